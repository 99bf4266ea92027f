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
from tuner.sweepdir import place_of

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
    prior = warm.attach(cfg, None, place_of(str(sweep_dir)))
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction, None, prior
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
    # Two more names for the same sweep (issue 44 item 17: it counted once per name).
    (out / "a-link").symlink_to(out / "earlier")
    (out / "z-link").symlink_to(out / "earlier")
    cfg = _new(out, "optuna", "auto")
    assert [p.uri for p in warm.sources(cfg, place_of(str(out / "new")))] == [str(out / "earlier")]


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
    # What warm_start.json says ran first is what ran (before, its list was drawn with room for
    # num_samples, not num_samples less the start_with ones: 4 listed, 3 run).
    record = json.loads((Path(out.sweep_dir) / "warm_start.json").read_text())
    ran = [algorithms.key(t["config"]) for t in summary["trials"]]
    assert all(algorithms.key(f["config"]) in ran for f in record.get("first", []))
    assert origins.count("searcher") == 4 - 1 - origins.count(str(earlier))


# ----------------------------------------------------------------------------- the fingerprint


def test_a_task_field_an_older_fingerprint_lacks_counts_as_unset() -> None:
    """code.json of a sweep recorded before a task field existed lacks it; the field is unset
    (None) here: the same task. Before, `difference` raised a bare StopIteration, ending the
    sweep that looked for warm-start sources."""
    ours = {"task": {"model": "mlp", "loss": None}, "objectives": [["val_acc", "max"]], "modules": {}}
    older = {"task": {"model": "mlp"}, "objectives": [["val_acc", "max"]], "modules": {}}
    assert warm.difference(ours, older) is None
    other = {"task": {"model": "cnn"}, "objectives": [["val_acc", "max"]], "modules": {}}
    assert warm.difference(ours, other) == "task.model is 'mlp' here, 'cnn' there"


def test_the_fingerprint_is_computed_once_per_sweep(tmp_path: Path) -> None:
    """code.json, warm starts and the autotune cache key read one fingerprint: a user module
    edited while the sweep starts does not give them two tasks (each computed its own before)."""
    from tests.conftest import DEBUG
    from tuner.config import load_sweep

    (tmp_path / "mymodel.py").write_text("def build(config, shape, classes):\n    return None\n")
    cfg = load_sweep(DEBUG, {"task.model": "mymodel:build"}, imports=[str(tmp_path)])
    first = warm.fingerprint(cfg)
    assert first["modules"]["mymodel"]
    (tmp_path / "mymodel.py").write_text("def build(config, shape, classes):\n    return 1\n")
    assert warm.fingerprint(cfg) == first
    cfg.code_dirs = [str(tmp_path)]  # other directories: another computation
    assert warm.fingerprint(cfg)["modules"]["mymodel"] != first["modules"]["mymodel"]


def test_each_trial_s_origin_is_recorded_when_its_configuration_is_handed_out(tmp_path: Path) -> None:
    """Random search with start_with and a warm start: the origins the plan records as the
    searcher hands configurations out are what it hands out, in order (start_with, then the
    earlier sweep's best as room allows, then its own draws)."""
    from tuner.search.plan import Prior, PriorTrial

    cfg = debug_config(tmp_path, search__num_samples=4, search__start_with=[{"lr": 0.05}])
    fixed = {"depth": 1, **{k: v for k, v in cfg.training.model_dump().items() if v is not None}}
    earlier = [
        PriorTrial({**fixed, "lr": 0.01 * (i + 1), "optimizer": "adam", "width": 10 + i},
                   [{"epoch": 1, "val_acc": 0.5 + i / 100}], origin="/runs/a")
        for i in range(6)
    ]  # fmt: skip
    plan = algorithms.build_for(cfg, prior=Prior(earlier=earlier))
    configs = [plan.search_alg.suggest(f"t{i}") for i in range(4)]
    assert [plan.handed[f"t{i}"] for i in range(4)] == ["start_with", "/runs/a", "/runs/a", "/runs/a"]
    assert configs[0]["lr"] == 0.05 and [c["width"] for c in configs[1:]] == [15, 14, 13]  # the best first
