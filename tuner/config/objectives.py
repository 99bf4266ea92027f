"""What a sweep optimises: one metric, or several objectives (`metric: [val_acc, num_params]`
with `mode: [max, min]`).

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
Mode = Literal["max", "min"]
MetricField = Union[MetricName, Annotated[list[MetricName], Field(min_length=1)]]
ModeField = Union[Mode, Annotated[list[Mode], Field(min_length=1)], None]


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


def mode_shape(value: Any) -> Any:
    """`mode` as written: max, min, a list of them, or nothing (ValueError if not)."""
    for m in value if isinstance(value, list) else [value]:
        if m not in ("max", "min", None) or (m is None and isinstance(value, list)):
            raise ValueError(
                f"{m!r} is no mode: max or min" + (" for each metric" if isinstance(value, list) else "")
            )
    return value


def directions(metric: Union[str, list[str]], mode: Optional[Union[str, list[str]]]) -> list[str]:
    """The mode of each objective, in order: the ones given, else the known metrics' own;
    a ConfigError (field `mode`) for a missing, extra or contrary one."""
    names = metric if isinstance(metric, list) else [metric]
    if isinstance(mode, list) and not isinstance(metric, list):
        raise ConfigError(
            "mode", "a list of modes goes with a list of metrics (metric: [a, b], mode: [max, min])"
        )
    if isinstance(metric, list) and mode is not None and not isinstance(mode, list):
        raise ConfigError("mode", f"one mode per metric, as a list in the same order ({len(names)} metrics)")
    modes: list[Optional[str]] = list(mode) if isinstance(mode, list) else [mode] * len(names)
    if len(modes) != len(names):
        raise ConfigError(
            "mode", f"{len(modes)} mode(s) for {len(names)} metrics: one per metric, in the same order"
        )
    out = []
    for name, given in zip(names, modes, strict=True):
        natural = OBJECTIVES.get(name)
        if given is None and natural is None:
            raise ConfigError(
                "mode",
                f"required for metric '{name}' (max or min): tuner knows the direction of "
                f"{', '.join(OBJECTIVES)} only",
            )
        if given is not None and natural is not None and given != natural:
            raise ConfigError("mode", f"{name} is to be {natural}imised, not {given}")
        out.append(str(given or natural))
    return out


def pairs(metric: Union[str, list[str]], mode: Optional[Union[str, list[str]]]) -> list[tuple[str, str]]:
    """(metric, mode) of each objective of a validated config, the first first."""
    names = metric if isinstance(metric, list) else [metric]
    modes = mode if isinstance(mode, list) else [mode]
    return [(n, str(m)) for n, m in zip(names, modes, strict=True)]


def check_several(count: int, algorithm: Algorithm) -> None:
    """Refuse an algorithm that ranks trials by one number when there are several objectives
    (the scheduler's own refusal: tuner.config.schedulers.check_pair)."""
    if count > 1 and not algorithm.several_objectives:
        raise ConfigError("search.algorithm", algorithm.one_objective)
