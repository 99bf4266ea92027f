"""When a sweep as a whole ends early: its time budget is spent, or a trial reached the target.

`schedule.time_budget`: once spent, trials queued but not started are removed before Tune
starts them, trials still running stop at their next report (their reported epochs are kept;
nothing is cut mid-epoch), and when none runs any more the experiment ends.
`schedule.stop_at`: the sweep ends as soon as a trial reports the target; running trials are
stopped at once, and recorded as stopped for it (their records say `"stopped":
"target_reached"`): the sweep is over, not interrupted, and `resume` has nothing to continue.

A Ctrl-C or SIGTERM ends it too (driver/stopping.py); `UserStopped` is how Tune hears of it.

`SweepLimits` is both Tune's Stopper (asked about every result, and about the whole
experiment every step) and a Callback (it sees trials start and end), and remembers why the
sweep ended; `Budgeted` wraps the sweep's scheduler, whose `choose_trial_to_run` Tune asks
before it starts queued trials. Imports Ray: loaded only when a sweep runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Optional

from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.stopper import Stopper

from tuner.driver.callbacks import trial_dir
from tuner.driver.stopping import INTERRUPTED
from tuner.results import BUDGET, TARGET
from tuner.sweepdir import finite, read_record, write_record


class SweepLimits(Stopper, Callback):
    def __init__(
        self,
        metric: str,
        direction: str,
        time_budget: Optional[float] = None,
        stop_at: Optional[float] = None,
        clock: Any = time.monotonic,
    ):
        self.metric, self.clock = metric, clock
        self.sign = 1.0 if direction == "max" else -1.0
        self.deadline = None if time_budget is None else clock() + time_budget
        self.target = stop_at
        self.reason: Optional[str] = None  # BUDGET or TARGET once the sweep ends for it
        self.running: set[str] = set()  # trials started and not yet ended
        self.cut: set[str] = set()  # trials stopped because the budget was spent

    @classmethod
    def wanted(
        cls, metric: str, direction: str, time_budget: Optional[float], stop_at: Optional[float]
    ) -> Any:
        """A SweepLimits, or None when the sweep has neither a budget nor a target."""
        if time_budget is None and stop_at is None:
            return None
        return cls(metric, direction, time_budget, stop_at)

    def spent(self) -> bool:
        if self.reason is None and self.deadline is not None and self.clock() >= self.deadline:
            self.reason = BUDGET
        return self.reason == BUDGET

    # Stopper
    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = result.get(self.metric)
        if self.target is not None and finite(value) and self.sign * value >= self.sign * self.target:
            self.reason = TARGET
            return True
        if self.spent():  # a running trial stops at this, its next report
            self.cut.add(trial_id)
            return True
        return False

    def stop_all(self) -> bool:
        if self.reason == TARGET:
            return True
        return self.spent() and not self.running

    # Callback
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.running.add(trial.trial_id)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.running.discard(trial.trial_id)
        if trial.trial_id in self.cut:  # its record says so: not stopped early by a scheduler
            path = trial_dir(trial)
            record = read_record(path) if path else None
            if path and record is not None:
                record["stopped"] = BUDGET
                write_record(path, record)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.running.discard(trial.trial_id)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        # Tune stops the trials still running when a Stopper ends the experiment without a
        # completion for any of them (Ray 2.60, TuneController._stop_experiment_if_needed).
        if self.reason != TARGET:
            return
        for trial in trials:
            path = trial_dir(trial)
            record = read_record(path) if path else None
            if path and record is not None and record.get("status") == "RUNNING":
                record.update(status="TERMINATED", stopped=TARGET, ended=time.time())
                write_record(path, record)


class Budgeted(TrialScheduler):
    """The sweep's scheduler (ASHA, or first-in first-out), which starts nothing once the
    time budget is spent: Tune asks `choose_trial_to_run` before it starts queued trials
    (ray.tune.execution.tune_controller), and `stop_trial` removes a queued one unstarted."""

    def __init__(self, inner: Optional[TrialScheduler], limits: SweepLimits):
        self.inner, self.limits = inner or FIFOScheduler(), limits

    def choose_trial_to_run(self, tune_controller: Any) -> Optional[Trial]:
        if self.limits.spent():
            for trial in tune_controller.get_trials():
                if trial.status == Trial.PAUSED:  # (a population's member, waiting): it ends here
                    self.limits.cut.add(trial.trial_id)
                    tune_controller.stop_trial(trial)
                elif trial.status == Trial.PENDING:
                    # Named (an empty directory, as Tune makes for every trial it queues for
                    # an actor), since Tune asks every trial for its path when it ends.
                    trial.init_local_path()
                    tune_controller.stop_trial(trial)
                    with contextlib.suppress(OSError):  # and the directory goes again
                        os.rmdir(trial.local_path)
            return None
        return self.inner.choose_trial_to_run(tune_controller)

    # Everything else is the inner scheduler's.
    @property
    def metric(self) -> Any:
        return self.inner.metric

    @property
    def supports_buffered_results(self) -> bool:
        return self.inner.supports_buffered_results

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self.inner.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self.inner.on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        return self.inner.on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        self.inner.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        self.inner.on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return self.inner.debug_string()

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)


class UserStopped(Stopper):
    """Tune's Stopper for a sweep the user stopped (stopping.INTERRUPTED): the experiment ends
    at Tune's next step, its running trials stopped at their next report."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return INTERRUPTED.is_set()
