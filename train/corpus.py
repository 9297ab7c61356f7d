"""Build the training corpus for edge's built-in model from the Python standard library (PSF licence).

    python -m train.corpus --out data/corpus [--seed 0]

Everything comes from the running interpreter: the stdlib sources (parsed with `ast`) and the pydoc topics. Each
module yields chat examples (write a function from its docstring, explain a class, a module, a function) and plain
code chunks for continuation; each pydoc topic yields one chat example. The output is deterministic (sorted walk,
RNGs seeded per example), deduplicated by normalised content, and split by module into train and heldout so that no
function appears in both.

Output, under --out: `train.jsonl`, `heldout.jsonl` (one example per line, shuffled with the seed) and
`stats.json`. An example is {"id", "kind", "source", "messages"} for chat kinds or {"id", "kind", "source", "text"}
for "code"; `messages` is [user, assistant] with "role" and "content" keys.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import platform
import random
import re
import sysconfig
import textwrap
import time
import tokenize
import warnings
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

KINDS = ("chat_function", "chat_class", "chat_module", "chat_docstring", "chat_topic", "code")
SPLITS = ("train", "heldout")
TOPICS_SOURCE = "pydoc_topics"
HELDOUT_PERCENT = 3

SKIP_DIRS = frozenset({
    "test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__", "turtledemo", "tkinter", "ensurepip",
    "pydoc_data",
})
MAX_FILE_BYTES = 200_000
GENERATED_MARKER = "gencodec.py"
MAX_FUNCTION_LINES = 60
MAX_CHUNK_LINES = 120
MIN_CHUNK_CHARS = 40
MIN_DOC_WORDS = 3
MODULE_DOC_PARAGRAPHS, MODULE_DOC_CHARS = 3, 1500
CLASS_DOC_PARAGRAPHS, CLASS_DOC_CHARS = 2, 1500
FUNCTION_DOC_PARAGRAPHS, FUNCTION_DOC_CHARS = 3, 1500
TOPIC_CHARS = 2000
FENCE_PROBABILITY = 0.5
# Text that holds one of these would be read as a special token by the tokenizer; such examples are dropped.
RESERVED_MARKERS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

FUNCTION_PROMPTS = (
    "Write a Python {what} `{signature}` that does the following: {summary}",
    "Implement `{signature}` in Python.\n\n{summary}",
    "Write the {what} `{signature}` from the `{module}` module. Its documentation says: {summary}",
    "Can you write a Python {what} `{signature}`? It should do this: {summary}",
    'Here is a docstring:\n\n"""{summary}"""\n\nWrite the Python {what} `{signature}` that it describes.',
    "Please implement the {what} `{signature}`. Description: {summary}",
    "Show me how Python's `{module}` module implements `{signature}`. The docstring reads: {summary}",
    "Write a Python {what} named `{name}` with the parameters `({parameters})`. Purpose: {summary}",
)
CLASS_PROMPTS = (
    "What is `{module}.{qualname}` for?",
    "What does the `{qualname}` class in `{module}` do?",
    "Explain the `{module}.{qualname}` class.",
    "Describe the purpose of the `{qualname}` class from Python's `{module}` module.",
    "What is `{qualname}` in the `{module}` module?",
    "Tell me about `{module}.{qualname}`.",
    "When would I use `{module}.{qualname}`?",
)
MODULE_PROMPTS = (
    "What does the `{module}` module do?",
    "Explain the purpose of Python's `{module}` module.",
    "What is the `{module}` module for?",
    "Describe the `{module}` module in the Python standard library.",
    "Tell me about Python's `{module}` module.",
    "What is `{module}` used for in Python?",
    "Give me an overview of the `{module}` module.",
)
DOCSTRING_PROMPTS = (
    "What does `{module}.{qualname}` do?",
    "Explain the `{qualname}` {what} in Python's `{module}` module.",
    "What is the purpose of `{module}.{qualname}()`?",
    "Describe `{module}.{qualname}`.",
    "How do I use `{module}.{qualname}`?",
    "Tell me about the {what} `{qualname}` in `{module}`.",
    "What is `{module}.{qualname}` used for?",
)
TOPIC_PROMPTS = (
    "Explain the `{topic}` topic in Python.",
    "What should I know about {words} in Python?",
    "Tell me about {words} in Python.",
    "What does the Python documentation say about {words}?",
    "Describe {words} in Python.",
    "Explain {words} in the Python language.",
)


# ---------------------------------------------------------------------------------------------------------------
# Hashing, seeding and the split
# ---------------------------------------------------------------------------------------------------------------


def stable_hash(*parts: object) -> str:
    """A hex SHA-256 of the parts (joined by NUL), identical across runs and machines."""
    return hashlib.sha256("\0".join(str(part) for part in parts).encode("utf-8")).hexdigest()


def is_heldout(name: str) -> bool:
    """Whether a module (or pydoc topic) goes to the heldout split: its stable hash mod 100 < HELDOUT_PERCENT."""
    return int(stable_hash(name), 16) % 100 < HELDOUT_PERCENT


def _rng(seed: int, *key: object) -> random.Random:
    """An RNG for one example, seeded from the global seed and the example's key (independent of build order)."""
    return random.Random(int(stable_hash(seed, *key)[:16], 16))


