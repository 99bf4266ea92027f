"""The built-in models, datasets and optimizers: names, parameters, defaults and bounds.

Torch-free and Ray-free: validation (tuner.config) and the trial (tuner.trial.loop.models, data,
optim) both read it, so adding a built-in is one entry here plus its builder in the trial.
A user model or dataset is named 'package.module:function' instead;
`tuner.config.functions.check_function` finds it without running it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class ModelParam:
    """A size a built-in model reads from the trial's configuration."""

    kind: type  # int or float
    default: Union[int, float]
    low: float
    high: float


_DROPOUT = ModelParam(float, 0.0, 0, 0.99)

# name -> the parameters it reads (tuner.trial.loop.models builds it).
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
# Built-in datasets (tuner.trial.loop.data loads them).
DATA = ("digits", "synthetic", "synthetic_images")
# Optimizers by name (tuner.trial.loop.optim builds them).
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")


def model_param(model: str, name: str) -> Union[int, float]:
    """A built-in model's size `name` as its default (for the trial's builders)."""
    return MODELS[model][name].default
