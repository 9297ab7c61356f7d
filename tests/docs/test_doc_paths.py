"""README.md and docs/ cite only files in the repository: every relative link, and every path in the text that starts
at one of the repository's folders (edge/..., docs/..., tests/..., or edge's own subpackages as docs/architecture.md
writes them), exists; a link to a Markdown heading names one that is there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "edge" / "models").glob("*/README.md")])

LINK = re.compile(r"\]\(([^)\s]+)\)")
# a path in backticks, or a bare one starting at a folder: `edge/x.py`, docs/benchmarks.md, ../shared/x.md
CITED = re.compile(r"`([^`\s]+)`|(?<![\w/.$~@:-])((?:\.\./|\.ci/|edge/|tests/|bench/|train/|docs/)[\w./-]*\w)")
PLACEHOLDER = re.compile(r"[*{}$~<>|]|\.\.\.")  # a pattern, not a file: edge/models/*/README.md


def cited_paths(text: str) -> list[str]:
    found = []
    for match in CITED.finditer(text):
        path = (match[1] or match[2]).rstrip(".,:;)").split("@")[0]
        if "/" in path and "://" not in path and not PLACEHOLDER.search(path):
            found.append(path)
    return found


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def ignored_names() -> set[str]:
    """Top-level names .gitignore keeps out of the repository (a reader's data/, a build/): not citations."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip("/") for line in lines if line and not line.startswith("#") and "*" not in line}


def inside_repository(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def missing_citations(document: Path) -> list[str]:
    text = document.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (document.parent / path) if path else document
        if not (file.exists() and inside_repository(file)):
            missing.append(f"link {target}")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text(encoding="utf-8")):
            missing.append(f"link {target} (no such heading)")
    top = {entry.name for entry in ROOT.iterdir()} - ignored_names()
    subpackages = {entry.name for entry in (ROOT / "edge").iterdir() if entry.is_dir()}
    for path in cited_paths(text):
        first = path.split("/")[0]
        if first not in top | subpackages | {".."}:
            continue  # a folder the reader makes (data/, a download), not a citation of the repository
        candidates = [ROOT / path, document.parent / path, ROOT / "edge" / path]
        if not any(candidate.exists() and inside_repository(candidate) for candidate in candidates):
            missing.append(path)
    return missing


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_cited_path_is_in_the_repository(document):
    assert missing_citations(document) == []


def test_a_path_outside_the_repository_or_a_missing_file_is_caught(tmp_path):
    document = ROOT / "docs" / "architecture.md"
    text = ("The design is `../shared/DESIGN.md`; see [benchmarks](benchmarks.md#no-such-heading), "
            "edge/no_such_module.py and `model/config.py`.")
    fake = ROOT / "docs" / f".{tmp_path.name}.md"
    fake.write_text(text)
    try:
        assert missing_citations(fake) == ["link benchmarks.md#no-such-heading (no such heading)",
                                           "../shared/DESIGN.md", "edge/no_such_module.py"]
    finally:
        fake.unlink()
    assert document in DOCUMENTS
