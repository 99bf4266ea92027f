"""What a search plan is made of: the earlier run of a resumed sweep, the request a builder
gets, the plan it returns, and ASHA's rungs (Ray-free; `rungs` and `budgets` live with the
schedule they are made of, tuner.config.schedule)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from tuner.config.schedule import budgets, rungs  # noqa: F401 (where the search finds them)
from tuner.space.params import ParamT

if TYPE_CHECKING:
    from tuner.config import ScheduleSection, SearchSection
    from tuner.config.algorithms import Algorithm
    from tuner.config.schedulers import Scheduler

TIME_ATTR = "epoch"


@dataclass
class PriorTrial:
    """A trial of an earlier run: what it ran with and what it reported each epoch."""

    config: dict[str, Any]
    history: list[dict[str, Any]]
    error: bool = False
    origin: str = ""  # an earlier sweep's directory, for a warm start's trials


@dataclass
class Prior:
    """What a sweep starts from: the earlier run of a resumed one, earlier sweeps' trials."""

    finished: list[PriorTrial] = field(default_factory=list)
    resumed: list[dict[str, Any]] = field(default_factory=list)  # run again, from checkpoints
    # The same trials with what they reported before the interruption (their journals), for
    # a scheduler to know them as it did: ASHA's rungs hold the values they reached.
    interrupted: list[PriorTrial] = field(default_factory=list)
    new: Optional[int] = None  # fresh trials still to run (None: the whole budget)
    # Trials of earlier sweeps (search.warm_start), mapped into this space: told to the
    # searcher and ASHA's rungs as history, never counted as this sweep's trials.
    earlier: list[PriorTrial] = field(default_factory=list)


@dataclass
class SearchPlan:
    """What `tune.Tuner` needs from the algorithm side."""

    param_space: dict[str, Any]
    search_alg: Optional[Any]
    scheduler: Optional[Any]
    num_samples: int
    description: str
    points: Optional[list[dict[str, Any]]] = None  # grid/random: exactly the trials to run
    # Tune trial id -> the directory it continues in, for trials the plan's searcher names
    # itself (a population's members); None: a resumed trial is found by its configuration.
    names: Optional[dict[str, str]] = None
    # Tune trial id -> where its configuration came from (start_with, an earlier sweep's path,
    # searcher), filled by the searcher as it hands configurations out; none for a trial that
    # continues from an earlier run (its record has its origin).
    handed: dict[str, str] = field(default_factory=dict)


def key(config: dict[str, Any]) -> str:
    """A configuration's identity, comparable across a JSON or YAML round trip.

    Numbers count by value, as Python compares them (0 == 0.0): sweeps written before
    sweep.yaml was read back by the first run recorded `warmup_epochs: 0` in their trials and
    0.0 in the file, and they resume correctly too.
    """
    return json.dumps(_by_value(config), sort_keys=True, default=str)


def _by_value(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (dict, list)):
        value = value.item()  # numpy scalars from searchers
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_by_value(v) for v in value]
    return value


@dataclass
class SearchRequest:
    """What an algorithm's builder, and a scheduler's, is given."""

    search: SearchSection
    schedule: ScheduleSection
    params: dict[str, ParamT]  # every trial-facing parameter, fixed values included
    metric: str
    direction: str
    max_concurrent: Optional[int]  # trials running at once (None: as many as resources allow)
    prior: Prior  # the earlier run of a resumed sweep (empty for a new sweep)
    # (metric, direction) of every objective when there are several (metric, direction: the first's).
    objectives: tuple[tuple[str, str], ...] = ()
    algorithm: Optional[Algorithm] = None  # search.algorithm's record
    scheduler: Optional[Scheduler] = None  # the scheduler the sweep runs with (its record)
    # Where the sweep lives, for a scheduler that reads or writes its trials' files (a
    # population): its place (tuner.sweepdir.place.Place); None: nowhere.
    place: Any = None
