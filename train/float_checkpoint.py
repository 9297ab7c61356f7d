"""A GGUF file (or any model edge loads) as a float32 Hugging Face checkpoint folder, for training against it.

    python -m train.float_checkpoint MODEL OUT

Training a drafter runs the target in transformers (train.feature_drafter), which reads safetensors folders. A GGUF
file's tensors are dequantized to float32 (its exact values: every quantized weight is a float32 number) under
their Hugging Face names, rows back in Hugging Face's order; config.json and the tokenizer files come from the
folder edge reads the file into. The drafter trained on this folder serves the file itself.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch


def write_float_checkpoint(model: str | Path, out: Path) -> Path:
    """`model` (a .gguf file, Hub id or folder) as float32 safetensors in `out`; returns `out`."""
    from safetensors.torch import save_file

    from edge.sources.gguf_checkpoint import gguf_index
    from edge.sources.gguf_weights import float_tensors
    from edge.sources.model_source import resolve_model

    folder = resolve_model(model)
    index = gguf_index(folder)
    if index is None:
        raise SystemExit(f"{model} is not a GGUF file: a checkpoint folder already loads in transformers")
    tensors = float_tensors(folder, index)
    state = {name: tensors[name].to(torch.float32).contiguous() for name in tensors}
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json", "chat_template.jinja"):
        if (folder / name).is_file():
            shutil.copyfile(folder / name, out / name)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.float_checkpoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a .gguf file or a Hub id naming one")
    parser.add_argument("out", type=Path, help="the folder to write")
    args = parser.parse_args(argv)
    print(f"wrote {write_float_checkpoint(args.model, args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
