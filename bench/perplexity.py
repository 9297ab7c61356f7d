"""Perplexity and top-1 agreement of models on the same text: how far a quantization moves a model.

    python -m bench.perplexity MODEL[@WEIGHTS] [MODEL[@WEIGHTS] ...] [--reference MODEL] [--tokens 16384]

Each model is a checkpoint folder, a .gguf file or a Hub id; `@int4` (or any --weights value) loads it with that
re-quantization. The text is the prose of Python's own documentation topics (`pydoc_data.topics`, shipped with the
interpreter: offline and the same everywhere), encoded with the first model's tokenizer, cut into windows of
--context tokens; as llama.cpp's perplexity tool does, each window's second half is scored with the first half as
context. Top-1 agreement is the share of scored positions where a model's most likely token is the reference's (the
first model unless --reference names one).
"""

from __future__ import annotations

import math
import sys

import torch

from bench.arguments import bench_parser


def evaluation_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def scored(spec: str, windows: list[torch.Tensor], context: int) -> tuple[float, list[torch.Tensor], float]:
    """(mean negative log-likelihood, each window's argmax over its scored half, bits per weight)."""
    from edge.engine import Engine

    path, _, weights = spec.partition("@")
    engine = Engine.load(path, max_context=context + 1, weights=weights or None)
    model = engine.model
    total, count, argmaxes = 0.0, 0, []
    with torch.inference_mode():
        for window in windows:
            logits = model.forward_logits(window[None], 0, model.new_cache(context))[0].float()  # (T, V)
            half = context // 2
            predicted, targets = logits[half - 1:-1], window[half:]  # position t predicts token t + 1
            total += torch.nn.functional.cross_entropy(predicted, targets, reduction="sum").item()
            count += targets.numel()
            argmaxes.append(predicted.argmax(dim=-1))
    bits = 8 * model.weight_bytes() / parameters(model.config)
    return total / count, argmaxes, bits


def parameters(config) -> int:
    return config.shape().parameters()


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.perplexity", __doc__,
                          tokens={"default": 16384, "help": "tokens of text to use (default: 16384)"},
                          context={"default": 512, "help": "tokens per window (default: 512)"})
    parser.add_argument("models", nargs="+", help="MODEL or MODEL@WEIGHTS (int8, int4, float16)")
    parser.add_argument("--reference", help="the model top-1 agreement is measured against (default: the first)")
    args = parser.parse_args(argv)
    from edge.frontend.options import resolve_model_path
    from edge.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(resolve_model_path(args.models[0].partition("@")[0]))
    ids = tokenizer.encode(evaluation_text())[:args.tokens]
    windows = [torch.tensor(ids[i:i + args.context]) for i in range(0, len(ids) - args.context + 1, args.context)]
    reference = args.reference or args.models[0]
    results = {spec: scored(spec, windows, args.context) for spec in dict.fromkeys([reference, *args.models])}
    _, expected, _ = results[reference]
    print(f"{len(windows)} windows of {args.context} tokens, the second half of each scored "
          f"({len(windows) * (args.context // 2)} tokens); top-1 agreement with {reference}", file=sys.stderr)
    print("| model | bits per weight | perplexity | top-1 agreement |")
    print("|---|---:|---:|---:|")
    for spec in args.models:
        loss, argmaxes, bits = results[spec]
        agree = sum((a == b).sum().item() for a, b in zip(argmaxes, expected)) / sum(a.numel() for a in expected)
        print(f"| {spec} | {bits:.2f} | {math.exp(loss):.3f} | {agree:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
