"""A user's own loop (`task.train: tests.scripted:train`) that reports values written down in
advance, so a test knows each trial's best and how it ends without training anything.

`config["curve"]` names one of CURVES: its val_acc epoch by epoch; "boom" raises a ValueError
at that epoch (before it, when first), NaN diverges. `config["pause_s"]` sleeps before each
epoch (trials then end in a known order). Each epoch keeps a checkpoint (a state of its own:
the loop has no model), so a resumed trial goes on from its last epoch.
"""

from __future__ import annotations

import math
import time
from typing import Any

NAN = math.nan
CURVES: dict[str, list[Any]] = {
    "peaks": [0.6, 0.9, 0.7, 0.65],  # its last epoch is worse than its best (epoch 2)
    "rises": [0.5, 0.6, 0.7, 0.8],
    "fails": [0.7, 0.75, "boom"],  # an error at epoch 3: its first two epochs count
    "diverges": [0.55, NAN],  # diverged at epoch 2
    "crashes": ["boom"],  # an error before its first epoch: no value at all
}


def best(curve: str) -> tuple[float, int] | None:
    """(the best val_acc, its epoch) of a curve, worked out here, not by tuner."""
    values = [(v, e) for e, v in enumerate(CURVES[curve], 1) if isinstance(v, float) and not math.isnan(v)]
    return max(values, key=lambda ve: (ve[0], -ve[1])) if values else None


def train(config: dict[str, Any], ctx: Any) -> None:
    values = CURVES[config["curve"]]
    for epoch in range(ctx.epoch, min(ctx.max_epochs, len(values))):
        time.sleep(float(config.get("pause_s", 0.0)))
        v = values[epoch]
        if v == "boom":
            raise ValueError(f"boom: {config['curve']} fails at epoch {epoch + 1} on purpose")
        ctx.report({"val_acc": v, "val_loss": 1.0 - v}, state={"curve": config["curve"]})
