"""tuner against the hand-written peers, measured side by side in one run on this machine.

usage: python scripts/bench.py [--repeats 3] [--only SECTION,...] [--write BENCHMARKS.md] [--smoke]
                              [--address GCS] [--against DIR] [--joined]
                              [--algorithm NAME]

Sections (issues 7 and 16):
  fixed       issue 16's command (digits_mlp, random, 30 trials, <= 27 epochs, seed 1) against
              the Optuna peer, whole processes alternating: wall (ours / peer, pair by pair),
              best, our fixed cost (start -> first epoch, last epoch -> results / summary /
              exit), issue 50's figure of merit and where the seconds went, stage by stage
              (scripts/timeline.py); with --against DIR, the tuner of another checkout too
              (`git archive main | tar -x -C DIR`), a third party of each repeat; with --joined,
              the command joined to a `tuner cluster start` cluster kept running through the
              runs, another party; with --algorithm NAME, that search instead of random;
              bench_fixed.py
  throughput  30-trial sweeps of digits_mlp (<= 27 epochs): wall time, epochs/s, best val_acc,
              ours (bohb, random, optuna) vs ../shared/peers or $TUNER_PEERS (Optuna in-process; Ray Tune with
              reused actors, random+ASHA and BOHB), repeats alternating, seeds 0..repeats-1
  overhead    100 one-epoch trials of a tiny task: a trial's start (Tune starts it) to its
              first report, and a slot's idle time between one trial and the next
  ddp         2-worker gloo DDP trials, one sweep of 3 per repeat, one trial at a time: a
              trial's start to its first report, trials on new rank processes (the
              sweep's first) apart from those on the ranks the trial before left
  parity      samples/s of tuner's loop vs a hand-written DDP loop under torchrun, same work
  makespan    trials of 1-10 s, TensorBoard on: trials' span / (sum of epoch compute / slots)
  search      epochs each algorithm needs to reach val_acc 0.975 on digits, median of 5 seeds
  compute     a digits CNN (epochs of ~0.3 s+), 30 trials: time to the Optuna peer's best
              (scripts/peers/optuna_digits_cnn.py); scripts/bench_compute.py

Every figure is a median over repeats; ratios compare runs of the same repeat set. --smoke
runs every section at toy sizes (tuner's bohb and random only) in a few minutes
(tests/test_bench.py keeps it from rotting); its numbers mean nothing and it writes
BENCHMARKS.md only if --write is given. --address runs tuner's sweeps on a Ray cluster that is
already running (`tuner cluster start`; its token as for `tuner sweep --address`) instead of each
starting its own Ray: their walls then leave out Ray's start, so their ratios against the peers
(which start theirs) are not the issue's. The fixed-cost section always starts its own, since
that start is what it measures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import bench_fixed

from tuner import sweepdir
from tuner.trial.launch.ranks import KEPT_NOTE

ROOT = Path(__file__).resolve().parents[1]
# The hand-written peers live beside the repository (../shared/peers) unless TUNER_PEERS says.
PEERS = Path(os.environ.get("TUNER_PEERS", ROOT.parent / "shared" / "peers"))
PY = sys.executable
TARGET_ACC = 0.975
DEFAULT_SECTIONS = "fixed,throughput,overhead,ddp,parity,makespan,search,compute"
JOIN: list[str] = []  # ["--address", GCS] with --address: every sweep but the fixed cost's joins it


def run(cmd: list[str], timeout: float = 1800) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return wall, out


def trials(sweep: Path) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(directory, record, epochs) of every trial, by directory name, read through tuner.sweepdir."""
    return [
        (d, sweepdir.read_record(d) or {}, sweepdir.read_metrics(d))
        for d in sorted(sweepdir.trial_dirs(str(sweep)))
    ]


