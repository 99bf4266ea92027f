"""Checks of `search.params` against what reads them (the training section and the built-in
models of the catalogue), of their `when:` conditions and of `search.constraints`."""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ValidationError

from tuner import catalogue
from tuner.config.algorithms import ALGORITHMS, Algorithm
from tuner.config.base import MAX_TRIALS
from tuner.errors import ConfigError, validation_message
from tuner.space import conditions
from tuner.space import constraints as rules
from tuner.space.params import (
    Fixed,
    LogUniform,
    ParamT,
    Scalar,
    Uniform,
    extremes,
    grid_values,
    values_of,
)


def check_param(name: str, param: ParamT, model: str, training: BaseModel) -> None:
    """Refuse a value of `search.params.<name>` that its training field or the built-in model
    would refuse (the whole range: both bounds, or every listed value)."""
    fields = type(training).model_fields
    path = f"search.params.{name}"
    if name in fields:
        default, set_here = fields[name].default, getattr(training, name)
        if conditions.conditions(param) and set_here != default:
            # An absent parameter is absent from the trial's configuration, which then runs
            # the built-in default: a value set under training: would silently not apply.
            raise ConfigError(
                f"training.{name}",
                f"is {set_here!r}, but search.params.{name} has a when: condition, and where it does "
                f"not hold a trial uses the default {default!r}; leave training.{name} unset",
            )
        for value in extremes(param):
            try:
                setattr(training.model_copy(), name, value)  # validate_assignment checks it
            except ValidationError as err:
                raise ConfigError(path, validation_message(err.errors()[0], value)) from None
        return
    known = catalogue.MODELS.get(model)
    if known is None:  # a user model reads whatever it likes
        return
    if name not in known:
        valid = sorted(set(known) | set(fields))
        raise ConfigError(path, f"not a parameter of model '{model}' or training (valid: {', '.join(valid)})")
    kind, low, high = known[name].kind, known[name].low, known[name].high
    for value in extremes(param):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"must be a number, got {value!r}")
        if kind is int and value != int(value):
            raise ConfigError(path, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(path, f"{value!r} is outside {low}..{high}")


# ----------------------------------------------------------------------------- when: and constraints


def check_search(
    params: dict[str, ParamT], constraints: list[str], algorithm: Algorithm, grid_points: int
) -> None:
    """The search section on its own: conditions, the syntax of constraints, the grid's size."""
    check_conditions(params, algorithm, grid_points)
    for i, text in enumerate(constraints):
        try:
            rules.parse(text)
        except ValueError as err:
            raise ConfigError(f"search.constraints.{i}", f"{text!r}: {err}") from None
    if algorithm.runs_grid:
        try:
            conditions.grid_configs(params, grid_points, limit=MAX_TRIALS)
        except conditions.TooLarge as err:
            raise ConfigError(
                "search.params",
                f"{err} is more than the {MAX_TRIALS:,} trials a sweep may run (fewer values, a "
                "smaller grid_points, or random search)",
            ) from None


def check_conditions(params: dict[str, ParamT], algorithm: Algorithm, grid_points: int) -> None:
    """Refuse a `when:` naming no parameter of search.params, a continuous one, a value its
    parameter never takes (in grid search: not among the grid's values), a cycle, or one that
    holds in no configuration (a chain that contradicts itself)."""
    found = conditions.cycle(params)
    if found:
        raise ConfigError(f"search.params.{found[0]}.when", f"conditions form a cycle: {' -> '.join(found)}")
    for name, param in params.items():
        for parent, wanted in conditions.conditions(param).items():
            path = f"search.params.{name}.when.{parent}"
            if parent not in params:
                valid = ", ".join(n for n in params if n != name) or "none"
                raise ConfigError(path, f"no parameter '{parent}' in search.params (there: {valid})")
            other = params[parent]
            if isinstance(other, (Uniform, LogUniform)):
                raise ConfigError(
                    path,
                    f"'{parent}' is a continuous {other.kind} parameter; a condition "
                    "needs a choice, grid, integer range or fixed value",
                )
            for value in wanted:
                if not _can_take(other, value, algorithm, grid_points):
                    raise ConfigError(path, f"'{parent}' never takes the value {value!r}{_its_values(other)}")
    for name in conditions.never_apply(params):
        raise ConfigError(
            f"search.params.{name}.when",
            "holds in no configuration (the conditions it chains through contradict each other)",
        )


def _can_take(p: ParamT, value: Scalar, algorithm: Algorithm, grid_points: int) -> bool:
    listed = grid_values(p, grid_points) if algorithm.runs_grid else values_of(p)
    if listed is not None:
        return any(conditions.same(value, v) for v in listed)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        return False
    return p.low <= value <= p.high  # type: ignore[union-attr]


def _its_values(p: ParamT) -> str:
    listed = values_of(p)
    if listed is not None:
        return f" (its values: {', '.join(map(str, listed))})"
    return f" (an integer in {p.low}..{p.high})"  # type: ignore[union-attr]


DRAWS = 1000  # random configurations validation tries against the constraints


def check_constraints(search: Any, hyper: dict[str, ParamT]) -> None:
    """Refuse a constraint reading a name that is no parameter or no number, and constraints
    that leave no configuration: none in the grid, or none in DRAWS random draws."""
    texts, algorithm, grid_points = search.constraints, ALGORITHMS[search.algorithm], search.grid_points
    for i, text in enumerate(texts):
        for name in sorted(rules.parse(text).names):
            if name not in hyper:
                raise ConfigError(f"search.constraints.{i}", f"{text!r}: '{name}' is not a parameter")
            for value in extremes(hyper[name]):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(
                        f"search.constraints.{i}", f"{text!r}: '{name}' takes {value!r}, not a number"
                    )
    if not texts:
        return
    if algorithm.runs_grid:
        if not conditions.grid_configs(hyper, grid_points, texts):
            raise ConfigError(
                "search.constraints",
                "the constraints leave no configuration (no combination of the grid keeps them all)",
            )
    elif conditions.feasible_draw(hyper, texts, random.Random(search.seed), DRAWS) is None:
        raise ConfigError(
            "search.constraints",
            f"the constraints leave no configuration ({DRAWS:,} random draws broke them all)",
        )


def check_start_with(search: Any, hyper: dict[str, ParamT]) -> None:
    """Refuse a start_with configuration naming no searched parameter, a value outside its
    parameter, a conditional parameter without the values that make it apply, or one that no
    completion from the space keeps search.constraints (DRAWS random completions tried); and
    more of them than num_samples (grid search runs them before its grid)."""
    entries = search.start_with
    if not ALGORITHMS[search.algorithm].runs_grid and len(entries) > search.num_samples:
        more = f"{len(entries)} configurations, more than num_samples ({search.num_samples})"
        raise ConfigError("search.start_with", more)
    for i, entry in enumerate(entries):
        for name, value in entry.items():
            path = f"search.start_with.{i}.{name}"
            if name not in search.params:
                valid = ", ".join(search.params) or "none"
                raise ConfigError(path, f"no parameter '{name}' in search.params (there: {valid})")
            reason = conditions.outside(search.params[name], value)
            if reason:
                raise ConfigError(path, f"{value!r} {reason}")
            for parent, wanted in conditions.conditions(search.params[name]).items():
                fixed = hyper.get(parent)
                have = entry.get(parent, fixed.value if isinstance(fixed, Fixed) else None)
                if have is None or not any(conditions.same(have, w) for w in wanted):
                    values = " or ".join(map(str, wanted))
                    raise ConfigError(
                        path, f"applies only where {parent} is {values}; give {parent}: {wanted[0]} with it"
                    )
        done = conditions.feasible_draw(hyper, search.constraints, random.Random(search.seed), DRAWS, entry)
        if done is None:
            raise ConfigError(
                f"search.start_with.{i}",
                f"no configuration with these values keeps search.constraints ({DRAWS:,} completions tried)",
            )
