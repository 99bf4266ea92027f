"""Warm start (`search.warm_start`): earlier sweeps of the same task, their trials mapped into
this sweep's space and told to its searcher as history (Ray- and torch-free).

Same task means the same fingerprint, recorded in each sweep's code.json when it starts: the
task's fields (model, data and its arguments, user functions, command), the objectives, and
a SHA-256 of each user module the task names (so an edited model or data function counts as
another task). Built-in data is identified by its name and arguments; what a user's data
function reads from disk is not hashed.

An earlier trial is used when every parameter that applies in this space has a value the
space can take (a choice it lists, a number in its range), every fixed value is the one it
ran with, and the constraints hold; otherwise it is dropped: a value outside the space says
nothing about the values inside it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from tuner.errors import ConfigError
from tuner.search.plan import Prior, PriorTrial, key
from tuner.space import conditions
from tuner.space.constraints import allows
from tuner.space.params import Fixed, ParamT, values_of
from tuner.sweepdir.files import WARM_FILE

if TYPE_CHECKING:
    from tuner.config import SweepConfig

AUTO = "auto"


def fingerprint(cfg: SweepConfig) -> dict[str, Any]:
    """What makes two sweeps the same task (recorded in code.json)."""
    task = cfg.task.model_dump(mode="json")
    return {
        "task": task,
        "objectives": [list(o) for o in cfg.objectives],
        "modules": _module_hashes(task, cfg.code_dirs),
    }


def _module_hashes(task: dict[str, Any], dirs: list[str]) -> dict[str, str]:
    refs = [v for v in task.values() if isinstance(v, str) and ":" in v]
    files = {ref.split(":")[0]: _module_file(ref.split(":")[0], dirs) for ref in refs}
    for word in task.get("command") or []:
        if isinstance(word, str) and word.endswith(".py"):
            files[word] = next(
                (os.path.join(d, word) for d in dirs if os.path.isfile(os.path.join(d, word))), None
            )
    return {name: _sha256(path) for name, path in sorted(files.items()) if path}


def _module_file(module: str, dirs: list[str]) -> Optional[str]:
    saved = list(sys.path)
    sys.path[:0] = dirs
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved
    return spec.origin if spec is not None and spec.origin and os.path.isfile(spec.origin) else None


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def recorded_fingerprint(sweep_dir: str) -> Optional[dict[str, Any]]:
    from tuner.sweepdir.files import CODE_FILE

    try:
        with open(os.path.join(sweep_dir, CODE_FILE)) as f:
            found = json.load(f).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


def difference(ours: dict[str, Any], theirs: Optional[dict[str, Any]]) -> Optional[str]:
    """Where two fingerprints differ, in a few words; None if they are the same."""
    if theirs is None:
        return "it recorded no task fingerprint (started before warm starts existed)"
    for part in ("task", "objectives", "modules"):
        a, b = ours.get(part), theirs.get(part)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            k = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            if part == "modules":
                return (
                    f"module {k} is not the one it ran" if k in a and k in b else f"it ran other code ({k})"
                )
            return f"{part}.{k} is {a.get(k)!r} here, {b.get(k)!r} there"
        return f"{part} are {a!r} here, {b!r} there"
    return None


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


def sources(cfg: SweepConfig, sweep_dir: Optional[str]) -> list[str]:
    """The earlier sweep directories to start from: those named (each refused in one line if
    it is no sweep directory, or its fingerprint differs, unless warm_start_force), or with
    `auto` every sweep beside this one in output/ with the same fingerprint. A resumed sweep
    reads the list its first run resolved."""
    recorded = _recorded_sources(sweep_dir)
    if recorded is not None:
        return recorded
    wanted, ours = cfg.search.warm_start, fingerprint(cfg)
    if wanted == AUTO:
        base = os.path.dirname(sweep_dir) if sweep_dir else os.path.abspath(cfg.output)
        here = [os.path.join(base, d) for d in sorted(os.listdir(base))] if os.path.isdir(base) else []
        return [
            d
            for d in here
            if d != sweep_dir and _is_sweep(d) and difference(ours, recorded_fingerprint(d)) is None
        ]
    out = []
    for i, d in enumerate(wanted or []):
        path = os.path.abspath(os.path.expanduser(d))
        if not _is_sweep(path):
            raise ConfigError(f"search.warm_start.{i}", f"{d}: not a sweep directory (no sweep.yaml there)")
        why = difference(ours, recorded_fingerprint(path))
        if why and not cfg.search.warm_start_force:
            raise ConfigError(
                f"search.warm_start.{i}",
                f"{d} is another task: {why} (search.warm_start_force: true uses it anyway)",
            )
        out.append(path)
    return out


def _is_sweep(path: str) -> bool:
    from tuner.sweepdir.files import CONFIG_FILE

    return os.path.isfile(os.path.join(path, CONFIG_FILE))


def _recorded_sources(sweep_dir: Optional[str]) -> Optional[list[str]]:
    if not sweep_dir:
        return None
    try:
        with open(os.path.join(sweep_dir, WARM_FILE)) as f:
            return [s["sweep"] for s in json.load(f)["sources"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load(cfg: SweepConfig, dirs: list[str]) -> list[Source]:
    """Each earlier sweep's finished trials, mapped into this sweep's space."""
    from tuner.results import records
    from tuner.sweepdir.files import full_config, read_config

    params, constraints = cfg.hyperparameters(), cfg.search.constraints
    out = []
    for d in dirs:
        theirs = read_config(d, standins=True)
        done = [
            t
            for t in records(
                d, cfg.objective, cfg.direction, theirs.schedule.max_epochs, list(theirs.search.params)
            )
            if t.finished and t.history
        ]
        source = Source(d, trials=len(done))
        for t in done:
            mapped = into_space(params, constraints, full_config(t.path))
            if mapped is None:
                source.dropped += 1
            else:
                source.used.append(PriorTrial(mapped, t.history, t.status == "ERROR", origin=d))
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


def write_record(sweep_dir: str, used: list[Source], firsts: list[dict[str, Any]]) -> None:
    """warm_start.json: the sources, how many of their trials were used, and the earlier
    configurations random search runs first (with the sweep each came from)."""
    from tuner.sweepdir.files import write_atomic

    rows = [{"sweep": s.sweep, "trials": s.trials, "used": len(s.used), "dropped": s.dropped} for s in used]
    text = json.dumps({"sources": rows, "first": firsts}, indent=2, default=str)
    write_atomic(os.path.join(sweep_dir, WARM_FILE), text)


def attach(cfg: SweepConfig, prior: Optional[Prior], sweep_dir: Optional[str]) -> Optional[Prior]:
    """The sweep's Prior with the earlier sweeps' trials (search.warm_start), their sources
    written to warm_start.json and announced; `prior` itself when there is no warm start."""
    if not cfg.search.warm_start:
        return prior
    found = load(cfg, sources(cfg, sweep_dir))
    prior = prior or Prior()
    prior.earlier = [t for s in found for t in s.used]
    if sweep_dir:
        firsts = []
        if cfg.algorithm.ranks_earlier:
            from tuner.search.algorithms import top_earlier

            origin = {key(t.config): t.origin for t in prior.earlier}
            ranked = top_earlier(prior.earlier, cfg.objective, cfg.direction, cfg.search.num_samples)
            firsts = [{"config": c, "origin": origin[key(c)]} for c in ranked]
        write_record(sweep_dir, found, firsts)
    for s in found:
        print(f"[tuner] warm start: {s.line()}", flush=True)
    if not found:
        print("[tuner] warm start: no earlier sweep of this task in output/", flush=True)
    return prior


def mark_origins(cfg: SweepConfig, sweep_dir: str, summary: dict[str, Any]) -> None:
    """summary.json's record of what came from where: `warm_start` (the sources) and each
    trial's `origin` (start_with, or the earlier sweep random search took it from)."""
    from tuner.search.algorithms import start_configs

    searched = list(cfg.search.params)

    def k(config: dict[str, Any]) -> str:
        return key({n: config[n] for n in searched if n in config})

    origin: dict[str, str] = {}
    try:
        with open(os.path.join(sweep_dir, WARM_FILE)) as f:
            record = json.load(f)
        summary["warm_start"] = record.get("sources", [])
        origin.update({k(f["config"]): f["origin"] for f in record.get("first", [])})
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass
    if cfg.search.start_with:
        params = cfg.hyperparameters()
        starts = start_configs(params, cfg.search.start_with, cfg.search.seed, cfg.search.constraints)
        origin.update({k(c): "start_with" for c in starts})
    for t in summary.get("trials", []):
        mark = origin.get(k(t.get("config") or {}))
        if mark:
            t["origin"] = mark
