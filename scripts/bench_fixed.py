"""Section `fixed` of scripts/bench.py: a whole `tuner sweep` process against the Optuna peer.

Issue 16's command, timed from outside, alternating with `optuna_digits.py N EPOCHS SEED`
(same seed every repeat): whole-process wall and best val_acc of each, and where our fixed
cost goes, from the process's own output (line times) and its trial records (epoch times):

  start -> header          imports, config, the embedded Ray up, the search planned
  start -> first epoch     ... and the trial processes started, torch imported, one epoch
  last epoch -> results    the last trial's end seen, summary.json and best/ written, table
  last epoch -> exit       ... and the embedded Ray gone

and, from the stages its processes mark (scripts/timeline.py), issue 50's figure of merit: the
wall over the trials' own times on the slots they had; its stage-by-stage timeline, and the
wall against the peer's pair by pair (each run of ours beside the peer's run next to it).

With --joined (bench.py), the same command also runs joined to a `tuner cluster start` cluster
of this machine's CPUs that the section starts for it and stops after (`--address`), as a party
of its own in the alternation: what a sweep costs where a cluster is kept running (no Ray start;
trial actors copied from each node's warm process). Its nodes write the trials' marks.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import timeline

from tuner import sweepdir

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["search_spaces/digits_mlp.yaml"]
ALGORITHM = "random"  # the issue's; --algorithm NAME runs the same sweep with another
TARGETS = {"first_epoch": 3.0, "to_results": 0.3, "to_summary": 0.3, "to_exit": 1.0}
WALL_TARGET = 0.7  # x the peer's whole-process wall (issue 50; issue 16 asked 0.8)
MERIT_TARGET = 1.5  # the sweep's wall over its trials' own times on its slots (issue 50)


def timed(
    cmd: list[str], timeout: float = 1800, env: Optional[dict[str, str]] = None, cwd: Path = ROOT
) -> tuple[float, list[tuple[float, str]], int, dict[int, dict[str, Any]]]:
    """Run `cmd` from `cwd`; (its epoch start time, [(seconds since start, output line)], the
    last entry ("", exit) when it ended; its pid; the CPU samples of it and its processes)."""
    start = time.time()
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    sampler = timeline.Sampler(proc.pid)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.time() - start, line.rstrip("\n")))
    code = proc.wait(timeout=timeout)
    lines.append((time.time() - start, f"<exit {code}>"))
    procs = sampler.stop()
    if code != 0:
        tail = "\n".join(text for _, text in lines[-40:])
        raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{tail}")
    return start, lines, proc.pid, procs


@contextlib.contextmanager
def warm_cluster(work: Path) -> Iterator[tuple[str, Path]]:
    """A `tuner cluster start` cluster of this machine's CPUs, its state under `work`, its
    nodes' trials marking their stages in a file of its own: (its GCS address, that file)."""
    marks = work / "joined.timeline.jsonl"
    env = {**os.environ, "TUNER_CLUSTER_DIR": str(work / "joined-cluster"), timeline.ENV: str(marks)}
    cluster = [sys.executable, "-m", "tuner", "cluster"]
    started = subprocess.run(
        [*cluster, "start", "--num-cpus", str(os.cpu_count() or 1)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    try:
        if started.returncode != 0:
            raise RuntimeError(f"tuner cluster start failed:\n{started.stdout}{started.stderr}")
        yield json.loads((work / "joined-cluster" / "cluster.json").read_text())["gcs"], marks
    finally:
        subprocess.run([*cluster, "stop"], cwd=ROOT, env=env, capture_output=True)


def ours(
    work: Path,
    trials: int,
    epochs: int,
    seed: int,
    tree: Path = ROOT,
    joined: Optional[tuple[str, Path]] = None,
    algorithm: str = ALGORITHM,
) -> dict[str, Any]:
    """One sweep of the tuner in `tree` (another checkout: --against), timed; `joined`: on
    that cluster (warm_cluster), not a Ray of its own."""
    name = f"fixed-{seed}-{time.monotonic_ns()}"
    args = [
        *COMMAND,
        "--algorithm",
        algorithm,
        "--num-samples",
        str(trials),
        "--max-epochs",
        str(epochs),
        "--seed",
        str(seed),
    ]
    marks = work / f"{name}.timeline.jsonl"
    if joined:  # (the file its nodes' trials write to: this run's alone)
        args += ["--address", joined[0]]
        marks = joined[1]
        marks.write_text("")
    env = {**os.environ, timeline.ENV: str(marks)}
    if tree != ROOT:  # (run from there, it imports its own tuner first; so do Ray's workers)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    start, lines, pid, procs = timed(
        [sys.executable, "-m", "tuner", "sweep", *args, "--output", str(work), "--name", name],
        env=env,
        cwd=tree,
    )
    sweep = work / name
    stages = timeline.analyse(timeline.collected(start, lines[-1][0], pid, marks, procs, sweep))

    def line_at(prefix: str) -> float:
        return next(t for t, text in lines if text.startswith(prefix))

    from bench import records  # (bench imports this module first)

    recs = records(sweep)
    epochs_at = [row["wall_time"] - start for _, rows in recs for row in rows]
    last = max(epochs_at)
    summary = sweepdir.read_summary(str(sweep)) or {}
    return {
        "wall": lines[-1][0],
        "best": summary["best"]["metrics"]["val_acc"],
        "epochs": len(epochs_at),
        "header": line_at(f"[tuner] {name}:"),
        "first_start": min(rec["started"] for rec, _ in recs) - start,
        "first_epoch": min(epochs_at),
        "to_results": line_at("results:") - last,
        "to_summary": os.path.getmtime(sweep / "summary.json") - start - last,
        "to_exit": lines[-1][0] - last,
        "merit": stages["merit"],
        "timeline": stages,
    }


def peer(peers: Path, trials: int, epochs: int, seed: int) -> dict[str, Any]:
    _, lines, _, _ = timed(
        [sys.executable, str(peers / "optuna_digits.py"), str(trials), str(epochs), str(seed)]
    )
    out = json.loads([text for _, text in lines if text.startswith("{")][-1])
    return {"wall": lines[-1][0], "best": out["best_val_acc"], "epochs": out["epochs_spent"]}


def fixed(cfg: Any, work: Path, peers: Path, have_peers: bool) -> dict[str, Any]:
    """cfg.repeats alternating runs of ours, (with cfg.against) the tuner of another checkout,
    and (when present) the peer, seed cfg.fixed_seed; who goes first turns each repeat."""
    against: Optional[Path] = getattr(cfg, "against", None)
    res: dict[str, list[dict[str, Any]]] = {"ours": [], "before": [], "joined": [], "peer": []}
    turn = [
        "ours",
        *(["before"] if against else []),
        *(["joined"] if getattr(cfg, "joined", False) else []),
        "peer",
    ]
    alg = getattr(cfg, "algorithm", ALGORITHM)
    with warm_cluster(work) if "joined" in turn else contextlib.nullcontext() as joined:
        for rep in range(cfg.repeats):
            k = rep % len(turn)
            for who in turn[k:] + turn[:k]:
                if who == "ours":
                    r = ours(work, cfg.trials, cfg.max_epochs, cfg.fixed_seed, algorithm=alg)
                elif who == "before" and against:
                    r = ours(work, cfg.trials, cfg.max_epochs, cfg.fixed_seed, against, algorithm=alg)
                elif who == "joined":
                    r = ours(work, cfg.trials, cfg.max_epochs, cfg.fixed_seed, joined=joined, algorithm=alg)
                elif have_peers:
                    r = peer(peers, cfg.trials, cfg.max_epochs, cfg.fixed_seed)
                else:
                    continue
                res[who].append(r)
                figures = ", ".join(f"{k} {v:.2f}" for k, v in r.items() if isinstance(v, (int, float)))
                print(f"  [fixed] {who} run {rep}: {figures}", flush=True)
    return res


def report(res: dict[str, list[dict[str, Any]]], cfg: Any) -> list[str]:
    def med(who: str, key: str) -> float:
        return statistics.median(r[key] for r in res[who])

    def runs(key: str) -> str:
        return ", ".join(f"{r[key]:.2f}" for r in res["ours"])

    algorithm = getattr(cfg, "algorithm", ALGORITHM)
    tuner = f"tuner {algorithm}"

    command = " ".join(
        [
            "python -m tuner sweep",
            *COMMAND,
            "--algorithm",
            algorithm,
            "--num-samples",
            str(cfg.trials),
            "--max-epochs",
            str(cfg.max_epochs),
        ]
        + ["--seed", str(cfg.fixed_seed)]
    )
    lines = [f"### Fixed cost and whole-process wall: `{command}`", ""]
    before, joined = res.get("before") or [], res.get("joined") or []
    if joined:
        lines += [
            '"joined": the same command with `--address` of a `tuner cluster start` cluster of '
            "this machine's CPUs, kept running through the runs (no Ray start in its wall; trial "
            "actors copied from its nodes' warm processes), alternating with the others.",
            "",
        ]
    if before:
        lines += [
            f"With `--against {cfg.against}`: that checkout's tuner ran as a third party of each repeat "
            "(\"before\"), alternating with this tree's and the peer's.",
            "",
        ]
    if res["peer"]:
        # Each run of ours against the peer's run beside it (they alternate): the median of
        # those ratios holds better on a machine whose load changes than a ratio of medians.
        pairs = [o["wall"] / p["wall"] for o, p in zip(res["ours"], res["peer"], strict=False)]
        ratio = statistics.median(pairs)
        gap = (med("ours", "best") - med("peer", "best")) * 100
        lines += [
            "| | wall s (median) | runs | best val_acc | epochs |",
            "| --- | --- | --- | --- | --- |",
            f"| {tuner} | {med('ours', 'wall'):.1f} | {runs('wall')} | {med('ours', 'best'):.4f} "
            f"| {med('ours', 'epochs'):.0f} |",
            *(
                [
                    f"| {tuner}, before | {med('before', 'wall'):.1f} | "
                    + ", ".join(f"{r['wall']:.2f}" for r in before)
                    + f" | {med('before', 'best'):.4f} | {med('before', 'epochs'):.0f} |"
                ]
                if before
                else []
            ),
            *(
                [
                    f"| {tuner}, joined to a running cluster | {med('joined', 'wall'):.1f} | "
                    + ", ".join(f"{r['wall']:.2f}" for r in joined)
                    + f" | {med('joined', 'best'):.4f} | {med('joined', 'epochs'):.0f} |"
                ]
                if joined
                else []
            ),
            f"| peer optuna in-process | {med('peer', 'wall'):.1f} | "
            + ", ".join(f"{r['wall']:.2f}" for r in res["peer"])
            + f" | {med('peer', 'best'):.4f} | {med('peer', 'epochs'):.0f} |",
            "",
            f"- wall, ours / peer: **{ratio:.2f}x**, the median of each pair's ("
            + ", ".join(f"{x:.2f}" for x in pairs)
            + f"; target <= {WALL_TARGET}x: {'met' if ratio <= WALL_TARGET else 'not met'}); best "
            f"val_acc {gap:+.2f} pt (target within 0.5 pt: {'met' if gap >= -0.5 else 'not met'})",
        ]
        for runs_of, label in ((before, "before"), (joined, "joined")):
            if runs_of:
                pairs = [b["wall"] / p["wall"] for b, p in zip(runs_of, res["peer"], strict=False)]
                lines.append(
                    f"- {label}, wall / peer: **{statistics.median(pairs):.2f}x** ("
                    + ", ".join(f"{x:.2f}" for x in pairs)
                    + ")"
                )
    else:
        lines.append("- no peer here: wall ratio not measured")
    for who, label in (("ours", ""), ("before", "before, "), ("joined", "joined, ")):
        merits = [r["merit"] for r in res.get(who, []) if r.get("merit")]
        if merits:
            merit = statistics.median(merits)
            lines.append(
                f"- {label}figure of merit (issue 50), wall / (the trials' own times / concurrent trials): "
                f"**{merit:.2f}x** (" + ", ".join(f"{m:.2f}" for m in merits) + f"; target <= "
                f"{MERIT_TARGET}x: {'met' if merit <= MERIT_TARGET else 'not met'})"
            )
    if before:
        pairs = [o["wall"] / b["wall"] for o, b in zip(res["ours"], before, strict=False)]
        lines.append(
            f"- this tree / before, pair by pair: wall **{statistics.median(pairs):.2f}x** ("
            + ", ".join(f"{x:.2f}" for x in pairs)
            + ")"
        )
    lines += ["", "| from -> to (ours) | median s | runs | target |", "| --- | --- | --- | --- |"]
    names = {
        "header": "start -> sweep header printed",
        "first_start": "start -> first trial started",
        "first_epoch": "start -> first trial's first epoch",
        "to_results": "last epoch -> results printed",
        "to_summary": "last epoch -> summary.json written",
        "to_exit": "last epoch -> process exit",
    }
    for key, label in names.items():
        target = TARGETS.get(key)
        verdict = (
            "" if target is None else f"<= {target} s: {'met' if med('ours', key) <= target else 'not met'}"
        )
        lines.append(f"| {label} | {med('ours', key):.2f} | {runs(key)} | {verdict} |")
    lines.append("")
    for who, label in (
        ("ours", tuner),
        ("before", f"{tuner}, before"),
        ("joined", f"{tuner}, joined to a running cluster"),
    ):
        stages = [r["timeline"] for r in res.get(who, []) if r.get("timeline")]
        if stages:
            lines += [f"Where the seconds of {label} went (scripts/timeline.py):", ""]
            lines += timeline.report(label, stages)[2:]
    return lines
