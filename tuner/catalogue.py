"""The built-in models, datasets and optimizers: names, parameters, defaults and bounds.

Torch-free and Ray-free: validation (tuner.config) and the trial (tuner.trial.models, data,
optim) both read it, so adding a built-in is one entry here plus its builder in the trial.
A user model or dataset is named 'package.module:function' instead; `check_importable`
finds it without running it.
"""

from __future__ import annotations

import ast
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union


@dataclass(frozen=True)
class ModelParam:
    """A size a built-in model reads from the trial's configuration."""

    kind: type  # int or float
    default: Union[int, float]
    low: float
    high: float


_DROPOUT = ModelParam(float, 0.0, 0, 0.99)

# name -> the parameters it reads (tuner.trial.models builds it).
MODELS: dict[str, dict[str, ModelParam]] = {
    "mlp": {
        "width": ModelParam(int, 128, 1, math.inf),
        "depth": ModelParam(int, 2, 0, 64),
        "dropout": _DROPOUT,
    },
    "cnn": {
        "channels": ModelParam(int, 32, 1, 4096),
        "blocks": ModelParam(int, 2, 1, 16),
        "dropout": _DROPOUT,
    },
    "vit": {
        "patch_size": ModelParam(int, 16, 1, 1024),
        "width": ModelParam(int, 192, 8, math.inf),
        "depth": ModelParam(int, 6, 1, 128),
        "heads": ModelParam(int, 3, 1, 256),
        "mlp_ratio": ModelParam(float, 4.0, 0.25, 16),
        "dropout": _DROPOUT,
    },
}
# Built-in datasets (tuner.trial.data loads them).
DATA = ("digits", "synthetic", "synthetic_images")
# Optimizers by name (tuner.trial.optim builds them).
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")


def model_param(model: str, name: str) -> Union[int, float]:
    """A built-in model's size `name` as its default (for the trial's builders)."""
    return MODELS[model][name].default


def check_importable(spec: str, call: Optional[tuple[str, ...]] = None) -> None:
    """Refuse a 'package.module:function' that cannot be found, without importing torch.

    The module is located (its parent packages are imported, as Python must) and its source
    scanned for a top-level definition of the name; the module itself runs only in trials.
    `call`: the arguments it is called with (names, for the message); a function defined in
    the source that cannot take them, or a name bound to a plain value, is refused too.
    """
    module, _, attr = spec.partition(":")
    if not module or not attr.isidentifier():
        raise ValueError(f"'{spec}' is not of the form package.module:function")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:
        raise ValueError(f"cannot import module '{module}' ({err})") from None
    if found is None:
        raise ValueError(f"cannot import module '{module}' (not found from {Path.cwd()})")
    origin = found.origin
    if origin and origin.endswith(".py"):
        try:
            tree = ast.parse(Path(origin).read_text(), filename=origin)
        except SyntaxError as err:
            raise ValueError(f"cannot import module '{module}' (line {err.lineno}: {err.msg})") from None
        defined = _top_level(tree)
        if attr not in defined:
            raise ValueError(f"module '{module}' has no function '{attr}'")
        if call is not None:
            _check_call(defined[attr], attr, call)


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    """Names the module binds at the top, each to the statement that binds it last."""
    names: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return names


_VALUES = (ast.Constant, ast.List, ast.Dict, ast.Tuple, ast.Set, ast.JoinedStr)


def _check_call(node: ast.stmt, attr: str, call: tuple[str, ...]) -> None:
    """Refuse what the source shows cannot be called with `call`'s arguments (positionally).
    Anything else (a class, an import, a decorated or assigned function) is taken on trust:
    the trial checks it again when it imports it."""
    shape = f"{attr}({', '.join(call)})"
    value = getattr(node, "value", None)
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, _VALUES):
        raise ValueError(f"'{attr}' is a {type(value).__name__.lower()} value, not a function")
    if isinstance(node, ast.AsyncFunctionDef):
        raise ValueError(f"'{attr}' is an async function; it is called as {shape}")
    if not isinstance(node, ast.FunctionDef) or node.decorator_list:
        return
    a = node.args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    keyword_only = any(d is None for d in a.kw_defaults)
    if keyword_only or required > len(call) or (positional < len(call) and a.vararg is None):
        raise ValueError(f"'{attr}({ast.unparse(a)})' cannot be called as {shape}")
