"""Interrupted sweeps and `tuner resume`: kill -9 or Ctrl-C the driver, resume, lose nothing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import DEBUG, ROOT, cli, gone, marked, processes_left, run_cli, unheld
from tests.terminal import CTRL_Z, Terminal
from tuner.cluster._ray_internals import FALLBACKS_ENV
from tuner.search.algorithms import random_configs
from tuner.search.plan import key
from tuner.space.params import Fixed
from tuner.sweepdir import read_config, read_metrics
from tuner.trial.frame.checkpoint import DirCheckpoints

pytestmark = pytest.mark.slow
SAMPLES, EPOCHS = 8, 8
CTRL_C_SAMPLES = 4  # caught with one finished, one mid-way and the rest to start: each kind resumed


def _start_args(tmp_path: Path, algorithm: str, samples: int = SAMPLES) -> list[str]:
    args = [
        "sweep", str(DEBUG), "--output", str(tmp_path),
        "--algorithm", algorithm, "--num-samples", str(samples), "--max-epochs", str(EPOCHS),
        "--set", "training.batch_size=16",  # slower epochs: trials are caught mid-way
    ]  # fmt: skip
    if algorithm != "bohb":  # every trial runs long enough to be interrupted with checkpoints
        args += ["--set", "schedule.early_stopping=false"]
    return args


def _start(
    tmp_path: Path, algorithm: str, env: Optional[dict] = None, samples: int = SAMPLES
) -> subprocess.Popen:
    args = [sys.executable, "-m", "tuner", *_start_args(tmp_path, algorithm, samples)]
    log = open(tmp_path / "driver.log", "w")
    env = {**os.environ, **(env or {})}
    return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def _trials(sweep: Path) -> dict[str, dict]:
    out = {}
    for rec in sweep.glob("*/tuner_trial.json"):
        try:
            out[rec.parent.name] = json.loads(rec.read_text())
        except ValueError:  # being replaced right now
            continue
    return out


def _midway(sweep: Path, trial: str, record: dict) -> bool:
    """Started, not ended, and not yet through all its epochs (a trial killed after its last
    epoch but before the driver recorded its end has finished: its journal says so)."""
    return record["status"] == "RUNNING" and (DirCheckpoints(str(sweep / trial)).latest_epoch() or 0) < EPOCHS


def _interrupt_when_caught_midway(proc: subprocess.Popen, sweep: Path, sig: int) -> None:
    """Signal the driver once a trial has finished and another is mid-way with a checkpoint.
    After SIGKILL, wait until every process of the run is gone: its trials live on a moment,
    until Ray ends them, and one that wrote its last epoch after the test's snapshot would be
    finished for the resume but mid-way for the test (seen once in a full tier)."""
    import psutil

    tree: list[int] = []

    def stop() -> None:
        if sig == signal.SIGKILL:
            tree.extend(p.pid for p in psutil.Process(proc.pid).children(recursive=True))
        os.kill(proc.pid, sig)

    _stop_when_caught_midway(proc, sweep, stop)
    if sig == signal.SIGKILL:
        unheld(sweep)
        gone(*tree)


def _stop_when_caught_midway(proc: subprocess.Popen, sweep: Path, stop: Any, epochs: int = 0) -> float:
    """`stop()` once a trial has finished and another is mid-way with a checkpoint (and the
    trials have trained more than `epochs` epochs in all); the seconds from then until the
    command exited."""
    deadline = time.time() + 240
    while time.time() < deadline:
        trials = _trials(sweep)
        if sum(len(read_metrics(str(sweep / t))) for t in trials) <= epochs:
            time.sleep(0.05)
            continue
        finished = [t for t, r in trials.items() if r["status"] != "RUNNING"]
        midway = [
            t
            for t, r in trials.items()
            if _midway(sweep, t, r) and DirCheckpoints(str(sweep / t)).latest_epoch()
        ]
        if finished and midway:
            start = time.monotonic()
            stop()
            proc.wait(timeout=600)  # (a hang guard: the tests bound what they measure themselves)
            return time.monotonic() - start
        assert proc.poll() is None, (sweep.parent / "driver.log").read_text()[-3000:]
        time.sleep(0.02)
    proc.kill()
    pytest.fail("the sweep never had a finished trial and a checkpointed one at once")


def _snapshot(sweep: Path) -> tuple[dict, dict]:
    """(finished trial -> its journal, unfinished trial -> its newest checkpoint epoch)."""
    finished, midway = {}, {}
    for t, r in _trials(sweep).items():
        if _midway(sweep, t, r):
            midway[t] = DirCheckpoints(str(sweep / t)).latest_epoch()
        else:
            finished[t] = read_metrics(str(sweep / t))
    return finished, midway


def _check_resumed(sweep: Path, finished: dict, midway: dict, samples: int = SAMPLES) -> dict:
    summary = json.loads((sweep / "summary.json").read_text())
    ids = [t["trial_id"] for t in summary["trials"]]
    assert summary["status"] == "completed" and len(ids) == len(set(ids)) == samples, summary["counts"]
    for t, journal in finished.items():  # kept as they were: not rerun, not changed
        assert t in ids and read_metrics(str(sweep / t)) == journal
    for t, epoch in midway.items():
        if epoch:  # continued from its checkpoint, not from epoch 0
            log = (sweep / t / "trial.log").read_text()
            resumed = [int(e) for e in re.findall(r"resumed at epoch (\d+)", log)]
            assert resumed and min(resumed) >= epoch, (t, epoch, log)
        epochs = [r["epoch"] for r in read_metrics(str(sweep / t))]
        assert epochs == list(range(1, len(epochs) + 1)), (t, epochs)  # one line per epoch
    return summary


@pytest.mark.usefixtures("ray_session")  # the resume runs in this process, on the session's Ray
def test_kill_9_then_resume_loses_nothing(tmp_path: Path) -> None:
    """BOHB: its rungs and model rebuilt from a driver killed mid-way. (Every algorithm's plan
    rebuilt from earlier trials: test_algorithms.py::test_resumed_plan_runs_exactly_what_is_left;
    on Ray, after Ctrl-C: test_trust.py::test_resumed_sweep_runs_what_an_uninterrupted_one_runs.)"""
    sweep = tmp_path / "debug"
    _interrupt_when_caught_midway(_start(tmp_path, "bohb"), sweep, signal.SIGKILL)
    finished, midway = _snapshot(sweep)
    out = cli("resume", str(sweep), on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # A trial caught mid-way that ASHA's rungs stop as the sweep resumes ends there, finished
    # (sweep.py, _stopped_at_resume); whether one is depends on where the kill caught them.
    judged = set(re.findall(r"trial (\w+) ends at epoch \d+, judged as it resumes", out.stdout))
    assert judged <= set(midway), (judged, midway)
    ended = len(finished) + len(judged)
    assert re.search(
        rf"resuming debug: {ended} trials finished, {len(midway) - len(judged)} to continue", out.stdout
    )
    _check_resumed(sweep, finished, {t: e for t, e in midway.items() if t not in judged})


def test_ctrl_c_stops_gracefully_then_resume_with_rays_private_api_unused(tmp_path: Path) -> None:
    """Ctrl-C, resume, resume again, extend: with TUNER_RAY_FALLBACKS=1, as on a Ray other than
    the one _ray_internals was checked against (Ray started plainly, Tune imported in order,
    Ray shut down gracefully). Ctrl-C with the shortcuts taken: tests/test_records.py,
    tests/test_board.py, tests/test_trust.py (in-process)."""
    sweep = tmp_path / "debug"
    mark = uuid.uuid4().hex
    ray_tmp = Path("/tmp") / f"tn{mark[:8]}"  # short: Ray's socket paths must fit 107 bytes
    env = {FALLBACKS_ENV: "1", "TUNER_TEST_MARK": mark, "RAY_TMPDIR": str(ray_tmp)}
    try:
        proc = _start(tmp_path, "random", env, samples=CTRL_C_SAMPLES)
        _interrupt_when_caught_midway(proc, sweep, signal.SIGINT)
        assert proc.returncode == 130
        log = (tmp_path / "driver.log").read_text()
        assert f"continue with: python -m tuner resume {sweep}" in log
        assert "[tuner] stopping: trials end at their next report" in log and "Tuner.restore" not in log
        assert json.loads((sweep / "summary.json").read_text())["status"] == "interrupted"
        # Started plainly: Ray's API server (dashboard.log) before its raylet, the other way
        # round from the shortcut's (tests/test_local_ray.py).
        logs = next(ray_tmp.glob("*/ray/session_*/logs"))
        assert _first_time(logs / "dashboard.log") < _first_time(logs / "raylet.out")
        finished, midway = _snapshot(sweep)
        out = run_cli("resume", str(sweep), timeout=600, env=env)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        summary = _check_resumed(sweep, finished, midway, samples=CTRL_C_SAMPLES)
        assert summary["best"] is not None
        # Extend after resume: two more trials, the next two of the planned random sequence,
        # the four before kept as they were.
        journals = {t["trial_id"]: read_metrics(str(sweep / t["trial_id"])) for t in summary["trials"]}
        grown = run_cli("extend", str(sweep), "--num-samples", "2", timeout=600, env=env)
        assert grown.returncode == 0, grown.stdout[-2000:] + grown.stderr[-2000:]
        assert not processes_left(mark), "shut down gracefully, Ray left nothing behind"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    after = json.loads((sweep / "summary.json").read_text())
    assert after["status"] == "completed" and len(after["trials"]) == CTRL_C_SAMPLES + 2
    assert all(read_metrics(str(sweep / t)) == j for t, j in journals.items())
    cfg = read_config(str(sweep))
    searched = [k for k, p in cfg.search.params.items() if not isinstance(p, Fixed)]
    planned = random_configs(cfg.hyperparameters(), CTRL_C_SAMPLES + 2, cfg.search.seed)
    new = [t["config"] for t in after["trials"] if t["trial_id"] not in journals]
    assert sorted(key({k: c[k] for k in searched}) for c in new) == sorted(
        key({k: c[k] for k in searched}) for c in planned[CTRL_C_SAMPLES:]
    )
    # Resuming a finished sweep says so and changes nothing.
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob("*") if p.is_file()}
    again = cli("resume", str(sweep))
    assert again.returncode == 0 and "nothing to resume" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("*") if p.is_file()} == before


def _first_time(log: Path) -> str:
    """The time stamp of a Ray log's first line ("2026-11-25 01:05:19,365"), either format."""
    return log.read_text().splitlines()[0].lstrip("[")[:23]


