"""Search algorithms: one record an algorithm, chosen by `search.algorithm`.

A record holds what the rest of tuner asks about an algorithm: the function that builds its
searcher (named here, imported only when a sweep runs), the parameter kinds it can search,
whether it takes several objectives, which schedulers it runs with (tuner.config.schedulers)
and which one by default, whether it runs a fixed grid, whether a sweep of it can be extended
or warm-started, whether it runs an earlier sweep's best configurations first (it ranks them
itself instead of learning from them), and the modules a sweep imports for it while Ray
starts. Validation, the driver, warm starts and the report ask the record instead of testing
`algorithm == "grid"`.

A new algorithm is one builder under tuner/search/ (`fn(request) -> SearchPlan`, a searcher
that is told earlier results through `replay` so that a resumed or extended sweep continues)
and one entry in ALGORITHMS; tests/test_algorithm_contract.py then runs it with every
scheduler it allows. This module imports neither torch nor Ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.space.params import KINDS

EVERY_KIND = frozenset(KINDS)
# A model needs a distribution for every parameter: a grid parameter has none.
DISTRIBUTIONS = EVERY_KIND - {"grid"}


@dataclass(frozen=True)
class Algorithm:
    """One search algorithm (see the module)."""

    name: str
    title: str  # in a plan's description: "random search"
    builds: str  # "module:function": fn(tuner.search.plan.SearchRequest) -> SearchPlan (no scheduler)
    kinds: frozenset[str]  # the parameter kinds it can search (space.params.KINDS)
    several_objectives: bool = False  # searches for a Pareto front when `metric` lists several
    one_objective: str = ""  # why not, when not: the refusal's words
    # the schedulers it runs with
    schedulers: tuple[str, ...] = ("asha", "fifo", "moasha", "median", "curve")
    default_scheduler: str = "asha"  # without schedule.scheduler or schedule.early_stopping
    schedulers_why: str = ""  # why only those: the refusal's words
    runs_grid: bool = False  # runs every combination of a grid (num_samples is not used)
    no_extend: str = ""  # why `tuner extend` cannot add trials ("": it can)
    warm_starts: bool = True  # takes earlier sweeps (search.warm_start)
    # Runs an earlier sweep's best configurations first (search.warm_start) rather than learning
    # from them: warm_start.json records which, and each such trial's origin.
    ranks_earlier: bool = False
    preload: tuple[str, ...] = ()  # modules the launch imports for it while Ray starts
    # Its next configuration depends on the results so far (a model, a population): where Tune
    # queues as many trials as run at once, it is held to as many configurations without an
    # outcome (a ConcurrencyLimiter); one that does not (grid, random) is not (sweep.py).
    learns: bool = True

    def builder(self) -> Callable[[Any], Any]:
        """Its builder, imported now (Ray, and its library: call it where a sweep runs)."""
        return imported(self.builds)

    def unsupported(self, params: dict[str, object]) -> list[tuple[str, str]]:
        """(name, kind) of every parameter it cannot search."""
        return [(name, p.kind) for name, p in params.items() if p.kind not in self.kinds]  # type: ignore[attr-defined]


def imported(ref: str) -> Callable[..., Any]:
    """The function a record names as "module:function", imported now."""
    module, name = ref.split(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


OPTUNA = ("optuna", "tuner.search.searchers", "tuner.search.samplers")

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            name="grid",
            title="grid",
            builds="tuner.search.algorithms:plan_grid",
            kinds=EVERY_KIND,
            several_objectives=True,
            schedulers=("fifo", "asha", "moasha", "median", "curve"),
            default_scheduler="fifo",
            schedulers_why="grid runs each combination once as it is; a population (pbt, pb2) evolves "
            "search.num_samples configurations: use random",
            runs_grid=True,
            no_extend="runs every combination once",
            warm_starts=False,
            learns=False,
        ),
        Algorithm(
            name="random",
            title="random search",
            builds="tuner.search.algorithms:plan_random",
            kinds=EVERY_KIND,
            several_objectives=True,
            ranks_earlier=True,
            # (pbt and pb2 start from random search's population and evolve it)
            schedulers=("asha", "fifo", "moasha", "median", "curve", "pbt", "pb2"),
            learns=False,
        ),
        Algorithm(
            name="bohb",
            title="BOHB (hpbandster's model + ASHA, asynchronous)",
            builds="tuner.search.algorithms:plan_bohb",
            kinds=DISTRIBUTIONS,
            one_objective="bohb optimises one metric; with several objectives use optuna "
            "(multi-objective TPE), random or grid",
            # (its model learns at ASHA's rungs, which are its budgets; median and curve stop
            # trials at any epoch, and report every epoch, the budgets included)
            schedulers=("asha", "median", "curve"),
            schedulers_why="bohb always stops early (ASHA, or median or curve stopping): its model "
            "learns at ASHA's rungs; use random or optuna to turn early stopping off",
            preload=("tuner.search.bohb",),
        ),
        Algorithm(
            name="optuna",
            title="Optuna TPE",
            builds="tuner.search.samplers:tpe",
            kinds=DISTRIBUTIONS,
            several_objectives=True,
            schedulers_why="a population (pbt, pb2) starts from random search's configurations and "
            "evolves them: use random",
            preload=OPTUNA,
        ),
        Algorithm(
            name="cmaes",
            title="Optuna CMA-ES",
            builds="tuner.search.samplers:cmaes",
            kinds=DISTRIBUTIONS,
            one_objective="cmaes optimises one metric (CMA-ES ranks by one value); with several "
            "objectives use nsga2, gp, optuna, random or grid",
            schedulers_why="a population (pbt, pb2) starts from random search's configurations and "
            "evolves them: use random",
            preload=OPTUNA,
        ),
        Algorithm(
            name="gp",
            title="Optuna GP",
            builds="tuner.search.samplers:gp",
            kinds=DISTRIBUTIONS,
            several_objectives=True,
            default_scheduler="fifo",
            schedulers_why="a population (pbt, pb2) starts from random search's configurations and "
            "evolves them: use random",
            preload=(*OPTUNA, "torch"),  # optuna's GP is written in torch
        ),
        Algorithm(
            name="nsga2",
            title="Optuna NSGA-II",
            builds="tuner.search.samplers:nsga2",
            kinds=DISTRIBUTIONS,
            several_objectives=True,  # (without early stopping: fifo is then the default)
            schedulers_why="a population (pbt, pb2) starts from random search's configurations and "
            "evolves them: use random",
            preload=OPTUNA,
        ),
    )
}
DEFAULT = "random"
