"""Search algorithms' builders: each turns the neutral space into the searcher Ray Tune runs,
and `build` puts it together with the sweep's scheduler (tuner.search.schedulers).

Two registries, not if/elif chains: `search.algorithm` names a record of
tuner.config.algorithms, `schedule.scheduler` one of tuner.config.schedulers; each names its
builder, imported only when called (hpbandster, optuna, Ray's schedulers), and `build`
refuses an unknown name listing the valid ones.

Every builder also resumes: given `Prior` (the trials of an interrupted run), grid and random
search run the configurations not yet started (their lists are fixed by the seed), and BOHB
and Optuna get a fresh searcher that has been told every earlier result, with the
interrupted trials handed out first; ASHA's rungs start with the earlier trials in them.
(Ray's `Tuner.restore` instead relies on an experiment snapshot written every ~10 s, and
cannot restore BOHB at all: ray-project/ray#39900.)
"""

from __future__ import annotations

import random as pyrandom
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from tuner.config.algorithms import ALGORITHMS
from tuner.config.schedulers import SCHEDULERS, chosen
from tuner.errors import ConfigError
from tuner.results import best_row_of
from tuner.search.plan import (
    Prior,
    PriorTrial,
    SearchPlan,
    SearchRequest,
    budgets,
    key,
    rungs,
)
from tuner.space import conditions
from tuner.space.conditions import grid_configs
from tuner.space.constraints import allows
from tuner.space.params import Fixed, Grid, ParamT, to_tune, values_of

if TYPE_CHECKING:
    from tuner.config import ScheduleSection, SearchSection

__all__ = [
    "ALGORITHMS", "SCHEDULERS", "Prior", "PriorTrial", "SearchPlan", "build", "key", "random_configs", "rungs"
]  # fmt: skip


def _limit(searcher: Any, max_concurrent: Optional[int]) -> Any:
    # Tune applies TuneConfig.max_concurrent_trials only to searchers it builds itself (it
    # ignores it, with a warning, for a searcher we pass), so every builder
    # applies the limit here and the Tuner gets none.
    if not max_concurrent:
        return searcher
    from ray.tune.search import ConcurrencyLimiter

    return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)


def _fixed(params: dict[str, ParamT]) -> dict[str, Any]:
    return {k: p.value for k, p in params.items() if isinstance(p, Fixed)}


# ----------------------------------------------------------------------------- lists


MAX_REDRAWS = 10_000  # draws of one sample that break a constraint before random search gives up


