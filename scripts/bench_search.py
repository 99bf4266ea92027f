"""Search efficiency: every algorithm tuner offers, on four tasks, many seeds, fixed budgets.

Each run is a simulation of Tune's controller (tuner.search.simulate) driving the very
scheduler and searcher `algorithms.build` gives a sweep, `--slots` trials side by side taking
turns epoch by epoch; training is replaced by a learning curve:

- synthetic: search_spaces/synthetic.py's objective (known optimum, crossing curves, noise
  shrinking with the epochs, diverging learning rates), the function its `task.train` runs;
- digits_mlp, digits_cnn, regression: real curves, trained in-process by tuner's trial loop
  for a table of configurations of the sweep file's space (scripts/search_curves.py; each
  proposal gets its nearest configuration's curve). The tables are committed under
  benchmarks/curves/; `--retrain` trains them again.

Reported per task and algorithm: epochs spent until the best value seen reaches the task's
target (median and quartiles over seeds; a seed that never reaches it counts as infinite),
the best at equal total epochs and at the end, epochs spent in all, the searcher's own time
(suggest and learn: the simulation's CPU time, which the load of a shared machine does not
inflate as it does wall time) and the training time those epochs would take
at the table's measured seconds per epoch. The best-so-far curves go to a PNG.

    python scripts/bench_search.py --seeds 10 --write BENCHMARKS-search.md --plot benchmarks/search.png
    python scripts/bench_search.py --smoke      # seconds: CI (tests/test_bench.py)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from search_curves import NearestCurve, train_table  # noqa: E402

from tuner.config import load_sweep  # noqa: E402
from tuner.search import algorithms, searchers  # noqa: E402
from tuner.search.simulate import Event, simulate  # noqa: E402


@dataclass
class Task:
    name: str
    sweep_file: str
    target: float  # the value the best must reach (at least, or at most with mode min)
    table: str = ""  # benchmarks/curves/<name>.json: real curves ("" for the synthetic task)
    num_samples: int = 100


TASKS = [
    Task("synthetic", "search_spaces/synthetic.yaml", 0.10),
    Task("digits_mlp", "search_spaces/digits_mlp.yaml", 0.975, "benchmarks/curves/digits_mlp.json"),
    Task("digits_cnn", "search_spaces/digits_cnn.yaml", 0.97, "benchmarks/curves/digits_cnn.json"),
    Task("regression", "search_spaces/regression.yaml", 2975.0, "benchmarks/curves/regression.json"),
]

# name -> (search.algorithm, sweep overrides, searchers.TPE_SETTINGS, searchers.BOHB_SETTINGS)
Variant = tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]
VARIANTS: dict[str, Variant] = {
    "random": ("random", {}, {}, {}),
    "bohb": ("bohb", {}, {}, {}),
    "optuna": ("optuna", {}, {}, {}),
    "grid": ("grid", {"search.grid_points": 3}, {}, {}),
}


def variant(name: str) -> Variant:
    """A name of VARIANTS, or 'algorithm:key=value,...' (keys of TPESampler or of
    hpbandster's BOHB; 'grace'/'factor' set the schedule)."""
    if name in VARIANTS:
        return VARIANTS[name]
    algo, _, spec = name.partition(":")
    settings: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        k, _, v = item.partition("=")
        value = json.loads(v)
        if k == "grace":
            overrides["schedule.grace_epochs"] = value
        elif k == "factor":
            overrides["schedule.reduction_factor"] = value
        else:
            settings[k] = value
    return (algo, overrides, settings if algo == "optuna" else {}, settings if algo == "bohb" else {})


def make_curve(task: Task, params: dict[str, Any]) -> tuple[Callable[..., float], float]:
    """The task's curve and its training seconds per epoch (0 for the synthetic task)."""
    if not task.table:
        from search_spaces.synthetic import loss

        return loss, 0.0
    table = json.loads((ROOT / task.table).read_text())
    epochs = sum(len(r["curve"]) for r in table["rows"])
    return NearestCurve(table, params), table["train_seconds"] / max(1, epochs)


@dataclass
class Run:
    events: list[Event]
    seconds: float  # CPU seconds of the simulation: the searcher's and scheduler's own work
    configs: int


def run_one(task: Task, name: str, seed: int, slots: int, num_samples: int) -> Run:
    algo, overrides, tpe, bohb = variant(name)
    cfg = load_sweep(
        ROOT / task.sweep_file,
        {"search.algorithm": algo, "search.num_samples": num_samples, "search.seed": seed, **overrides},
    )
    params = cfg.hyperparameters()
    curve, _ = make_curve(task, params)
    saved = dict(searchers.TPE_SETTINGS), dict(searchers.BOHB_SETTINGS)
    searchers.TPE_SETTINGS.update(tpe)
    searchers.BOHB_SETTINGS.update(bohb)
    try:
        t0 = time.process_time()
        plan = algorithms.build(cfg.search, cfg.schedule, params, cfg.metric, str(cfg.mode))
        log: list[Event] = []
        trials = simulate(
            plan,
            plan.num_samples,
            cfg.schedule.max_epochs,
            curve,
            slots,
            seed,
            cfg.metric,
            str(cfg.mode),
            log,
        )
        return Run(log, time.process_time() - t0, len(trials))
    finally:
        for live, old in zip((searchers.TPE_SETTINGS, searchers.BOHB_SETTINGS), saved, strict=True):
            live.clear()
            live.update(old)


def best_so_far(events: list[Event], sign: float) -> list[float]:
    """After each epoch spent: the best finite value seen (sign·value maximised), or nan."""
    out, best = [], -math.inf
    for e in events:
        if math.isfinite(e.value):
            best = max(best, sign * e.value)
        out.append(sign * best if math.isfinite(best) else math.nan)
    return out


def epochs_to(curve: list[float], target: float, sign: float) -> float:
    for i, v in enumerate(curve):
        if math.isfinite(v) and sign * v >= sign * target:
            return i + 1
    return math.inf


def at(curve: list[float], epochs: int) -> float:
    return curve[min(epochs, len(curve)) - 1]


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    s = sorted(xs)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0]] * 3
    return q[0], statistics.median(s), q[2]


