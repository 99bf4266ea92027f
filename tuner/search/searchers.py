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


class Listed(_SavesState, Searcher):
    """Hands out a fixed list of configurations in order (grid and random search)."""

    def __init__(self, configs: list[dict[str, Any]]):
        super().__init__()
        self.queue = [dict(c) for c in configs]

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        return self.queue.pop(0) if self.queue else Searcher.FINISHED

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

# Optuna's settings (keyword arguments of its TPESampler; sampler=gp: its GPSampler instead), chosen
# with scripts/bench_search.py (BENCHMARKS.md); bohb's are tuner.search.bohb.BOHB_SETTINGS.
TPE_SETTINGS: dict[str, Any] = {}
# How Optuna is told of a trial ASHA stopped before max_epochs: PRUNED (TPE ranks such trials
# below every complete one, among themselves by the epoch they reached, then their last value)
# or COMPLETE (its last value, as Ray's OptunaSearch tells it: a value at epoch 3 ranked
# against values at max_epochs).
STOPPED_EARLY = "PRUNED"


class OptunaTPE(_SavesState, Searcher):
    """Optuna's TPE sampler, define-by-run: a conditional parameter is suggested only where its
    condition holds (so TPE models it on the trials that have it).

    A proposal that breaks a constraint is told to the study as failed (TPE learns from
    complete and pruned trials only) and a fresh one asked for, in the same Tune trial; see
    Feasible. Told like Ray's OptunaSearch: each result as an intermediate value at its epoch,
    the trial's last value when it completes; an error, a reported `failure` or a non-finite
    value is a failed trial.

    With several `objectives` the study is multi-objective (optuna's TPE then is MOTPE, Ozaki
    et al. 2020) and is told, when a trial completes, every objective's value at the trial's
    best epoch of the first: where summary.json's Pareto front judges it (tuner.results.pareto).
    Optuna takes no intermediate values there.
    """

    def __init__(
        self,
        params: dict[str, ParamT],
        objectives: list[tuple[str, str]],
        seed: int,
        feasible: Feasible,
        max_epochs: Optional[int] = None,
    ):
        import optuna

        metric, mode = objectives[0]
        super().__init__(metric=metric, mode=mode)
        self.objectives = list(objectives)
        settings = dict(TPE_SETTINGS)
        if settings.pop("sampler", "tpe") == "gp":  # a peer for scripts/bench_search.py (optuna:sampler=gp)
            sampler = optuna.samplers.GPSampler(seed=seed, **settings)
        else:
            sampler = optuna.samplers.TPESampler(seed=seed, **settings)
        self.study = optuna.create_study(
            directions=["maximize" if m == "max" else "minimize" for _, m in self.objectives],
            sampler=sampler,
            pruner=optuna.pruners.NopPruner(),
        )
        self.rows: dict[str, list[dict[str, Any]]] = {}  # several objectives: each trial's values
        self.searched = {k: p for k, p in params.items() if not isinstance(p, Fixed)}
        self.names = conditions.order(self.searched)
        self.feasible = feasible
        self.max_epochs = max_epochs  # a trial ended before it was stopped early (by ASHA)
        self.trials: dict[str, Any] = {}  # Tune trial id -> optuna trial
        self.reported: dict[str, set[int]] = {}
        self.first: list[dict[str, Any]] = []  # proposed before TPE (search.start_with)

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        asked: list[Any] = []

        def draw() -> dict[str, Any]:
            asked.append(self.study.ask())
            return self._define(asked[-1])

        def reject() -> None:
            self.study.tell(asked.pop(), state=_state("FAIL"))

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
        if len(self.objectives) > 1:
            if trial_id in self.trials:
                self.rows.setdefault(trial_id, []).append(self._kept(result))
            return
        ot, value, step = self.trials.get(trial_id), result.get(self.metric), result.get(TIME_ATTR)
        if ot is not None and finite(value) and finite(step) and int(step) not in self.reported[trial_id]:
            self.reported[trial_id].add(int(step))
            ot.report(float(value), int(step))

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        if result:  # the stopping result, which Tune gives the scheduler only (a pruned trial's last)
            self.on_trial_result(trial_id, result)
        ot = self.trials.pop(trial_id, None)
        self.reported.pop(trial_id, None)
        rows = self.rows.pop(trial_id, [])  # (the stopping result among them, just above)
        if ot is None:
            return
        values = self._values(rows) if len(self.objectives) > 1 else _one((result or {}).get(self.metric))
        if error or "failure" in (result or {}) or values is None:
            self.study.tell(ot, state=_state("FAIL"))
        elif STOPPED_EARLY == "PRUNED" and self._stopped_early((result or {}).get(TIME_ATTR)):
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
        row = best_row_of(rows, self.metric, str(self.mode)) or {}
        values = [row.get(n) for n, _ in self.objectives]
        return [float(v) for v in values] if all(finite(v) for v in values) else None  # type: ignore[arg-type]

    def _stopped_early(self, epoch: Any) -> bool:
        return self.max_epochs is not None and finite(epoch) and int(epoch) < self.max_epochs

    def replay(self, config: dict[str, Any], history: list[dict[str, Any]], error: bool = False) -> None:
        """Tell the study an earlier run's trial (a resumed sweep), as it was told live."""
        import optuna

        values = {
            int(r[TIME_ATTR]): float(r[self.metric])
            for r in history
            if finite(r.get(self.metric)) and finite(r.get(TIME_ATTR))
        }
        several = self._values(history) if len(self.objectives) > 1 else None
        failed = error or not values or any("failure" in r for r in history)
        failed = failed or (len(self.objectives) > 1 and several is None)
        state = "FAIL" if failed else STOPPED_EARLY if self._stopped_early(max(values)) else "COMPLETE"
        params = {k: study_value(self.searched[k], config[k]) for k in self.searched if k in config}
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
