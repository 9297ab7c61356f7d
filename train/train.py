"""Train the built-in target (LayerSkip recipe) or its drafter (distilled from the target) on the corpus.

    python -m train.train --preset target  --corpus data/corpus --tokenizer data/tokenizer --out data/runs/target
    python -m train.train --preset drafter --corpus data/corpus --tokenizer data/tokenizer --out data/runs/drafter \
        --teacher data/runs/target/final
    python -m train.train --preset drafter-replies --init data/runs/drafter/final --replies data/replies.jsonl \
        --teacher data/runs/target/final --out data/runs/drafter-replies      (tuning on the target's own replies)

Seeded and resumable: a checkpoint (model, optimizer, RNG and data position) is written every `--save-every`
steps and picked up by the next run with the same --out. Writes `log.jsonl` (one line per logged step and per
evaluation) and, at the end, a Hugging Face checkpoint in OUT/final (float32, safetensors) with the tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from train.data import TokenStream, training_streams
from train.layerskip import LayerSkipConfig, heldout_losses, layerskip_loss
from train.progress import Progress


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    steps: int
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 150
    weight_decay: float = 0.1
    layerskip: bool = False
    distill: bool = False
    tunes: bool = False  # starts from a trained model (--init) and adds the target's replies (--replies)
    precision: str = "bfloat16"  # autocast dtype of the training forward; master weights stay float32
    mix: dict[str, float] = field(default_factory=dict)  # corpus kind -> draws per epoch (unnamed kinds: 1.0)


# The built-in model answers questions about the standard library, so its training draws the explanatory turns
# (a question -> the documentation) several times per epoch and a third of the plain-code chunks: per epoch about
# 3.6M tokens instead of 3.9M, of which explanations are 52% instead of 14% and plain code 19% instead of 59%.
HELP_MIX = {"chat_module": 8.0, "chat_class": 4.0, "chat_docstring": 3.0, "chat_topic": 3.0, "chat_function": 1.0,
            "code": 0.3}

# Tuning a trained drafter on the target's own greedy replies (`python -m train.replies`), what it drafts at run
# time: every reply once per epoch, beside the corpus at REPLY_CORPUS_SHARE of its usual draws.
REPLY_CORPUS_SHARE = 0.3
REPLY_MIX = {**{kind: REPLY_CORPUS_SHARE * draws for kind, draws in HELP_MIX.items()}, "reply": 1.0}
REPLIES_HELD_BACK = 400  # the last replies of the file: evaluation only, never trained on

PRESETS = {
    # about 70 minutes on 2 CPU cores with bfloat16 autocast (1.9 s per 4096-token LayerSkip step; 2.5 epochs)
    "target": Preset(hidden_size=256, intermediate_size=768, num_layers=12, num_heads=4, num_kv_heads=2,
                     steps=2200, warmup=100, layerskip=True, mix=HELP_MIX),
    # about 11 minutes: distillation costs a teacher forward per step
    "drafter": Preset(hidden_size=256, intermediate_size=768, num_layers=2, num_heads=4, num_kv_heads=2,
                      steps=800, warmup=40, distill=True, mix=HELP_MIX),
    # about 7 minutes, after the drafter preset
    "drafter-replies": Preset(hidden_size=256, intermediate_size=768, num_layers=2, num_heads=4, num_kv_heads=2,
                              steps=400, warmup=20, lr=8e-4, distill=True, tunes=True, mix=REPLY_MIX),
    "smoke": Preset(hidden_size=32, intermediate_size=64, num_layers=3, num_heads=2, num_kv_heads=1,
                    steps=6, batch_size=2, seq_len=32, warmup=2, layerskip=True, precision="float32"),
}


def build_model(preset: Preset, tokenizer, tokenizer_dir: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    eos_id = _special_id(tokenizer, tokenizer_config.get("eos_token", "<|im_end|>"))
    pad_id = _special_id(tokenizer, tokenizer_config.get("pad_token", "<|endoftext|>"))
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers, num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=None, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id,
    )
    config._attn_implementation = "sdpa"  # causal masking with attention_mask=None relies on SDPA's is_causal
    return LlamaForCausalLM(config)


def _special_id(tokenizer, token) -> int:
    content = token["content"] if isinstance(token, dict) else token
    token_id = tokenizer.token_to_id(content)
    if token_id is None:
        raise SystemExit(f"special token {content!r} is not in the tokenizer")
    return token_id


def learning_rate(step: int, preset: Preset) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < preset.warmup:
        return preset.lr * (step + 1) / preset.warmup
    progress = (step - preset.warmup) / max(preset.steps - preset.warmup, 1)
    return preset.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def distill_loss(student, teacher, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Half cross-entropy on the data, half KL(teacher || student) on the teacher's full distribution."""
    logits = student(tokens).logits  # (B, T, V)
    with torch.no_grad():
        teacher_logp = teacher(tokens).logits.log_softmax(-1)
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    kl = F.kl_div(logits.log_softmax(-1).flatten(0, 1), teacher_logp.flatten(0, 1), log_target=True,
                  reduction="batchmean")
    return 0.5 * ce + 0.5 * kl, {"final_ce": ce.item(), "kl": kl.item()}


