"""Warm start (`search.warm_start`): earlier sweeps of the same task, their trials mapped into
this sweep's space and told to its searcher as history (Ray- and torch-free).

Same task means the same fingerprint (tuner.config.fingerprint), recorded in each sweep's
code.json when it starts.

An earlier trial is used when every parameter that applies in this space has a value the
space can take (a choice it lists, a number in its range), every fixed value is the one it
ran with, and the constraints hold; otherwise it is dropped: a value outside the space says
nothing about the values inside it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from tuner.config.fingerprint import difference
from tuner.errors import ConfigError
from tuner.search.plan import Prior, PriorTrial
from tuner.space import conditions
from tuner.space.constraints import allows
from tuner.space.params import Fixed, ParamT, values_of
from tuner.sweepdir.files import WARM_FILE
from tuner.sweepdir.place import Place, place_of

if TYPE_CHECKING:
    from tuner.config import SweepConfig

AUTO = "auto"


def fingerprint(cfg: SweepConfig) -> dict[str, Any]:
    """What makes two sweeps the same task (code.json records it): the config's own, computed
    once (tuner.config.fingerprint)."""
    return cfg.fingerprint


def recorded_fingerprint(sweep: Union[str, Place]) -> Optional[dict[str, Any]]:
    from tuner.sweepdir.files import CODE_FILE

    place = sweep if isinstance(sweep, Place) else place_of(sweep)
    try:
        found = json.loads(place.read(CODE_FILE) or "").get("fingerprint")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


# ----------------------------------------------------------------------------- sources


@dataclass
class Source:
    """One earlier sweep and what became of its trials."""

    sweep: str
    trials: int = 0  # finished trials it had
    used: list[PriorTrial] = field(default_factory=list)  # mapped into this space
    dropped: int = 0  # outside this space (or with other fixed values)

    def line(self) -> str:
        return f"{len(self.used)} of {self.trials} trials of {self.sweep} ({self.dropped} outside this space)"


def sources(cfg: SweepConfig, place: Place) -> list[Place]:
    """The earlier sweeps to start from: those named (each refused in one line if it holds no
    sweep, or its fingerprint differs, unless warm_start_force), or with `auto` every sweep
    beside this one in output with the same fingerprint (each once, however many links lead
    to it). A resumed sweep reads the list its first run resolved."""
    recorded = _recorded_sources(place)
    if recorded is not None:
        return recorded
    wanted, ours = cfg.search.warm_start, fingerprint(cfg)
    if wanted == AUTO:
        return [s for s in place.siblings() if difference(ours, recorded_fingerprint(s)) is None]
    out = []
    for i, d in enumerate(wanted or []):
        there = place_of(d, f"search.warm_start.{i}")
        if not there.exists():
            raise ConfigError(f"search.warm_start.{i}", f"{d}: not a sweep directory (no sweep.yaml there)")
        why = difference(ours, recorded_fingerprint(there))
        if why and not cfg.search.warm_start_force:
            raise ConfigError(
                f"search.warm_start.{i}",
                f"{d} is another task: {why} (search.warm_start_force: true uses it anyway)",
            )
        out.append(there)
    return out


def _recorded_sources(place: Place) -> Optional[list[Place]]:
    try:
        return [place_of(s["sweep"]) for s in json.loads(place.read(WARM_FILE) or "")["sources"]]
    except (ValueError, KeyError, TypeError, ConfigError):
        return None


def load(cfg: SweepConfig, places: list[Place]) -> list[Source]:
    """Each earlier sweep's finished trials, mapped into this sweep's space (read from a
    reader's copy of each)."""
    from tuner.results import records
    from tuner.sweepdir.files import full_config, read_config

    params, constraints = cfg.hyperparameters(), cfg.search.constraints
    out = []
    for place in places:
        d = place.reader().readable()
        theirs = read_config(d, standins=True)
        done = [
            t
            for t in records(
                d,
                cfg.objective,
                cfg.objective_direction,
                theirs.schedule.max_epochs,
                list(theirs.search.params),
            )
            if t.finished and t.history
        ]
        source = Source(place.uri, trials=len(done))
        for t in done:
            mapped = into_space(params, constraints, full_config(t.path))
            if mapped is None:
                source.dropped += 1
            else:
                source.used.append(PriorTrial(mapped, t.history, t.status == "ERROR", origin=place.uri))
        out.append(source)
    return out


def into_space(
    params: dict[str, ParamT], constraints: list[str], config: dict[str, Any]
) -> Optional[dict[str, Any]]:
    """An earlier trial's configuration as this space holds it, or None if it lies outside."""
    out: dict[str, Any] = {}
    for name in conditions.order(params):
        p = params[name]
        if not conditions.applies(p, out):
            continue
        if isinstance(p, Fixed):
            if name in config and not conditions.same(config[name], p.value):
                return None  # it ran with another value
            out[name] = p.value
            continue
        if name not in config or conditions.outside(p, config[name]):
            return None
        listed = values_of(p)
        out[name] = (
            next((v for v in listed if conditions.same(v, config[name])), None) if listed else config[name]
        )
    if not allows(constraints, out):
        return None
    return {n: out[n] for n in params if n in out}


def write_record(place: Place, used: list[Source]) -> None:
    """warm_start.json: the sources and how many of their trials were used. (Which trials
    ran an earlier sweep's configuration is each trial's `origin`, recorded when the searcher
    handed it out.)"""
    rows = [{"sweep": s.sweep, "trials": s.trials, "used": len(s.used), "dropped": s.dropped} for s in used]
    place.write(WARM_FILE, json.dumps({"sources": rows}, indent=2, default=str))


def attach(cfg: SweepConfig, prior: Optional[Prior], place: Place) -> Optional[Prior]:
    """The sweep's Prior with the earlier sweeps' trials (search.warm_start), their sources
    written to warm_start.json and announced; `prior` itself when there is no warm start."""
    if not cfg.search.warm_start:
        return prior
    found = load(cfg, sources(cfg, place))
    prior = prior or Prior()
    prior.earlier = [t for s in found for t in s.used]
    write_record(place, found)
    for s in found:
        print(f"[tuner] warm start: {s.line()}", flush=True)
    if not found:
        print("[tuner] warm start: no earlier sweep of this task in output/", flush=True)
    return prior


def mark_origins(cfg: SweepConfig, sweep_dir: str, summary: dict[str, Any]) -> None:
    """summary.json's record of the sweeps it started from (`warm_start`: warm_start.json's
    sources). Each trial's `origin` is in its own record (start_with, an earlier sweep, the
    searcher), written when its configuration was handed out."""
    try:
        with open(os.path.join(sweep_dir, WARM_FILE)) as f:
            summary["warm_start"] = json.load(f).get("sources", [])
    except (OSError, ValueError, AttributeError):
        pass
