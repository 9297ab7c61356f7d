"""Train an EAGLE-3 head for a target (a GGUF file or a checkpoint folder) on 2 CPU cores, in the hub's layout that
`--drafter eagle3:PATH` loads (edge/decoding/drafters/eagle3_head.py).

    python -m train.replies --target MODEL.gguf --requests both --count 3000 --out data/replies.jsonl
    python -m train.eagle3 --target MODEL.gguf --replies data/replies.jsonl --out data/runs/eagle3

1. Features (resumable, cached under OUT/features): each reply, rendered with the chat template, runs once through
   the target as a prefill pass on edge's own kernels (edge.model.layer_features): the residual streams after a low,
   a middle and a high layer at every position, exactly what the drafter reads at run time, stored in float16 with
   the token ids, which positions are the target's reply, and the target's 16 likeliest next tokens there.
2. Training (resumable, checkpoints in OUT): row j fuses the streams at j (fc, 3D -> D) with the embedding of token
   j + 1, runs the head's one decoder layer and predicts token j + 2 over the draft vocabulary (soft labels: the
   target's distribution over its 16 likeliest tokens, renormalised over the draft vocabulary; `--labels greedy`
   fits only its greedy choice, the reply's token). Training-time test: `--unroll` more passes feed each row the
   previous row's output of the pass before, as drafting does past its first token, so later draft tokens are
   trained on the head's own features (causal attention within a pass: a simplification of EAGLE-3's tree mask).
3. OUT/final: config.json (architectures LlamaForCausalLMEagle3, eagle_config's layer ids), model.safetensors (fc,
   midlayer.*, norm, lm_head over the draft vocabulary, d2t, t2d; the target's embedding is not copied) and card.json
   (data, steps, held-out top-1 agreement of the first and the later draft tokens). With --install (a GGUF target)
   it is copied where edge-chat and edge-serve offer it by default for that model (edge/sources/installed_heads.py).

More data, cheaper: `--corpus DIR --corpus-count N` adds N conversations of the corpus's training split with their
own answers, labelled with the target's greedy choice at every answer position (computed in the same prefill pass:
a prefill row costs a fraction of a decoded reply token). `--head-from-target` (the default) starts the head's
lm_head and norm from the target's own head rows and final norm over the draft vocabulary and keeps the lm_head
fixed (`--train-head` trains it too): the layer learns to produce what the target's last hidden state would be,
and a step computes no gradient for the largest matrix.

The draft vocabulary is the `--draft-vocab` most frequent tokens of the replies (EAGLE-3's d2t/t2d), or a VocabTrim
file's ids (`--draft-vocab FILE.json`, e.g. edge/models/qwen2.5-vocab/vocab.json; `auto` picks the file edge
ships for the target's tokenizer where there is one). `python -m train.install_head MODEL` runs every step with
the settings used for edge's own heads, and installs the result.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edge.sources.installed_heads import identity, install_head
from train.progress import Progress
from train.replies import SKIPPED

HELD_OUT = 64  # replies kept out of training, for the card's agreement figures
UNROLL_WEIGHT = 0.7  # the loss of unrolled pass s weighs UNROLL_WEIGHT ** s
CORPUS_SEED = 8  # the order corpus conversations are drawn in (train.replies asks in order 7)
SOFT_TOP = 16  # the target's most likely next tokens kept per position, the soft labels' support
LOGIT_ROWS = 256  # answer rows whose logits a feature pass computes at a time


class Eagle3Head(nn.Module):
    """The trainable head, its parameters named as published EAGLE-3 heads name theirs."""

    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, draft_vocab: int,
                 layers: int, eps: float, rope_theta: float) -> None:
        super().__init__()
        self.eps, self.heads, self.kv_heads, self.head_dim = eps, heads, kv_heads, head_dim
        self.rope_theta = rope_theta
        self.fc = nn.Linear(layers * hidden, hidden, bias=False)
        attn = nn.Module()
        attn.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        attn.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        attn.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        attn.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        mlp.up_proj = nn.Linear(hidden, intermediate, bias=False)
        mlp.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.midlayer = nn.Module()
        self.midlayer.self_attn, self.midlayer.mlp = attn, mlp
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            setattr(self.midlayer, name, nn.Module())
            getattr(self.midlayer, name).weight = nn.Parameter(torch.ones(hidden))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(hidden))
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)

    def _norm(self, x: torch.Tensor, module: nn.Module) -> torch.Tensor:
        return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, Dh) rotated by position (half-split rotary, as edge and Llama run it)."""
        half = self.head_dim // 2
        inv = 1.0 / self.rope_theta ** (torch.arange(half, dtype=torch.float32) / half)  # (Dh/2,)
        angles = torch.arange(x.shape[2], dtype=torch.float32)[:, None] * inv[None, :]  # (T, Dh/2)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()  # (T, Dh) each
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos + rotated * sin

    def layer(self, g: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """g, embeds (B, T, D) -> the layer's output (B, T, D), causal over T."""
        m, (b, t, _) = self.midlayer, g.shape
        h = self._norm(g, m.hidden_norm)
        joined = torch.cat((self._norm(embeds, m.input_layernorm), h), -1)  # (B, T, 2D)
        q = self._rope(m.self_attn.q_proj(joined).view(b, t, self.heads, self.head_dim).transpose(1, 2))
        k = self._rope(m.self_attn.k_proj(joined).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2))
        v = m.self_attn.v_proj(joined).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = g + m.self_attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))  # (B, T, D)
        normed = self._norm(x, m.post_attention_layernorm)
        return x + m.mlp.down_proj(F.silu(m.mlp.gate_proj(normed)) * m.mlp.up_proj(normed))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self._norm(out, self.norm))  # (B, T, Vd)

    def passes(self, features: torch.Tensor, embeds: torch.Tensor, unroll: int) -> list[torch.Tensor]:
        """features (B, T, 3D) at rows j, embeds (B, T, D) of tokens j + 1 -> logits (B, T, Vd) of each pass: the
        first from the target's features, each later one from the previous pass's output one row earlier."""
        out = self.layer(self.fc(features), embeds)
        logits = [self.logits(out)]
        for _ in range(unroll):
            g = torch.cat((out[:, :1], out[:, :-1]), 1)  # row j gets the previous pass's row j - 1
            out = self.layer(g, embeds)
            logits.append(self.logits(out))
        return logits


