"""task.train on real Ray: failures end their own trials, a pausing scheduler (HyperBand)
and a killed driver lose no epoch, the language-model example runs with 2 DDP workers, and
the notebook example runs through the Python API."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.conftest import ROOT, cli, run_cli
from tests.own_loops import _data, hyperband_resumes
from tests.test_own_loop import own
from tuner.config import TrainingSection, parse_sweep
from tuner.sweepdir import read_metrics

pytestmark = pytest.mark.usefixtures("ray_session")


def _trials(out: Any) -> dict[str, dict[str, Any]]:
    """Trials of a finished sweep by their `behave` setting."""
    return {t["config"]["behave"]: t for t in out.summary["trials"]}


def test_failures_in_own_loops_end_their_trials_and_the_others_finish(tmp_path: Path) -> None:
    from tuner.driver.sweep import run_sweep

    schedule = {"max_epochs": 3, "early_stopping": False}
    raw = own("tests.banner_loop:regress", schedule=schedule, output=str(tmp_path))
    raw["search"] = {
        "algorithm": "grid",
        "params": {"behave": {"type": "grid", "values": ["ok", "oom", "nan", "boom", "early"]}, "lr": 0.05},
    }
    out = run_sweep(parse_sweep(raw))
    t = _trials(out)
    assert t["ok"]["status"] == "TERMINATED" and t["ok"]["epochs"] == 3 and t["ok"]["failure"] is None
    assert t["oom"]["failure"] == "oom" and t["oom"]["status"] != "ERROR"
    assert t["nan"]["failure"] == "diverged" and t["nan"]["status"] != "ERROR"
    assert t["boom"]["status"] == "ERROR" and t["boom"]["failure"].startswith("error: ValueError: boom")
    # Its configuration: what ctx applies and the loop reads, no default only tuner's loop reads.
    given = json.loads((Path(out.sweep_dir) / t["ok"]["trial_id"] / "tuner_trial.json").read_text())["config"]
    assert {"batch_size", "amp", "lr", "behave"} <= set(given) and not {"optimizer", "momentum"} & set(given)
    # What the user's module printed when a process first imported it (a library's banner)
    # is in every trial's log, also of trials that reused a process (5 trials, 2 at a time).
    for d in Path(out.sweep_dir).glob("*/trial.log"):
        log = d.read_text()
        assert "out| mylib 1.0: banner printed once per process, at import" in log, (d, log)
        assert "err| mylib: a warning shown once per process" in log, (d, log)
    # A loop that returns before max_epochs stopped itself (its early stopping), not the scheduler.
    assert t["early"]["epochs"] == 2 and t["early"]["stopped_itself"] and not t["early"]["stopped_early"]
    boom_dir = Path(out.sweep_dir) / t["boom"]["trial_id"]
    assert "boom: this configuration fails on purpose" in (boom_dir / "traceback.txt").read_text()
    assert out.summary["best"]["trial_id"] == t["ok"]["trial_id"]
    ok_dir = Path(out.sweep_dir) / t["ok"]["trial_id"]
    assert [r["epoch"] for r in read_metrics(str(ok_dir))] == [1, 2, 3]
    assert list(ok_dir.glob("events.out.tfevents.*")), "TensorBoard scalars of the own loop"
    # Its best epoch's weights are the state's "model" (ctx.state_dict); the model is the user's.
    import tuner
    from tuner.config import ConfigError

    x, y = _data(64, seed=1).tensors  # regress's validation data
    net = tuner.load_best(out.sweep_dir, model=torch.nn.Linear(4, 1))
    with torch.no_grad():
        assert (net(x) - y).pow(2).mean().item() == pytest.approx(
            out.summary["best"]["metrics"]["val_loss"], rel=1e-5
        )
    with pytest.raises(ConfigError, match="task.train"):
        tuner.load_best(out.sweep_dir)
    assert (Path(out.sweep_dir) / "best" / "model.pt").is_file()
    script = cli("export", out.sweep_dir, "--format", "torchscript")
    assert script.returncode == 2 and script.stderr.count("\n") == 1 and "model=YourModel" in script.stderr


def test_a_stopped_trial_that_takes_seconds_to_wind_down_does_not_fail_the_next_in_its_actor(
    tmp_path: Path,
) -> None:
    # ASHA stops trials at their reports; each loop then takes 3 s in its `finally` (a user's
    # loop saving its work). The next trial reuses the actor only once that thread has ended:
    # Tune waits 2 s by default, then failed the next trial ("Could not re-use actor"), which
    # never got a record, and the sweep ended "interrupted" (first seen on an H200, where a
    # packed trial's wind-down took over 2 s). Two trials at a time, the default.
    from tuner.driver.sweep import run_sweep

    raw = own(output=str(tmp_path), schedule={"max_epochs": 3, "grace_epochs": 1, "reduction_factor": 2})
    lrs = [0.1, 0.08, 0.001, 0.0005]  # the last two far behind at every rung: stopped
    raw["search"] = {
        "algorithm": "random",  # (with ASHA; a grid parameter takes each value once)
        "num_samples": len(lrs),
        "params": {"lr": {"type": "grid", "values": lrs}, "behave": "linger", "linger_s": 3.0},
    }
    out = run_sweep(parse_sweep(raw))
    trials = out.summary["trials"]
    assert sorted(t["config"]["lr"] for t in trials) == sorted(lrs)
    assert [t for t in trials if t["status"] == "ERROR"] == []
    assert not list(Path(out.sweep_dir).glob("*/error.txt"))
    assert out.summary["counts"].get("stopped early", 0) >= 1, out.summary["counts"]
    assert out.summary["status"] == "completed"

    # Where the reuse does fail (a user's own TUNE_FUNCTION_THREAD_TIMEOUT_S of 1 s is kept),
    # the trial Tune failed before it started is one of the sweep's, ended in error, and the
    # sweep completes with exit 1, a failed trial (it said "interrupted", exit 130, leaving
    # that trial out).
    path = tmp_path / "linger.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "short"}))
    ran = run_cli("sweep", str(path), env={"TUNE_FUNCTION_THREAD_TIMEOUT_S": "1"})
    assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr[-2000:]
    summary = json.loads((tmp_path / "short" / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == len(lrs)
    failed = [t for t in summary["trials"] if t["status"] == "ERROR"]
    assert failed and all("reset_config" in t["failure"] for t in failed), summary["trials"]
    assert all(t["epochs"] == 0 and t["never_started"] for t in failed)
    assert all("never_started" not in t for t in summary["trials"] if t["status"] != "ERROR")
    assert f"{len(failed)} trial(s) Ray Tune could not start" in ran.stdout
    # None of the user's code ran in those: `resume` runs them, in their own directories,
    # and they train as the same configurations did in the sweep above (where reuse held).
    resumed = cli("resume", str(tmp_path / "short"), on_session=True)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    summary = json.loads((tmp_path / "short" / "summary.json").read_text())
    after = {t["trial_id"]: t for t in summary["trials"]}
    assert len(after) == len(lrs) and all(t["status"] == "TERMINATED" for t in after.values()), after
    first = {t["config"]["lr"]: t for t in trials}
    for t in failed:
        again = after[t["trial_id"]]
        assert "never_started" not in again and again["epochs"] >= 1
        rows = read_metrics(str(tmp_path / "short" / t["trial_id"]))
        same = read_metrics(str(Path(out.sweep_dir) / first[t["config"]["lr"]]["trial_id"]))
        assert rows[0]["val_loss"] == pytest.approx(same[0]["val_loss"], rel=1e-6), (rows[0], same[0])


@pytest.mark.slow
def test_hyperband_pauses_and_resumes_own_loops_without_repeating_an_epoch(tmp_path: Path) -> None:
    from ray import tune

    lrs = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2]
    space = {**TrainingSection().model_dump(), "amp": "off", "batch_size": 64, "behave": "slow"}
    space.update(epoch_s=0.1, lr=tune.grid_search(lrs))
    resumed = hyperband_resumes(tmp_path, space, trial_mode="train", train="tests.own_loops:regress")
    assert resumed >= 1, "HyperBand paused and resumed at least one trial"


LM_TINY = [
    "--set", "search.num_samples=1", "--set", "schedule.max_epochs=2",
    "--set", "search.params.chars=20000", "--set", "search.params.lr=0.003",
    "--set", "search.params.width=64", "--set", "search.params.layers=1",
    "--set", "search.params.block_size=32", "--set", "training.batch_size=32",
]  # fmt: skip


@pytest.mark.slow
def test_language_model_example_trains_with_2_ddp_workers(tmp_path: Path) -> None:
    out = cli(
        "sweep", "search_spaces/char_lm.yaml", "--output", str(tmp_path),
        "--set", "resources.workers_per_trial=2", *LM_TINY,
        cwd=ROOT, on_session=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "char-lm" / "summary.json").read_text())
    (t,) = summary["trials"]
    assert t["status"] == "TERMINATED" and t["epochs"] == 2 and t["failure"] is None
    rows = read_metrics(str(tmp_path / "char-lm" / t["trial_id"]))
    # It learns: guessing uniformly over the text's ~80 characters scores ln(80) = 4.4 nats.
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] and rows[-1]["val_loss"] < 3.6, rows
    # Its workers fit on this node: rank 0 kept the checkpoints, in the trial's directory.
    assert list((tmp_path / "char-lm" / t["trial_id"]).glob("checkpoint_e*.pt"))


def test_notebook_example_runs_the_language_model_from_python(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    import tuner
    from search_spaces.notebook_char_lm import sweep_config

    assert sweep_config().task.train == "search_spaces.char_lm:train"
    params = {"lr": 2e-3, "width": 32, "layers": {"type": "choice", "values": [1, 2]}, "heads": 4}
    params.update(block_size=32, chars=6000)
    tiny = sweep_config(
        output=str(tmp_path),
        search={"algorithm": "random", "num_samples": 2, "params": params},
        schedule={"max_epochs": 2, "grace_epochs": 1},
        resources={"gpus_per_worker": 0},
        training={"batch_size": 32, "amp": "off"},
    )
    out = tuner.run_sweep(tiny)
    assert out.exit_code == 0 and out.summary["status"] == "completed", out.table
    best = out.summary["best"]
    assert best is not None and best["metrics"]["val_loss"] < 4.0
