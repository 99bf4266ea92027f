"""Neutral parameters: every type converts to Tune and ConfigSpace and samples stay in bounds."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from tests.conftest import contains
from tuner.space.params import (
    Choice,
    Fixed,
    Grid,
    LogRandInt,
    LogUniform,
    RandInt,
    Uniform,
    allows,
    grid_size,
    grid_values,
    to_configspace,
    to_tune,
)

PARAMS = {
    "uniform": Uniform(type="uniform", low=-1.0, high=2.0),
    "loguniform": LogUniform(type="loguniform", low=1e-4, high=1e-1),
    "randint": RandInt(type="randint", low=1, high=3),
    "lograndint": LogRandInt(type="lograndint", low=32, high=512),
    "choice": Choice(type="choice", values=["sgd", "adam", 3]),
}


@pytest.mark.parametrize("kind", list(PARAMS))
def test_tune_domain_samples_stay_in_bounds(kind: str) -> None:
    p = PARAMS[kind]
    domain = to_tune(p)
    rng = np.random.default_rng(0)
    draws = [domain.sample(random_state=rng) for _ in range(400)]
    assert all(contains(p, d if not isinstance(d, np.generic) else d.item()) for d in draws)
    if kind == "randint":  # inclusive bounds: both ends are drawn
        assert set(draws) == {1, 2, 3}
    if kind == "lograndint":
        assert min(draws) < 40 and max(draws) > 400  # log-spread: both ends reached


@pytest.mark.parametrize("kind", list(PARAMS))
def test_configspace_samples_stay_in_bounds(kind: str) -> None:
    p = PARAMS[kind]
    cs = to_configspace({kind: p}, seed=0)
    draws = [cfg[kind] for cfg in cs.sample_configuration(400)]
    draws = [d.item() if isinstance(d, np.generic) else d for d in draws]
    if kind == "choice":
        assert set(map(str, draws)) == {"sgd", "adam", "3"}
    else:
        assert all(contains(p, d) for d in draws)
    if kind == "randint":
        assert set(draws) == {1, 2, 3}


def test_configspace_refuses_grid_and_skips_fixed() -> None:
    with pytest.raises(ValueError, match="search.params.g"):
        to_configspace({"g": Grid(type="grid", values=[1, 2])})
    assert set(to_configspace({"f": Fixed(value=3), **PARAMS}).keys()) == set(PARAMS)


def test_fixed_and_grid_to_tune() -> None:
    assert to_tune(Fixed(value=0.9)) == 0.9
    assert to_tune(Grid(type="grid", values=[1, 2])) == {"grid_search": [1, 2]}


def test_grid_values() -> None:
    lr = grid_values(PARAMS["loguniform"], 3)
    assert lr[0] == pytest.approx(1e-4) and lr[-1] == pytest.approx(1e-1)
    assert lr[1] == pytest.approx(math.sqrt(1e-4 * 1e-1), rel=1e-5)  # log-midpoint
    assert grid_values(PARAMS["randint"], 3) == [1, 2, 3]  # small int range: every value
    assert grid_values(PARAMS["lograndint"], 3) == [32, 128, 512]
    assert grid_values(PARAMS["uniform"], 1) == [0.5]
    assert grid_values(PARAMS["choice"], 3) == ["sgd", "adam", 3]
    assert grid_size(PARAMS, 3) == 3 * 3 * 3 * 3 * 3


def test_contains_rejects_out_of_range() -> None:
    assert not contains(PARAMS["randint"], 4)
    assert not contains(PARAMS["randint"], 2.0)
    assert not contains(PARAMS["loguniform"], 0.5)
    assert not contains(PARAMS["choice"], "adamw")
    assert contains(PARAMS["uniform"], random.uniform(-1, 2))


@pytest.mark.parametrize(
    "p, inside, outside",
    [
        (LogUniform(type="loguniform", low=1e-3, high=1e-1), [1e-3, 0.05, 0.1], [0.5, 1e-4, True, "0.01"]),
        (RandInt(type="randint", low=8, high=32), [8, 20, 32], [7, 33, 20.0, True]),
        (Choice(type="choice", values=["sgd", "adam"]), ["sgd", "adam"], ["adamw", 1]),
        (Choice(type="choice", values=[1, 2]), [1, 2], [True, 1.5, 3]),
    ],
)
def test_allows_says_which_values_a_parameter_can_take(p: Any, inside: list, outside: list) -> None:
    # (what a resumed or extended sweep checks its earlier trials against, issue 26)
    assert all(allows(p, v) for v in inside) and not any(allows(p, v) for v in outside)
