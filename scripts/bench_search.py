"""Search efficiency: every algorithm tuner offers, on six tasks, many seeds, fixed budgets.

Each run is a simulation of Tune's controller (tuner.search.simulate) driving the very
scheduler and searcher `algorithms.build` gives a sweep, `--slots` trials side by side taking
turns epoch by epoch; training is replaced by a learning curve:

- synthetic: search_spaces/synthetic.py's objective (known optimum, crossing curves, noise
  shrinking with the epochs, diverging learning rates), the function its `task.train` runs;
- conditional: benchmarks/tasks/conditional.py, whose good region is small and conditional
  (adam within half a decade of lr 0.006; sgd leads at the first rungs);
- digits_mlp, digits_cnn, regression: real curves, trained in-process by tuner's trial loop
  for a table of configurations of the sweep file's space (scripts/search_curves.py; each
  proposal gets its nearest configuration's curve). The tables are committed under
  benchmarks/curves/; `--retrain` trains them again;
- char_gru (held back: never used to choose settings, reported on its own): the char-level GRU
  of issue 32 (benchmarks/tasks/char_gru.py), a real table.

A task's target is what only the best 5% of its configurations reach at max_epochs (over the
table, or over 4,000 random configurations of an analytic task). Each run spends a fixed
budget, `--budget` × max_epochs epochs (60 full trainings' worth by default; num_samples is
no limit). Reported per task and algorithm: epochs spent until the best value seen reaches the
target (median and quartiles over seeds; a seed that never reaches it counts as infinite), the
seeds that reach it, the best at half and at the whole budget, the trials run, the searcher's
own time (suggest and learn: the simulation's CPU time, which the load of a shared machine
does not inflate as it does wall time) and the training time the epochs would take at the
table's measured seconds per epoch. The best-so-far curves go to a PNG. `--warm` measures warm
starts instead: per seed, an earlier sweep of a shifted space (each range half as wide), its
trials mapped into the task's space (tuner.search.warm), then a cold and a warm-started sweep.
BENCHMARKS.md has a run and its notes.

    python scripts/bench_search.py --seeds 10 --plot benchmarks/search.png
    python scripts/bench_search.py --warm --seeds 10 --budget 20 --tasks conditional,digits_mlp
    python scripts/bench_search.py --algorithms bohb,bohb:random_fraction=0.1 --tasks synthetic
    python scripts/bench_search.py --algorithms random,cmaes,cmaes:scheduler=fifo --tasks digits_mlp
    python scripts/bench_search.py --cross-check 20   # a real sweep against the simulation
    python scripts/bench_search.py --smoke            # seconds: CI (tests/test_bench.py)
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
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from search_curves import NearestCurve, train_table  # noqa: E402

from tuner.config import load_sweep  # noqa: E402
from tuner.search import algorithms, samplers  # noqa: E402
from tuner.search import bohb as bohb_module  # noqa: E402
from tuner.search.simulate import Event, simulate  # noqa: E402


@dataclass
class Task:
    name: str
    sweep_file: str
    table: str = ""  # benchmarks/curves/<name>.json: real curves ("" for an analytic task)
    curve: str = ""  # an analytic task's Curve, "module:function"
    held_back: bool = False  # never used to choose defaults; reported on its own
    target: float = math.nan  # set by targets(): near the best the task can reach


TASKS = [
    Task("synthetic", "search_spaces/synthetic.yaml", curve="search_spaces.synthetic:loss"),
    Task("conditional", "benchmarks/tasks/conditional.yaml", curve="benchmarks.tasks.conditional:loss"),
    Task("digits_mlp", "search_spaces/digits_mlp.yaml", "benchmarks/curves/digits_mlp.json"),
    Task("digits_cnn", "search_spaces/digits_cnn.yaml", "benchmarks/curves/digits_cnn.json"),
    Task("regression", "search_spaces/regression.yaml", "benchmarks/curves/regression.json"),
    Task("char_gru", "benchmarks/tasks/char_gru.yaml", "benchmarks/curves/char_gru.json", held_back=True),
]
TARGET_PERCENTILE = 95  # of every configuration's final value (direction-aware): 1 in 20 reach it
ANALYTIC_DRAWS = 4000  # random configurations an analytic task's target is taken over


def target(task: Task) -> float:
    """The value only the best 5% of configurations reach at max_epochs: over the curve
    table's rows for a real task, over ANALYTIC_DRAWS random configurations (a seed of no
    benchmark run) for an analytic one. Diverged runs count as the worst."""
    import numpy as np

    cfg = load_sweep(ROOT / task.sweep_file)
    sign = 1.0 if cfg.objective_direction == "max" else -1.0
    if task.table:
        rows = json.loads((ROOT / task.table).read_text())["rows"]
        finals = [r["curve"][-1] if not r["failed"] else math.nan for r in rows]
    else:
        curve, _ = make_curve(task, cfg.hyperparameters())
        configs = algorithms.random_configs(cfg.hyperparameters(), ANALYTIC_DRAWS, 424242)
        finals = [curve(c, cfg.schedule.max_epochs, None) for c in configs]
    scores = [sign * v for v in finals if math.isfinite(v)]
    worst = min(scores) - 1.0  # a diverged run: below every finished one
    scores += [worst] * (len(finals) - len(scores))
    return sign * float(np.percentile(scores, TARGET_PERCENTILE))


# name -> (search.algorithm, sweep overrides, the settings of its searcher: samplers.SETTINGS
# of an Optuna sampler, bohb_module.BOHB_SETTINGS for bohb)
Variant = tuple[str, dict[str, Any], dict[str, Any]]
VARIANTS: dict[str, Variant] = {
    "grid": ("grid", {"search.grid_points": 3}, {}),
    # random search with the other schedulers (random alone is random + ASHA)
    "curve": ("random", {"schedule.scheduler": "curve"}, {}),
    "median": ("random", {"schedule.scheduler": "median"}, {}),
    "fifo": ("random", {"schedule.scheduler": "fifo"}, {}),
}
# The words of a variant that set the schedule -> the sweep file's fields
SCHEDULE_WORDS = {
    "grace": "schedule.grace_epochs",
    "factor": "schedule.reduction_factor",
    "scheduler": "schedule.scheduler",
    "threshold": "schedule.curve.threshold",
}


def variant(name: str) -> Variant:
    """A name of VARIANTS, an algorithm's name, or 'algorithm:key=value+key=value' (keys of its
    Optuna sampler or of hpbandster's BOHB; the words of SCHEDULE_WORDS set the schedule,
    'random:scheduler=curve+threshold=0.1'; an Optuna sampler's 'stopped=COMPLETE' tells
    trials the scheduler stopped as complete: samplers.Recipe.stopped_early)."""
    if name in VARIANTS:
        return VARIANTS[name]
    algo, _, spec = name.partition(":")
    settings: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    for item in filter(None, spec.split("+")):
        k, _, v = item.partition("=")
        try:
            value = json.loads(v)  # numbers, true/false, lists
        except ValueError:
            value = v  # a word (fifo)
        if k in SCHEDULE_WORDS:
            overrides[SCHEDULE_WORDS[k]] = value
        else:
            settings[k] = value
    return algo, overrides, settings


def _settings_of(algo: str) -> dict[str, Any]:
    """The live settings an algorithm's searcher is built with (what a variant changes)."""
    if algo == "bohb":
        return bohb_module.BOHB_SETTINGS
    return samplers.SETTINGS.get(algo, {})


