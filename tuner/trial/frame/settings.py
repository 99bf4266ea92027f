"""The trial's training settings, read once at entry into a typed object.

A trial's configuration is a flat dict (searched and fixed values, model sizes, the user's own
keys). Its training settings are `TrainingSection`'s fields: `Settings.of` takes them out once,
with `TrainingSection`'s defaults for those it lacks (no default is restated here) and each as
its field's type, so the loop and the optimizer read attributes, never `hp.get(key, default)`.
The sweep file was validated before the sweep started; this is the trial's typed view of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Optional

from tuner.config.sections import TrainingSection, amp_from_yaml


@dataclass(frozen=True)
class Settings:
    """TrainingSection's fields as one trial runs them (see tuner.config for their meaning)."""

    batch_size: int
    micro_batch: Optional[int]
    min_micro_batch: int
    amp: str
    eval_precision: str
    lr: float
    optimizer: str
    momentum: float
    weight_decay: Optional[float]
    lr_schedule: str
    warmup_epochs: float
    grad_clip: Optional[float]
    eval_batch_size: int
    seed: int
    loader_workers: int
    prefetch: bool
    channels_last: bool
    compile: bool
    find_batch_size: bool
    tf32: bool
    threads: Optional[int]
    autotune: int

    @classmethod
    def of(cls, hp: Mapping[str, Any]) -> Settings:
        """The settings of a trial's configuration `hp` (TrainingSection's defaults for the rest)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = hp.get(f.name, TrainingSection.model_fields[f.name].default)
            values[f.name] = _as(f.type, raw.item() if hasattr(raw, "item") else raw)
        values["amp"] = str(amp_from_yaml(hp.get("amp", values["amp"])))
        # 0 or unset: no clipping, no cap (the whole per-worker batch)
        values["grad_clip"] = values["grad_clip"] or None
        values["micro_batch"] = values["micro_batch"] or None
        return cls(**values)


assert [f.name for f in fields(Settings)] == list(TrainingSection.model_fields), (
    "Settings lags TrainingSection"
)

_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _as(annotation: Any, value: Any) -> Any:
    optional = str(annotation).startswith("Optional[")
    if value is None and optional:
        return None
    kind = str(annotation).removeprefix("Optional[").removesuffix("]")
    return _TYPES[kind](value)
