"""The schedulers of tuner.config.schedulers, built for Ray Tune (imports Ray: loaded only when
a sweep runs):
each a builder, `fn(request) -> TrialScheduler`, and its resume seeding, `fn(scheduler,
request)`, which rebuilds from the trials' journals what it had seen before a kill.

Schedulers measure time in the trial's own `epoch` metric (plan.TIME_ATTR), not Tune's
`training_iteration`, which restarts at 1 whenever a trial resumes from a checkpoint.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from ray.tune.schedulers import ASHAScheduler

from tuner.cluster import _ray_internals
from tuner.search.plan import TIME_ATTR, PriorTrial, SearchRequest, key


class ResumableASHA(ASHAScheduler):
    """ASHA whose rungs hold an interrupted trial's earlier values under a name of its own
    (seed_asha) until the trial comes back, under a new Tune trial id, continuing from its
    checkpoint, and then under that id: it is not judged again at a rung it passed before
    the kill, as the uninterrupted sweep would not judge it (tests/test_algorithm_contract.py)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.waiting: dict[str, list[str]] = {}  # configuration key -> names in the rungs
        self.max_epochs, self.rf = int(kwargs["max_t"]), float(kwargs["reduction_factor"])
        self.sign = 1.0 if kwargs["mode"] == "max" else -1.0

    def at_resume(self, i: int, epoch: int) -> Optional[dict[str, Any]]:
        """ASHA's judgement of the i-th trial to be continued (seed_asha's `resumed-i`) at the
        epoch it recorded last, when that epoch is a rung's: made as ASHA makes it on the
        trial's report (its value against the rung's cutoff over the values recorded there
        before it: AsyncHyperBandScheduler's percentile). A driver killed between that report
        and the judgement lost it, and ASHA never judges a trial at a rung it is recorded at.
        None: the epoch is no rung's (the trial was judged at its rung and trained on), or
        there is nothing yet to judge it against. Exact where trials run one at a time; with
        several at once, the rung may hold values that came after the report."""
        if epoch >= self.max_epochs:
            return None
        name = f"resumed-{i}"
        for milestone, recorded in _ray_internals.asha_rungs(self):
            if milestone != epoch or name not in recorded:
                continue
            others = [v for k, v in recorded.items() if k != name]
            if not others:
                return None
            cutoff = float(np.nanpercentile(others, (1 - 1 / self.rf) * 100))
            value = recorded[name]
            return {
                TIME_ATTR: epoch,
                "stop": bool(value < cutoff),
                "value": self.sign * value,
                "cutoff": self.sign * cutoff,
            }
        return None

    def brief(self, verdict: dict[str, Any]) -> str:
        """A judgement of `at_resume` in a few words."""
        return f"{self._metric} {verdict['value']:.4g} short of the rung's cutoff {verdict['cutoff']:.4g}"

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        super().on_trial_add(tune_controller, trial)
        names = self.waiting.get(key(trial.config)) if self.waiting else None
        if names:
            name = names.pop(0)
            for _, recorded in _ray_internals.asha_rungs(self):
                if name in recorded:
                    recorded[trial.trial_id] = recorded.pop(name)


def asha(r: SearchRequest) -> Any:
    """Ray's ASHA (AsyncHyperBandScheduler, one bracket) over the trials' epochs."""
    s = r.schedule
    return ResumableASHA(
        time_attr=TIME_ATTR,
        metric=r.metric,
        mode=r.direction,
        max_t=s.max_epochs,
        grace_period=s.grace_epochs,
        reduction_factor=s.reduction_factor,
    )


def seed_asha(scheduler: Any, r: SearchRequest) -> None:
    """Record the earlier trials at the rungs they reached, as ASHA did when it ran them.

    Without them a resumed sweep's rungs start empty, and its first trials go on at every
    rung unopposed. The trials: an earlier sweep's (warm start), the finished ones of this
    sweep's earlier run, and those it continues (interrupted: renamed when they come back).
    (Ray's AsyncHyperBandScheduler keeps rungs in `_brackets[i]._rungs`: (milestone,
    {trial_id: value * metric_op}) from the top down; tested in test_bohb.)
    """
    prior = r.prior
    _record_rungs(scheduler, [(f"prior-{i}", t) for i, t in enumerate(prior.earlier + prior.finished)], r)
    interrupted = [(f"resumed-{i}", t) for i, t in enumerate(prior.interrupted)]
    _record_rungs(scheduler, interrupted, r)
    for name, t in interrupted:
        scheduler.waiting.setdefault(key(t.config), []).append(name)


def _record_rungs(scheduler: Any, trials: list[tuple[str, PriorTrial]], r: SearchRequest) -> None:
    op = 1.0 if r.direction == "max" else -1.0
    for milestone, recorded in _ray_internals.asha_rungs(scheduler):
        for name, t in trials:
            # The value it reported on meeting the milestone, as Ray records it (-inf too).
            values = [row.get(r.metric) for row in t.history if (row.get(TIME_ATTR) or 0) >= milestone]
            if values and isinstance(values[0], (int, float)):
                recorded[name] = op * values[0]
