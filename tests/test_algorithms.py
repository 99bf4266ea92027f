"""Contract suite over the algorithm registry: the same checks for every search algorithm.

Each builds from the debug sweep, suggests configurations inside the space, survives
non-finite results, pickles its state and restores to the same next suggestion, and the
same seed gives the same first suggestions.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest

from tests.conftest import DEBUG, ROOT, contains
from tuner.config import load_sweep
from tuner.config.schedulers import SCHEDULERS
from tuner.search import algorithms
from tuner.space.params import KINDS, Fixed, Grid, LogUniform

ALGOS = list(algorithms.ALGORITHMS)
LISTED = ("grid", "random")  # a fixed list of configurations, drawn up front
MODELS = [a for a in ALGOS if a not in LISTED]  # learn from results


def _plan(name: str, seed: int = 0, **over: Any) -> tuple[Any, Any]:
    cfg = load_sweep(DEBUG, {"search.algorithm": name, "search.seed": seed, **over})
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction
    )
    return cfg, plan


def _configs(name: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """n configurations the algorithm would run (the search space resolved, no cluster)."""
    cfg, plan = _plan(name, seed, **({"search.num_samples": n} if name == "random" else {}))
    if name in LISTED:  # the exact list of trials, fixed up front
        assert plan.num_samples == len(plan.points)
        return plan.points
    searcher = plan.search_alg
    out = []
    for i in range(n):
        suggestion = searcher.suggest(f"t{i}")
        out.append({**plan.param_space, **suggestion})
        searcher.on_trial_complete(f"t{i}", {cfg.metric: 0.5 + 0.01 * i, "epoch": 1})
    return out


def test_every_record_names_what_exists() -> None:
    for a in algorithms.ALGORITHMS.values():
        assert callable(a.builder()) and a.kinds <= set(KINDS)
        assert a.default_scheduler in a.schedulers and set(a.schedulers) <= set(SCHEDULERS), a.name
    for s in SCHEDULERS.values():
        assert s.stops_early or s.builds is None or s.clones or s.pauses, s.name


@pytest.mark.parametrize("name", ALGOS)
def test_builds_with_scheduler_on_epochs(name: str) -> None:
    cfg, plan = _plan(name)
    from ray.tune.schedulers import AsyncHyperBandScheduler

    assert cfg.scheduler.name == algorithms.ALGORITHMS[name].default_scheduler
    assert (plan.scheduler is None) == (cfg.scheduler.name == "fifo")
    assert plan.scheduler is None or isinstance(plan.scheduler, AsyncHyperBandScheduler)
    if plan.scheduler is not None:
        assert plan.scheduler._time_attr == "epoch"  # not training_iteration (resets on resume)
    assert plan.num_samples == (3 * 2 * 3 if name == "grid" else cfg.search.num_samples)


@pytest.mark.parametrize("name", ALGOS)
def test_suggestions_stay_in_bounds(name: str) -> None:
    cfg = load_sweep(DEBUG)
    params = cfg.hyperparameters()
    configs = _configs(name, 12)
    assert configs
    if name == "grid":
        assert len(configs) == 3 * 2 * 3  # lr 3 points x 2 optimizers x width 3 points
    for c in configs:
        for k, p in params.items():
            v = c[k].item() if isinstance(c[k], np.generic) else c[k]
            if isinstance(p, Fixed):
                assert v == p.value
            elif name != "grid":
                assert contains(p, v), (k, v)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_model_based_searchers_survive_non_finite_results(name: str, value: float) -> None:
    _, plan = _plan(name)
    s = plan.search_alg
    for i in range(4):
        assert s.suggest(f"t{i}") is not None
        s.on_trial_complete(f"t{i}", {"val_acc": value if i % 2 else 0.8, "epoch": 3})
    assert s.suggest("after") is not None


@pytest.mark.parametrize("name", ALGOS)
def test_state_pickles_and_restores(name: str, tmp_path) -> None:
    _, plan = _plan(name)
    s = plan.search_alg
    if name in MODELS:
        for i in range(3):
            s.suggest(f"t{i}")
            s.on_trial_complete(f"t{i}", {"val_acc": 0.5 + i / 10, "epoch": 1})
    _, fresh = _plan(name)
    if name in LISTED:  # a SearchAlgorithm: Tune persists it with save_to_dir
        s.save_to_dir(str(tmp_path), session_str="t")
        assert os.listdir(tmp_path)
        fresh.search_alg.restore_from_dir(str(tmp_path))
        return
    path = os.path.join(tmp_path, "state.pkl")
    s.save(path)
    assert os.path.getsize(path) > 0
    fresh.search_alg.restore(path)
    assert fresh.search_alg.suggest("next") is not None


@pytest.mark.parametrize("name", [a for a in ALGOS if a != "grid"])
def test_same_seed_same_suggestions(name: str) -> None:
    a, b, c = _configs(name, 5, seed=1), _configs(name, 5, seed=1), _configs(name, 5, seed=2)
    assert a == b
    assert a != c


@pytest.mark.parametrize("name", ALGOS)
def test_resumed_plan_runs_exactly_what_is_left(name: str) -> None:
    """Given an earlier run, each algorithm plans the interrupted trials first, then only as
    many new ones as the budget has left, and model-based searchers learn the old results."""
    from tuner.search.algorithms import Prior, PriorTrial

    cfg, full = _plan(name, **({"search.num_samples": 6} if name != "grid" else {}))
    old = _configs(name, 3)
    history = [{"epoch": e, "val_acc": 0.5 + 0.1 * e} for e in (1, 2, 3)]
    prior = Prior(
        finished=[PriorTrial(old[0], history), PriorTrial(old[1], history[:1])],
        resumed=[old[2]],
        new=(full.num_samples if name != "grid" else len(full.points)) - 3,
    )
    p = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction, None, prior
    )
    total = full.num_samples if name != "grid" else len(full.points)
    assert p.num_samples == total - 2  # the resumed one + the rest
    if name in LISTED:
        assert p.points[0] == old[2]
        keys = [algorithms.key(c) for c in p.points]
        assert algorithms.key(old[0]) not in keys[1:] and algorithms.key(old[1]) not in keys[1:]
        return
    first = p.search_alg.suggest("r0")
    assert algorithms.key({**p.param_space, **first}) == algorithms.key(old[2])
    assert p.search_alg.suggest("n0") is not None  # then the rebuilt searcher
    if hasattr(p.search_alg.inner, "study"):  # optuna's samplers
        study = p.search_alg.inner.study
        assert len(study.trials) >= 2  # the two finished trials were told


def test_random_search_takes_a_grid_parameter_in_turn() -> None:
    params = {
        "width": Grid(type="grid", values=[32, 64, 128]),
        "lr": LogUniform(type="loguniform", low=1e-3, high=1e-1),
    }
    configs = algorithms.random_configs(params, 7, seed=0)
    assert [c["width"] for c in configs] == [32, 64, 128, 32, 64, 128, 32]
    assert all(isinstance(c["lr"], float) and 1e-3 <= c["lr"] <= 1e-1 for c in configs)
    assert configs == algorithms.random_configs(params, 7, seed=0)


def test_optuna_is_told_a_trial_asha_stopped_as_pruned_and_one_that_stopped_itself_as_complete() -> None:
    """A trial the scheduler stopped before max_epochs is PRUNED (TPE ranks it below every
    complete trial, by the epoch it reached): its epoch-1 value is not ranked against values at
    max_epochs. A trial whose own code ended it early (its early stopping) finished: COMPLETE
    with its last value, as a trial at max_epochs is (PRUNED, TPE would rank it below them all
    and GP, NSGA-II and CMA-ES would ignore it). Told as Tune tells them: the stopping result
    is new to the searcher; a trial whose function returned ends with the result it reported
    last, marked done. A resumed sweep's study is rebuilt the same way (the journal's last row
    says the trial stopped itself)."""
    from tuner.search.algorithms import Prior, PriorTrial
    from tuner.sweepdir import STOPPED_ITSELF

    cfg, plan = _plan("optuna")
    last = cfg.schedule.max_epochs
    assert last > 2
    short = [{"epoch": 1, "val_acc": 0.9}]
    full = [{"epoch": e, "val_acc": 0.5} for e in range(1, last + 1)]
    itself = [{"epoch": 1, "val_acc": 0.6}, {"epoch": 2, "val_acc": 0.7}]
    s = plan.search_alg
    configs = []
    for tid, history, told in (("short", short, -1), ("full", full, None), ("itself", itself, None)):
        configs.append(s.suggest(tid))
        for row in history[:told]:
            s.on_trial_result(tid, row)
        s.on_trial_complete(tid, {**history[-1], "done": True})
    live = [(t.state.name, t.value, t.intermediate_values) for t in s.inner.study.trials]
    assert live == [
        ("PRUNED", 0.9, {1: 0.9}),
        ("COMPLETE", 0.5, {e: 0.5 for e in range(1, last + 1)}),
        ("COMPLETE", 0.7, {1: 0.6, 2: 0.7}),
    ]
    journal = itself[:-1] + [{**itself[-1], STOPPED_ITSELF: True}]
    histories = (short, full, journal)
    prior = Prior(finished=[PriorTrial(c, h) for c, h in zip(configs, histories, strict=True)], new=2)
    resumed = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction, None, prior
    )
    again = [(t.state.name, t.value) for t in resumed.search_alg.inner.study.trials]
    assert again == [("PRUNED", 0.9), ("COMPLETE", 0.5), ("COMPLETE", 0.7)]


# ----------------------------------------------------------------------------- distributions

# Every parameter type, a conditional one on a choice and one on an integer range (which bohb's
# model keeps as an integer: its condition compares integers).
SPACE = {
    "lr": {"type": "loguniform", "low": 1e-4, "high": 3e-2},
    "dropout": {"type": "uniform", "low": 0.0, "high": 0.5},
    "optimizer": {"type": "choice", "values": ["sgd", "adam", "adamw"]},
    "depth": {"type": "randint", "low": 1, "high": 4},
    "heads": {"type": "lograndint", "low": 1, "high": 8},
    "width": {"type": "lograndint", "low": 16, "high": 256},
    "momentum": {"type": "uniform", "low": 0.8, "high": 0.99, "when": {"optimizer": "sgd"}},
    "blocks": {"type": "randint", "low": 1, "high": 3, "when": {"depth": [3, 4]}},
}
PROPOSALS = 1500
ALPHA = 1e-3  # seeded, so each verdict is fixed; a real departure gives p far below this


def _empty_history_proposals(name: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    from tuner.config import ScheduleSection, SearchSection

    search = SearchSection(algorithm=name, params=SPACE, num_samples=n, seed=seed)
    plan = algorithms.build(search, ScheduleSection(max_epochs=9), search.params, "val_loss", "min")
    if plan.points is not None:
        return plan.points
    return [plan.search_alg.suggest(f"t{i}") for i in range(n)]


def _log_int_pmf(low: int, high: int) -> dict[int, float]:
    """The space's lograndint: the integer part of a log-uniform draw from [low, high + 1)."""
    total = math.log((high + 1) / low)
    return {k: math.log((k + 1) / k) / total for k in range(low, high + 1)}


