"""Structured output: replies follow their JSON schema by construction, and greedy constrained decoding with
speculation emits exactly what it does without, for every drafter."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.decoding.constrained import GrammarError, json_schema_grammar
from edge.events import FINISH_EOS
from tests.decoding.test_speculative import (  # checkpoints: a fixture
    DRAFTERS, checkpoints, drafter_spec, ids_of)  # noqa: F401

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "kind": {"enum": ["cat", "dog", "fox"]}},
    "required": ["name", "tags", "age", "kind"], "additionalProperties": False}
LIST = {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"type": "null"}},
                                   "required": ["x"], "additionalProperties": False}, "maxItems": 5}
FORMATS = [{"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
           {"type": "json_schema", "json_schema": {"name": "list", "schema": LIST}},
           {"type": "json_object"}]
PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox",
           "import os\nfor name in os.listdir('.'):\n    print(name"]


def schema_of(response_format: dict) -> dict:
    return response_format["json_schema"]["schema"] if "json_schema" in response_format else {"type": "object"}


def check_reply(events, response_format: dict) -> None:
    """A reply that ended on its own (not cut by max_new_tokens) is JSON valid under its schema."""
    text = "".join(event.text for event in events)
    assert events[-1].finish_reason == FINISH_EOS, text
    jsonschema.validate(json.loads(text), schema_of(response_format))


@pytest.fixture(scope="module")
def constrained_reference(checkpoints):  # noqa: F811 - the imported fixture
    engine = Engine.load(checkpoints["target"], max_context=512)
    return {(prompt, index): ids_of(engine.generate(prompt, max_new_tokens=200, response_format=response_format, temperature=0.0))
            for prompt in PROMPTS for index, response_format in enumerate(FORMATS)}


@pytest.mark.slow
@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("length", ["adaptive", 3])
def test_greedy_constrained_speculation_equals_constrained_plain_decoding(checkpoints, constrained_reference, name,
                                                                         length):  # noqa: F811
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec(name, checkpoints),
                         draft_length=length)
    drafted = 0
    for prompt in PROMPTS:
        for index, response_format in enumerate(FORMATS):
            events = list(engine.generate(prompt, max_new_tokens=200, response_format=response_format, temperature=0.0))
            assert ids_of(events) == constrained_reference[prompt, index], (name, length, prompt, index)
            check_reply(events, response_format)
            drafted += events[-1].stats.drafted
    assert drafted > 0  # the drafter proposed, and the grammar cut or kept its drafts


def test_retrieval_constrained_equals_constrained_plain_decoding(checkpoints, constrained_reference,
                                                                tmp_path):  # noqa: F811
    """The retrieval drafter over a datastore of the constrained replies themselves: long drafts, all checked."""
    from edge.decoding.drafters.retrieval import CARD, STORE, TokenStore
    from edge.text.tokenizer import Tokenizer

    store = tmp_path / "store"
    store.mkdir()
    TokenStore.from_replies(list(constrained_reference.values())).save(store / STORE)
    vocab = Tokenizer.from_dir(checkpoints["target"]).fingerprint()["vocab_sha256"]
    (store / CARD).write_text(json.dumps({"vocab_sha256": vocab}))
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=f"retrieval:{store}", draft_length=3)
    accepted = 0
    for prompt in PROMPTS:
        for index, response_format in enumerate(FORMATS):
            events = list(engine.generate(prompt, max_new_tokens=200, response_format=response_format, temperature=0.0))
            assert ids_of(events) == constrained_reference[prompt, index], (prompt, index)
            accepted += events[-1].stats.accepted
    assert accepted > 0


def test_quantspec_constrained_equals_its_plain_decoding(checkpoints):  # noqa: F811
    """QuantSpec drafts over the hierarchical cache, whose own plain decoding is the reference."""
    plain = Engine.load(checkpoints["target"], max_context=512, kv_cache="hierarchical")
    fast = Engine.load(checkpoints["target"], max_context=512, drafter="quantspec", kv_cache="hierarchical")
    for response_format in FORMATS:
        a = list(plain.generate(PROMPTS[0], max_new_tokens=200, response_format=response_format, temperature=0.0))
        b = list(fast.generate(PROMPTS[0], max_new_tokens=200, response_format=response_format, temperature=0.0))
        assert ids_of(a) == ids_of(b)
        check_reply(b, response_format)


def test_a_drafter_that_ignores_the_grammar_is_cut_where_the_grammar_forbids(checkpoints):  # noqa: F811
    """The target drafting for itself has every free draft accepted; under a grammar its drafts are cut at the first
    token the grammar forbids (stats count the drafted tokens kept), what is left is all accepted (where the free
    choice is allowed it is the constrained choice too), and the reply equals plain constrained decoding."""
    free = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec("self", checkpoints),
                       draft_length=4)
    plain = Engine.load(checkpoints["target"], max_context=512)
    response_format = FORMATS[0]
    events = list(free.generate(PROMPTS[0], max_new_tokens=200, response_format=response_format, temperature=0.0))
    stats = events[-1].stats
    assert 0 < stats.accepted == stats.drafted < 4 * (stats.steps - 1)
    assert ids_of(events) == ids_of(plain.generate(PROMPTS[0], max_new_tokens=200, response_format=response_format, temperature=0.0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["small", "early-exit:2", "ngram"])
def test_sampled_constrained_speculation_follows_the_schema(checkpoints, name):  # noqa: F811
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec(name, checkpoints))
    for seed in range(3):
        events = list(engine.chat([{"role": "user", "content": "a person"}], max_new_tokens=160, temperature=1.0,
                                  seed=seed, response_format=FORMATS[0]))
        check_reply(events, FORMATS[0])
        again = list(engine.chat([{"role": "user", "content": "a person"}], max_new_tokens=160, temperature=1.0,
                                 seed=seed, response_format=FORMATS[0]))
        assert ids_of(again) == ids_of(events)  # a seed still reproduces its reply


def test_unsupported_schema_features_are_one_line_errors_naming_them(checkpoints):  # noqa: F811
    with pytest.raises(GrammarError, match=r"'not'|\"not\""):
        json_schema_grammar({"type": "object", "not": {"required": ["a"]}})
    with pytest.raises(GrammarError, match="format"):
        json_schema_grammar({"type": "string", "format": "no-such-format"})
    engine = Engine.load(checkpoints["target"], max_context=512)
    with pytest.raises(GrammarError, match="response_format type"):
        engine.generate("hi", response_format={"type": "yaml"})
    with pytest.raises(GrammarError, match="ignore_eos"):
        engine.generate("hi", response_format={"type": "json_object"}, ignore_eos=True, temperature=0.0)
    for bad in [{"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": 3}}]:
        with pytest.raises(GrammarError) as error:
            engine.generate("hi", response_format=bad)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("schema", [{"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                     "$ref": "#/$defs/a"}], ids=["self", "pair"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_schema_no_value_satisfies_is_one_line_not_an_empty_reply_or_a_crash(schema, temperature):
    """A $ref that only leads back to itself: no token can start a reply (greedy used to end it at once, empty, and
    sampling raised torch's "probability tensor contains inf or nan")."""
    engine = Engine.load(builtin_model_path(), max_context=96)
    response_format = {"type": "json_schema", "json_schema": {"name": "loop", "schema": schema}}
    with pytest.raises(GrammarError, match="no finite instance|admits no JSON value") as error:
        list(engine.chat([{"role": "user", "content": "hi"}], max_new_tokens=8, response_format=response_format,
                         temperature=temperature))
    assert "\n" not in str(error.value)


# -- 100 fuzzed schemas on the built-in model -------------------------------------------------------------------

NAMES = st.sampled_from(["a", "id", "name", "value", "items", "ok", "x_1"])
LEAVES = st.one_of(
    st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.tuples(st.integers(-1000, 1000), st.integers(0, 1000)).map(
        lambda bounds: {"type": "integer", "minimum": bounds[0], "maximum": bounds[0] + bounds[1]}),
    st.integers(0, 8).map(lambda n: {"type": "string", "maxLength": n}),
    st.sampled_from([{"type": "string", "pattern": "^[a-z]{1,6}$"}, {"type": "string", "format": "date"},
                     {"type": "string", "enum": ["red", "green", "blue"]}, {"const": 42},
                     {"enum": [1, "one", None, True]}]),
)


def composite(children):
    objects = st.lists(st.tuples(NAMES, children, st.booleans()), min_size=1, max_size=3,
                       unique_by=lambda item: item[0]).map(lambda props: {
                           "type": "object", "properties": {name: schema for name, schema, _ in props},
                           "required": [name for name, _, required in props if required],
                           "additionalProperties": False})
    arrays = st.tuples(children, st.integers(0, 1), st.integers(1, 3)).map(
        lambda a: {"type": "array", "items": a[0], "minItems": a[1], "maxItems": a[1] + a[2]})
    unions = st.lists(children, min_size=2, max_size=3).map(lambda options: {"anyOf": options})
    return st.one_of(objects, arrays, unions)


SCHEMAS = st.recursive(LEAVES, composite, max_leaves=6)


@pytest.fixture(scope="module")
def builtin_engines():
    return Engine.load(builtin_model_path()), Engine.load(builtin_model_path(), drafter="hybrid:feature")


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS)
def test_json_schema_replies_validate_on_fuzzed_schemas(builtin_engines, schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    plain, fast = builtin_engines
    response_format = {"type": "json_schema", "json_schema": {"name": "fuzzed", "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": "Reply in JSON."}]
    events = list(fast.chat(messages, max_new_tokens=200, response_format=response_format, temperature=0.0))
    check_reply(events, response_format)
    assert ids_of(events) == ids_of(plain.chat(messages, max_new_tokens=200, response_format=response_format, temperature=0.0))


def test_every_end_of_sequence_id_is_forbidden_until_the_grammar_may_end(checkpoints):  # noqa: F811
    """The test tokenizer ends a reply at two ids, the second also an ordinary piece of text ('ac'): inside a JSON
    string the grammar allows that text, but the reply would end there, so neither id may come before the end."""
    from edge.decoding.constrained import response_format_grammar

    engine = Engine.load(checkpoints["target"], max_context=512)
    assert len(engine.eos_token_ids) > 1
    constraint = engine.constraint(response_format_grammar(FORMATS[0]))
    constraint.consume(engine.tokenizer.encode('{"name": "', add_special_tokens=False))
    allowed = constraint.allowed()
    assert not any(bool(allowed[token]) for token in engine.eos_token_ids)
    constraint.consume(engine.tokenizer.encode('x", "tags": [], "age": 3, "kind": "cat"}', add_special_tokens=False))
    assert all(bool(constraint.allowed()[token]) for token in engine.eos_token_ids)
