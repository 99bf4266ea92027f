"""What every section of the sweep file shares: strict fields, no bools for numbers, and the
limits a sweep must stay within."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

# Metrics whose direction tuner knows: `metric` may name any value a trial reports, but one
# not listed here needs `direction`. Tuner's own loop reports the first four every epoch
# (num_params: the model's trainable parameters, for "accuracy against size" objectives).
OBJECTIVES = {
    "val_acc": "max",
    "val_loss": "min",
    "train_loss": "min",
    "num_params": "min",
    "val_mse": "min",
    "val_rmse": "min",
    "val_mae": "min",
}
# Most trials one sweep may plan: the driver lists grid and random configurations up front
# (a 10^11-point grid took 4 GB before its first trial), and no sweep here needs more.
MAX_TRIALS = 10_000
# Seeds reach numpy's RandomState (searchers) and torch: both take 0..2**32-1 in common.
MAX_SEED = 2**32 - 1


class Section(BaseModel):
    """A section of the sweep file: unknown keys refused, assignments validated."""

    # validate_default: a float field's int default (warmup_epochs: 0) is 0.0 from the start,
    # as it is once sweep.yaml is read back; allow_inf_nan: `lr: .inf` is no learning rate.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1: `num_samples: true` is a mistake, not one trial.
        if (
            isinstance(value, bool)
            and info.field_name
            and _numeric_only(cls.model_fields[info.field_name].annotation)
        ):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


def _numeric_only(annotation: Any) -> bool:
    """A field that takes numbers and no bool (int, float, Optional[float], "auto" or float)."""
    kinds = get_args(annotation) or (annotation,)
    return bool({int, float} & set(kinds)) and bool not in kinds


def one_of(value: str, valid: Iterable[str], what: str) -> str:
    """`value` if it is one of `valid`, else a ValueError listing them."""
    valid = list(valid)
    if value not in valid:
        raise ValueError(f"unknown {what} '{value}' (valid: {', '.join(valid)})")
    return value
