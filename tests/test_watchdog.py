"""schedule.trial_timeout's watchdog (tuner/trial/frame/watchdog.py), each case in a process of
its own: when the watchdog fires it ends the process, as it ends a hung trial's.

A trial waits inside its report until the sweep's driver has handed it to the scheduler
(milliseconds, unless the driver is busy or stopped, or a scheduler pauses the trial at a
rung, as Tune's synchronous HyperBand does): that wait is no epoch's time, and must not end the
trial as timed out (it used to: the process was ended and the journal given a timeout row). An
epoch that takes longer than the timeout still ends it. The watchdog's clock is the test's
(`Clock`): it moves only when the trial says time passes, and the trial goes on once the
watchdog has looked at it, so neither case depends on how fast the machine is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tuner.sweepdir import read_metrics

TIMEOUT_S = 1.0
HELD_S = 2.5  # longer than TIMEOUT_S, on the watchdog's clock

# guarded() wires the session's report to the watchdog, as in every trial; the session holds
# the trial in its report as a stalled driver (or a pausing scheduler) does.
TRIAL = f"""
import sys, threading, time
from tuner.trial.frame import watchdog
from tuner.trial.frame.harness import guarded
from tuner.trial.frame.session import Session
from tuner.trial.frame.spec import TrialSpec

trial_dir, slow = sys.argv[1], sys.argv[2]


class Clock:
    now, looks = 0.0, 0

    def monotonic(self):
        if threading.current_thread().name == "tuner-watchdog":
            self.looks += 1
        return self.now


clock = watchdog.time = Clock()  # the watchdog's time passes when this trial says so


def passes(seconds):
    clock.now += seconds
    seen = clock.looks
    while clock.looks < seen + 2:  # until the watchdog has looked at the time since
        time.sleep(0.01)


class PausedAtReport(Session):
    def __init__(self):
        self.trial_dir = trial_dir

    def _report(self, metrics, state):
        with self.held():
            if metrics["epoch"] == 1:
                passes({HELD_S})


def body(f):
    for epoch in (1, 2):
        if slow == "epoch" and epoch == 2:
            passes({HELD_S})  # the epoch itself takes too long
        f.session.report({{"epoch": epoch, "val_acc": 0.5}}, None)
        f.watchdog.kick()


spec = TrialSpec(model="", data="", max_epochs=2, metric="val_acc", trial_timeout={TIMEOUT_S})
guarded({{}}, spec, PausedAtReport(), body)
print("trained", flush=True)
"""


@pytest.mark.slow  # two processes importing torch
def test_a_trial_held_at_its_report_is_not_timed_out_and_a_slow_epoch_is(tmp_path: Path) -> None:
    runs = {}
    for case in ("held", "epoch"):
        (tmp_path / case).mkdir()
        runs[case] = subprocess.Popen(
            [sys.executable, "-c", TRIAL, str(tmp_path / case), case],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out = {case: (p.communicate(timeout=120), p.returncode) for case, p in runs.items()}
    (held_out, held_err), held_code = out["held"]
    assert held_code == 0 and "trained" in held_out, held_err
    assert read_metrics(str(tmp_path / "held")) == []  # (the session writes no journal itself)
    (slow_out, slow_err), slow_code = out["epoch"]
    assert slow_code == 1 and "trained" not in slow_out, slow_err
    rows = read_metrics(str(tmp_path / "epoch"))
    assert [(r["epoch"], r["failure"]) for r in rows] == [(0, "timeout")], rows  # (no journal before)
