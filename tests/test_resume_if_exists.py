"""`tuner sweep FILE --resume-if-exists`, the command of a job that may run again (a retried
RayJob, a requeued batch job): new, interrupted, finished, and a different sweep (refused)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import DEBUG, ROOT
from tuner.cli import main
from tuner.cluster import submit
from tuner.config import load_sweep
from tuner.driver.sweep import sweep_or_resume
from tuner.sweepdir import difference

TRIALS = 4


def _sweep_file(tmp_path: Path) -> Path:
    """debug.yaml, random search, whose second trial model interrupts the sweep (Ctrl-C to
    this process) once: tests/interrupt.py."""
    (tmp_path / "chaos").mkdir()
    raw = {
        "name": "job",
        "output": str(tmp_path / "runs"),
        "task": {"model": "tests.interrupt:after_builds", "data": "digits"},
        "search": {
            "algorithm": "random",
            "num_samples": TRIALS,
            "params": {
                "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
                "chaos_dir": str(tmp_path / "chaos"),
                "interrupt_at": 2,
                "driver_pid": os.getpid(),
            },
        },
        "schedule": {"max_epochs": 2},
        "resources": {"max_concurrent_trials": 1},  # one at a time: the 2nd build after the 1st ends
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    return path


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_resume_if_exists_starts_continues_finishes_and_refuses_another_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = _sweep_file(tmp_path)
    sweep = tmp_path / "runs" / "job"
    # New: the sweep starts (and is interrupted in its second trial, as a stopped job is).
    first = sweep_or_resume(load_sweep(file))
    assert first.exit_code == 130 and first.summary["status"] == "interrupted"
    done_first = {t["trial_id"]: t for t in first.summary["trials"] if t["status"] == "TERMINATED"}
    assert 1 <= len(done_first) < TRIALS, first.summary["counts"]
    metrics_first = {t: (sweep / t / "metrics.jsonl").read_bytes() for t in done_first}
    # Interrupted: the same command again continues it; the finished trial is kept, not rerun.
    second = sweep_or_resume(load_sweep(file))
    assert second.exit_code == 0 and second.summary["status"] == "completed"
    trials = {t["trial_id"]: t for t in second.summary["trials"]}
    assert len(trials) == TRIALS and all(t["status"] == "TERMINATED" for t in trials.values())
    for trial_id, was in done_first.items():
        assert trials[trial_id] == was
        assert (sweep / trial_id / "metrics.jsonl").read_bytes() == metrics_first[trial_id]
    assert len(list(sweep.glob("*/tuner_trial.json"))) == TRIALS  # no trial started twice
    # Finished: nothing to run, exit 0, nothing written (through the CLI, as a job runs it).
    capsys.readouterr()
    before = _tree(sweep)
    assert main(["sweep", str(file), "--resume-if-exists"]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert _tree(sweep) == before
    # A different sweep in that directory: refused in one line, exit 2, nothing written.
    assert main(["sweep", str(file), "--resume-if-exists", "--num-samples", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a different sweep (search.num_samples: 4 there, 5 here)" in err
    assert _tree(sweep) == before
    # Without the flag an existing sweep is refused, as ever.
    assert main(["sweep", str(file)]) == 2 and "already holds a sweep" in capsys.readouterr().err


def test_difference_names_the_first_field_and_ignores_where_the_sweep_lives() -> None:
    a = {"name": "a", "output": "runs", "search": {"num_samples": 4, "seed": 0}, "task": {"model": "mlp"}}
    assert difference(a, {**a, "name": "b", "output": "/abs/runs"}) is None
    b = {**a, "search": {"num_samples": 4, "seed": 1}}
    assert difference(a, b) == "search.seed: 0 there, 1 here"
    assert difference(a, {**a, "extra": {"x": [1]}}) == 'extra: null there, {"x": [1]} here'


def test_submit_lets_a_retryable_job_target_an_existing_sweep() -> None:
    # `tuner submit FILE -- --resume-if-exists` names a directory that may hold the sweep already.
    args = ["--output", str(ROOT), "--name", "tests"]  # tests/ exists and is no empty directory
    with pytest.raises(Exception, match="already holds a sweep"):
        submit.validate(str(DEBUG), args, ROOT)
    submit.validate(str(DEBUG), [*args, "--resume-if-exists"], ROOT)