def test_resume_refuses_what_is_not_a_sweep(tmp_path: Path) -> None:
    out = cli("resume", str(tmp_path))
    assert out.returncode == 2 and "is not a sweep directory" in out.stderr and "Traceback" not in out.stderr


def _ctrl_z_then_fg(term: Terminal, mark: str, within_s: float) -> None:
    """Ctrl-Z (SIGTSTP for the terminal's foreground group: the command's) stops every process
    of the sweep: its driver, that driver's Ray and the trials in the groups Ray gives them;
    `fg` (SIGCONT for the group) has them all go on. Each within `within_s` seconds."""
    import psutil

    def states() -> dict[int, str]:
        out = {}
        for p in [*marked(mark), *_every_process_of(term.proc)]:  # (Ray's agents drop the mark)
            with contextlib.suppress(psutil.Error):
                out[p.pid] = f"{p.name()} {p.status()} {os.getpgid(p.pid)}"
        out.pop(term.proc.pid)  # (the shell: no job of its own)
        return out

    for press, stopped in ((lambda: term.type(CTRL_Z), True), (term.fg, False)):
        press()
        deadline = time.monotonic() + within_s  # (a hang guard)
        while wrong := {p: s for p, s in states().items() if (psutil.STATUS_STOPPED in s) != stopped}:
            assert time.monotonic() < deadline, (stopped, wrong)
            time.sleep(0.05)
        assert len(states()) > 3, states()  # the command, its driver and the driver's Ray


