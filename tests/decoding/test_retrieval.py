"""Retrieval drafting (edge/decoding/drafters/retrieval.py): the datastore finds every occurrence of a suffix, drafts
what most occurrences continue with, is written from the target's replies as its template frames them, only drafts for
the tokenizer it was written with, and is lossless."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from edge import Engine, SamplingError
from edge.sources.builtin import builtin_model_path, shipped_for
from edge.decoding.drafters.retrieval import SEPARATOR, RetrievalDrafter, TokenStore, read_datastore
from edge.text.tokenizer import Tokenizer

PROMPTS = ["How do I read a CSV file in Python?", "What does the json module do?", "How do I copy a file?"]


def test_the_store_finds_every_occurrence_of_a_suffix():
    rng = random.Random(0)
    replies = [[rng.randrange(12) for _ in range(rng.randrange(3, 30))] for _ in range(120)]
    store = TokenStore.from_replies(replies)
    flat = store.tokens.tolist()
    for _ in range(400):
        reply = rng.choice(replies)
        end = rng.randrange(1, len(reply) + 1)
        suffix = reply[max(0, end - rng.randrange(1, 9)):end]
        expected = sorted(p + len(suffix) for p in range(len(flat) - len(suffix) + 1)
                          if flat[p:p + len(suffix)] == suffix)
        assert sorted(store.occurrences(suffix).tolist()) == expected, suffix
    assert len(store.occurrences([13, 13])) == 0  # never seen


def test_the_draft_follows_what_most_occurrences_continue_with():
    store = TokenStore.from_replies([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7], [9, 1, 2, 3, 4, 5, 8]])
    assert store.continuation(store.occurrences([2, 3]), 4) == [4, 5]  # 3 of 4 say 4, then 2 of 3 say 5
    assert store.continuation(store.occurrences([4, 5]), 3) == []  # one ends there, one goes on: no majority
    drafter = RetrievalDrafter(store)
    assert drafter.propose([0, 1, 2], 3, None).tokens == [3, 4, 5]
    assert drafter.propose([8, 8, 8, 0, 8, 8], 2, None).tokens == [0, 8]  # no store match: the context's own
    with pytest.raises(SamplingError, match="below"):
        TokenStore.from_replies([[SEPARATOR]])


def test_a_fresh_copy_shares_the_store_and_keeps_its_own_prompt_lookup():
    """A batch's slots each draft with a fresh copy: one conversation's lookup must not draft for another's."""
    drafter = RetrievalDrafter(TokenStore.from_replies([[1, 2, 3, 4]]))
    other = drafter.fresh()
    assert other.store is drafter.store and other.lookup is not drafter.lookup
    assert drafter.propose([7, 8, 9, 7, 8], 2, None).tokens == [9, 7]  # its own context repeats
    assert other.propose([5, 6, 8], 2, None).tokens == []  # 8 follows nothing in its own tokens


@pytest.fixture(scope="module")
def builtin_store(tmp_path_factory):
    """A datastore of the built-in model's own greedy replies to PROMPTS, written as train.datastore writes one."""
    from train.datastore import build

    path = builtin_model_path()
    if path is None:
        pytest.skip("the built-in model is not in this checkout")
    engine = Engine.load(path, max_context=256)
    folder = tmp_path_factory.mktemp("store")
    lines = []
    for prompt in PROMPTS:
        reply = "".join(e.text for e in engine.chat([{"role": "user", "content": prompt}], max_new_tokens=48, temperature=0.0))
        lines.append(json.dumps({"kind": "reply", "messages": [{"role": "user", "content": prompt},
                                                              {"role": "assistant", "content": reply}]}))
    (folder / "replies.jsonl").write_text("\n".join(lines) + "\n")
    card = build(str(path), folder / "replies.jsonl", folder / "store")
    assert card["replies"] == len(PROMPTS) and card["tokens"] > 3 * len(PROMPTS)
    return path, folder / "store"


@pytest.mark.slow
def test_retrieval_drafting_is_lossless_and_drafts_the_targets_own_replies(builtin_store):
    path, store = builtin_store
    plain = Engine.load(path, max_context=256)
    fast = Engine.load(path, max_context=256, drafter=f"retrieval:{store}", draft_length=3)
    for prompt in PROMPTS + ["Explain what a dictionary is."]:
        messages = [{"role": "user", "content": prompt}]
        events = list(fast.chat(messages, max_new_tokens=48, temperature=0.0))
        assert [t for e in events for t in e.token_ids] == [
            t for e in plain.chat(messages, max_new_tokens=48, temperature=0.0) for t in e.token_ids], prompt
        if prompt in PROMPTS:  # its own reply is in the store: drafted nearly whole
            assert events[-1].stats.accepted >= events[-1].stats.decode_tokens // 2, prompt


def test_a_datastore_drafts_only_for_the_tokenizer_it_was_written_with(builtin_store, tmp_path, llama_dir):
    path, store = builtin_store
    tokenizer, other = Tokenizer.from_dir(path), Tokenizer.from_dir(llama_dir)
    assert read_datastore(store, tokenizer).tokens.dtype == np.uint16
    with pytest.raises(SamplingError, match="another tokenizer"):
        read_datastore(store, other)
    with pytest.raises(SamplingError, match="not a retrieval datastore"):
        read_datastore(tmp_path, tokenizer)
    assert shipped_for(tokenizer, [tmp_path, store]) == store and shipped_for(other, [store]) is None
    with pytest.raises(SamplingError, match="no retrieval datastore ships"):
        Engine.load(llama_dir, max_context=64, drafter="retrieval")
