"""Write the model cards of the built-in pair from the training logs: data, size, time, loss curve, perplexities,
samples. Every figure in the cards is read from `log.jsonl`/`stats.json` or measured here, never typed in.

    python -m train.model_card --runs data/runs --corpus data/corpus --models edge/models
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path

# Chosen before the model they describe was trained: one question of each kind the corpus teaches, about items in
# the training split, then two the model has not seen (a held-out module and a task outside the corpus).
SAMPLE_PROMPTS = [
    ("What does the `json` module do?", "module, training split"),
    ("What is `collections.OrderedDict` for?", "class, training split"),
    ("Describe `shutil.copyfileobj`.", "function, training split"),
    ('Tell me about the "for" statement in Python.', "pydoc topic, training split"),
    ("What does the `xmlrpc.server` module do?", "held-out module: not in the training data"),
    ("Write a Python function `is_palindrome(text)` that returns True if text reads the same backwards.",
     "a task outside the corpus"),
]

# every card ends with the command that rebuilds it
REPRODUCE_LINES = ["## Reproduce", "", "```bash", "pip install -e '.[train]' && python -m train.build_default", "```",
                   ""]


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_losses(logs: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    for name, log in logs.items():
        train = [r for r in log if r["event"] == "train"]
        evals = [r for r in log if r["event"] == "eval"]
        tokens = [r["tokens_seen"] / 1e6 for r in train]
        axis.plot(tokens, [r["final_ce"] for r in train], linewidth=1, label=f"{name}: training loss")
        per_step = train[-1]["tokens_seen"] / train[-1]["step"] if train else 0
        axis.plot([r["step"] * per_step / 1e6 for r in evals], [r["heldout_ce_by_exit"][-1] for r in evals], "o--",
                  label=f"{name}: held-out loss")
    axis.set_xlabel("training tokens (millions)")
    axis.set_ylabel("cross-entropy (nats/token)")
    axis.set_title("edge built-in models: training curves")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)


def sample_generations(model_dir: Path, max_new_tokens: int = 96) -> list[tuple[str, str, str]]:
    """(prompt, what it asks about, greedy reply) for each sample prompt."""
    from edge.engine import Engine

    engine = Engine.load(model_dir, max_context=1024)
    samples = []
    for prompt, about in SAMPLE_PROMPTS:
        engine.reset()
        reply = "".join(event.text for event in engine.chat([{"role": "user", "content": prompt}],
                                                            max_new_tokens=max_new_tokens, temperature=0.0))
        samples.append((prompt, about, reply))
    return samples


def summary(log: list[dict]) -> dict:
    start = next(r for r in log if r["event"] == "start")
    last_eval = [r for r in log if r["event"] == "eval"][-1]
    done = next((r for r in log if r["event"] == "done"), None)
    train = [r for r in log if r["event"] == "train"]
    return {
        "start": start,
        "exits": [math.exp(ce) for ce in last_eval["heldout_ce_by_exit"]],
        "minutes": (done or train[-1])["elapsed_s"] / 60,
        "tokens": train[-1]["tokens_seen"],
        "final_train_loss": train[-1]["final_ce"],
    }


def size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6


def card_text(name: str, role: str, info: dict, stats: dict, samples: list[tuple[str, str, str]],
              folder: Path, tuning: list[dict] | None = None) -> str:
    """A model's card; `tuning` is the log of its tuning on the target's replies (train.train --init --replies)."""
    start = info["start"]
    lines = [
        f"# edge built-in {name} model",
        "",
        role,
        "",
        "## Model",
        "",
        f"- Llama architecture (`LlamaForCausalLM`), {start['num_layers']} layers, hidden {start['hidden_size']}, "
        f"MLP {start['intermediate_size']}, {start['num_heads']} heads / {start['num_kv_heads']} KV heads, "
        f"tied embeddings, vocabulary {json.loads((folder / 'config.json').read_text())['vocab_size']} "
        "(byte-level BPE trained on the same corpus)",
        f"- {start['parameters'] / 1e6:.2f}M parameters, stored in float16 safetensors ({size_mb(folder):.1f} MB "
        "with the tokenizer)",
        "- Loads in transformers (`AutoModelForCausalLM.from_pretrained`) as well as in edge.",
        "",
        "## Data",
        "",
        f"The Python {stats.get('python_version', platform.python_version())} standard library (PSF licence): "
        "functions requested from their docstrings and answered with their source, modules and classes "
        "explained by their documentation, `pydoc` topics, and plain source code for continuation. Built by "
        "`python -m train.corpus`, deterministic (seed "
        f"{stats.get('seed', 0)}), deduplicated, held-out split by module.",
        "",
        "```json",
        json.dumps({k: stats[k] for k in ("python_version", "seed", "modules", "examples", "duplicates_dropped",
                                          "characters") if k in stats}, indent=1),
        "```",
        "",
        "## Training",
        "",
        f"- {start['steps']} steps of {start['batch_size']} x {start['seq_len']} tokens "
        f"({info['tokens'] / 1e6:.2f}M tokens), AdamW, peak learning rate {start['lr']}, warm-up {start['warmup']}, "
        "cosine decay, seed " + str(start["seed"]),
        *_mixture_lines(start.get("mix") or {}),
        f"- {info['minutes']:.1f} minutes on a 2-core CPU (no GPU), torch {_torch_version()}, forward pass in "
        + ("bfloat16 autocast (float32 master weights)" if start.get("precision", "float32") == "bfloat16"
           else "float32"),
    ]
    if start.get("layerskip"):
        lines.append("- LayerSkip recipe: layer dropout rising linearly with depth to 0.1, early-exit losses through "
                     "the shared final norm and head on a rotating set of layers, weights rising with depth")
    if start.get("distill"):
        lines.append("- Distilled from the target: half cross-entropy on the data, half KL(target || drafter)")
    lines += [
        f"- Final training loss {info['final_train_loss']:.3f} nats/token",
        "",
        "![loss curve](loss.png)",
        "",
        "## Held-out perplexity",
        "",
        "| exit after layer | perplexity |",
        "|---:|---:|",
    ]
    exits = info["exits"]
    for layer, ppl in enumerate(exits):
        label = f"{layer + 1} (full model)" if layer == len(exits) - 1 else str(layer + 1)
        lines.append(f"| {label} | {ppl:.2f} |")
    lines.append("")
    if tuning:
        lines += _drafter_tuning_lines(tuning)
    lines += ["## Greedy samples (edge, float32, chat template, 96 new tokens at most)", "",
              "The prompts were fixed before training; each names what it asks about.", ""]
    for prompt, about, reply in samples:
        lines += [f"**User** ({about}): {prompt}", "", "````", reply.strip(), "````", ""]  # replies may hold ```
    lines += REPRODUCE_LINES
    return "\n".join(lines)


def _minutes(log: list[dict]) -> float:
    done = next((r for r in log if r["event"] == "done"), None)
    return (done or [r for r in log if r["event"] == "eval"][-1])["elapsed_s"] / 60


def feature_card_text(log: list[dict], folder: Path, tuning: list[dict] | None = None,
                      task_tuning: list[dict] | None = None) -> str:
    """The feature drafter's card: what it is, how it was trained (and tuned on the target's replies, when `tuning`
    is that stage's log), and its agreement with the target."""
    start = next(r for r in log if r["event"] == "start")
    evals = [r for r in log if r["event"] == "eval"]
    config = json.loads((folder / "config.json").read_text())
    lines = [
        "# edge built-in feature drafter",
        "",
        "An EAGLE-style drafter for the built-in target (`--drafter feature`): one Llama decoder layer that drafts",
        "from the target's own final hidden states. The row for position p fuses the target's hidden state at p-1",
        "with the embedding of token p (one linear layer, 2D -> D), runs the decoder layer and a norm, and predicts",
        "the target's hidden state at p; the target's tied head turns it into the next token. Later drafts feed the",
        "drafter's own predictions back as features.",
        "",
        "## Model",
        "",
        f"- 1 decoder layer, hidden {config['hidden_size']}, MLP {config['intermediate_size']}, "
        f"{config['num_attention_heads']} heads / {config['num_key_value_heads']} KV heads, plus the fusion layer: "
        f"{start['parameters'] / 1e6:.2f}M trained parameters, float16 safetensors ({size_mb(folder):.1f} MB)",
        "- It uses the target's embedding and head; the file keeps a copy of the embedding only so that edge can",
        "  check the drafter belongs to the target it is given (edge shares the target's at run time).",
        "",
        "## Training (`python -m train.feature_drafter`, part of `python -m train.build_default`)",
        "",
        f"- {start['steps']} steps of {start['batch_size']} x {start['seq_len']} tokens of the target's data "
        f"mixture, target frozen, AdamW, peak learning rate {start['lr']}, seed {start['seed']}; "
        f"{_minutes(log):.1f} minutes on a 2-core CPU (no GPU), bfloat16 autocast",
        f"- Loss: KL(target || drafter) on the next token + {start['feature_weight']:g} x SmoothL1 between the "
        f"predicted and the true hidden state; a second pass per batch feeds the first pass's predictions back as "
        f"features (weight {start['second_pass_weight']:g}), as later draft positions do",
        "- Initialised from the target's last layer and final norm",
        "",
        "## Held-out agreement with the target",
        "",
        "How often the drafter's top token equals the target's on the held-out split, teacher-forced: from the",
        "target's true features (the first draft of a step), and from the drafter's own predicted features (the",
        "second pass: later drafts).",
        "",
        "| step | from true features | from its own features |",
        "|---:|---:|---:|",
        *[f"| {r['step']} | {r['heldout_agreement'][0]:.3f} | {r['heldout_agreement'][1]:.3f} |" for r in evals],
        "",
        *(_feature_tuning_lines(tuning, final=task_tuning is None) if tuning else []),
        *(feature_task_tuning_lines(task_tuning) if task_tuning else []),
        *REPRODUCE_LINES,
    ]
    return "\n".join(lines)


