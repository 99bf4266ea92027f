"""Where a sweep's seconds go: one `tuner sweep` on a private local Ray, stage by stage.

usage: python scripts/timeline.py [--sweep digits|debug|FILE] [--runs N] [--against DIR] [--json OUT]
                                  [-- TUNER ARGS]

Runs the sweep with TUNER_TIMELINE set (tuner/timeline.py: the driver and each trial process
mark the stages they pass, with their CPU seconds so far) while a sampler here reads the CPU
seconds of every process under it (the driver, Ray's own, the trial workers) five times a
second. Then prints, for each stage of the sweep, when it ended (seconds since the command
started) and the CPU seconds each kind of process spent in it; for each trial actor its start,
its imports and each hand-over from one trial to the next; and the figure of merit of issue 50:
the sweep's wall over its training's own wall on the slots it had (sum of the trials' epoch
times / concurrent trials). Absolute seconds vary with the machine and its load; the CPU
seconds per process and the ratios are what compare (measure alternatives side by side,
alternating: `--against DIR` runs each sweep of this tree and then the same sweep of another
checkout of tuner, e.g. `git worktree add /tmp/before main`, in turn, with this venv).
`scripts/bench.py --only timeline` runs it for the issue's digits sweep and debug.yaml.

  digits   search_spaces/digits_mlp.yaml --algorithm random --num-samples 30 --max-epochs 27 --seed 1
  debug    search_spaces/debug.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import psutil

from tuner import sweepdir
from tuner.timeline import ENV

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = {
    "digits": [
        "search_spaces/digits_mlp.yaml",
        *("--algorithm", "random", "--num-samples", "30", "--max-epochs", "27", "--seed", "1"),
    ],
    "debug": ["search_spaces/debug.yaml"],
}
SAMPLE_S = 0.2  # how often the sampler lists the processes (each listing reads all of /proc)

# What a process is, from its command line (Ray 2.60's process names and titles).
KINDS = (
    ("gcs_server", "ray"),
    ("raylet", "ray"),
    ("dashboard/agent.py", "ray"),
    ("runtime_env/agent/main.py", "ray"),
    ("dashboard/dashboard.py", "ray"),
    ("monitor.py", "ray"),
    ("log_monitor.py", "ray"),
    ("default_worker.py", "worker"),
    ("ray::DashboardAgent", "ray"),
    ("ray::RuntimeEnvAgent", "ray"),
    ("ray::", "worker"),
)


class Sampler:
    """The CPU seconds of `root` and every process under it, sampled until stopped."""

    def __init__(self, root: int):
        self.root = root
        self.procs: dict[int, dict[str, Any]] = {}
        self._handles: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_S)

    def sample(self) -> None:
        try:
            top = psutil.Process(self.root)
            now = [top, *top.children(recursive=True)]
        except psutil.Error:
            now = []
        for p in now:
            self._handles.setdefault(p.pid, p)
        t = time.time()
        for pid, p in self._handles.items():
            try:
                with p.oneshot():
                    cpu = p.cpu_times()
                    cmd = " ".join(p.cmdline()) or p.name()
                    info = self.procs.setdefault(
                        pid,
                        {"pid": pid, "ppid": p.ppid(), "born": p.create_time(), "cmd": cmd, "samples": []},
                    )
            except psutil.Error:
                continue
            if cmd.startswith("ray::") and "IDLE" not in cmd:
                info["cmd"] = cmd  # a worker's title once it hosts an actor
            info["samples"].append((t, cpu.user + cpu.system))

    def stop(self) -> dict[int, dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        return self.procs


def run(argv: list[str], work: Path, name: str, tree: Path = ROOT) -> dict[str, Any]:
    """One sweep of the tuner in `tree`, timed: its marks, its processes' CPU samples, its
    trials' records."""
    marks_file = work / f"{name}.timeline.jsonl"
    env = {**os.environ, ENV: str(marks_file)}
    if tree != ROOT:  # (run from there, it imports its own tuner first; so do Ray's workers)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "tuner", "sweep", *argv, "--output", str(work), "--name", name]
    start = time.time()
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(proc.pid)
    out, _ = proc.communicate()
    wall = time.time() - start
    procs = sampler.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    return collected(start, wall, proc.pid, marks_file, procs, work / name)


