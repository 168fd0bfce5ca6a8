"""The shape of the code: imports run one way, through layers, with no circle and none hidden
inside a function; no function grows past 60 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

from decoding.trace import TRACE_VERSION

PACKAGES = ("decoding", "visualize", "app")

# Lowest first: a module may import its own layer and those below it, never one above.
LAYERS = (
    "decoding",  # the package itself: its __init__ imports nothing
    "decoding.errors",
    "decoding.settings",
    "decoding.trace",
    "decoding.costmodel",
    "visualize",
    "decoding.runtime",
    "decoding.models",
    "decoding.core",
    "decoding.drafts",
    "decoding.api",
    "decoding.tools",
    "decoding.__main__",
    "app",
)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def _resolve(importer: str, path: Path, node: ast.ImportFrom) -> list[str]:
    """The project modules a `from … import …` names (a submodule where the name is one)."""
    if node.level:
        package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
    return targets or ([base] if base in MODULES else [])


def imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported project module, whether the import sits inside a function) for each import."""
    tree = ast.parse(path.read_text())
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            targets = _resolve(name, path, node)
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name in MODULES]
        else:
            continue
        found += [(t, id(node) in inside) for t in targets if t != name]
    return found


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> int:
    return max(i for i, prefix in enumerate(LAYERS) if module == prefix or module.startswith(prefix + "."))


def test_every_module_has_a_layer():
    for name in MODULES:
        assert layer(name) >= 0, name


def test_no_project_import_inside_a_function():
    hidden = [(m, t) for m, edges in GRAPH.items() for t, inside in edges if inside]
    assert not hidden, f"imports inside functions (move them to the top): {hidden}"


def test_imports_run_down_the_layers():
    upward = [(m, t) for m, edges in GRAPH.items() for t, _ in edges if layer(t) > layer(m)]
    assert not upward, f"imports of a higher layer: {upward}"


def test_the_import_graph_has_no_circle():
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target, _ in GRAPH[module]:
            if state.get(target) == 1:
                circle = path[path.index(target) :] + [target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in MODULES:
        if module not in state:
            visit(module, [module])


def test_the_engine_imports_no_ui_and_the_views_no_engine():
    for module, edges in GRAPH.items():
        targets = {t for t, _ in edges}
        if module.startswith("decoding"):
            assert not {t for t in targets if t.startswith(("app", "visualize"))}, module
        if module.startswith("visualize"):
            allowed = (
                "decoding.trace",
                "decoding.costmodel",
                "decoding.settings",
                "decoding.errors",
                "visualize",
            )
            assert all(t.startswith(allowed) for t in targets), (module, targets)


def test_no_function_is_longer_than_60_lines():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert not long, long


def test_the_architecture_page_names_every_module_and_todays_trace_version():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert f"Version {TRACE_VERSION}:" in text
    names = {name.rsplit(".", 1)[-1] for name, path in MODULES.items() if path.name != "__init__.py"}
    unnamed = sorted(n for n in names - {"__main__"} if not re.search(rf"\b{n}\b", text))
    assert not unnamed, f"docs/architecture.md does not name {unnamed}"
