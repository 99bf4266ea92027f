"""`training.autotune` on the driver: the choice made (or found) before the first trial.

The arms run in one Ray task holding what one trial holds (its CPUs; a whole GPU where trials
get GPUs, so nothing shares it while it is measured), on the model sizes `tuner.autotune`
plans. A choice is looked up first in the cache (`<cache>/autotune.json`, by model fingerprint,
device name and torch version), so a later sweep of the same model on the same machine costs
nothing; what was measured is added to it. The sweep directory keeps its own `autotune.json`:
the table of every size, its choice, and what it cost. A resumed or extended sweep reads that
file back and measures nothing, so its trials run with what the first run chose.

The cost is printed as it is paid, one line per size, and bounded by the budget; a reference
arm that fails (out of memory, an error) leaves the file's settings in place, said in its line:
autotune never stops a sweep the trials themselves could run.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from tuner import autotune, sweepdir
from tuner.config import SweepConfig, TrainingSection
from tuner.driver import resources
from tuner.search import warm
from tuner.space.params import Fixed
from tuner.sweepdir.place import Place, cache_root

CACHE_FILE = "autotune.json"  # under the cache root ($TUNER_CACHE_DIR, else ~/.cache/tuner)
# Seconds the task may take beyond the budget: starting its process, building the last arm,
# one step that overruns (a compile).
SLACK_S = 600


def cache_path() -> str:
    return os.path.join(cache_root(), CACHE_FILE)


def searched(cfg: SweepConfig) -> list[str]:
    """The parameters search.params searches: autotune never overrides them."""
    return [k for k, p in cfg.search.params.items() if not isinstance(p, Fixed)]


def plan(cfg: SweepConfig) -> autotune.SizePlan:
    """The configurations measured: one per model size, at most a few (tuner.autotune)."""
    by = autotune.size_names(cfg.search.params, cfg.task.model, TrainingSection.model_fields)
    return autotune.plan_sizes(cfg.hyperparameters(), cfg.search.constraints, by)


def for_sweep(cfg: SweepConfig, res: resources.TrialResources, place: Place) -> Optional[dict[str, Any]]:
    """The table every trial applies (tuner.autotune.Table as JSON), or None when
    training.autotune is off. The sweep keeps autotune.json in its place."""
    if not cfg.training.autotune:
        return None
    table = settle(cfg, res, place.local, cfg.training.autotune)
    place.push(os.path.join(place.local, sweepdir.AUTOTUNE_FILE))
    return table.to_json()


def settle(
    cfg: SweepConfig,
    res: resources.TrialResources,
    sweep_dir: Optional[str],
    budget_s: float,
    cache: Optional[str] = None,
) -> autotune.Table:
    """The settings the sweep's trials run with: autotune.json's when the sweep has one, else
    measured (or cached) now and written there. `sweep_dir`: the sweep's working copy (its
    place's `local`); None keeps nothing."""
    if sweep_dir:
        found = sweepdir.read_autotune(sweep_dir)
        if found is not None:
            table = table_from(found)
            print(
                f"[tuner] autotune: the choice this sweep made before ({sweepdir.AUTOTUNE_FILE})", flush=True
            )
            return table
    sizes = plan(cfg)
    store = autotune.Cache(cache or cache_path())
    print(f"[tuner] autotune: {sizes.note}, within a budget of {budget_s:g} s", flush=True)
    try:
        raw = _run_task(cfg, res, sizes, budget_s, store.all())
    except TimeoutError:
        # A step that never ends (a hung loader, a compile stuck): the trials run as the file
        # says, and the task is gone with whatever it held.
        spent = budget_s + SLACK_S
        why = f"the measuring task did not finish within {spent:g} s of budget and slack: cancelled"
        raw = [
            {**autotune.Result({}, [], 0.0, budget_s, 1.0, note=why).to_json(), "key": None}
            for _ in sizes.configs
        ]
    results = [autotune.Result.from_json(r) for r in raw]
    for r, result in zip(raw, results, strict=True):
        if r["key"] is not None:
            store.put(r["key"], result)
    for config, result in zip(sizes.configs, results, strict=True):
        print(f"[tuner] {autotune.summary_line(result, _label(config, sizes.by))}", flush=True)
    table = autotune.table_of(sizes, results)
    if sweep_dir:
        sweepdir.write_autotune(sweep_dir, record(sizes, raw, table, budget_s))
    return table


def _label(config: dict[str, Any], by: list[str]) -> str:
    shown = ", ".join(f"{n}={config.get(n)}" for n in by)
    return f"autotune ({shown})" if shown else "autotune"


def record(
    sizes: autotune.SizePlan, raw: list[dict[str, Any]], table: autotune.Table, budget_s: float
) -> dict:
    """autotune.json: the sizes, each with its measured (or cached) result; the table trials use."""
    return {
        "budget_s": budget_s,
        "note": sizes.note,
        "by": table.by,
        "default": table.default,
        "sizes": [
            {"size": {n: c.get(n) for n in sizes.by}, "config": c, "result": r}
            for c, r in zip(sizes.configs, raw, strict=True)
        ],
        "seconds": sum(float(r.get("seconds", 0.0)) for r in raw),
    }


def table_from(found: dict[str, Any]) -> autotune.Table:
    """The table an earlier run wrote into autotune.json."""
    by = list(found.get("by") or [])
    choices = {autotune.size_key(s["size"], by): dict(s["result"]["choice"]) for s in found.get("sizes", [])}
    return autotune.Table(by, choices, dict(found.get("default") or {}))


def _run_task(
    cfg: SweepConfig,
    res: resources.TrialResources,
    sizes: autotune.SizePlan,
    budget_s: float,
    cached: dict[str, Any],
) -> list[dict[str, Any]]:
    spec = resources.trial_spec(cfg, res, "", None)
    task_fp = {k: v for k, v in warm.fingerprint(cfg).items() if k != "objectives"}
    gpus = 1 if res.gpus_per_worker > 0 else 0  # a whole GPU: nothing else on it while measured
    args = (sizes.configs, spec, searched(cfg), budget_s, task_fp, cached)
    what = "autotune's measuring task"
    return resources.run_task(
        _tune, args, budget_s + SLACK_S, what, num_cpus=res.cpus_per_worker, num_gpus=gpus
    )


def _tune(*args: Any) -> list[dict[str, Any]]:
    from tuner.trial.loop.autotune import tune_sizes  # torch: imported in the task, not in the driver

    return tune_sizes(*args)
