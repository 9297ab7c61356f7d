"""The project's import graph: no cycle among its modules (function-local imports counted, so none can hide one),
packages depend one way (tui, serve, bench -> frontend -> edge -> memory/kernels; export -> edge; bench -> export),
edge's subpackages depend one way too (decoding -> sources, backends -> model, text), and no module imports another's
private names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {  # package -> the project packages it may import
    "kernels": set(),
    "memory": set(),
    "edge": {"memory", "kernels"},
    "frontend": {"edge", "memory", "kernels"},
    "export": {"edge", "memory", "kernels"},
    "tui": {"edge", "frontend", "memory", "kernels"},
    "bench": {"edge", "frontend", "export", "memory", "kernels"},
    "train": {"edge", "memory", "kernels"},
    "serve": {"edge", "frontend", "memory", "kernels"},
}
# Inside edge: subpackages in layers, each importing only the subpackages named here. The leaves (errors, events,
# activity) import nothing of the project and every part of edge may import them; the top-level modules (engine,
# load_spec, planning, and the package's own face, edge/__init__.py) sit above every subpackage and may import any.
EDGE_LAYERS = {  # subpackage of edge -> the subpackages it may import
    "model": set(),  # the transformer, its config, KV caches, weight formats, offload, calibration, trimmed head
    "text": set(),  # tokenizer, chat templates, stop strings
    "sources": {"model"},  # checkpoint folders, GGUF files, Hub ids, the default and built-in models
    "backends": {"model", "text"},  # exported bundles run behind the Transformer calls
    "decoding": {"model", "text", "sources", "backends"},  # loop, speculation, sampling, grammars, drafters, registry
}
EDGE_LEAVES = {"errors", "events", "files", "activity"}
EDGE_TOP = {"engine", "load_spec", "planning"}


# the parts installed under the one import root `edge` beside its runtime (edge.kernels, edge.tui, ...); bench and
# train run from a checkout and keep their own top-level names
INSTALLED_PARTS = {"kernels", "memory", "export", "tui", "serve", "frontend"}


def package_of(module: str) -> str:
    """The package a module belongs to in ALLOWED: "edge.kernels.runner" -> "kernels", "edge.engine" -> "edge",
    "bench.cli" -> "bench"."""
    parts = module.split(".")
    return parts[1] if parts[0] == "edge" and len(parts) > 1 and parts[1] in INSTALLED_PARTS else parts[0]


def project_modules() -> dict[str, Path]:
    modules = {}
    for top in ("edge", "bench", "train"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = project_modules()


def imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported project module, names taken from it) for every import statement anywhere in the file."""
    found = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            for alias in node.names:  # `from package import module` imports that module
                submodule = f"{module}.{alias.name}"
                found.append((submodule, []) if submodule in MODULES else (module, [alias.name]))
    return [(target, names) for target, names in found if target.split(".")[0] in {"edge", "bench", "train"}]


def graph() -> dict[str, set[str]]:
    edges = {}
    for name, path in MODULES.items():
        targets = set()
        for target, _ in imports(name, path):
            while target not in MODULES:  # `import a.b.c` of a name inside a module: that module
                target = target.rpartition(".")[0]
            targets.add(target)
        edges[name] = targets - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in edges[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_the_projects_modules():
    edges = graph()
    assert len(edges) > 100  # the walk found the project
    assert cycles(edges) == []


def test_the_detector_finds_a_cycle_through_a_function_local_import():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


def test_packages_depend_one_way():
    wrong = sorted(f"{name} imports {target}" for name, targets in graph().items() for target in targets
                   if package_of(target) != package_of(name)
                   and package_of(target) not in ALLOWED[package_of(name)])
    assert wrong == []


def edge_part(module: str) -> str:
    """The part of edge a module belongs to: "edge.model.config" -> "model", "edge.engine" -> "engine", "edge" -> ""."""
    return module.split(".")[1] if "." in module else ""


def test_edge_holds_the_parts_its_layers_name():
    parts = {edge_part(name) for name in MODULES if package_of(name) == "edge"}
    assert parts == set(EDGE_LAYERS) | EDGE_LEAVES | EDGE_TOP | {""}
    assert all((ROOT / "edge" / part / "__init__.py").is_file() for part in EDGE_LAYERS)


def test_edges_layers_are_one_way():
    assert cycles({part: set(below) for part, below in EDGE_LAYERS.items()}) == []
    assert all(below <= set(EDGE_LAYERS) - {part} for part, below in EDGE_LAYERS.items())


def test_edges_subpackages_import_only_the_layers_below_them():
    edges = graph()
    wrong = sorted(f"{name} imports {target}" for name, targets in edges.items() if package_of(name) == "edge"
                   and edge_part(name) in set(EDGE_LAYERS) | EDGE_LEAVES
                   for target in targets if package_of(target) == "edge" and edge_part(target) != edge_part(name)
                   and edge_part(target) not in EDGE_LAYERS.get(edge_part(name), set()) | EDGE_LEAVES)
    assert wrong == []
    leaves = sorted(f"{name} imports {target}" for name, targets in edges.items()
                    if package_of(name) == "edge" and edge_part(name) in EDGE_LEAVES for target in targets)
    assert leaves == []
    parts = {}  # the subpackages' own graph, as the code has it
    for name, targets in edges.items():
        if package_of(name) == "edge" and edge_part(name) in EDGE_LAYERS:
            parts.setdefault(edge_part(name), set()).update(
                edge_part(target) for target in targets
                if package_of(target) == "edge" and edge_part(target) in EDGE_LAYERS)
    assert cycles({part: below - {part} for part, below in parts.items()}) == []


def test_no_module_imports_another_modules_private_names():
    private = sorted(f"{name} takes {target}.{imported}" for name, path in MODULES.items()
                     for target, names in imports(name, path) for imported in names
                     if imported.startswith("_") and not imported.startswith("__") and target != name)
    assert private == []
