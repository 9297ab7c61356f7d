"""A JSON schema whose $refs form a cycle no finite document gets out of is refused before generation, naming the
cycle by its JSON pointers; a grammar that fails part way is named in the schema's terms, never by token ids."""

from __future__ import annotations

import pytest

from edge.decoding.constrained import Constraint, GrammarError, json_schema_grammar
from edge.decoding.schema_cycles import endless_cycle

MUTUAL = {"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
                    "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}},
          "$ref": "#/$defs/A"}
SELF_REQUIRED = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
REF_TO_REF = {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
ENDLESS = [
    (MUTUAL, ["#/$defs/A", "#/$defs/A/properties/b", "#/$defs/B", "#/$defs/B/properties/a", "#/$defs/A"]),
    (SELF_REQUIRED, ["#", "#/properties/next", "#"]),
    (REF_TO_REF, ["#/$defs/A", "#/$defs/B", "#/$defs/A"]),
    ({"$defs": {"N": {"type": "array", "items": {"$ref": "#/$defs/N"}, "minItems": 1}}, "$ref": "#/$defs/N"},
     ["#/$defs/N", "#/$defs/N/items", "#/$defs/N"]),
    ({"definitions": {"T": {"anyOf": [{"$ref": "#/definitions/T"}, {"allOf": [{"$ref": "#/definitions/T"}]}]}},
      "$ref": "#/definitions/T"}, ["#/definitions/T", "#/definitions/T/anyOf/0", "#/definitions/T"]),
    # optional, but a grammar engine cannot build the subschema either: refused too
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/A"}, "y": {"type": "integer"}}, "required": ["y"],
      "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/A"}}, "required": ["b"]}}},
     ["#/$defs/A", "#/$defs/A/properties/b", "#/$defs/A"]),
]
FINITE = [
    {"type": "object", "properties": {"next": {"$ref": "#"}}},  # the chain may stop: {} ends it
    {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
     "required": ["name", "children"]},  # a tree: an empty children list ends it
    {"$defs": {"T": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/$defs/T"}, "minItems": 1}]}},
     "$ref": "#/$defs/T"},
    {"type": "object", "properties": {"x": False}},  # a property forbidden, not a cycle
    {"$defs": {"unused": {"$ref": "#/$defs/unused"}}, "type": "string"},  # a cycle nothing reaches
    {"$ref": "https://example.com/elsewhere.json"},
]


@pytest.mark.parametrize("schema, cycle", ENDLESS)
def test_a_cycle_without_a_finite_instance_is_found(schema, cycle):
    assert endless_cycle(schema) == cycle


@pytest.mark.parametrize("schema", FINITE)
def test_schemas_with_finite_instances_pass(schema):
    assert endless_cycle(schema) is None


def test_the_refusal_names_the_cycle_and_the_fix():
    with pytest.raises(GrammarError) as raised:
        json_schema_grammar(MUTUAL)
    assert str(raised.value) == (
        "response_format.json_schema.schema has no finite instance: its $refs form a cycle every instance must follow "
        "(#/$defs/A → #/$defs/A/properties/b → #/$defs/B → #/$defs/B/properties/a → #/$defs/A); make one step of it "
        "optional (leave the property out of required, let the array be empty, or add an anyOf branch without the "
        "$ref)")


def test_a_deeply_nested_schema_is_checked_without_recursion():
    schema: dict = {"type": "string"}
    for _ in range(20_000):
        schema = {"anyOf": [schema]}
    assert endless_cycle(schema) is None


class GivingUp:
    """An llguidance matcher that gives up at the first token, as it does on schemas too tangled for it."""

    def consume_token(self, token: int) -> bool:
        return False

    def get_error(self) -> str:
        return "parser error: Too many items (limit 50000; ff_tokens) at token 93"


def test_a_grammar_that_gives_up_is_named_in_the_schemas_terms_not_token_ids():
    constraint = Constraint(GivingUp(), 100, frozenset(), "response_format.json_schema.schema")
    with pytest.raises(GrammarError) as raised:
        constraint.consume([93])
    message = str(raised.value)
    assert message.startswith("response_format.json_schema.schema: the grammar engine (llguidance) gave up part way")
    assert "93" not in message and message.endswith("simplify the schema")
