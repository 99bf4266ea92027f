"""No training script outlives its sweep, and a trial's files have one writer (issue 26).

A script in a long epoch that prints nothing (so no broken pipe can end it) is gone soon after
its driver is killed with -9 or stopped with SIGTERM, at the default concurrency. Ray SIGKILLs
a worker's direct children first, so this holds only if the supervisor's death is enough.
And `resume` while an earlier run of a trial's script is still alive: that run is stopped when
this machine knows it, and its reports never reach the trial either way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ROOT, kill_9_when, resumed_to_the_end
from tests.test_command import SCRIPT, _alive, _none_left, _raw, _scripts_of
from tuner.sweepdir import SCRIPT_CHECKPOINTS, SCRIPT_RUN, read_metrics


def _mid_epoch(sweep: Path) -> bool:
    """Both trials' scripts are running, each past its first epoch (a checkpoint to resume)."""
    started = [t for t in sweep.glob("*/") if (t / "trained.txt").exists()]
    return len(started) == 2 and len(_scripts_of(sweep)) >= 2


def _silent_sweep(tmp_path: Path, name: str) -> dict[str, Any]:
    raw = _raw(tmp_path, name=name)
    raw["search"]["num_samples"] = 2
    raw["search"]["params"]["sleep"] = 5.0  # a long epoch, in which the script prints nothing
    raw["schedule"] = {"max_epochs": 3, "early_stopping": False}
    return raw


def test_the_supervisor_killed_with_9_ends_the_script_tree(tmp_path: Path) -> None:
    """What Ray does to a worker's children: SIGKILL to the supervisor (the actor lives on)."""
    from tuner.trial.script.process import SUPERVISOR

    pids, record = tmp_path / "pids", tmp_path / "run.json"
    script = (
        "import os, subprocess, time; "
        "w = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{w.pid}}'); time.sleep(300)"
    )
    supervisor = subprocess.Popen(
        [sys.executable, SUPERVISOR, str(os.getpid()), "2", "--record", str(record), "--",
         sys.executable, "-c", script],
    )  # fmt: skip
    deadline = time.time() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.time() < deadline:
        time.sleep(0.05)
    started = [int(p) for p in pids.read_text().split()]
    run = json.loads(record.read_text())
    assert run["host"] == socket.gethostname() and run["script"][0] == started[0]
    assert len(_alive(started)) == 2
    supervisor.kill()
    supervisor.wait()
    deadline = time.time() + 15
    while _alive(started) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(started)


@pytest.mark.usefixtures("ray_session")
def test_a_script_does_not_outlive_its_actor_killed_by_ray(tmp_path: Path) -> None:
    """Ray kills an exiting worker's direct children with -9 (the supervisor), then the worker."""
    import ray

    @ray.remote(num_cpus=0)
    class Actor:
        def start(self, argv: list[str], env: dict[str, str]) -> int:
            import logging

            from tuner.trial.script.process import ScriptProcess

            self.proc = ScriptProcess(argv, str(ROOT), env, str(tmp_path / "r.jsonl"), logging.getLogger("t"))
            return self.proc.proc.pid

    actor = Actor.remote()
    env = {**os.environ, "TUNER_TRIAL_DIR": str(tmp_path)}
    argv = [sys.executable, SCRIPT, "--kind", "api", "--sleep", "120"]  # silent for 2 min
    ray.get(actor.start.remote(argv, env))
    deadline = time.time() + 60
    while not (tmp_path / "pids.txt").exists() and time.time() < deadline:
        time.sleep(0.1)
    (script,) = [int(p) for p in (tmp_path / "pids.txt").read_text().split()]
    assert _alive([script])
    ray.kill(actor)
    deadline = time.time() + 30
    while _alive([script]) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive([script]), "the script outlived its actor"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_silent_script_does_not_outlive_its_driver(tmp_path: Path, sig: int) -> None:
    """kill -9 (nothing of the driver runs) and SIGTERM (what `ray job stop` and a scheduler's
    preemption send)."""
    raw = _silent_sweep(tmp_path, f"orphan-{int(sig)}")
    # Stopped in its 2nd epoch; a script left running would train 10 more of 5 s, past the
    # 30 s the check waits (with 3, an orphan would have ended by itself in time, and the
    # check could not fail: so the kill -9 half of the resume test below proves nothing alone).
    raw["schedule"]["max_epochs"] = 12
    sweep = kill_9_when(raw, tmp_path, _mid_epoch, sig=sig)
    if sig == signal.SIGTERM:
        assert "status interrupted" in (tmp_path / "driver.log").read_text()
    _no_script_left(sweep)