def _tuning_start(log: list[dict]) -> tuple[dict, int]:
    """A tuning log's start record, and how many replies (trained and held back) the stage read."""
    start = next(r for r in log if r["event"] == "start")
    return start, start["replies_trained"] + start["replies_held_back"]


def _tuning_intro(log: list[dict], final: bool = True) -> list[str]:
    """The tuning stage on the target's own replies: what it trained on, how long, and what it started from."""
    from train.replies import MAX_NEW_TOKENS
    from train.train import REPLY_CORPUS_SHARE

    start, replies = _tuning_start(log)
    return [
        "## Tuned on the target's own replies (`python -m train.replies`, then `--init ... --replies ...`)",
        "",
        "The model above was then tuned on what it drafts at run time: the shipped target's greedy replies to "
        f"{replies} user turns of the training split, drawn in a seeded order (at most {MAX_NEW_TOKENS} new tokens "
        f"each), the last {start['replies_held_back']} held back. {start['steps']} steps of {start['batch_size']} x "
        f"{start['seq_len']} tokens, peak learning rate {start['lr']}, the corpus mixture at "
        f"{REPLY_CORPUS_SHARE:g} of its weight beside the replies; {_minutes(log):.1f} minutes on the same CPU. "
        + ("This folder holds the tuned model. " if final else "") + "Step 0 is where the tuning started.",
        "",
    ]