def _example_id(kind: str, source: str, key: str, content: object) -> str:
    """The stable id of an example: a hash of what identifies it and of its content."""
    return stable_hash(kind, source, key, json.dumps(content, ensure_ascii=False, sort_keys=True))[:16]


def _chat(kind: str, source: str, key: str, user: str, assistant: str) -> dict:
    """A chat example: the user's question and the assistant's answer."""
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"id": _example_id(kind, source, key, messages), "kind": kind, "source": source, "messages": messages}


def _code(source: str, key: str, text: str) -> dict:
    """A plain code example for continuation."""
    return {"id": _example_id("code", source, key, text), "kind": "code", "source": source, "text": text}


# ---------------------------------------------------------------------------------------------------------------
# Finding and parsing the stdlib modules
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    """A stdlib source file and its dotted module name."""

    name: str
    path: Path


@dataclass(frozen=True)
class ParsedModule:
    """A module's source text and syntax tree."""

    name: str
    source: str
    tree: ast.Module

    @cached_property
    def lines(self) -> list[str]:
        """The source's lines with their newlines, split as `ast` counts them."""
        return _source_lines(self.source)


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_modules(root: Path | None = None) -> list[Module]:
    """Every .py file of the stdlib outside the skipped packages, sorted by module name."""
    root = Path(root) if root is not None else stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(name for name in dirnames if name not in SKIP_DIRS and name.isidentifier())
        package = list(Path(dirpath).relative_to(root).parts)
        for filename in sorted(filenames):
            stem = filename[:-3]
            if not filename.endswith(".py") or not stem.isidentifier():
                continue
            parts = package if stem == "__init__" else package + [stem]
            if parts:
                found.append(Module(".".join(parts), Path(dirpath) / filename))
    return sorted(found, key=lambda module: module.name)


