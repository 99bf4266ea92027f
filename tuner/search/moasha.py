"""Multi-objective ASHA (schedule.scheduler: moasha; Schmucker et al. 2021, Syne Tune's
MOASHA): ASHA's rungs, a trial ranked at each by non-dominated sorting of every objective
instead of by one metric (imports Ray: loaded only when a sweep runs).

At a rung (tuner.search.plan.rungs, ASHA's milestones) a trial's values of the objectives are
compared with those of the trials that reached the rung before it: the points are sorted
into Pareto fronts (the first: no point dominates them; the second: only the first's do, ...)
and, within a front, in the order of an epsilon-net (Salinas et al. 2021, Syne Tune's
NonDominatedPriority): the front's best point in the first objective first, then each time
the point farthest from those already taken, so that the points a rung keeps spread along
the front rather than bunch at one end. The trial goes on if it is among the first
ceil(n / reduction_factor) of the n points, itself included; the first to reach a rung always
does. With one objective this is ASHA's rule by rank.

The rungs are rebuilt from the trials' journals on resume (`seed`), as ASHA's are.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from tuner.search.plan import TIME_ATTR, SearchRequest, key, rungs
from tuner.sweepdir import finite


def fronts(points: np.ndarray) -> np.ndarray:
    """The Pareto front of each point (0: the first), every objective maximised: points x
    objectives in, one integer a point out."""
    n = len(points)
    ge = (points[:, None, :] >= points[None, :, :]).all(axis=2)
    gt = (points[:, None, :] > points[None, :, :]).any(axis=2)
    dominated_by = (ge & gt).T  # [i, j]: j dominates i
    front = np.full(n, -1)
    left = np.ones(n, dtype=bool)
    k = 0
    while left.any():
        free = left & ~(dominated_by & left[None, :]).any(axis=1)
        front[free] = k
        left &= ~free
        k += 1
    return front


def order(points: np.ndarray) -> list[int]:
    """The points' indices best first: by front, then within each front in epsilon-net order
    (the best in the first objective, then farthest first, in units of each objective's
    range over all the points)."""
    span = points.max(axis=0) - points.min(axis=0)
    scaled = (points - points.min(axis=0)) / np.where(span > 0, span, 1.0)
    front = fronts(points)
    out: list[int] = []
    for k in range(int(front.max()) + 1 if len(points) else 0):
        members = [int(i) for i in np.flatnonzero(front == k)]
        # (ties by index: the earlier point, as in the others' sorts)
        first = max(members, key=lambda i: (points[i, 0], -i))
        taken = [first]
        rest = [i for i in members if i != first]
        nearest = np.linalg.norm(scaled[rest] - scaled[first], axis=1) if rest else np.array([])
        while rest:
            j = int(np.argmax(nearest))
            taken.append(rest.pop(j))
            nearest = np.delete(nearest, j)
            if rest:
                d = np.linalg.norm(scaled[rest] - scaled[taken[-1]], axis=1)
                nearest = np.minimum(nearest, d)
        out += taken
    return out


class MultiObjectiveASHA(FIFOScheduler):
    """ASHA over several objectives (see the module)."""

    def __init__(
        self,
        objectives: list[tuple[str, str]],
        max_epochs: int,
        grace_epochs: int,
        reduction_factor: float,
    ):
        super().__init__()
        self.objectives = list(objectives)
        self._metric, self._mode = self.objectives[0]
        self._time_attr = TIME_ATTR
        self.signs = np.array([1.0 if m == "max" else -1.0 for _, m in self.objectives])
        self.factor = reduction_factor
        self.milestones = rungs(grace_epochs, max_epochs, reduction_factor)
        # milestone -> trial -> its signed values there, in the order they were recorded
        self.recorded: dict[int, dict[str, np.ndarray]] = {m: {} for m in self.milestones}
        # Trials continued from checkpoints, by configuration: the names their points have in
        # the rungs until Tune adds them (under a new trial id, which they then take).
        self.waiting: dict[str, list[str]] = {}

    def vector(self, row: dict[str, Any]) -> Optional[np.ndarray]:
        """A result's values of the objectives, signed so that higher is better; None when
        one is missing or not finite (a failed trial ends by itself)."""
        values = [row.get(name) for name, _ in self.objectives]
        if "failure" in row or not all(finite(v) for v in values):
            return None
        return self.signs * np.array(values, dtype=float)

    def at_rungs(self, history: list[dict[str, Any]]) -> dict[int, np.ndarray]:
        """The values a trial reported on meeting each milestone it reached."""
        out = {}
        for milestone in self.milestones:
            rows = [row for row in history if (row.get(TIME_ATTR) or 0) >= milestone]
            point = self.vector(rows[0]) if rows else None
            if point is not None:
                out[milestone] = point
        return out

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        waiting = self.waiting.get(key(trial.config)) if self.waiting else None
        if waiting:
            name = waiting.pop(0)
            for recorded in self.recorded.values():
                if name in recorded:
                    recorded[trial.trial_id] = recorded.pop(name)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        epoch, point = result.get(TIME_ATTR), self.vector(result)
        if not finite(epoch) or point is None:
            return TrialScheduler.CONTINUE
        for milestone in reversed(self.milestones):  # (the highest one reached, as Ray's ASHA)
            recorded = self.recorded[milestone]
            if epoch < milestone or trial.trial_id in recorded:
                continue
            goes_on = self.goes_on(recorded, point)
            recorded[trial.trial_id] = point
            return TrialScheduler.CONTINUE if goes_on else TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def goes_on(self, recorded: dict[str, np.ndarray], point: np.ndarray) -> bool:
        """Whether a point is among the first ceil(n / reduction_factor) of the rung's n."""
        if not recorded:
            return True
        points = np.vstack([*recorded.values(), point])
        place = order(points).index(len(points) - 1)
        return place < math.ceil(len(points) / self.factor)

    def debug_string(self) -> str:
        return "MultiObjectiveASHA: " + ", ".join(f"{m}: {len(r)}" for m, r in self.recorded.items())


def moasha(r: SearchRequest) -> MultiObjectiveASHA:
    s = r.schedule
    objectives = list(r.objectives) or [(r.metric, r.direction)]
    return MultiObjectiveASHA(objectives, s.max_epochs, s.grace_epochs, s.reduction_factor)


def seed(scheduler: MultiObjectiveASHA, r: SearchRequest) -> None:
    """The earlier trials at the rungs they reached, with the values they reported on meeting
    each milestone, as MOASHA recorded them live: an earlier sweep's and the finished ones
    under names of their own, those continued from checkpoints too until Tune adds them again,
    then under their new trial id (a rung they passed is not judged again)."""
    for i, t in enumerate(r.prior.earlier + r.prior.finished):
        for milestone, point in scheduler.at_rungs(t.history).items():
            scheduler.recorded[milestone][f"prior-{i}"] = point
    for i, t in enumerate(r.prior.interrupted):
        for milestone, point in scheduler.at_rungs(t.history).items():
            scheduler.recorded[milestone][f"resumed-{i}"] = point
        scheduler.waiting.setdefault(key(t.config), []).append(f"resumed-{i}")
