"""A finished sweep with every kind of ending, shared by the report and board tests.

Grid search over lr x width (10 trials, ASHA on) of a user model that refuses one
configuration: trials that complete, trials stopped early, two that diverge (lr 1e8 with
SGD) and one that crashes (ValueError in the model builder, so Tune marks it ERROR).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import debug_config

MODEL_MODULE = "report_boom_model"  # a name no other test uses: reused actors cache imports
CRASH = {"lr": 0.003, "width": 24}
DIVERGING_LR = 1.0e8
MODEL_SOURCE = f"""
import math

from torch import nn


def build(config, input_shape, num_classes):
    if config["lr"] == {CRASH["lr"]} and config["width"] == {CRASH["width"]}:
        raise ValueError("boom: this configuration is refused on purpose")
    width = int(config["width"])
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(), nn.Linear(width, num_classes)
    )
"""
PARAMS = {
    "lr": {"type": "grid", "values": [CRASH["lr"], 0.01, 0.03, 0.1, DIVERGING_LR]},
    "width": {"type": "grid", "values": [8, CRASH["width"]]},
    "optimizer": "sgd",
}

_made: dict[str, Any] = {}


def failing_sweep(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run the sweep once per test session (the first caller pays); returns its SweepOutcome."""
    if "outcome" not in _made:
        from tuner.driver.sweep import run_sweep

        root = tmp_path_factory.mktemp("failing")
        (root / f"{MODEL_MODULE}.py").write_text(MODEL_SOURCE)
        # User modules are found from the directory the sweep starts in (`python -m` puts it
        # on sys.path; in-process, we do).
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            mp.syspath_prepend(str(root))
            cfg = debug_config(
                root,
                name="failing",
                task__model=f"{MODEL_MODULE}:build",
                search__algorithm="grid",
                search__params=PARAMS,
                schedule__early_stopping=True,
            )
            _made["outcome"] = run_sweep(cfg)
        _made["root"] = root
    return _made["outcome"]


def sweep_root() -> Path:
    """The directory the shared sweep was started in (where its model module lives)."""
    return _made["root"]
