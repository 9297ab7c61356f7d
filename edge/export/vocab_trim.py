"""VocabTrim: keep only the head rows of the tokens the target actually produces, for a cheaper drafter.

    counts = count_generated(engine, CALIBRATION_PROMPTS, max_new_tokens=96, extra_text=user_text)
    kept = choose_vocabulary(counts, coverage=0.99, always=tokenizer.special_token_ids)   # sorted ids (V',)

    python -m edge.export.vocab_trim CHECKPOINT -o vocab.json     # the same, for torch drafters: --drafter SPEC@vocab.json

The drafter's head is rebuilt with those rows only (edge/export/onnx_graph.py `head_rows`) and the kept ids are stored
with it; the runtime maps each drafted position back to the full vocabulary (edge.backends.onnx_backend: `vocab_map`),
with the dropped tokens impossible for the drafter. The target still verifies over the full vocabulary, so output is
unchanged: a token outside the kept set is simply never drafted, and the target produces it itself.

The calibration prompts below are general requests of the kind a chat model answers; they are deliberately not the
benchmark's prompts (bench/prompts.py), so benchmark figures are not fitted to the calibration.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from edge.engine import Engine
from edge.errors import EdgeError

CALIBRATION_PROMPTS = (
    "How do I read a text file line by line in Python?",
    "Write a function that returns the n-th Fibonacci number.",
    "What does the `os.path` module provide?",
    "Explain what a list comprehension is, with an example.",
    "Write a Python class for a simple stack with push and pop.",
    "What is the difference between a tuple and a list?",
    "How do I sort a dictionary by its values?",
    "Write a function that checks whether a number is prime.",
    "What is `itertools.chain` used for?",
    "Explain exceptions and the `try` statement.",
    "Write a function that counts the words in a string.",
    "How do I parse command line arguments with argparse?",
    "What does the `re` module do?",
    "Write a generator that yields the lines of a file without their newline.",
    "How do I measure how long a piece of code takes to run?",
    "What is a decorator? Show a small one.",
    "Write a function that merges two sorted lists.",
    "How can I run a shell command and capture its output?",
    "What is the `datetime` module for?",
    "Write a context manager that changes the working directory and restores it.",
    "Summarize what the `collections` module offers.",
    "Translate this loop into a list comprehension: result = []; for x in data: result.append(x * 2)",
    "Write a function that flattens a nested list.",
    "What does `functools.lru_cache` do?",
)


def prompt_ids(tokenizer, request: str, chat_template: str | None = None) -> list[int]:
    """A calibration request as the model sees it: a one-message chat in `chat_template` (a template's source) or
    the tokenizer's own; a base model without either continues the request as plain text."""
    if chat_template is None and tokenizer.chat_template is None:
        return tokenizer.encode(request, add_special_tokens=True)
    return tokenizer.encode_chat([{"role": "user", "content": request}], chat_template=chat_template)


def count_generated(engine, prompts: Sequence[str] = CALIBRATION_PROMPTS, *, max_new_tokens: int = 96,
                    extra_text: str | None = None, progress=None, chat_template: str | None = None) -> Counter:
    """How often the target emits each token id: greedy replies to `prompts` (in `chat_template`, or the
    tokenizer's own; as plain text for a base model), plus every token of `extra_text`."""
    counts: Counter = Counter()
    for index, prompt in enumerate(prompts if max_new_tokens > 0 else ()):
        for event in engine.generate(prompt_ids(engine.tokenizer, prompt, chat_template),
                                     max_new_tokens=max_new_tokens, speculate=False, temperature=0.0):
            counts.update(event.token_ids)
        engine.reset()
        if progress is not None:
            progress(index + 1, len(prompts))
    if extra_text:
        counts.update(engine.tokenizer.encode(extra_text, add_special_tokens=False))
    return counts


def choose_vocabulary(counts: Counter, coverage: float, always: Iterable[int] = (), *,
                      minimum: int = 64) -> list[int]:
    """The fewest most frequent ids covering `coverage` of all counted tokens, plus `always` (special tokens)
    and at least `minimum` ids; sorted. Ties are broken by id, so the choice is deterministic."""
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    total = sum(counts.values())
    if total == 0:
        raise ValueError("no calibration tokens were counted; give prompts the target can answer")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept, covered = [], 0
    for token, count in ranked:
        if covered >= coverage * total and len(kept) >= minimum:
            break
        kept.append(token)
        covered += count
    return sorted(set(kept) | set(always))


def calibrate(engine, coverage: float, *, max_new_tokens: int = 96, extra_text: str | None = None,
              progress=None, chat_template: str | None = None) -> tuple[list[int], dict]:
    """Count the target's tokens on CALIBRATION_PROMPTS (plus `extra_text`) and keep those covering `coverage` of
    them, special and end-of-sequence tokens always; return the kept ids and a report of the choice."""
    counts = count_generated(engine, CALIBRATION_PROMPTS, max_new_tokens=max_new_tokens, extra_text=extra_text,
                             progress=progress, chat_template=chat_template)
    kept = choose_vocabulary(counts, coverage, engine.tokenizer.special_token_ids | set(engine.eos_token_ids))
    report = {"coverage_target": coverage, "kept": len(kept), "vocab_size": engine.model.config.vocab_size,
              "calibration_prompts": len(CALIBRATION_PROMPTS), "calibration_tokens": sum(counts.values()),
              "covered_share": round(covered_share(counts, kept), 4), "user_text": extra_text is not None}
    return kept, report


def covered_share(counts: Counter, kept: Iterable[int]) -> float:
    """Share of the counted tokens that fall inside `kept`."""
    kept = set(kept)
    total = sum(counts.values())
    return sum(count for token, count in counts.items() if token in kept) / total if total else 0.0


def reply_texts(path: Path) -> list[str]:
    """The assistant messages of a JSON-lines file of conversations ({"messages": [...]} per line)."""
    texts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            messages = json.loads(line)["messages"]
            texts += [m["content"] for m in messages if m["role"] == "assistant" and isinstance(m["content"], str)]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}:{number} is not a conversation (expected {{\"messages\": [...]}})") from None
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge.export.vocab_trim",
                                     description="Count the tokens a checkpoint generates on calibration prompts and "
                                                 "write the most frequent ones, for a trimmed drafter head: "
                                                 "edge-chat CHECKPOINT --drafter early-exit:3@vocab.json")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--coverage", type=float, default=0.99, help="share of generated tokens to cover")
    parser.add_argument("--calibration-text", type=Path, help="UTF-8 text whose tokens also count")
    parser.add_argument("--calibration-tokens", type=int, default=96,
                        help="tokens generated per prompt (0: none, count only the texts and replies given)")
    parser.add_argument("--replies", type=Path,
                        help="the target's own replies, which count too: JSON lines of conversations (python -m "
                             "train.replies --target CHECKPOINT writes them); their assistant messages are counted")
    args = parser.parse_args(argv)
    try:
        texts = [args.calibration_text.read_text(encoding="utf-8")] if args.calibration_text else []
        if args.replies:
            texts += reply_texts(args.replies)
        text = "\n\n".join(texts) or None
        engine = Engine.load(args.checkpoint)
        kept, report = calibrate(engine, args.coverage, max_new_tokens=args.calibration_tokens, extra_text=text)
    except (EdgeError, OSError, ValueError) as error:
        print(f"vocab_trim: {error}", file=sys.stderr)
        return 2
    report = {"kept_ids": kept, **report}
    temporary = args.output.with_suffix(args.output.suffix + ".tmp")
    temporary.write_text(json.dumps(report))
    temporary.replace(args.output)
    print(f"wrote {args.output}: {len(kept)} of {report['vocab_size']} tokens cover "
          f"{report['covered_share']:.1%} of {report['calibration_tokens']} calibration tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