def target_and_layers(target: str):
    from edge.engine import Engine
    from edge.model.layer_features import default_layers

    engine = Engine.load(target, max_context=4096)
    return engine, default_layers(engine.model.config.num_layers)


def encode(example: dict, tokenizer) -> tuple[list[int], list[bool]]:
    """A reply example -> its token ids and which of them are the reply's (the target's own tokens)."""
    messages = example["messages"]
    prompt = tokenizer.encode_chat(messages[:-1], add_generation_prompt=True)
    reply = tokenizer.encode(messages[-1]["content"], add_special_tokens=False) + tokenizer.eos_token_ids[:1]
    return prompt + reply, [False] * len(prompt) + [True] * len(reply)


def corpus_conversations(corpus: Path, count: int, seed: int = CORPUS_SEED) -> list[dict]:
    """`count` chat examples of the corpus's training split with their own answers, in a seeded order."""
    from train.corpus import read_jsonl

    chats = [example for example in read_jsonl(corpus / "train.jsonl") if example.get("messages")
             and example["messages"][-1]["role"] == "assistant"]
    random.Random(seed).shuffle(chats)
    return chats[:count]


def extract_features(engine, layers, examples: list[dict], folder: Path, distilled: bool) -> list[Path]:
    """One .pt file per example under `folder` (ids, answer mask, next: the label of each position's next token,
    soft: the target's SOFT_TOP most likely next tokens and their log-probabilities, float16 features), made once
    each. A reply's labels are its own tokens (the target's greedy choices); a distilled example's are the target's
    greedy choices computed here, where the answer is someone else's text."""
    from edge.model.layer_features import layer_features

    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"{i:06d}.pt" for i in range(len(examples))]
    todo = [i for i, path in enumerate(files) if not path.exists()]
    progress = Progress(len(files), len(files) - len(todo), f"features {folder.name}")
    for done, i in enumerate(todo, len(files) - len(todo) + 1):
        ids, mask = encode(examples[i], engine.tokenizer)
        features, hidden = layer_features(engine.model, ids, layers, hidden=True)  # (T, 3D), (T, D)
        rows = torch.tensor(mask).nonzero()[:, 0] - 1  # (n,): the rows that predict an answer token
        rows = rows[rows >= 0]
        soft_ids = torch.full((len(ids), SOFT_TOP), -1, dtype=torch.int32)  # (T, SOFT_TOP): -1 where none
        soft_logprobs = torch.zeros(len(ids), SOFT_TOP, dtype=torch.float16)  # (T, SOFT_TOP)
        choices = torch.full((len(ids),), -1, dtype=torch.long)  # (T,): the target's greedy choice after each row
        for chunk in rows.split(LOGIT_ROWS):  # the logits of a few rows at a time: a row is 0.6 MB on Qwen2.5
            with torch.inference_mode():
                logits = engine.model.logits(hidden[None, chunk])[0].float()  # (c, V)
            top = logits.log_softmax(-1).topk(SOFT_TOP, -1)  # (c, SOFT_TOP) each
            soft_ids[chunk], soft_logprobs[chunk] = top.indices.to(torch.int32), top.values.half()
            choices[chunk] = logits.argmax(-1)
        # a reply's labels are its next tokens (the target's own greedy choices); a distilled example's, computed here
        following = choices if distilled else torch.tensor(ids[1:] + [-1])  # (T,)
        partial = files[i].with_suffix(".partial")
        torch.save({"ids": torch.tensor(ids), "mask": torch.tensor(mask), "next": following, "soft_ids": soft_ids,
                    "soft_logprobs": soft_logprobs, "features": features.to(torch.float16)}, partial)
        partial.rename(files[i])
        progress.update(done)
    progress.close()
    return files