def parse_module(module: Module) -> ParsedModule | str:
    """Read and parse a module; a reason string when it is skipped: "too_large", "parse_error", or "generated"
    (the encodings.* character-mapping tables written by gencodec.py, which are data rather than code)."""
    if module.path.stat().st_size > MAX_FILE_BYTES:
        return "too_large"
    try:
        with tokenize.open(module.path) as handle:
            source = handle.read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=str(module.path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return "parse_error"
    if GENERATED_MARKER in (ast.get_docstring(tree) or ""):
        return "generated"
    return ParsedModule(module.name, source, tree)


# ---------------------------------------------------------------------------------------------------------------
# Text helpers
# ---------------------------------------------------------------------------------------------------------------


def _paragraphs(text: str) -> list[str]:
    """The blank-line separated paragraphs of a text, keeping each paragraph's inner lines and indentation."""
    pieces = re.split(r"\n[ \t]*\n(?:[ \t]*\n)*", text.strip("\n"))
    return [piece.rstrip() for piece in pieces if piece.strip()]


def _cut_at_sentence(text: str, max_chars: int) -> str:
    """Shorten one long paragraph to at most max_chars, at a sentence end when one is in the second half."""
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    end = max(head.rfind(". "), head.rfind(".\n"))
    if end >= max_chars // 2:
        return head[:end + 1]
    space = max(head.rfind(" "), head.rfind("\n"))
    return head[:space].rstrip() if space > 0 else head


def leading_paragraphs(text: str, max_paragraphs: int, max_chars: int) -> str:
    """The first paragraphs of a text that fit in max_chars together (at least part of the first one)."""
    paragraphs = _paragraphs(text)
    kept: list[str] = []
    for paragraph in paragraphs[:max_paragraphs]:
        if len("\n\n".join(kept + [paragraph])) > max_chars:
            break
        kept.append(paragraph)
    if not kept and paragraphs:
        return _cut_at_sentence(paragraphs[0], max_chars)
    return "\n\n".join(kept)


def _collapse(text: str) -> str:
    """Whitespace collapsed to single spaces."""
    return " ".join(text.split())


def _summary(docstring: str) -> str:
    """The first paragraph of a docstring on one line; "" when it is too short or a doctest."""
    paragraphs = _paragraphs(docstring)
    summary = _collapse(paragraphs[0]) if paragraphs else ""
    if summary.startswith(">>>") or len(summary.split()) < MIN_DOC_WORDS:
        return ""
    return summary


def _fence(code: str, rng: random.Random) -> str:
    """The code, wrapped in a ```python block with probability FENCE_PROBABILITY."""
    return f"```python\n{code}\n```" if rng.random() < FENCE_PROBABILITY else code


def _unfence(text: str) -> str:
    """The inside of a ```python block, or the text itself when it is not one."""
    if text.startswith("```python\n") and text.endswith("\n```"):
        return text[len("```python\n"):-len("\n```")]
    return text


# ---------------------------------------------------------------------------------------------------------------
# Definitions: functions, methods and classes
# ---------------------------------------------------------------------------------------------------------------

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _child_bodies(node: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists directly inside a compound statement (bodies, else/finally blocks, handlers, cases)."""
    bodies = [getattr(node, field, None) for field in ("body", "orelse", "finalbody")]
    bodies = [body for body in bodies if isinstance(body, list)]
    bodies += [handler.body for handler in getattr(node, "handlers", [])]
    bodies += [case.body for case in getattr(node, "cases", [])]
    return [body for body in bodies if body and isinstance(body[0], ast.stmt)]


def iter_definitions(tree: ast.Module) -> Iterator[tuple[str, ast.AST, bool]]:
    """(qualname, node, is_method) for module-level functions and classes, methods, and nested classes.

    Definitions inside module-level `if`/`try` blocks count as module level; function bodies are not entered.
    """

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> Iterator[tuple[str, ast.AST, bool]]:
        for node in body:
            if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                yield prefix + node.name, node, in_class
                if isinstance(node, ast.ClassDef):
                    yield from visit(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, (ast.If, ast.Try)):
                for child in _child_bodies(node):
                    yield from visit(child, prefix, in_class)

    yield from visit(tree.body, "", False)


def definition_source(parsed: ParsedModule, node: ast.AST) -> str | None:
    """A definition's source with its decorators, dedented; None when it cannot be dedented cleanly.

    The same text as `ast.get_source_segment(source, node, padded=True)` plus the decorator lines, sliced from the
    module's lines split once (get_source_segment splits the whole file on every call).
    """
    first = min([node.lineno] + [decorator.lineno for decorator in getattr(node, "decorator_list", [])])
    lines = parsed.lines[first - 1:node.end_lineno]
    last = lines[-1].rstrip("\n").encode("utf-8")[:node.end_col_offset].decode("utf-8", errors="ignore")
    code = textwrap.dedent("".join(lines[:-1]) + last).strip("\n")
    return code if code and not code[0].isspace() else None


def _signature_fields(module: str, qualname: str, node: ast.AST, is_method: bool) -> dict[str, str]:
    """The template fields that name a function or method."""
    parameters = ast.unparse(node.args)
    return {
        "module": module, "qualname": qualname, "name": node.name, "parameters": parameters,
        "signature": f"{qualname}({parameters})", "what": "method" if is_method else "function",
    }


def function_examples(parsed: ParsedModule, qualname: str, node: ast.AST, is_method: bool, seed: int) -> list[dict]:
    """chat_function (docstring -> source) and chat_docstring (question -> docstring) for a documented function."""
    docstring = ast.get_docstring(node)
    summary = _summary(docstring or "")
    if not summary:
        return []
    fields = _signature_fields(parsed.name, qualname, node, is_method)
    examples = []
    code = definition_source(parsed, node)
    if code is not None and code.count("\n") + 1 <= MAX_FUNCTION_LINES:
        rng = _rng(seed, "chat_function", parsed.name, qualname)
        user = rng.choice(FUNCTION_PROMPTS).format(summary=summary, **fields)
        examples.append(_chat("chat_function", parsed.name, qualname, user, _fence(code, rng)))
    answer = leading_paragraphs(docstring, FUNCTION_DOC_PARAGRAPHS, FUNCTION_DOC_CHARS)
    rng = _rng(seed, "chat_docstring", parsed.name, qualname)
    user = rng.choice(DOCSTRING_PROMPTS).format(**fields)
    examples.append(_chat("chat_docstring", parsed.name, qualname, user, answer))
    return examples


def class_examples(parsed: ParsedModule, qualname: str, node: ast.ClassDef, seed: int) -> list[dict]:
    """chat_class: what a class is for -> its docstring's first paragraphs."""
    docstring = ast.get_docstring(node)
    if not docstring or not _summary(docstring):
        return []
    answer = leading_paragraphs(docstring, CLASS_DOC_PARAGRAPHS, CLASS_DOC_CHARS)
    prompt = _rng(seed, "chat_class", parsed.name, qualname).choice(CLASS_PROMPTS)
    user = prompt.format(module=parsed.name, qualname=qualname)
    return [_chat("chat_class", parsed.name, qualname, user, answer)]


def module_doc_examples(parsed: ParsedModule, seed: int) -> list[dict]:
    """chat_module: what a module does -> its docstring's first paragraphs."""
    docstring = ast.get_docstring(parsed.tree)
    if not docstring or not _summary(docstring):
        return []
    answer = leading_paragraphs(docstring, MODULE_DOC_PARAGRAPHS, MODULE_DOC_CHARS)
    user = _rng(seed, "chat_module", parsed.name).choice(MODULE_PROMPTS).format(module=parsed.name)
    return [_chat("chat_module", parsed.name, "", user, answer)]


# ---------------------------------------------------------------------------------------------------------------
# Code chunks
# ---------------------------------------------------------------------------------------------------------------


def _source_lines(source: str) -> list[str]:
    """The source's lines with their newlines, split on "\\n" only (as `ast` counts them; form feeds stay)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", source)


def _statement_boundaries(tree: ast.Module, lines: list[str]) -> dict[int, int]:
    """Line index -> nesting depth for every place a chunk may start: before each statement but the first of its
    block, after the blank lines that follow the previous statement (comments go with the statement below)."""
    depth_at: dict[int, int] = {}

    def visit(body: list[ast.stmt], depth: int) -> None:
        previous_end = None
        for node in body:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            if previous_end is not None:
                index = previous_end
                while index < start and not lines[index].strip():
                    index += 1
                index = min(index, start)
                depth_at[index] = min(depth_at.get(index, depth), depth)
            previous_end = node.end_lineno
            for child in _child_bodies(node):
                visit(child, depth + 1)

    visit(tree.body, 0)
    return depth_at


def _chunk_end(lines: list[str], start: int, depth_at: dict[int, int], max_lines: int) -> int:
    """Where the chunk that begins at `start` ends: the last boundary within max_lines at the shallowest depth
    available, else after the last blank line in the second half of the window, else at max_lines."""
    limit = start + max_lines
    if limit >= len(lines):
        return len(lines)
    candidates = [(depth, index) for index, depth in depth_at.items() if start < index <= limit]
    if candidates:
        shallowest = min(depth for depth, _ in candidates)
        return max(index for depth, index in candidates if depth == shallowest)
    blank_ends = [index for index in range(start + max_lines // 2, limit + 1) if not lines[index - 1].strip()]
    return max(blank_ends) if blank_ends else limit


def split_code(source: str, tree: ast.Module, max_lines: int = MAX_CHUNK_LINES) -> list[str]:
    """A module's source cut into consecutive chunks of at most max_lines lines at definition boundaries.

    The chunks concatenate back to the source exactly.
    """
    lines = _source_lines(source)
    depth_at = _statement_boundaries(tree, lines)
    chunks, start = [], 0
    while start < len(lines):
        end = _chunk_end(lines, start, depth_at, max_lines)
        chunks.append("".join(lines[start:end]))
        start = end
    return chunks


def code_examples(parsed: ParsedModule) -> list[dict]:
    """code: the module's chunks that hold more than a few characters."""
    chunks = split_code(parsed.source, parsed.tree)
    return [_code(parsed.name, str(index), chunk) for index, chunk in enumerate(chunks)
            if len(chunk.strip()) >= MIN_CHUNK_CHARS]


def module_examples(parsed: ParsedModule, seed: int) -> list[dict]:
    """All examples of one module: module, class and function chats, then code chunks."""
    examples = module_doc_examples(parsed, seed)
    for qualname, node, is_method in iter_definitions(parsed.tree):
        if isinstance(node, ast.ClassDef):
            examples += class_examples(parsed, qualname, node, seed)
        else:
            examples += function_examples(parsed, qualname, node, is_method, seed)
    return examples + code_examples(parsed)


# ---------------------------------------------------------------------------------------------------------------
# pydoc topics
# ---------------------------------------------------------------------------------------------------------------


def _topic_words(topic: str, text: str) -> str:
    """How to name a topic in a question: its title (the first line, when underlined), else its name in words."""
    lines = text.strip().splitlines()
    if len(lines) > 1 and lines[0].strip() and set(lines[1].strip()) <= set("*=-") and lines[1].strip():
        title = lines[0].strip()
        return "t" + title[1:] if title.startswith("The ") else title
    return topic.replace("-", " ")


def topic_examples(seed: int) -> list[tuple[str, dict]]:
    """(topic name, chat_topic example) for every pydoc topic, the answer cut at a paragraph boundary."""
    from pydoc_data.topics import topics

    pairs = []
    for topic in sorted(topics):
        answer = leading_paragraphs(topics[topic], max_paragraphs=10**6, max_chars=TOPIC_CHARS)
        if not answer:
            continue
        prompt = _rng(seed, "chat_topic", topic).choice(TOPIC_PROMPTS)
        user = prompt.format(topic=topic, words=_topic_words(topic, topics[topic]))
        pairs.append((topic, _chat("chat_topic", TOPICS_SOURCE, topic, user, answer)))
    return pairs


# ---------------------------------------------------------------------------------------------------------------
# Deduplication, splitting, stats
# ---------------------------------------------------------------------------------------------------------------


def normalised_content(example: dict) -> tuple[str, str]:
    """The dedup key: ("code", text) or ("chat", assistant answer without its code fence), whitespace-collapsed."""
    if "text" in example:
        return "code", _collapse(example["text"])
    return "chat", _collapse(_unfence(example["messages"][-1]["content"]))


def dedupe(examples: Iterable[dict]) -> tuple[list[dict], Counter]:
    """The examples whose normalised content was not seen before (first one wins), and drops per kind."""
    seen: set[tuple[str, str]] = set()
    kept, dropped = [], Counter()
    for example in examples:
        key = normalised_content(example)
        if key in seen:
            dropped[example["kind"]] += 1
            continue
        seen.add(key)
        kept.append(example)
    return kept, dropped


def _contents(example: dict) -> list[str]:
    """The texts of an example: its code text or its message contents."""
    return [example["text"]] if "text" in example else [message["content"] for message in example["messages"]]


def _is_clean(example: dict) -> bool:
    """False when some content holds a special-token marker (the tokenizer would read it as the token)."""
    return not any(marker in text for text in _contents(example) for marker in RESERVED_MARKERS)


def characters(examples: Iterable[dict]) -> int:
    """Characters of content (code text, or message contents) in the examples."""
    return sum(len(text) for example in examples for text in _contents(example))


def _shuffled(examples: list[dict], seed: int, split: str) -> list[dict]:
    """The examples in a deterministic, seeded order."""
    ordered = list(examples)
    random.Random(int(stable_hash(seed, "shuffle", split)[:16], 16)).shuffle(ordered)
    return ordered


def _split_stats(examples: list[dict]) -> dict:
    """Counts per kind (every kind listed) and the total."""
    counts = Counter(example["kind"] for example in examples)
    return {**{kind: counts[kind] for kind in KINDS}, "total": len(examples)}


# ---------------------------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------------------------


def select_modules(modules: Sequence[str] | None = None, max_modules: int | None = None) -> list[Module]:
    """The stdlib modules to use: all of them, or those named (ValueError for unknown names); the first max_modules."""
    available = stdlib_modules()
    if modules is not None:
        wanted = set(modules)
        missing = wanted - {module.name for module in available}
        if missing:
            raise ValueError(f"not stdlib modules the corpus can use: {', '.join(sorted(missing))}")
        available = [module for module in available if module.name in wanted]
    return available[:max_modules] if max_modules is not None else available


def build_corpus(seed: int = 0, modules: Sequence[str] | None = None, max_modules: int | None = None,
                 include_topics: bool = True) -> tuple[list[dict], list[dict], dict]:
    """Build the corpus: (train examples, heldout examples, stats), each split shuffled with the seed.

    `modules` restricts the build to those stdlib modules (dotted names) and `max_modules` to the first n of them
    in name order (for tests); `include_topics` adds the pydoc topics.
    """
    split_keys: list[tuple[str, dict]] = []
    skipped: Counter = Counter()
    used = []
    for module in select_modules(modules, max_modules):
        parsed = parse_module(module)
        if isinstance(parsed, str):
            skipped[parsed] += 1
            continue
        used.append(module.name)
        split_keys += [(module.name, example) for example in module_examples(parsed, seed)]
    if include_topics:
        split_keys += topic_examples(seed)

    unclean = sum(1 for _, example in split_keys if not _is_clean(example))
    split_keys = [(key, example) for key, example in split_keys if _is_clean(example)]
    kept, dropped = dedupe(example for _, example in split_keys)
    kept_ids = {id(example) for example in kept}
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for key, example in split_keys:
        if id(example) in kept_ids:
            splits["heldout" if is_heldout(key) else "train"].append(example)
    train, heldout = (_shuffled(splits[split], seed, split) for split in SPLITS)

    topic_names = sorted({key for key, example in split_keys if example["source"] == TOPICS_SOURCE})
    stats = {
        "python_version": platform.python_version(),
        "seed": seed,
        "modules": len(used),
        "modules_skipped": dict(sorted(skipped.items())),
        "heldout_modules": sorted(name for name in used if is_heldout(name)),
        "heldout_topics": [topic for topic in topic_names if is_heldout(topic)],
        "examples": {"train": _split_stats(train), "heldout": _split_stats(heldout)},
        "duplicates_dropped": {**{kind: dropped[kind] for kind in KINDS}, "total": sum(dropped.values())},
        "reserved_marker_dropped": unclean,
        "characters": {"train": characters(train), "heldout": characters(heldout)},
    }
    return train, heldout, stats


def iter_texts(examples: Iterable[dict], render: Callable[[list[dict]], str] | None = None) -> Iterator[str]:
    """The text of each example: code as is, chats through `render` (default: the contents joined by blank lines).

    The tokenizer trainer passes `train.tokenizer.render_chat` so chats look as the model will see them.
    """
    for example in examples:
        if "text" in example:
            yield example["text"]
        elif render is not None:
            yield render(example["messages"])
        else:
            yield "\n\n".join(message["content"] for message in example["messages"])


# ---------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------


def write_jsonl(path: Path, examples: Iterable[dict]) -> None:
    """Write one JSON object per line (UTF-8, not ASCII-escaped)."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for example in examples:
            handle.write(json.dumps(example, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Read a file written by write_jsonl."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_split(corpus_dir: str | os.PathLike, split: str) -> list[dict]:
    """The examples of one split ("train" or "heldout") of a written corpus."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return read_jsonl(Path(corpus_dir) / f"{split}.jsonl")


def write_corpus(out_dir: str | os.PathLike, train: list[dict], heldout: list[dict], stats: dict) -> Path:
    """Write train.jsonl, heldout.jsonl and stats.json under out_dir (created); the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "heldout.jsonl", heldout)
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return out


def summary_line(stats: dict, out_dir: str | os.PathLike) -> str:
    """The one-line summary the CLI prints."""
    def counts(split: str) -> str:
        split_stats = stats["examples"][split]
        return f"{split} {split_stats['total']} (" + ", ".join(f"{kind} {split_stats[kind]}" for kind in KINDS) + ")"

    chars = stats["characters"]
    return (f"corpus: {stats['modules']} modules, {counts('train')}, {counts('heldout')}, "
            f"{stats['duplicates_dropped']['total']} duplicates dropped, "
            f"{chars['train'] + chars['heldout']:,} chars (train {chars['train']:,}), "
            f"python {stats['python_version']}, seed {stats['seed']} -> {out_dir}")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: build the corpus and write it."""
    parser = argparse.ArgumentParser(prog="python -m train.corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/corpus", help="output directory (default: data/corpus)")
    parser.add_argument("--seed", type=int, default=0, help="seed for phrasings and shuffling (default: 0)")
    parser.add_argument("--max-modules", type=int, default=None, help="use only the first N modules (for trials)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    train, heldout, stats = build_corpus(seed=args.seed, max_modules=args.max_modules)
    write_corpus(args.out, train, heldout, stats)
    print(f"{summary_line(stats, args.out)} [{time.perf_counter() - started:.1f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
