"""Requests of the benchmark's kinds written from the training split (train.task_turns), answered by train.replies."""

from __future__ import annotations

import json

from train import replies
from train.task_turns import task_requests

FUNCTION = "```python\ndef area(width, height):\n    \"\"\"Area of a rectangle.\"\"\"\n    return width * height\n```"


def write_corpus(folder) -> None:
    """Chat turns of every corpus kind from two modules, one of which edge-bench's prompts are about."""
    folder.mkdir()
    rows = []
    for module in ("geometry", "json"):
        for index in range(6):
            rows.append({"kind": "chat_function", "source": module, "messages": [
                {"role": "user", "content": f"Write a Python function `{module}.area{index}(width, height)`."},
                {"role": "assistant", "content": FUNCTION}]})
            rows.append({"kind": "chat_docstring", "source": module, "messages": [
                {"role": "user", "content": f"Describe `{module}.shape{index}`."},
                {"role": "assistant", "content": f"The {module} shape number {index}. " * 8}]})
    rows.append({"kind": "code", "source": "geometry", "text": "x = 1\n"})
    for split in ("train", "heldout"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_requests_cover_every_kind_in_turn_and_never_name_a_benchmark_module(tmp_path):
    write_corpus(tmp_path / "corpus")
    requests = task_requests(tmp_path / "corpus", 70, seed=3)
    assert len(requests) == 70 and requests == task_requests(tmp_path / "corpus", 70, seed=3)
    assert all(conversation[-1]["role"] == "user" for conversation in requests)
    assert all(len(conversation) == 3 for conversation in requests[::7])  # multi-turn: a corpus exchange + a follow-up
    assert all(len(conversation) == 1 for index, conversation in enumerate(requests) if index % 7)
    text = json.dumps(requests)
    assert "json" not in text and "geometry" in text
    assert any("def area" in conversation[0]["content"] for conversation in requests[1::7])  # code to rewrite


def test_replies_to_task_requests_keep_the_whole_conversation(tmp_path, llama_dir):
    write_corpus(tmp_path / "corpus")
    out = tmp_path / "replies.jsonl"
    assert replies.main(["--target", str(llama_dir), "--corpus", str(tmp_path / "corpus"), "--out", str(out),
                         "--requests", "tasks", "--count", "7", "--max-new-tokens", "4", "--threads", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = task_requests(tmp_path / "corpus", 7, seed=replies.TASK_SEED)
    assert [row["messages"][:-1] for row in rows] == expected
    assert all(row["kind"] == "reply" and row["messages"][-1]["role"] == "assistant" for row in rows)


def test_both_kinds_alternate(tmp_path):
    write_corpus(tmp_path / "corpus")
    both = replies.requests(tmp_path / "corpus", "both", 5)
    assert both[0::2] == replies.requests(tmp_path / "corpus", "corpus", 5)
    assert both[1::2] == replies.requests(tmp_path / "corpus", "tasks", 5)
