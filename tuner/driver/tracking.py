"""`tracking.mlflow`: every trial as an MLflow run, nested under one run of the sweep.

A Tune callback in the driver: a parent run per sweep (its id kept in the sweep directory, so
`resume` and `extend` log under the same one), a child run per trial (params = the trial's
configuration, per-epoch metrics with the epoch as step, FINISHED or FAILED at the end, the
trial's outcome as a tag). A resumed trial goes on in its earlier child run. Imports mlflow
and Ray: loaded only when a sweep that asks for it runs.

Tracking never ends a sweep: the store was checked before Ray started (mlflow_store.check),
and when it fails later, the first failure is a warning, and the rest of this run is not
logged to MLflow (each call would wait on the store again); the sweep's own files have it all.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from tuner.config.schedule import redacted
from tuner.driver.callbacks import trial_name
from tuner.driver.mlflow_store import brief, one_line
from tuner.errors import warn
from tuner.sweepdir.files import MLFLOW_RUN_FILE, finite, write_atomic

F = TypeVar("F", bound=Callable[..., None])

TRIAL_TAG, SWEEP_TAG, PARENT_TAG = "tuner.trial", "tuner.sweep_dir", "mlflow.parentRunId"
# What every Tune result holds beside the trial's own numbers.
_TUNE_KEYS = {
    "timestamp", "time_this_iter_s", "time_total_s", "training_iteration", "pid", "time_since_restore",
    "iterations_since_restore", "done", "epoch", "wall_time",
}  # fmt: skip


def _best_effort(hook: F) -> F:
    """A callback hook that never raises into Tune (which would end the sweep): the store's
    first failure is a warning and tracking stops for this run."""

    @functools.wraps(hook)
    def guarded(self: MLflowTracking, *args: Any, **kwargs: Any) -> None:
        if self.failed:
            return
        try:
            with brief():
                hook(self, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the store's failure is never the sweep's
            self.failed = True
            warn(
                f"tracking.mlflow: the MLflow store ({_where(self.uri)}) failed: {one_line(err)}; "
                "the sweep goes on, no longer logged to MLflow (its own files have every result)"
            )

    return guarded  # type: ignore[return-value]


def _where(uri: str) -> str:
    """The store as a warning may name it: a server's scheme and host (its URL may carry
    credentials), a database's scheme."""
    return redacted(uri) if uri.startswith(("http://", "https://")) else uri.partition(":")[0]


class MLflowTracking(Callback):
    def __init__(self, uri: str, experiment: str, sweep_name: str, sweep_dir: str):
        self.uri, self.experiment, self.sweep_name, self.sweep_dir = uri, experiment, sweep_name, sweep_dir
        self.runs: dict[str, str] = {}  # Tune trial id -> MLflow run id
        self.failed = False

    @_best_effort
    def setup(self, **info: Any) -> None:
        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(self.experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        self.parent = self._parent()

    def _parent(self) -> str:
        path = os.path.join(self.sweep_dir, MLFLOW_RUN_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                run_id = f.read().strip()
            if run_id:
                self.client.update_run(run_id, status="RUNNING")
                return run_id
        run = self.client.create_run(
            self.experiment_id, run_name=self.sweep_name, tags={SWEEP_TAG: self.sweep_dir}
        )
        write_atomic(path, run.info.run_id + "\n")
        return run.info.run_id

    def _child(self, trial: Any, name: str) -> str:
        if trial.trial_id in self.runs:
            return self.runs[trial.trial_id]
        earlier = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.parent}' and tags.`{TRIAL_TAG}` = '{name}'",
            max_results=1,
        )
        if earlier:  # a trial continued by resume, or paused and started again
            run_id = earlier[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(
                self.experiment_id, run_name=name, tags={PARENT_TAG: self.parent, TRIAL_TAG: name}
            ).info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in sorted(trial.config.items())]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(run_id, params=params[i : i + 100])
        self.runs[trial.trial_id] = run_id
        return run_id

    @_best_effort
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._child(trial, trial_name(trial))

    @_best_effort
    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        run_id = self._child(trial, trial_name(trial))
        step = int(result.get("epoch") or result.get("training_iteration") or 0)
        stamp = int(1000 * float(result.get("wall_time") or time.time()))
        numbers = {k: v for k, v in result.items() if k not in _TUNE_KEYS and finite(v)}
        metrics = [Metric(k, float(v), stamp, step) for k, v in numbers.items()]
        tags = [RunTag("tuner.failure", str(result["failure"]))] if result.get("failure") else []
        if metrics or tags:
            self.client.log_batch(run_id, metrics=metrics, tags=tags)

    @_best_effort
    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED" if (trial.last_result or {}).get("failure") else "FINISHED")

    @_best_effort
    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED")

    def _end(self, trial: Any, status: str) -> None:
        run_id = self.runs.get(trial.trial_id)
        if run_id is not None:  # (a trial removed before it started has no run)
            self.client.set_terminated(run_id, status=status)

    @_best_effort
    def on_experiment_end(self, trials: list, **info: Any) -> None:
        # Trials Tune tore down on Ctrl-C never completed: their runs (and the sweep's) are
        # KILLED, to be continued by `tuner resume`.
        ended = ("TERMINATED", "ERROR")
        unfinished = [t for t in trials if t.trial_id in self.runs and t.status not in ended]
        for t in unfinished:
            self.client.set_terminated(self.runs[t.trial_id], status="KILLED")
        self.client.set_terminated(self.parent, status="KILLED" if unfinished else "FINISHED")
