"""Whole sweeps on a real local Ray (2 CPUs): every algorithm, DDP, TensorBoard, summary, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.plugins.hparams import api_pb2

from tests.conftest import DEBUG, CliSweep, assert_resources_returned, cli, debug_config
from tests.tbread import hparams, scalars
from tuner.config import SweepConfig
from tuner.driver.sweep import SweepOutcome, run_sweep
from tuner.sweepdir import RECORD_FILE, read_metrics

pytestmark = pytest.mark.usefixtures("ray_session")


def _trial_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir())


# bohb's real sweep is tests/test_bohb.py::test_a_bohb_sweep_trains_its_best_to_max_epochs,
# which makes these checks of it too (one sweep fewer); cmaes, gp and nsga2 share one sweep,
# resume and extend in tests/test_algorithm_contract.py (the simulated contract covers the rest).
@pytest.mark.parametrize("name", ["grid", "random", "optuna"])
def test_every_algorithm_runs_debug_to_completion(name: str, tmp_path: Path) -> None:
    cfg = debug_config(tmp_path, search__algorithm=name, search__num_samples=5)
    check_completed(run_sweep(cfg), cfg, name)


def check_completed(out: SweepOutcome, cfg: SweepConfig, name: str) -> None:
    """A sweep of `name` on debug.yaml completed, and its summary, Tune's own records and
    TensorBoard agree on every trial."""
    s = out.summary
    assert out.exit_code == 0, s
    assert s["status"] == "completed" and s["algorithm"] == name
    assert len(s["trials"]) == cfg.expected_trials()
    assert all(t["status"] == "TERMINATED" and t["failure"] is None for t in s["trials"])
    # The best is the trial with the highest val_acc any epoch reached.
    top = max(s["trials"], key=lambda t: t["best_value"])
    assert s["best"]["trial_id"] == top["trial_id"]
    assert s["best"]["metrics"]["val_acc"] == top["best_value"]
    sweep_dir = Path(out.sweep_dir)
    assert json.loads((sweep_dir / "summary.json").read_text()) == json.loads(json.dumps(s, default=str))
    assert (sweep_dir / "sweep.yaml").is_file()
    _summary_matches_tune(sweep_dir, s, cfg.schedule.max_epochs)
    _tensorboard_has_every_trial(sweep_dir, s, cfg.schedule.max_epochs)


def _tune_results(trial_dir: Path) -> list[dict]:
    """What Ray Tune itself recorded for a trial (its result.json, one line per report)."""
    return [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line]


def _summary_matches_tune(sweep_dir: Path, s: dict, max_epochs: int) -> None:
    """Every trial's last_metrics and epochs are the last result Tune recorded for it."""
    for t in s["trials"]:
        rows = _tune_results(sweep_dir / t["trial_id"])
        assert rows, t["trial_id"]
        last = rows[-1]
        assert t["epochs"] == last["epoch"]
        for key in ("val_acc", "val_loss", "train_loss", "samples_per_s", "world_size"):
            assert t["last_metrics"][key] == last[key]
        assert t["best_value"] == max(r["val_acc"] for r in rows)
        assert t["stopped_early"] == (last["epoch"] < max_epochs)
        assert {k: t["config"][k] for k in ("lr", "optimizer", "width")} == {
            k: last["config"][k] for k in ("lr", "optimizer", "width")
        }


def _tensorboard_has_every_trial(sweep_dir: Path, s: dict, max_epochs: int) -> None:
    root = hparams(sweep_dir)
    exp = root["experiment"]
    assert {h.name for h in exp.hparam_infos} >= {"lr", "optimizer", "width", "depth"}
    assert "val_acc" in {m.name.tag for m in exp.metric_infos}
    for t in s["trials"]:
        run = sweep_dir / t["trial_id"]
        sc = scalars(run)
        for tag in ("val_acc", "val_loss", "train_loss", "lr", "samples_per_s"):
            assert len(sc[tag]) == t["epochs"], (t["trial_id"], tag)
        assert sc["val_acc"][-1] == pytest.approx(t["last_metrics"]["val_acc"], rel=1e-6)
        hp = hparams(run)
        start = hp["session_start"].hparams
        assert start["optimizer"].string_value == t["config"]["optimizer"]
        assert start["lr"].number_value == pytest.approx(t["config"]["lr"])
        assert hp["session_end"].status == api_pb2.STATUS_SUCCESS


