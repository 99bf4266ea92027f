"""Schedulers that stop a trial from its whole learning curve (schedule.scheduler: median,
curve), built for Ray Tune (imports Ray: loaded only when a sweep runs).

- `median`: the median stopping rule (Golovin et al. 2017, Google Vizier; Ray Tune's
  MedianStoppingRule, Katib's medianstop): after grace_epochs, a trial whose best value so far
  is worse than the median of the other trials' running averages at the same epoch stops
  (once at least MEDIAN_MIN_TRIALS others have reached that epoch). As in Ray's, a running
  average runs from grace_epochs to that epoch, and the others are every trial that reached
  it (running or ended; Katib counts only those that completed).
- `curve`: learning-curve extrapolation (Domhan et al. 2015; tuner.search.curves): after
  grace_epochs, a trial whose probability of beating the incumbent (the best value any trial
  has reported) by max_epochs falls below schedule.curve.threshold stops. The incumbent's
  trial is never stopped. A short curve says little of its shape, so its prior over the
  ensemble's shapes leans on those the sweep's longer curves took (empirical Bayes:
  POPULATION_SHARE), and its noise is theirs until it has epochs enough to show its own.

Both keep every trial's curve as it arrives, and nothing else: the incumbent, the median, the
pooled noise and the shapes are functions of the set of curves, not of the order they came in. So a
resumed sweep, its scheduler rebuilt from the trials' journals (`seed`: the finished trials,
those continued from checkpoints, and a warm start's), decides as the uninterrupted sweep
would have. Each judgement is kept (`verdicts`, `columns` name its numbers), for the driver
to write beside the trial and show (tuner.driver.dashboard).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from tuner.search import curves as curve_model
from tuner.search.plan import TIME_ATTR, PriorTrial, SearchRequest, key
from tuner.sweepdir import finite

MEDIAN_MIN_TRIALS = 3  # others that reached the epoch before the median rule judges (Ray's, Katib's)
# The curve stopper's prior over curve shapes for a short curve: this share from the shapes
# the sweep's own curves of OWN_NOISE_POINTS epochs or more took (once POPULATION_MIN have),
# the rest the families' own (chosen with scripts/bench_search.py, 10 seeds: median epochs to
# the targets of conditional, synthetic and regression 82.5, 211.5, 89.5 with 0.8; 84, 211.5,
# 89.5 with 0.5; 85, 231.5, 90.5 with none; BENCHMARKS.md, "Stopping by the learning curve").
POPULATION_SHARE = 0.8
POPULATION_MIN = 3
SHAPE_UNIT = 2**40  # a shape's weights in integer units: sums in any order are the same


class CurveScheduler(FIFOScheduler):
    """What the curve-reading schedulers share (see the module): each trial's curve, signed so
    that higher is better, by Tune's trial id; those of an earlier run under ids of their own."""

    # The numbers a judgement gives, in the order shown: key -> what it is (HParams columns).
    columns: dict[str, str] = {}

    def __init__(self, metric: str, direction: str, max_epochs: int, grace_epochs: int):
        super().__init__()
        self._metric, self._mode, self._time_attr = metric, direction, TIME_ATTR  # (Ray's names)
        self.sign = 1.0 if direction == "max" else -1.0
        self.max_epochs, self.grace = max_epochs, grace_epochs
        self.curves: dict[str, dict[int, float]] = {}  # trial -> epoch -> signed value
        self.best = -math.inf  # the incumbent: the best signed value of any trial
        # Trials continued from checkpoints, by configuration: the names their curves have
        # until Tune adds them (under a new trial id, which they then take).
        self.waiting: dict[str, list[str]] = {}
        self.verdicts: dict[str, dict[str, Any]] = {}  # trial -> its latest judgement

    # ------------------------------------------------------------------ Tune's calls

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        waiting = self.waiting.get(key(trial.config)) if self.waiting else None
        if waiting and trial.trial_id not in self.curves:
            self.rename(waiting.pop(0), trial.trial_id)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        epoch, value = result.get(TIME_ATTR), result.get(self._metric)
        if not finite(epoch) or not finite(value) or "failure" in result:
            return TrialScheduler.CONTINUE  # (a failed trial ends by itself)
        epoch = int(epoch)
        curve = self.curves.setdefault(trial.trial_id, {})
        for later in [e for e in curve if e > epoch]:  # continued from an earlier checkpoint
            del curve[later]
        self._observe(trial.trial_id, epoch, self.sign * float(value))
        if epoch < self.grace or epoch >= self.max_epochs:
            return TrialScheduler.CONTINUE
        verdict = self.judge(trial.trial_id, epoch)
        if verdict is None:
            return TrialScheduler.CONTINUE
        self.verdicts[trial.trial_id] = {TIME_ATTR: epoch, **verdict}
        return TrialScheduler.STOP if verdict["stop"] else TrialScheduler.CONTINUE

    def debug_string(self) -> str:
        return f"{type(self).__name__}: {len(self.curves)} curves"

    # ------------------------------------------------------------------ state

    def seed(self, prior: Any) -> None:
        """The earlier trials' curves, as if seen live: finished ones (and a warm start's)
        under names of their own, and those to be continued, whose names they keep until Tune
        adds them again (they count meanwhile: for the incumbent, the median, the noise)."""
        for i, t in enumerate(prior.earlier + prior.finished):
            self._take(f"prior-{i}", self._curve_of(t))
        for i, t in enumerate(prior.interrupted):
            self._take(f"resumed-{i}", self._curve_of(t))
            self.waiting.setdefault(key(t.config), []).append(f"resumed-{i}")

    def at_resume(self, i: int, epoch: int) -> Optional[dict[str, Any]]:
        """The judgement of the i-th trial to be continued (`seed`'s prior.interrupted) at
        `epoch`, the last its journal holds, as the run that recorded the epoch would have made it: a
        driver killed between the report and the judgement lost it, and the trial, continued,
        would be judged first one epoch later. None: no judgement there (before grace_epochs,
        at max_epochs, too few others)."""
        name = f"resumed-{i}"
        if epoch not in self.curves.get(name, {}) or epoch < self.grace or epoch >= self.max_epochs:
            return None
        verdict = self.judge(name, epoch)
        return None if verdict is None else {TIME_ATTR: epoch, **verdict}

    def rename(self, old: str, new: str) -> None:
        """A trial's state under its new trial id (a resumed trial, added again)."""
        if old in self.curves:
            self.curves[new] = self.curves.pop(old)
        if old in self.verdicts:
            self.verdicts[new] = self.verdicts.pop(old)

    def _curve_of(self, t: PriorTrial) -> dict[int, float]:
        curve = {}
        for row in t.history:
            epoch, value = row.get(TIME_ATTR), row.get(self._metric)
            if finite(epoch) and finite(value) and "failure" not in row:
                curve[int(epoch)] = self.sign * float(value)
        return curve

    def _take(self, trial_id: str, curve: dict[int, float]) -> None:
        if not curve:  # (no finite value: as a trial whose first result failed, none kept)
            return
        self.curves[trial_id] = {}
        for epoch in sorted(curve):
            self._observe(trial_id, epoch, curve[epoch])

    def _observe(self, trial_id: str, epoch: int, z: float) -> None:
        self.curves[trial_id][epoch] = z
        self.best = max(self.best, z)

    def judge(self, trial_id: str, epoch: int) -> Optional[dict[str, Any]]:
        """The judgement at `epoch`: {"stop": bool, and the numbers of `columns`}; None: none
        can be made yet."""
        raise NotImplementedError

    def value(self, z: float) -> float:
        """A signed value in the metric's own terms."""
        return self.sign * z

    def reason(self, verdict: dict[str, Any]) -> str:
        """A judgement in words, as the report and a finished trial's line say it."""
        raise NotImplementedError

    def brief(self, verdict: dict[str, Any]) -> str:
        """A judgement in a few words, as the live status line says it."""
        raise NotImplementedError


