"""Ray Tune's driver-side staging directory: what one run of a sweep must not leave to the next.

Tune stages a run's driver-side files (each trial's params.json, result.json, progress.csv;
its experiment and searcher state) under the Ray session, in a directory named by the
experiment's name and the second the run began (`Trial.local_experiment_path`, Ray 2.60:
`<session>/artifacts/<YYYY-MM-DD_HH-MM-SS>/<name>/driver_artifacts`), and copies that whole
directory into the sweep's. Two runs of sweeps with one name (debug.yaml's "debug" into two
outputs, or a sweep and its resume) begun in the same second on the same Ray (in one process:
a notebook, the tests) shared it: the second copied the first one's trials into its own sweep
(a third trial, unfinished, in a sweep of two), or, resuming, found the interrupted trial
staged there and continued it under a new name (Tune gives a trial whose directory is already
staged 4 random hex characters more).

`StagingCleanup` removes the run's staging directory when Tune has ended the run (after its
last copy into the sweep); `unstage` removes a continued trial's stale staged copy before Tune
looks (a run that could not clean up: its driver killed). Never anything inside the sweep.
`OwnSecond` keeps two drivers of same-named sweeps on one node (drivers of one Ray cluster,
started in the same second) from staging in one directory while both run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from typing import Any, Optional

from ray.tune import Callback

from tuner.sweepdir.place import cache_root


def staging_dir(trial: Any) -> Optional[str]:
    """The run's staging directory, where it is not the sweep itself (None then, or where
    this Tune has no such thing)."""
    try:
        staging, sweep = trial.local_experiment_path, trial.remote_experiment_path
    except (AttributeError, RuntimeError, TypeError):
        return None
    staging, sweep = os.path.realpath(staging), os.path.realpath(sweep)
    if os.path.commonpath([staging, sweep]) in (staging, sweep):
        return None  # staged in the sweep itself (not so in Ray 2.60)
    return staging


def unstage(trial: Any, name: str) -> None:
    """Removes an earlier run's staged copy of the trial directory `name` (called with a new
    trial, before Tune looks for it: the earlier run has ended, one run of a sweep at a time)."""
    staging = staging_dir(trial)
    if staging is not None and os.path.isdir(os.path.join(staging, name)):
        shutil.rmtree(os.path.join(staging, name), ignore_errors=True)


class StagingCleanup(Callback):
    """Removes the run's staging directory at its end (Tune calls on_experiment_end after its
    last copy into the sweep, Ray 2.60: tune.run's final checkpoint, then cleanup)."""

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for trial in trials[:1]:
            staging = staging_dir(trial)
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)


class OwnSecond(Callback):
    """A run of a sweep named `name` begins Tune holding a lock of the node for that name (a
    file under the cache root), and lets it go once Tune has named its staging directory (at
    the callbacks' setup), writing the second it had reached then. The next run of that name,
    holding the lock in turn, waits for a later second if the clock has not passed that one:
    its staging's second is later, its directory another. Uncontended, it costs a lock. (By
    name alone: drivers of the name on other Rays of the machine wait their turn too, a second
    at most, where a lock per Ray node would leave a file behind for every sweep run.)

        with OwnSecond(name) as own:  # (and `own` among the run's callbacks)
            tuner.fit()
    """

    def __init__(
        self,
        name: str,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        self.path = os.path.join(cache_root(), "staging", f"{digest}.lock")
        self.clock, self.sleep = clock, sleep
        self.fd: Optional[int] = None

    def __enter__(self) -> OwnSecond:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # (held by another run of the name for its start)
            taken = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
        except OSError:  # (a cache that cannot be written: runs as Tune alone would)
            self._release()
            return self
        if taken.isdigit() and self.clock() < int(taken) + 1:
            self.sleep(int(taken) + 1 - self.clock())
        return self

    def setup(self, **info: Any) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, f"{int(self.clock())}\n".encode(), 0)
        self._release()

    def __exit__(self, *exc: Any) -> None:
        self._release()  # (Tune failed before its setup)

    def _release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # (the lock goes with it)
            self.fd = None