def random_configs(
    params: dict[str, ParamT], n: int, seed: int, constraints: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """n configurations drawn with Tune's own samplers from one seeded generator.

    A grid parameter takes its values in turn (sample i gets value i mod len), so n samples
    cover every value once n reaches their number, and the sweep still runs n trials. A
    conditional parameter is drawn only where its condition holds (parents first); a sample
    that breaks a constraint is drawn again (its grid values kept), MAX_REDRAWS times at most.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    names = conditions.order(params)
    domains = {k: None if isinstance(p, Grid) else to_tune(p) for k, p in params.items()}
    out = []
    for i in range(n):
        for _ in range(MAX_REDRAWS):
            config: dict[str, Any] = {}
            for name in names:
                p = params[name]
                if not conditions.applies(p, config):
                    continue
                domain = domains[name]
                if isinstance(p, Grid):
                    value = p.values[i % len(p.values)]
                else:
                    value = domain.sample(random_state=rng) if hasattr(domain, "sample") else domain
                config[name] = value.item() if hasattr(value, "item") else value
            if allows(constraints, config):
                break
        else:
            raise ConfigError(
                "search.constraints",
                f"{MAX_REDRAWS:,} draws in a row for trial {i + 1} broke them (they leave too little "
                "of the space; loosen them, or search fewer values)",
            )
        out.append({k: config[k] for k in params if k in config})
    return out


def start_configs(
    params: dict[str, ParamT],
    start_with: Sequence[dict[str, Any]],
    seed: int,
    constraints: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`search.start_with` completed: each partial configuration's other parameters drawn from
    the space (where their conditions hold, keeping the constraints), from one generator
    seeded by the sweep's seed, so a resumed or extended sweep completes them the same way.
    A given value is written as the space lists it (64.0 for a choice of 64: 64)."""
    rng = pyrandom.Random(seed)
    out = []
    for i, entry in enumerate(start_with):
        given = {k: _as_listed(params[k], v) for k, v in entry.items()}
        config = conditions.feasible_draw(params, constraints, rng, MAX_REDRAWS, given)
        if config is None:  # validation tried the same
            raise ConfigError(f"search.start_with.{i}", "no completion keeps search.constraints")
        out.append(config)
    return out


def _as_listed(p: ParamT, value: Any) -> Any:
    listed = values_of(p)
    return next((v for v in listed if conditions.same(v, value)), value) if listed else value


def _not_started(configs: list[tuple[dict[str, Any], str]], prior: Prior) -> list[tuple[dict[str, Any], str]]:
    """The list (configuration, origin) without one copy of each configuration an earlier
    run already started."""
    started: dict[str, int] = {}
    for c in [t.config for t in prior.finished] + prior.resumed:
        started[key(c)] = started.get(key(c), 0) + 1
    left = []
    for c, origin in configs:
        k = key(c)
        if started.get(k):
            started[k] -= 1
        else:
            left.append((c, origin))
    return left


def plan_grid(r: SearchRequest) -> SearchPlan:
    every = grid_configs(r.params, r.search.grid_points, r.search.constraints)
    given = [(c, START_WITH) for c in _start(r)]
    todo = _not_started(given + [(c, SEARCHER) for c in every], r.prior)
    return _listed_plan(r, todo, f"grid over {len(every)} combinations")


def plan_random(r: SearchRequest) -> SearchPlan:
    prior = r.prior
    fresh = _not_started(random_todo(r), prior)
    todo = fresh[: prior.new if prior.new is not None else len(fresh)]
    return _listed_plan(r, todo, "random search")


def random_todo(r: SearchRequest) -> list[tuple[dict[str, Any], str]]:
    """Random search's configurations, in the order it runs them, the same on every run of the
    sweep: search.start_with's, a warm start's best earlier ones, then draws of the seed; each
    with its origin (start_with, an earlier sweep's path, searcher)."""
    search = r.search
    start = [(c, START_WITH) for c in _start(r)]
    start += top_earlier(r.prior.earlier, r.metric, r.direction, search.num_samples - len(start))
    drawn = random_configs(r.params, search.num_samples - len(start), search.seed, search.constraints)
    return start + [(c, SEARCHER) for c in drawn]


TOP_EARLIER = 5  # random search runs this many of a warm start's best earlier configurations first
# A trial's origin, recorded when its configuration is handed out (an earlier sweep's: its path).
START_WITH, SEARCHER = "start_with", "searcher"


def top_earlier(
    earlier: list[PriorTrial], metric: str, direction: str, room: int
) -> list[tuple[dict[str, Any], str]]:
    """The best earlier trials' configurations (by their best value), best first, each once,
    with the sweep each came from: what random search, which learns nothing, takes from a
    warm start."""
    best: dict[str, tuple[float, dict[str, Any], str]] = {}
    sign = -1.0 if direction == "max" else 1.0
    for t in earlier:
        row = best_row_of(t.history, metric, direction)
        if row is not None and not t.error:
            k, value = key(t.config), sign * float(row[metric])
            if k not in best or value < best[k][0]:
                best[k] = (value, t.config, t.origin)
    ranked = sorted(best.values(), key=lambda vco: vco[0])
    return [(dict(c), origin) for _, c, origin in ranked[: max(0, min(TOP_EARLIER, room))]]


def _searched_starts(r: SearchRequest) -> list[dict[str, Any]]:
    """The start_with configurations not yet started, as a model-based searcher proposes them
    (fixed values left out): handed out before its own proposals, and told like them."""
    return [
        {k: v for k, v in c.items() if not isinstance(r.params[k], Fixed)}
        for c, _ in _not_started([(c, START_WITH) for c in _start(r)], r.prior)
    ]


def _start(r: SearchRequest) -> list[dict[str, Any]]:
    return start_configs(r.params, r.search.start_with, r.search.seed, r.search.constraints)


def _listed_plan(r: SearchRequest, todo: list[tuple[dict[str, Any], str]], description: str) -> SearchPlan:
    """Exactly the configurations `todo`, in order, after the interrupted trials (grid and
    random search), each recorded with its origin when it is handed out.

    Handed out by a searcher, not as Tune's points_to_evaluate: Tune fills a key a point
    lacks from the space, and a conditional parameter must stay absent where it does not apply.
    """
    from tuner.search.searchers import Listed

    listed = Listed([*((c, "") for c in r.prior.resumed), *todo])
    return SearchPlan(
        param_space=_fixed(r.params),
        search_alg=_limit(listed, r.max_concurrent),
        scheduler=None,
        num_samples=len(r.prior.resumed) + len(todo),
        points=[*r.prior.resumed, *(c for c, _ in todo)],
        description=description,
        handed=listed.handed,
    )


# ----------------------------------------------------------------------------- model-based


def plan_bohb(r: SearchRequest) -> SearchPlan:
    search, schedule, params, metric, direction = r.search, r.schedule, r.params, r.metric, r.direction
    max_concurrent, prior = r.max_concurrent, r.prior
    # Asynchronous BOHB: hpbandster's model proposes, ASHA stops. Ray's HyperBandForBOHB sizes
    # its synchronous brackets from max_t and the reduction factor alone (98 configurations
    # in the first bracket for 150 epochs, factor 3), starts at 1 epoch whatever grace_epochs
    # says, and its top rung is max_t rounded down to a power of the factor (81): a sweep of
    # fewer trials never filled a bracket, and none trained to max_epochs. ASHA's rungs start
    # at grace_epochs, the first trial to reach a rung always goes on (so, at any
    # num_samples, at least one trains to max_epochs, as does the best at every rung), and
    # no trial waits, paused, for a rung to fill.
    from tuner.search.bohb import AsyncBOHB, IntsAsFloats
    from tuner.search.searchers import Feasible, ResumeFirst

    searched = {k: p for k, p in params.items() if not isinstance(p, Fixed)}
    seed = _searcher_seed(search.seed, prior)
    space = IntsAsFloats(searched, seed=seed)
    feasible = Feasible(params, search.constraints, seed)
    searcher = AsyncBOHB(space, metric, direction, budgets=budgets(schedule), seed=seed, feasible=feasible)
    searcher.first = _searched_starts(r)
    for t in prior.earlier + prior.finished:
        searcher.replay({k: t.config[k] for k in searched if k in t.config}, t.history, t.error)
    return SearchPlan(
        param_space=_fixed(params),  # the searcher owns the searched space
        search_alg=_limit(ResumeFirst(searcher, prior), max_concurrent),
        scheduler=None,
        num_samples=_budget(search, prior),
        description="BOHB (hpbandster's model, asynchronous)",
        handed=searcher.handed,
    )


def optuna_plan(r: SearchRequest, recipe: Any) -> SearchPlan:
    """An Optuna sampler's plan (`recipe`: tuner.search.samplers.Recipe): a fresh study told
    every earlier result, the start_with configurations proposed first, the interrupted
    trials handed out before anything."""
    search, params, prior = r.search, r.params, r.prior
    import optuna

    from tuner.search.searchers import Feasible, OptunaSearch, ResumeFirst

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seed = _searcher_seed(search.seed, prior)
    objectives = list(r.objectives) or [(r.metric, r.direction)]
    searcher = OptunaSearch(
        params,
        objectives,
        recipe.sampler(seed, r),
        Feasible(params, search.constraints, seed),
        r.schedule.max_epochs,
        recipe.stopped_early,
        recipe.replay_by_asking,
    )
    for t in prior.earlier + prior.finished:  # told, as it was told live
        searcher.replay(t.config, t.history, t.error)
    searcher.first = _searched_starts(r)
    return SearchPlan(
        param_space=_fixed(params),
        search_alg=_limit(ResumeFirst(searcher, prior), r.max_concurrent),
        scheduler=None,
        num_samples=_budget(search, prior),
        description=recipe.title if len(objectives) < 2 else recipe.title_several,
        handed=searcher.handed,
    )


def _searcher_seed(seed: int, prior: Prior) -> int:
    """The seed of a model-based searcher: the sweep's, or for a resumed sweep one derived from
    it and the trials already started. Seeded as the first run was, a fresh searcher proposes
    that run's first configurations again, and the resumed sweep ran them twice."""
    started = len(prior.finished) + len(prior.resumed)
    if not started:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, started]).generate_state(1)[0])


