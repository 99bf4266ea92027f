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
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

from ray.tune import Callback


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
