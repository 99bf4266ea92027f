"""The schedulers of tuner.config.schedulers, built for Ray Tune (imports Ray when called):
each a builder, `fn(request) -> TrialScheduler`, and its resume seeding, `fn(scheduler,
request)`, which rebuilds from the trials' journals what it had seen before a kill.

Schedulers measure time in the trial's own `epoch` metric (plan.TIME_ATTR), not Tune's
`training_iteration`, which restarts at 1 whenever a trial resumes from a checkpoint.
"""

from __future__ import annotations

from typing import Any

from tuner.cluster import _ray_internals
from tuner.search.plan import TIME_ATTR, PriorTrial, SearchRequest


def asha(r: SearchRequest) -> Any:
    """Ray's ASHA (AsyncHyperBandScheduler, one bracket) over the trials' epochs."""
    from ray.tune.schedulers import ASHAScheduler

    s = r.schedule
    return ASHAScheduler(
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
    rung unopposed. The trials: an earlier sweep's (warm start) and the finished ones of this
    sweep's earlier run. (Ray's AsyncHyperBandScheduler keeps rungs in `_brackets[i]._rungs`:
    (milestone, {trial_id: value * metric_op}) from the top down; tested in test_bohb.)
    """
    _record_rungs(scheduler, r.prior.earlier + r.prior.finished, r.metric, r.mode)


def _record_rungs(scheduler: Any, trials: list[PriorTrial], metric: str, mode: str) -> None:
    op = 1.0 if mode == "max" else -1.0
    for milestone, recorded in _ray_internals.asha_rungs(scheduler):
        for i, t in enumerate(trials):
            # The value it reported on meeting the milestone, as Ray records it (-inf too).
            values = [r.get(metric) for r in t.history if (r.get(TIME_ATTR) or 0) >= milestone]
            if values and isinstance(values[0], (int, float)):
                recorded[f"prior-{i}"] = op * values[0]