def draft_vocabulary(files: list[Path], size_or_file: str) -> torch.Tensor:
    """Sorted target ids of the draft vocabulary: a VocabTrim file's, or the most frequent reply tokens."""
    if not size_or_file.isdigit():
        from edge.model.trimmed_head import read_vocabulary
        return read_vocabulary(size_or_file)
    counts = Counter()
    for path in files:
        record = torch.load(path)
        counts.update(record["ids"][record["mask"]].tolist())
    kept = [token for token, _ in counts.most_common(int(size_or_file))]
    return torch.tensor(sorted(kept), dtype=torch.long)  # reply ids: within the vocabulary, each once


def shipped_or_size(tokenizer, size: int = 16384) -> str:
    """--draft-vocab auto: the draft vocabulary edge ships for this tokenizer's models, else the `size` most frequent
    reply tokens."""
    from edge.decoding.registry import shipped_vocabulary

    shipped = shipped_vocabulary(tokenizer)
    return str(shipped) if shipped is not None else str(size)


def batches(files: list[Path], seq_len: int, batch: int, rng: random.Random):
    """Endless batches of (ids, mask, next, soft_ids, soft_logprobs, features) windows of seq_len rows from random
    examples (features cached before soft labels were kept have none: soft_ids -1 there)."""
    while True:
        picked = [torch.load(rng.choice(files)) for _ in range(batch)]
        windows = []
        for record in picked:
            n = record["ids"].shape[0]
            if "soft_ids" not in record:
                record["soft_ids"] = torch.full((n, SOFT_TOP), -1, dtype=torch.int32)
                record["soft_logprobs"] = torch.zeros(n, SOFT_TOP, dtype=torch.float16)
            start = rng.randrange(0, max(1, n - seq_len))
            windows.append({key: value[start:start + seq_len] for key, value in record.items()})
        length = min(w["ids"].shape[0] for w in windows)
        stacked = {key: torch.stack([w[key][:length] for w in windows]) for key in windows[0]}
        yield (stacked["ids"], stacked["mask"], stacked["next"], stacked["soft_ids"].long(),
               stacked["soft_logprobs"].float(), stacked["features"].float())


def soft_targets(soft_ids: torch.Tensor, soft_logprobs: torch.Tensor, t2d: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
    """The target's top tokens (n, SOFT_TOP) -> their draft ids (n, SOFT_TOP; 0 where outside the draft vocabulary)
    and probabilities renormalised over those inside it (n, SOFT_TOP; 0 outside)."""
    draft = torch.where(soft_ids >= 0, t2d[soft_ids.clamp(min=0)], -1)  # (n, K)
    probs = soft_logprobs.exp() * (draft >= 0)  # (n, K)
    return draft.clamp(min=0), probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)