class _Webhook:
    """notify.webhook's server: what it was sent (`close`)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        got: list[dict[str, Any]] = []

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None: ...

        self.got, self.server = got, ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> list[dict[str, Any]]:
        self.server.shutdown()
        return self.got


def _every_process_of(proc: subprocess.Popen) -> list:
    import psutil

    top = psutil.Process(proc.pid)
    return [top, *top.children(recursive=True)]


@pytest.mark.usefixtures("ray_session")  # the last resume runs in this process, on the session's Ray
def test_ctrl_z_a_closed_terminal_or_scancel_then_resume_loses_nothing(tmp_path: Path) -> None:
    """A sweep run from a shell on a terminal: Ctrl-Z and `fg` stop the whole sweep and have it
    go on. Closing the terminal signals the command's process group (SIGHUP, as `kill -TERM
    -PGID` would SIGTERM), and what the sweep writes after goes nowhere; SLURM's scancel
    signals every process of the job, its Ray's included. The first stops gracefully (the
    driver's Ray is in a group of its own); after the second the sweep's Ray is gone, and the
    command notices, writes summary.json (interrupted) from the trials' records and exits 130:
    within a few times what it took to start the sweep (Ray 2.60 left the driver to exit 1 at once, or after
    60 s without its GCS). notify.webhook hears each time that it was interrupted. `resume`
    then continues each time, losing nothing."""
    sweep = tmp_path / "debug"
    mark = uuid.uuid4().hex
    env = {**os.environ, "TUNER_TEST_MARK": mark}

    def start(*words: str) -> subprocess.Popen:
        log = open(tmp_path / "driver.log", "w")
        return subprocess.Popen(
            [sys.executable, "-m", "tuner", *words], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,  # a process group of its own, as a job's
        )  # fmt: skip

    began = time.monotonic()
    hook = _Webhook()
    first = [sys.executable, "-m", "tuner", *_start_args(tmp_path, "random", CTRL_C_SAMPLES)]
    term = Terminal([*first, "--notify", hook.url], tmp_path / "driver.log", cwd=ROOT, env=env)
    proc = term.proc
    while not any(read_metrics(str(t)) for t in sweep.glob("*/") if t.is_dir()):
        assert proc.poll() is None and time.monotonic() - began < 240, (tmp_path / "driver.log").read_text()
        time.sleep(0.05)
    startup = time.monotonic() - began  # launch to the first epoch: imports, Ray up, a trial trained
    _ctrl_z_then_fg(term, mark, startup)  # (stopping takes less than starting)
    _stop_when_caught_midway(proc, sweep, term.hang_up)
    log = (tmp_path / "driver.log").read_text()  # (what it showed until the terminal closed)
    assert proc.returncode == 130, log[-3000:]
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    # (its lines after the hangup failed: the driver ended with OSError, told "failed")
    assert [(n["status"], n["counts"]) for n in hook.close()] == [("interrupted", summary["counts"])]
    assert not processes_left(mark)
    finished, midway = _snapshot(sweep)

    hook = _Webhook()
    proc = start("resume", str(sweep), "--notify", hook.url)

    def scancel() -> None:
        for p in _every_process_of(proc):
            with contextlib.suppress(Exception):
                p.send_signal(signal.SIGTERM)

    trained = sum(len(read_metrics(str(t))) for t in sweep.glob("*/") if t.is_dir())
    took = _stop_when_caught_midway(proc, sweep, scancel, epochs=trained)  # (once it trains again)
    log = (tmp_path / "driver.log").read_text()
    assert proc.returncode == 130, log[-3000:]
    # Ray 2.60's driver waited 60 s for its GCS: far above a few start-ups (both measured here,
    # but at different moments: a load that changes between them must not fail the test).
    assert took < 3 * startup, (took, startup, log[-3000:])
    assert "status interrupted" in log and f"continue with: python -m tuner resume {sweep}" in log
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    # notify.webhook hears how it ended, as from a driver that ended itself (the watcher wrote it)
    assert [(n["status"], n["counts"]) for n in hook.close()] == [("interrupted", summary["counts"])]
    assert not processes_left(mark)
    more_finished, more_midway = _snapshot(sweep)
    assert all(more_finished[t] == journal for t, journal in finished.items())  # kept as they were
    # (a trial caught mid-way both times: it continued from its first checkpoint, then its second)
    midway = {t: midway.get(t, epoch) for t, epoch in more_midway.items()}
    finished = more_finished

    out = cli("resume", str(sweep), on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    _check_resumed(sweep, finished, midway, samples=CTRL_C_SAMPLES)
