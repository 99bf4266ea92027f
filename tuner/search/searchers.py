"""Searcher wrappers (imports Ray: loaded only when a sweep runs)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, Optional

import cloudpickle
from ray.tune.search import Searcher

from tuner.errors import ConfigError
from tuner.results import best_row_of, finite
from tuner.search.plan import TIME_ATTR
from tuner.space import conditions
from tuner.space.constraints import allows
from tuner.space.params import Fixed, LogRandInt, ParamT, to_optuna
from tuner.sweepdir import STOPPED_ITSELF


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

    Those trials continue from their checkpoints in their own directories, under new Tune
    trial ids. The inner searcher adopts each when it is built (`adopt`: told what the trial
    reported before the interruption, as it was told live) and follows it under its new id
    once handed out (`rename`), so that it learns how the trial ends, as the uninterrupted
    sweep's searcher would.
    """

    def __init__(self, inner: Any, prior: Any):
        super().__init__(metric=inner.metric, mode=inner.mode)
        histories = [t.history for t in prior.interrupted]
        if len(histories) != len(prior.resumed):  # (an earlier run that kept none)
            histories = [[] for _ in prior.resumed]
        self.inner, self.queue = inner, []
        for i, (config, history) in enumerate(zip(prior.resumed, histories, strict=True)):
            name = f"resumed-{i}"
            inner.adopt(name, dict(config), history)
            self.queue.append((name, dict(config)))

    def set_search_properties(
        self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any
    ) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        if self.queue:
            name, config = self.queue.pop(0)
            self.inner.rename(name, trial_id)
            return config
        return self.inner.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        self.inner.on_trial_complete(trial_id, result=result, error=error)


class Listed(_SavesState, Searcher):
    """Hands out a fixed list of configurations in order (grid and random search), each
    recorded in `handed` with its origin ("": a trial that continues, recorded before)."""

    def __init__(self, configs: list[tuple[dict[str, Any], str]]):
        super().__init__()
        self.queue = [(dict(c), origin) for c, origin in configs]
        self.handed: dict[str, str] = {}

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        if not self.queue:
            return Searcher.FINISHED
        config, origin = self.queue.pop(0)
        if origin:
            self.handed[trial_id] = origin
        return config

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        pass  # learns nothing


MODEL_DRAWS = 100  # proposals of a model-based searcher that break a constraint before a random draw


class Feasible:
    """The constraints as a model-based searcher meets them: its proposals are checked (the
    space's fixed values filled in); after MODEL_DRAWS broken ones in a row, a random
    configuration that keeps them is taken instead (conditions.feasible_draw), so a model
    that keeps proposing from a broken region cannot stall the sweep."""

    def __init__(self, params: dict[str, ParamT], constraints: list[str], seed: Optional[int]):
        self.params, self.constraints = params, list(constraints)
        self.fixed = {k: p.value for k, p in params.items() if isinstance(p, Fixed)}
        self.rng = random.Random(seed)

    def propose(self, draw: Callable[[], dict[str, Any]], reject: Callable[[], None]) -> dict[str, Any]:
        """`draw()` until a configuration keeps the constraints (`reject()` after each broken
        one), or a random configuration that keeps them."""
        for _ in range(MODEL_DRAWS if self.constraints else 1):
            config = draw()
            if allows(self.constraints, {**self.fixed, **config}):
                return config
            reject()
        config = conditions.feasible_draw(self.params, self.constraints, self.rng, MAX_RANDOM_DRAWS)
        if config is None:
            raise ConfigError(
                "search.constraints",
                f"{MAX_RANDOM_DRAWS:,} random draws in a row broke them (they leave too little of the "
                "space; loosen them, or search fewer values)",
            )
        return {k: v for k, v in config.items() if k not in self.fixed}

    def searched_where(self, config: dict[str, Any], name: str) -> bool:
        """Whether the searched parameter `name` applies next to `config` (fixed values in)."""
        return conditions.applies(self.params[name], {**self.fixed, **config})


MAX_RANDOM_DRAWS = 10_000


