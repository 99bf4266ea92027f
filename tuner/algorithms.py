"""Search algorithms by name: each builder turns the neutral space into what Ray Tune runs.

A registry, not an if/elif chain: a name maps to a builder that imports its library only
when called (hpbandster, optuna), and `build` refuses an unknown name listing the valid ones.
Schedulers measure time in the trial's own `epoch` metric, not Tune's `training_iteration`,
which restarts at 1 whenever a trial resumes from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from tuner.space import ALGORITHM_KINDS, Fixed, ParamT, grid_size, to_configspace, to_tune

if TYPE_CHECKING:
    from tuner.config import ScheduleSection, SearchSection

TIME_ATTR = "epoch"


@dataclass
class SearchPlan:
    """What `tune.Tuner` needs from the algorithm side."""

    param_space: dict[str, Any]
    search_alg: Optional[Any]
    scheduler: Optional[Any]
    num_samples: int
    description: str


Builder = Callable[..., SearchPlan]


def _asha(schedule: ScheduleSection, metric: str, mode: str) -> Any:
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr=TIME_ATTR,
        metric=metric,
        mode=mode,
        max_t=schedule.max_epochs,
        grace_period=schedule.grace_epochs,
        reduction_factor=schedule.reduction_factor,
    )


def _limit(searcher: Any, max_concurrent: Optional[int]) -> Any:
    # Tune applies TuneConfig.max_concurrent_trials only to searchers it builds itself (it
    # ignores it, with a warning, for a BasicVariantGenerator we pass), so every builder
    # applies the limit here and the Tuner gets none.
    if not max_concurrent:
        return searcher
    from ray.tune.search import ConcurrencyLimiter

    return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)


def _grid(search, schedule, params, metric, mode, max_concurrent) -> SearchPlan:
    from ray.tune.search.basic_variant import BasicVariantGenerator

    space = {k: to_tune(p, grid=True, points=search.grid_points) for k, p in params.items()}
    stop_early = schedule.early_stopping is True
    return SearchPlan(
        param_space=space,
        search_alg=BasicVariantGenerator(max_concurrent=max_concurrent or 0),
        scheduler=_asha(schedule, metric, mode) if stop_early else None,
        num_samples=1,
        description=f"grid over {grid_size(params, search.grid_points)} combinations"
        + (" + ASHA" if stop_early else ""),
    )


def _random(search, schedule, params, metric, mode, max_concurrent) -> SearchPlan:
    from ray.tune.search.basic_variant import BasicVariantGenerator

    stop_early = schedule.early_stopping is not False
    return SearchPlan(
        param_space={k: to_tune(p) for k, p in params.items()},
        search_alg=BasicVariantGenerator(random_state=search.seed, max_concurrent=max_concurrent or 0),
        scheduler=_asha(schedule, metric, mode) if stop_early else None,
        num_samples=search.num_samples,
        description="random search" + (" + ASHA" if stop_early else ""),
    )


def _bohb(search, schedule, params, metric, mode, max_concurrent) -> SearchPlan:
    from ray.tune.schedulers.hb_bohb import HyperBandForBOHB
    from ray.tune.search.bohb import TuneBOHB

    searched = {k: p for k, p in params.items() if not isinstance(p, Fixed)}
    return SearchPlan(
        # The searcher owns the searched space; Tune merges the fixed values into each trial.
        param_space={k: p.value for k, p in params.items() if isinstance(p, Fixed)},
        search_alg=_limit(
            TuneBOHB(
                space=to_configspace(searched, seed=search.seed),
                metric=metric,
                mode=mode,
                seed=search.seed,
            ),
            max_concurrent,
        ),
        scheduler=HyperBandForBOHB(
            time_attr=TIME_ATTR,
            metric=metric,
            mode=mode,
            max_t=schedule.max_epochs,
            reduction_factor=schedule.reduction_factor,
        ),
        num_samples=search.num_samples,
        description="BOHB (TuneBOHB + HyperBandForBOHB)",
    )


def _optuna(search, schedule, params, metric, mode, max_concurrent) -> SearchPlan:
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stop_early = schedule.early_stopping is not False
    return SearchPlan(
        param_space={k: to_tune(p) for k, p in params.items()},
        search_alg=_limit(
            OptunaSearch(metric=metric, mode=mode, sampler=optuna.samplers.TPESampler(seed=search.seed)),
            max_concurrent,
        ),
        scheduler=_asha(schedule, metric, mode) if stop_early else None,
        num_samples=search.num_samples,
        description="Optuna TPE" + (" + ASHA" if stop_early else ""),
    )


ALGORITHMS: dict[str, Builder] = {
    "grid": _grid,
    "random": _random,
    "bohb": _bohb,
    "optuna": _optuna,
}
assert ALGORITHMS.keys() == ALGORITHM_KINDS.keys()


def build(
    search: SearchSection,
    schedule: ScheduleSection,
    params: dict[str, ParamT],
    metric: str,
    mode: str,
    max_concurrent: Optional[int] = None,
) -> SearchPlan:
    """The Tune pieces for `search.algorithm` over `params` (fixed values included).

    `max_concurrent`: trials running at once (None: as many as resources allow).
    """
    try:
        builder = ALGORITHMS[search.algorithm]
    except KeyError:
        raise ValueError(f"unknown algorithm '{search.algorithm}' (valid: {', '.join(ALGORITHMS)})") from None
    return builder(search, schedule, params, metric, mode, max_concurrent)
