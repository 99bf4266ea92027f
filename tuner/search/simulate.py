"""Tune's controller in miniature: a search plan's real scheduler and searcher driven with a
learning curve in place of training, thousands of trials in seconds.

Used by the tests of the algorithms (tests/test_bohb.py) and by the search benchmark
(scripts/bench_search.py), so both exercise exactly what `algorithms.build` gives a sweep.
What it does not model: wall-clock time (every epoch costs the same), trial start-up, and
asynchrony beyond `slots` trials taking turns epoch by epoch (a real sweep's trials finish
epochs in whatever order their speeds give).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

# metric after `epoch` epochs of `config` (a non-finite value: the trial diverged there;
# None: it crashed there, as a trial whose code raises), or with several objectives a dict of
# every objective's value
Curve = Callable[[dict[str, Any], int, random.Random], Union[None, float, dict[str, float]]]


@dataclass
class Trial:
    config: dict[str, Any]
    values: list[float] = field(default_factory=list)  # the metric at epoch 1, 2, ...
    failed: bool = False  # ended diverged (its last value is the worst) or crashed
    crashed: bool = False  # ended by an error (its code raised): no value at its last epoch
    ended: bool = False  # finished: stopped, failed or at max_epochs (False: still running)
    resumed_at: int = 0  # continued from a checkpoint at this epoch (a resumed sweep's trial)
    stopped: bool = False  # stopped by the scheduler before max_epochs
    rows: list[dict[str, Any]] = field(default_factory=list)  # the results it reported here


@dataclass(eq=False)
class Handle:
    """What the scheduler and searcher are given of a trial, as Tune gives them its Trial
    (hashable by identity, as a Trial is: Ray's MedianStoppingRule keys its results by it)."""

    trial_id: str
    config: dict[str, Any]


@dataclass
class Event:
    """One epoch of one trial, in the order they ran."""

    trial_id: str
    epoch: int
    value: float


def simulate(
    plan: Any,
    n: int,
    max_epochs: int,
    curve: Curve,
    slots: int = 2,
    seed: int = 0,
    metric: str = "val_acc",
    direction: str = "max",
    log: Optional[list[Event]] = None,
    epoch_budget: Optional[int] = None,
    continued: Optional[list[list[float]]] = None,
) -> dict[str, Trial]:
    """Run n trials, `slots` at a time, through the plan's scheduler and searcher as Tune's
    controller does (ray.tune.execution.tune_controller): a result goes to the scheduler
    first, to the searcher only if the trial goes on, and a stopped trial's last result to
    the searcher's on_trial_complete. Trials side by side take turns epoch by epoch (the one
    with the fewest epochs next). A non-finite value ends the trial as tuner's loop does: the
    row carries the worst value and `failure: diverged`. Every epoch is appended to `log`.
    With `epoch_budget`, the run ends once that many epochs are spent in all, trials running
    or not (as a sweep's schedule.time_budget ends it, or a kill -9: the trials not `ended`
    are those a resumed sweep continues). A curve's None is a crash: the scheduler's
    on_trial_error and the searcher's on_trial_complete(error=True), as Tune tells them.
    `continued`: the values so far of the trials a resumed sweep continues from their
    checkpoints, the first ones its searcher hands out (ResumeFirst): they report from the
    epoch after, as a resumed trial does under a new Tune trial id.
    """
    sched, searcher, rng = plan.scheduler, plan.search_alg, random.Random(seed)
    worst = -math.inf if direction == "max" else math.inf
    trials: dict[str, Trial] = {}
    running: list[Handle] = []
    spent = 0
    while (len(trials) < n or running) and (epoch_budget is None or spent < epoch_budget):
        while len(running) < slots and len(trials) < n:
            tid = f"t{len(trials)}"
            suggested = searcher.suggest(tid)
            if suggested is None or suggested == "FINISHED":
                n = len(trials)
                break
            config = {**plan.param_space, **suggested}
            earlier = list(continued[len(trials)]) if continued and len(trials) < len(continued) else []
            trials[tid] = Trial(config, earlier, resumed_at=len(earlier))
            running.append(Handle(tid, config))
            if sched is not None:
                sched.on_trial_add(None, running[-1])
        if not running:
            break
        handle = min(running, key=lambda t: len(trials[t.trial_id].values))
        trial = trials[handle.trial_id]
        raw = curve(trial.config, len(trial.values) + 1, rng)
        spent += 1
        if raw is None:  # crashed: Tune reports no result, the trial errs
            trial.failed = trial.crashed = trial.ended = True
            if sched is not None:
                sched.on_trial_error(None, handle)
            searcher.on_trial_complete(handle.trial_id, None, error=True)
            running.remove(handle)
            continue
        values = {k: float(v) for k, v in raw.items()} if isinstance(raw, dict) else {metric: float(raw)}
        result: dict[str, Any] = {"epoch": len(trial.values) + 1, **values}
        if not math.isfinite(result[metric]):
            result.update({metric: worst, "failure": "diverged"})
            trial.failed = True
        trial.values.append(result[metric])
        trial.rows.append(result)
        if log is not None:
            log.append(Event(handle.trial_id, result["epoch"], result[metric]))
        decision = sched.on_trial_result(None, handle, result) if sched is not None else "CONTINUE"
        if decision == "STOP" or trial.failed or len(trial.values) >= max_epochs:
            trial.ended = True
            trial.stopped = decision == "STOP" and not trial.failed and len(trial.values) < max_epochs
            if sched is not None:
                sched.on_trial_complete(None, handle, result)
            searcher.on_trial_complete(handle.trial_id, result)
            running.remove(handle)
        else:
            searcher.on_trial_result(handle.trial_id, result)
    return trials


def resumed_from(trials: dict[str, Trial], n: int) -> tuple[Any, list[list[float]]]:
    """What a sweep of n trials, killed where `trials` stand (`epoch_budget`), resumes from, as
    the driver reads it back from their journals (tuner.driver.sweep): the search plan's Prior
    and the values so far of the trials it continues (`simulate`'s `continued`). The results
    are the rows the trials reported here (every objective of them)."""
    from tuner.search.plan import Prior, PriorTrial

    ended = [t for t in trials.values() if t.ended]
    running = [t for t in trials.values() if not t.ended]
    prior = Prior(
        finished=[PriorTrial(t.config, t.rows, t.crashed) for t in ended],
        resumed=[t.config for t in running],
        interrupted=[PriorTrial(t.config, t.rows) for t in running],
        new=n - len(trials),
    )
    return prior, [list(t.values) for t in running]
