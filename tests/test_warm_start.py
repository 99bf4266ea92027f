"""search.warm_start: an earlier sweep's trials, mapped into a new space, told to the
searcher as history; the task fingerprint; what came from where."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import debug_config
from tuner.config import ConfigError
from tuner.search import algorithms, warm

NEW_LR = {"type": "loguniform", "low": 1e-2, "high": 1e-1}  # the upper half (in log) of debug's


@pytest.fixture(scope="module")
def earlier(ray_session, tmp_path_factory) -> Path:
    """A real random sweep of debug.yaml: 8 trials, lr in 1e-3..1e-1."""
    from tuner.driver.sweep import run_sweep

    out = tmp_path_factory.mktemp("earlier")
    cfg = debug_config(out, name="earlier", search__num_samples=8)
    done = run_sweep(cfg)
    assert done.exit_code == 0, done.summary
    return Path(done.sweep_dir)


def _new(tmp_path: Path, algorithm: str, sources: Any, **over: Any):
    return debug_config(
        tmp_path,
        name="new",
        search__algorithm=algorithm,
        search__num_samples=8,
        search__seed=5,
        search__warm_start=sources,
        **{"search__params.lr": NEW_LR},
        **over,
    )


def _inside(earlier: Path) -> list[dict[str, Any]]:
    """The earlier trials the new space holds, by hand: lr within 1e-2..1e-1 (the rest of
    debug's space is unchanged), with their best val_acc, from summary.json."""
    trials = json.loads((earlier / "summary.json").read_text())["trials"]
    return [t for t in trials if 1e-2 <= t["config"]["lr"] <= 1e-1]


def _plan(cfg, sweep_dir: Path):
    sweep_dir.mkdir(parents=True, exist_ok=True)
    prior = warm.attach(cfg, None, str(sweep_dir))
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, str(cfg.mode), None, prior
    )
    return prior, plan


def test_a_warm_started_optuna_study_holds_the_earlier_trials_inside_the_new_space(earlier, tmp_path) -> None:
    inside = _inside(earlier)
    assert 0 < len(inside) < 8  # the shifted space holds some, not all
    cfg = _new(tmp_path, "optuna", [str(earlier)])
    prior, plan = _plan(cfg, tmp_path / "new")
    study = plan.search_alg.inner.study
    told = sorted((t.params["lr"], t.params["optimizer"], t.params["width"]) for t in study.trials)
    expected = sorted((t["config"]["lr"], t["config"]["optimizer"], t["config"]["width"]) for t in inside)
    assert told == expected
    by_lr = {t.params["lr"]: t for t in study.trials}
    for t in inside:  # each told its last value (3 epochs: every one ran to max_epochs or was stopped)
        ot = by_lr[t["config"]["lr"]]
        assert ot.intermediate_values[t["epochs"]] == pytest.approx(t["last_metrics"]["val_acc"])
    record = json.loads((tmp_path / "new" / warm.WARM_FILE).read_text())
    assert record["sources"] == [
        {"sweep": str(earlier), "trials": 8, "used": len(inside), "dropped": 8 - len(inside)}
    ]


def test_bohb_and_asha_are_told_the_earlier_trials(earlier, tmp_path) -> None:
    inside = _inside(earlier)
    cfg = _new(tmp_path, "bohb", [str(earlier)])
    _, plan = _plan(cfg, tmp_path / "new")
    bohber = plan.search_alg.inner.bohber
    assert len(bohber.losses[1]) == len(inside)  # every one reached the first budget (1 epoch)
    rung_1 = dict(plan.scheduler._brackets[0]._rungs)[1]
    assert len(rung_1) == len(inside)


def test_random_search_runs_the_best_earlier_configurations_first(earlier, tmp_path) -> None:
    """The first trials are the earlier trials of best val_acc (summary.json's best_value),
    best first; then the sweep's own draws, 8 in all."""
    inside = _inside(earlier)
    cfg = _new(tmp_path, "random", [str(earlier)])
    _, plan = _plan(cfg, tmp_path / "new")
    k = min(algorithms.TOP_EARLIER, len(inside))
    best = {(t["config"]["lr"], t["config"]["width"]): t["best_value"] for t in inside}
    first = [best.get((c["lr"], c["width"])) for c in plan.points[:k]]
    assert first == sorted(best.values(), reverse=True)[:k]  # (None if not an earlier one)
    assert len(plan.points) == 8


def test_another_task_is_refused_in_one_line_unless_forced(earlier, tmp_path) -> None:
    other = {"task__data_args": {"samples": 256, "features": 8, "classes": 3}}
    cfg = _new(tmp_path, "optuna", [str(earlier)], **other)
    with pytest.raises(ConfigError) as err:
        _plan(cfg, tmp_path / "new")
    assert err.value.path == "search.warm_start.0"
    assert "task.data_args is" in str(err.value) and "warm_start_force" in str(err.value)
    forced = _new(tmp_path, "optuna", [str(earlier)], search__warm_start_force=True, **other)
    prior, _ = _plan(forced, tmp_path / "forced")
    assert prior.earlier
    with pytest.raises(ConfigError, match="not a sweep directory"):
        _plan(_new(tmp_path, "optuna", [str(tmp_path)]), tmp_path / "x")


def test_auto_takes_the_sweeps_of_the_same_task_in_output(earlier, tmp_path) -> None:
    out = tmp_path / "out"
    shutil.copytree(earlier, out / "earlier")
    code = json.loads((out / "earlier" / "code.json").read_text())
    code["fingerprint"]["modules"] = {"somewhere": "0" * 64}  # another task's copy, beside it
    shutil.copytree(earlier, out / "other")
    (out / "other" / "code.json").write_text(json.dumps(code))
    cfg = _new(out, "optuna", "auto")
    assert warm.sources(cfg, str(out / "new")) == [str(out / "earlier")]


@pytest.mark.slow
def test_a_warm_started_sweep_says_what_came_from_where(earlier, tmp_path) -> None:
    """On Ray: summary.json names the earlier sweep and marks the trials taken from it and
    the start_with one; a resume would read the same sources (warm_start.json)."""
    from tuner.driver.sweep import run_sweep

    cfg = _new(tmp_path, "random", [str(earlier)], search__start_with=[{"lr": 0.05}])
    cfg.search.num_samples = 4
    out = run_sweep(cfg)
    assert out.exit_code == 0, out.summary
    summary = out.summary
    assert summary["warm_start"][0]["sweep"] == str(earlier)
    origins = [t.get("origin") for t in summary["trials"]]
    assert origins.count("start_with") == 1
    assert origins.count(str(earlier)) == min(3, len(_inside(earlier)))
    assert json.loads((Path(out.sweep_dir) / "summary.json").read_text())["warm_start"]