def losses(head: Eagle3Head, embed: nn.Module, t2d: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
           following: torch.Tensor, soft_ids: torch.Tensor, soft_logprobs: torch.Tensor, features: torch.Tensor,
           unroll: int, soft: bool = True) -> tuple[torch.Tensor, list[float]]:
    """Row j: features j, embedding of token j + 1 -> the target's choice after token j + 1 (following[j + 1]);
    answer positions inside the draft vocabulary only. With `soft`, rows that have the target's distribution there
    (soft_ids) are fitted to it (cross-entropy against its top tokens, renormalised over the draft vocabulary: the
    target's near-choices teach more per position than its choice alone), the others to the choice. Returns the
    weighted loss and each pass's top-1 agreement with the target's choice."""
    with torch.no_grad():
        embeds = embed(ids[:, 1:-1]).float()  # (B, T-2, D)
    chosen = following[:, 1:-1]  # (B, T-2): target ids, -1 where none was computed
    labels = torch.where(chosen >= 0, t2d[chosen.clamp(min=0)], -1)  # (B, T-2): draft ids, -1 outside
    valid = mask[:, 2:] & (labels >= 0)
    top_ids, top_probs = soft_targets(soft_ids[:, 1:-1], soft_logprobs[:, 1:-1], t2d)  # (B, T-2, K) each
    softened = valid & (top_probs.sum(-1) > 0) if soft else torch.zeros_like(valid)  # (B, T-2): has a distribution
    total, agreement = 0.0, []
    for s, logits in enumerate(head.passes(features[:, :-2], embeds, unroll)):
        keep = valid.clone()
        keep[:, :s] = False  # the first s rows of pass s have no earlier row of the pass before
        if keep.any():
            logprobs = logits[keep].log_softmax(-1)  # (n, Vd)
            hard = -logprobs.gather(-1, labels[keep][:, None])[:, 0]  # (n,)
            fitted = -(top_probs[keep] * logprobs.gather(-1, top_ids[keep])).sum(-1)  # (n,)
            total = total + UNROLL_WEIGHT ** s * torch.where(softened[keep], fitted, hard).mean()
            agreement.append(float((logits[keep].argmax(-1) == labels[keep]).float().mean()))
        else:
            agreement.append(float("nan"))
    return total, agreement


def start_from_target(head: Eagle3Head, model, kept: torch.Tensor, train_head: bool) -> None:
    """The head's lm_head rows and final norm from the target's head rows `kept` and its final norm; the lm_head
    kept fixed unless `train_head`."""
    from edge.model.trimmed_head import kept_rows

    with torch.no_grad():
        head.lm_head.weight.copy_(kept_rows(model, kept).float())  # (Vd, D)
        head.norm.weight.copy_(model.norm.weight.float())  # (D,)
    head.lm_head.weight.requires_grad_(train_head)