def save_checkpoint(path: Path, model, optimizer, step: int, stream: TokenStream,
                    generator: torch.Generator | None, elapsed: float) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
             "stream": stream.state(), "torch_rng": torch.get_rng_state(), "elapsed": elapsed}
    if generator is not None:
        state["generator"] = generator.get_state()
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: a crash never leaves a half-written checkpoint


def start_or_resume(out: Path, model, optimizer, stream: TokenStream, generator: torch.Generator | None,
                    start_record: dict, label: str) -> tuple[int, float, Path, Path]:
    """Resume from out/checkpoint.pt if there is one, else start out/log.jsonl afresh with `start_record`; returns
    (step, seconds already trained, checkpoint path, log path)."""
    checkpoint_path, log_path = out / "checkpoint.pt", out / "log.jsonl"
    resumed = resume_checkpoint(checkpoint_path, model, optimizer, stream, generator)
    if resumed:
        print(f"resuming {label} from step {resumed[0]}", file=sys.stderr)
    else:
        log_path.write_text("")
        log_record(log_path, {"event": "start", **start_record})
    step, elapsed_before = resumed or (0, 0.0)
    return step, elapsed_before, checkpoint_path, log_path


def optimizer_step(optimizer, loss: torch.Tensor, parameters, step: int, preset: Preset) -> float:
    """One update at this step's learning rate, gradients clipped to norm 1; returns the norm before clipping."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, preset)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, 1.0).item()
    optimizer.step()
    return grad_norm


def resume_checkpoint(path: Path, model, optimizer, stream: TokenStream,
                      generator: torch.Generator | None) -> tuple[int, float] | None:
    """Restore what save_checkpoint wrote; (step, elapsed seconds), or None when there is no checkpoint yet."""
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    stream.restore(state["stream"])
    if generator is not None:
        generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["elapsed"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--teacher", type=Path, help="target checkpoint to distil from (drafter presets)")
    parser.add_argument("--init", type=Path, help="the trained checkpoint a tuning preset starts from")
    parser.add_argument("--replies", type=Path, help="the target's replies (python -m train.replies) a tuning "
                                                     "preset adds to the corpus")
    parser.add_argument("--steps", type=int, help="override the preset's number of steps")
    parser.add_argument("--precision", choices=["bfloat16", "float32"],
                        help="override the preset's training-forward precision (bfloat16 autocast is about 1.4x "
                             "faster on CPUs with AVX-512 BF16 or AMX; float32 works everywhere)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--heldout-batches", type=int, default=16)
    args = parser.parse_args(argv)

    preset = PRESETS[args.preset]
    if (args.init is not None, args.replies is not None) != (preset.tunes, preset.tunes):
        parser.error(f"--init and --replies go together, with a tuning preset "
                     f"({', '.join(name for name, p in PRESETS.items() if p.tunes)}) and only with one")
    if args.steps:
        preset = Preset(**{**asdict(preset), "steps": args.steps})
    if args.precision:
        preset = Preset(**{**asdict(preset), "precision": args.precision})
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    from train.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    train_stream, heldout, replies_trained = training_streams(
        args.corpus, tokenizer, preset.mix, preset.seq_len, preset.batch_size, args.seed, args.heldout_batches,
        args.replies, REPLIES_HELD_BACK)
    model = build_model(preset, tokenizer, args.tokenizer)
    if args.init:
        from safetensors.torch import load_file

        state, expected = load_file(str(args.init / "model.safetensors")), model.state_dict()
        wrong = sorted(name for name in state if name not in expected or state[name].shape != expected[name].shape)
        missing = sorted(set(expected) - set(state) - {"lm_head.weight"})  # a tied head is saved once
        if wrong or missing:
            raise SystemExit(f"{args.init} is not a checkpoint of the {args.preset} preset's shape "
                             f"({len(wrong)} tensors differ, {len(missing)} missing): pass the folder it trained")
        model.load_state_dict(state, strict=False)
    teacher = None
    if preset.distill:
        if args.teacher is None:
            raise SystemExit("the drafter preset distils from the target: pass --teacher OUT_OF_TARGET/final")
        from transformers import AutoModelForCausalLM

        teacher = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32, attn_implementation="sdpa")
        teacher.eval().requires_grad_(False)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": preset.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=preset.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(args.seed)
    recipe = LayerSkipConfig()
    step, elapsed_before, checkpoint_path, log_path = start_or_resume(
        args.out, model, optimizer, train_stream, generator,
        {"preset": args.preset, **asdict(preset), "seed": args.seed,
         "parameters": sum(p.numel() for p in model.parameters()),
         "train_tokens_available": train_stream.total_tokens, "init": str(args.init) if args.init else None,
         "replies": str(args.replies) if args.replies else None,
         "replies_trained": replies_trained,
         "replies_held_back": REPLIES_HELD_BACK if args.replies else 0}, args.preset)

    def evaluate(step: int, elapsed: float) -> None:
        """Held-out cross-entropy at every exit and the full model's perplexity (and on held-back replies)."""
        model.eval()
        losses = {name: heldout_losses(model, batches) for name, batches in heldout.items()}
        model.train()
        record = {"event": "eval", "step": step, "elapsed_s": elapsed, "heldout_ce_by_exit": losses["heldout"],
                  "heldout_ppl": math.exp(losses["heldout"][-1])}
        if "replies" in losses:
            record["replies_ppl"] = math.exp(losses["replies"][-1])
        log_record(log_path, record)
        progress.note(" ".join(f"{key} {value:.2f}" for key, value in record.items() if key.endswith("_ppl")))

    progress = Progress(preset.steps, start=step, label=args.preset)
    if args.init and step == 0:
        evaluate(0, 0.0)  # where the tuning starts from
    started = time.perf_counter()
    model.train()
    while step < preset.steps:
        tokens, targets = train_stream.next_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=preset.precision == "bfloat16"):
            if teacher is not None:
                loss, parts = distill_loss(model, teacher, tokens, targets)
            elif preset.layerskip:
                loss, parts = layerskip_loss(model, tokens, targets, step, recipe, generator)
            else:
                logits = model(tokens).logits  # (B, T, V)
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
                parts = {"final_ce": loss.item()}
        grad_norm = optimizer_step(optimizer, loss, model.parameters(), step, preset)
        step += 1
        elapsed = elapsed_before + time.perf_counter() - started
        progress.update(step, loss=loss.item())
        if step % 10 == 0 or step == preset.steps:
            log_record(log_path, {"event": "train", "step": step, "loss": loss.item(), "lr": learning_rate(step - 1, preset),
                            "grad_norm": grad_norm, "elapsed_s": elapsed,
                            "tokens_seen": step * preset.batch_size * preset.seq_len, **parts})
        if step % args.eval_every == 0 or step == preset.steps:
            evaluate(step, elapsed)
        if step % args.save_every == 0 or step == preset.steps:
            save_checkpoint(checkpoint_path, model, optimizer, step, train_stream, generator, elapsed)
    progress.close()

    final = args.out / "final"
    model.eval()
    model.save_pretrained(final, safe_serialization=True)
    for item in args.tokenizer.iterdir():
        if item.is_file():
            shutil.copy(item, final / item.name)
    log_record(log_path, {"event": "done", "step": step, "elapsed_s": elapsed_before + time.perf_counter() - started})
    print(f"wrote {final}", file=sys.stderr)
    return 0


def log_record(path: Path, record: dict) -> None:
    """Append one JSON line to a training log."""
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main())
