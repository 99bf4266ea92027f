"""Asynchronous BOHB: hpbandster's density model proposing, ASHA deciding who goes on
(imports Ray: loaded only when a sweep runs).

The model sees the space through `IntsAsFloats`: hpbandster models an integer range as a
continuous value rounded to the nearest integer, which gives the range's two ends half the
share of the others (1..3 drawn 1/4, 1/2, 1/4 from a flat model), and ConfigSpace draws a
log-integer range its own way; here each integer owns an equal stretch of a float range (of
log space for lograndint), so a flat model draws the space's own distribution, as random
search does. What hpbandster itself gets wrong is fixed in tuner.search.hpbandster_fixes.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from ray.tune.search import Searcher

from tuner.results import finite
from tuner.search.hpbandster_fixes import count_every_choice, fast_truncnorm, quiet_statsmodels
from tuner.search.plan import TIME_ATTR
from tuner.search.searchers import Feasible, _SavesState
from tuner.space.params import Fixed, LogRandInt, LogUniform, ParamT, RandInt, Uniform, to_configspace

# Keyword arguments of hpbandster's BOHB config generator, chosen with scripts/bench_search.py
# (BENCHMARKS.md).
BOHB_SETTINGS: dict[str, Any] = {}
# When two budgets' results rank configurations alike: the rank correlation (Spearman) of the
# losses at both, over the trials told at both (MIN_PAIRS at least, else not measured), is
# AGREEMENT or more one standard error below its estimate (`AsyncBOHB.agrees`). A model is used
# only where its budget's ranks agree with the later budgets' and the lower rungs that chose its
# trials agree with its own (`AsyncBOHB.trust`); elsewhere the proposals are random (measured
# with scripts/bench_search.py: BENCHMARKS.md, "bohb and a misleading first rung").
AGREEMENT = 0.5
MIN_PAIRS = 6


class IntsAsFloats:
    """The searched space as hpbandster sees it: each integer range a float range whose equal
    stretches round to its integers (randint k: [k - 0.5, k + 0.5); lograndint k: [k, k + 1)
    in log space, as the space draws it), except where a `when:` names the integer (its
    conditions compare integers). `decode` turns a proposal back into the space's values,
    `encode` a configuration of the space into the model's."""

    def __init__(self, params: dict[str, ParamT], seed: Optional[int]):
        named = {parent for p in params.values() for parent in (getattr(p, "when", None) or {})}
        self.floated: dict[str, ParamT] = {
            k: p for k, p in params.items() if isinstance(p, (RandInt, LogRandInt)) and k not in named
        }
        model: dict[str, ParamT] = {}
        for k, p in params.items():
            if isinstance(p, Fixed):
                continue
            if isinstance(p, RandInt) and k in self.floated:
                model[k] = Uniform(type="uniform", low=p.low - 0.5, high=p.high + 0.5, when=p.when)
            elif isinstance(p, LogRandInt) and k in self.floated:
                model[k] = LogUniform(type="loguniform", low=p.low, high=p.high + 1, when=p.when)
            else:
                model[k] = p
        self.space = to_configspace(model, seed=seed)

    def decode(self, config: dict[str, Any]) -> dict[str, Any]:
        out = dict(config)
        for k, p in self.floated.items():
            if k in out:
                x = float(out[k])
                k_int = math.floor(x + 0.5) if isinstance(p, RandInt) else math.floor(x)
                out[k] = min(max(k_int, p.low), p.high)  # type: ignore[union-attr]
        return out

    def encode(self, config: dict[str, Any]) -> dict[str, Any]:
        out = dict(config)
        for k, p in self.floated.items():
            if k in out:
                v = int(out[k])
                out[k] = float(v) if isinstance(p, RandInt) else math.sqrt(v * (v + 1.0))  # mid-stretch
        return out


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

    def __init__(
        self,
        space: IntsAsFloats,
        metric: str,
        direction: str,
        budgets: list[int],
        seed: Optional[int] = None,
        feasible: Optional[Feasible] = None,
    ):
        import numpy as np
        from hpbandster.optimizers.config_generators.bohb import BOHB  # statsmodels: seconds

        super().__init__(metric=metric, mode=direction)
        fast_truncnorm()
        self.encoding = space
        with quiet_statsmodels():
            self.bohber = BOHB(space.space, **BOHB_SETTINGS)
        # hpbandster draws from numpy's global generator (the random share, the model's
        # samples), which Ray's schedulers also draw from: a generator of our own, swapped in
        # for each proposal, keeps "same seed, same results, same suggestions" true.
        self.rng_state = np.random.RandomState(seed).get_state()
        self.budgets = sorted(set(budgets))
        self.sign = -1.0 if direction == "max" else 1.0  # hpbandster minimises a loss
        self.configs: dict[str, dict[str, Any]] = {}
        self.told: dict[str, set[int]] = {}  # trial -> budgets already told
        self.last: dict[str, int] = {}  # trial -> last epoch seen
        self.failed: set[str] = set()
        self.feasible = feasible or Feasible({}, [], seed)
        self.first: list[dict[str, Any]] = []  # proposed before the model (search.start_with)
        # trial id -> origin: start_with, or the searcher's and how it proposed (see `suggest`)
        self.handed: dict[str, str] = {}
        # budget -> (a trial's number: `numbers`) -> the loss told there, for the agreement
        self.at_budget: dict[int, dict[int, float]] = {b: {} for b in self.budgets}
        self.numbers: dict[str, int] = {}  # trial id -> a number of its own (replays included)
        self.proposed = ""  # how the latest proposal was made

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        """A configuration, recorded with its origin: `start_with`, or `searcher: model at N
        epochs`, `searcher: random` (no model yet, or hpbandster's random share), `searcher:
        random: ...` saying why the model it has is not trusted (`trust`)."""
        if self.first:
            self.handed[trial_id] = "start_with"
            config = self.first.pop(0)
        else:  # redrawn while one breaks a constraint
            config = self.feasible.propose(self._propose, lambda: None)
            self.handed[trial_id] = f"searcher: {self.proposed}"
        self._number(trial_id)
        self.configs[trial_id] = dict(config)
        self.told[trial_id] = set()
        return dict(config)

    def _number(self, trial_id: str) -> None:
        self.numbers[trial_id] = len(self.numbers)

    def _propose(self) -> dict[str, Any]:
        budget = self.bohber.largest_budget_with_model()  # (-inf: no model yet)
        why = self.trust(int(budget)) if finite(budget) else None
        models = self.bohber.kde_models
        if why is not None:  # a model fitted where the ranks mislead: none (random, as before any)
            self.bohber.kde_models = {}
        try:
            with self._own_generator(), quiet_statsmodels():
                config, info = self.bohber.get_config(None)
        finally:
            self.bohber.kde_models = models
        if info.get("model_based_pick"):
            self.proposed = f"model at {_epochs(int(budget))}"
        else:
            self.proposed = "random" + ("" if why is None else f": {why}")
        return self.encoding.decode(config)

    def agreement(self, low: int, high: int) -> Optional[float]:
        """The rank correlation (Spearman) of the losses told at two budgets, over the trials
        told at both; None with fewer than MIN_PAIRS of them (or no spread to rank)."""
        from scipy.stats import spearmanr

        at_low, at_high = self.at_budget[low], self.at_budget[high]
        both = sorted(set(at_low) & set(at_high))
        if len(both) < MIN_PAIRS:
            return None
        rho = spearmanr([at_low[t] for t in both], [at_high[t] for t in both]).statistic
        return float(rho) if math.isfinite(rho) else None

    def agrees(self, low: int, high: int) -> Optional[tuple[bool, str]]:
        """Whether the ranks at two budgets clearly agree: the Spearman correlation one
        standard error below its estimate (Fisher's z, Fieller et al.'s 1.06 / (n - 3) for a
        rank correlation) at least AGREEMENT; and the figures in words. None: not measured."""
        rho = self.agreement(low, high)
        if rho is None:
            return None
        n = len(set(self.at_budget[low]) & set(self.at_budget[high]))
        lower = math.tanh(math.atanh(min(max(rho, -0.9999), 0.9999)) - math.sqrt(1.06 / (n - 3)))
        return lower >= AGREEMENT, f"Spearman {rho:.2f} over {n} trials"

    def trust(self, budget: int) -> Optional[str]:
        """Why the model fitted at `budget` is not to be used, or None when it is. The trials
        told at a budget are those the lower rungs let through: where a lower rung does not
        clearly rank them as the budget does (`agrees`), they are a sample chosen by the wrong
        order (the conditional task's survivors of epoch 1 are mostly sgd, so a model of the
        top budget learns that sgd is good), and the model is not used. Beyond that, the top
        budget's model is; a lower one when its ranks clearly agree with those of every later
        budget compared with it so far, at least one of them trusted."""
        for low in (b for b in self.budgets if b < budget):
            checked = self.agrees(low, budget)
            if checked is not None and not checked[0]:
                return (
                    f"the trials at {_epochs(budget)} passed the rung at {_epochs(low)}, whose ranks"
                    f" disagree with those at {_epochs(budget)} ({checked[1]})"
                )
        if budget >= self.budgets[-1]:
            return None
        later = [(b, self.agrees(budget, b)) for b in self.budgets if b > budget]
        measured = [(b, checked) for b, checked in later if checked is not None]
        if not measured:
            return f"the model at {_epochs(budget)} not yet checked against a later rung"
        for b, (ok, figures) in measured:
            if not ok:
                return f"ranks at {_epochs(budget)} disagree with those at {_epochs(b)} ({figures})"
        if all(self.trust(b) is not None for b, _ in measured):
            return f"the later rungs that agree with the one at {_epochs(budget)} are not trusted yet"
        return None

    @contextmanager
    def _own_generator(self) -> Iterator[None]:
        """numpy's global generator holds this searcher's state for the duration: hpbandster
        draws from it when proposing and when fitting (it fills a conditional parameter's
        absent values with random ones), and the global one is seeded by nobody."""
        import numpy as np

        outside = np.random.get_state()
        np.random.set_state(self.rng_state)
        try:
            yield
        finally:
            self.rng_state = np.random.get_state()
            np.random.set_state(outside)

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

    def adopt(self, name: str, config: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """An interrupted trial of an earlier run, which continues: told what it reported
        before the interruption, by the rules of a live one (its later results follow)."""
        self._number(name)
        self.configs[name] = {k: v for k, v in config.items() if k in self.encoding.space}
        self.told[name] = set()
        for row in history:
            self._observe(name, row)

    def rename(self, name: str, trial_id: str) -> None:
        """The adopted trial `name` runs again as Tune's `trial_id`."""
        for d in (self.configs, self.told, self.last, self.numbers):
            if name in d:
                d[trial_id] = d.pop(name)
        if name in self.failed:
            self.failed.discard(name)
            self.failed.add(trial_id)

    def replay(self, config: dict[str, Any], history: list[dict[str, Any]], error: bool = False) -> None:
        """Tell the model an earlier run's trial (a resumed sweep) by the rules of a live one."""
        trial_id = f"replay-{len(self.numbers)}"
        self._number(trial_id)
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
            self.at_budget[budget][self.numbers[trial_id]] = loss
            with self._own_generator(), quiet_statsmodels():
                self.bohber.new_result(_Job(loss, budget, self.encoding.encode(self.configs[trial_id])))
            count_every_choice(self.bohber)


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("" if n == 1 else "s")
