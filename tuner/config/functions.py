"""User functions named 'package.module:function' (task.model, task.data, task.loss, ...).

`check_function` finds one and checks that it can be called with the documented arguments,
from the module's source: the module is located (its parent packages are imported, as Python
must) but not run, so a sweep file is checked without importing torch or the user's code.
What the source cannot tell (a name imported from elsewhere, a decorated function, an object
made by a call) is taken on trust here and checked again when a trial imports it
(tuner.trial.loop.data.import_function).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Optional, Union

from tuner.errors import ConfigError

# Values that are never callable, by the kind of expression that makes them.
_NOT_CALLABLE = {
    ast.Constant: "a constant",
    ast.List: "a list",
    ast.Tuple: "a tuple",
    ast.Dict: "a dict",
    ast.Set: "a set",
    ast.JoinedStr: "a string",
    ast.ListComp: "a list",
    ast.DictComp: "a dict",
    ast.SetComp: "a set",
}
_Callee = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda]

# Where a sweep's modules are imported from while its file is validated (see code_dirs).
_CODE_DIRS: ContextVar[tuple[str, ...]] = ContextVar("code_dirs", default=())


def code_dirs(sweep_file: Optional[str] = None, *more: str) -> list[str]:
    """Where a sweep's own modules are imported from, first match wins: the directory the
    sweep is started in, then the sweep file's directory, then `more` (directories recorded
    by the run that started it). Absolute paths, each once."""
    dirs = [os.getcwd()]
    for d in (os.path.dirname(os.path.abspath(sweep_file)) if sweep_file else None, *more):
        if d and os.path.abspath(d) not in dirs:
            dirs.append(os.path.abspath(d))
    return dirs


@contextmanager
def importing_from(dirs: Sequence[str]) -> Iterator[None]:
    """check_function looks in `dirs` (instead of the current directory) inside this block."""
    token = _CODE_DIRS.set(tuple(dirs))
    try:
        yield
    finally:
        _CODE_DIRS.reset(token)


def check_function(field: str, ref: str, search_path: Optional[str], args: Sequence[str]) -> None:
    """Refuse, as a ConfigError naming `field`, a 'package.module:function' `ref` that cannot
    be found from `search_path` (default: the directories of `importing_from`, else the
    current directory), is not callable, or cannot be called as `fn(*args)` (positionally)."""
    module, _, attr = ref.partition(":")
    if not module or not attr.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        raise ConfigError(field, f"'{ref}' is not of the form package.module:function")
    where = [search_path] if search_path else list(_CODE_DIRS.get()) or [os.getcwd()]
    origin = _locate(field, module, where)
    if not (origin and origin.endswith(".py")):
        return  # a compiled or namespace module: checked when the trial imports it
    try:
        tree = ast.parse(Path(origin).read_text(), filename=origin)
    except SyntaxError as err:
        raise ConfigError(field, f"cannot import module '{module}' (line {err.lineno}: {err.msg})") from None
    node = _binding(tree, attr)
    if node is None:
        if not _open_namespace(tree):
            raise ConfigError(field, f"module '{module}' has no function '{attr}'")
        return
    wanted = f"fn({', '.join(args)})"
    if isinstance(node, ast.AsyncFunctionDef):
        raise ConfigError(field, f"'{ref}' is an async function; it is called as {wanted}")
    if isinstance(node, ast.expr):
        for kind, what in _NOT_CALLABLE.items():
            if isinstance(node, kind):
                raise ConfigError(field, f"'{ref}' is not callable ({what}); it must be {wanted}")
        if not isinstance(node, ast.Lambda):
            return  # made by a call or taken from a name: known only when run
    callee = _callee(node)
    if callee is not None and not _takes(callee, len(args), method=isinstance(node, ast.ClassDef)):
        raise ConfigError(
            field, f"'{ref}' cannot be called as {wanted}: its parameters are ({_params(callee)})"
        )


def _locate(field: str, module: str, where: list[str]) -> Optional[str]:
    """The module's source file (None where it has none), or a ConfigError if not found."""
    added = [d for d in where if d not in sys.path]
    sys.path[:0] = added
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:
        raise ConfigError(field, f"cannot import module '{module}' ({err})") from None
    finally:
        for d in added:
            sys.path.remove(d)
    if found is None:
        raise ConfigError(field, f"cannot import module '{module}' (not found from {' or '.join(where)})")
    return found.origin


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those inside if/try/with blocks (not functions)."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try, ast.With)) and hasattr(node, block):
                yield from _statements(getattr(node, block))
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                yield from _statements(handler.body)


def _binding(tree: ast.Module, name: str) -> Optional[Union[ast.stmt, ast.expr]]:
    """What the module's last top-level binding of `name` binds: a def or class, the
    assigned expression, or the import statement."""
    found: Optional[Union[ast.stmt, ast.expr]] = None
    for node in _statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            found = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node.value or node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name).split(".")[0] == name for a in node.names
        ):
            found = node
    return found


def _open_namespace(tree: ast.Module) -> bool:
    """Names may come from `from x import *` or a module-level __getattr__."""
    return any(
        (isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names))
        or (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
        for n in _statements(tree.body)
    )


def _callee(node: Union[ast.stmt, ast.expr]) -> Optional[_Callee]:
    """The function whose parameters a call meets: the def itself, a class's own __init__,
    a lambda; None where the source does not say (decorated, inherited, imported)."""
    if isinstance(node, ast.Lambda):
        return node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None if node.decorator_list else node
    if isinstance(node, ast.ClassDef) and not node.decorator_list:
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__" and not item.decorator_list:
                return item
    return None


def _takes(fn: _Callee, n: int, method: bool) -> bool:
    """Whether `fn` accepts n positional arguments (after self, for a method)."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args][1 if method else 0 :]
    required = len(positional) - len(a.defaults)
    kw_required = any(d is None for d in a.kw_defaults)
    return required <= n and (a.vararg is not None or len(positional) >= n) and not kw_required


def _params(fn: _Callee) -> str:
    return ast.unparse(fn.args)
