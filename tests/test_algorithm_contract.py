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
# The pairs the simulated controller (tuner/search/simulate.py) drives: not yet those whose
# scheduler pauses trials or continues them from another's checkpoint (pbt, pb2 read and copy
# the trials' files: tests/test_population.py tests them).
SIMULATED = [(a, s) for a, s in ALLOWED if not SCHEDULERS[s].needs_checkpoints]


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
            early = "asha" if len(cfg.objectives) < 2 else "moasha"  # (several: Pareto fronts)
            assert cfg.scheduler.name == (early if wanted else "fifo")


@pytest.mark.parametrize(("algorithm", "scheduler"), ALLOWED)
def test_an_allowed_pair_builds_its_scheduler(algorithm: str, scheduler: str) -> None:
    from tuner.search import algorithms

    cfg = _cfg(algorithm, scheduler)
    assert cfg.scheduler is SCHEDULERS[scheduler]
    plan = algorithms.build_for(cfg)
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
    two = {"metric": ["val_acc", "num_params"], "direction": ["max", "min"]}
    assert _cfg("random", **two).scheduler.name == "fifo"  # the default gives way
    with pytest.raises(ConfigError, match="^schedule.scheduler: ASHA ranks trials by one metric.*moasha"):
        _cfg("random", "asha", **two)
    for one in ("median", "curve"):
        with pytest.raises(ConfigError, match="^schedule.scheduler: .* one metric .*use moasha"):
            _cfg("random", one, **two)
    # early stopping asked for with several objectives: multi-objective ASHA
    assert _cfg("random", **two, **{"schedule.early_stopping": True}).scheduler.name == "moasha"
    assert _cfg("optuna", **two, **{"schedule.early_stopping": True}).scheduler.name == "moasha"


# ----------------------------------------------------------------------------- the contract

# Every parameter kind a model takes, one conditional on a choice and one on an integer range,
# and a constraint between two of them (a grid parameter for the algorithms that take one).
SPACE: dict[str, Any] = {
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "dropout": {"type": "uniform", "low": 0.0, "high": 0.5},
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "depth": {"type": "randint", "low": 1, "high": 4},
    "width": {"type": "lograndint", "low": 8, "high": 128},
    "momentum": {"type": "uniform", "low": 0.5, "high": 0.99, "when": {"optimizer": "sgd"}},
    "blocks": {"type": "randint", "low": 1, "high": 3, "when": {"depth": [3, 4]}},
    "seed_offset": 7,
}
CONSTRAINTS = ["width >= 4 * depth"]
MAX_EPOCHS = 9
# Pairs whose searcher needs seconds per proposal (optuna's GP fits a Gaussian process each
# time): out of the quick tier.
SLOW = {"gp"}


@pytest.fixture(autouse=True)
def _models_start_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """The samplers' models take over after 3 complete trials (TPE's and GP's default: 10),
    so that these short sweeps exercise the models, not only their random start."""
    from tuner.search import samplers

    for name in ("optuna", "gp"):
        monkeypatch.setitem(samplers.SETTINGS, name, {**samplers.SETTINGS[name], "n_startup_trials": 3})


def _marked(pairs: list[tuple[str, str]]) -> list[Any]:
    return [
        pytest.param(a, s, id=f"{a}+{s}", marks=[pytest.mark.slow] if a in SLOW else []) for a, s in pairs
    ]


def _sections(algorithm: str, scheduler: str, n: int, seed: int = 0) -> tuple[Any, Any]:
    from tuner.config import ScheduleSection, SearchSection

    params = dict(SPACE)
    if "grid" in ALGORITHMS[algorithm].kinds:
        params["depth"] = {"type": "grid", "values": [1, 2, 3, 4]}
    search = SearchSection(
        algorithm=algorithm, params=params, num_samples=n, seed=seed, constraints=CONSTRAINTS, grid_points=2
    )
    schedule = ScheduleSection(max_epochs=MAX_EPOCHS, grace_epochs=1, reduction_factor=3, scheduler=scheduler)
    return search, schedule


def _plan(search: Any, schedule: Any, prior: Any = None) -> Any:
    from tuner.search import algorithms

    return algorithms.build(search, schedule, search.params, "val_loss", "min", None, prior)


def _curve(config: dict[str, Any], epoch: int, _rng: Any) -> float | None:
    """Deterministic val_loss, best near lr 0.01 with adam; some widths diverge (NaN at epoch
    3), report +inf, or crash at epoch 2 (a trial whose code raises)."""
    import math

    if config["width"] % 5 == 0 and epoch == 2:
        return None
    if config["width"] % 7 == 0 and epoch == 3:
        return math.nan
    if config["width"] % 11 == 0:
        return math.inf
    gap = abs(math.log10(config["lr"]) + 2) + (0.3 if config["optimizer"] == "sgd" else 0.0)
    return 0.2 + gap + config["dropout"] / 10 + config["depth"] / 100 + 1.0 / epoch


