"""Requests of the kinds edge-bench measures (Spec-Bench's six categories: multi-turn, translation, summarization,
question answering, math, retrieval-augmented answers; and code), written from the corpus's training split, for the
target to answer (train.replies --requests tasks).

The corpus's own chat turns are all of a few shapes ("Describe `x`", "Write a Python function ... that does the
following"), while people also paste text to summarize, code to rewrite and documentation to answer from. A drafter
tuned only on replies to the corpus's shapes agrees with the target less often on the others, so its tuning set
holds replies to these requests too. Every pasted text comes from the training split, and no request names a module
that edge-bench's prompts (bench/prompts.py) are about, so the benchmark's prompts stay unseen.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from train.corpus import read_jsonl

# the modules edge-bench's prompts are about: never pasted or named here
BENCH_MODULES = frozenset({"json", "shutil", "collections", "os", "posixpath", "ntpath", "genericpath"})

SUMMARIZE = ("Summarize this documentation in two sentences:", "Give a one-sentence summary of this text:",
             "Summarize this in plain words:", "What is the gist of this documentation?")
SUMMARIZE_CODE = ("Summarize what this function does:", "Explain briefly what this code does:",
                  "Describe this function in one sentence:")
REWRITE = ("Rewrite this code in modern Python 3 style:", "Translate this Python 2 code to Python 3:",
           "Rewrite this function with type hints:", "Rewrite this code to be shorter:",
           "Translate this code to idiomatic Python:")
RAG_LEAD = ("Using this documentation:", "Read this documentation and answer the question.",
            "Here is part of the documentation:")
RAG_QUESTION = ("What does `{name}` do?", "How do I use `{name}`?", "When should I use `{name}`?",
                "What does the `{module}` module provide?")
QUESTIONS = ("What does the `{module}` module do?", "Explain `{name}` in Python.", "What is `{name}` for?",
             "How does `{name}` work?")
FOLLOW_UPS = ("What does `{name}` do?", "And what about `{name}`?", "Can you explain `{name}` too?")
MATH = (("factorial(n)", "returns n factorial"), ("median(values)", "returns the median of a list"),
        ("variance(values)", "returns the variance of a list of numbers"), ("is_prime(n)", "tells whether n is prime"),
        ("lcm(a, b)", "returns the least common multiple"), ("fibonacci(n)", "returns the n-th Fibonacci number"),
        ("sum_of_squares(values)", "returns the sum of the squares of a list"),
        ("dot(a, b)", "returns the dot product of two lists"), ("clamp(x, low, high)", "limits x to [low, high]"),
        ("power(base, exponent)", "raises base to an integer power"), ("digits(n)", "returns the digits of n"),
        ("average_speed(distance, time)", "returns distance over time"),
        ("percent(part, whole)", "returns part as a percentage of whole"),
        ("is_even(n)", "tells whether n is even"), ("hypotenuse(a, b)", "returns the hypotenuse of a right triangle"))
CLASSES = (("Queue", "enqueue, dequeue and is_empty"), ("Counter", "increment, reset and value"),
           ("Point", "x, y and distance_to"), ("Matrix", "rows, columns and transpose"),
           ("Account", "deposit, withdraw and balance"), ("Timer", "start, stop and elapsed"),
           ("LinkedList", "append, remove and __len__"), ("Inventory", "add, remove and count"))


def _allowed(example: dict) -> bool:
    return example["source"].split(".")[0] not in BENCH_MODULES  # os.path and its submodules go with os


def _named(text: str) -> str | None:
    """The first `name` a corpus turn asks about."""
    found = re.search(r"`([A-Za-z_][\w.]*)", text)
    return found.group(1).split("(")[0] if found else None


def _code_of(answer: str) -> str | None:
    found = re.search(r"```(?:python)?\n(.*?)```", answer, re.S)
    return found.group(1).strip() + "\n" if found and 2 <= found.group(1).count("\n") <= 20 else None


def task_requests(corpus_dir: Path, count: int, seed: int) -> list[list[dict]]:
    """`count` conversations (each ending with a user message), the seven kinds (six categories and code) in turn, from the training split."""
    rng = random.Random(seed)
    chats = [e for e in read_jsonl(corpus_dir / "train.jsonl") if "messages" in e and _allowed(e)]
    rng.shuffle(chats)
    docs = [e for e in chats if e["kind"] in ("chat_module", "chat_class", "chat_docstring")
            and 120 <= len(e["messages"][1]["content"]) <= 700]
    functions = [(e, code) for e in chats if e["kind"] == "chat_function"
                 for code in [_code_of(e["messages"][1]["content"])] if code]
    by_module: dict[str, list[dict]] = {}
    for example in chats:
        by_module.setdefault(example["source"], []).append(example)

    def user(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    def multi_turn() -> list[dict]:
        first = rng.choice(chats)
        others = [e for e in by_module[first["source"]] if e is not first and _named(e["messages"][0]["content"])]
        name = _named(rng.choice(others)["messages"][0]["content"]) if others else first["source"]
        return [*first["messages"], {"role": "user", "content": rng.choice(FOLLOW_UPS).format(name=name)}]

    def summarization() -> list[dict]:
        if rng.random() < 0.5:
            return user(f"{rng.choice(SUMMARIZE)}\n\n{rng.choice(docs)['messages'][1]['content']}")
        return user(f"{rng.choice(SUMMARIZE_CODE)}\n\n{rng.choice(functions)[1]}")

    def translation() -> list[dict]:
        return user(f"{rng.choice(REWRITE)}\n\n{rng.choice(functions)[1]}")

    def rag() -> list[dict]:
        doc = rng.choice(docs)
        name = _named(doc["messages"][0]["content"]) or doc["source"]
        question = rng.choice(RAG_QUESTION).format(name=name, module=doc["source"])
        return user(f"{rng.choice(RAG_LEAD)}\n\n{doc['messages'][1]['content']}\n\n{question}")

    def qa() -> list[dict]:
        example = rng.choice(chats)
        name = _named(example["messages"][0]["content"]) or example["source"]
        return user(rng.choice(QUESTIONS).format(name=name, module=example["source"]))

    def math() -> list[dict]:
        signature, purpose = rng.choice(MATH)
        return user(f"Write a Python function `{signature}` that {purpose}.")

    def code() -> list[dict]:
        if rng.random() < 0.3:
            name, methods = rng.choice(CLASSES)
            return user(f"Write a Python class `{name}` with {methods} methods.")
        return [rng.choice(functions)[0]["messages"][0]]

    kinds = (multi_turn, translation, summarization, qa, math, rag, code)
    return [kinds[index % len(kinds)]() for index in range(count)]