def _chi_square(values: list[Any], pmf: dict[Any, float], bins: int = 10) -> float:
    """p-value of the counts of `values` against `pmf`, neighbouring values pooled into at
    most `bins` cells of about equal probability (every expected count large)."""
    from collections import Counter

    from scipy import stats

    assert set(values) <= set(pmf), set(values) - set(pmf)
    counts = Counter(values)
    observed, expected, o, e = [], [], 0.0, 0.0
    for k, p in pmf.items():
        o, e = o + counts[k], e + p * len(values)
        if e >= len(values) / bins:
            observed.append(o)
            expected.append(e)
            o = e = 0.0
    if e:
        observed[-1] += o
        expected[-1] += e
    return float(stats.chisquare(observed, expected).pvalue)


# Thousands of proposals per searcher for the chi-square checks: 5-20 s for bohb and optuna on 2
# loaded cores (over the quick tier's 5 s); random's stay quick.
@pytest.mark.parametrize(
    "name", ["random", *(pytest.param(name, marks=pytest.mark.slow) for name in ("bohb", "optuna"))]
)
def test_proposals_from_an_empty_history_are_distributed_as_the_space_says(name: str) -> None:
    """1,500 proposals with nothing learnt yet, against each parameter's own distribution:
    log-uniform and uniform floats (Kolmogorov-Smirnov), a choice, an integer range and two
    log-integer ranges (chi-square), and two conditional parameters, present exactly where
    their condition holds and then distributed as their type says. Before issue 32, bohb drew
    a lograndint as ConfigSpace does (1..3: 1 in 46% of draws, not 50%) and optuna as optuna
    does (1..8: 1 in 39%, not 32%)."""
    from scipy import stats

    configs = _empty_history_proposals(name, PROPOSALS)
    assert len(configs) == PROPOSALS
    lr = [math.log(c["lr"]) for c in configs]
    log_span = math.log(3e-2 / 1e-4)
    p = {
        "lr": stats.kstest(lr, stats.uniform(math.log(1e-4), log_span).cdf).pvalue,
        "dropout": stats.kstest([c["dropout"] for c in configs], stats.uniform(0, 0.5).cdf).pvalue,
        "optimizer": _chi_square(
            [c["optimizer"] for c in configs], dict.fromkeys(["sgd", "adam", "adamw"], 1 / 3)
        ),
        "depth": _chi_square([c["depth"] for c in configs], dict.fromkeys(range(1, 5), 1 / 4)),
        "heads": _chi_square([c["heads"] for c in configs], _log_int_pmf(1, 8)),
        "width": _chi_square([c["width"] for c in configs], _log_int_pmf(16, 256)),
    }
    sgd = [c for c in configs if c["optimizer"] == "sgd"]
    deep = [c for c in configs if c["depth"] in (3, 4)]
    assert [("momentum" in c) for c in configs] == [c["optimizer"] == "sgd" for c in configs]
    assert [("blocks" in c) for c in configs] == [c["depth"] in (3, 4) for c in configs]
    p["momentum"] = stats.kstest([c["momentum"] for c in sgd], stats.uniform(0.8, 0.19).cdf).pvalue
    p["blocks"] = _chi_square([c["blocks"] for c in deep], dict.fromkeys(range(1, 4), 1 / 3))
    assert all(isinstance(c[k], int) for c in configs for k in ("depth", "heads", "width"))
    assert min(p.values()) > ALPHA, p