def _evaluation_table(log: list[dict], columns: str, row) -> list[str]:
    """One table row per evaluation of a log (`row(record)` -> its cells), under a step column."""
    return [f"| step | {columns} |", "|---:|---:|---:|",
            *[f"| {r['step']} | {row(r)} |" for r in log if r["event"] == "eval"], ""]


def _tuning_lines(log: list[dict], columns: str, row, final: bool = True) -> list[str]:
    """The tuning section: the introduction, then its evaluations."""
    return [*_tuning_intro(log, final), *_evaluation_table(log, columns, row)]


def _agreement_cells(record: dict) -> str:
    """A feature drafter's evaluation: held-out split and held-back replies, each from true / own features."""
    return (f"{record['heldout_agreement'][0]:.3f} / {record['heldout_agreement'][1]:.3f} | "
            f"{record['replies_agreement'][0]:.3f} / {record['replies_agreement'][1]:.3f}")


def _feature_tuning_lines(log: list[dict], final: bool = True) -> list[str]:
    return _tuning_lines(log, "held-out split, true / own features | held-back replies, true / own features",
                         _agreement_cells, final)


def feature_task_tuning_lines(log: list[dict]) -> list[str]:
    """The feature drafter's second tuning stage: the target's replies to the corpus's turns and to requests of the
    benchmarks' kinds (train.replies --requests both)."""
    start, replies = _tuning_start(log)
    return [
        "## Tuned on replies to the requests people make (`python -m train.replies --requests both`)",
        "",
        "The corpus's own turns come in a few shapes (\"Describe `x`\", \"Write a Python function ... that does the "
        "following\"). People also paste text to summarize, code to rewrite and documentation to answer from, and "
        "the drafter above agreed with the target less often on the target's replies to those. So it was tuned once "
        f"more, on {replies} conversations: in turn, a user turn of the training split and a request of one of the "
        "kinds edge-bench measures (Spec-Bench's six categories: multi-turn, translation, summarization, question "
        "answering, math, retrieval-augmented answers; and code; `train/task_turns.py`), written from training-split "
        "material that never names a module edge-bench's prompts are about, each with the shipped target's greedy "
        f"reply; the last {start['replies_held_back']} held back (half of each kind). {start['steps']} steps of "
        f"{start['batch_size']} x {start['seq_len']} tokens, peak learning rate {start['lr']}, "
        f"{start.get('precision', 'bfloat16')} forward, starting from the model above as shipped; "
        f"{_minutes(log):.1f} minutes on a 2-core AVX2 CPU. This folder holds this model.",
        "",
        *_evaluation_table(log, "held-out split, true / own features | held-back conversations, true / own features",
                           _agreement_cells),
    ]


