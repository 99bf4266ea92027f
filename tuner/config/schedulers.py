"""Early stopping as a registry of its own: one record a scheduler, chosen by `schedule.scheduler`.

- `fifo`: every trial trains to `max_epochs` (Tune's first-in first-out; nothing stopped);
- `asha`: asynchronous successive halving (Li et al. 2020), which stops poor trials at rungs;
- `moasha`: the same with several objectives, a rung ranking trials by Pareto fronts (Schmucker
  et al. 2021, Syne Tune's MOASHA);
- `median`: the median stopping rule (Golovin et al. 2017): a trial whose best so far is worse
  than the median of the others' running averages stops;
- `curve`: learning-curve extrapolation (Domhan et al. 2015): a trial unlikely to beat the best
  value by max_epochs stops (schedule.curve);
- `pbt`: population-based training (Jaderberg et al. 2017): the worst trials continue from the
  best ones' checkpoints with perturbed configurations (schedule.pbt);
- `pb2`: the same, the new configurations chosen by a GP bandit (Parker-Holder et al. 2020).

Ray keeps searchers and schedulers apart, and so does tuner: a search algorithm
(tuner.config.algorithms) proposes configurations, a scheduler decides which trials go on.
A record holds what the rest of tuner asks about a scheduler: the function that builds it
(named here, imported only when a sweep runs, so Ray stays out of `tuner validate`), the one
that rebuilds its state from the trials' journals when a sweep resumes after a kill, what it
does to trials (stops them early, pauses them, continues one from another's checkpoint),
whether it takes several objectives and whether it reads each trial's whole learning curve.
The pair of a search algorithm and a scheduler is checked here once, before Ray starts: a
refused pair is one line naming the field that chose it.

A new scheduler is one module under tuner/search/ (its builder and its resume seeding) and
one entry in SCHEDULERS; tests/test_algorithm_contract.py then runs it with every search
algorithm that allows it. This module imports neither torch nor Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from tuner.config.algorithms import ALGORITHMS, Algorithm, imported
from tuner.config.population import check_population
from tuner.errors import ConfigError

# What a scheduler's check reads: the SweepConfig, its sections valid each on its own
# (tuner.config.modes.SweepFile, which this module cannot name: modes' checks ask it).
SweepFile = Any


@dataclass(frozen=True)
class Scheduler:
    """One way of deciding which trials go on (see the module)."""

    name: str
    title: str  # in messages and a plan's description: "ASHA"
    # "module:function" that builds it, fn(request: tuner.search.plan.SearchRequest) -> a Ray Tune
    # TrialScheduler; None: Tune's own first-in first-out (nothing stopped, nothing paused).
    builds: Optional[str] = None
    # "module:function" that rebuilds its state on resume, fn(scheduler, request): from the
    # journals of the trials an earlier run (request.prior) left, finished, interrupted and
    # those of earlier sweeps (warm start), as if it had seen them live. None: it keeps none.
    seeds: Optional[str] = None
    stops_early: bool = False  # stops trials before max_epochs (what schedule.early_stopping asks)
    several_objectives: bool = False  # ranks trials by several objectives (a Pareto sort)
    one_objective: str = ""  # why not, when not: the refusal's words
    pauses: bool = False  # pauses trials and continues them later (from their checkpoints)
    clones: bool = False  # continues a trial from another trial's checkpoint (PBT's exploit)
    whole_curve: bool = False  # decides from each trial's whole learning curve, not one rung's value
    # What validate refuses for it besides the traits above (a parameter it cannot perturb, ...).
    check: Optional[Callable[[SweepFile], None]] = None
    # "module:function" that takes over handing out the trials, fn(plan, request, scheduler) ->
    # SearchPlan (a population hands out its own members, holding back those that wait for the
    # others); None: the algorithm's searcher does.
    hands_out: Optional[str] = None

    @property
    def needs_checkpoints(self) -> bool:
        """A trial of it continues from a checkpoint: its own (paused) or another's (cloned)."""
        return self.pauses or self.clones

    def build(self, request: Any) -> Any:
        """The Ray Tune scheduler for a sweep, its state rebuilt from `request.prior` (imports
        Ray: call it where a sweep runs). None: Tune's first-in first-out."""
        if self.builds is None:
            return None
        scheduler = imported(self.builds)(request)
        prior = request.prior
        if self.seeds is not None and (prior.finished or prior.earlier or prior.interrupted):
            imported(self.seeds)(scheduler, request)
        return scheduler

    def adapt(self, plan: Any, request: Any, scheduler: Any) -> Any:
        """The plan as this scheduler runs it: its own way of handing out trials, if it has one."""
        return plan if self.hands_out is None else imported(self.hands_out)(plan, request, scheduler)


