"""Which way imports point inside tuner/, read from the source (AST, nothing imported).

docs/explanation/architecture.md draws the rooms (packages, the modules at the top, and
trial/'s own rooms) in rows; an import goes down the picture, never up or sideways, except
among the shared modules of the bottom row, which import each other without a circle. Every
import counts: at module level, under `if TYPE_CHECKING:`, and inside functions (a lazy import
is still a dependency). And no module is in a circle of imports with others. Torch and Ray are
imported when a module loads only in the rooms that need them, so `tuner validate` and the
driver start without torch.

A new room (a new package or a module directly under tuner/) fails
test_every_room_has_its_row until it is given a row here and a place in the picture.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

TUNER = Path(__file__).resolve().parents[1] / "tuner"

# The picture's rows, top to bottom (docs/explanation/architecture.md, "The rooms").
ROWS: list[set[str]] = [
    {"__main__"},  # python -m tuner
    {"cli"},
    {"tuner"},  # the package's face: what `import tuner` gives a user
    {"driver"},
    {"search", "view"},
    {"history"},
    {"results"},
    {"cluster", "trial", "trial.launch", "integrations"},
    {"trial.userloop", "trial.script"},
    {"trial.loop"},
    {"trial.frame"},
    {
        "config",
        "space",
        "catalogue",
        "sweepdir",
        "packing",
        "errors",
        "autotune",
        "version",
        "environment",
        "timeline",
    },
]
SHARED = ROWS[-1]
ROW = {room: i for i, rooms in enumerate(ROWS) for room in rooms}
# The rooms that may import torch when they are loaded; anywhere else only inside a function.
TORCH_AT_LOAD = {"trial.frame", "trial.loop", "trial.userloop", "trial.script", "integrations"}
# The rooms `tuner validate` reads: neither Ray nor torch when loaded.
NO_RAY_AT_LOAD = SHARED


def _name(path: Path) -> str:
    parts = ["tuner", *path.relative_to(TUNER).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _modules() -> dict[str, ast.Module]:
    return {_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(TUNER.rglob("*.py"))}


def room(module: str) -> str:
    """tuner.driver.sweep -> driver; tuner.trial.loop.run -> trial.loop; tuner -> tuner."""
    parts = module.split(".")
    if len(parts) == 1:
        return "tuner"
    if parts[1] == "trial" and len(parts) > 2:
        return f"trial.{parts[2]}"
    return parts[1]


def _at_load(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run when the module is loaded (not those under `if TYPE_CHECKING:`)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) != "TYPE_CHECKING":
            out += _at_load([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            out += _at_load(
                [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
            )
    return out


def imports(module: str, load_only: bool = False) -> set[str]:
    """The names `module` imports: tuner's modules (`from tuner.x import y` is tuner.x.y when
    that is a module, else tuner.x) and other top-level packages (torch, ray)."""
    modules = _modules()
    tree = modules[module]
    nodes = _at_load(tree.body) if load_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in modules else node.module)
        elif isinstance(node, ast.ImportFrom):
            pytest.fail(f"{module}: a relative import (tuner imports by full name)")
    return out


def _ours(names: set[str]) -> set[str]:
    return {n for n in names if n == "tuner" or n.startswith("tuner.")}


def test_every_room_has_its_row() -> None:
    rooms = {room(m) for m in _modules()}
    assert rooms - set(ROW) == set(), "give the new room a row in ROWS and in architecture.md's picture"
    assert set(ROW) - rooms == set(), "a row names a room that is gone"


def test_imports_point_down_the_picture() -> None:
    wrong = []
    for module in _modules():
        for target in _ours(imports(module)):
            a, b = room(module), room(target)
            if a == b or (a in SHARED and b in SHARED):
                continue
            if ROW[b] <= ROW[a]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports up or sideways:\n" + "\n".join(wrong)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_circles_are_found() -> None:
    """The check below can fail: a circle of three is found, a chain is not."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_is_in_a_circle() -> None:
    graph = {m: _ours(imports(m)) & set(_modules()) for m in _modules()}
    assert _circles(graph) == []
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    assert _circles(rooms) == []


@pytest.mark.parametrize("package", ["torch", "ray"])
def test_heavy_imports_only_where_they_belong(package: str) -> None:
    allowed = TORCH_AT_LOAD if package == "torch" else set(ROW) - NO_RAY_AT_LOAD
    wrong = [
        m
        for m in _modules()
        if room(m) not in allowed and any(n.split(".")[0] == package for n in imports(m, load_only=True))
    ]
    assert not wrong, f"these import {package} when loaded: {wrong}"