def _inside(config: dict[str, Any], search: Any) -> None:
    from tuner.space import conditions
    from tuner.space.constraints import allows as keeps
    from tuner.space.params import allows

    for name, p in search.params.items():
        present = conditions.applies(p, config)
        assert (name in config) == present, (name, config)
        if present:
            value = config[name].item() if hasattr(config[name], "item") else config[name]
            assert allows(p, value), (name, value)
    assert keeps(CONSTRAINTS, config), config


class _Failing:
    """_curve, except that of every five trials (in the order they start) one crashes at
    epoch 1, one diverges (NaN) at epoch 3 and one reports +inf: whatever the searcher proposes."""

    def __init__(self) -> None:
        self.order: dict[str, int] = {}

    def __call__(self, config: dict[str, Any], epoch: int, rng: Any) -> float | None:
        import math

        from tuner.search.plan import key

        i = self.order.setdefault(key(config), len(self.order))
        fails = {2: (1, None), 3: (3, math.nan), 4: (1, math.inf)}.get(i % 5)
        if fails is not None and epoch >= fails[0]:
            return fails[1]
        return _curve(config, epoch, rng)


@pytest.mark.parametrize(("algorithm", "scheduler"), _marked(SIMULATED))
def test_proposals_stay_inside_the_space_through_nan_inf_and_crashes(algorithm: str, scheduler: str) -> None:
    from tuner.search.simulate import simulate

    n = 10 if algorithm in SLOW else 20
    search, schedule = _sections(algorithm, scheduler, n)
    plan = _plan(search, schedule)
    trials = simulate(
        plan, min(n, plan.num_samples), MAX_EPOCHS, _Failing(), metric="val_loss", direction="min"
    )
    assert len(trials) == n
    for t in trials.values():
        _inside(t.config, search)
        assert t.ended
    assert any(t.crashed for t in trials.values())  # each kind of failure was met, and survived
    assert any(t.failed and not t.crashed for t in trials.values())


def _killed(plan: Any, n: int, kill_at: int) -> dict[str, Any]:
    from tuner.search.simulate import simulate

    return simulate(plan, n, MAX_EPOCHS, _curve, metric="val_loss", direction="min", epoch_budget=kill_at)


def _rows(values: list[float]) -> list[dict[str, Any]]:
    import math

    return [
        {"epoch": e, "val_loss": v, **({} if math.isfinite(v) else {"failure": "diverged"})}
        for e, v in enumerate(values, 1)
    ]


def _prior(trials: dict[str, Any], n: int) -> Any:
    """What a resumed sweep reads back from the trials' journals after a kill -9."""
    from tuner.search.plan import Prior, PriorTrial

    finished = [PriorTrial(t.config, _rows(t.values), t.crashed) for t in trials.values() if t.ended]
    running = [t for t in trials.values() if not t.ended]
    return Prior(
        finished=finished,
        resumed=[t.config for t in running],
        interrupted=[PriorTrial(t.config, _rows(t.values)) for t in running],
        new=n - len(trials),
    )


def _asha_state(scheduler: Any) -> Any:
    from tuner.cluster import _ray_internals

    return [
        (m, sorted(round(v, 9) for v in recorded.values()))
        for m, recorded in _ray_internals.asha_rungs(scheduler)
    ]


# What each scheduler has learnt, comparable between runs (trial ids aside). A new scheduler
# needs its entry here: the test fails until it has one.
def _curves_state(scheduler: Any) -> Any:
    """median, curve: every trial's curve (trial ids aside), and the best value of any."""
    every = scheduler.curves.values()
    return scheduler.best, sorted(tuple((e, round(v, 9)) for e, v in sorted(c.items())) for c in every)


def _moasha_state(scheduler: Any) -> Any:
    return [(m, sorted(tuple(p) for p in recorded.values())) for m, recorded in scheduler.recorded.items()]


STATE = {
    "fifo": lambda s: None,
    "asha": _asha_state,
    "median": _curves_state,
    "curve": _curves_state,
    "moasha": _moasha_state,
}