def collected(
    start: float, wall: float, root: int, marks_file: Path, procs: dict[int, dict[str, Any]], sweep: Path
) -> dict[str, Any]:
    """What `analyse` reads of one finished run: its marks, its processes' samples (Sampler),
    its trials' reports and epoch times."""
    marks = [json.loads(line) for line in marks_file.read_text().splitlines() if line.strip()]
    trials = []
    for d in sorted(sweepdir.trial_dirs(str(sweep))):
        rows = sweepdir.read_metrics(d)
        trials.append(
            {
                "trial": os.path.basename(d),
                "reports": [r["wall_time"] for r in rows],
                "time_s": sum(float(r.get("epoch_time_s") or 0) for r in rows),
                "first_epoch_s": float(rows[0].get("epoch_time_s") or 0) if rows else 0.0,
            }
        )
    return {
        "start": start,
        "wall": wall,
        "root": root,
        "marks": marks,
        "procs": list(procs.values()),
        "trials": trials,
    }


def kind(info: dict[str, Any], root: int, actors: set[int]) -> str:
    if info["pid"] in actors:
        return "trial actors"
    if info["pid"] == root:
        return "driver"
    if info["ppid"] == root and "tuner" in info["cmd"]:
        return "driver"  # (the sweep's driver, forked by the command: driver/stopping.py)
    if "tuner.cluster.worker_fork" in info["cmd"]:
        return "warm process"  # (the trial actors' imports, done once: tuner/cluster/worker_fork.py)
    for needle, what in KINDS:
        if needle in info["cmd"]:
            return "Ray's processes" if what == "ray" else "other workers"
    return "other"


