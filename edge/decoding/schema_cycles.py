"""JSON schemas whose `$ref`s form a cycle that no finite document gets out of.

    cycle = endless_cycle(schema)      # None, or the JSON pointers around the cycle: ["#", "#/properties/next", "#"]

`{"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}` describes only infinite documents:
each object must hold another. A grammar built from it can never finish, so generation under it goes astray (an
empty reply, or the grammar engine giving up part way). This finds, before anything is generated, whether some
subschema the document can reach through `$ref` has no finite instance, and which cycle of references causes it.

A subschema has a finite instance ("is inhabited") unless its structure forces an uninhabited part: a required
property, the first `minItems` items of an array, every `allOf` member, some `anyOf`/`oneOf` branch, a `$ref`'s
target. The inhabited subschemas are found as a least fixed point (none at first; then, round by round, each whose
forced parts are all inhabited), so a subschema left out at the end lies on, or leads into, a cycle of forced
references. Constraints besides structure (patterns, ranges, `not`, ...) are taken to be satisfiable: the check
refuses only what the references make impossible.
"""

from __future__ import annotations

from typing import Any, Iterator
from urllib.parse import unquote

# keywords whose value is one subschema, a list of them, or a name -> subschema mapping
_ONE = ("additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
MAX_ROUNDS = 200  # past this many rounds the check gives up (and refuses nothing)


def endless_cycle(schema: Any) -> list[str] | None:
    """The JSON pointers of a cycle of `$ref`s (and the forced steps between them) that a subschema reachable from
    the root cannot get out of, first pointer repeated last; None when every reachable subschema has a finite
    instance (or the schema is too tangled to tell)."""
    nodes = dict(_subschemas(schema, "#"))
    inhabited = _inhabited(nodes)
    if inhabited is None:
        return None
    for path in _reachable(nodes):
        node = nodes[path]
        target = _target(node.get("$ref"), nodes) if isinstance(node, dict) else None
        if target is not None and target not in inhabited:
            return _cycle_from(target, nodes, inhabited)
    return None


def _subschemas(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every subschema of the document with its JSON pointer, each before its children (no recursion: a schema may
    nest deeper than Python's stack)."""
    stack = [(path, node)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if isinstance(node, dict):
            stack.extend(reversed(list(_children(node, path, with_definitions=True))))


def _children(node: dict, path: str, with_definitions: bool) -> Iterator[tuple[str, Any]]:
    for keyword in _ONE:
        if isinstance(node.get(keyword), (dict, bool)):
            yield f"{path}/{keyword}", node[keyword]
    for keyword in _LIST:
        if isinstance(node.get(keyword), list):
            for index, child in enumerate(node[keyword]):
                yield f"{path}/{keyword}/{index}", child
    for keyword in _MAP:
        if keyword in ("$defs", "definitions") and not with_definitions:
            continue
        if isinstance(node.get(keyword), dict):
            for name, child in node[keyword].items():
                yield f"{path}/{keyword}/{_escape(str(name))}", child


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _target(reference: Any, nodes: dict[str, Any]) -> str | None:
    """The pointer of a local `$ref`'s target ("#", "#/$defs/A"), None for one that points elsewhere."""
    if not isinstance(reference, str) or not reference.startswith("#"):
        return None
    path = unquote(reference).rstrip("/") or "#"
    return path if path in nodes else None


def _inhabited(nodes: dict[str, Any]) -> set[str] | None:
    """The pointers of the subschemas with a finite instance (a least fixed point), None past MAX_ROUNDS."""
    order = list(reversed(list(nodes)))  # children before their parents: most settle in the first round
    inhabited: set[str] = set()
    for _ in range(MAX_ROUNDS):
        grown = False
        for path in order:
            if path not in inhabited and not _forced_parts_missing(path, nodes[path], nodes, inhabited):
                inhabited.add(path)
                grown = True
        if not grown:
            return inhabited
    return None


def _forced_parts_missing(path: str, node: Any, nodes: dict[str, Any], inhabited: set[str]) -> list[str]:
    """The pointers of the parts every instance of `node` needs that are not (yet) known to be inhabited; ["false"]
    for the schema `false`."""
    if node is False:
        return ["false"]
    if not isinstance(node, dict):
        return []
    missing = []
    target = _target(node.get("$ref"), nodes)
    if target is not None and target not in inhabited:
        missing.append(target)
    for index, _ in enumerate(node.get("allOf") or []):
        if f"{path}/allOf/{index}" not in inhabited:
            missing.append(f"{path}/allOf/{index}")
    for keyword in ("anyOf", "oneOf"):
        branches = [f"{path}/{keyword}/{index}" for index in range(len(node.get(keyword) or []))]
        if branches and not any(branch in inhabited for branch in branches):
            missing.append(branches[0])
    if "const" in node or node.get("enum"):
        return missing
    kinds = node.get("type", list(_TYPES))
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else list(_TYPES)
    needs = [_type_needs(path, node, kind, inhabited) for kind in kinds]
    if needs and all(needs):  # no type of value can be made: blame the first one's need
        missing.append(needs[0][0])
    return missing


def _type_needs(path: str, node: dict, kind: Any, inhabited: set[str]) -> list[str]:
    """The parts a value of type `kind` under `node` needs that are not known to be inhabited."""
    if kind == "object":
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        needs = []
        for name in node.get("required") or []:
            if not isinstance(name, str):
                continue
            if name in properties:
                child = f"{path}/properties/{_escape(name)}"
            elif isinstance(node.get("additionalProperties"), (dict, bool)) and not node.get("patternProperties"):
                child = f"{path}/additionalProperties"
            else:
                continue
            if child not in inhabited:
                needs.append(child)
        return needs
    if kind == "array":
        least = node.get("minItems", 0)
        least = least if isinstance(least, int) and not isinstance(least, bool) else 0
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else \
            node.get("items") if isinstance(node.get("items"), list) else []
        prefix_key = "prefixItems" if isinstance(node.get("prefixItems"), list) else "items"
        rest = "items" if isinstance(node.get("items"), (dict, bool)) else \
            "additionalItems" if isinstance(node.get("additionalItems"), (dict, bool)) else None
        needs = []
        for index in range(min(least, len(prefix) + 1)):
            child = f"{path}/{prefix_key}/{index}" if index < len(prefix) else \
                f"{path}/{rest}" if rest is not None else None
            if child is not None and child not in inhabited:
                needs.append(child)
        return needs
    return []


def _reachable(nodes: dict[str, Any]) -> list[str]:
    """The pointers of the subschemas an instance of the root may meet: through keywords and `$ref`s, in order."""
    seen, stack, order = set(), ["#"], []
    while stack:
        path = stack.pop()
        if path in seen or path not in nodes:
            continue
        seen.add(path)
        order.append(path)
        node = nodes[path]
        if not isinstance(node, dict):
            continue
        children = [key for key, _ in _children(node, path, with_definitions=False)]
        target = _target(node.get("$ref"), nodes)
        stack.extend(reversed(children + ([target] if target is not None else [])))
    return order


def _cycle_from(path: str, nodes: dict[str, Any], inhabited: set[str]) -> list[str] | None:
    """Follow, from an uninhabited subschema, the first forced part that is uninhabited, until a pointer repeats:
    the cycle, its first pointer repeated last."""
    trail: list[str] = []
    while path not in trail:
        trail.append(path)
        missing = _forced_parts_missing(path, nodes[path], nodes, inhabited)
        if not missing or missing[0] not in nodes:
            return None  # a `false` schema, not a cycle
        path = missing[0]
    return trail[trail.index(path):] + [path]