def deep_feature_card_text(log: list[dict], folder: Path) -> str:
    """The two-layer feature drafter's card: the shipped feature drafter grown by a layer and tuned on the same
    conversations, and when it pays."""
    start = next(r for r in log if r["event"] == "start")
    config = json.loads((folder / "config.json").read_text())
    return "\n".join([
        "# edge built-in feature drafter, two layers",
        "",
        f"The built-in feature drafter (`edge/models/feature`, whose card explains the design) with "
        f"{config['num_hidden_layers']} decoder layers instead of one: `--drafter feature:PATH` with this folder "
        "(`edge/models/feature-deep` in a checkout). It agrees with the target more often, and each drafted token "
        "runs every layer. That pays where a target step reads far more weights than the drafter does, such "
        "as the memory-bound copies of the built-in model that `python -m bench.memory_bound` writes; on the "
        "built-in model itself, which fits in a CPU's cache, the one-layer drafter is faster "
        "(docs/benchmarks.md).",
        "",
        "## Model",
        "",
        f"- {config['num_hidden_layers']} decoder layers, hidden {config['hidden_size']}, MLP "
        f"{config['intermediate_size']}, {config['num_attention_heads']} heads / {config['num_key_value_heads']} KV "
        f"heads, plus the fusion layer: {start['parameters'] / 1e6:.2f}M trained parameters, float16 safetensors "
        f"({size_mb(folder):.1f} MB)",
        "",
        "## Training (`python -m train.feature_drafter --layers 2`, part of `python -m train.build_default`)",
        "",
        f"- Starts from the shipped one-layer drafter; the added layer is the target's last layer with zero output "
        "projections, so at step 0 it drafts exactly as the one-layer drafter does",
        f"- Tuned on the same {start['replies_trained'] + start['replies_held_back']} conversations as the one-layer "
        f"drafter's last stage (the last {start['replies_held_back']} held back): {start['steps']} steps of "
        f"{start['batch_size']} x {start['seq_len']} tokens, peak learning rate {start['lr']}, "
        f"{start.get('precision', 'bfloat16')} forward; {_minutes(log):.1f} minutes on a 2-core AVX2 CPU",
        "",
        *_evaluation_table(log, "held-out split, true / own features | held-back conversations, true / own features",
                           _agreement_cells),
        *REPRODUCE_LINES,
    ])


