"""The trial's training settings, read once at entry through the sweep file's own model.

A trial's configuration is a flat dict (searched and fixed values, model sizes, the user's own
keys). Its training settings are `TrainingSection`'s fields: `Settings.of` takes them out once and
validates them with `TrainingSection` itself (its types, defaults and checks: nothing is restated
here), so the loop and the optimizer read typed attributes, never `hp.get(key, default)`. The
sweep file was validated before the sweep started; this is the trial's frozen view of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict

from tuner.config.sections import TrainingSection

# "0 or unset" means off for these: no clipping, no cap on the micro-batch (the whole per-worker
# batch). A searched choice may hand out 0, which the sweep file's field (> 0) would refuse.
_ZERO_IS_UNSET = ("grad_clip", "micro_batch")


class Settings(TrainingSection):
    """TrainingSection's fields as one trial runs them (see tuner.config for their meaning)."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls, hp: Mapping[str, Any]) -> Settings:
        """The settings of a trial's configuration `hp` (TrainingSection's defaults for the rest)."""
        values = {}
        for name in TrainingSection.model_fields:
            if name in hp:
                raw = hp[name]
                values[name] = raw.item() if hasattr(raw, "item") else raw  # numpy scalars
        for name in _ZERO_IS_UNSET:
            values[name] = values.get(name) or None
        return cls.model_validate(values)
