"""The test tiers: which tests `scripts/test.sh --quick` runs, decided from what a test starts.

A test is marked `ray` when it, a fixture it uses or a helper of tests/ it calls (read from
their source, transitively) starts a Ray: the `ray_session` fixture, tuner's run_sweep /
resume_sweep / extend_sweep / connect, `ray.init`, or a `python -m tuner` command that runs
sweeps or clusters in a subprocess (`run_cli("sweep", ...)`, an argument list holding
"tuner", "sweep", `ray start`, a cluster or benchmark script). It is marked `browser` when
it drives chromium, and `slow` when it runs a script that takes long without Ray (setup.sh,
bench_gpu.py). Nobody has to remember to mark: a new test lands in its tier by what it calls.

The quick tier is every test marked neither `ray`, `browser` nor `slow` (also by hand: seconds
of work without Ray, such as multi-process torch). What the scan cannot see (a sweep started
some other way) the time limit catches: under --quick a test that takes longer than
QUICK_LIMIT_S fails, naming the marks to give it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import textwrap
import types
from typing import Any, Optional

import pytest

QUICK_LIMIT_S = float(os.environ.get("TUNER_QUICK_LIMIT_S", "5"))
WAIT_FACTOR = 6  # a quick test's wall may be this many times its CPU limit (a busy machine)
LIMIT_ENV = "TUNER_QUICK_LIMIT_S"
TIERS = ("ray", "browser", "slow")  # any of these: not in the quick tier

# What starts a Ray when called (or used as a fixture; `connect` called by its bare name, and
# `ray.init`), and what drives a browser.
RAY_NAMES = frozenset({"ray_session", "cli_sweep", "run_sweep", "resume_sweep", "extend_sweep"})
BROWSER_NAMES = frozenset({"browser_page", "sync_playwright"})
# `python -m tuner WORD` that may start a Ray (a refusal before it would not, but the scan
# cannot tell: in-process `cli(...)` is the way to test those in the quick tier).
RAY_COMMANDS = frozenset({"sweep", "resume", "extend", "submit", "cluster"})
RAY_SCRIPTS = ("cluster.sh", "submit.sh", "demo.sh", "bench.py", "bench_compute.py", "bench_fixed.py")
RAY_CODE = ("ray.init(", "connect(Runtime", "run_sweep(")  # in the code of a `python -c` probe
# Scripts that take longer than the quick tier allows without starting a Ray.
SLOW_SCRIPTS = ("setup.sh", "setup_browser.sh", "bench_gpu.py", "bench_search.py", "torchrun_loop.py")


# Imported once before the quick tier's first test, so that no test is charged for seconds of
# imports every later test gets for free (Ray Tune alone takes ~2-5 s on 2 cores).
SHARED_IMPORTS = (
    "torch",
    "ray.tune",
    "ray.tune.search",
    "ray.tune.schedulers",
    "optuna",
    "ConfigSpace",
    "hpbandster.optimizers.config_generators.bohb",
    "tensorboard.backend.event_processing.event_accumulator",
    "matplotlib.pyplot",
    "sklearn.model_selection",
)


def import_shared() -> None:
    import importlib

    for name in SHARED_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def mark(items: list[pytest.Item]) -> None:
    """Add the `ray` / `browser` / `slow` marks each item earns (see the module's docstring)."""
    for item in items:
        for tier in sorted(_tiers_of(item)):
            if tier not in {m.name for m in item.iter_markers()}:
                item.add_marker(getattr(pytest.mark, tier))


def quick(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(t) for t in TIERS)


CPU_KEY = pytest.StashKey[float]()


def cpu_seconds() -> float:
    """CPU-s this process and its waited-for children have used (user and system)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """The call's CPU-s, for `police`."""
    before = cpu_seconds()
    try:
        return (yield)
    finally:
        item.stash[CPU_KEY] = cpu_seconds() - before


def police(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
    """Under --quick: a test's call that took more than the limit fails. Measured in CPU-s (the
    test's process and the processes it waited for), not wall seconds: a busy or slower
    machine stretches a test's wall, not the work it does; and in wall seconds past
    WAIT_FACTOR times the limit, for a test that mostly waits."""
    cpu = item.stash.get(CPU_KEY, call.duration)
    if report.when != "call" or not report.passed:
        return
    if cpu <= QUICK_LIMIT_S and call.duration <= WAIT_FACTOR * QUICK_LIMIT_S:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} took {cpu:.1f} CPU-s ({call.duration:.1f} s), over the quick tier's "
        f"{QUICK_LIMIT_S:g} CPU-s (or {WAIT_FACTOR * QUICK_LIMIT_S:g} s): "
        "make it faster, or mark it (pytest.mark.slow; pytest.mark.ray if it starts a Ray some way "
        "tests/tiers.py cannot see)"
    )


def _tiers_of(item: pytest.Item) -> set[str]:
    fixtures = set(getattr(item, "fixturenames", ()))
    found = {"ray"} if fixtures & RAY_NAMES else set()
    funcs = [getattr(item, "function", None)]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    funcs += [d[-1].func for name, d in defs.items() if name in fixtures and d]
    for fn in funcs:
        if isinstance(fn, types.FunctionType) and _ours(fn):
            found |= _uses(fn)
    return found