def save_head(folder: Path, head: Eagle3Head, kept: torch.Tensor, layers, target_config, card: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().to(torch.bfloat16).contiguous() for name, value in head.state_dict().items()}
    tensors["d2t"] = (kept - torch.arange(kept.numel())).to(torch.int64)  # target id = draft id + d2t[draft id]
    t2d = torch.zeros(target_config.vocab_size, dtype=torch.bool)
    t2d[kept] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": target_config.hidden_size, "intermediate_size": head.midlayer.mlp.up_proj.out_features,
              "num_attention_heads": head.heads, "num_key_value_heads": head.kv_heads, "head_dim": head.head_dim,
              "rms_norm_eps": head.eps, "rope_theta": head.rope_theta, "vocab_size": target_config.vocab_size,
              "draft_vocab_size": int(kept.numel()), "num_hidden_layers": 1, "tie_word_embeddings": False,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [layer + 1 for layer in layers]}}
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.eagle3", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target: a GGUF file or checkpoint folder")
    parser.add_argument("--replies", type=Path, help="the target's replies (python -m train.replies)")
    parser.add_argument("--corpus", type=Path, help="a corpus folder (train.jsonl): conversations with their own "
                        "answers, labelled with the target's greedy choices (--corpus-count of them)")
    parser.add_argument("--corpus-count", type=int, default=0, help="how many corpus conversations to add")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--limit", type=int, default=None, help="use the first N replies")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--unroll", type=int, default=2, help="training-time test: passes on the head's own features")
    parser.add_argument("--intermediate", type=int, default=None, help="the head's MLP width (default: the target's)")
    parser.add_argument("--draft-vocab", default="16384", help="a size (most frequent reply tokens), a JSON file, "
                        "or auto: the vocabulary edge ships for the target's tokenizer, else 16384")
    parser.add_argument("--head-from-target", action=argparse.BooleanOptionalAction, default=True,
                        help="start lm_head and norm from the target's head rows and final norm (default: yes)")
    parser.add_argument("--train-head", action="store_true", help="train the lm_head too (default: kept fixed "
                        "when it starts from the target's)")
    parser.add_argument("--held-out", type=int, default=HELD_OUT, help="replies kept out for the card's figures")
    parser.add_argument("--labels", choices=("soft", "greedy"), default="soft",
                        help="fit the target's distribution over its top tokens (soft, the default) or only its "
                        "greedy choice")
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--install", action="store_true", help="then install the head for the GGUF target, where "
                        "edge-chat and edge-serve find it for that model and every quantization of it (greedy)")
    args = parser.parse_args(argv)
    if args.install and identity(args.target) is None:
        parser.error(f"--install needs a GGUF target edge reads; {args.target} is not one (train without --install "
                     "and pass --drafter eagle3:OUT/final)")

    if args.replies is None and not (args.corpus and args.corpus_count):
        parser.error("give the target's replies (--replies FILE) or corpus conversations (--corpus DIR "
                     "--corpus-count N), or both")
    torch.manual_seed(args.seed)
    engine, layers = target_and_layers(args.target)
    config = engine.model.config
    files = []
    if args.replies is not None:
        replies = [reply for reply in map(json.loads, filter(str.strip, args.replies.read_text().splitlines()))
                   if reply["kind"] != SKIPPED][:args.limit]
        files = extract_features(engine, layers, replies, args.out / "features", distilled=False)
    if args.corpus and args.corpus_count:
        conversations = corpus_conversations(args.corpus, args.corpus_count)
        files += extract_features(engine, layers, conversations, args.out / "features-corpus", distilled=True)
    if len(files) <= args.held_out:
        print(f"train.eagle3: {len(files)} examples are too few (need more than {args.held_out}); make more with "
              "python -m train.replies --count N or add --corpus DIR --corpus-count N", file=sys.stderr)
        return 2
    held_out, training = files[:args.held_out], files[args.held_out:]
    kept = draft_vocabulary(training, shipped_or_size(engine.tokenizer) if args.draft_vocab == "auto"
                            else args.draft_vocab)
    t2d = torch.full((config.vocab_size,), -1, dtype=torch.long)
    t2d[kept] = torch.arange(kept.numel())
    head = Eagle3Head(config.hidden_size, args.intermediate or config.intermediate_size, config.num_heads,
                      config.num_kv_heads, config.head_dim, int(kept.numel()), len(layers), config.rms_norm_eps,
                      config.rope_theta)
    if args.head_from_target:
        start_from_target(head, engine.model, kept, train_head=args.train_head)
    trained = [parameter for parameter in head.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)
    state, step = args.out / "checkpoint.pt", 0
    if state.exists():
        saved = torch.load(state)
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    rng = random.Random(args.seed + step)
    stream = batches(training, args.seq_len, args.batch, rng)
    progress = Progress(args.steps, step, "training")
    started = time.time()
    while step < args.steps:
        ids, mask, following, soft_ids, soft_logprobs, features = next(stream)
        for group in optimizer.param_groups:  # warm up, then cosine down
            group["lr"] = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        loss, agreement = losses(head, engine.model.embed, t2d, ids, mask, following, soft_ids, soft_logprobs,
                                 features, args.unroll, soft=args.labels == "soft")
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        step += 1
        progress.update(step, loss=float(loss.detach()), first=agreement[0])
        if step % args.save_every == 0 or step == args.steps:
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, state)
    progress.close()
    with torch.no_grad():
        scores = [losses(head, engine.model.embed, t2d, *batch, args.unroll)[1]
                  for batch in (next(batches([path], 4096, 1, random.Random(0))) for path in held_out)]
    agreement = [sum(s[i] for s in scores if not math.isnan(s[i])) / max(1, sum(not math.isnan(s[i]) for s in scores))
                 for i in range(args.unroll + 1)]
    card = {"target": str(args.target), "replies": str(args.replies), "corpus": str(args.corpus),
            "corpus_conversations": args.corpus_count if args.corpus else 0, "training_examples": len(training),
            "held_out_examples": len(held_out), "head_from_target": args.head_from_target,
            "head_trained": args.train_head or not args.head_from_target, "steps": step, "batch": args.batch, "seq_len": args.seq_len,
            "unroll": args.unroll, "labels": args.labels, "draft_vocab": int(kept.numel()), "layers": list(layers),
            "held_out_top1_by_draft_position": [round(a, 4) for a in agreement],
            "training_minutes": round((time.time() - started) / 60, 1)}
    save_head(args.out / "final", head, kept, layers, config, card)
    print(json.dumps(card), file=sys.stderr)
    if args.install:
        folder = install_head(args.out / "final", args.target)
        print(f"train.eagle3: installed in {folder}: `edge-chat {args.target} --temperature 0` drafts with it where "
              "no draft model of it is found (a draft model comes first), as with any other quantization of this model; "
              f"--drafter eagle3:{folder} asks for it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