def test_the_chi_square_check_tells_the_libraries_log_integers_apart() -> None:
    """The check above can fail: draws the way optuna and ConfigSpace make a log-integer range
    on their own are refused, the space's own are not."""
    import numpy as np

    rng = np.random.default_rng(0)
    space_way = np.floor(np.exp(rng.uniform(0, math.log(9), PROPOSALS))).astype(int)
    optuna_way = np.rint(np.exp(rng.uniform(math.log(0.5), math.log(8.5), PROPOSALS))).astype(int)
    rounded = np.rint(np.exp(rng.uniform(0, math.log(8), PROPOSALS))).astype(int)  # ConfigSpace's model
    pmf = _log_int_pmf(1, 8)
    assert _chi_square(space_way.tolist(), pmf) > ALPHA
    assert _chi_square(optuna_way.tolist(), pmf) < ALPHA
    assert _chi_square(rounded.tolist(), pmf) < ALPHA


@pytest.mark.slow  # 400 simulated trials: 6-14 s
def test_cmaes_survives_a_conditional_parameter_every_first_trial_had() -> None:
    """optuna 5.0's CMA-ES takes into its space a parameter every complete trial had so far
    (`momentum`, while they were all sgd) and counts the trials ASHA stopped among its
    solutions: one of those without it failed an assertion in optuna's transform (`Parameter
    configuration must contain all distributions`; the search benchmark's conditional task,
    seed 3). tuner's keeps conditional parameters out of CMA-ES's space."""
    from benchmarks.tasks.conditional import loss
    from tuner.search.simulate import simulate

    cfg = load_sweep(
        ROOT / "benchmarks/tasks/conditional.yaml", {"search.algorithm": "cmaes", "search.seed": 3}
    )
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.objective, cfg.objective_direction
    )
    max_epochs = cfg.schedule.max_epochs
    trials = simulate(
        plan, 2000, max_epochs, loss, metric="val_loss", direction="min", epoch_budget=60 * max_epochs
    )
    assert len(trials) > 100