_CURVES: dict[str, tuple[Callable[..., float], float]] = {}


def make_curve(task: Task, params: dict[str, Any]) -> tuple[Callable[..., float], float]:
    """The task's curve and its training seconds per epoch (0 for the synthetic task)."""
    if task.name not in _CURVES:
        _CURVES[task.name] = _make_curve(task, params)
    return _CURVES[task.name]


def _make_curve(task: Task, params: dict[str, Any]) -> tuple[Callable[..., float], float]:
    if not task.table:
        import importlib

        module, _, fn = task.curve.partition(":")
        return getattr(importlib.import_module(module), fn), 0.0
    table = json.loads((ROOT / task.table).read_text())
    epochs = sum(len(r["curve"]) for r in table["rows"])
    return NearestCurve(table, params), table["train_seconds"] / max(1, epochs)


@dataclass
class Run:
    events: list[Event]
    seconds: float  # CPU seconds of the simulation: the searcher's and scheduler's own work
    trials: dict[str, Any]
    cfg: Any = None  # the SweepConfig it ran


MAX_TRIALS = 2000  # num_samples of a benchmark run: the epoch budget ends it first


def run_one(
    task: Task,
    name: str,
    seed: int,
    slots: int,
    num_samples: int = MAX_TRIALS,
    budget: Optional[int] = None,
    space: Optional[dict[str, Any]] = None,
    prior: Optional[algorithms.Prior] = None,
) -> Run:
    """One seed of one algorithm: num_samples trials, or `budget` × max_epochs epochs spent;
    `space`: other search.params; `prior`: what it starts from (a warm start's trials)."""
    algo, overrides, settings = variant(name)
    if space is not None:
        overrides = {**overrides, "search.params": space}
    sets = {"search.algorithm": algo, "search.num_samples": num_samples, "search.seed": seed, **overrides}
    cfg = load_sweep(ROOT / task.sweep_file, sets)
    if budget and not cfg.scheduler.stops_early and not cfg.algorithm.runs_grid:
        # Every trial trains to max_epochs: the budget is that many trials, and a user would
        # say so (NSGA-II sizes its population from num_samples).
        cfg = load_sweep(ROOT / task.sweep_file, {**sets, "search.num_samples": min(num_samples, budget)})
    params = cfg.hyperparameters()
    curve, _ = make_curve(task, params)
    live = _settings_of(algo)
    saved = dict(live)
    live.update(settings)
    try:
        t0 = time.process_time()
        plan = algorithms.build(
            cfg.search, cfg.schedule, params, cfg.metric, cfg.objective_direction, None, prior
        )
        log: list[Event] = []
        trials = simulate(
            plan,
            plan.num_samples,
            cfg.schedule.max_epochs,
            curve,
            slots,
            seed,
            cfg.metric,
            cfg.objective_direction,
            log,
            epoch_budget=budget * cfg.schedule.max_epochs if budget else None,
        )
        return Run(log, time.process_time() - t0, trials, cfg)
    finally:
        live.clear()
        live.update(saved)


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
    """25th, 50th and 75th percentiles, interpolated; infinite where an infinite value takes
    part (a seed that never reached the target)."""
    s = sorted(xs)

    def q(p: float) -> float:
        i = p * (len(s) - 1)
        lo, hi = s[math.floor(i)], s[math.ceil(i)]
        return lo if lo == hi else lo + (hi - lo) * (i - math.floor(i))

    return q(0.25), q(0.5), q(0.75)