def _ours(obj: Any) -> bool:
    """A function of this test suite (tests/...), whose body the scan reads."""
    module = getattr(obj, "__module__", "") or ""
    return module in ("tests", "conftest") or module.startswith(("tests.", "test_"))


@functools.cache
def _uses(fn: types.FunctionType, depth: int = 0) -> frozenset[str]:
    tree = _tree(fn)
    if tree is None:
        return frozenset()
    found: set[str] = set()
    local = _local_imports(tree)
    # What an assert compares (an expected command line, say) starts nothing; a script runs
    # when its name is a word of a command (in a list, or an argument), not a path's part.
    asserted = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assert) for n in ast.walk(a)}
    words = {id(w) for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple)) for w in n.elts}
    words |= {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) for a in n.args}
    for node in ast.walk(tree):
        name = _name(node)
        if name in RAY_NAMES or _calls_connect_or_init(node):
            found.add("ray")
        elif name in BROWSER_NAMES:
            found.add("browser")
        if isinstance(node, ast.Call) and _name(node.func) in ("run_cli", "start_cli"):
            words = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if words and words[0] in RAY_COMMANDS and "--help" not in words:
                found.add("ray")
        if isinstance(node, ast.Call) and any(k.arg == "on_session" for k in node.keywords):
            found.add("ray")  # cli(..., on_session=True): a sweep on the session's Ray
        if id(node) not in asserted:
            if isinstance(node, (ast.List, ast.Tuple)) and _starts_a_process_that_starts_ray(fn, node):
                found.add("ray")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _starts_ray(node.value):
                    found.add("ray")
                elif node.value.endswith(SLOW_SCRIPTS) and id(node) in words:
                    found.add("slow")
        if name and depth < 8:
            target = _resolve(fn, node, local)
            if isinstance(target, str) and _starts_ray(target):
                found.add("ray")
            for code in _functions_of(target):
                if code is not fn:
                    found |= _uses(code, depth + 1)
    return frozenset(found)


def _functions_of(target: Any) -> list[types.FunctionType]:
    """The function of tests/ a name refers to, or every method of a class of tests/."""
    if isinstance(target, types.FunctionType) and _ours(target):
        return [target]
    if isinstance(target, type) and _ours(target):
        return [f for f in vars(target).values() if isinstance(f, types.FunctionType)]
    return []


def _local_imports(tree: ast.AST) -> dict[str, tuple[str, Optional[str]]]:
    """Names a function imports itself from tests/: name -> (module, attribute or None)."""
    names: dict[str, tuple[str, Optional[str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
            for alias in node.names:
                if node.module == "tests":
                    names[alias.asname or alias.name] = (f"tests.{alias.name}", None)
                else:
                    names[alias.asname or alias.name] = (node.module or "", alias.name)
    return names


def _tree(fn: types.FunctionType) -> Optional[ast.AST]:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _calls_connect_or_init(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Name):
        return f.id == "connect"
    return isinstance(f, ast.Attribute) and f.attr == "init" and _name(f.value) == "ray"


def _resolve(fn: types.FunctionType, node: ast.AST, local: dict[str, tuple[str, Optional[str]]]) -> Any:
    """What a name (or module.name) in fn's body refers to: its module's globals, or what the
    function imports from tests/ itself."""
    if isinstance(node, ast.Name):
        return fn.__globals__.get(node.id, _imported(local.get(node.id)))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        module = fn.__globals__.get(node.value.id, _imported(local.get(node.value.id)))
        if isinstance(module, types.ModuleType):
            return getattr(module, node.attr, None)
    return None


def _imported(where: Optional[tuple[str, Optional[str]]]) -> Any:
    if where is None:
        return None
    import importlib

    try:
        module = importlib.import_module(where[0])
    except ImportError:
        return None
    return module if where[1] is None else getattr(module, where[1], None)


def _starts_a_process_that_starts_ray(fn: types.FunctionType, node: ast.List | ast.Tuple) -> bool:
    """An argument list `python -m tuner sweep ...` (not `... --help`), or `ray start ...`."""
    words: list[str] = []
    for e in node.elts:
        if isinstance(e, ast.Name) and isinstance(fn.__globals__.get(e.id), str):
            words.append(os.path.basename(fn.__globals__[e.id]))
        else:  # a constant, or one inside a call (Path(...).with_name("ray"))
            words += [c.value for c in ast.walk(e) if isinstance(c, ast.Constant) and type(c.value) is str]
    if "ray" in words and "start" in words[words.index("ray") + 1 :]:
        return True
    if "tuner" not in words or "--help" in words:
        return False
    return any(w in RAY_COMMANDS for w in words[words.index("tuner") + 1 :])


def _starts_ray(text: str) -> bool:
    """A script that starts Ray, or a `python -c` probe's code that does."""
    return text.endswith(RAY_SCRIPTS) or any(code in text for code in RAY_CODE)