def _budget(search: SearchSection, prior: Prior) -> int:
    new = search.num_samples if prior.new is None else prior.new
    return len(prior.resumed) + max(0, new)


def build_for(
    cfg: Any, max_concurrent: Optional[int] = None, prior: Optional[Prior] = None, place: Any = None
) -> SearchPlan:
    """`build` for a whole sweep file (a SweepConfig): its search, schedule, parameters and
    objectives, read once here rather than by every caller."""
    return _built(_request_for(cfg, max_concurrent, prior, place))


def scheduler_for(cfg: Any, prior: Prior) -> Any:
    """The sweep file's scheduler alone, its state rebuilt from `prior` (None: Tune's FIFO),
    for the driver to ask before a resumed sweep runs (`CurveScheduler.at_resume`)."""
    request = _request_for(cfg, None, prior, None)
    assert request.scheduler is not None
    return request.scheduler.build(request)


def build(
    search: SearchSection,
    schedule: ScheduleSection,
    params: dict[str, ParamT],
    metric: str,
    direction: str,
    max_concurrent: Optional[int] = None,
    prior: Optional[Prior] = None,
    objectives: Sequence[tuple[str, str]] = (),
    place: Any = None,
) -> SearchPlan:
    """The Tune pieces for `search.algorithm` over `params` (fixed values included), with the
    sweep's scheduler (`schedule.scheduler`, or the algorithm's default), its state rebuilt
    from `prior`.

    `max_concurrent`: trials running at once (None: as many as resources allow).
    `prior`: the earlier run of a resumed sweep (None: a new sweep).
    `objectives`: (metric, direction) of each when there are several (`metric`, `direction`: the first).
    `place`: where the sweep lives (tuner.sweepdir.place.Place), for a scheduler
    that reads its trials' files (a population).
    """
    return _built(
        _request(search, schedule, params, metric, direction, max_concurrent, prior, objectives, place)
    )


