"""The training corpus builder (train.corpus) and tokenizer trainer (train.tokenizer), on a few stdlib modules.

The corpus is built from a handful of small modules plus one module that hashes into the heldout split; the
tokenizer is trained on it with a 400-token vocabulary, so the whole file runs in seconds.
"""

from __future__ import annotations

import json
import re

import pytest

from train import corpus
from train.tokenizer import (CHAT_TEMPLATE, DEFAULT_SYSTEM, SPECIAL_TOKENS, encode_example, load_tokenizer,
                             render_chat, save_tokenizer, train_tokenizer)

SMALL_MODULES = ["bisect", "colorsys", "heapq", "shlex", "textwrap"]


def _heldout_module() -> str:
    """A smallish stdlib module (over 2 KB, so it has examples) that goes to the heldout split."""
    modules = [module for module in corpus.stdlib_modules()
               if corpus.is_heldout(module.name) and module.path.stat().st_size > 2000]
    return min(modules, key=lambda module: (module.path.stat().st_size, module.name)).name


SUBSET = SMALL_MODULES + [_heldout_module()]


@pytest.fixture(scope="module")
def built():
    """(train, heldout, stats) of the subset with seed 0."""
    return corpus.build_corpus(seed=0, modules=SUBSET)


@pytest.fixture(scope="module")
def tokenizer_dir(built, tmp_path_factory):
    """A 400-token tokenizer trained on the subset's train split and saved the Hugging Face way."""
    train, _, _ = built
    out = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(train_tokenizer(train, vocab_size=400), out)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------------------------


