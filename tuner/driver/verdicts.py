"""The judgement a scheduler that reads whole curves (schedule.scheduler: median, curve) makes
of each trial, kept beside the trial and shown, so that a user sees why a trial was stopped.

Tune hands the scheduler a copy of each result and the callbacks the original, after the
scheduler has decided (ray.tune.execution.tune_controller); this callback, the first of the
driver's, reads the scheduler's judgement of the result's epoch and:

- appends it to the trial's stopper.jsonl (tuner.sweepdir; the report reads it);
- adds its numbers to the result as `stopper/<name>` (the curve stopper's `pred_final`,
  `p_beat`, `incumbent`; the median rule's `median`, `best`), which the callbacks after it
  see: the Dashboard writes them as HParams columns, Tune's result.json keeps them;
- says, for the live line and a finished trial's line (driver.callbacks.Progress), why a
  trial it stopped was stopped.
"""

from __future__ import annotations

from typing import Any, Optional

from ray.tune import Callback

from tuner.driver.callbacks import _Places
from tuner.sweepdir import append_verdict
from tuner.sweepdir.place import Place

STOPPER = "stopper/"  # result keys and TensorBoard tags of a judgement's numbers


def columns(scheduler: Any) -> dict[str, tuple[str, str]]:
    """The HParams columns of the scheduler's judgements: tag -> (header, description)."""
    return {STOPPER + k: (STOPPER + k, f"{what} (its latest)") for k, what in judged(scheduler).items()}


def judged(scheduler: Any) -> dict[str, str]:
    """The numbers a scheduler's judgement holds (name -> what it is); {} for one that keeps none."""
    return dict(getattr(scheduler, "columns", {}) or {}) if hasattr(scheduler, "verdicts") else {}


class Verdicts(Callback):
    """Keeps and shows the scheduler's judgements (see the module)."""

    def __init__(self, scheduler: Any, place: Optional[Place] = None):
        self.scheduler = scheduler
        self.places = _Places(place)

    @classmethod
    def wanted(cls, scheduler: Any, place: Optional[Place] = None) -> Optional[Verdicts]:
        return cls(scheduler, place) if judged(scheduler) else None

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        verdict = self.scheduler.verdicts.get(trial.trial_id)
        if verdict is None or verdict.get("epoch") != result.get("epoch"):
            return  # (not judged at this epoch: before grace_epochs, or too few others yet)
        result.update({STOPPER + k: verdict[k] for k in self.scheduler.columns})
        path = self.places.trial(trial)
        if path:
            self.places.saved(append_verdict(path, verdict))

    def why(self, trial: Any, brief: bool = False) -> Optional[str]:
        """Why the scheduler stopped the trial; None if it did not."""
        verdict = self.scheduler.verdicts.get(trial.trial_id)
        if verdict is None or not verdict["stop"]:
            return None
        return self.scheduler.brief(verdict) if brief else self.scheduler.reason(verdict)