def _request_for(
    cfg: Any, max_concurrent: Optional[int], prior: Optional[Prior], place: Any
) -> SearchRequest:
    return _request(
        cfg.search,
        cfg.schedule,
        cfg.hyperparameters(),
        cfg.objective,
        cfg.objective_direction,
        max_concurrent,
        prior,
        cfg.objectives,
        place,
    )


def _request(
    search: SearchSection,
    schedule: ScheduleSection,
    params: dict[str, ParamT],
    metric: str,
    direction: str,
    max_concurrent: Optional[int],
    prior: Optional[Prior],
    objectives: Sequence[tuple[str, str]],
    place: Any,
) -> SearchRequest:
    try:
        algorithm = ALGORITHMS[search.algorithm]
    except KeyError:
        raise ValueError(f"unknown algorithm '{search.algorithm}' (valid: {', '.join(ALGORITHMS)})") from None
    scheduler, _ = chosen(schedule, algorithm, len(objectives))
    if scheduler.name not in algorithm.schedulers:  # (validation refuses it first, in one line)
        raise ConfigError("schedule.scheduler", f"{algorithm.name} does not run with {scheduler.name}")
    return SearchRequest(
        search,
        schedule,
        params,
        metric,
        direction,
        max_concurrent,
        prior or Prior(),
        tuple(objectives),
        algorithm,
        scheduler,
        place,
    )


def _built(request: SearchRequest) -> SearchPlan:
    assert request.algorithm is not None and request.scheduler is not None
    plan: SearchPlan = request.algorithm.builder()(request)
    plan.scheduler = request.scheduler.build(request)
    if plan.scheduler is not None:
        plan.description += f" + {request.scheduler.title}"
    return request.scheduler.adapt(plan, request, plan.scheduler)