def fmt(x: float, digits: int = 4) -> str:
    if math.isinf(x):
        return "not reached"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.0f}"


def bench_task(
    task: Task, names: list[str], seeds: list[int], slots: int, num_samples: int
) -> dict[str, Any]:
    cfg = load_sweep(ROOT / task.sweep_file)
    sign = 1.0 if str(cfg.mode) == "max" else -1.0
    _, per_epoch = make_curve(task, cfg.hyperparameters())
    curves: dict[str, list[list[float]]] = {}
    rows = {}
    for name in names:
        runs = [run_one(task, name, s, slots, num_samples) for s in (seeds[:1] if name == "grid" else seeds)]
        curves[name] = [best_so_far(r.events, sign) for r in runs]
        rows[name] = runs
    common = min(len(c) for cs in curves.values() for c in cs)
    table = []
    random_med = quartiles([epochs_to(c, task.target, sign) for c in curves.get("random", [])] or [math.nan])[
        1
    ]
    for name in names:
        cs, runs = curves[name], rows[name]
        reach = [epochs_to(c, task.target, sign) for c in cs]
        q1, med, q3 = quartiles(reach)
        spent = statistics.median(len(c) for c in cs)
        table.append(
            {
                "algorithm": name,
                "runs": len(cs),
                "reached": sum(math.isfinite(x) for x in reach),
                "epochs_to_target": (q1, med, q3),
                "vs_random": med / random_med
                if math.isfinite(med) and math.isfinite(random_med)
                else math.nan,
                "best_at_common": statistics.median(at(c, common) for c in cs),
                "best_at_end": statistics.median(c[-1] for c in cs),
                "epochs_spent": spent,
                "search_s": statistics.median(r.seconds for r in runs),
                "train_s": spent * per_epoch,
            }
        )
    return {"task": task, "mode": str(cfg.mode), "common": common, "rows": table, "curves": curves}


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = []
    for res in results:
        task = res["task"]
        better = "≥" if res["mode"] == "max" else "≤"
        lines += [
            f"#### {task.name}: target {task.metric_name} {better} {task.target:g}"
            f" ({args.num_samples} trials, seeds {args.seeds_text})",
            "",
            "| algorithm | reached | epochs to target: median [q1, q3] | vs random"
            f" | best at {res['common']} epochs | best at end | epochs spent | search CPU s | training s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in res["rows"]:
            q1, med, q3 = r["epochs_to_target"]
            ratio = "" if math.isnan(r["vs_random"]) else f"{r['vs_random']:.2f}x"
            lines.append(
                f"| {r['algorithm']} | {r['reached']}/{r['runs']} | {fmt(med)} [{fmt(q1)}, {fmt(q3)}]"
                f" | {ratio} | {fmt(r['best_at_common'])} | {fmt(r['best_at_end'])} | {r['epochs_spent']:.0f}"
                f" | {r['search_s']:.1f} | {r['train_s']:.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6))
    for ax, res in zip(np.atleast_1d(axes), results, strict=True):
        task = res["task"]
        for name, cs in res["curves"].items():
            n = min(len(c) for c in cs)
            m = np.array([c[:n] for c in cs], dtype=float)
            x = np.arange(1, n + 1)
            med = np.nanmedian(m, axis=0)
            (line,) = ax.plot(x, med, label=name, lw=1.4)
            if len(cs) > 1:
                lo, hi = np.nanpercentile(m, 25, axis=0), np.nanpercentile(m, 75, axis=0)
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
        ax.axhline(task.target, color="k", ls="--", lw=0.8)
        ax.set_title(task.name)
        ax.set_xlabel("epochs spent (all trials)")
        ax.set_ylabel(f"best {task.metric_name} so far")
        ax.set_xscale("log")
        finite = [
            v for cs in res["curves"].values() for c in cs for v in c[len(c) // 20 :] if math.isfinite(v)
        ]
        if finite:
            lo, hi = np.percentile(finite, [2, 100 if res["mode"] == "max" else 98])
            pad = 0.1 * (hi - lo or 1)
            ax.set_ylim(lo - pad, hi + pad)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 per task and algorithm")
    ap.add_argument("--num-samples", type=int, default=100, help="trials per run")
    ap.add_argument("--slots", type=int, default=2, help="trials running side by side")
    ap.add_argument("--tasks", default=",".join(t.name for t in TASKS))
    ap.add_argument("--algorithms", default="random,bohb,optuna,grid", help="names or 'bohb:key=value,...'")
    ap.add_argument("--write", help="append the tables to this markdown file")
    ap.add_argument("--plot", help="the best-so-far curves to this PNG")
    ap.add_argument("--retrain", type=int, metavar="N", help="train the real tasks' tables anew (N configs)")
    ap.add_argument("--smoke", action="store_true", help="2 seeds, 12 trials, seconds")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.num_samples = 2, 12
    args.seeds_text = f"0..{args.seeds - 1}"
    tasks = [t for t in TASKS if t.name in args.tasks.split(",")]
    names = args.algorithms.split(",")
    results = []
    for task in tasks:
        task.metric_name = load_sweep(ROOT / task.sweep_file).metric  # type: ignore[attr-defined]
        if args.retrain and task.table:
            train_table(task.sweep_file, args.retrain, str(ROOT / task.table))
        t0 = time.perf_counter()
        results.append(bench_task(task, names, list(range(args.seeds)), args.slots, args.num_samples))
        print(f"{task.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    text = markdown(results, args)
    print(text)
    if args.write:
        with open(args.write, "a") as f:
            f.write(text + "\n")
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
