"""failure.fail_fast (issue 26, item 12): a sweep whose first trials all fail with the same
error stops with it in one line, instead of running every trial into it."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import cli
from tuner.sweepdir import SWEEP_RUN

TRAIN = textwrap.dedent(
    """
    def train(config, ctx):
        with open("data.csv") as f:  # forgotten: not in the directory the sweep starts from
            rows = f.read().split()
        for epoch in range(ctx.epoch, ctx.max_epochs):
            ctx.report({"val_loss": config["lr"] * len(rows)})
    """
)
SWEEP = textwrap.dedent(
    """
    name: forgot
    task:
      train: mytrain:train
    metric: val_loss
    direction: min
    search:
      algorithm: random
      num_samples: 8
      params:
        lr: {type: loguniform, low: 1.0e-3, high: 1.0e-1}
    schedule:
      max_epochs: 2
    output: runs
    """
)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")  # the sweep and the resume run on it, from tmp_path
def test_the_first_trials_failing_alike_stop_the_sweep_and_resume_runs_the_rest(tmp_path: Path) -> None:
    # A module name of this test's own: the session's reused trial processes keep what they imported.
    module = f"forgot_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(TRAIN)
    (tmp_path / "sweep.yaml").write_text(SWEEP.replace("mytrain:train", f"{module}:train"))
    done = cli("sweep", "sweep.yaml", cwd=tmp_path, on_session=True)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    said = [ln for ln in done.stdout.splitlines() if ln.startswith("[tuner] failure.fail_fast:")]
    assert len(said) == 1 and "the first 3 trials all failed with FileNotFoundError" in said[0], done.stdout
    assert "No such file or directory: 'data.csv'" in said[0]
    sweep_dir = tmp_path / "runs" / "forgot"
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["status"] == "failed", summary["status"]
    assert summary["error"].startswith("FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'")
    assert summary["counts"]["error"] >= 3 and len(summary["trials"]) < 8, summary["counts"]
    assert "status failed\n" in done.stdout and "stopped: its first trials all failed with" in done.stdout
    # Trials it never started left no directory (Tune makes one as it queues a trial).
    kept = {p.name for p in sweep_dir.iterdir() if p.is_dir()} - {SWEEP_RUN}  # (TensorBoard's sweep run)
    assert kept == {t["trial_id"] for t in summary["trials"]}
    # Fixed, `resume` runs the rest: the failed trials stay as they ended, the others finish.
    (tmp_path / "data.csv").write_text("1 2 3\n")
    again = cli("resume", str(sweep_dir), cwd=tmp_path, on_session=True)
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert len(summary["trials"]) == 8 and summary["status"] == "completed", again.stdout[-3000:]
    assert summary["counts"].get("completed", 0) + summary["counts"].get("stopped early", 0) >= 8 - 4


def _trial(tmp_path: Path, name: str, error: str | None) -> Any:
    path = tmp_path / name
    path.mkdir()
    if error:
        (path / "traceback.txt").write_text(f"Traceback (most recent call last):\n  ...\n{error}\n")
    return SimpleNamespace(trial_id=name, path=str(path))


@pytest.mark.parametrize(
    "endings, stops",
    [
        (["E1", "E1", "E1"], True),
        (["E1", "E1", None, "E1", "E1", "E1"], False),  # a trial that ran: the code can run
        (["E1", "E2", "E1"], False),  # different errors: the configurations' own
        (["E1", "E1"], False),  # not yet
    ],
)
def test_fail_fast_stops_only_when_its_first_trials_all_failed_alike(
    tmp_path: Path, endings: list[str | None], stops: bool
) -> None:
    from tuner.driver.failfast import FailFast

    errors = {
        "E1": "FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'",
        "E2": "ValueError: x",
    }
    watch = FailFast(3)
    for i, ending in enumerate(endings):
        trial = _trial(tmp_path, f"t{i}", errors.get(ending or ""))
        if ending is None:
            watch.on_trial_complete(0, [], trial)
        else:
            watch.on_trial_error(0, [], trial)
    assert watch.stop_all() is stops
    assert FailFast.wanted(0) is None


def test_an_error_naming_the_trial_s_own_directory_is_the_same_error(tmp_path: Path) -> None:
    from tuner.driver.failfast import FailFast

    watch = FailFast(2)
    for name in ("a1", "b2"):
        path = tmp_path / name
        trial = _trial(tmp_path, name, f"OSError: cannot write {path}/scratch/{name}.bin")
        watch.on_trial_error(0, [], trial)
    assert watch.stop_all()


def test_trials_that_timed_out_are_no_error_of_the_code_and_never_make_the_sweep_failed(
    tmp_path: Path,
) -> None:
    """A trial whose watchdog ended it (schedule.trial_timeout) reaches Tune as an error with
    no traceback of ours: three of them used to read as three alike 'unknown error's, stop
    the sweep as failed, and then crash the driver's summary (status failed with no error to
    name). They ran; the sweep goes on; a summary ended 'failed' without an error among its
    trials stands as it is (resume runs the rest)."""
    from tuner.driver.failfast import FailFast
    from tuner.results import FAILED, record, summarize
    from tuner.trial.frame.journal import MetricsLog

    watch = FailFast(3)
    for name in ("t0", "t1", "t2"):
        trial = _trial(tmp_path, name, None)  # Tune's error.txt only: the process was ended
        (Path(trial.path) / "error.txt").write_text("ray.exceptions.ActorDiedError: the actor died\n")
        MetricsLog(trial.path).append({"epoch": 1, "val_loss": 0.5})
        MetricsLog(trial.path).append({"epoch": 1, "val_loss": math.inf, "failure": "timeout"})
        watch.on_trial_error(0, [], trial)
    assert not watch.stop_all()
    trials = [record(str(tmp_path / name), "val_loss", "min", 2, ["lr"]) for name in ("t0", "t1", "t2")]
    assert [r.failure for r in trials] == ["timeout"] * 3
    summary = summarize(
        trials,
        name="x",
        metric="val_loss",
        direction="min",
        algorithm="random",
        expected_trials=8,
        ended=FAILED,
    )
    assert summary["status"] == "interrupted" and "error" not in summary, summary
