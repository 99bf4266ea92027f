"""Several objectives (issue 14, part 3) without a cluster: the Pareto front on hand-made
trials, the CLI table's marks, summary.json's keys, the multi-objective Optuna searcher (live
and replayed alike), no early stopping unless asked for, and the bad inputs (one line, exit 2)."""

from __future__ import annotations

import itertools
import random
from typing import Any, Optional

import pytest

from tests.conftest import DEBUG, cli
from tuner.config import ConfigError, load_sweep, parse_sweep, read_yaml
from tuner.results import TrialRecord, leaderboard, pareto, summarize
from tuner.search import algorithms
from tuner.search.plan import Prior, PriorTrial

TWO = [("val_acc", "max"), ("num_params", "min")]


def _trial(
    tid: str, acc: Optional[float], params: Optional[int], failure: Optional[str] = None
) -> TrialRecord:
    best = {k: v for k, v in (("val_acc", acc), ("num_params", params), ("epoch", 2)) if v is not None}
    return TrialRecord(
        trial_id=tid,
        status="ERROR" if failure else "TERMINATED",
        config={"width": params},
        last_metrics=best,
        epochs=3,
        time_s=1.0,
        failure=failure,
        stopped_early=False,
        best_value=None if failure else acc,  # (it failed before any epoch of its own)
        best_epoch=None if acc is None or failure else 2,
        best_metrics={} if failure else best,
    )


# Worked out by hand: a and b tie (equal values: both on the front); c is the most accurate;
# f the smallest; d and its duplicate e are both dominated by a (less accurate, larger); i is
# as accurate as c but larger (dominated); g would dominate everything but diverged at its
# first epoch (no result); h never
# reported num_params; j reported no value at all.
HAND = [
    _trial("a", 0.90, 1000),
    _trial("b", 0.90, 1000),
    _trial("c", 0.95, 5000),
    _trial("d", 0.80, 2000),
    _trial("e", 0.80, 2000),
    _trial("f", 0.85, 500),
    _trial("g", 0.99, 100, failure="diverged: non-finite loss at epoch 2"),
    _trial("h", 0.97, None),
    _trial("i", 0.95, 6000),
    _trial("j", None, None),
]


def test_pareto_of_hand_made_trials() -> None:
    assert pareto(HAND, TWO) == ["a", "b", "c", "f"]
    # Either objective's direction flipped gives another front, worked out by hand as well.
    assert pareto(HAND, [("val_acc", "max"), ("num_params", "max")]) == ["i"]
    assert pareto(HAND, [("val_acc", "min"), ("num_params", "min")]) == ["d", "e", "f"]
    # Order of the trials never matters; the answer keeps theirs.
    assert pareto(HAND[::-1], TWO) == ["f", "c", "b", "a"]


def _brute_force(points: dict[str, tuple[float, ...]]) -> list[str]:
    """Every pair compared (all objectives maximised): the definition, written out."""
    return [
        p
        for p, v in points.items()
        if not any(
            all(a >= b for a, b in zip(w, v, strict=True)) and w != v for q, w in points.items() if q != p
        )
    ]


def test_pareto_matches_the_definition_on_random_points_with_many_ties() -> None:
    rng = random.Random(0)
    for n, k in itertools.product((1, 5, 40), (2, 3)):
        objectives = [("val_acc", "max"), ("num_params", "min"), ("val_loss", "min")][:k]
        names = [m for m, _ in objectives]
        trials, points = [], {}
        for i in range(n):
            values = [rng.choice([1, 2, 3, 4]) for _ in names]  # few values: ties everywhere
            t = _trial(f"t{i}", values[0], values[1])
            t.best_metrics = dict(zip(names, values, strict=True))
            trials.append(t)
            points[t.trial_id] = tuple(
                v if mode == "max" else -v for v, (_, mode) in zip(values, objectives, strict=True)
            )
        assert pareto(trials, objectives) == _brute_force(points), (n, k)


def test_the_table_marks_the_front_and_summary_json_lists_it() -> None:
    table = leaderboard(HAND, TWO, top=2)
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    head = table.splitlines()[0].split()
    assert head[:6] == ["trial", "val_acc", "num_params", "epoch", "status", "pareto"]
    # The top 2 by val_acc (h, off the front for want of num_params; c), then the rest of
    # the front, best val_acc first.
    assert list(rows) == ["h", "c", "a", "b", "f"]
    assert {t for t, line in rows.items() if line.split()[5] == "*"} == {"a", "b", "c", "f"}
    assert rows["f"].split()[1:3] == ["0.85", "500"] and rows["h"].split()[1:3] == ["0.97", "-"]

    summary = summarize(HAND, name="x", metric="val_acc", direction="max", algorithm="random",
                        expected_trials=10, objectives=TWO)  # fmt: skip
    assert summary["pareto"] == ["a", "b", "c", "f"]
    assert summary["objectives"] == [["val_acc", "max"], ["num_params", "min"]]
    assert summary["best"]["trial_id"] == "h" and (summary["metric"], summary["direction"]) == (
        "val_acc",
        "max",
    )
    assert summary["mode"] == "max"  # (direction's older name: scripts that read it go on working)
    one = summarize(HAND, name="x", metric="val_acc", direction="max", algorithm="random", expected_trials=10)
    assert "pareto" not in one and "objectives" not in one
    assert "pareto" not in leaderboard(HAND, TWO[:1]).splitlines()[0]


