"""How close a quantized model stays to the float one: greedy outputs and top-1 agreement over edge-bench's prompts.

    python -m bench.agreement [MODEL] [--weights int8,int4] [--max-new-tokens 64]

For each prompt the float model (the checkpoint as stored) decodes greedily; then, per weights format:
  - greedy: whether the quantized model's own greedy output is the same, and how many leading tokens agree;
  - top-1: over the float model's continuation fed to both (teacher forcing), the share of positions where the
    quantized model's most likely next token is the float model's.
Top-1 agreement is what a drafter sees (a quantized copy drafting for the float target is accepted about that
often, greedily); identical greedy output is the stricter, all-or-nothing measure.
"""

from __future__ import annotations

import statistics

import torch

from bench.arguments import CHECKPOINT_HELP, bench_parser
from bench.prompts import PROMPTS
from edge.frontend.options import resolve_model_path
from edge.model.kv_cache import common_prefix


def continuation(engine, ids: list[int], max_new_tokens: int) -> list[int]:
    engine.reset()
    return [t for event in engine.generate(ids, max_new_tokens=max_new_tokens, temperature=0.0) for t in event.token_ids]


def next_tokens(model, ids: list[int]) -> torch.Tensor:
    """The argmax next token at every position of ids (T,) in one pass."""
    cache = model.new_cache(len(ids) + 1)
    with torch.inference_mode():
        return model.logits(model(torch.tensor([ids]), 0, cache))[0].argmax(dim=-1)  # (T,)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.agreement", __doc__, model=CHECKPOINT_HELP, max_new_tokens=64,
                          weights={"default": "int8,int4", "help": "comma-separated formats to compare (int8, int4)"})
    args = parser.parse_args(argv)
    from edge.engine import Engine

    path = resolve_model_path(args.model)
    reference = Engine.load(path, max_context=2048)
    prompts = [reference.tokenizer.encode_chat(prompt.messages) for prompt in PROMPTS]
    expected = [continuation(reference, ids, args.max_new_tokens) for ids in prompts]
    print("| weights | same greedy output | leading tokens that agree (mean) | top-1 agreement |")
    print("|---|---:|---:|---:|")
    for fmt in [w for w in args.weights.split(",") if w]:
        quantized = Engine.load(path, max_context=2048, weights=fmt)
        same, leading, top1 = 0, [], []
        for ids, wanted in zip(prompts, expected):
            got = continuation(quantized, ids, args.max_new_tokens)
            same += got == wanted
            leading.append(common_prefix(got, wanted) / max(len(wanted), 1))
            full = ids + wanted
            teacher = next_tokens(reference.model, full)[len(ids) - 1:-1]  # the float model's own choices
            student = next_tokens(quantized.model, full)[len(ids) - 1:-1]
            top1.append((teacher == student).float().mean().item())
        print(f"| {fmt} | {same} of {len(prompts)} | {100 * statistics.mean(leading):.0f}% | "
              f"{100 * statistics.mean(top1):.1f}% |")
    matmul = reference.model.runner.matmul
    kernel = matmul.path if matmul is not None else "none (torch)"
    stored = str(reference.model.layers[0].attn.wqkv.weight.dtype).removeprefix("torch.")
    print(f"\n{len(prompts)} prompts, up to {args.max_new_tokens} new tokens each, greedy; float: the checkpoint as "
          f"stored ({stored}); CPU kernel path: {kernel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
