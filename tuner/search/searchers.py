"""Searcher wrappers (imports Ray: loaded only when a sweep runs)."""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any, Optional

import cloudpickle
from ray.tune.search import Searcher

from tuner.results import finite
from tuner.search.plan import TIME_ATTR


class _SavesState:
    """Searcher.save/restore (what Tune checkpoints): the whole state, pickled."""

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            cloudpickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(cloudpickle.load(f))


class ResumeFirst(_SavesState, Searcher):
    """Hands out the configurations of interrupted trials first, then the inner searcher's.

    Those trials continue from their checkpoints in their own directories; the inner
    searcher already knows their earlier results, so it is not told about them again.
    """

    def __init__(self, inner: Any, resumed: list[dict[str, Any]]):
        super().__init__(metric=inner.metric, mode=inner.mode)
        self.inner, self.queue, self.ours = inner, [dict(c) for c in resumed], set()

    def set_search_properties(
        self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any
    ) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        if self.queue:
            self.ours.add(trial_id)
            return self.queue.pop(0)
        return self.inner.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self.ours:
            self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        if trial_id not in self.ours:
            self.inner.on_trial_complete(trial_id, result=result, error=error)


class _Job:
    """What hpbandster's config generator reads of a finished run: a loss at a budget."""

    def __init__(self, loss: float, budget: float, config: dict[str, Any]):
        self.result = {"loss": loss}
        self.kwargs = {"budget": budget, "config": config}
        self.exception = None


class AsyncBOHB(_SavesState, Searcher):
    """BOHB's model proposing, ASHA deciding who goes on: asynchronous BOHB.

    hpbandster's config generator (Falkner et al., 2018: a kernel density model of the good
    and the bad configurations, fitted on the largest budget with enough results; a third of
    the proposals random) is told each trial's metric at the epochs where ASHA compares trials
    (its rungs) and at `max_epochs`. Those are the budgets: ASHA stops a trial only at a rung,
    so every trial reports at each rung it reaches.

    Tune tells a searcher of a result only if the scheduler lets the trial go on, and of the
    stopping result through `on_trial_complete` (ray.tune.execution.tune_controller), so both
    are read here: without the stopped trials' results the model would see only winners.
    A trial that fails (a crash, or a diverged one reporting a `failure`) counts as the worst
    loss at the next budget it did not reach, as hpbandster counts a crashed run.
    """

    def __init__(self, space: Any, metric: str, mode: str, budgets: list[int], seed: Optional[int] = None):
        import numpy as np
        from hpbandster.optimizers.config_generators.bohb import BOHB  # statsmodels: seconds

        super().__init__(metric=metric, mode=mode)
        self.bohber = BOHB(space)  # hpbandster's defaults
        # hpbandster draws from numpy's global generator (the random share, the model's
        # samples), which Ray's schedulers also draw from: a generator of our own, swapped in
        # for each proposal, keeps "same seed, same results, same suggestions" true.
        self.rng_state = np.random.RandomState(seed).get_state()
        self.budgets = sorted(set(budgets))
        self.sign = -1.0 if mode == "max" else 1.0  # hpbandster minimises a loss
        self.configs: dict[str, dict[str, Any]] = {}
        self.told: dict[str, set[int]] = {}  # trial -> budgets already told
        self.last: dict[str, int] = {}  # trial -> last epoch seen
        self.failed: set[str] = set()

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        import numpy as np

        outside = np.random.get_state()
        np.random.set_state(self.rng_state)
        try:
            config, _ = self.bohber.get_config(None)
        finally:
            self.rng_state = np.random.get_state()
            np.random.set_state(outside)
        self.configs[trial_id] = dict(config)
        self.told[trial_id] = set()
        return dict(config)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self.configs:
            self._observe(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        if trial_id not in self.configs:
            return
        if result:
            self._observe(trial_id, result)
        if error and trial_id not in self.failed:
            self._fail(trial_id, self.last.get(trial_id, 0) + 1)
        for d in (self.configs, self.told, self.last):
            d.pop(trial_id, None)
        self.failed.discard(trial_id)

    def replay(self, config: dict[str, Any], history: list[dict[str, Any]], error: bool = False) -> None:
        """Tell the model an earlier run's trial (a resumed sweep) by the rules of a live one."""
        trial_id = f"replay-{len(self.configs)}"
        self.configs[trial_id], self.told[trial_id] = dict(config), set()
        for row in history:
            self._observe(trial_id, row)
        self.on_trial_complete(trial_id, error=error)

    def _observe(self, trial_id: str, result: dict) -> None:
        epoch = result.get(TIME_ATTR)
        if not finite(epoch) or trial_id in self.failed:
            return
        epoch = int(epoch)
        self.last[trial_id] = max(epoch, self.last.get(trial_id, 0))
        value = result.get(self.metric)
        if "failure" in result or (isinstance(value, float) and not math.isfinite(value)):
            self._fail(trial_id, epoch)
        elif epoch in self.budgets and finite(value):
            self._tell(trial_id, epoch, self.sign * value)

    def _fail(self, trial_id: str, epoch: int) -> None:
        self.failed.add(trial_id)
        i = bisect_left(self.budgets, epoch)  # the first budget at or after the failure
        if i < len(self.budgets):
            self._tell(trial_id, self.budgets[i], math.inf)

    def _tell(self, trial_id: str, budget: int, loss: float) -> None:
        if budget not in self.told[trial_id]:
            self.told[trial_id].add(budget)
            self.bohber.new_result(_Job(loss, budget, self.configs[trial_id]))
