"""Memory-bound benchmark targets with a trained model's behaviour: the built-in model pair, widened.

    python -m bench.memory_bound OUT [--params 500M] [--draft-params 50M]

Speculative decoding pays when a decode step is bound by reading the weights; the built-in model (10M parameters)
sits in the CPU's cache, and no real 0.5-8B checkpoint can be downloaded here. This writes OUT/target: the built-in
target with extra MLP channels in every layer, sized so that a decode step reads about --params parameters of
weights (matrices and head), and OUT/draft: the built-in draft model widened the same way to --draft-params (a
tenth of the target by default, as real pairs are: 0.5B drafting for 7B).

The extra channels' gate and up rows are small random weights and their down-projection columns are zero, so
every layer adds exactly zero to the residual stream: each widened model's tokens are its built-in model's, at
every precision edge runs (int8 and int4 too: the extra channels' activations stay far below the original ones, so
per-row activation scales do not move, and their zero weight columns quantize to zero). A step still reads and
multiplies every extra weight, as a model of that size does. Both are standard Llama checkpoints (config.json,
model.safetensors in the built-in model's dtype, float16, and its tokenizer) that transformers and llama.cpp load
too; the chat template and tokenizer are the built-in model's.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import torch

from bench.arguments import bench_parser

EXTRA_STD = 2e-3  # the extra gate/up rows: |activations| about 1e-4 of the original channels'
ALIGN = 64  # widths stay a multiple of the kernels' tiles and int4's groups of 32


def parse_count(text: str) -> int:
    """'500M', '1.5B', '150000000' -> a parameter count."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbB]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a parameter count; write e.g. 150M, 500M or 1B")
    scale = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def weight_traffic(config: dict, intermediate: int) -> int:
    """Parameters a decode step reads: every layer's attention and MLP matrices, and the head."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    attention = hidden * head_dim * (2 * config["num_attention_heads"] + 2 * config["num_key_value_heads"])
    return layers * (attention + 3 * hidden * intermediate) + config["vocab_size"] * hidden


def widened_intermediate(config: dict, params: int) -> int:
    """The MLP width at which a step reads about `params` parameters (never narrower than the model's own)."""
    base = config["intermediate_size"]
    per_channel = 3 * config["hidden_size"] * config["num_hidden_layers"]
    extra = max(0, params - weight_traffic(config, base)) // per_channel
    return base + -(-extra // ALIGN) * ALIGN


def widen(source: Path, out: Path, params: int, seed: int = 0) -> dict:
    """Write `source` widened to about `params` parameters of weight traffic into `out`; returns its config."""
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    base = config["intermediate_size"]
    width = widened_intermediate(config, params)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for path in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(path))
    widened = {}
    for name, tensor in tensors.items():
        extra = width - base
        if extra and name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):  # (I, D) -> (I', D)
            rows = torch.randn(extra, tensor.shape[1], generator=generator) * EXTRA_STD
            tensor = torch.cat([tensor, rows.to(tensor.dtype)])
        elif extra and name.endswith("mlp.down_proj.weight"):  # (D, I) -> (D, I'): the extra inputs weigh zero
            tensor = torch.cat([tensor, torch.zeros(tensor.shape[0], extra, dtype=tensor.dtype)], dim=1)
        widened[name] = tensor.contiguous()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in source.iterdir():  # tokenizer, chat template, generation config
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("config.json", "README.md"):
            shutil.copy2(path, out / path.name)
    save_file(widened, out / "model.safetensors", metadata={"format": "pt"})
    config["intermediate_size"] = width
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    traffic = weight_traffic(config, width)
    (out / "README.md").write_text(
        f"# {source.name}, widened to {traffic / 1e6:.0f}M parameters of weight traffic\n\n"
        f"Written by `python -m bench.memory_bound` from edge's built-in `{source.name}` model: MLP width "
        f"{base} -> {width}; the extra channels' down-projection columns are zero, so its tokens are the built-in "
        f"model's while every decode step reads {traffic / 1e6:.0f}M parameters. A benchmark target, not a model "
        f"to use.\n")
    return config


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.memory_bound", __doc__,
                          seed={"default": 0, "help": "seed of the extra channels' small random weights"})
    parser.add_argument("out", type=Path, help="folder to write target/ and draft/ into")
    parser.add_argument("--params", type=parse_count, default=parse_count("500M"),
                        help="the target's weight traffic per step, e.g. 150M, 500M, 1B (default 500M)")
    parser.add_argument("--draft-params", type=parse_count,
                        help="the draft model's (default: a tenth of --params)")
    args = parser.parse_args(argv)
    from edge.sources.builtin import builtin_drafter_path, builtin_model_path

    target_source, draft_source = builtin_model_path(), builtin_drafter_path()
    if target_source is None or draft_source is None:
        parser.error("this install has no built-in model pair to widen (edge/models/default and edge/models/drafter)")
    draft_params = args.draft_params or args.params // 10
    for name, source, params in (("target", target_source, args.params), ("draft", draft_source, draft_params)):
        config = widen(source, args.out / name, params, args.seed)
        traffic = weight_traffic(config, config["intermediate_size"])
        print(f"wrote {args.out / name}: {traffic / 1e6:.0f}M parameters of weight traffic per step "
              f"({config['num_hidden_layers']} layers, MLP width {config['intermediate_size']}, "
              f"{config.get('dtype') or config.get('torch_dtype')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