def test_build_is_deterministic(built, tmp_path):
    again = corpus.build_corpus(seed=0, modules=SUBSET)
    assert again == built
    corpus.write_corpus(tmp_path / "a", *built)
    corpus.write_corpus(tmp_path / "b", *again)
    for name in ("train.jsonl", "heldout.jsonl", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert corpus.load_split(tmp_path / "a", "train") == built[0]


def test_seed_changes_phrasing_and_order_only(built):
    other = corpus.build_corpus(seed=1, modules=SUBSET)
    assert other[0] != built[0]
    assert sorted(example["source"] for example in other[0]) == sorted(example["source"] for example in built[0])


def test_examples_are_well_formed(built):
    train, heldout, _ = built
    examples = train + heldout
    assert len({example["id"] for example in examples}) == len(examples)
    for example in examples:
        assert re.fullmatch(r"[0-9a-f]{16}", example["id"])
        assert example["kind"] in corpus.KINDS
        if example["kind"] == "code":
            assert set(example) == {"id", "kind", "source", "text"}
            assert example["text"].strip()
        else:
            assert set(example) == {"id", "kind", "source", "messages"}
            assert [message["role"] for message in example["messages"]] == ["user", "assistant"]
            assert all(isinstance(message["content"], str) and message["content"].strip()
                       for message in example["messages"])
        expected_source = corpus.TOPICS_SOURCE if example["kind"] == "chat_topic" else None
        assert example["source"] == expected_source or example["source"] in SUBSET
        assert not any(marker in text for text in corpus._contents(example) for marker in corpus.RESERVED_MARKERS)
    kinds = {example["kind"] for example in examples}
    assert kinds == set(corpus.KINDS)


def test_function_examples_hold_the_source():
    train, _, _ = corpus.build_corpus(seed=0, modules=["heapq"], include_topics=False)
    [example] = [e for e in train if e["kind"] == "chat_function" and "`heappush(" in e["messages"][0]["content"]]
    answer = corpus._unfence(example["messages"][1]["content"])
    assert answer.startswith("def heappush(heap, item):\n    \"\"\"Push item onto heap")
    assert len(answer.splitlines()) <= corpus.MAX_FUNCTION_LINES


def test_splits_are_by_module(built):
    train, heldout, stats = built
    train_sources = {example["source"] for example in train} - {corpus.TOPICS_SOURCE}
    heldout_sources = {example["source"] for example in heldout} - {corpus.TOPICS_SOURCE}
    assert heldout_sources == {SUBSET[-1]}
    assert not train_sources & heldout_sources
    assert all(not corpus.is_heldout(source) for source in train_sources)
    assert stats["heldout_modules"] == [SUBSET[-1]]
    assert stats["examples"]["train"]["total"] == len(train)
    assert stats["examples"]["heldout"]["total"] == len(heldout)
    assert stats["characters"]["train"] == corpus.characters(train)
    topics_heldout = sum(1 for example in heldout if example["kind"] == "chat_topic")
    assert topics_heldout == len(stats["heldout_topics"])


def test_dedupe_drops_normalised_duplicates(built):
    chat = lambda answer: {"id": "x", "kind": "chat_docstring", "source": "m",  # noqa: E731
                           "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}]}
    code = {"id": "y", "kind": "code", "source": "m", "text": "x = 1\n"}
    examples = [chat("Return  the\nvalue."), chat("Return the value."), chat("```python\nReturn the value.\n```"),
                code, dict(code, text="x =  1"), chat("x = 1")]
    kept, dropped = corpus.dedupe(examples)
    assert kept == [examples[0], examples[3], examples[5]]
    assert dropped == {"chat_docstring": 2, "code": 1}
    train, heldout, stats = built
    keys = [corpus.normalised_content(example) for example in train + heldout]
    assert len(set(keys)) == len(keys)
    drops = stats["duplicates_dropped"]
    assert drops["total"] == sum(count for kind, count in drops.items() if kind != "total")


def test_code_chunks_cover_the_module():
    for module in corpus.select_modules(["textwrap", "shlex"]):
        parsed = corpus.parse_module(module)
        chunks = corpus.split_code(parsed.source, parsed.tree, max_lines=40)
        assert "".join(chunks) == parsed.source
        assert all(chunk.count("\n") <= 40 for chunk in chunks)
        assert len(chunks) > 3


def test_unknown_module_is_refused():
    with pytest.raises(ValueError, match="no_such_module"):
        corpus.build_corpus(modules=["no_such_module"])


def test_cli_writes_the_corpus(tmp_path, capsys):
    assert corpus.main(["--out", str(tmp_path), "--max-modules", "2"]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["modules"] + sum(stats["modules_skipped"].values()) == 2
    assert capsys.readouterr().out.startswith("corpus: ")


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------


def test_special_token_ids(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    assert [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] == [0, 1, 2]
    assert tokenizer.get_vocab_size() == 400


def test_saved_config_holds_the_chat_template(tokenizer_dir):
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["bos_token"] is None and config["model_max_length"] == 2048
    assert not (tokenizer_dir / "chat_template.jinja").exists()


CONVERSATIONS = [
    [{"role": "user", "content": "What does `heapq` do?"}, {"role": "assistant", "content": "Heap queues."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\n\n  there "}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_render_chat(tokenizer_dir, messages):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for generation_prompt in (False, True):
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        assert text == render_chat(messages, add_generation_prompt=generation_prompt)
    if messages:
        ids = hf.apply_chat_template(messages, tokenize=True)
        assert ids == encode_example({"messages": messages}, load_tokenizer(tokenizer_dir))
    assert hf.eos_token_id == 2 and hf.pad_token_id == 0


def test_default_system_message():
    text = render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_edge_renders_the_same_template(tokenizer_dir):
    from edge.text.tokenizer import Tokenizer

    edge_tokenizer = Tokenizer.from_dir(tokenizer_dir)
    for messages in CONVERSATIONS:
        assert edge_tokenizer.apply_chat_template(messages, add_generation_prompt=False) == render_chat(messages)


def test_encode_decode_round_trip(built, tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    train, heldout, _ = built
    for example in train + heldout:
        ids = encode_example(example, tokenizer)
        if example["kind"] == "code":
            assert ids[-1] == 0
            assert tokenizer.decode(ids[:-1]) == example["text"]
        else:
            assert ids[-2:] == [2, tokenizer.token_to_id("Ċ")]
            assert tokenizer.decode(ids, skip_special_tokens=False) == render_chat(example["messages"])
    odd = "déjà vu 🙂\ttabs\r\n  x = '\\x00'\n"
    assert tokenizer.decode(encode_example({"text": odd}, tokenizer)[:-1]) == odd
