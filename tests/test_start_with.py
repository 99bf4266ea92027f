"""search.start_with: known configurations every algorithm runs first, completed from the
space, checked at validation, told to the model-based searchers, kept through resume/extend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEBUG, cli, contains, debug_config
from tuner.config import ConfigError, load_sweep
from tuner.search import algorithms
from tuner.search.algorithms import Prior, PriorTrial
from tuner.search.simulate import simulate

SPACE = {
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "momentum": {"type": "uniform", "low": 0.5, "high": 0.99, "when": {"optimizer": "sgd"}},
    "width": {"type": "lograndint", "low": 8, "high": 64},
}
GIVEN = [{"lr": 0.05, "optimizer": "adam"}, {"optimizer": "sgd", "momentum": 0.9, "width": 16}]


def _cfg(algorithm: str, n: int = 6, **search: Any):
    over = {"search.algorithm": algorithm, "search.num_samples": n, "search.params": SPACE}
    over["search.start_with"] = GIVEN
    over.update({f"search.{k}": v for k, v in search.items()})
    return load_sweep(DEBUG, over)


def _plan(cfg, prior: Prior | None = None):
    return algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction, None, prior
    )


def _first(plan, n: int) -> list[dict[str, Any]]:
    if plan.points is not None:
        return plan.points[:n]
    return [{**plan.param_space, **plan.search_alg.suggest(f"t{i}")} for i in range(n)]


@pytest.mark.parametrize("algorithm", list(algorithms.ALGORITHMS))
def test_every_algorithm_runs_the_given_configurations_first(algorithm: str) -> None:
    """The first trials hold the given values; the rest of each is drawn from the space (in
    range, conditional parameters only where they apply); grid search then runs its grid."""
    cfg = _cfg(algorithm, grid_points=2) if algorithm == "grid" else _cfg(algorithm)
    params = cfg.hyperparameters()
    first = _first(_plan(cfg), 3)
    for given, config in zip(GIVEN, first, strict=False):
        assert {k: config[k] for k in given} == given
        for k, p in params.items():
            if k in config and k not in given and k in SPACE:
                assert contains(p, config[k]), (k, config[k])
    assert "momentum" not in first[0] and first[1]["momentum"] == 0.9
    assert first[2] not in first[:2]  # then the algorithm's own
    again = _first(_plan(cfg), 2)
    assert again == first[:2]  # completed the same way every time (the sweep's seed)
    if algorithm == "grid":
        assert cfg.expected_trials() == 2 * 2 + 2 * 2 * 2 + 2  # adam: lr x width; sgd: x momentum; + given


@pytest.mark.parametrize("algorithm", [a for a in algorithms.ALGORITHMS if a not in ("grid", "random")])
def test_model_based_searchers_learn_from_the_given_trials(algorithm: str) -> None:
    cfg = _cfg(algorithm, 8)
    plan = _plan(cfg)
    trials = simulate(plan, 4, 3, lambda c, e, rng: 0.5 + 0.1 * e, metric="val_acc", direction="max")
    configs = [t.config for t in trials.values()]
    inner = plan.search_alg.inner
    if hasattr(inner, "study"):  # optuna's samplers
        told = [(t.state.name, t.params["optimizer"], t.value) for t in inner.study.trials[:2]]
        assert told == [("COMPLETE", "adam", 0.8), ("COMPLETE", "sgd", 0.8)]
        assert inner.study.trials[1].params["momentum"] == 0.9
    else:
        told = inner.bohber.configs[3][:2]  # in the model's own coordinates, at max_epochs
        encoded = [inner.encoding.encode({k: c[k] for k in SPACE if k in c}) for c in configs[:2]]
        import ConfigSpace as CS
        import numpy as np

        expected = [CS.Configuration(inner.bohber.configspace, e).get_array() for e in encoded]
        np.testing.assert_array_equal(np.array(told), np.array(expected))  # (nan: momentum absent)


@pytest.mark.parametrize("algorithm", list(algorithms.ALGORITHMS))
def test_a_resumed_or_extended_sweep_keeps_the_given_configurations(algorithm: str) -> None:
    """The first given trial finished, the second was interrupted: the rebuilt plan continues
    the second (from its checkpoints), never runs the first again, and runs the rest."""
    cfg = _cfg(algorithm, grid_points=2) if algorithm == "grid" else _cfg(algorithm)
    done, cut = _first(_plan(cfg), 2)
    history = [{"epoch": e, "val_acc": 0.5 + 0.1 * e} for e in (1, 2, 3)]
    left = cfg.expected_trials() - 2
    prior = Prior(finished=[PriorTrial(done, history)], resumed=[cut], new=left)
    plan = _plan(cfg, prior)
    rest = _first(plan, left + 1)
    assert rest[0] == cut
    assert algorithms.key(done) not in [algorithms.key(c) for c in rest]
    if algorithm in ("grid", "random"):
        assert len(plan.points) == left + 1


@pytest.mark.parametrize(
    "start_with, field, words",
    [
        ([{"depth": 2}], "search.start_with.0.depth", "no parameter 'depth' in search.params"),
        ([{"lr": 0.5}], "search.start_with.0.lr", "0.5 is outside 0.001..0.1"),
        ([{"optimizer": "rmsprop"}], "search.start_with.0.optimizer", "is not one of its values (sgd, adam)"),
        ([{"width": 12.5}], "search.start_with.0.width", "is not an integer"),
        ([{"momentum": 0.9}], "search.start_with.0.momentum", "applies only where optimizer is sgd"),
        ([{"optimizer": "adam", "momentum": 0.9}], "search.start_with.0.momentum", "give optimizer: sgd"),
        ([{}] * 7, "search.start_with", "7 configurations, more than num_samples (6)"),
    ],
)
def test_validation_refuses_what_the_space_cannot_hold(start_with: list, field: str, words: str) -> None:
    over = {"search.num_samples": 6, "search.params": SPACE, "search.start_with": start_with}
    with pytest.raises(ConfigError) as err:
        load_sweep(DEBUG, over)
    assert err.value.path == field and words in str(err.value), str(err.value)


def test_validation_refuses_a_configuration_no_completion_keeps_constrained() -> None:
    over = {
        "search.params": SPACE,
        "search.start_with": [{"width": 64}],
        "search.constraints": ["width <= 32"],
    }
    with pytest.raises(ConfigError, match="keeps search.constraints") as err:
        load_sweep(DEBUG, over)
    assert err.value.path == "search.start_with.0"


def test_the_cli_refuses_a_bad_start_in_one_line_with_exit_2(tmp_path: Path) -> None:
    import yaml

    raw = yaml.safe_load(DEBUG.read_text())
    raw["search"]["start_with"] = [{"lr": 5.0}]
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(raw))
    out = cli("validate", str(bad))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "search.start_with.0.lr" in lines[0], lines


@pytest.mark.slow
def test_a_real_sweep_runs_the_given_configurations_first(ray_session, tmp_path: Path) -> None:
    """On Ray, at the default concurrency (2 trials at once): the first two trials started
    are the given ones, and summary.json holds them."""
    from tuner.driver.sweep import run_sweep

    cfg = debug_config(
        tmp_path,
        search__num_samples=3,
        search__start_with=[{"lr": 0.05, "optimizer": "adam", "width": 9}, {"lr": 0.002}],
    )
    out = run_sweep(cfg)
    assert out.exit_code == 0, out.summary
    configs = [t["config"] for t in out.summary["trials"]]
    assert {"lr": 0.05, "optimizer": "adam", "width": 9, "depth": 1} in configs
    assert any(c["lr"] == 0.002 for c in configs)
