"""Section `fixed` of scripts/bench.py: a whole `tuner sweep` process against the Optuna peer.

Issue 16's command, timed from outside, alternating with `optuna_digits.py N EPOCHS SEED`
(same seed every repeat): whole-process wall and best val_acc of each, and where our fixed
cost goes, from the process's own output (line times) and its trial records (epoch times):

  start -> header          imports, config, the embedded Ray up, the search planned
  start -> first epoch     ... and the trial processes started, torch imported, one epoch
  last epoch -> results    the last trial's end seen, summary.json and best/ written, table
  last epoch -> exit       ... and the embedded Ray gone
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tuner import sweepdir

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["search_spaces/digits_mlp.yaml", "--algorithm", "random"]
TARGETS = {"first_epoch": 3.0, "to_results": 0.3, "to_summary": 0.3, "to_exit": 1.0}
WALL_TARGET = 0.8  # x the peer's whole-process wall


def timed(cmd: list[str], timeout: float = 1800) -> tuple[float, list[tuple[float, str]]]:
    """Run `cmd` from ROOT; (its epoch start time, [(seconds since start, output line)]),
    the last entry ("", exit) when it ended."""
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.time() - start, line.rstrip("\n")))
    code = proc.wait(timeout=timeout)
    lines.append((time.time() - start, f"<exit {code}>"))
    if code != 0:
        tail = "\n".join(text for _, text in lines[-40:])
        raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{tail}")
    return start, lines


def ours(work: Path, trials: int, epochs: int, seed: int) -> dict[str, Any]:
    name = f"fixed-{seed}-{time.monotonic_ns()}"
    args = [*COMMAND, "--num-samples", str(trials), "--max-epochs", str(epochs), "--seed", str(seed)]
    start, lines = timed(
        [sys.executable, "-m", "tuner", "sweep", *args, "--output", str(work), "--name", name]
    )
    sweep = work / name

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
    }


def peer(peers: Path, trials: int, epochs: int, seed: int) -> dict[str, Any]:
    _, lines = timed([sys.executable, str(peers / "optuna_digits.py"), str(trials), str(epochs), str(seed)])
    out = json.loads([text for _, text in lines if text.startswith("{")][-1])
    return {"wall": lines[-1][0], "best": out["best_val_acc"], "epochs": out["epochs_spent"]}


def fixed(cfg: Any, work: Path, peers: Path, have_peers: bool) -> dict[str, Any]:
    """cfg.repeats alternating runs of ours and (when present) the peer, seed cfg.fixed_seed."""
    res: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}
    for rep in range(cfg.repeats):
        order = ["ours", "peer"] if rep % 2 == 0 else ["peer", "ours"]
        for who in order:
            if who == "ours":
                r = ours(work, cfg.trials, cfg.max_epochs, cfg.fixed_seed)
            elif have_peers:
                r = peer(peers, cfg.trials, cfg.max_epochs, cfg.fixed_seed)
            else:
                continue
            res[who].append(r)
            print(
                f"  [fixed] {who} run {rep}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True
            )
    return res


def report(res: dict[str, list[dict[str, Any]]], cfg: Any) -> list[str]:
    def med(who: str, key: str) -> float:
        return statistics.median(r[key] for r in res[who])

    def runs(key: str) -> str:
        return ", ".join(f"{r[key]:.2f}" for r in res["ours"])

    command = " ".join(
        [
            "python -m tuner sweep",
            *COMMAND,
            "--num-samples",
            str(cfg.trials),
            "--max-epochs",
            str(cfg.max_epochs),
        ]
        + ["--seed", str(cfg.fixed_seed)]
    )
    lines = [f"### Fixed cost and whole-process wall: `{command}`", ""]
    if res["peer"]:
        ratio = med("ours", "wall") / med("peer", "wall")
        gap = (med("ours", "best") - med("peer", "best")) * 100
        lines += [
            "| | wall s (median) | runs | best val_acc | epochs |",
            "| --- | --- | --- | --- | --- |",
            f"| tuner random | {med('ours', 'wall'):.1f} | {runs('wall')} | {med('ours', 'best'):.4f} "
            f"| {med('ours', 'epochs'):.0f} |",
            f"| peer optuna in-process | {med('peer', 'wall'):.1f} | "
            + ", ".join(f"{r['wall']:.2f}" for r in res["peer"])
            + f" | {med('peer', 'best'):.4f} | {med('peer', 'epochs'):.0f} |",
            "",
            f"- wall, ours / peer: **{ratio:.2f}x** (target <= {WALL_TARGET}x: "
            f"{'met' if ratio <= WALL_TARGET else 'not met'}); best val_acc {gap:+.2f} pt "
            f"(target within 0.5 pt: {'met' if gap >= -0.5 else 'not met'})",
        ]
    else:
        lines.append("- no peer here: wall ratio not measured")
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
    return lines
