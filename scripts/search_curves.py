"""Real learning curves for the search benchmark (scripts/bench_search.py): a table of
configurations of a sweep file's space, each trained for real, in-process (tuner's own trial
loop or the task's own `task.train`, with a LocalSession: the model, data, loss and metrics a sweep's trials
run), to `max_epochs`, its metric recorded every epoch.

A searcher's proposal is answered with the curve of the nearest configuration in the table
(log-scaled ranges for log types, each range scaled to [0, 1], a choice counting 1 when it
differs): a tabular surrogate in the manner of LCBench, so that 10 seeds × 100 trials ×
every algorithm cost table lookups, and every seed reuses the same trained curves.

    python scripts/search_curves.py search_spaces/digits_mlp.yaml 128 benchmarks/curves/digits_mlp.json
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.config import load_sweep  # noqa: E402
from tuner.search.algorithms import random_configs  # noqa: E402
from tuner.space.params import Choice, Fixed, LogRandInt, LogUniform, ParamT  # noqa: E402

TABLE_SEED = 12345  # the table's configurations: not any benchmark seed's


def train_table(sweep_file: str, n: int, out: str) -> None:
    """Train n random configurations of the sweep's space to max_epochs; write their curves."""
    import torch

    from tuner.driver.resources import TrialResources, trial_spec
    from tuner.trial.frame.session import LocalSession

    class NoCheckpoints(LocalSession):
        def _report(self, metrics: dict[str, Any], state: Any) -> None:
            self.metrics.append(dict(metrics))

    torch.set_num_threads(1)
    cfg = load_sweep(sweep_file)
    trial = cfg.trial_mode.function()  # tuner's loop, or task.train's
    params = cfg.hyperparameters()
    fixed = {k: p.value for k, p in params.items() if isinstance(p, Fixed)}
    one_cpu = TrialResources(workers=1, cpus_per_worker=1, gpus_per_worker=0, bundle={}, max_concurrent=None)
    spec = replace(trial_spec(cfg, one_cpu, "", None), search_path=str(ROOT))  # what a sweep's trials get
    every = random_configs(params, n, TABLE_SEED, cfg.search.constraints)
    configs = [{k: v for k, v in c.items() if k not in fixed} for c in every]
    # Written after every row, and continued from the rows already there (the list of
    # configurations is fixed by TABLE_SEED): an interrupted table is not trained again.
    table = json.loads(Path(out).read_text()) if os.path.isfile(out) else {}
    rows, spent = table.get("rows", []), table.get("train_seconds", 0.0)
    assert [r["config"] for r in rows] == configs[: len(rows)], f"{out} holds other configurations"
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    for i, config in enumerate(configs[len(rows) :], len(rows)):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            session = NoCheckpoints(d, metric=cfg.metric)
            trial({**fixed, **config}, spec, session)
        spent += time.perf_counter() - t0
        curve = [m[cfg.metric] for m in session.metrics]
        rows.append(
            {"config": config, "curve": curve, "failed": any("failure" in m for m in session.metrics)}
        )
        print(f"{i + 1}/{n} {spent:.0f}s {config} -> {curve[-1]:.4g}", flush=True)
        header = {"sweep_file": sweep_file, "metric": cfg.metric, "direction": cfg.objective_direction}
        header.update(max_epochs=cfg.schedule.max_epochs, train_seconds=round(spent, 1))
        Path(out).write_text(json.dumps({**header, "rows": rows}, indent=None))


class NearestCurve:
    """A Curve (tuner.search.simulate) answering each configuration with the trained curve
    of the nearest one in the table; a diverged curve is NaN from where it failed."""

    def __init__(self, table: dict[str, Any], params: dict[str, ParamT]):
        self.searched = {k: p for k, p in params.items() if not isinstance(p, Fixed)}
        self.rows = table["rows"]
        self.points = [self._point(r["config"]) for r in self.rows]
        self.cache: dict[str, int] = {}

    def _point(self, config: dict[str, Any]) -> list[float]:
        out = []
        for name, p in self.searched.items():
            v = config.get(name)
            if isinstance(p, Choice):
                out.append(float(p.values.index(v)) if v in p.values else -1.0)
            elif isinstance(p, (LogUniform, LogRandInt)):
                out.append((math.log(v) - math.log(p.low)) / (math.log(p.high) - math.log(p.low)))
            else:
                out.append((v - p.low) / (p.high - p.low))
        return out

    def nearest(self, config: dict[str, Any]) -> int:
        k = json.dumps({n: config.get(n) for n in self.searched}, sort_keys=True, default=str)
        if k not in self.cache:
            x = self._point(config)
            kinds = [isinstance(p, Choice) for p in self.searched.values()]

            def dist(y: list[float]) -> float:
                return sum((a != b) * 1.0 if c else (a - b) ** 2 for a, b, c in zip(x, y, kinds, strict=True))

            self.cache[k] = min(range(len(self.points)), key=lambda i: dist(self.points[i]))
        return self.cache[k]

    def __call__(self, config: dict[str, Any], epoch: int, rng: Any) -> float:
        row = self.rows[self.nearest(config)]
        curve = row["curve"]
        if epoch > len(curve) or (row["failed"] and epoch == len(curve)):
            return math.nan
        return float(curve[epoch - 1])


if __name__ == "__main__":
    train_table(sys.argv[1], int(sys.argv[2]), sys.argv[3])
