"""`failure.fail_fast`: a sweep whose first trials all fail with the same error stops.

A missing data file or a typo in the training code fails every trial the same way; without
this a sweep of 50 trials ran all 50 into the same FileNotFoundError, one after the other
(Ray Tune's `FailureConfig(fail_fast=True)` and Katib's `maxFailedTrialCount` stop earlier).
`FailFast` watches the trials of this run as they end: when the first `after` of them all
ended in an error (their code raised) with the same last line, it says so in one line and
stops the sweep (Tune's Stopper: `stop_all`); status `failed`, exit 1, and `tuner resume`
runs the rest once it is fixed. One trial that ends otherwise (finished, stopped early,
diverged, out of memory, timed out) shows the code can run, and nothing is stopped for the
rest of the run. Imports Ray: loaded only when a sweep runs.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ray.tune import Callback
from ray.tune.stopper import Stopper

from tuner.driver.callbacks import trial_dir
from tuner.sweepdir import error_line, recorded_failure


class FailFast(Stopper, Callback):
    def __init__(self, after: int):
        self.after = after
        self.errors: list[Optional[str]] = []  # each trial that ended: its error, None if none
        self.error: Optional[str] = None  # the error they all ended with, once stopped

    @classmethod
    def wanted(cls, after: int) -> Optional[FailFast]:
        """A FailFast, or None when failure.fail_fast is 0 (off)."""
        return cls(after) if after > 0 else None

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        # A trial that recorded its own ending (timed out: its watchdog ended its process, so
        # Tune sees an error) ran; it is no error of the code's.
        path = trial_dir(trial)
        self._ended(None if recorded_failure(path) else _error_of(trial))

    def _ended(self, error: Optional[str]) -> None:
        if len(self.errors) >= self.after:  # decided already, one way or the other
            return
        self.errors.append(error)
        first = self.errors[0]
        if len(self.errors) == self.after and first is not None and all(e == first for e in self.errors):
            self.error = first
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


def _error_of(trial: Any) -> str:
    """The trial's error in one line, its own directory and id left out (a path inside it
    differs from trial to trial, the error does not)."""
    path = trial_dir(trial)
    line = error_line(path) if path else "an error (see Ray's log)"
    for own in (path.rstrip("/"), os.path.basename(path.rstrip("/"))) if path else ():
        line = line.replace(own, "<trial>")
    return line.replace(str(trial.trial_id), "<trial>")