def records(sweep: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(record, epochs) of every trial, by directory name."""
    return [(rec, rows) for _, rec, rows in trials(sweep)]


def tuner_sweep(work: Path, name: str, *args: str) -> tuple[float, Path]:
    wall, _ = run([PY, "-m", "tuner", "sweep", *args, *JOIN, "--output", str(work), "--name", name])
    return wall, work / name


# ----------------------------------------------------------------------------- throughput


def throughput(cfg: argparse.Namespace, work: Path) -> dict[str, Any]:
    n, epochs = cfg.trials, cfg.max_epochs
    spaces = str(ROOT / "search_spaces" / "digits_mlp.yaml")

    def ours(algorithm: str) -> Callable[[int], dict[str, Any]]:
        def go(seed: int) -> dict[str, Any]:
            name = f"tp-{algorithm}-{seed}-{time.monotonic_ns()}"
            wall, sweep = tuner_sweep(
                work,
                name,
                spaces,
                "--algorithm",
                algorithm,
                "--num-samples",
                str(n),
                "--max-epochs",
                str(epochs),
                "--seed",
                str(seed),
            )
            summary = sweepdir.read_summary(str(sweep)) or {}
            spent = sum(len(rows) for _, rows in records(sweep))
            return {
                "wall": wall,
                "epochs": spent,
                "best": summary["best"]["metrics"]["val_acc"],
                "sweep": str(sweep),
            }

        return go

    def peer(script: str, *pre: str) -> Callable[[int], dict[str, Any]]:
        def go(seed: int) -> dict[str, Any]:
            wall, out = run([PY, str(PEERS / script), *pre, str(n), str(epochs), str(seed)])
            line = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
            return {"wall": wall, "epochs": line["epochs_spent"], "best": line["best_val_acc"]}

        return go

    contenders = {f"tuner {a}": ours(a) for a in cfg.algorithms}
    if have_peers():
        contenders.update(
            {
                "peer optuna in-process": peer("optuna_digits.py"),
                "peer raytune random (reuse)": peer("raytune_digits.py", "random"),
                "peer raytune bohb (reuse)": peer("raytune_digits.py", "bohb"),
            }
        )
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in contenders}
    names = list(contenders)
    for rep in range(cfg.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]  # alternate who goes first
        for name in order:
            results[name].append(contenders[name](rep))
            r = results[name][-1]
            print(
                f"  [throughput] {name} seed {rep}: {r['wall']:.1f}s, {r['epochs']} epochs, "
                f"best {r['best']:.4f}"
            )
    return results


def have_peers() -> bool:
    return all((PEERS / f).is_file() for f in ("optuna_digits.py", "raytune_digits.py"))


def throughput_table(results: dict[str, list[dict[str, Any]]]) -> str:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def rate(name: str) -> float:
        return statistics.median(r["epochs"] / r["wall"] for r in results[name])

    def ratio(name: str, peer: Optional[str]) -> str:
        return f"{rate(name) / rate(peer):.2f}x" if peer in results else ""

    peers = [n for n in results if n.startswith("peer")]
    rows = [
        "| contender | wall s | epochs | epochs/s | best val_acc | epochs/s vs Optuna "
        "| vs Ray Tune (same search) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in results:
        same = {"tuner random": "peer raytune random (reuse)", "tuner bohb": "peer raytune bohb (reuse)"}.get(
            name
        )
        rows.append(
            f"| {name} | {med(name, 'wall'):.1f} | {med(name, 'epochs'):.0f} | {rate(name):.1f} | "
            f"{med(name, 'best'):.4f} | {ratio(name, 'peer optuna in-process')} | {ratio(name, same)} |"
        )
    if peers:
        rows.append(f"\nBest peer val_acc (median): {max(med(n, 'best') for n in peers):.4f}.")
    else:
        rows.append(f"\nNo peers: {PEERS} does not hold them (set TUNER_PEERS), so no ratios.")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- fixed cost


def fixed(cfg: argparse.Namespace, work: Path) -> dict[str, Any]:
    return bench_fixed.fixed(cfg, work, PEERS, have_peers())


# ----------------------------------------------------------------------------- overhead


def overhead(cfg: argparse.Namespace, work: Path) -> dict[str, Any]:
    tiny = [
        "--set",
        "task.data_args={samples: 80, features: 4, classes: 2}",
        "--set",
        "search.params.width=4",
        "--set",
        "schedule.early_stopping=false",
    ]
    _, sweep = tuner_sweep(
        work,
        f"overhead-{time.monotonic_ns()}",
        str(ROOT / "search_spaces" / "debug.yaml"),
        "--num-samples",
        str(cfg.overhead_trials),
        "--max-epochs",
        "1",
        *tiny,
    )
    recs = records(sweep)
    first = [rows[0]["wall_time"] - rec["started"] for rec, rows in recs if rows]
    return {"first_report_s": first, "slot_idle_s": _slot_idle(recs, slots=2)}


def _slot_idle(recs: list, slots: int) -> list[float]:
    """Time a slot waits between one trial's recorded end and the next trial's start."""
    spans = sorted((rec["started"], rec.get("ended")) for rec, _ in recs if rec.get("ended"))
    free = [spans[0][0]] * slots
    idle = []
    for start, end in spans:
        i = min(range(slots), key=lambda k: free[k])
        if free[i] <= start:
            idle.append(start - free[i])
        free[i] = end
    return idle[slots:]  # the first trial on each slot waits for nothing before it


def ddp(cfg: argparse.Namespace, work: Path) -> dict[str, Any]:
    cold, warm = [], []
    for rep in range(cfg.repeats):
        _, sweep = tuner_sweep(
            work,
            f"ddp-{rep}-{time.monotonic_ns()}",
            str(ROOT / "search_spaces" / "debug.yaml"),
            "--num-samples",
            str(DDP_TRIALS),
            "--max-epochs",
            "1",
            "--set",
            "resources.workers_per_trial=2",
            "--set",
            "resources.max_concurrent_trials=1",  # one actor, whatever the cores: one cold start
        )
        for d, rec, rows in trials(sweep):
            first = rows[0]["wall_time"] - rec["started"]
            kept = KEPT_NOTE in Path(d, sweepdir.TRIAL_LOG).read_text()
            (warm if kept else cold).append(first)
            print(f"  [ddp] start to first report: {first:.2f} s{' (ranks kept)' * kept}")
    return {"first_report_s": cold, "kept_ranks_first_report_s": warm}


DDP_TRIALS = 3


# ----------------------------------------------------------------------------- parity


def parity(cfg: argparse.Namespace, work: Path) -> dict[str, Any]:
    from tuner.cluster.nodes import free_ports

    out: dict[str, list[float]] = {"ours": [], "hand": []}
    for rep in range(cfg.repeats):
        for which in ["ours", "hand"] if rep % 2 == 0 else ["hand", "ours"]:
            path = work / f"parity-{which}-{rep}.json"
            run(
                [
                    PY,
                    "-m",
                    "torch.distributed.run",
                    "--nproc_per_node",
                    "2",
                    "--master_port",
                    str(free_ports(1)[0]),
                    str(ROOT / "scripts" / "torchrun_loop.py"),
                    which,
                    str(path),
                    *cfg.parity_args,
                ]
            )
            rates = json.loads(path.read_text())["samples_per_s"]
            out[which].append(statistics.median(rates[1:] or rates))  # epoch 1 warms up
            print(f"  [parity] {which}: {out[which][-1]:.0f} samples/s")
    return out


# ----------------------------------------------------------------------------- makespan


def makespan(cfg: argparse.Namespace, work: Path) -> dict[str, Any]:
    widths = cfg.makespan_widths  # longest first: the packing a careful user would choose
    grid = "{type: grid, values: [" + ", ".join(map(str, widths)) + "]}"
    _, sweep = tuner_sweep(
        work,
        f"makespan-{time.monotonic_ns()}",
        str(ROOT / "search_spaces" / "debug.yaml"),
        "--algorithm",
        "grid",
        "--max-epochs",
        str(cfg.makespan_epochs),
        "--set",
        f"search.params.width={grid}",
        "--set",
        "search.params.lr=0.01",
        "--set",
        "search.params.optimizer=adam",
        "--set",
        "task.data_args={samples: 8192, features: 64, classes: 10}",
    )
    recs = records(sweep)
    span = max(r["ended"] for r, _ in recs) - min(r["started"] for r, _ in recs)
    compute = sum(row["epoch_time_s"] for _, rows in recs for row in rows)
    durations = sorted(sum(row["epoch_time_s"] for row in rows) for _, rows in recs)
    # The one-off start of the trial processes (Ray starts them, they import torch and build
    # their first trial): from the first trial's start to the first epoch's start anywhere.
    first_epoch = min(rows[0]["wall_time"] - rows[0]["epoch_time_s"] for _, rows in recs if rows)
    warmup = first_epoch - min(r["started"] for r, _ in recs)
    return {
        "span_s": span,
        "compute_s": compute,
        "ratio": span / (compute / 2),
        "warmup_s": warmup,
        "steady_ratio": (span - warmup) / (compute / 2),
        "trial_s": durations,
    }


# ----------------------------------------------------------------------------- search efficiency


def search(cfg: argparse.Namespace, work: Path, done: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    spaces = str(ROOT / "search_spaces" / "digits_mlp.yaml")
    out: dict[str, list[int]] = {}
    for algorithm in cfg.algorithms:
        sweeps = [Path(r["sweep"]) for r in done.get(f"tuner {algorithm}", [])]
        for seed in range(len(sweeps), cfg.search_seeds):
            _, sweep = tuner_sweep(
                work,
                f"search-{algorithm}-{seed}-{time.monotonic_ns()}",
                spaces,
                "--algorithm",
                algorithm,
                "--num-samples",
                str(cfg.trials),
                "--max-epochs",
                str(cfg.max_epochs),
                "--seed",
                str(seed),
            )
            sweeps.append(sweep)
        out[algorithm] = [_epochs_to_target(s) for s in sweeps[: cfg.search_seeds]]
        print(f"  [search] {algorithm}: epochs to {TARGET_ACC}: {out[algorithm]}")
    return out


def _epochs_to_target(sweep: Path) -> int:
    """Epochs the sweep had spent, in order of completion, when one first reached the target
    (all its epochs, +1, when none did: 'not reached within the budget')."""
    rows = sorted((row for _, rows in records(sweep) for row in rows), key=lambda r: r["wall_time"])
    for i, row in enumerate(rows, 1):
        if row.get("val_acc", 0) >= TARGET_ACC:
            return i
    return len(rows) + 1


# ----------------------------------------------------------------------------- report


def report(cfg: argparse.Namespace, res: dict[str, Any]) -> str:
    lines = [f"## Run of {datetime.date.today().isoformat()} on {machine()}", ""]
    algorithm = getattr(cfg, "algorithm", bench_fixed.ALGORITHM)
    lines += [
        f"Command: `python scripts/bench.py --repeats {cfg.repeats}{' --smoke' if cfg.smoke else ''}"
        f"{'' if cfg.only == DEFAULT_SECTIONS else ' --only ' + cfg.only}"
        f"{' --against ' + str(cfg.against) if getattr(cfg, 'against', None) else ''}"
        f"{' --joined' if getattr(cfg, 'joined', False) else ''}"
        f"{'' if algorithm == bench_fixed.ALGORITHM else ' --algorithm ' + algorithm}`"
        f" (all sections in one run, repeats alternating).",
        "",
    ]
    if getattr(cfg, "address", None):  # the address itself is the user's: not written
        lines += [
            "tuner's sweeps ran on a running Ray cluster (--address): Ray's start is not in their walls.",
            "",
        ]
    if "fixed" in res:
        lines += bench_fixed.report(res["fixed"], cfg)
    if "throughput" in res:
        lines += [
            "### Sweep throughput: digits_mlp, "
            f"{cfg.trials} trials, <= {cfg.max_epochs} epochs, seeds 0..{cfg.repeats - 1}",
            "",
            throughput_table(res["throughput"]),
            "",
        ]
    if "overhead" in res:
        o = res["overhead"]
        lines += [
            "### Per-trial overhead (in-actor, 1-epoch trials of a tiny task)",
            "",
            f"- start (Tune starts the trial) to first report: median {_ms(o['first_report_s'], 50)}, "
            f"p95 {_ms(o['first_report_s'], 95)} over {len(o['first_report_s'])} trials",
            f"- a slot idle between trials: median {_ms(o['slot_idle_s'], 50)}, "
            f"p95 {_ms(o['slot_idle_s'], 95)}",
            "",
        ]
    if "ddp" in res:
        f, w = res["ddp"]["first_report_s"], res["ddp"]["kept_ranks_first_report_s"]
        lines += [
            f"### DDP trial start-up (2 gloo workers; sweeps of {DDP_TRIALS} trials, one at a time)",
            "",
            f"- a sweep's first trial (new rank processes), start to first report: median "
            f"{statistics.median(f):.2f} s ({', '.join(f'{x:.2f}' for x in f)})",
            "- the later trials (on the ranks the trial before left), start to first report: "
            + (f"median {statistics.median(w):.2f} s ({', '.join(f'{x:.2f}' for x in w)})" if w else "none"),
            "",
        ]
    if "parity" in res:
        p = res["parity"]
        ratio = statistics.median(p["ours"]) / statistics.median(p["hand"])
        lines += [
            "### Loop parity under torchrun (2 gloo processes, synthetic, same MLP, batch, fp32)",
            "",
            f"- tuner's loop {statistics.median(p['ours']):.0f} samples/s, hand-written "
            f"{statistics.median(p['hand']):.0f} samples/s: **{ratio:.2f}x**",
            "",
        ]
    if "makespan" in res:
        m = res["makespan"]
        lines += [
            "### Makespan (trials of "
            + ", ".join(f"{t:.1f}" for t in m["trial_s"])
            + " s of compute, 2 slots, TensorBoard on)",
            "",
            f"- trials' span {m['span_s']:.1f} s / (compute {m['compute_s']:.1f} s / 2) "
            f"= **{m['ratio']:.2f}x**",
            f"- of the span, {m['warmup_s']:.1f} s before the first epoch (the trial processes start "
            f"and import torch, once per sweep); without it {m['steady_ratio']:.2f}x",
            "",
        ]
    if "search" in res:
        s = res["search"]
        lines += [
            f"### Search efficiency: epochs until val_acc >= {TARGET_ACC} "
            f"(digits_mlp, {cfg.trials} trials, median of seeds)",
            "",
        ]
        for algorithm, counts in s.items():
            lines.append(f"- {algorithm}: median {statistics.median(counts):.0f} epochs ({counts})")
        if "random" in s and "bohb" in s:
            lines.append(
                f"- bohb / random: **{statistics.median(s['bohb']) / statistics.median(s['random']):.2f}x**"
            )
        lines.append("")
    if "compute" in res:
        from bench_compute import compute_report

        lines += compute_report(cfg, res["compute"])
    return "\n".join(lines)


def _ms(values: list[float], pct: int) -> str:
    ordered = sorted(values)
    v = (
        ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]
        if pct != 50
        else statistics.median(values)
    )
    return f"{v * 1000:.0f} ms"


def machine() -> str:
    import torch

    cores = os.cpu_count()
    py, tv = platform.python_version(), torch.__version__
    return f"{platform.node()} ({cores} CPU cores, Python {py}, torch {tv}, no GPU)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=DEFAULT_SECTIONS)
    p.add_argument("--write", metavar="FILE", help="append the tables to this Markdown file")
    p.add_argument("--smoke", action="store_true", help="toy sizes: checks every section runs")
    p.add_argument("--keep", action="store_true", help="keep the sweep directories")
    p.add_argument(
        "--against",
        metavar="DIR",
        type=Path,
        help="fixed section: also run the tuner of this other checkout (e.g. main), alternating",
    )
    p.add_argument(
        "--algorithm",
        default=bench_fixed.ALGORITHM,
        help="fixed section: the search of its sweep (default random, the issue's command)",
    )
    p.add_argument(
        "--joined",
        action="store_true",
        help="fixed section: also run its command joined to a `tuner cluster start` cluster it starts",
    )
    p.add_argument(
        "--address",
        metavar="GCS",
        help="run the sweeps on this running Ray cluster, not a Ray of their own (fixed cost excepted)",
    )
    cfg = p.parse_args()
    JOIN[:] = ["--address", cfg.address] if cfg.address else []
    if cfg.against is not None:
        cfg.against = cfg.against.resolve()
        if not (cfg.against / "tuner" / "__main__.py").exists():
            p.error(f"--against {cfg.against}: no checkout of tuner there")
    sizes = dict(
        trials=30,
        max_epochs=27,
        overhead_trials=100,
        search_seeds=5,
        makespan_epochs=10,
        makespan_widths=[8192, 6144, 4096, 3072, 2048, 1024, 512, 128],
        parity_args=[],
        fixed_seed=1,
        algorithms=["bohb", "random", "optuna"],
    )
    if cfg.smoke:
        sizes = dict(
            trials=3,
            max_epochs=2,
            overhead_trials=4,
            search_seeds=1,
            makespan_epochs=1,
            makespan_widths=[32, 16],
            parity_args=["--samples", "512", "--epochs", "2", "--width", "16"],
            fixed_seed=1,
            algorithms=["bohb", "random"],  # tuner's side of every table (optuna's is the same code)
        )
        cfg.repeats = 1
    vars(cfg).update(sizes)
    if not cfg.smoke and {"throughput", "fixed"} & set(cfg.only.split(",")) and not have_peers():
        p.error(f"the peers are not in {PEERS}: set TUNER_PEERS to their directory")
    work = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    sections = cfg.only.split(",")
    res: dict[str, Any] = {}
    try:
        for name in sections:
            print(f"[bench] {name}", flush=True)
            if name == "search":
                res[name] = search(cfg, work, res.get("throughput", {}))
            elif name == "compute":  # its own module; imports this one, so imported here
                from bench_compute import compute

                res[name] = compute(cfg, work)
            else:
                res[name] = globals()[name](cfg, work)
    finally:
        if not cfg.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = report(cfg, res)
    print("\n" + text)
    if cfg.write:
        with open(cfg.write, "a") as f:
            f.write("\n" + text + "\n")
        print(f"[bench] appended to {cfg.write}")


if __name__ == "__main__":
    main()
