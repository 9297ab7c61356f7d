"""The code's shape, as a newcomer meets it: edge/ holds subpackages and only its few top-level modules, no function in
the runtime or the server runs past a screen, the torch model stays a torch model, and docs/architecture.md's
package diagrams say what tests/test_import_graph.py enforces."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_import_graph import ALLOWED, EDGE_LAYERS, EDGE_LEAVES, EDGE_TOP, INSTALLED_PARTS, package_of

ROOT = Path(__file__).resolve().parents[1]
LONGEST_FUNCTION = 60  # lines, the def line to the last, docstring included
EDGE_TOP_LEVEL = {"__init__", *EDGE_LEAVES, *EDGE_TOP}


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def class_named(path: Path, name: str) -> ast.ClassDef:
    return next(node for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ClassDef) and node.name == name)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def length(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_function_in_the_runtime_or_the_server_is_longer_than_a_screen():
    long = sorted(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length(node)} lines)"
                  for path in (ROOT / "edge").rglob("*.py") if package_of(module_name(path)) in ("edge", "serve")
                  for node in functions(path) if length(node) > LONGEST_FUNCTION)
    assert long == []


def test_edge_holds_subpackages_and_only_its_top_level_modules():
    modules = {path.stem for path in (ROOT / "edge").glob("*.py")}
    assert modules - EDGE_TOP_LEVEL == set()
    subpackages = {path.parent.name for path in (ROOT / "edge").glob("*/__init__.py")}
    assert subpackages - {"engine"} - INSTALLED_PARTS == set(EDGE_LAYERS)


def test_the_transformer_is_a_torch_model_without_kernel_plumbing():
    source = ROOT / "edge" / "model" / "transformer.py"
    transformer = class_named(source, "Transformer")
    methods = [node.name for node in transformer.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= 12, methods
    text = ast.get_source_segment(source.read_text(), transformer)
    assert not re.search(r"rowwise|_fused|kernel_head|draft_greedy|packed_format", text)


def test_the_engine_and_the_app_factory_stay_small():
    engine = next(path for path in (ROOT / "edge" / "engine").rglob("*.py")
                  if "class Engine" in path.read_text())
    assert length(class_named(engine, "Engine")) < 200
    create_app = next(node for path in (ROOT / "edge" / "serve").rglob("*.py") for node in functions(path)
                      if node.name == "create_app")
    assert length(create_app) < 40


def test_no_docstring_tells_the_history_of_a_plan():
    pattern = re.compile("Step [0-9] " + "of")
    found = [f"{path.relative_to(ROOT)}" for top in ("edge", "bench", "train", "tests") for path in (ROOT / top).rglob("*.py")
             if pattern.search(path.read_text())]
    assert found == []


def diagram(heading: str) -> dict[str, set[str]]:
    """The arrows of the first diagram under `heading` in docs/architecture.md: name -> the names after '->'."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split(heading, 1)[1].split("```", 2)[1]
    arrows, current = {}, None
    for line in block.splitlines():
        if line and not line.startswith(" "):
            current = re.split(r"[/ ,]", line, maxsplit=1)[0].removesuffix(".py")
        if "->" in line and current is not None:
            targets = line.rsplit("->", 1)[1]
            arrows[current] = set() if "nothing" in targets or "none" in targets else {
                name.strip() for name in targets.split(",")}
    return arrows


def test_the_package_diagram_says_what_the_import_graph_test_allows():
    assert diagram("## Packages and the direction of their imports") == ALLOWED


def test_the_diagram_of_edges_layers_says_what_the_import_graph_test_allows():
    arrows = diagram("Inside edge the subpackages are layers too")
    assert {name: targets for name, targets in arrows.items() if name in EDGE_LAYERS} == EDGE_LAYERS
    assert set(arrows) == set(EDGE_LAYERS) | {"engine"}
