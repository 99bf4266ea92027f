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
from typing import Union


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


def check_importable(spec: str) -> None:
    """Refuse a 'package.module:function' that cannot be found, without importing torch.

    The module is located (its parent packages are imported, as Python must) and its source
    scanned for a top-level definition of the name; the module itself runs only in trials.
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
        tree = ast.parse(Path(origin).read_text(), filename=origin)
        if attr not in _top_level_names(tree):
            raise ValueError(f"module '{module}' has no function '{attr}'")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names