def _study_state(searcher: Any) -> Any:
    """The study's trials that ran (a proposal that broke a constraint is a FAIL the resumed
    study need not repeat): parameters (integers as the space's integers: the study may hold
    a lograndint at any point of the stretch that gives it), state, value, intermediate values."""
    import math

    def params(t: Any) -> str:
        return str(
            sorted(
                (k, math.floor(v) if k in ("width", "depth", "blocks") else round(v, 9))
                if isinstance(v, (int, float))
                else (k, v)
                for k, v in t.params.items()
            )
        )

    ran = [t for t in searcher.study.trials if t.state.name in ("COMPLETE", "PRUNED", "RUNNING")]
    return sorted(
        (params(t), t.state.name, round(t.value, 9) if t.value is not None else None,
         str(sorted((k, round(v, 9)) for k, v in t.intermediate_values.items())))
        for t in ran
    )  # fmt: skip


def _bohb_state(searcher: Any) -> Any:
    return {b: sorted(round(x, 9) for x in losses) for b, losses in searcher.bohber.losses.items()}


def _inner(search_alg: Any) -> Any:
    inner = getattr(search_alg, "searcher", search_alg)  # (a ConcurrencyLimiter's)
    return getattr(inner, "inner", inner)  # (ResumeFirst's)


def _learnt(algorithm: str, search_alg: Any) -> Any:
    inner = _inner(search_alg)
    if hasattr(inner, "study"):
        return _study_state(inner)
    if hasattr(inner, "bohber"):
        return _bohb_state(inner)
    return None  # grid and random learn nothing


def _events(trials: dict[str, Any]) -> list[tuple[str, tuple[float, ...], bool]]:
    from tuner.search.plan import key

    return sorted((key(t.config), tuple(round(v, 9) for v in t.values), t.failed) for t in trials.values())


@pytest.mark.parametrize(
    ("algorithm", "scheduler", "kill_at"),
    [
        pytest.param(a, s, k, id=f"{a}+{s}-{k}", marks=[pytest.mark.slow] if a in SLOW else [])
        for a, s in SIMULATED
        for k in ((0.6,) if a in SLOW else (0.3, 0.7))
    ],
)
def test_resume_after_a_kill_equals_the_uninterrupted_run(
    algorithm: str, scheduler: str, kill_at: float
) -> None:
    """Killed after `kill_at` of its epochs and resumed from what the trials' journals hold: the
    scheduler's state and what the searcher has been told are those of the uninterrupted run
    at the kill; for the algorithms whose list is fixed (grid, random), the whole sweep is."""
    from tuner.search.simulate import simulate

    search, schedule = _sections(algorithm, scheduler, 8 if algorithm in SLOW else 12)
    n = _plan(search, schedule).num_samples  # (grid: its whole grid)
    whole = simulate(_plan(search, schedule), n, MAX_EPOCHS, _curve, metric="val_loss", direction="min")
    at_kill = _plan(search, schedule)
    killed = _killed(at_kill, n, round(kill_at * sum(len(t.values) for t in whole.values())))
    assert 0 < len(killed) < n or not all(t.ended for t in killed.values())  # killed mid-sweep
    prior = _prior(killed, n)
    resumed = _plan(search, schedule, prior)
    assert STATE[scheduler](resumed.scheduler) == STATE[scheduler](at_kill.scheduler)
    assert _learnt(algorithm, resumed.search_alg) == _learnt(algorithm, at_kill.search_alg)
    continued = [list(t.values) for t in killed.values() if not t.ended]
    rest = simulate(resumed, resumed.num_samples, MAX_EPOCHS, _curve, metric="val_loss", direction="min",
                    continued=continued)  # fmt: skip
    done = [t for t in killed.values() if t.ended] + list(rest.values())
    assert len(done) == n and all(t.ended for t in done)
    for t in rest.values():
        _inside(t.config, search)
    if ALGORITHMS[algorithm].builds.endswith(("plan_grid", "plan_random")):
        assert _events(dict(enumerate(done))) == _events(whole)


@pytest.mark.parametrize(
    ("algorithm", "scheduler"), _marked([p for p in SIMULATED if not ALGORITHMS[p[0]].no_extend])
)
def test_an_extended_sweep_runs_only_new_trials_told_every_earlier_one(
    algorithm: str, scheduler: str
) -> None:
    from tuner.search.plan import key
    from tuner.search.simulate import simulate

    n, more = (5, 2) if algorithm in SLOW else (8, 4)
    search, schedule = _sections(algorithm, scheduler, n)
    plan = _plan(search, schedule)
    first = simulate(plan, n, MAX_EPOCHS, _curve, metric="val_loss", direction="min")
    search.num_samples = n + more
    extended = _plan(search, schedule, _prior(first, n + more))
    assert extended.num_samples == more
    assert _learnt(algorithm, extended.search_alg) == _learnt(algorithm, plan.search_alg)
    added = simulate(extended, more, MAX_EPOCHS, _curve, metric="val_loss", direction="min")
    assert len(added) == more
    for t in added.values():
        _inside(t.config, search)
    if ALGORITHMS[algorithm].builds.endswith("plan_random"):  # the seeded list, continued
        whole = simulate(
            _plan(search, schedule), n + more, MAX_EPOCHS, _curve, metric="val_loss", direction="min"
        )
        assert {key(t.config) for t in added.values()} == {key(t.config) for t in list(whole.values())[n:]}


