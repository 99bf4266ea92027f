"""`failure.fail_fast`: a sweep whose first trials all fail with the same error stops.

A missing data file or a typo in the training code fails every trial the same way; without
this a sweep of 50 trials ran all 50 into the same FileNotFoundError, one after the other
(Ray Tune's `FailureConfig(fail_fast=True)` and Katib's `maxFailedTrialCount` stop earlier).
`FailFast` watches the trials of this run as they end: when the first `after` of them all
ended in an error (their code raised) that is the same error, it says so in one line and
stops the sweep (Tune's Stopper: `stop_all`); status `failed`, exit 1, and `tuner resume`
runs the rest once it is fixed. One trial that ends otherwise (finished, stopped early,
diverged, out of memory, timed out) shows the code can run, and nothing is stopped for the
rest of the run. Imports Ray: loaded only when a sweep runs.

Errors are compared by what they are, not by their incidental numbers: the same bug fails
each trial with another pid, port, address, timestamp or temporary path in its message
(`Connection closed by peer [127.0.0.1]:34984`), so those are masked (`same_error`) first.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Optional

from ray.tune import Callback
from ray.tune.stopper import Stopper

from tuner.driver.callbacks import trial_dir
from tuner.sweepdir import Place, error_file, error_line, recorded_failure


class FailFast(Stopper, Callback):
    def __init__(self, after: int, place: Optional[Place] = None):
        self.after, self.place = after, place
        self.errors: list[Optional[str]] = []  # each trial that ended: its error's key, None if none
        self.error: Optional[str] = None  # the error they all ended with (the first's words), once stopped
        self._first: Optional[str] = None  # the first error's words

    @classmethod
    def wanted(cls, after: int, place: Optional[Place] = None) -> Optional[FailFast]:
        """A FailFast, or None when failure.fail_fast is 0 (off). `place`: the sweep's, whose
        working copy holds the trials' files (pulled first when remote)."""
        return cls(after, place) if after > 0 else None

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        # A trial that recorded its own ending (timed out: its watchdog ended its process, so
        # Tune sees an error) ran; it is no error of the code's.
        path = trial_dir(trial)
        if path and self.place is not None:  # (the trial's own files, where the sweep lives)
            path = self.place.trial(path)
            self.place.pull(only=os.path.basename(path.rstrip("/")))
        self._ended(None if recorded_failure(path) else _error_of(trial, path))

    def _ended(self, error: Optional[str]) -> None:
        if len(self.errors) >= self.after:  # decided already, one way or the other
            return
        if not self.errors:
            self._first = error
        self.errors.append(None if error is None else same_error(error))
        key = self.errors[0]
        if len(self.errors) == self.after and key is not None and all(e == key for e in self.errors):
            self.error = first = self._first
            print(
                f"[tuner] failure.fail_fast: the first {self.after} trials all failed with {first}; "
                "the sweep stops (fix it, then `tuner resume` runs the rest; fail_fast: 0 runs every "
                "trial whatever fails)",
                flush=True,
            )

    # Stopper: running trials are stopped with the experiment, not one by one.
    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.error is not None


# The incidental parts of an error message, each with what it becomes: numbers that differ
# from process to process and run to run while the error is the same.
_INCIDENTAL = [
    (re.compile(r"\b\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?"), "<time>"),
    (re.compile(r"\[?\b(?:\d{1,3}\.){3}\d{1,3}\b\]?(?::\d+)?"), "<address>"),
    (re.compile(r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\](?::\d+)?"), "<address>"),
    (re.compile(r"\b(localhost|[\w-]+(?:\.[\w-]+)+):\d{2,5}\b"), r"\1:<port>"),
    (re.compile(r"\b0x[0-9a-fA-F]{4,}\b"), "0x<address>"),
    (re.compile(r"\b(pid|PID|process|port|Port)([\s:=#]+)\d+"), r"\1\2<n>"),
]


def same_error(line: str) -> str:
    """An error line with its incidental parts masked, so that one error read from two
    trials compares equal: times, addresses and ports, pids, memory addresses, temporary
    paths (`/tmp/tmpab12cd/x` -> `<tmp>/x`)."""
    for tmp in {tempfile.gettempdir(), "/tmp", "/var/tmp"}:
        line = re.sub(re.escape(tmp.rstrip("/")) + r"/[^\s'\"/:,)]+", "<tmp>", line)
    for pattern, mask in _INCIDENTAL:
        line = pattern.sub(mask, line)
    return line


def _error_of(trial: Any, path: Optional[str]) -> str:
    """The trial's error in one line, its own directory and id left out (a path inside it
    differs from trial to trial, the error does not). `path`: the trial's directory in the
    working copy; Tune's own error file (kept on the driver) where the trial left none."""
    line = error_line(path) if path else "an error (see Ray's log)"
    tune_file = getattr(trial, "error_file", None)
    if path and not os.path.isfile(error_file(path)) and tune_file and os.path.isfile(tune_file):
        line = error_line(os.path.dirname(tune_file))
    for own in (path.rstrip("/"), os.path.basename(path.rstrip("/"))) if path else ():
        line = line.replace(own, "<trial>")
    return line.replace(str(trial.trial_id), "<trial>")
