"""Pack a trained feature drafter for shipping beside a real model: 16-bit weights without the target's embedding.

    python -m train.pack_feature_drafter RUN/final --target MODEL --out edge/models/NAME-feature [--vocab VOCAB.json]

train.feature_drafter writes the drafter with a copy of its target's embedding (so the folder loads alone and edge
can check which target it belongs to). For a real model that copy is most of the folder (SmolLM2-135M: 113 MB of a
125 MB folder). The packed folder keeps instead `PROBE_ROWS` rows of it (edge.embedding_probe, and their ids), which
FeatureDrafter.load compares with the target's rows, and shares the target's embedding at run time. It also holds:

    config.json   the drafter's, its dtype the packed one
    vocab.json    the trimmed head's token ids, when --vocab is given (the drafter then drafts over them by itself)
    card.json     the target's vocabulary hash: `--drafter feature` picks the packed drafter whose hash is the model's
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from edge.decoding.drafters.feature import EMBEDDING, PROBE, PROBE_IDS, VOCABULARY
from edge.model.trimmed_head import read_vocabulary
from edge.text.tokenizer import Tokenizer
from edge.sources.model_source import resolve_model

PROBE_ROWS = 64


def pack(run: Path, target: str, out: Path, vocab: Path | None, dtype: torch.dtype) -> dict:
    """Write the packed folder; returns its card."""
    state = load_file(str(run / "model.safetensors"))
    if EMBEDDING not in state:
        raise SystemExit(f"{run} holds no embedding: it is packed already")
    embedding = state.pop(EMBEDDING)  # (V, D)
    ids = torch.linspace(0, embedding.shape[0] - 1, PROBE_ROWS).round().long()  # (n,) spread over the vocabulary
    packed = {name: tensor.to(dtype).contiguous() for name, tensor in state.items()}
    packed[PROBE] = embedding[ids].to(dtype).contiguous()  # (n, D)
    packed[PROBE_IDS] = ids
    out.mkdir(parents=True, exist_ok=True)
    save_file(packed, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((run / "config.json").read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if vocab is not None:
        shutil.copyfile(vocab, out / VOCABULARY)
    tokenizer = Tokenizer.from_dir(resolve_model(target))
    card = {"vocab_sha256": tokenizer.fingerprint()["vocab_sha256"], "target": Path(target).name,
            "trained_run": str(run), "dtype": config["dtype"],
            "trimmed_vocabulary": len(read_vocabulary(vocab)) if vocab is not None else None}
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    return card


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m train.pack_feature_drafter", description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="the folder train.feature_drafter wrote (RUN/final)")
    parser.add_argument("--target", required=True, help="the target model: a folder, a .gguf file or a Hub id")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab", type=Path, default=None, help="the trimmed head's token ids (edge.export.vocab_trim)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    args = parser.parse_args(argv)
    if not (args.run / "model.safetensors").is_file() or not (args.run / "config.json").is_file():
        raise SystemExit(f"{args.run} is not a trained feature drafter (no model.safetensors and config.json); pass "
                         "the final folder python -m train.feature_drafter wrote")
    card = pack(args.run, args.target, args.out, args.vocab, getattr(torch, args.dtype))
    print(f"wrote {args.out} ({card['dtype']}, vocabulary {card['trimmed_vocabulary'] or 'whole'})")


if __name__ == "__main__":
    main()
