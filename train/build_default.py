"""Rebuild the built-in default model pair from a fresh clone, in one command (about three hours on 2 CPU
cores):

    pip install -e '.[train]' && python -m train.build_default

corpus -> tokenizer -> target (LayerSkip) -> drafter (distilled) -> feature drafter (on the target's hidden states)
-> the target's greedy replies to training-split questions -> both drafters tuned on them
-> the feature drafter tuned again on replies to requests of the benchmarks' kinds (train.task_turns)
-> a copy of it grown to two layers and tuned on the same replies (for memory-bound targets)
-> half-precision copies in edge/models/
-> model cards with the loss curve, held-out perplexities and samples -> the golden outputs CI checks. Each stage is skipped when its output
exists, and training resumes from its last checkpoint, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "edge" / "models"
TASK_REPLY_COUNT = 3500  # of each kind: corpus turns and task requests (train.replies --requests both)
TASK_TUNING_STEPS = 600


def package_half_precision(final: Path, destination: Path) -> None:
    """Save a trained float32 checkpoint as float16 safetensors plus its tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    staging = destination.with_name(destination.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.to(torch.float16).save_pretrained(staging, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (final / name).is_file():
            shutil.copy(final / name, staging / name)
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)  # a half-written model never replaces a good one


def package_feature_drafter(final: Path, destination: Path) -> None:
    """Save a trained feature drafter (train.feature_drafter) as float16 safetensors with its config."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    tensors = {name: tensor.to(torch.float16) if tensor.is_floating_point() else tensor
               for name, tensor in load_file(final / "model.safetensors").items()}
    config = json.loads((final / "config.json").read_text())
    staging = destination.with_name(destination.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    (staging / "config.json").write_text(json.dumps({**config, "torch_dtype": "float16"}, indent=2) + "\n")
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.build_default", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "data", help="corpus, tokenizer and runs (default: data/)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    work = args.work
    corpus, tokenizer, runs = work / "corpus", work / "tokenizer", work / "runs"

    from train import corpus as corpus_cli
    from train import feature_drafter as feature_cli
    from train import golden
    from train import model_card
    from train import replies as replies_cli
    from train import tokenizer as tokenizer_cli
    from train import train as train_cli

    if not (corpus / "train.jsonl").is_file():
        corpus_cli.main(["--out", str(corpus), "--seed", str(args.seed)])
    if not (tokenizer / "tokenizer.json").is_file():
        tokenizer_cli.main(["--corpus", str(corpus), "--out", str(tokenizer), "--vocab-size", "4096"])
    common = ["--corpus", str(corpus), "--tokenizer", str(tokenizer), "--seed", str(args.seed)]
    if not (runs / "target" / "final" / "model.safetensors").is_file():
        train_cli.main(["--preset", "target", "--out", str(runs / "target"), *common])
    if not (runs / "drafter" / "final" / "model.safetensors").is_file():
        train_cli.main(["--preset", "drafter", "--out", str(runs / "drafter"),
                        "--teacher", str(runs / "target" / "final"), *common])
    if not (runs / "feature" / "final" / "model.safetensors").is_file():
        feature_cli.main(["--target", str(runs / "target" / "final"), "--out", str(runs / "feature"), *common])
    package_half_precision(runs / "target" / "final", MODELS / "default")
    replies = work / "replies.jsonl"
    if not replies.is_file():  # the shipped (half-precision) target answers, as it will at run time
        replies_cli.main(["--target", str(MODELS / "default"), "--corpus", str(corpus), "--out", str(replies)])
    if not (runs / "feature-replies" / "final" / "model.safetensors").is_file():
        feature_cli.main(["--target", str(runs / "target" / "final"), "--init", str(runs / "feature" / "final"),
                          "--replies", str(replies), "--out", str(runs / "feature-replies"), *common])
    if not (runs / "drafter-replies" / "final" / "model.safetensors").is_file():
        train_cli.main(["--preset", "drafter-replies", "--init", str(runs / "drafter" / "final"),
                        "--replies", str(replies), "--teacher", str(runs / "target" / "final"),
                        "--out", str(runs / "drafter-replies"), *common])
    package_half_precision(runs / "drafter-replies" / "final", MODELS / "drafter")
    package_feature_drafter(runs / "feature-replies" / "final", MODELS / "feature")
    conversations = work / "task-replies.jsonl"
    if not conversations.is_file():  # corpus turns and requests of the benchmarks' kinds, in turn
        replies_cli.main(["--target", str(MODELS / "default"), "--corpus", str(corpus), "--requests", "both",
                          "--count", str(TASK_REPLY_COUNT), "--out", str(conversations)])
    # the task-tuned drafter from the one shipped just before, then its two-layer copy from it
    for run, layers, folder in (("feature-tasks", 1, "feature"), ("feature-deep", 2, "feature-deep")):
        if not (runs / run / "final" / "model.safetensors").is_file():
            feature_cli.main(["--target", str(MODELS / "default"), "--init", str(MODELS / "feature"),
                              "--layers", str(layers), "--replies", str(conversations), "--out", str(runs / run),
                              "--steps", str(TASK_TUNING_STEPS), "--eval-every", "200", "--precision", "float32",
                              *common])
        package_feature_drafter(runs / run / "final", MODELS / folder)
    model_card.main(["--runs", str(runs), "--corpus", str(corpus), "--models", str(MODELS)])
    golden.main()  # the greedy replies CI checks the shipped model against
    print(f"built-in models written to {MODELS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
