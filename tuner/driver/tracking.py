"""`tracking.mlflow`: every trial as an MLflow run, nested under one run of the sweep.

A Tune callback in the driver: a parent run per sweep (its id kept in the sweep directory, so
`resume` and `extend` log under the same one), a child run per trial (params = the trial's
configuration, per-epoch metrics with the epoch as step, FINISHED or FAILED at the end, the
trial's outcome as a tag). A resumed trial goes on in its earlier child run. Imports mlflow
and Ray: loaded only when a sweep that asks for it runs.
"""

from __future__ import annotations

import os
import time
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from tuner.driver.callbacks import trial_dir
from tuner.sweepdir.files import finite, write_atomic

PARENT_FILE = ".mlflow_run"  # in the sweep directory: the parent run's id
TRIAL_TAG, SWEEP_TAG, PARENT_TAG = "tuner.trial", "tuner.sweep_dir", "mlflow.parentRunId"
# What every Tune result holds beside the trial's own numbers.
_TUNE_KEYS = {
    "timestamp", "time_this_iter_s", "time_total_s", "training_iteration", "pid", "time_since_restore",
    "iterations_since_restore", "done", "epoch", "wall_time",
}  # fmt: skip


class MLflowTracking(Callback):
    def __init__(self, uri: str, experiment: str, sweep_name: str, sweep_dir: str):
        self.uri, self.experiment, self.sweep_name, self.sweep_dir = uri, experiment, sweep_name, sweep_dir
        self.runs: dict[str, str] = {}  # Tune trial id -> MLflow run id

    def setup(self, **info: Any) -> None:
        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(self.experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        self.parent = self._parent()

    def _parent(self) -> str:
        path = os.path.join(self.sweep_dir, PARENT_FILE)
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

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._child(trial, _name(trial))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        run_id = self._child(trial, _name(trial))
        step = int(result.get("epoch") or result.get("training_iteration") or 0)
        stamp = int(1000 * float(result.get("wall_time") or time.time()))
        numbers = {k: v for k, v in result.items() if k not in _TUNE_KEYS and finite(v)}
        metrics = [Metric(k, float(v), stamp, step) for k, v in numbers.items()]
        tags = [RunTag("tuner.failure", str(result["failure"]))] if result.get("failure") else []
        if metrics or tags:
            self.client.log_batch(run_id, metrics=metrics, tags=tags)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED" if (trial.last_result or {}).get("failure") else "FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED")

    def _end(self, trial: Any, status: str) -> None:
        run_id = self.runs.get(trial.trial_id)
        if run_id is not None:  # (a trial removed before it started has no run)
            self.client.set_terminated(run_id, status=status)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        # Trials Tune tore down on Ctrl-C never completed: their runs (and the sweep's) are
        # KILLED, to be continued by `tuner resume`.
        ended = ("TERMINATED", "ERROR")
        unfinished = [t for t in trials if t.trial_id in self.runs and t.status not in ended]
        for t in unfinished:
            self.client.set_terminated(self.runs[t.trial_id], status="KILLED")
        self.client.set_terminated(self.parent, status="KILLED" if unfinished else "FINISHED")


def _name(trial: Any) -> str:
    """The trial's name in MLflow: its directory's (what summary.json calls its trial_id)."""
    path = trial_dir(trial)
    return os.path.basename(path.rstrip("/")) if path else str(trial.trial_id)
