"""Train the built-in feature drafter (EAGLE-style): a decoder layer that drafts from the target's own features.

    python -m train.feature_drafter --target data/runs/target/final --out data/runs/feature

At position p the drafter sees the target's final (normed) hidden state at p-1 and the embedding of token p,
fused by one linear layer, and runs them through one Llama decoder layer and a norm; its output predicts the
target's hidden state at p, and the target's own (tied) head turns that into the next token. Drafting then
continues from its own predicted features. The target stays frozen; the drafter learns

    loss = KL(target's next-token distribution || drafter's) + feature_weight * SmoothL1(predicted, true feature)

on the same data mixture as the target. To make later draft positions (which run on predicted features) accurate,
a second pass per batch feeds the first pass's predictions back as features ("training-time test").
Seeded and resumable like train.train; writes OUT/log.jsonl and OUT/final (config.json + model.safetensors in
Hugging Face Llama names plus `fc.weight`; the embedding is the target's, stored so the folder loads alone).

A second stage tunes a trained drafter on the target's own greedy replies (`python -m train.replies`), which is
what it drafts at run time, mixed with a share of the corpus:

    python -m train.feature_drafter --init data/runs/feature/final --replies data/replies.jsonl \
        --out data/runs/feature-replies

`--layers 2` grows a drafter by a layer that starts out adding nothing, so tuning starts from the drafter it grows
from.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from train.data import training_streams
from train.progress import Progress
from train.train import (HELP_MIX, REPLIES_HELD_BACK, REPLY_CORPUS_SHARE, REPLY_MIX, Preset, learning_rate,
                         log_record, optimizer_step, save_checkpoint, start_or_resume)

PRESET = Preset(hidden_size=0, intermediate_size=0, num_layers=1, num_heads=0, num_kv_heads=0, steps=1500,
                batch_size=16, seq_len=256, lr=2e-3, warmup=50, mix=HELP_MIX)  # sizes come from the target
TUNE_PRESET = Preset(hidden_size=0, intermediate_size=0, num_layers=1, num_heads=0, num_kv_heads=0, steps=800,
                     batch_size=16, seq_len=256, lr=8e-4, warmup=20, tunes=True, mix=REPLY_MIX)
FEATURE_WEIGHT = 1.0
SECOND_PASS_WEIGHT = 0.5


class FeatureDrafter(nn.Module):
    """fc(cat(feature[p-1], embed(token[p]))) -> `layers` Llama layers (one by default) -> norm = predicted
    feature[p]."""

    def __init__(self, target_config, layers: int = 1) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        config = LlamaConfig(**{**target_config.to_dict(), "num_hidden_layers": layers})
        config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.body = LlamaModel(config)

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor) -> torch.Tensor:
        """features, token_embeds (B, T, D) -> predicted next features (B, T, D)."""
        fused = self.fc(torch.cat((features, token_embeds), dim=-1))  # (B, T, D)
        return self.body(inputs_embeds=fused).last_hidden_state  # (B, T, D), causal (SDPA is_causal)

    def init_from_target(self, target) -> None:
        """Start from the target's last layer and final norm, and a fusion that passes the feature through; layers
        after the first start as the target's last layer with zero output projections (they add nothing yet)."""
        for index, layer in enumerate(self.body.layers):
            layer.load_state_dict(target.model.layers[-1].state_dict())
            if index:
                _adds_nothing(layer)
        self.body.norm.load_state_dict(target.model.norm.state_dict())
        self.body.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
        self.body.embed_tokens.requires_grad_(False)
        hidden = self.config.hidden_size
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, :hidden].copy_(torch.eye(hidden))
            self.fc.weight[:, hidden:].copy_(torch.eye(hidden))

    def load_trained(self, folder: Path) -> None:
        """The weights a trained drafter saved in `folder` (its embedding stays the target's). A drafter with more
        layers than the saved one keeps its extra layers as init_from_target left them (adding nothing), so it
        starts out drafting exactly as the saved one does."""
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        with torch.no_grad():
            self.fc.weight.copy_(state.pop("fc.weight"))
        state = {name.removeprefix("model."): tensor for name, tensor in state.items()}
        saved_layers = len({name.split(".")[1] for name in state if name.startswith("layers.")})
        if saved_layers > len(self.body.layers):
            raise SystemExit(f"--init {folder} has {saved_layers} layers, more than --layers {len(self.body.layers)}; "
                             f"pass --layers {saved_layers} or more")
        missing, unexpected = self.body.load_state_dict(state, strict=False)
        if unexpected or any(not name.startswith("layers.") or int(name.split(".")[1]) < saved_layers
                             for name in missing):
            raise SystemExit(f"{folder} does not hold a feature drafter's weights (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
        self.body.embed_tokens.requires_grad_(False)

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        state = {f"model.{name}": tensor.detach().contiguous() for name, tensor in self.body.state_dict().items()}
        state["fc.weight"] = self.fc.weight.detach().contiguous()
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        # the drafter uses the target's head, whatever it is: no lm_head of its own
        config = {**self.config.to_dict(), "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True,
                  "edge_drafter": "feature"}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _adds_nothing(layer: nn.Module) -> None:
    """Zero a decoder layer's output projections: its residual branches add nothing until training moves them."""
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def drafter_losses(drafter: FeatureDrafter, target, tokens: torch.Tensor,
                   kept: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Both passes' losses over positions 1..T-1 of a (B, T) batch; with `kept` (V',) token ids, over the head's rows
    of those tokens only (the distributions renormalized over them), as the drafter then drafts with a trimmed head
    (SPEC@vocab.json): on a large vocabulary the head is most of a training step."""
    head = target.lm_head.weight if kept is None else target.lm_head.weight[kept]  # (V or V', D), frozen
    with torch.no_grad():
        features = target.model(tokens).last_hidden_state  # (B, T, D), after the final norm
        target_logp = F.linear(features, head).float().log_softmax(-1)  # (B, T, V or V')
    embeds = target.model.embed_tokens(tokens[:, 1:])  # (B, T-1, D)
    wanted, wanted_logp = features[:, 1:], target_logp[:, 1:]  # what position p should predict
    total, parts = 0.0, {}
    inputs = features[:, :-1]  # (B, T-1, D): the true feature of the previous position
    for index, weight in enumerate((1.0, SECOND_PASS_WEIGHT)):
        predicted = drafter(inputs, embeds)  # (B, T-1, D)
        logp = F.linear(predicted, head).float().log_softmax(-1)  # (B, T-1, V)
        kl = F.kl_div(logp.flatten(0, 1), wanted_logp.flatten(0, 1), log_target=True, reduction="batchmean")
        regression = F.smooth_l1_loss(predicted.float(), wanted.float())
        total = total + weight * (kl + FEATURE_WEIGHT * regression)
        agree = (logp.argmax(-1) == wanted_logp.argmax(-1)).float().mean().item()
        parts.update({f"kl{index + 1}": kl.item(), f"reg{index + 1}": regression.item(), f"agree{index + 1}": agree})
        # the second pass sees the first pass's predictions as the previous features, as later drafts do
        inputs = torch.cat((features[:, :1], predicted[:, :-1]), dim=1)  # (B, T-1, D)
    return total, parts


@torch.no_grad()
def heldout_agreement(drafter: FeatureDrafter, target, batches, kept: torch.Tensor | None = None) -> list[float]:
    """How often the drafter's top token equals the target's, from true features and from its own (two passes)."""
    agree = [0.0, 0.0]
    for tokens, _ in batches:
        _, parts = drafter_losses(drafter, target, tokens, kept)
        agree[0] += parts["agree1"]
        agree[1] += parts["agree2"]
    return [value / len(batches) for value in agree]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.feature_drafter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=Path("data/runs/target/final"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    parser.add_argument("--target-tokenizer", action="store_true",
                        help="encode the data with the target folder's own tokenizer and chat template instead of "
                             "--tokenizer: a drafter for a real model (its folder from python -m "
                             "train.float_checkpoint FILE.gguf OUT)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--init", type=Path, help="start from this trained feature drafter (the tuning stage)")
    parser.add_argument("--replies", type=Path,
                        help="the target's replies (python -m train.replies): tune on them, with --init")
    parser.add_argument("--steps", type=int, help="override the number of steps (default: 1500, tuning: 800)")
    parser.add_argument("--precision", choices=["bfloat16", "float32"], default="bfloat16",
                        help="the training forward's precision: bfloat16 autocast is faster on CPUs with AVX-512 BF16 "
                             "or AMX, and 20x slower than float32 on an AVX2 CPU (Zen 3)")
    parser.add_argument("--layers", type=int, default=1,
                        help="decoder layers in the drafter (default 1); with --init from a drafter with fewer, the "
                             "added layers start adding nothing")
    parser.add_argument("--vocab", type=Path,
                        help="train over the head rows of these token ids only (a JSON file from python -m "
                             "edge.export.vocab_trim): the drafter then runs as feature:PATH@VOCAB.json")
    parser.add_argument("--batch-size", type=int, help="override the batch size (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--heldout-batches", type=int, default=8)
    args = parser.parse_args(argv)
    if (args.init is None) != (args.replies is None):
        parser.error("the tuning stage takes both --init (a trained drafter) and --replies (the target's replies)")
    preset = TUNE_PRESET if args.replies else PRESET
    preset = Preset(**{**preset.__dict__, "steps": args.steps or preset.steps,
                       "batch_size": args.batch_size or preset.batch_size})

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoModelForCausalLM

    from train.tokenizer import TargetTokenizer, load_tokenizer

    tokenizer = TargetTokenizer(args.target) if args.target_tokenizer else load_tokenizer(args.tokenizer)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32, attn_implementation="sdpa")
    target.eval().requires_grad_(False)
    stream, heldout, replies_trained = training_streams(
        args.corpus, tokenizer, preset.mix, preset.seq_len, preset.batch_size, args.seed, args.heldout_batches,
        args.replies, REPLIES_HELD_BACK)

    kept = None
    if args.vocab is not None:
        from edge.model.trimmed_head import read_vocabulary

        kept = read_vocabulary(args.vocab)  # (V',) sorted ids
    drafter = FeatureDrafter(target.config, args.layers)
    drafter.init_from_target(target)
    if args.init:
        drafter.load_trained(args.init)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, elapsed_before, checkpoint_path, log_path = start_or_resume(
        args.out, drafter, optimizer, stream, None,
        {"steps": preset.steps, "batch_size": preset.batch_size, "seq_len": preset.seq_len, "lr": preset.lr,
         "seed": args.seed, "feature_weight": FEATURE_WEIGHT, "second_pass_weight": SECOND_PASS_WEIGHT,
         "layers": args.layers,
         "parameters": sum(p.numel() for p in trainable), "init": str(args.init) if args.init else None,
         "replies": str(args.replies) if args.replies else None, "mix": preset.mix,
         "corpus_share": REPLY_CORPUS_SHARE if args.replies else 1.0,
         "replies_trained": replies_trained,
         "replies_held_back": REPLIES_HELD_BACK if args.replies else 0, "precision": args.precision,
         "vocab": str(args.vocab) if args.vocab else None, "kept_tokens": int(kept.numel()) if kept is not None
         else None},
        "the feature drafter")

    def evaluate(step: int, elapsed: float) -> None:
        drafter.eval()
        agreements = {f"{name}_agreement": heldout_agreement(drafter, target, batches, kept)
                      for name, batches in heldout.items()}
        drafter.train()
        log_record(log_path, {"event": "eval", "step": step, "elapsed_s": elapsed, **agreements})
        progress.note(" ".join(f"{name} {a[0]:.3f} / {a[1]:.3f}" for name, a in agreements.items()))

    progress = Progress(preset.steps, start=step, label="feature drafter")
    if args.init and step == 0:
        evaluate(0, 0.0)  # where the tuning starts from
    started = time.perf_counter()
    drafter.train()
    while step < preset.steps:
        tokens, _ = stream.next_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bfloat16"):
            loss, parts = drafter_losses(drafter, target, tokens, kept)
        grad_norm = optimizer_step(optimizer, loss, trainable, step, preset)
        step += 1
        elapsed = elapsed_before + time.perf_counter() - started
        progress.update(step, loss=loss.item())
        if step % 10 == 0 or step == preset.steps:
            log_record(log_path, {"event": "train", "step": step, "loss": loss.item(), "grad_norm": grad_norm,
                            "lr": learning_rate(step - 1, preset), "elapsed_s": elapsed, **parts})
        if step % args.eval_every == 0 or step == preset.steps:
            evaluate(step, elapsed)
        if step % args.save_every == 0 or step == preset.steps:
            save_checkpoint(checkpoint_path, drafter, optimizer, step, stream, None, elapsed)
    progress.close()
    drafter.eval()
    drafter.save(args.out / "final")
    log_record(log_path, {"event": "done", "step": step, "elapsed_s": elapsed_before + time.perf_counter() - started})
    print(f"wrote {args.out / 'final'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