SCHEDULERS: dict[str, Scheduler] = {
    s.name: s
    for s in (
        Scheduler(name="fifo", title="no early stopping", several_objectives=True),
        Scheduler(
            name="asha",
            title="ASHA",
            builds="tuner.search.schedulers:asha",
            seeds="tuner.search.schedulers:seed_asha",
            stops_early=True,
            one_objective="ASHA ranks trials by one metric and would stop the ones that trade it for "
            "the other objectives; use moasha (what schedule.early_stopping: true gives them)",
        ),
        Scheduler(
            name="moasha",
            title="multi-objective ASHA",
            builds="tuner.search.moasha:moasha",
            seeds="tuner.search.moasha:seed",
            stops_early=True,
            several_objectives=True,
        ),
        Scheduler(
            name="median",
            title="median stopping",
            builds="tuner.search.stoppers:median",
            seeds="tuner.search.stoppers:seed",
            stops_early=True,
            one_objective="the median rule compares trials by one metric and would stop the ones that "
            "trade it for the other objectives; use moasha",
            whole_curve=True,
        ),
        Scheduler(
            name="curve",
            title="learning-curve stopping",
            builds="tuner.search.stoppers:curve",
            seeds="tuner.search.stoppers:seed",
            stops_early=True,
            one_objective="the curve stopper extrapolates one metric and would stop the trials that "
            "trade it for the other objectives; use moasha",
            whole_curve=True,
        ),
        *(
            Scheduler(
                name=name,
                title=title,
                builds=f"tuner.search.pbt:{name}",
                pauses=True,
                clones=True,
                one_objective=f"{name} ranks the population by one metric (the first objective)",
                check=check_population,
                hands_out="tuner.search.pbt:hand_out",
            )
            for name, title in (
                ("pbt", "population-based training"),
                ("pb2", "population-based bandits (PB2)"),
            )
        ),
    )
}
EARLY = "asha"  # what `schedule.early_stopping: true` asks for
EARLY_SEVERAL = "moasha"  # and with several objectives
NONE = "fifo"  # what `schedule.early_stopping: false` asks for


def chosen(schedule: Any, algorithm: Algorithm, objectives: int) -> tuple[Scheduler, str]:
    """The sweep's scheduler and the field that chose it ("" for the algorithm's default):
    `schedule.scheduler` if set, else `schedule.early_stopping` (true: asha, or moasha with
    several objectives; false: fifo), else the algorithm's default, which with several
    objectives is fifo unless it takes them."""
    if schedule.scheduler is not None:
        return SCHEDULERS[schedule.scheduler], "schedule.scheduler"
    if schedule.early_stopping is not None:
        early = EARLY_SEVERAL if objectives > 1 else EARLY
        return SCHEDULERS[early if schedule.early_stopping else NONE], "schedule.early_stopping"
    default = SCHEDULERS[algorithm.default_scheduler]
    if objectives > 1 and not default.several_objectives:
        return SCHEDULERS[NONE], ""
    return default, ""


def needs_early_stopping(algorithm: Algorithm) -> bool:
    """Every scheduler the algorithm runs with stops trials early (bohb: its model learns at
    ASHA's rungs)."""
    return all(SCHEDULERS[s].stops_early for s in algorithm.schedulers)


def check_pair(cfg: SweepFile) -> Scheduler:
    """The sweep's scheduler, or a ConfigError in one line for a pair that cannot work: a
    scheduler and early_stopping that contradict each other, a scheduler the algorithm does
    not run with, one that takes one objective where there are several, one that continues
    trials from checkpoints a script does not write, and what its own check refuses."""
    schedule, algorithm = cfg.schedule, ALGORITHMS[cfg.search.algorithm]
    count = len(cfg.objectives)
    scheduler, field = chosen(schedule, algorithm, count)
    wanted = schedule.early_stopping
    if field == "schedule.scheduler" and wanted is not None and wanted != scheduler.stops_early:
        does = "stops trials early" if scheduler.stops_early else "stops no trial early"
        raise ConfigError(
            "schedule.early_stopping",
            f"{str(wanted).lower()} contradicts schedule.scheduler: {scheduler.name}, which {does} "
            "(set one of them)",
        )
    field = field or "schedule.scheduler"
    if scheduler.name not in algorithm.schedulers:
        raise ConfigError(
            field, f"{algorithm.name} does not run with {scheduler.name}: {algorithm.schedulers_why}"
        )
    if count > 1 and not scheduler.several_objectives:
        raise ConfigError(field, scheduler.one_objective)
    # (task.checkpoints is the script's word that it writes checkpoints: the other modes always do)
    writes = "checkpoints" not in cfg.trial_mode.fields or cfg.task.checkpoints is not False
    if scheduler.needs_checkpoints and not writes:
        does = "pauses trials" if scheduler.pauses else "continues trials from others' checkpoints"
        raise ConfigError(
            "task.checkpoints",
            f"false, but schedule.scheduler: {scheduler.name} {does}: a trial without checkpoints "
            "would start again at epoch 1",
        )
    if scheduler.check is not None:
        scheduler.check(cfg)
    return scheduler