def cpu_at(info: dict[str, Any], t: float) -> float:
    """The process's CPU seconds at time t, from its samples (linear between two)."""
    samples = info["samples"]
    if not samples or t <= info["born"]:
        return 0.0
    before = [(st, c) for st, c in samples if st <= t]
    after = [(st, c) for st, c in samples if st > t]
    t0, c0 = before[-1] if before else (info["born"], 0.0)
    if not after:
        return c0
    t1, c1 = after[0]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def analyse(res: dict[str, Any]) -> dict[str, Any]:
    """Stages (end time, CPU seconds by kind of process), trial actors, figure of merit."""
    start, marks = res["start"], res["marks"]
    root = res["root"]
    by_what: dict[str, list[dict[str, Any]]] = {}
    for m in marks:
        by_what.setdefault(m["what"], []).append(m)
    actors = {m["pid"] for m in by_what.get("trial", [])}
    kinds = {p["pid"]: kind(p, root, actors) for p in res["procs"]}

    def first(what: str) -> Optional[float]:
        return min((m["t"] for m in by_what.get(what, [])), default=None)

    def last(what: str) -> Optional[float]:
        return max((m["t"] for m in by_what.get(what, [])), default=None)

    reports = [r for t in res["trials"] for r in t["reports"]]
    points = [
        ("python, tuner's imports", first("cli")),
        ("the sweep file read, checked, planned", first("ray_init")),
        ("ray.init: Ray's processes up", first("ray_up")),
        ("Ray Tune imported (a thread, beside ray.init), Tuner built", first("fit")),
        ("first trial actor started, imports Ray Tune and tuner", first("trial")),
        ("its imports (torch), data, model, first epoch", first("first_report")),
        ("the training, trials handed over", max(reports) if reports else None),
        ("Tune's end", first("fit_done")),
        ("summary.json, best/", first("finished")),
        ("table, progress line", first("leave")),
        ("Ray killed, exit", start + res["wall"]),
    ]
    stages, before = [], start
    for label, t in points:
        if t is None:
            continue
        cpu: dict[str, float] = {}
        for p in res["procs"]:
            spent = cpu_at(p, t) - cpu_at(p, before)
            cpu[kinds[p["pid"]]] = cpu.get(kinds[p["pid"]], 0.0) + spent
        stages.append({"stage": label, "end_s": t - start, "wall_s": t - before, "cpu": cpu})
        before = t
    per_kind: dict[str, float] = {}
    for p in res["procs"]:
        per_kind[kinds[p["pid"]]] = per_kind.get(kinds[p["pid"]], 0.0) + (
            p["samples"][-1][1] if p["samples"] else 0
        )
    slots = max(1, _most_at_once(by_what))
    compute = sum(t["time_s"] for t in res["trials"])
    # Each trial's own time in its actor, from its start there to its end (set-up, epochs,
    # reports, wind-down): what the figure of merit divides by. A trial whose actor
    # Tune ended right after its last report (Tune's cleanup does not wait for the trial's
    # thread; the sweep's end kills Ray) may have no end mark: its last report is its end.
    ends = {(m["pid"], m.get("trial")): m["t"] for m in by_what.get("trial_end", [])}
    last_report = {t["trial"]: max(t["reports"]) for t in res["trials"] if t["reports"]}
    spans = sum(
        ends.get((m["pid"], m.get("trial")), last_report.get(m.get("trial"), m["t"])) - m["t"]
        for m in by_what.get("trial", [])
    )
    return {
        "wall_s": res["wall"],
        "stages": stages,
        "cpu_by_kind": per_kind,
        "cpu_by_process": sorted(
            (
                (kinds[p["pid"]], _short(p["cmd"]), p["samples"][-1][1] if p["samples"] else 0.0)
                for p in res["procs"]
            ),
            key=lambda x: -x[2],
        ),
        "actors": _actors(res, by_what),
        "trials": len(res["trials"]),
        "trial_time_s": compute,
        "trial_span_s": spans,
        "slots": slots,
        "merit": res["wall"] / (spans / slots) if spans else None,
        "merit_epochs": res["wall"] / (compute / slots) if compute else None,
    }


def _most_at_once(by_what: dict[str, list[dict[str, Any]]]) -> int:
    events = [(m["t"], 1) for m in by_what.get("trial", [])] + [
        (m["t"], -1) for m in by_what.get("trial_end", [])
    ]
    most = now = 0
    for _, step in sorted(events):
        now += step
        most = max(most, now)
    return most


