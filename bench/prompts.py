"""edge-bench's prompt set: Spec-Bench's six categories, written for this project (the built-in model knows Python
and its standard library, so the tasks are about Python). Each prompt is a chat conversation; the multi-turn
ones carry an earlier exchange."""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("multi-turn", "translation", "summarization", "qa", "math", "rag", "code")

_JSON_DOC = (
    "json exposes an API familiar to users of the standard library marshal and pickle modules. "
    "Encoding basic Python object hierarchies: json.dumps(['foo', {'bar': ('baz', None, 1.0, 2)}]). "
    "Compact encoding: json.dumps([1, 2, 3, {'4': 5, '6': 7}], separators=(',', ':')). "
    "Decoding JSON: json.loads('[\"foo\", {\"bar\":[\"baz\", null, 1.0, 2]}]')."
)
_SHUTIL_DOC = (
    "The shutil module offers a number of high-level operations on files and collections of files. In "
    "particular, functions are provided which support file copying and removal. For operations on individual "
    "files, see also the os module. copyfile(src, dst) copies the contents of the file named src to a file "
    "named dst. copytree(src, dst) recursively copies an entire directory tree rooted at src to a directory "
    "named dst. rmtree(path) deletes an entire directory tree."
)
_FUNCTION = (
    "def _count_elements(mapping, iterable):\n"
    "    'Tally elements from the iterable.'\n"
    "    mapping_get = mapping.get\n"
    "    for elem in iterable:\n"
    "        mapping[elem] = mapping_get(elem, 0) + 1\n"
)


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    messages: list[dict] = field(default_factory=list)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


PROMPTS: list[BenchPrompt] = [
    BenchPrompt("multi-turn", [
        {"role": "user", "content": "What does the `json` module do?"},
        {"role": "assistant", "content": "It encodes Python objects as JSON text and decodes JSON text."},
        {"role": "user", "content": "Write a Python function `save_json(path, data)` that writes data to a file."},
    ]),
    BenchPrompt("multi-turn", [
        {"role": "user", "content": "What is `collections.Counter` for?"},
        {"role": "assistant", "content": "It counts hashable objects: a dict subclass mapping elements to counts."},
        {"role": "user", "content": "What does `collections.OrderedDict` do?"},
    ]),
    BenchPrompt("translation", _user(
        "Translate this Python 2 code to Python 3:\n\nprint 'hello %s' % name\nfor k, v in d.iteritems():\n"
        "    print k, v\n")),
    BenchPrompt("translation", _user(
        "Rewrite this loop as a list comprehension:\n\nresult = []\nfor x in items:\n    if x > 0:\n"
        "        result.append(x * 2)\n")),
    BenchPrompt("summarization", _user(f"Summarize this documentation in two sentences:\n\n{_SHUTIL_DOC}")),
    BenchPrompt("summarization", _user(f"Summarize what this function does:\n\n{_FUNCTION}")),
    BenchPrompt("qa", _user("What does the `os.path` module do?")),
    BenchPrompt("qa", _user("Explain the `with` statement in Python.")),
    BenchPrompt("math", _user("Write a Python function `mean(values)` that returns the arithmetic mean of a list.")),
    BenchPrompt("math", _user("Write a Python function `gcd(a, b)` that returns the greatest common divisor.")),
    BenchPrompt("rag", _user(f"Using this documentation:\n\n{_JSON_DOC}\n\nHow do I encode a list compactly with "
                             "json?")),
    BenchPrompt("rag", _user(f"Using this documentation:\n\n{_SHUTIL_DOC}\n\nHow do I copy a whole directory?")),
    BenchPrompt("code", _user("Write a Python function `read_lines(path)` that returns the lines of a text file.")),
    BenchPrompt("code", _user("Write a Python function `flatten(items)` that flattens a nested list.")),
    BenchPrompt("code", _user("Write a Python class `Stack` with push, pop and is_empty methods.")),
]


def quick_prompts() -> list[int]:
    """edge-bench --quick's prompts: the first of each category (indices into PROMPTS)."""
    first: dict[str, int] = {}
    for index, prompt in enumerate(PROMPTS):
        first.setdefault(prompt.category, index)
    return list(first.values())