def _no_script_left(sweep: Path) -> None:
    """Both trials' scripts (each ran once: two pids) have ended, and nothing of theirs is left."""
    pids = [p for d in sweep.glob("*/pids.txt") for p in map(int, d.read_text().split())]
    assert len(pids) == 2
    assert _none_left(sweep, 30), f"a script outlived the driver: {[p.pid for p in _scripts_of(sweep)]}"
    assert not _alive(pids)


def _stray(trial: Path, report: str) -> subprocess.Popen:
    """A run of the trial's script that outlived it: reports epochs quickly into `report`."""
    env = {
        **os.environ,
        "TUNER_TRIAL_DIR": str(trial),
        "TUNER_REPORT_FILE": str(trial / report),
        "TUNER_CHECKPOINT_DIR": str(trial / SCRIPT_CHECKPOINTS),
    }
    return subprocess.Popen(
        [sys.executable, SCRIPT, "--kind", "api", "--epochs", "1000", "--sleep", "0.2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.usefixtures("ray_session")  # the resume runs on it
def test_resume_beside_an_earlier_run_of_a_script_keeps_one_writer(tmp_path: Path) -> None:
    """The driver killed with -9 while both scripts are silent mid-epoch: neither outlives it.
    Then a resume beside an earlier run of each trial's script, one this machine knows of."""
    raw = _silent_sweep(tmp_path, "fenced")
    raw["search"]["params"]["sleep"] = 0.5
    raw["schedule"]["max_epochs"] = 5
    go = tmp_path / "go"  # each script waits after its second epoch until the resume (not before:
    raw["task"]["command"] = [*raw["task"]["command"], "--hold", str(go)]  # a slow start is no race)

    def both_mid_way(sweep: Path) -> bool:  # each has an epoch (and its checkpoint), and more to go
        epochs = [len(read_metrics(str(t))) for t in sweep.glob("*/") if (t / "trained.txt").exists()]
        return len(epochs) == 2 and all(1 <= n < 4 for n in epochs) and len(_scripts_of(sweep)) >= 2

    sweep = kill_9_when(raw, tmp_path, both_mid_way)
    go.touch()
    _no_script_left(sweep)
    known, unknown = sorted(t for t in sweep.glob("*/") if (t / "trained.txt").exists())
    assert all(len(read_metrics(str(t))) < 5 for t in (known, unknown))  # both to be resumed
    # One this machine ran (its supervisor's record names it), one it cannot see (another
    # machine's, say): both keep reporting epochs, into the report files of their runs.
    recorded = _stray(known, "reports-0000aaaa.jsonl")
    p = psutil.Process(recorded.pid)
    (known / SCRIPT_RUN).write_text(
        json.dumps({"host": socket.gethostname(), "script": [p.pid, p.create_time()]})
    )
    hidden = _stray(unknown, "reports-1111bbbb.jsonl")
    try:
        time.sleep(1.0)  # both are writing
        summary = resumed_to_the_end(sweep, 2)
        assert recorded.poll() is not None, "the earlier run this machine knew of was not stopped"
        assert hidden.poll() is None  # (it never knew: its reports were simply not read)
        for t in summary["trials"]:
            rows = read_metrics(str(sweep / t["trial_id"]))
            assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5], (t["trial_id"], rows)
            assert t["status"] == "TERMINATED" and t["failure"] is None
        log = (known / "trial.log").read_text()
        assert (
            f"an earlier run of this trial's script is still running (pids [{recorded.pid}]): stopped" in log
        )
    finally:
        for proc in (recorded, hidden):
            proc.kill()
            proc.wait()