def _drafter_tuning_lines(log: list[dict]) -> list[str]:
    return _tuning_lines(log, "held-out split perplexity | held-back replies perplexity",
                         lambda r: f"{r['heldout_ppl']:.2f} | {r['replies_ppl']:.2f}")


def _mixture_lines(mix: dict[str, float]) -> list[str]:
    """The data mixture as one bullet: how many times per epoch each kind of example is drawn."""
    if not mix:
        return []
    return ["- Data mixture, draws per epoch: " + ", ".join(f"{kind} {weight:g}" for kind, weight in mix.items())
            + " (the explanatory turns several times, a fraction of the plain-code chunks)"]


def _torch_version() -> str:
    import torch

    return torch.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.model_card")
    parser.add_argument("--runs", type=Path, default=Path("data/runs"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--models", type=Path, default=Path("edge/models"))
    args = parser.parse_args(argv)
    stats = json.loads((args.corpus / "stats.json").read_text())
    logs = {name: read_log(args.runs / name / "log.jsonl") for name in ("target", "drafter")}
    plot_losses(logs, args.models / "default" / "loss.png")
    plot_losses(logs, args.models / "drafter" / "loss.png")
    roles = {
        "target": ("default", "The target model: what `edge-chat`, `edge-bench` and the README use when no model "
                              "is given. Trained so that its early exits draft well (self-speculation)."),
        "drafter": ("drafter", "The separate draft model for speculative decoding with the default target "
                               "(same tokenizer)."),
    }
    tuning_logs = {"drafter": args.runs / "drafter-replies" / "log.jsonl"}
    for name, (folder_name, role) in roles.items():
        folder = args.models / folder_name
        samples = sample_generations(folder)
        tuning = read_log(tuning_logs[name]) if name in tuning_logs and tuning_logs[name].is_file() else None
        card = card_text(name, role, summary(logs[name]), stats, samples, folder, tuning)
        (folder / "README.md").write_text(card)
        print(f"wrote {folder / 'README.md'}", file=sys.stderr)
    feature_log, feature_folder = args.runs / "feature" / "log.jsonl", args.models / "feature"
    tuning_log, task_log = args.runs / "feature-replies" / "log.jsonl", args.runs / "feature-tasks" / "log.jsonl"
    if feature_log.is_file() and (feature_folder / "config.json").is_file():
        tuning = read_log(tuning_log) if tuning_log.is_file() else None
        task_tuning = read_log(task_log) if task_log.is_file() else None
        (feature_folder / "README.md").write_text(
            feature_card_text(read_log(feature_log), feature_folder, tuning, task_tuning))
        print(f"wrote {feature_folder / 'README.md'}", file=sys.stderr)
    deep_log, deep_folder = args.runs / "feature-deep" / "log.jsonl", args.models / "feature-deep"
    if deep_log.is_file() and (deep_folder / "config.json").is_file():
        (deep_folder / "README.md").write_text(deep_feature_card_text(read_log(deep_log), deep_folder))
        print(f"wrote {deep_folder / 'README.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
