"""Population-based training against random search + ASHA, at the same epoch budget, on real
training (issue 47).

Two tasks where a schedule matters, each trained by real sweeps (`python -m tuner sweep`, a
private local Ray each, 2 trials at a time on a 2-core machine):

- digits_cnn: tuner's loop, the built-in CNN on the digits data, SGD with momentum at a
  constant learning rate and weight decay, both searched (a decaying rate is what helps);
- char_lm: the char-level transformer of search_spaces/char_lm.py (`task.train`), AdamW at a
  constant learning rate, searched.

Per task and seed, side by side and alternating which goes first: pbt (a population of
POPULATION trials of MAX_EPOCHS epochs, perturbed every INTERVAL) and random + ASHA (the same
space, ASHA_TRIALS trials of up to MAX_EPOCHS, grace 1, reduction factor 3). Every epoch any
trial trained is counted, in the order the epochs ended (their journals' wall_time); the
budget is pbt's (POPULATION x MAX_EPOCHS epochs). Reported per task and method, over seeds:
the best value within the budget (median and each seed's), the epochs spent until the best
so far reaches each of the task's two targets (an easy one most runs reach, and one near the
best either reaches; median, a seed that never reaches it counts as infinite), and the wall
time. The goal: pbt reaches the target in at most 0.8x random + ASHA's epochs.

    python scripts/bench_pbt.py --seeds 5 --out /tmp/bench_pbt      # ~1-2 h on 2 cores
    python scripts/bench_pbt.py --report /tmp/bench_pbt             # the tables again
    python scripts/bench_pbt.py --smoke --out /tmp/bench_pbt_smoke  # a minute: it runs
    python scripts/bench_pbt.py --orders /tmp/bench_pbt             # other training orders
    python scripts/bench_pbt.py --methods pbt --out DIR              # pbt alone (a change to it),
                                                  # against asha rows copied into DIR/results.jsonl

`--orders` asks what the order of training costs: it replays each recorded pbt sweep's
members (their values epoch by epoch, their lineages) under other orders with the same
decisions (a decision depends only on the members' values at its epoch, so any order that
waits for them makes the same ones), one epoch a step on 2 slots, and counts the epochs until
the target: `lockstep` (every member reaches a perturbation before any goes on: tuner's),
`ahead` (a member goes on past a perturbation once it cannot be a recipient there, at least
`quantile` of the population having reached it below it; the best first: no epoch is
wasted), `eager` (every member goes on at once, the best first; a recipient's epochs past its
perturbation are thrown away, counted, and credited nothing, as their values were never
measured).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.config.population import perturbation_epochs  # noqa: E402
from tuner.sweepdir import read_metrics, trial_dirs  # noqa: E402

POPULATION, MAX_EPOCHS, INTERVAL, ASHA_TRIALS = 6, 8, 2, 26

TASKS: dict[str, dict[str, Any]] = {
    "digits_cnn": {
        "task": {"model": "cnn", "data": "digits"},
        "metric": "val_acc",
        "direction": "max",
        "targets": (0.975, 0.99),
        "params": {
            "lr": {"type": "loguniform", "low": 1e-3, "high": 0.5},
            "weight_decay": {"type": "loguniform", "low": 1e-6, "high": 1e-2},
            "channels": 16,
            "blocks": 2,
            "optimizer": "sgd",
            "momentum": 0.9,
        },
        "training": {"batch_size": 64, "amp": "off", "lr_schedule": "constant"},
    },
    "char_lm": {
        "task": {"train": "search_spaces.char_lm:train"},
        "metric": "val_loss",
        "direction": "min",
        "targets": (1.8, 1.75),
        "params": {
            "lr": {"type": "loguniform", "low": 1e-4, "high": 3e-2},
            "width": 64,
            "layers": 1,
            "heads": 4,
            "block_size": 32,
            "dropout": 0.0,
            "modules": "argparse,collections",
            "chars": 30000,
            "batch_size": 32,
        },
        "training": {},
    },
}


def sweep_file(task: str, method: str, seed: int, out: Path, smoke: bool) -> dict[str, Any]:
    t = TASKS[task]
    epochs, population = (3, 3) if smoke else (MAX_EPOCHS, POPULATION)
    schedule: dict[str, Any] = {"max_epochs": epochs}
    if method == "pbt":
        schedule.update(scheduler="pbt", pbt={"interval": 1 if smoke else INTERVAL})
        samples = population
    else:
        schedule.update(scheduler="asha", grace_epochs=1, reduction_factor=3)
        samples = 4 if smoke else ASHA_TRIALS
    return {
        "name": f"{task}-{method}-{seed}",
        "task": t["task"],
        "metric": t["metric"],
        "direction": t["direction"],
        "search": {"algorithm": "random", "num_samples": samples, "seed": seed, "params": t["params"]},
        "schedule": schedule,
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
        "training": t["training"],
        "output": str(out),
    }


def run(task: str, method: str, seed: int, out: Path, smoke: bool) -> dict[str, Any]:
    raw = sweep_file(task, method, seed, out / "sweeps", smoke)
    path = out / "files" / f"{raw['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "sweep", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    wall = time.monotonic() - began
    if done.returncode not in (0, 1):
        raise RuntimeError(
            f"{raw['name']}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    rows = []
    for d in trial_dirs(str(out / "sweeps" / raw["name"])):
        rows += [r for r in read_metrics(d) if "failure" not in r]
    rows.sort(key=lambda r: r["wall_time"])
    values = [float(r[raw["metric"]]) if math.isfinite(float(r[raw["metric"]])) else math.nan for r in rows]
    return {"task": task, "method": method, "seed": seed, "wall_s": round(wall, 1), "values": values}


def measured(result: dict[str, Any], budget: int, target: float, direction: str) -> dict[str, Any]:
    """The best within `budget` epochs, and the epochs until the best reaches `target` over
    every epoch the sweep ran (inf: never)."""
    sign = 1.0 if direction == "max" else -1.0
    best, reached = -math.inf, math.inf
    for i, v in enumerate(result["values"], 1):
        if math.isfinite(v) and (i <= budget or reached == math.inf):
            if i <= budget:
                best = max(best, sign * v)
            if sign * v >= sign * target and reached == math.inf:
                reached = i
    return {"best": sign * best, "epochs_to_target": reached, "epochs": len(result["values"])}


def report(out: Path, smoke: bool) -> str:
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    lines = []
    for task in TASKS:
        mine = [r for r in results if r["task"] == task]
        if not mine:
            continue
        t = TASKS[task]
        budget = (3 * 3) if smoke else POPULATION * MAX_EPOCHS
        targets = ", ".join(f"{x:g}" for x in t["targets"])
        lines.append(
            f"\n{task}: budget {budget} epochs, targets {t['metric']} {targets} ({t['direction']})\n"
        )
        head = ["method", "seeds", "best at budget (median)", "each seed"]
        head += [f"epochs to {x:g} (median; each seed)" for x in t["targets"]]
        lines.append("| " + " | ".join((*head, "epochs run (median)", "wall s (median)")) + " |")
        lines.append("| --- " * (len(head) + 2) + "|")
        medians: dict[str, list[float]] = {}
        for method in ("pbt", "asha"):
            rs = sorted((r for r in mine if r["method"] == method), key=lambda r: r["seed"])
            if not rs:
                continue
            cells = [method if method == "pbt" else "random + ASHA", str(len(rs))]
            best = [measured(r, budget, t["targets"][0], t["direction"])["best"] for r in rs]
            cells += [f"{statistics.median(best):.4f}", ", ".join(f"{b:.4f}" for b in best)]
            medians[method] = []
            for target in t["targets"]:
                reach = [measured(r, budget, target, t["direction"])["epochs_to_target"] for r in rs]
                medians[method].append(statistics.median(reach))
                cells.append(f"{statistics.median(reach):g}; {', '.join(f'{x:g}' for x in reach)}")
            cells.append(f"{statistics.median(len(r['values']) for r in rs):g}")
            cells.append(f"{statistics.median(r['wall_s'] for r in rs):.0f}")
            lines.append("| " + " | ".join(cells) + " |")
        if len(medians) == 2:
            for target, p, a in zip(t["targets"], medians["pbt"], medians["asha"], strict=True):
                ratio = f"{p / a:.2f}x" if math.isfinite(a) and math.isfinite(p) else f"pbt {p:g}, asha {a:g}"
                lines.append(f"\npbt / random+ASHA epochs to {target:g} (medians): {ratio}")
    return "\n".join(lines)


ORDERS = ("lockstep", "ahead", "eager")


def replay(
    sweep: Path, metric: str, sign: float, target: float, order: str, slots: int = 2
) -> tuple[float, int]:
    """(epochs until a member reaches `target`, epochs trained) of the pbt sweep `sweep` had
    its epochs been trained in `order` (see the module), with its recorded decisions."""
    from tuner.sweepdir import read_lineage

    vals: dict[int, dict[int, float]] = {}
    recipient: dict[int, set[int]] = {}
    for d in trial_dirs(str(sweep)):
        lineage = read_lineage(d)
        if lineage is None:
            continue
        m = int(lineage["member"])
        rows = [r for r in read_metrics(d) if "failure" not in r]
        vals[m] = {int(r["epoch"]): sign * float(r[metric]) for r in rows}
        recipient[m] = {int(s["epoch"]) for s in lineage["segments"][1:]}
    last = max(max(v, default=0) for v in vals.values())
    epochs = perturbation_epochs(INTERVAL, MAX_EPOCHS)
    count = min(math.ceil(len(vals) * 0.25), len(vals) // 2)  # (schedule.pbt.quantile's default)
    pos = dict.fromkeys(vals, 0)  # epochs of its recorded course trained
    lost = dict.fromkeys(vals, 0)  # eager: epochs past a perturbation it turns out a recipient at
    decided: set[int] = set()
    spent, reached = 0, math.inf

    def may(m: int) -> bool:
        if pos[m] + lost[m] >= last:
            return False
        pending = [e for e in epochs if e not in decided and pos[m] == e]
        if order == "lockstep":
            return not any(e not in decided and pos[m] >= e for e in epochs)
        if order == "ahead":
            return all(
                sum(pos[o] >= e and vals[o].get(e, -math.inf) < vals[m][e] for o in vals) >= count
                for e in pending
            )
        return True

    def first(m: int) -> tuple[Any, ...]:
        if order == "lockstep":
            return (pos[m], m)
        return (
            pos[m] > 0,
            -vals[m].get(pos[m], -math.inf) if pos[m] else 0.0,
            m,
        )  # a value for each, then the best

    while any(pos[m] < last for m in vals):
        decided |= {e for e in epochs if all(pos[m] >= e for m in vals)}
        for m in vals:
            if any(e in decided for e in recipient[m] if pos[m] == e):
                lost[m] = 0  # its epochs past the perturbation are the donor's now
        for m in sorted((m for m in vals if may(m)), key=first)[:slots]:
            spent += 1
            if any(e not in decided and pos[m] >= e for e in recipient[m]):
                lost[m] += 1  # (eager) on weights that will be replaced
                continue
            pos[m] += 1
            if reached == math.inf and vals[m].get(pos[m], -math.inf) >= sign * target:
                reached = spent
    return reached, spent


def orders(out: Path) -> str:
    lines = []
    for task, t in TASKS.items():
        sign = 1.0 if t["direction"] == "max" else -1.0
        sweeps = sorted((out / "sweeps").glob(f"{task}-pbt-*"))
        if not sweeps:
            continue
        lines.append(f"\n{task}: {len(sweeps)} pbt sweeps replayed\n")
        head = [f"epochs to {x:g} (median; each seed)" for x in t["targets"]]
        lines.append("| order | " + " | ".join(head) + " | epochs trained (median) |")
        lines.append("| --- " * (len(head) + 2) + "|")
        for order in ORDERS:
            cells, trained = [order], []
            for target in t["targets"]:
                got = [replay(s, t["metric"], sign, target, order) for s in sweeps]
                reach = [r for r, _ in got]
                trained = [n for _, n in got]
                cells.append(f"{statistics.median(reach):g}; {', '.join(f'{x:g}' for x in reach)}")
            lines.append("| " + " | ".join([*cells, f"{statistics.median(trained):g}"]) + " |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument(
        "--methods",
        default="pbt,asha",
        help="e.g. pbt: only pbt's sweeps (--report then "
        "compares them with the asha results already in --out)",
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_pbt"))
    ap.add_argument("--report", type=Path, help="print the tables of an earlier --out")
    ap.add_argument("--smoke", action="store_true", help="tiny sweeps: it runs")
    ap.add_argument("--orders", type=Path, help="replay an earlier --out's pbt sweeps in other orders")
    args = ap.parse_args(argv)
    if args.orders:
        print(orders(args.orders))
        return 0
    if args.report:
        print(report(args.report, args.smoke))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TUNER_CACHE_DIR", str(args.out / "cache"))
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for seed in range(args.seeds):
        for task in args.tasks.split(","):
            order = ("pbt", "asha") if seed % 2 == 0 else ("asha", "pbt")  # alternating
            for method in (m for m in order if m in args.methods.split(",")):
                result = run(task, method, seed, args.out, args.smoke)
                result["load"] = os.getloadavg()[0]
                with open(args.out / "results.jsonl", "a") as f:
                    f.write(json.dumps(result) + "\n")
                print(
                    f"{task} {method} seed {seed}: {len(result['values'])} epochs, {result['wall_s']} s",
                    flush=True,
                )
    print(report(args.out, args.smoke))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
