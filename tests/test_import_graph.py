"""The project's import graph: no cycle among its modules (function-local imports counted, so none can hide one),
packages depend one way (tui, serve -> edge -> memory/kernels; export -> edge; bench -> edge), and no module imports
another's private names."""

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


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in ALLOWED:
        for path in (ROOT / package).rglob("*.py"):
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
    return [(target, names) for target, names in found if target.split(".")[0] in ALLOWED]


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
                   if target.split(".")[0] != name.split(".")[0]
                   and target.split(".")[0] not in ALLOWED[name.split(".")[0]])
    assert wrong == []


def test_no_module_imports_another_modules_private_names():
    private = sorted(f"{name} takes {target}.{imported}" for name, path in MODULES.items()
                     for target, names in imports(name, path) for imported in names
                     if imported.startswith("_") and not imported.startswith("__") and target != name)
    assert private == []