def _actors(res: dict[str, Any], by_what: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each trial actor: born, its boot (Ray's worker, Ray Tune, tuner) and imports, and each
    hand-over from one of its trials to the next, in three parts: the trial's last report to
    its end in the actor (wind-down), that end to the next trial's start there (Tune: the
    driver hears of the end, picks the next trial, resets the actor), and that start to the
    next trial's first epoch (its data and model built)."""
    reports = {t["trial"]: t for t in res["trials"]}
    out = []
    for pid in sorted({m["pid"] for m in by_what.get("trial", [])}):
        mine = sorted((m for m in res["marks"] if m["pid"] == pid), key=lambda m: m["t"])
        born = next((m["born"] for m in mine if "born" in m), None)
        entered = [m for m in mine if m["what"] == "trial"]
        loaded = [m for m in mine if m["what"] == "loaded"]
        firsts = {m.get("trial"): m for m in mine if m["what"] == "first_report"}
        ends = [m for m in mine if m["what"] == "trial_end"]
        handovers = []
        for end, nxt in zip(ends, entered[1:], strict=False):
            done, then = reports.get(end.get("trial")), reports.get(nxt.get("trial"))
            if not done or not done["reports"] or not then or not then["reports"]:
                continue
            first_epoch_began = then["reports"][0] - then["first_epoch_s"]
            handovers.append(
                {
                    "wind_down_s": end["t"] - max(done["reports"]),
                    "tune_s": nxt["t"] - end["t"],
                    "setup_s": first_epoch_began - nxt["t"],
                    "total_s": first_epoch_began - max(done["reports"]),
                    "actor_cpu": nxt["cpu"] - end["cpu"],
                }
            )
        first = firsts.get(entered[0].get("trial"))
        out.append(
            {
                "pid": pid,
                "born_s": (born or 0) - res["start"],
                "boot_cpu": entered[0]["cpu"],
                "boot_s": entered[0]["t"] - (born or entered[0]["t"]),
                "imports_cpu": loaded[0]["cpu"] - entered[0]["cpu"] if loaded else None,
                "first_report_cpu": first["cpu"] - entered[0]["cpu"] if first else None,
                "first_report_s": first["t"] - entered[0]["t"] if first else None,
                "trials": len(entered),
                "handovers": handovers,
                "cpu": mine[-1]["cpu"],
            }
        )
    return out


def _short(cmd: str) -> str:
    words = cmd.split()
    for w in words:
        if (
            w.endswith(".py")
            or w.startswith("ray::")
            or "/" in w
            and w.rsplit("/", 1)[1] in ("raylet", "gcs_server")
        ):
            return w.rsplit("/", 1)[-1]
    return " ".join(words[:3])[:40]


def report(name: str, runs: list[dict[str, Any]]) -> list[str]:
    """Markdown: the stages (medians over runs), processes by kind, actors, figure of merit."""
    kinds = ["driver", "Ray's processes", "warm process", "trial actors", "other workers"]
    med = statistics.median
    n = len(runs)
    lines = [
        f"#### {name}: {n} run(s); wall {_list(r['wall_s'] for r in runs)} s",
        "",
        "| stage (ends when) | ends at s | wall s | " + " | ".join(f"CPU-s {k}" for k in kinds) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in kinds) + " |",
    ]
    for i, stage in enumerate(runs[0]["stages"]):
        same = [
            r["stages"][i] for r in runs if len(r["stages"]) > i and r["stages"][i]["stage"] == stage["stage"]
        ]
        cells = [f"{med(s['cpu'].get(k, 0.0) for s in same):.2f}" for k in kinds]
        at, took = med(s["end_s"] for s in same), med(s["wall_s"] for s in same)
        lines.append(f"| {stage['stage']} | {at:.2f} | {took:.2f} | " + " | ".join(cells) + " |")
    total = {k: med(r["cpu_by_kind"].get(k, 0.0) for r in runs) for k in kinds}
    lines += [
        f"| **whole sweep** | | {med(r['wall_s'] for r in runs):.2f} | "
        + " | ".join(f"**{total[k]:.2f}**" for k in kinds)
        + " |",
        "",
    ]
    actors = [a for r in runs for a in r["actors"]]
    if actors:
        imports = [a["imports_cpu"] for a in actors if a["imports_cpu"] is not None]
        firsts = [a["first_report_cpu"] for a in actors if a["first_report_cpu"] is not None]
        lines.append(
            f"- trial actors ({len(actors) // n} a run): started {_list(a['born_s'] for a in actors)} s "
            f"after the command; CPU-s before their first trial (Ray's worker, Ray Tune, tuner, and "
            f"what a warm worker imported ahead) median {med(a['boot_cpu'] for a in actors):.2f}; from "
            f"the first trial's start to its mode loaded (torch) {med(imports) if imports else 0:.2f}, "
            f"to its first report {med(firsts) if firsts else 0:.2f}"
        )
        hand = [h for a in actors for h in a["handovers"]]
        if hand:

            def part(key: str) -> str:
                values = sorted(h[key] for h in hand)
                return f"{med(values) * 1000:.0f} ms (p90 {values[int(len(values) * 0.9)] * 1000:.0f})"

            lines.append(
                f"- hand-over in a reused actor, a trial's last report -> the next one's first epoch "
                f"begins: median {part('total_s')} over {len(hand)}: wind-down {part('wind_down_s')}, "
                f"Tune (end seen, next trial, actor reset) {part('tune_s')}, the next trial's set-up "
                f"(data, model) {part('setup_s')}; the actor's CPU in between median "
                f"{med(h['actor_cpu'] for h in hand) * 1000:.0f} ms"
            )
    merits = [r["merit"] for r in runs if r["merit"]]
    if merits:
        strict = [r["merit_epochs"] for r in runs if r["merit_epochs"]]
        lines.append(
            f"- figure of merit, wall / (sum of the trials' own times / concurrent trials): "
            f"**{med(merits):.2f}x** ({_list(merits)}; {runs[0]['trials']} trials of "
            f"{med(r['trial_span_s'] for r in runs):.1f} s in all, from each one's start in its actor "
            f"to its end there, on {runs[0]['slots']} slots); counting only their epochs "
            f"({med(r['trial_time_s'] for r in runs):.1f} s): {med(strict):.2f}x"
        )
    lines.append("")
    return lines


