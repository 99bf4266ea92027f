"""Section `compute` of scripts/bench.py: a sweep whose epochs, not start-up, take the time.

A digits CNN (search_spaces/digits_cnn.yaml with channels {32, 48, 64} and 2-3 blocks, so an
epoch takes 0.25-0.6 s on one core, quiet), 30 trials of up to 9 epochs, against
scripts/peers/optuna_digits_cnn.py: the same CNN, space and training, Optuna TPE + Hyperband
pruning in one process, torch on every core. Each repeat (seed = repeat) runs the peer and
`python -m tuner sweep` with each algorithm, in an order that turns from one repeat to the next.

The figure is the time, from each process's start, until the sweep's best val_acc first
reaches the peer's final best (study.best_value, its best complete trial) of the same seed:
for ours, from the trial records' epoch end times (wall_time); for the peer, from the "bests"
it prints. A sweep that never gets there within its budget counts as infinite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench import PY, ROOT, records, run, tuner_sweep

from tuner import sweepdir

PEER = ROOT / "scripts" / "peers" / "optuna_digits_cnn.py"
SPACE = [
    "--set",
    "search.params.channels={type: choice, values: [32, 48, 64]}",
    "--set",
    "search.params.blocks={type: randint, low: 2, high: 3}",
]
SIZES = {"trials": 30, "epochs": 9, "algorithms": ["random", "bohb", "optuna"]}
SMOKE = {"trials": 2, "epochs": 2, "algorithms": ["random"]}  # one wave on 2 slots (grace is 2)
EPS = 5e-5  # the peer rounds accuracies to 4 places; accuracies on 450 samples differ by 1/450


def compute(cfg: argparse.Namespace, work: Path) -> dict[str, Any]:
    size = SMOKE if cfg.smoke else SIZES
    n, epochs = size["trials"], size["epochs"]

    def peer(seed: int) -> dict[str, Any]:
        wall, out = run([PY, str(PEER), str(n), str(epochs), str(seed)])
        line = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
        return {
            "wall": wall,
            "best": line["best_val_acc"],
            "epochs": line["epochs_spent"],
            "curve": [tuple(b) for b in line["bests"]],
        }

    def ours(algorithm: str, seed: int) -> dict[str, Any]:
        name = f"compute-{algorithm}-{seed}-{time.monotonic_ns()}"
        launched = time.time()
        wall, sweep = tuner_sweep(
            work,
            name,
            str(ROOT / "search_spaces" / "digits_cnn.yaml"),
            *("--algorithm", algorithm, "--num-samples", str(n), "--max-epochs", str(epochs)),
            *("--seed", str(seed), *SPACE),
        )
        rows = sorted((r for _, rs in records(sweep) for r in rs), key=lambda r: r["wall_time"])
        curve, best = [], float("-inf")
        for r in rows:
            if r.get("val_acc", float("-inf")) > best:
                best = r["val_acc"]
                curve.append((r["wall_time"] - launched, best))
        summary = sweepdir.read_summary(str(sweep)) or {}
        return {
            "wall": wall,
            "best": summary["best"]["metrics"]["val_acc"],
            "epochs": len(rows),
            "epoch_s": statistics.median(r["epoch_time_s"] for r in rows),
            "curve": curve,
        }

    names = ["peer"] + [f"tuner {a}" for a in size["algorithms"]]
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    for rep in range(cfg.repeats):
        for who in names[rep % len(names) :] + names[: rep % len(names)]:
            r = peer(rep) if who == "peer" else ours(who.split()[1], rep)
            out[who].append(r)
            print(
                f"  [compute] {who} seed {rep}: {r['wall']:.1f}s, {r['epochs']} epochs, best {r['best']:.4f}"
            )
        target = out["peer"][rep]["best"]  # the peer's final best of the same seed
        for who in names:
            out[who][rep]["to_target"] = time_to(out[who][rep]["curve"], target)
        print(
            f"  [compute] seed {rep}, to {target:.4f}: "
            + ", ".join(f"{w} {out[w][rep]['to_target']:.1f}s" for w in names)
        )
    return out


def time_to(curve: list[tuple[float, float]], target: float) -> float:
    """Seconds until the best-so-far curve first reaches `target` (inf: never)."""
    return next((t for t, acc in curve if acc >= target - EPS), float("inf"))


def compute_report(cfg: argparse.Namespace, res: dict[str, list[dict[str, Any]]]) -> list[str]:
    peer, size = res["peer"], SMOKE if cfg.smoke else SIZES

    def med(who: str, key: str) -> float:
        return statistics.median(r[key] for r in res[who])

    def ratio(who: str, key: str) -> float:
        return statistics.median(r[key] / p[key] for r, p in zip(res[who], peer, strict=True))

    lines = [
        f"### Compute-bound sweep: digits CNN, {size['trials']} trials, <= {size['epochs']} epochs, "
        f"seeds 0..{len(peer) - 1}",
        "",
        "Time to the peer's best: from the process's start until the sweep's best val_acc first "
        "reaches the peer's final best of the same seed (target <= 0.7x the peer's own).",
        "",
        "| contender | wall s | epochs | epoch s (median) | best val_acc | to peer's best s "
        "| to peer's best vs peer | wall vs peer |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for who in res:
        epoch_s = f"{med(who, 'epoch_s'):.2f}" if "epoch_s" in res[who][0] else "-"
        vs = "- | -" if who == "peer" else f"**{ratio(who, 'to_target'):.2f}x** | {ratio(who, 'wall'):.2f}x"
        label = "peer optuna in-process (cnn)" if who == "peer" else who
        lines.append(
            f"| {label} | {med(who, 'wall'):.1f} | {med(who, 'epochs'):.0f} | {epoch_s} "
            f"| {med(who, 'best'):.4f} | {med(who, 'to_target'):.1f} | {vs} |"
        )
    lines.append("")
    return lines
