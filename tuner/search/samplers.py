"""Optuna's samplers as tuner's search algorithms (imports optuna when a builder is called):
`optuna` (TPE), `cmaes` (CMA-ES), `gp` (Gaussian-process Bayesian optimisation) and `nsga2`
(NSGA-II), each one recipe for tuner.search.searchers.OptunaSearch and one builder that
tuner.config.algorithms names.

A recipe says how to make the sampler, how a trial the scheduler stopped early is told, and
how earlier trials are told on resume. What each sampler does with what optuna cannot model:

- CMA-ES models numeric ranges only: a `choice` parameter, and any parameter that is absent
  from some trials (a conditional one), is drawn by optuna's independent sampler (random,
  seeded); CMA-ES optimises one objective (several are refused at validate). A trial the
  scheduler stopped early counts with its last value (`consider_pruned_trials`).
- GP (optuna's GPSampler: a Matérn kernel, log expected improvement; several objectives: log
  expected hypervolume improvement) learns from complete trials only: a trial the scheduler
  stopped early teaches it nothing, hence `fifo` by default. A conditional parameter is drawn
  at random (its search space is what every trial has).
- NSGA-II learns from complete trials, generation by generation (`population_size` trials
  each; a trial the scheduler stopped early is told as pruned and joins none); with one
  objective it is a plain elitist genetic algorithm.

SETTINGS holds each sampler's keyword arguments (scripts/bench_search.py varies them; the key
`stopped` sets how a stopped trial is told, PRUNED or COMPLETE).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.search.algorithms import optuna_plan
from tuner.search.plan import SearchPlan, SearchRequest

# Keyword arguments of each sampler, chosen with scripts/bench_search.py (BENCHMARKS.md).
SETTINGS: dict[str, dict[str, Any]] = {"optuna": {}, "cmaes": {}, "gp": {}, "nsga2": {}}


@dataclass(frozen=True)
class Recipe:
    """How tuner runs one Optuna sampler (see the module)."""

    name: str  # the algorithm's name: its SETTINGS
    title: str  # a plan's description
    title_several: str  # ... with several objectives
    make: Callable[..., Any]  # fn(seed, request, **settings) -> the optuna sampler
    stopped_early: str = "PRUNED"  # how a trial stopped before max_epochs is told
    # Earlier trials are asked for and told again (the sampler keeps its state in its trials'
    # system attributes: CMA-ES and NSGA-II count generations there), not added as they ended.
    replay_by_asking: bool = False

    def sampler(self, seed: int, r: SearchRequest) -> Any:
        settings = {k: v for k, v in SETTINGS[self.name].items() if k != "stopped"}
        with warnings.catch_warnings():
            # optuna marks some arguments experimental (consider_pruned_trials): said once
            # here, in docs/explanation/algorithms.md, not at every sweep.
            warnings.simplefilter("ignore", category=Warning)
            return self.make(seed, r, **settings)

    def plan(self, r: SearchRequest) -> SearchPlan:
        told = SETTINGS[self.name].get("stopped", self.stopped_early)
        recipe = Recipe(self.name, self.title, self.title_several, self.make, told, self.replay_by_asking)
        return optuna_plan(r, recipe)


def _tpe(seed: int, r: SearchRequest, **settings: Any) -> Any:
    import optuna

    return optuna.samplers.TPESampler(seed=seed, **settings)


def _cmaes(seed: int, r: SearchRequest, **settings: Any) -> Any:
    import optuna

    from tuner.space.conditions import conditions

    conditional = frozenset(k for k, p in r.params.items() if conditions(p))

    class CmaEs(optuna.samplers.CmaEsSampler):
        """CMA-ES over the unconditional ranges alone. Optuna's infers its space from the
        trials so far, and a parameter present in them all until then (`momentum` while
        every trial was sgd) joins it; a later solution without it then fails an assertion in
        optuna 5.0's transform (`Parameter configuration must contain all distributions`)."""

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            space = super().infer_relative_search_space(study, trial)
            return {k: d for k, d in space.items() if k not in conditional}

    settings = {"consider_pruned_trials": True, "warn_independent_sampling": False, **settings}
    return CmaEs(seed=seed, **settings)


def _gp(seed: int, r: SearchRequest, **settings: Any) -> Any:
    import inspect

    import optuna

    if "warn_independent_sampling" in inspect.signature(optuna.samplers.GPSampler).parameters:
        settings = {"warn_independent_sampling": False, **settings}  # (optuna 4 and later)
    return optuna.samplers.GPSampler(seed=seed, **settings)


POPULATION = (4, 50)  # NSGA-II's population: num_samples / 6 within these (optuna's default: 50)


def _nsga2(seed: int, r: SearchRequest, **settings: Any) -> Any:
    import optuna

    low, high = POPULATION
    # Six generations or more for a sweep of any size up to 300 trials: optuna's 50 suits
    # thousands, and a sweep of 40 would never leave its random first generation.
    population = min(high, max(low, r.search.num_samples // 6))
    settings = {"population_size": population, **settings}
    return optuna.samplers.NSGAIISampler(seed=seed, **settings)


TPE = Recipe("optuna", "Optuna TPE, define-by-run", "Optuna multi-objective TPE", _tpe)
CMAES = Recipe("cmaes", "Optuna CMA-ES", "Optuna CMA-ES", _cmaes, replay_by_asking=True)
GP = Recipe("gp", "Optuna GP (Bayesian optimisation)", "Optuna GP (log EHVI)", _gp)
NSGA2 = Recipe("nsga2", "Optuna NSGA-II", "Optuna NSGA-II", _nsga2, replay_by_asking=True)


def tpe(r: SearchRequest) -> SearchPlan:
    return TPE.plan(r)


def cmaes(r: SearchRequest) -> SearchPlan:
    return CMAES.plan(r)


def gp(r: SearchRequest) -> SearchPlan:
    return GP.plan(r)


def nsga2(r: SearchRequest) -> SearchPlan:
    return NSGA2.plan(r)