def ratios(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[str]:
    """This tree against the other, run by run (they alternated): wall and CPU-s ratios."""
    pairs = list(zip(ours, theirs, strict=True))
    walls = [a["wall_s"] / b["wall_s"] for a, b in pairs]
    cpus = [sum(a["cpu_by_kind"].values()) / sum(b["cpu_by_kind"].values()) for a, b in pairs]
    return [
        f"- this tree / the other, pair by pair: wall **{statistics.median(walls):.2f}x** ({_list(walls)}), "
        f"CPU-s of all processes **{statistics.median(cpus):.2f}x** ({_list(cpus)})",
        "",
    ]


def _list(values: Any) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def measure(
    which: str, runs: int, work: Path, extra: list[str], trees: tuple[Path, ...] = (ROOT,)
) -> list[list[dict[str, Any]]]:
    """`runs` sweeps of each tree in `trees`, alternating (which goes first alternates too):
    a list of analyses per tree."""
    argv = [*SWEEPS.get(which, [which]), *extra]
    out: list[list[dict[str, Any]]] = [[] for _ in trees]
    for i in range(runs):
        order = list(range(len(trees)))
        for t in order if i % 2 == 0 else order[::-1]:
            name = f"timeline-{Path(which).stem}-{t}-{i}-{time.monotonic_ns()}"
            res = analyse(run(argv, work, name, trees[t]))
            cpu = ", ".join(f"{k} {v:.1f}" for k, v in res["cpu_by_kind"].items())
            print(
                f"  [timeline] {which} ({trees[t]}) run {i}: wall {res['wall_s']:.2f} s, merit "
                f"{res['merit'] or 0:.2f}x, CPU-s {cpu}",
                flush=True,
            )
            out[t].append(res)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", default="digits", help="digits, debug, or a sweep file")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--against", metavar="DIR", type=Path, help="another checkout of tuner, run in turn")
    p.add_argument("--json", metavar="OUT", help="write every run's analysis here")
    p.add_argument("--processes", action="store_true", help="also list each process's CPU-s")
    p.add_argument("extra", nargs="*", help="more arguments for `tuner sweep` (after --)")
    cfg = p.parse_args()
    trees = (ROOT, cfg.against.resolve()) if cfg.against else (ROOT,)
    with tempfile.TemporaryDirectory(prefix="tuner-timeline-") as work:
        every = measure(cfg.sweep, cfg.runs, Path(work), cfg.extra, trees)
    for tree, runs in zip(trees, every, strict=True):
        print("\n".join(report(f"{cfg.sweep} ({tree})", runs)))
        if cfg.processes:
            for r in runs:
                for k, cmd, cpu in r["cpu_by_process"]:
                    print(f"  {cpu:6.2f}  {k:16s} {cmd}")
                print()
    if cfg.against:
        print("\n".join(ratios(every[0], every[1])))
    if cfg.json:
        Path(cfg.json).write_text(
            json.dumps({str(t): r for t, r in zip(trees, every, strict=True)}, indent=1)
        )


if __name__ == "__main__":
    main()