def fmt(x: float, digits: int = 4) -> str:
    if math.isinf(x):
        return "not reached"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.0f}"


def lost_best(task: Task, run: Run, sign: float) -> bool:
    """Whether the run's scheduler stopped the eventual best configuration before it reached
    its best: among the trials the run started, those whose whole curve (every epoch to
    max_epochs, as the simulation would have given it) reaches the best value any of them
    could, all stopped short of that value. A trial the budget cut off counts as not stopped."""
    cfg = run.cfg
    curve, _ = make_curve(task, cfg.hyperparameters())
    reachable: dict[str, float] = {}
    for tid, t in run.trials.items():
        best = -math.inf
        for epoch in range(1, cfg.schedule.max_epochs + 1):
            v = curve(t.config, epoch, None)
            if not math.isfinite(v):
                break
            best = max(best, sign * v)
        reachable[tid] = best
    top = max(reachable.values(), default=-math.inf)
    if not math.isfinite(top):
        return False
    winners = [run.trials[tid] for tid, v in reachable.items() if v >= top]
    return all(w.stopped and max(sign * v for v in w.values) < top for w in winners)


def bench_task(task: Task, names: list[str], seeds: list[int], slots: int, budget: int) -> dict[str, Any]:
    cfg = load_sweep(ROOT / task.sweep_file)
    sign = 1.0 if cfg.objective_direction == "max" else -1.0
    _, per_epoch = make_curve(task, cfg.hyperparameters())
    curves: dict[str, list[list[float]]] = {}
    rows = {}
    for name in names:
        runs = [
            run_one(task, name, s, slots, budget=budget) for s in (seeds[:1] if name == "grid" else seeds)
        ]
        curves[name] = [best_so_far(r.events, sign) for r in runs]
        cpu = sum(r.seconds for r in runs)
        print(f"  {task.name} {name}: {len(runs)} runs, {cpu:.0f} CPU s", file=sys.stderr, flush=True)
        rows[name] = runs
    # The budget: every run spends it, except grid once its list is done, and a run without
    # early stopping whose num_samples (the budget's trials) ended before (diverged trials end
    # early): their best stays.
    full = budget * cfg.schedule.max_epochs
    random_reach = [epochs_to(c, task.target, sign) for c in curves.get("random", [])]
    random_med = quartiles(random_reach)[1] if random_reach else math.nan
    table = []
    for name in names:
        cs, runs = curves[name], rows[name]
        reach = [epochs_to(c, task.target, sign) for c in cs]
        med = quartiles(reach)[1]
        lost = [lost_best(task, r, sign) for r in runs]
        table.append(
            {
                "algorithm": name,
                "runs": len(cs),
                "reached": sum(math.isfinite(x) for x in reach),
                "epochs_to_target": quartiles(reach),
                "vs_random": _ratio(med, random_med),
                "best_at_half": statistics.median(at(c, full // 2) for c in cs),
                "best_at_end": statistics.median(at(c, full) for c in cs),
                "worst_at_end": min((at(c, full) for c in cs), key=lambda v: sign * v),
                "trials": statistics.median(len(r.trials) for r in runs),
                "search_s": statistics.median(r.seconds for r in runs),
                "train_s": statistics.median(len(c) for c in cs) * per_epoch,
                "per_seed": reach,
                "lost_best": sum(lost),
            }
        )
    return {
        "task": task,
        "direction": cfg.objective_direction,
        "budget": full,
        "rows": table,
        "curves": curves,
    }


def _ratio(ours: float, random: float) -> str:
    if math.isfinite(ours) and math.isfinite(random):
        return f"{ours / random:.2f}x"
    if math.isnan(random) or math.isinf(ours) == math.isinf(random):
        return ""
    return "< 1x (random: not reached)" if math.isinf(random) else "> 1x (not reached)"


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = []
    for res in sorted(results, key=lambda r: r["task"].held_back):
        task, budget = res["task"], res["budget"]
        if task.held_back and not any(line.startswith("#### Held back") for line in lines):
            lines += ["#### Held back (never used to choose settings)", ""]
        better = "≥" if res["direction"] == "max" else "≤"
        lines += [
            f"#### {task.name}: target {task.metric_name} {better} {task.target:.4g} (the best 5% of"
            " configurations);"
            f" budget {budget} epochs, seeds {args.seeds_text}",
            "",
            "| algorithm | reached | epochs to target: median [q1, q3] | vs random"
            f" | best at {budget // 2} epochs | best at {budget} | its worst seed | trials | best stopped"
            " | search CPU s | training s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in res["rows"]:
            q1, med, q3 = r["epochs_to_target"]
            lines.append(
                f"| {r['algorithm']} | {r['reached']}/{r['runs']} | {fmt(med)} [{fmt(q1)}, {fmt(q3)}]"
                f" | {r['vs_random']} | {fmt(r['best_at_half'])} | {fmt(r['best_at_end'])}"
                f" | {fmt(r['worst_at_end'])}"
                f" | {r['trials']:.0f} | {r['lost_best']}/{r['runs']} | {r['search_s']:.1f}"
                f" | {r['train_s']:.0f} |"
            )
        lines += ["", "Epochs to the target, seed by seed:", ""]
        lines += [f"- {r['algorithm']}: {', '.join(fmt(x) for x in r['per_seed'])}" for r in res["rows"]]
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
        if finite and res["direction"] == "max":
            lo, hi = np.percentile(finite, [2, 100])
            ax.set_ylim(lo - 0.1 * (hi - lo or 1), hi + 0.1 * (hi - lo or 1))
        elif finite:  # a loss: on a log scale, from its best to where the curves stand early on
            ax.set_yscale("log")
            ax.set_ylim(min(finite) * 0.95, np.percentile(finite, 90) * 1.1)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cross_check(n: int, algorithm: str = "random") -> str:
    """One seed of the synthetic task as a real sweep (`python -m tuner sweep`, Ray, 2 trials
    side by side on this machine's CPUs) and through the simulation: the same configurations,
    the epochs each was given, the best value, the epochs spent."""
    import subprocess
    import tempfile

    task = TASKS[0]
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "tuner", "sweep", task.sweep_file, "--algorithm", algorithm]
        command += ["--num-samples", str(n), "--set", f"output={out}", "--set", "search.seed=0"]
        t0 = time.perf_counter()
        subprocess.run(command, cwd=ROOT, capture_output=True, text=True)  # 1: some trials diverged
        wall = time.perf_counter() - t0
        summary = json.loads((Path(out) / "synthetic" / "summary.json").read_text())
    real = {_key(t["config"]): t["epochs"] for t in summary["trials"]}
    run = run_one(task, algorithm, 0, 2, n)
    sim = {_key(t.config): len(t.values) for t in run.trials.values()}
    same = sum(real.get(k) == e for k, e in sim.items())
    return (
        f"Cross-check ({algorithm}, {n} trials, seed 0, synthetic): the real sweep took {wall:.0f} s;"
        f" {len(set(real) & set(sim))} of {n} configurations the same in both, {same} of them given the"
        f" same epochs; epochs spent {sum(real.values())} (sweep) vs {len(run.events)} (simulation);"
        f" best val_loss {summary['best']['metrics'][summary['metric']]:.4f} vs"
        f" {best_so_far(run.events, -1.0)[-1]:.4f}. Epochs per trial, sweep: {sorted(real.values())};"
        f" simulation: {sorted(sim.values())}."
    )


def shifted(task: Task) -> dict[str, Any]:
    """The task's search.params with each range half as wide (in log space for log types) and
    shifted: from 3/8 to 7/8 of the way up. Choices and fixed values as they are."""
    raw = load_sweep(ROOT / task.sweep_file).search.params
    out: dict[str, Any] = {}
    for name, p in raw.items():
        spec = p.model_dump(exclude_none=True) if hasattr(p, "low") else None
        if spec is None:
            out[name] = p.value if hasattr(p, "value") else p.model_dump(exclude_none=True)
            continue
        log = p.kind.startswith("log")
        lo, hi = (math.log(p.low), math.log(p.high)) if log else (p.low, p.high)
        a, b = lo + 0.375 * (hi - lo), lo + 0.875 * (hi - lo)
        a, b = (math.exp(a), math.exp(b)) if log else (a, b)
        if p.kind.endswith("randint"):
            a, b = math.ceil(a), max(math.ceil(a) + 1, math.floor(b))
        out[name] = {**spec, "low": a, "high": b}
    return out


def bench_warm(task: Task, names: list[str], seeds: list[int], slots: int, budget: int) -> list[str]:
    """Per algorithm: epochs to target of a cold start, and of a start warmed by an earlier
    sweep (same seed, `budget` × max_epochs epochs) of the shifted space; medians over seeds."""
    from tuner.search import warm

    cfg = load_sweep(ROOT / task.sweep_file)
    sign = 1.0 if cfg.objective_direction == "max" else -1.0
    rows = []
    for name in names:
        cold, warmed = [], []
        for seed in seeds:
            old = run_one(task, name, 1000 + seed, slots, budget=budget, space=shifted(task))
            earlier = []
            for t in old.trials.values():
                mapped = warm.into_space(cfg.hyperparameters(), cfg.search.constraints, t.config)
                if mapped is not None:
                    history = [{"epoch": e, cfg.metric: v} for e, v in enumerate(t.values, 1)]
                    earlier.append(algorithms.PriorTrial(mapped, history, t.failed))
            for out, prior in ((cold, None), (warmed, algorithms.Prior(earlier=earlier))):
                run = run_one(task, name, seed, slots, budget=budget, prior=prior)
                out.append(epochs_to(best_so_far(run.events, sign), task.target, sign))
        c, w = quartiles(cold)[1], quartiles(warmed)[1]
        rows.append(
            f"| {task.name} | {name} | {fmt(c)} ({sum(map(math.isfinite, cold))}/{len(seeds)})"
            f" | {fmt(w)} ({sum(map(math.isfinite, warmed))}/{len(seeds)}) | {_ratio(w, c)} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def front_points(trials: dict[str, Any], objectives: list[tuple[str, str]]) -> dict[str, tuple[float, ...]]:
    """The Pareto front of a run's trials, as tuner.results.pareto ranks them: each trial with
    its values at its best epoch of the first objective; configuration -> its values, signed
    so that higher is better."""
    signs = [1.0 if m == "max" else -1.0 for _, m in objectives]
    first, sign = objectives[0][0], signs[0]
    points: dict[str, tuple[float, ...]] = {}
    for t in trials.values():
        rows = [r for r in t.rows if "failure" not in r and math.isfinite(r[first])]
        if rows:
            best = max(rows, key=lambda r: sign * r[first])
            points[algorithms.key(t.config)] = tuple(
                s * best[n] for s, (n, _) in zip(signs, objectives, strict=True)
            )

    def dominated(p: tuple[float, ...]) -> bool:
        return any(q != p and all(a >= b for a, b in zip(q, p, strict=True)) for q in points.values())

    return {k: p for k, p in points.items() if not dominated(p)}


def hypervolume(points: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """The area two-objective points (higher is better) dominate above `ref`."""
    area, top = 0.0, ref[1]
    for x, y in sorted(points, reverse=True):  # best first objective first
        if y > top and x > ref[0]:
            area += (x - ref[0]) * (y - top)
            top = y
    return area


def pareto_gap(
    known: list[tuple[float, float]], found: list[tuple[float, float]], ref: tuple[float, float]
) -> tuple[float, float]:
    """How far a found front falls short of the known one: its hypervolume as a share of the
    known front's (above `ref`), and the additive epsilon (Zitzler et al. 2003): the least
    amount that, added to every found point, makes it cover every known point."""
    eps = max(min(max(a - b for a, b in zip(p, q, strict=True)) for q in found) for p in known)
    return hypervolume(found, ref) / hypervolume(known, ref), max(eps, 0.0)


def fit_cost(repeats: int = 3) -> str:
    """What one judgement of the curve stopper costs: its ensemble fitted to a curve and the
    probability of beating a value computed (tuner.search.curves.fit and p_above), for every
    length of every curve of the real tasks' tables and of 200 synthetic curves (81 epochs, the
    longest), in CPU time (process_time: the load of a shared machine does not inflate it as it
    does wall time). Median, 99th percentile and the most, in ms."""
    import numpy as np

    from tuner.search import curves as model

    series = []
    for task in TASKS:
        if task.table:
            rows = json.loads((ROOT / task.table).read_text())["rows"]
            series += [(r["curve"], len(r["curve"])) for r in rows if not r["failed"]]
    synthetic = TASKS[0]
    cfg = load_sweep(ROOT / synthetic.sweep_file)
    curve, _ = make_curve(synthetic, cfg.hyperparameters())
    for c in algorithms.random_configs(cfg.hyperparameters(), 200, 7):
        values = [curve(c, e, None) for e in range(1, 82)]
        if all(math.isfinite(v) for v in values):
            series.append((values, 81))
    costs = []
    # (one judgement before any is timed: the first imports scipy.special)
    model.fit(np.arange(1, 3), np.array(series[0][0][:2], dtype=float), series[0][1], noise=0.01).p_above(0.0)
    for values, length in series:
        z = np.array(values, dtype=float)
        model.grid(length)  # (made once per length, as in a sweep)
        for n in range(model.MIN_POINTS, length):
            epochs = np.arange(1, n + 1)
            for _ in range(repeats):
                t0 = time.process_time()
                fitted = model.fit(epochs, z[:n], length, noise=0.01)
                assert fitted is not None
                fitted.p_above(float(z.max()))
                costs.append(time.process_time() - t0)
    ms = np.array(costs) * 1e3
    return (
        f"One judgement of the curve stopper (fit + probability), {len(ms):,} of them over every length of"
        f" {len(series)} curves: median {np.median(ms):.2f} ms, 99th percentile"
        f" {np.percentile(ms, 99):.2f} ms, most {ms.max():.2f} ms (CPU time)."
    )


PARETO_TRIALS = 80  # trials a run of --pareto


def bench_pareto(seeds: list[int], schedulers: list[str]) -> list[str]:
    """The conditional task with a second objective (its width as cost: both of
    benchmarks/tasks/conditional.py), PARETO_TRIALS random configurations per seed, each
    scheduler against fifo (every configuration trained to max_epochs: the known front)."""
    from benchmarks.tasks.conditional import both

    objectives = [("val_loss", "min"), ("cost", "min")]
    two = {"metric": [n for n, _ in objectives], "direction": [d for _, d in objectives]}
    rows = []
    for scheduler in schedulers:
        gaps, epochs, kept = [], [], []
        for seed in seeds:
            fronts, spent = {}, {}
            for name in ("fifo", scheduler):
                over = {"search.num_samples": PARETO_TRIALS, "search.seed": seed, "schedule.scheduler": name}
                cfg = load_sweep(ROOT / TASKS[1].sweep_file, {**over, **two})
                plan = algorithms.build_for(cfg)
                trials = simulate(
                    plan, plan.num_samples, cfg.schedule.max_epochs, both, metric="val_loss", direction="min"
                )
                fronts[name], spent[name] = (
                    front_points(trials, objectives),
                    sum(len(t.values) for t in trials.values()),
                )
            every = [p for f in fronts.values() for p in f.values()]
            ref = (
                min(p[0] for p in every) - 0.1,
                min(p[1] for p in every) - 0.1,
            )  # (the worst, a little beyond)
            gaps.append(pareto_gap(list(fronts["fifo"].values()), list(fronts[scheduler].values()), ref))
            epochs.append(spent[scheduler] / spent["fifo"])
            kept.append((len(set(fronts["fifo"]) & set(fronts[scheduler])), len(fronts["fifo"])))
        hv = [g[0] for g in gaps]
        eps = [g[1] for g in gaps]
        same = sum(k == n for k, n in kept)
        rows.append(
            f"| {scheduler} | {statistics.median(epochs):.2f}x | {same}/{len(seeds)}"
            f" | {sum(k for k, _ in kept)}/{sum(n for _, n in kept)}"
            f" | {statistics.median(hv):.3f} [{min(hv):.3f}]"
            f" | {statistics.median(eps):.3f} [{max(eps):.3f}] |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _key(config: dict[str, Any]) -> str:
    from search_spaces.synthetic import BEST

    return json.dumps({k: round(float(config[k]), 9) if k != "optimizer" else config[k] for k in BEST})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 per task and algorithm")
    ap.add_argument("--budget", type=int, default=60, help="epochs per run, in multiples of max_epochs")
    ap.add_argument("--slots", type=int, default=2, help="trials running side by side")
    ap.add_argument("--tasks", default=",".join(t.name for t in TASKS))
    ap.add_argument(
        "--algorithms",
        default="random,bohb,optuna,grid",
        help="names, or 'bohb:key=value+key=value' (TPESampler/BOHB settings)",
    )
    ap.add_argument("--write", help="append the tables to this markdown file")
    ap.add_argument("--plot", help="the best-so-far curves to this PNG")
    ap.add_argument("--retrain", type=int, metavar="N", help="train the real tasks' tables anew (N configs)")
    ap.add_argument("--smoke", action="store_true", help="2 seeds, 12 trials, seconds")
    ap.add_argument(
        "--warm",
        action="store_true",
        help="warm start vs cold start: an earlier sweep of a shifted space (half as wide) first",
    )
    ap.add_argument(
        "--cross-check", type=int, metavar="N", help="N trials of synthetic: a real sweep and the simulation"
    )
    ap.add_argument("--fit-cost", action="store_true", help="what one judgement of the curve stopper costs")
    ap.add_argument(
        "--pareto",
        action="store_true",
        help="two objectives: the Pareto front with early stopping (moasha) against without (fifo)",
    )
    args = ap.parse_args()
    if args.cross_check:
        print(cross_check(args.cross_check))
        return 0
    if args.smoke:
        args.seeds, args.budget = 2, 2
    args.seeds_text = f"0..{args.seeds - 1}"
    if args.fit_cost:
        print(fit_cost())
        return 0
    if args.pareto:
        lines = [
            "| scheduler | epochs vs fifo | seeds with fifo's front | fifo's front points kept"
            " | hypervolume vs fifo's: median [worst] | additive epsilon: median [worst] |",
            "| --- | --- | --- | --- | --- | --- |",
            *bench_pareto(list(range(args.seeds)), ["moasha"]),
        ]
        print("\n".join(lines))
        return 0
    by_name = {t.name: t for t in TASKS}
    tasks = [by_name[n] for n in args.tasks.split(",")]  # in the order given
    names = args.algorithms.split(",")
    if args.warm:
        lines = [
            "| task | algorithm | cold: median epochs to target (seeds reaching it) | warm | warm vs cold |",
            "| --- | --- | --- | --- | --- |",
        ]
        if args.write:
            with open(args.write, "a") as f:
                f.write("\n".join(lines) + "\n")
        for task in tasks:
            task.target = target(task)
            algos = [n for n in names if n != "grid"]
            rows = bench_warm(task, algos, list(range(args.seeds)), args.slots, args.budget)
            lines += rows
            if args.write:  # each task's rows as soon as they are measured
                with open(args.write, "a") as f:
                    f.write("\n".join(rows) + "\n")
        print("\n".join(lines))
        return 0
    results = []
    for task in tasks:
        task.metric_name = load_sweep(ROOT / task.sweep_file).metric  # type: ignore[attr-defined]
        if args.retrain and task.table:
            train_table(task.sweep_file, args.retrain, str(ROOT / task.table))
        task.target = target(task)
        t0 = time.perf_counter()
        results.append(bench_task(task, names, list(range(args.seeds)), args.slots, args.budget))
        print(f"{task.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if args.write:  # each task's table as soon as it is done (a long run keeps what it measured)
            with open(args.write, "a") as f:
                f.write(markdown(results[-1:], args) + "\n")
    print(markdown(results, args))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