class MedianStopping(CurveScheduler):
    """The median stopping rule (see the module)."""

    columns = {
        "median": "the median of the other trials' running averages (from grace_epochs) at the "
        "epoch it was judged",
        "best": "the trial's best value by that epoch",
    }

    def __init__(self, metric: str, direction: str, max_epochs: int, grace_epochs: int):
        super().__init__(metric, direction, max_epochs, grace_epochs)
        # epoch -> trial -> the trial's running average up to that epoch (signed)
        self.averages: dict[int, dict[str, float]] = {}

    def _observe(self, trial_id: str, epoch: int, z: float) -> None:
        super()._observe(trial_id, epoch, z)
        curve = self.curves[trial_id]
        for later in [e for e, by in self.averages.items() if e >= epoch and trial_id in by]:
            del self.averages[later][trial_id]  # (a trial continued from an earlier checkpoint)
        window = range(self.grace, epoch + 1)
        if epoch >= self.grace and all(e in curve for e in window):
            # (math.fsum: the same average whichever order a resumed sweep re-reads it in)
            self.averages.setdefault(epoch, {})[trial_id] = math.fsum(curve[e] for e in window) / len(window)

    def rename(self, old: str, new: str) -> None:
        super().rename(old, new)
        for by in self.averages.values():
            if old in by:
                by[new] = by.pop(old)

    def judge(self, trial_id: str, epoch: int) -> Optional[dict[str, Any]]:
        others = [v for t, v in self.averages.get(epoch, {}).items() if t != trial_id]
        if len(others) < MEDIAN_MIN_TRIALS:
            return None
        median = float(np.median(others))
        best = max(z for e, z in self.curves[trial_id].items() if e <= epoch)
        return {"stop": best < median, "median": self.value(median), "best": self.value(best)}

    def reason(self, verdict: dict[str, Any]) -> str:
        than = "worse" if verdict["stop"] else "no worse"
        return (
            f"its best {self._metric} {verdict['best']:.4g} was {than} than the median "
            f"{verdict['median']:.4g} of the others' running averages at epoch {verdict[TIME_ATTR]}"
        )

    def brief(self, verdict: dict[str, Any]) -> str:
        return f"best {verdict['best']:.4g} vs median {verdict['median']:.4g}"


