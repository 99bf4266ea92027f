"""The two registries (tuner.config.algorithms, tuner.config.schedulers) and the contract every
search algorithm x scheduler pair keeps.

A pair the records allow is run through the same checks; a pair they refuse is refused at
validate in one line, exit 2, naming the field that chose it. A new algorithm or scheduler
joins every test here by its entry alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEBUG, SPACES, cli
from tuner.config import ConfigError, load_sweep
from tuner.config.algorithms import ALGORITHMS
from tuner.config.schedulers import SCHEDULERS

PAIRS = [(a, s) for a in ALGORITHMS for s in SCHEDULERS]
ALLOWED = [(a, s) for a, s in PAIRS if s in ALGORITHMS[a].schedulers]
REFUSED = [(a, s) for a, s in PAIRS if s not in ALGORITHMS[a].schedulers]


def _cfg(algorithm: str, scheduler: str | None = None, **over: Any):
    sets = {"search.algorithm": algorithm, **over}
    if scheduler is not None:
        sets["schedule.scheduler"] = scheduler
    return load_sweep(DEBUG, sets)


# ----------------------------------------------------------------------------- choosing


def _before_the_registry(cfg: Any) -> str:
    """The scheduler a sweep file got before schedule.scheduler existed (plan.SearchRequest's
    stop_early of commit 987d278): an independent answer for the defaults."""
    wanted = cfg.schedule.early_stopping
    on = wanted is True if cfg.search.algorithm == "grid" else wanted is not False
    return "asha" if on and len(cfg.objectives) < 2 else "fifo"


@pytest.mark.parametrize("path", sorted(SPACES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_file_keeps_the_scheduler_it_had(path: Path) -> None:
    for algorithm in ALGORITHMS:
        try:
            cfg = load_sweep(path, {"search.algorithm": algorithm})
        except ConfigError:
            continue  # (a parameter kind or several objectives the algorithm refuses)
        if algorithm in ("grid", "random", "bohb", "optuna"):
            assert cfg.scheduler.name == _before_the_registry(cfg), (path.name, algorithm)
        for wanted in (True, False):
            try:
                cfg = load_sweep(path, {"search.algorithm": algorithm, "schedule.early_stopping": wanted})
            except ConfigError:
                continue
            assert cfg.scheduler.name == ("asha" if wanted else "fifo")


@pytest.mark.parametrize(("algorithm", "scheduler"), ALLOWED)
def test_an_allowed_pair_builds_its_scheduler(algorithm: str, scheduler: str) -> None:
    from tuner.search import algorithms

    cfg = _cfg(algorithm, scheduler)
    assert cfg.scheduler is SCHEDULERS[scheduler]
    plan = algorithms.build(
        cfg.search,
        cfg.schedule,
        cfg.hyperparameters(),
        cfg.objective,
        cfg.direction,
        objectives=cfg.objectives,
    )
    if SCHEDULERS[scheduler].builds is None:
        assert plan.scheduler is None
    else:
        assert plan.scheduler is not None and SCHEDULERS[scheduler].title in plan.description
        assert plan.scheduler._time_attr == "epoch"  # not training_iteration (resets on resume)


@pytest.mark.parametrize(("algorithm", "scheduler"), REFUSED)
def test_a_refused_pair_is_one_line_naming_the_field(algorithm: str, scheduler: str) -> None:
    out = cli("validate", str(DEBUG), "--algorithm", algorithm, "--set", f"schedule.scheduler={scheduler}")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: schedule.scheduler: {algorithm} does not run with {scheduler}")


def test_an_unknown_scheduler_lists_the_valid_ones() -> None:
    out = cli("validate", str(DEBUG), "--set", "schedule.scheduler=pbt2000")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"(valid: {', '.join(SCHEDULERS)})" in out.stderr and "schedule.scheduler" in out.stderr


@pytest.mark.parametrize(("scheduler", "early_stopping"), [("fifo", True), ("asha", False)])
def test_early_stopping_that_contradicts_the_scheduler_is_refused(
    scheduler: str, early_stopping: bool
) -> None:
    with pytest.raises(ConfigError, match="schedule.early_stopping: .* contradicts schedule.scheduler"):
        _cfg("random", scheduler, **{"schedule.early_stopping": early_stopping})
    agrees = _cfg("random", scheduler, **{"schedule.early_stopping": not early_stopping})
    assert agrees.scheduler.name == scheduler


def test_several_objectives_refuse_a_scheduler_of_one_metric_naming_the_field_that_chose_it() -> None:
    two = {"metric": ["val_acc", "num_params"], "mode": ["max", "min"]}
    assert _cfg("random", **two).scheduler.name == "fifo"  # the default gives way
    with pytest.raises(ConfigError, match="^schedule.scheduler: ASHA ranks trials by one metric"):
        _cfg("random", "asha", **two)
    with pytest.raises(ConfigError, match="^schedule.early_stopping: ASHA ranks trials by one metric"):
        _cfg("random", **two, **{"schedule.early_stopping": True})
