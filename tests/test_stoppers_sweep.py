"""The schedulers that read whole learning curves (median, curve), ASHA and multi-objective ASHA
(moasha) in real sweeps on Ray, one each: `python -m tuner sweep` killed with -9 mid-way, then
`tuner resume` and `tuner extend`; the last trial the killed run stopped is first rewound to how
a kill between its report and the scheduler's judgement leaves it, and the resume judges it.
Trials run one at a time on a deterministic task, so the sweep's decisions have an independent
answer: the simulator (tuner.search.simulate) running the same configurations uninterrupted.
Every configuration gets the epochs it got there: the scheduler rebuilt from the trials'
journals decided as the one that ran through. The judgements are kept and shown where a user
looks: stopper.jsonl, summary.json, the line of a stopped trial, TensorBoard's HParams columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.tasks.conditional import both
from tests import tbread
from tests.conftest import cli, gone, kill_9_when
from tuner.config import load_sweep
from tuner.search import algorithms
from tuner.search.plan import key
from tuner.search.simulate import simulate
from tuner.sweepdir import STOPPER_FILE, full_config, read_record, read_verdicts, trial_dirs, write_record

FIRST, MORE = 6, 3  # trials of the sweep, then of its extension


def _raw(output: Path, scheduler: str) -> dict[str, Any]:
    several = scheduler == "moasha"
    return {
        "name": scheduler,
        "task": {"train": "tests.held_task:train_both_held"},  # (train_both, held at a moment)
        "metric": ["val_loss", "cost"] if several else "val_loss",
        "direction": ["min", "min"] if several else "min",
        "search": {
            "algorithm": "random",
            "num_samples": FIRST,
            "seed": 4,
            "params": {
                "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
                "lr": {"type": "loguniform", "low": 1.0e-3, "high": 0.04},
                "width": {"type": "lograndint", "low": 16, "high": 512},
            },
        },
        "schedule": {"scheduler": scheduler, "max_epochs": 6, "grace_epochs": 1, "reduction_factor": 2},
        # one trial at a time: the order the simulator runs them in
        "resources": {"cpus_per_worker": 1, "gpus_per_worker": 0, "max_concurrent_trials": 1},
        "output": str(output),
    }


def _expected(raw: dict[str, Any], tmp_path: Path) -> dict[str, int]:
    """configuration -> the epochs the simulator gives it, FIRST + MORE trials uninterrupted,
    in the order they run."""
    path = tmp_path / "expected.yaml"
    path.write_text(json.dumps({**raw, "search": {**raw["search"], "num_samples": FIRST + MORE}}))
    cfg = load_sweep(path)
    params = cfg.hyperparameters()
    plan = algorithms.build(
        cfg.search, cfg.schedule, params, cfg.objective, cfg.objective_direction, objectives=cfg.objectives
    )
    trials = simulate(
        plan, FIRST + MORE, cfg.schedule.max_epochs, both, 1, metric="val_loss", direction="min"
    )
    return {key(t.config): len(t.values) for t in trials.values()}


@pytest.mark.parametrize("scheduler", ["curve", "median", "asha", "moasha"])
def test_killed_resumed_and_extended_it_decides_as_the_one_that_ran_through(
    scheduler: str, ray_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _raw(tmp_path / "out", scheduler)
    rewound, keeps_verdicts = scheduler != "moasha", scheduler in ("curve", "median")
    expected = _expected(raw, tmp_path)
    assert len(set(expected.values())) > 1  # it stops some trials, not others

    # Killed while a trial waits before its first report, every one before it ended: the one
    # after the first the scheduler stops (moasha: the fourth), so that the last to end was
    # stopped, with nothing after it that its judgement could not have seen.
    order = list(expected.items())
    stops = [i for i, (_, epochs) in enumerate(order[:FIRST]) if epochs < raw["schedule"]["max_epochs"]]
    last = stops[0] if scheduler != "moasha" else 2
    assert last + 1 < FIRST, order
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("TUNER_TEST_HOLD", f"{gate}:{last + 2}")
    sweep = kill_9_when(raw, tmp_path, lambda _: (gate / "waiting").exists())
    # The waiting trial's process outlives its driver a moment (Ray ends it): gone before the
    # resume reads the sweep, it records nothing more (it never passes the gate).
    gone(int((gate / "waiting").read_text()))
    if rewound:
        # Killed between that trial's last report and the scheduler's judgement of it, the
        # sweep leaves it so: that epoch recorded (and its checkpoint), no judgement of it, its
        # record still running. Resumed, it is judged before it trains on, and ends there
        # (ASHA keeps no judgements: its rung holds the value, and ASHA never judges again).
        stopped_last = next(d for d in trial_dirs(str(sweep)) if key(full_config(d)) == order[last][0])
        judged = read_verdicts(stopped_last)
        if keeps_verdicts:
            assert judged[-1]["stop"] and judged[-1]["epoch"] == order[last][1], judged
            verdicts = Path(stopped_last) / STOPPER_FILE
            verdicts.write_text("".join(line + "\n" for line in verdicts.read_text().splitlines()[:-1]))
        write_record(stopped_last, {**(read_record(stopped_last) or {}), "status": "RUNNING"})
    resumed = cli("resume", str(sweep), on_session=True)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    if rewound:
        name = Path(stopped_last).name
        assert f"trial {name} ends at epoch {order[last][1]}, judged as it resumes" in resumed.stdout
        assert read_verdicts(stopped_last) == judged  # (median, curve: the same judgement, made again)
    grown = cli("extend", str(sweep), "--num-samples", str(MORE), on_session=True)
    assert grown.returncode == 0, grown.stdout[-3000:] + grown.stderr[-3000:]

    summary = json.loads((sweep / "summary.json").read_text())
    assert len(summary["trials"]) == FIRST + MORE
    for t in summary["trials"]:
        config = full_config(str(sweep / t["trial_id"]))
        assert expected[key(config)] == t["epochs"], (t["trial_id"], config)

    if scheduler == "moasha":
        assert summary["pareto"], summary
    if not keeps_verdicts:
        return
    # why each stopped trial was stopped: its judgements, summary.json, its line
    stopped = [t for t in summary["trials"] if t["stopped_early"]]
    assert stopped
    for t in stopped:
        verdicts = read_verdicts(str(sweep / t["trial_id"]))
        assert verdicts[-1]["epoch"] == t["epochs"] and verdicts[-1]["stop"] is True
        assert t["verdict"] == verdicts[-1]
    said = resumed.stdout + grown.stdout + (tmp_path / "driver.log").read_text()
    assert "(stopped early: " in said, said[-3000:]
    # TensorBoard's HParams table: the judgement's numbers as columns of the trial's run
    column = "stopper/p_beat" if scheduler == "curve" else "stopper/median"
    experiment = tbread.hparams(sweep)["experiment"]
    assert column in [m.name.tag for m in experiment.metric_infos]
    assert tbread.scalars(sweep / stopped[0]["trial_id"])[column]
