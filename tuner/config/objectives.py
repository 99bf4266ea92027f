"""What a sweep optimises: one metric, or several objectives (`metric: [val_acc, num_params]`
with `direction: [max, min]`).

With several objectives the sweep looks for the Pareto front (tuner.results.pareto); the first
objective is the one everything that needs a single number uses: `best`, the ranking, Ray
Tune's own metric, `schedule.stop_at`. An algorithm or a scheduler that ranks trials by one
number (BOHB, ASHA) would stop or drop exactly the trials that trade the first objective for
the others: their records say so (tuner.config.algorithms, tuner.config.schedulers), they are
refused with several objectives, and early stopping defaults to off.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, StringConstraints

from tuner.config.algorithms import Algorithm
from tuner.config.base import OBJECTIVES
from tuner.errors import ConfigError

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]*$"
MetricName = Annotated[str, StringConstraints(pattern=NAME_PATTERN, max_length=200)]
Direction = Literal["max", "min"]
MetricField = Union[MetricName, Annotated[list[MetricName], Field(min_length=1)]]
DirectionField = Union[Direction, Annotated[list[Direction], Field(min_length=1)], None]
# `mode` is how sweep files written before `direction` spell it; they keep validating.
OLDER_SPELLING = "mode"


def metric_shape(value: Any) -> Any:
    """`metric` as written: a name, or a non-empty list of distinct names (ValueError if not)."""
    names = value if isinstance(value, list) else [value]
    if not names:
        raise ValueError("an empty list names no objective")
    for name in names:
        if not isinstance(name, str) or not re.match(NAME_PATTERN, name) or len(name) > 200:
            raise ValueError(f"{name!r} is not a metric name (letters, digits, _ . / -)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"'{twice[0]}' is listed twice")
    return value


def direction_shape(value: Any) -> Any:
    """`direction` as written: max, min, a list of them, or nothing (ValueError if not)."""
    for d in value if isinstance(value, list) else [value]:
        if d not in ("max", "min", None) or (d is None and isinstance(value, list)):
            raise ValueError(
                f"{d!r} is no direction: max or min" + (" for each metric" if isinstance(value, list) else "")
            )
    return value


def older_spelling(raw: Any) -> Any:
    """A sweep file's `mode:` read as `direction:` (its older spelling, which files written
    before keep); a ConfigError (field `direction`) when a file gives both (an empty one,
    the default, gives none)."""
    if not isinstance(raw, dict) or OLDER_SPELLING not in raw:
        return raw
    if raw.get("direction") is not None and raw[OLDER_SPELLING] is not None:
        raise ConfigError(
            "direction",
            f"given twice, as direction and as {OLDER_SPELLING} (its older spelling): keep direction",
        )
    raw = dict(raw)
    older = raw.pop(OLDER_SPELLING)
    raw["direction"] = older if raw.get("direction") is None else raw["direction"]
    return raw


def directions(metric: Union[str, list[str]], direction: Optional[Union[str, list[str]]]) -> list[str]:
    """The direction of each objective, in order: the ones given, else the known metrics' own;
    a ConfigError (field `direction`) for a missing, extra or contrary one."""
    names = metric if isinstance(metric, list) else [metric]
    if isinstance(direction, list) and not isinstance(metric, list):
        raise ConfigError(
            "direction",
            "a list of directions goes with a list of metrics (metric: [a, b], direction: [max, min])",
        )
    if isinstance(metric, list) and direction is not None and not isinstance(direction, list):
        raise ConfigError(
            "direction", f"one direction per metric, as a list in the same order ({len(names)} metrics)"
        )
    given_each: list[Optional[str]] = (
        list(direction) if isinstance(direction, list) else [direction] * len(names)
    )
    if len(given_each) != len(names):
        raise ConfigError(
            "direction",
            f"{len(given_each)} direction(s) for {len(names)} metrics: one per metric, in the same order",
        )
    out = []
    for name, given in zip(names, given_each, strict=True):
        natural = OBJECTIVES.get(name)
        if given is None and natural is None:
            raise ConfigError(
                "direction",
                f"required for metric '{name}' (max or min): tuner knows the direction of "
                f"{', '.join(OBJECTIVES)} only",
            )
        if given is not None and natural is not None and given != natural:
            raise ConfigError("direction", f"{name} is to be {natural}imised, not {given}")
        out.append(str(given or natural))
    return out


def pairs(metric: Union[str, list[str]], direction: Optional[Union[str, list[str]]]) -> list[tuple[str, str]]:
    """(metric, direction) of each objective of a validated config, the first first."""
    names = metric if isinstance(metric, list) else [metric]
    each = direction if isinstance(direction, list) else [direction]
    return [(n, str(d)) for n, d in zip(names, each, strict=True)]


def check_several(count: int, algorithm: Algorithm) -> None:
    """Refuse an algorithm that ranks trials by one number when there are several objectives
    (the scheduler's own refusal: tuner.config.schedulers.check_pair)."""
    if count > 1 and not algorithm.several_objectives:
        raise ConfigError("search.algorithm", algorithm.one_objective)