def test_ddp_trials_run_two_workers_and_each_next_trial_keeps_them(tmp_path: Path) -> None:
    # 2 workers on the 2 CPUs: one trial at a time, each on the ranks the trial before left
    # (Tune reuses the trial actor), after a trial that ran to its end or one ASHA stopped
    # (lr 1e-5 learns nothing). The evaluation batch size changes no training, so the two
    # trials of an lr must train exactly alike, the first of them on fresh processes.
    cfg = debug_config(
        tmp_path,
        name="ddp",
        search__algorithm="grid",
        search__params={
            "lr": {"type": "choice", "values": [0.05, 1e-5]},
            "eval_batch_size": {"type": "choice", "values": [64, 128]},
            "optimizer": "adam",
            "width": 16,
            "depth": 1,
        },
        resources__workers_per_trial=2,
        schedule__max_epochs=30,
        schedule__grace_epochs=1,
        schedule__early_stopping=True,
        training__batch_size=64,
    )
    out = run_sweep(cfg)
    assert out.exit_code == 0, out.summary
    sweep = Path(out.sweep_dir)
    record = lambda t: json.loads((sweep / t["trial_id"] / RECORD_FILE).read_text())  # noqa: E731
    trials = sorted(out.summary["trials"], key=lambda t: record(t)["started"])
    losses: dict[float, list[list[float]]] = {0.05: [], 1e-5: []}
    ranks = []
    for trial in trials:
        run = sweep / trial["trial_id"]
        assert trial["last_metrics"]["world_size"] == 2
        rows = _tune_results(run)
        losses[trial["config"]["lr"]].append([r["train_loss"] for r in rows])
        # Rank 0's own journal ends where Tune stopped the trial: no rank trained on.
        assert [r["epoch"] for r in read_metrics(str(run))] == [r["epoch"] for r in rows]
        if trial["config"]["lr"] == 1e-5:
            assert trial["stopped_early"], trial
            continue
        assert trial["epochs"] == 30 and trial["last_metrics"]["val_acc"] > 0.4
        # Workers are the trial actor's own (no Ray Train): rank 0 keeps the checkpoints in
        # the trial's directory, as a 1-worker trial does.
        assert max(p.name for p in run.glob("checkpoint_e*.pt")) == "checkpoint_e000030.pt"
        assert not (run / "train").exists()
        assert len(scalars(run)["val_acc"]) == 30  # rank 0 only: one value per epoch
        (line,) = [x for x in (run / "trial.log").read_text().splitlines() if " ranks: processes " in x]
        ranks.append(line.split(" ranks: processes ")[1])
    for lr, (first, second) in losses.items():
        common = min(len(first), len(second))
        assert common >= 1 and first[:common] == second[:common], lr
    for trial in trials[1:]:
        log = (sweep / trial["trial_id"] / "trial.log").read_text()
        assert "(kept from the actor's last trial)" in log, trial["trial_id"]
    pids = ranks[0].removesuffix(" (kept from the actor's last trial)")
    assert all(r.startswith(pids) for r in ranks)
    assert_resources_returned()


def test_cli_sweep_end_to_end_and_refuses_to_overwrite(cli_sweep: CliSweep) -> None:
    first, sweep_dir = cli_sweep.run, cli_sweep.sweep_dir
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"results: {sweep_dir}" in first.stdout
    assert "best: trial" in first.stdout
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert len(summary["trials"]) == 3 and all(t["epochs"] == 1 for t in summary["trials"])  # --max-epochs 1
    before = sorted(p.name for p in sweep_dir.rglob("*"))
    again = cli(*cli_sweep.args)
    assert again.returncode == 2
    assert "already holds a sweep" in again.stderr and "tuner resume" in again.stderr
    assert sorted(p.name for p in sweep_dir.rglob("*")) == before  # nothing touched


def test_impossible_gpu_request_is_refused_fast(tmp_path: Path) -> None:
    # (Fast: refused, not left pending for a GPU that never comes; before anything is written.)
    out = cli("sweep", str(DEBUG), "--output", str(tmp_path), "--set", "resources.gpus_per_worker=1")
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: resources.gpus_per_worker: asks for 1 GPU per worker")
    assert "the cluster has no GPU" in line
    assert not (tmp_path / "debug").exists()  # refused before anything was written