class CurveStopping(CurveScheduler):
    """Learning-curve extrapolation (see the module and tuner.search.curves)."""

    columns = {
        "pred_final": "the value the curve stopper predicted for max_epochs",
        "p_beat": "its probability that the trial beats the incumbent by max_epochs",
        "incumbent": "the best value of any trial when it was judged",
    }

    def __init__(self, metric: str, direction: str, max_epochs: int, grace_epochs: int, threshold: float):
        super().__init__(metric, direction, max_epochs, grace_epochs)
        self.threshold = threshold
        self.noise: dict[str, float] = {}  # trial -> its own noise (sd), once it has enough epochs
        # trial -> its shape: the candidates' weights fitted to its own curve once it has enough
        # epochs, in integer units of SHAPE_UNIT, and their sum over the trials: integers, so the
        # sum is the same whatever order the curves came in (a resumed sweep's)
        self.shapes: dict[str, np.ndarray] = {}
        self.shape_sum: Optional[np.ndarray] = None

    def _observe(self, trial_id: str, epoch: int, z: float) -> None:
        super()._observe(trial_id, epoch, z)
        curve = self.curves[trial_id]
        self.noise.pop(trial_id, None)
        old = self.shapes.pop(trial_id, None)
        if old is not None and self.shape_sum is not None:
            self.shape_sum -= old
        if len(curve) >= curve_model.OWN_NOISE_POINTS:
            fitted = self._fit(curve, None, own=True)
            if fitted is not None and fitted.residual_var is not None:
                self.noise[trial_id] = math.sqrt(fitted.residual_var)
            if fitted is not None and POPULATION_SHARE > 0:
                shape = np.rint(fitted.weights * SHAPE_UNIT).astype(np.int64)
                self.shapes[trial_id] = shape
                self.shape_sum = shape.copy() if self.shape_sum is None else self.shape_sum + shape

    def rename(self, old: str, new: str) -> None:
        super().rename(old, new)
        if old in self.noise:
            self.noise[new] = self.noise.pop(old)
        if old in self.shapes:
            self.shapes[new] = self.shapes.pop(old)

    def population_prior(self) -> Optional[np.ndarray]:
        """The candidates' prior for a short curve: the shapes the sweep's longer curves took,
        blended with the families' own prior (None: too few longer curves yet)."""
        if len(self.shapes) < POPULATION_MIN or self.shape_sum is None:
            return None
        _, _, flat = curve_model.grid(self.max_epochs)
        seen = self.shape_sum / self.shape_sum.sum()
        return (1 - POPULATION_SHARE) * flat + POPULATION_SHARE * seen

    def pooled_noise(self) -> Optional[float]:
        """The median of the trials' own noise (None before any has enough epochs)."""
        return float(np.median(list(self.noise.values()))) if self.noise else None

    def _fit(
        self, curve: dict[int, float], noise: Optional[float], own: bool = False
    ) -> Optional[curve_model.Fit]:
        """The ensemble fitted to a curve: with its own shape prior (`own`: the families'
        alike, for the trial's own noise and shape) or the sweep's (population_prior)."""
        epochs = np.array(sorted(curve))
        z = np.array([curve[e] for e in epochs])
        prior = None if own else self.population_prior()
        return curve_model.fit(epochs, z, self.max_epochs, noise, prior)

    def judge(self, trial_id: str, epoch: int) -> Optional[dict[str, Any]]:
        curve = self.curves[trial_id]
        fitted = self._fit(curve, self.pooled_noise())
        if fitted is None:
            return None
        leads = max(curve.values()) >= self.best  # the incumbent's own trial
        p = 1.0 if leads else fitted.p_above(self.best)
        return {
            "stop": p < self.threshold,
            "pred_final": self.value(fitted.median),
            "p_beat": p,
            "incumbent": self.value(self.best),
        }

    def reason(self, verdict: dict[str, Any]) -> str:
        sign = "<" if verdict["stop"] else ">="
        return (
            f"at epoch {verdict[TIME_ATTR]} its curve predicted {self._metric} {verdict['pred_final']:.4g} "
            f"at epoch {self.max_epochs}, a {verdict['p_beat']:.1%} chance of beating the best "
            f"{verdict['incumbent']:.4g} ({sign} {self.threshold:g})"
        )

    def brief(self, verdict: dict[str, Any]) -> str:
        return f"predicted {verdict['pred_final']:.4g}, P(beats best) {verdict['p_beat']:.1%}"


def median(r: SearchRequest) -> MedianStopping:
    s = r.schedule
    return MedianStopping(r.metric, r.direction, s.max_epochs, s.grace_epochs)


def curve(r: SearchRequest) -> CurveStopping:
    s = r.schedule
    return CurveStopping(r.metric, r.direction, s.max_epochs, s.grace_epochs, s.curve.threshold)


def seed(scheduler: CurveScheduler, r: SearchRequest) -> None:
    """Resume seeding (tuner.config.schedulers): every earlier trial's curve."""
    scheduler.seed(r.prior)
