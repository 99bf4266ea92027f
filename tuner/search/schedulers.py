"""The schedulers of tuner.config.schedulers, built for Ray Tune (imports Ray: loaded only when
a sweep runs):
each a builder, `fn(request) -> TrialScheduler`, and its resume seeding, `fn(scheduler,
request)`, which rebuilds from the trials' journals what it had seen before a kill.

Schedulers measure time in the trial's own `epoch` metric (plan.TIME_ATTR), not Tune's
`training_iteration`, which restarts at 1 whenever a trial resumes from a checkpoint.
"""

from __future__ import annotations

from typing import Any

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
        mode=r.mode,
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
    op = 1.0 if r.mode == "max" else -1.0
    for milestone, recorded in _ray_internals.asha_rungs(scheduler):
        for name, t in trials:
            # The value it reported on meeting the milestone, as Ray records it (-inf too).
            values = [row.get(r.metric) for row in t.history if (row.get(TIME_ATTR) or 0) >= milestone]
            if values and isinstance(values[0], (int, float)):
                recorded[name] = op * values[0]