class OptunaSearch(_SavesState, Searcher):
    """An Optuna sampler (TPE, CMA-ES, GP, NSGA-II: tuner.search.samplers), define-by-run: a
    conditional parameter is suggested only where its condition holds (so a model sees it on
    the trials that have it).

    A proposal that breaks a constraint is told to the study as failed (no sampler learns
    from failed trials) and a fresh one asked for, in the same Tune trial; see Feasible.
    Told like Ray's OptunaSearch: each result as an intermediate value at its epoch, the
    trial's last value when it completes; an error, a reported `failure` or a non-finite
    value is a failed trial. A trial the scheduler stopped before `max_epochs` is told as
    `stopped_early` says: PRUNED (TPE ranks such trials below every complete one, among
    themselves by the epoch they reached, then their last value; CMA-ES takes their last
    value) or COMPLETE (its last value: a value at epoch 3 ranked against values at max_epochs).
    A trial whose own code ended it before `max_epochs` (its early stopping: `stopped itself`)
    finished as its user meant it to: COMPLETE with its last value, as a trial at max_epochs
    (told PRUNED, TPE would rank it below every complete trial, and GP, NSGA-II and CMA-ES
    would not learn from it at all).

    With several `objectives` the study is multi-objective and is told, when a trial completes,
    every objective's value at the trial's best epoch of the first: where summary.json's
    Pareto front judges it (tuner.results.pareto). Optuna takes no intermediate values there.

    Earlier trials (a resumed sweep's, a warm start's) are told through `replay`: added to the
    study as they ended, or, for a sampler whose state lives in its trials' system attributes
    (`replay_by_asking`: CMA-ES's and NSGA-II's generations), asked for with their own values
    fixed and told, so that the sampler counts them as it counted its own.
    """

    def __init__(
        self,
        params: dict[str, ParamT],
        objectives: list[tuple[str, str]],
        sampler: Any,
        feasible: Feasible,
        max_epochs: Optional[int] = None,
        stopped_early: str = "PRUNED",
        replay_by_asking: bool = False,
    ):
        import optuna

        metric, direction = objectives[0]
        super().__init__(metric=metric, mode=direction)
        self.objectives = list(objectives)
        self.study = optuna.create_study(
            directions=["maximize" if m == "max" else "minimize" for _, m in self.objectives],
            sampler=sampler,
            pruner=optuna.pruners.NopPruner(),
        )
        self.rows: dict[str, list[dict[str, Any]]] = {}  # several objectives: each trial's values
        self.searched = {k: p for k, p in params.items() if not isinstance(p, Fixed)}
        self.names = conditions.order(self.searched)
        self.feasible = feasible
        self.max_epochs = max_epochs  # a trial ended before it was stopped early (by the scheduler)
        self.stopped_early, self.replay_by_asking = stopped_early, replay_by_asking
        self.trials: dict[str, Any] = {}  # Tune trial id -> optuna trial
        self.reported: dict[str, set[int]] = {}
        self.first: list[dict[str, Any]] = []  # proposed before the sampler (search.start_with)
        self.handed: dict[str, str] = {}  # trial id -> origin (start_with or searcher)

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        asked: list[Any] = []

        def draw() -> dict[str, Any]:
            asked.append(self.study.ask())
            return self._define(asked[-1])

        def reject() -> None:
            self.study.tell(asked.pop(), state=_state("FAIL"))

        self.handed[trial_id] = "start_with" if self.first else "searcher"
        config = self.first.pop(0) if self.first else self.feasible.propose(draw, reject)
        if not asked:  # given, or a random draw after the model's kept breaking the constraints
            self.study.enqueue_trial({k: study_value(self.searched[k], v) for k, v in config.items()})
            asked.append(self.study.ask())
            config = self._define(asked[-1])
        self.trials[trial_id], self.reported[trial_id] = asked[-1], set()
        return config

    def _define(self, ot: Any) -> dict[str, Any]:
        config: dict[str, Any] = {}
        for name in self.names:
            if self.feasible.searched_where(config, name):
                config[name] = _suggest(ot, name, self.searched[name])
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        step = result.get(TIME_ATTR)
        if len(self.objectives) > 1:
            if trial_id in self.trials and not (finite(step) and int(step) in self.reported[trial_id]):
                self.rows.setdefault(trial_id, []).append(self._kept(result))
                if finite(step):
                    self.reported[trial_id].add(int(step))
            return
        ot, value = self.trials.get(trial_id), result.get(self.metric)
        if ot is not None and finite(value) and finite(step) and int(step) not in self.reported[trial_id]:
            self.reported[trial_id].add(int(step))
            ot.report(float(value), int(step))

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        itself = self._ended_itself(trial_id, result)
        if result:  # the stopping result, which Tune gives the scheduler only (a pruned trial's last)
            self.on_trial_result(trial_id, result)
        ot = self.trials.pop(trial_id, None)
        self.reported.pop(trial_id, None)
        rows = self.rows.pop(trial_id, [])  # (the stopping result among them, just above)
        if ot is None:
            return
        values = self._values(rows) if len(self.objectives) > 1 else _one((result or {}).get(self.metric))
        short = not itself and self._stopped_early((result or {}).get(TIME_ATTR))  # by a scheduler
        if error or "failure" in (result or {}) or values is None:
            self.study.tell(ot, state=_state("FAIL"))
        elif self.stopped_early == "PRUNED" and short:
            self.study.tell(ot, state=_state("PRUNED"))
        else:
            self.study.tell(ot, values)

    def _kept(self, result: dict) -> dict[str, Any]:
        """What the study needs of a result: the objectives' values, and whether it failed."""
        names = [n for n, _ in self.objectives] + ["failure"]
        return {k: result[k] for k in names if k in result}

    def _values(self, rows: list[dict[str, Any]]) -> Optional[list[float]]:
        """Every objective's value at the best epoch of the first; None if one is missing."""
        if any("failure" in r for r in rows):
            return None
        row = best_row_of(rows, *self.objectives[0]) or {}
        values = [row.get(n) for n, _ in self.objectives]
        return [float(v) for v in values] if all(finite(v) for v in values) else None  # type: ignore[arg-type]

    def _stopped_early(self, epoch: Any) -> bool:
        return self.max_epochs is not None and finite(epoch) and int(epoch) < self.max_epochs

    def _ended_itself(self, trial_id: str, result: Optional[dict]) -> bool:
        """Whether the trial's own code ended it: its function returned (or its script exited).
        Tune then completes it with the result it reported last, which this searcher was told
        already, marked done (ray.tune's RESULT_DUPLICATE); a scheduler's or a stopper's stop
        comes with a result the searcher has not been told, and a trial stopped with the sweep
        is not done. (The trial marks its journal `stopped_itself` only after that last report.)"""
        r = result or {}
        step = r.get(TIME_ATTR)
        return bool(r.get("done")) and finite(step) and int(step) in self.reported.get(trial_id, ())

    def adopt(self, name: str, config: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """An interrupted trial of an earlier run, which continues: asked for with its own
        values and told what it reported before the interruption, as it was told live."""
        params = {k: study_value(self.searched[k], config[k]) for k in self.searched if k in config}
        self.study.enqueue_trial(params)
        ot = self.study.ask()
        self._define(ot)
        self.trials[name], self.reported[name] = ot, set()
        for row in history:
            self.on_trial_result(name, row)

    def rename(self, name: str, trial_id: str) -> None:
        """The adopted trial `name` runs again as Tune's `trial_id`."""
        for d in (self.trials, self.reported, self.rows):
            if name in d:
                d[trial_id] = d.pop(name)

    def replay(self, config: dict[str, Any], history: list[dict[str, Any]], error: bool = False) -> None:
        """Tell the study an earlier trial (a resumed sweep's, a warm start's), as it was told live."""
        import optuna

        values = {
            int(r[TIME_ATTR]): float(r[self.metric])
            for r in history
            if finite(r.get(self.metric)) and finite(r.get(TIME_ATTR))
        }
        several = self._values(history) if len(self.objectives) > 1 else None
        failed = error or not values or any("failure" in r for r in history)
        failed = failed or (len(self.objectives) > 1 and several is None)
        itself = bool(history and history[-1].get(STOPPED_ITSELF))
        short = not failed and not itself and self._stopped_early(max(values))
        stopped = self.stopped_early if short else "COMPLETE"
        state = "FAIL" if failed else stopped
        params = {k: study_value(self.searched[k], config[k]) for k in self.searched if k in config}
        if self.replay_by_asking:
            self.study.enqueue_trial(params)
            ot = self.study.ask()
            self._define(ot)  # (the enqueued values, as the sampler's own suggestions)
            for step, value in [] if failed or several else sorted(values.items()):
                ot.report(value, step)
            told = several if several else values[max(values)] if not failed else None
            self.study.tell(ot, None if state != "COMPLETE" else told, state=_state(state))
            return
        self.study.add_trial(
            optuna.trial.create_trial(
                state=_state(state),
                value=None if failed or several else values[max(values)],
                values=None if failed or state != "COMPLETE" else several,
                params=params,
                distributions={k: study_distribution(self.searched[k]) for k in params},
                intermediate_values=None if failed or several else values,
            )
        )


def _one(value: Any) -> Optional[float]:
    return float(value) if finite(value) else None


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


def _suggest(ot: Any, name: str, p: ParamT) -> Any:
    dist = study_distribution(p)
    kind = type(dist).__name__
    if kind == "FloatDistribution":
        x = ot.suggest_float(name, dist.low, dist.high, log=dist.log)
        return min(math.floor(x), p.high) if isinstance(p, LogRandInt) else x
    if kind == "IntDistribution":
        return ot.suggest_int(name, dist.low, dist.high, log=dist.log)
    return ot.suggest_categorical(name, list(dist.choices))


def study_distribution(p: ParamT) -> Any:
    """The distribution the study models `p` with: the space's own, except for a lograndint,
    which optuna would draw its own way (k as often as log-space [k - 0.5, k + 0.5) is wide:
    1..8 gives 1 in 39% of draws, not the space's 32%): a log-uniform float over
    [low, high + 1), whose integer part is the value, as the space draws it."""
    from optuna.distributions import FloatDistribution

    if isinstance(p, LogRandInt):
        return FloatDistribution(p.low, p.high + 1, log=True)
    return to_optuna(p)


def study_value(p: ParamT, value: Any) -> Any:
    """A configuration's value as the study holds it (a lograndint: the middle, in log
    space, of the stretch that gives it)."""
    return math.sqrt(int(value) * (int(value) + 1.0)) if isinstance(p, LogRandInt) else value
