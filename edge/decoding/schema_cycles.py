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
    nodes = _Subschemas(schema)
    inhabited = _inhabited(nodes)
    if inhabited is None:
        return None
    for index in _reachable(nodes):
        node = nodes.values[index]
        target = nodes.target(node.get("$ref")) if isinstance(node, dict) else None
        if target is not None and not inhabited[target]:
            return _cycle_from(target, nodes, inhabited)
    return None


class _Subschemas:
    """Every subschema of a document, numbered each before its children (0: the root), with the step from its
    parent ("anyOf/0", "properties/name"): a pointer is spelled out only when asked for, so a schema nested N deep
    costs O(N), not O(N^2) in pointer strings. No recursion: a schema may nest deeper than Python's stack."""

    def __init__(self, schema: Any) -> None:
        self.values: list[Any] = []
        self.parents: list[int] = []
        self.steps: list[str] = []
        self.children: list[dict[str, int]] = []  # step -> child, of each subschema
        stack: list[tuple[int, str, Any]] = [(-1, "", schema)]
        while stack:
            parent, step, node = stack.pop()
            index = len(self.values)
            self.values.append(node)
            self.parents.append(parent)
            self.steps.append(step)
            self.children.append({})
            if parent >= 0:
                self.children[parent][step] = index
            if isinstance(node, dict):
                stack.extend((index, step, child) for step, child in reversed(list(_children(node, True))))

    def __len__(self) -> int:
        return len(self.values)

    def child(self, index: int, step: str) -> int | None:
        return self.children[index].get(step)

    def pointer(self, index: int) -> str:
        steps = []
        while index > 0:
            steps.append(self.steps[index])
            index = self.parents[index]
        return "/".join(["#", *reversed(steps)])

    def target(self, reference: Any) -> int | None:
        """The subschema a local `$ref` ("#", "#/$defs/A") points to, None for one that points elsewhere."""
        if not isinstance(reference, str) or not reference.startswith("#"):
            return None
        path = unquote(reference).rstrip("/") or "#"
        if path == "#":
            return 0
        if not path.startswith("#/"):
            return None
        tokens, index, at = path[2:].split("/"), 0, 0
        while at < len(tokens):  # a step is one token ("items") or two ("anyOf/0", "properties/name")
            found = self.child(index, tokens[at])
            if found is None and at + 1 < len(tokens):
                found = self.child(index, f"{tokens[at]}/{tokens[at + 1]}")
                at += 1
            if found is None:
                return None
            index, at = found, at + 1
        return index


def _children(node: dict, with_definitions: bool) -> Iterator[tuple[str, Any]]:
    """(step, subschema) of each subschema directly under `node`."""
    for keyword in _ONE:
        if isinstance(node.get(keyword), (dict, bool)):
            yield keyword, node[keyword]
    for keyword in _LIST:
        if isinstance(node.get(keyword), list):
            for index, child in enumerate(node[keyword]):
                yield f"{keyword}/{index}", child
    for keyword in _MAP:
        if keyword in ("$defs", "definitions") and not with_definitions:
            continue
        if isinstance(node.get(keyword), dict):
            for name, child in node[keyword].items():
                yield f"{keyword}/{_escape(str(name))}", child


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


FALSE = -1  # a forced part that is the schema `false`


def _inhabited(nodes: _Subschemas) -> list[bool] | None:
    """Whether each subschema has a finite instance (a least fixed point), None past MAX_ROUNDS."""
    inhabited = [False] * len(nodes)
    order = range(len(nodes) - 1, -1, -1)  # children before their parents: most settle in the first round
    for _ in range(MAX_ROUNDS):
        grown = False
        for index in order:
            if not inhabited[index] and not _forced_parts_missing(index, nodes, inhabited):
                inhabited[index] = True
                grown = True
        if not grown:
            return inhabited
    return None


def _forced_parts_missing(index: int, nodes: _Subschemas, inhabited: list[bool]) -> list[int]:
    """The subschemas every instance of subschema `index` needs that are not (yet) known to be inhabited; [FALSE]
    for the schema `false`."""
    node = nodes.values[index]
    if node is False:
        return [FALSE]
    if not isinstance(node, dict):
        return []
    missing = []
    target = nodes.target(node.get("$ref"))
    if target is not None and not inhabited[target]:
        missing.append(target)
    for member in range(len(node.get("allOf") or [])):
        child = nodes.child(index, f"allOf/{member}")
        if child is not None and not inhabited[child]:
            missing.append(child)
    for keyword in ("anyOf", "oneOf"):
        branches = [nodes.child(index, f"{keyword}/{branch}") for branch in range(len(node.get(keyword) or []))]
        branches = [branch for branch in branches if branch is not None]
        if branches and not any(inhabited[branch] for branch in branches):
            missing.append(branches[0])
    if "const" in node or node.get("enum"):
        return missing
    kinds = node.get("type", list(_TYPES))
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else list(_TYPES)
    needs = [_type_needs(index, node, kind, nodes, inhabited) for kind in kinds]
    if needs and all(needs):  # no type of value can be made: blame the first one's need
        missing.append(needs[0][0])
    return missing


def _type_needs(index: int, node: dict, kind: Any, nodes: _Subschemas, inhabited: list[bool]) -> list[int]:
    """The subschemas a value of type `kind` under `node` needs that are not known to be inhabited."""
    if kind == "object":
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        needs = []
        for name in node.get("required") or []:
            if not isinstance(name, str):
                continue
            if name in properties:
                child = nodes.child(index, f"properties/{_escape(name)}")
            elif isinstance(node.get("additionalProperties"), (dict, bool)) and not node.get("patternProperties"):
                child = nodes.child(index, "additionalProperties")
            else:
                continue
            if child is not None and not inhabited[child]:
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
        for item in range(min(least, len(prefix) + 1)):
            child = nodes.child(index, f"{prefix_key}/{item}") if item < len(prefix) else \
                nodes.child(index, rest) if rest is not None else None
            if child is not None and not inhabited[child]:
                needs.append(child)
        return needs
    return []


def _reachable(nodes: _Subschemas) -> list[int]:
    """The subschemas an instance of the root may meet: through keywords and `$ref`s, in order."""
    seen, stack, order = set(), [0], []
    while stack:
        index = stack.pop()
        if index in seen:
            continue
        seen.add(index)
        order.append(index)
        node = nodes.values[index]
        if not isinstance(node, dict):
            continue
        children = [nodes.child(index, step) for step, _ in _children(node, False)]
        target = nodes.target(node.get("$ref"))
        stack.extend(reversed(children + ([target] if target is not None else [])))
    return order


def _cycle_from(index: int, nodes: _Subschemas, inhabited: list[bool]) -> list[str] | None:
    """Follow, from an uninhabited subschema, the first forced part that is uninhabited, until one repeats: the
    cycle's pointers, its first repeated last."""
    trail: list[int] = []
    while index not in trail:
        trail.append(index)
        missing = _forced_parts_missing(index, nodes, inhabited)
        if not missing or missing[0] == FALSE:
            return None  # a `false` schema, not a cycle
        index = missing[0]
    return [nodes.pointer(step) for step in trail[trail.index(index):] + [index]]
