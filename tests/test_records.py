"""Damaged records of a sweep: read around, never dropped in silence.

A trial whose tuner_trial.json is damaged is read from Tune's params.json and continued by
`resume` in its own directory; a damaged newest checkpoint gives way to the one before it.
Each is said in one line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DEBUG, ROOT, cli
from tuner.results import records
from tuner.sweepdir import METRICS_FILE, RECORD_FILE, read_metrics, read_summary
from tuner.trial.frame.checkpoint import DirCheckpoints

EPOCHS = 12


def _interrupted_sweep(tmp_path: Path) -> Path:
    """Two slow trials side by side, stopped with Ctrl-C once both have 3+ checkpoints."""
    args = [
        sys.executable, "-m", "tuner", "sweep", str(DEBUG), "--output", str(tmp_path), "--name", "rec",
        "--algorithm", "grid", "--max-epochs", str(EPOCHS),
        "--set", "task.model=tests.chaos:slow", "--set", "schedule.early_stopping=false",
        "--set", "search.params={lr: 0.05, optimizer: adam, depth: 1, step_sleep_s: 0.04, "
        "width: {type: grid, values: [8, 16]}}",
    ]  # fmt: skip
    sweep = tmp_path / "rec"
    with open(tmp_path / "driver.log", "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 240
        while time.time() < deadline:
            epochs = [DirCheckpoints(str(d)).latest_epoch() or 0 for d in sweep.glob("*/") if d.is_dir()]
            if len(epochs) == 2 and min(epochs) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (tmp_path / "driver.log").read_text()
    return sweep


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")  # the resume runs in this process, on the session's Ray
def test_resume_continues_trials_with_a_damaged_record_or_newest_checkpoint(tmp_path: Path) -> None:
    sweep = _interrupted_sweep(tmp_path)
    a, b = sorted(p.parent for p in sweep.glob(f"*/{RECORD_FILE}"))
    at_a = DirCheckpoints(str(a)).latest_epoch()
    newest_b = DirCheckpoints(str(b)).latest_epoch()
    assert at_a and newest_b and max(at_a, newest_b) < EPOCHS, "both were caught mid-way"
    (a / RECORD_FILE).write_text("[1, 2]")  # valid JSON, not a record
    ckpt = Path(DirCheckpoints(str(b)).path(newest_b))
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])  # cut short

    run = cli("resume", str(sweep), on_session=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    warned = [ln for ln in run.stderr.splitlines() if RECORD_FILE in ln]
    assert len(warned) == 1 and "params.json" in warned[0] and str(a) in warned[0], run.stderr
    said = f"unreadable checkpoint checkpoint_e{newest_b:06d}.pt"
    assert f"{said} (" in run.stdout and f"resumed from checkpoint_e{newest_b - 1:06d}.pt" in run.stdout

    summary = read_summary(str(sweep))
    assert summary["status"] == "completed" and len(summary["trials"]) == 2  # no replacement trial
    assert {t["trial_id"] for t in summary["trials"]} == {a.name, b.name}
    # The live lines name the trials as summary.json does, not by their new Tune ids (issue 26).
    named = set(re.findall(r"\[tuner\] trial ([0-9a-f_]+)", run.stdout))
    assert named == {a.name, b.name}, run.stdout
    assert all(t["epochs"] == EPOCHS and t["status"] == "TERMINATED" for t in summary["trials"])
    # Each continued from its own work: not from epoch 0, and no epoch missing or twice.
    assert f"resumed at epoch {at_a} " in (a / "trial.log").read_text()
    assert f"resumed at epoch {newest_b - 1} " in (b / "trial.log").read_text()
    for d in (a, b):
        assert [r["epoch"] for r in read_metrics(str(d))] == list(range(1, EPOCHS + 1))


def test_an_older_summary_with_bare_nan_still_reads(tmp_path: Path) -> None:
    # summary.json files written before issue 26 hold bare NaN/Infinity: still read.
    (tmp_path / "summary.json").write_text('{"status": "completed", "best": null, "x": [NaN, -Infinity]}')
    summary = read_summary(str(tmp_path))
    assert summary is not None and summary["status"] == "completed" and summary["x"][1] == float("-inf")


def test_records_of_the_wrong_shape_are_read_around(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Valid JSON of the wrong type in tuner_trial.json or metrics.jsonl: no traceback."""
    good, odd, stray = tmp_path / "good", tmp_path / "odd", tmp_path / "stray"
    for d in (good, odd, stray):
        d.mkdir()
    config = {"lr": 0.1}
    (good / RECORD_FILE).write_text(json.dumps({"trial_id": "good", "config": config, "started": "x"}))
    rows = [{"epoch": 1, "val_acc": 0.5, "epoch_time_s": "slow"}, [1], "2", 3, {"epoch": "x"}, None]
    (good / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (odd / RECORD_FILE).write_text('"a string"')
    (odd / "params.json").write_text(json.dumps(config))
    (stray / RECORD_FILE).write_text("{}")  # a record with no config at all
    (stray / METRICS_FILE).write_text('{"epoch": 1, "failure": 7}\n')
    found = {os.path.basename(r.path): r for r in records(str(tmp_path), "val_acc", "max", 5, ["lr"])}
    assert found["good"].epochs == 1 and found["good"].best_value == 0.5 and found["good"].time_s == 0
    assert found["odd"].config == config and found["odd"].status == "RUNNING"
    assert found["stray"].failure == "7" and found["stray"].config == {}
    err = capsys.readouterr().err
    assert f"{odd / RECORD_FILE} is not a record (a JSON str)" in err