def _two_objectives(algorithm: str, **over: Any) -> Any:
    return load_sweep(
        DEBUG,
        {
            "search.algorithm": algorithm,
            "metric": ["val_acc", "num_params"],
            "direction": ["max", "min"],
            **over,
        },
    )


def _plan(cfg: Any, prior: Optional[Prior] = None) -> Any:
    return algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.objective, cfg.objective_direction, None, prior,
        objectives=cfg.objectives,
    )  # fmt: skip


@pytest.mark.parametrize("algorithm", ["grid", "random", "optuna"])
def test_no_early_stopping_with_several_objectives(algorithm: str) -> None:
    cfg = _two_objectives(algorithm)
    assert cfg.schedule.early_stopping is None  # unset: on for random and optuna, one objective
    assert _plan(cfg).scheduler is None


def test_optuna_is_told_every_objective_at_the_best_epoch_of_the_first() -> None:
    cfg = _two_objectives("optuna", **{"search.num_samples": 6})
    searcher = _plan(cfg).search_alg
    histories: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for i in range(5):
        config = searcher.suggest(f"t{i}")
        size = 100 * config["width"]
        # val_acc is best at epoch 2; num_params is the same every epoch, as a model's is.
        rows = [
            {"epoch": e, "val_acc": a, "num_params": size}
            for e, a in ((1, 0.5), (2, 0.6 + i / 100), (3, 0.55))
        ]
        for row in rows:
            searcher.on_trial_result(f"t{i}", row)
        searcher.on_trial_complete(f"t{i}", rows[-1])
        histories.append((config, rows))
    searcher.suggest("failed")
    searcher.on_trial_complete(
        "failed", {"epoch": 1, "val_acc": 0.9, "num_params": 10, "failure": "diverged"}
    )
    study = searcher.inner.study
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    told = [(t.state.name, t.values) for t in study.trials]
    expected = [("COMPLETE", [0.6 + i / 100, 100 * c["width"]]) for i, (c, _) in enumerate(histories)]
    assert told == expected + [("FAIL", None)]

    # A resumed sweep's fresh searcher is told the same, from the trials' journals.
    prior = Prior(finished=[PriorTrial(c, h) for c, h in histories])
    again = _plan(cfg, prior).search_alg.inner.study
    assert [(t.state.name, t.values) for t in again.trials] == expected


BAD = [
    (
        {"metric": ["val_acc", "num_params"], "direction": ["max"]},
        "direction: 1 direction(s) for 2 metrics: one per metric",
    ),
    ({"metric": ["val_acc", "my_score"]}, "direction: required for metric 'my_score' (max or min)"),
    (
        {"metric": ["val_acc", "num_params"], "direction": ["max", "max"]},
        "direction: num_params is to be minimised, not max",
    ),
    (
        {"metric": ["val_acc", "num_params"], "direction": "max"},
        "direction: one direction per metric, as a list",
    ),
    (
        {"metric": "val_acc", "direction": ["max"]},
        "direction: a list of directions goes with a list of metrics",
    ),
    ({"metric": ["val_acc", "val_acc"]}, "metric: 'val_acc' is listed twice"),
    ({"metric": []}, "metric: an empty list names no objective"),
    ({"metric": ["val_acc", "num_params"], "search": "bohb"}, "search.algorithm: bohb optimises one metric"),
    (
        # (schedule.early_stopping: true with several objectives is moasha: tests/test_stoppers.py)
        {"metric": ["val_acc", "num_params"], "scheduler": "asha"},
        "schedule.scheduler: ASHA ranks trials by one metric",
    ),
]


@pytest.mark.parametrize("over, line", BAD, ids=[b[1].split(":")[0] + str(i) for i, b in enumerate(BAD)])
def test_bad_objectives_are_refused(over: dict[str, Any], line: str) -> None:
    raw = read_yaml(DEBUG)
    raw.pop("direction")
    raw.update({k: v for k, v in over.items() if k in ("metric", "direction")})
    if "search" in over:
        raw["search"]["algorithm"] = over["search"]
    if "scheduler" in over:
        raw["schedule"]["scheduler"] = over["scheduler"]
    with pytest.raises(ConfigError) as err:
        parse_sweep(raw)
    assert str(err.value).startswith(line), str(err.value)


def test_the_cli_refuses_them_in_one_line_before_ray(tmp_path) -> None:
    out = cli("sweep", str(DEBUG), "--output", str(tmp_path), "--set", "metric=[val_acc, num_params]",
                  "--set", "direction=[max]")  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: direction: 1 direction(s) for 2 metrics: one per metric, in the same order"
    ], out.stderr
    assert not any(tmp_path.iterdir())
    ok = cli("validate", str(DEBUG), "--set", "metric=[val_acc, num_params]", "--set", "direction=[max, min]")
    assert ok.returncode == 0 and "metrics val_acc (max), num_params (min)" in ok.stdout, ok.stdout


def test_a_trial_must_report_every_objective(tmp_path) -> None:
    """With task.train a trial reports its own objectives: the first report must hold them all."""
    from tuner.errors import MissingMetricError
    from tuner.trial.frame.session import LocalSession

    session = LocalSession(str(tmp_path), metric="val_acc", also=("num_params",))
    with pytest.raises(MissingMetricError, match="metric 'num_params' is not among the values"):
        session.report({"epoch": 1, "val_acc": 0.5}, None)
    assert session.metrics == []  # nothing was sent
    session.report({"epoch": 1, "val_acc": 0.5, "num_params": 10}, None)
    assert session.metrics == [{"epoch": 1, "val_acc": 0.5, "num_params": 10}]