def test_grid_refuses_to_be_extended_in_one_line() -> None:
    assert ALGORITHMS["grid"].no_extend and not any(a.no_extend for n, a in ALGORITHMS.items() if n != "grid")


# ----------------------------------------------------------------------------- real sweeps


@pytest.mark.usefixtures("ray_session")  # resume and extend run in this process, on the session's Ray
def test_a_real_cmaes_sweep_is_killed_resumed_and_extended(tmp_path: Path) -> None:
    """An algorithm added on the registries, end to end: `tuner sweep` killed with -9 once a
    trial has finished and another is mid-way, `tuner resume` (finished trials kept, the
    interrupted one continued from its checkpoint), then `tuner extend` by one trial, its
    searcher rebuilt from every result. (gp and nsga2: the next test.)"""
    import re
    import signal

    from tests.test_resume import (
        CTRL_C_SAMPLES,
        _check_resumed,
        _interrupt_when_caught_midway,
        _snapshot,
        _start,
    )

    sweep = tmp_path / "debug"
    _interrupt_when_caught_midway(_start(tmp_path, "cmaes", samples=CTRL_C_SAMPLES), sweep, signal.SIGKILL)
    finished, midway = _snapshot(sweep)
    out = cli("resume", str(sweep), on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(
        rf"resuming debug: {len(finished)} trials finished, {len(midway)} to continue", out.stdout
    )
    _check_resumed(sweep, finished, midway, samples=CTRL_C_SAMPLES)
    _extended_by_one(sweep, "cmaes", CTRL_C_SAMPLES)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algorithm", ["gp", "nsga2"])
def test_a_real_sweep_runs_and_is_extended(algorithm: str, tmp_path: Path) -> None:
    """`tuner sweep` (its preloaded modules, its searcher on Ray Tune) then `tuner extend`."""
    args = ["--output", str(tmp_path), "--algorithm", algorithm, "--num-samples", "2", "--max-epochs", "2"]
    out = cli("sweep", str(DEBUG), *args, on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    _extended_by_one(tmp_path / "debug", algorithm, 2)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algorithm", ["random", "optuna"])
def test_tune_queues_as_many_trials_as_run_at_once_and_a_learner_proposes_no_further(
    algorithm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trials queued for an actor at once, seen after each step of Tune's loop: as many as the
    Ray holds (2), so that the first trials' actors are asked for together (one after another,
    a sweep on a running cluster waited for each worker in turn: BENCHMARKS.md). An algorithm
    that learns has at most that many trials without an outcome (queued or running): its next
    configuration is asked for only when one has ended, never on what it knew at the start."""
    from ray.tune.execution.tune_controller import TuneController

    queued: list[int] = []
    open_: list[int] = []
    step = TuneController.step

    def counted(self: Any) -> None:
        step(self)
        trials = self.get_trials()
        queued.append(sum(t.status == "PENDING" for t in trials))
        open_.append(sum(t.status in ("PENDING", "RUNNING", "PAUSED") for t in trials))

    monkeypatch.setattr(TuneController, "step", counted)
    args = ["--output", str(tmp_path), "--algorithm", algorithm, "--num-samples", "4", "--max-epochs", "2"]
    out = cli("sweep", str(DEBUG), *args, on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert queued and max(queued) == 2, queued
    if ALGORITHMS[algorithm].learns:
        assert max(open_) == 2, open_


def test_a_users_own_queue_setting_stands_and_ours_ends_with_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from tuner.driver.sweep import MAX_PENDING_ENV, _queued_ahead

    monkeypatch.delenv(MAX_PENDING_ENV, raising=False)
    with _queued_ahead(3):
        assert os.environ[MAX_PENDING_ENV] == "3"
    assert MAX_PENDING_ENV not in os.environ
    monkeypatch.setenv(MAX_PENDING_ENV, "16")
    with _queued_ahead(3):
        assert os.environ[MAX_PENDING_ENV] == "16"
    assert os.environ[MAX_PENDING_ENV] == "16"


def _extended_by_one(sweep: Path, algorithm: str, before: int) -> None:
    import json

    out = cli("extend", str(sweep), "--num-samples", "1", on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["algorithm"] == algorithm
    assert len(summary["trials"]) == before + 1
    assert all(t["status"] == "TERMINATED" and t["failure"] is None for t in summary["trials"])
    assert [t["origin"] for t in summary["trials"]] == ["searcher"] * (before + 1)
