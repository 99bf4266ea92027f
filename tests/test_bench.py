"""The benchmark scripts stay runnable: every section at toy sizes (their numbers mean nothing)."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from tests.conftest import ROOT, cluster_env

sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402
import bench_fixed  # noqa: E402
from bench_compute import time_to  # noqa: E402
from bench_search import TASKS, Task, best_so_far, epochs_to, shifted, target  # noqa: E402

from tuner.search.simulate import Event  # noqa: E402


def _smoke(script: str, *args: str, env: Optional[dict[str, str]] = None) -> None:
    """`script --smoke ARGS`; `env`, when given, is the whole environment."""
    done = subprocess.run(
        [sys.executable, script, "--smoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ if env is None else env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# Stand-ins for the hand-written peers (../shared/peers: Optuna in-process, Ray Tune), which
# live outside this repository and are what the real benchmark times. Each prints the JSON line
# the real ones print after a second's "sweep" of one epoch (a rate of the order of the smoke's
# own, so that every ratio prints as a number above 0.00): the smoke runs bench.py's own peer
# code (its peer runs, ratios and peer rows) without a minute of third-party sweeps whose
# numbers it ignores.
STAND_IN_PEER = """import json, time
time.sleep(1.0)
print(json.dumps({"peer": "stand-in", "epochs_spent": 1, "best_val_acc": 0.5}))
"""


def stand_in_peers(where: Path) -> Path:
    where.mkdir()
    for name in ("optuna_digits.py", "raytune_digits.py"):
        (where / name).write_text(STAND_IN_PEER)
    return where


def _row(text: str, first: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is `first`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first:
            return cells
    raise AssertionError(f"no row '{first}' in:\n{text}")


def _number(text: str, pattern: str) -> float:
    found = re.search(pattern, text)
    assert found, (pattern, text)
    return float(found.group(1))


def _sections(text: str) -> dict[str, str]:
    """Each `### heading`'s text, by the heading's first words (up to ':' or '(')."""
    parts = re.split(r"^### ", text, flags=re.M)[1:]
    return {re.split(r"[:(]", part, maxsplit=1)[0].strip(): part for part in parts}


@pytest.mark.slow
def test_bench_smoke_runs_every_section(tmp_path: Path) -> None:
    """Every section at its smoke size (3 trials of <= 2 epochs, tuner's bohb and random), with
    peers (stand-ins) beside it, each figure a real measurement: times and rates above 0,
    accuracies in (0, 1], counts as run. Without peers: the test below.

    Its sweeps join one cluster (`--address`, a `tuner cluster` of 2 CPUs started here, token
    and state in tmp_path) rather than each starting a Ray: 7 Ray starts fewer. The fixed-cost
    section still starts its own (the embedded start it times), so that path runs here too."""
    out_md = tmp_path / "bench.md"
    env = cluster_env(tmp_path)
    env["TUNER_PEERS"] = str(stand_in_peers(tmp_path / "p"))
    cluster = [sys.executable, "-m", "tuner", "cluster"]
    started = subprocess.run(
        [*cluster, "start", "--num-cpus", "2"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        gcs = json.loads((tmp_path / "state" / "cluster.json").read_text())["gcs"]
        _smoke("scripts/bench.py", "--write", str(out_md), "--address", gcs, env=env)
    finally:
        subprocess.run([*cluster, "stop"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    check_smoke_report(out_md.read_text())
    assert "ran on a running Ray cluster (--address)" in out_md.read_text()


def test_without_peers_the_report_says_so_instead_of_inventing_ratios() -> None:
    """A checkout without ../shared/peers: no peer rows or ratios, each section says why."""
    ours = {"wall": 9.0, "epochs": 6, "best": 0.9, "sweep": "-"}
    table = bench.throughput_table({"tuner bohb": [ours], "tuner random": [ours]})
    assert "No peers:" in table and "| peer" not in table
    assert _row(table, "tuner random")[5:] == ["", ""]  # no ratio against a peer that did not run
    run = dict.fromkeys(("header", "first_start", "first_epoch", "to_results", "to_summary", "to_exit"), 1.0)
    cfg = argparse.Namespace(trials=3, max_epochs=2, fixed_seed=1)
    fixed = "\n".join(bench_fixed.report({"ours": [{**ours, **run}], "peer": []}, cfg))
    assert "no peer here: wall ratio not measured" in fixed and "ours / peer" not in fixed
    assert float(_row(fixed, "start -> sweep header printed")[1]) == 1.0


def test_against_another_checkout_the_fixed_report_pairs_each_run_with_its_neighbours() -> None:
    """--against DIR: the other checkout's runs are a third row, their ratios to the peer and
    to this tree's taken pair by pair (the runs beside each other), and both figures of merit."""
    run = dict.fromkeys(("header", "first_start", "first_epoch", "to_results", "to_summary", "to_exit"), 1.0)

    def runs(walls: list[float], merit: float) -> list[dict]:
        return [{**run, "wall": w, "best": 0.95, "epochs": 60, "merit": merit} for w in walls]

    res = {"ours": runs([10.0, 30.0], 1.4), "before": runs([20.0, 60.0], 2.9), "peer": runs([20.0, 20.0], 0)}
    cfg = argparse.Namespace(trials=30, max_epochs=27, fixed_seed=1, against=Path("/tmp/before"))
    fixed = "\n".join(bench_fixed.report(res, cfg))
    assert _number(fixed, r"wall, ours / peer: \*\*([\d.]+)x") == statistics.median([0.5, 1.5])
    assert _number(fixed, r"before, wall / peer: \*\*([\d.]+)x") == statistics.median([1.0, 3.0])
    assert _number(fixed, r"this tree / before, pair by pair: wall \*\*([\d.]+)x") == statistics.median(
        [0.5, 0.5]
    )
    assert _number(fixed, r"- figure of merit \(issue 50\).*?\*\*([\d.]+)x") == 1.4
    assert _number(fixed, r"- before, figure of merit \(issue 50\).*?\*\*([\d.]+)x") == 2.9
    assert _row(fixed, "tuner random, before")[1] == "40.0"


def check_smoke_report(text: str) -> None:
    section = _sections(text)
    assert list(section) == [
        "Fixed cost and whole-process wall",
        "Sweep throughput",
        "Per-trial overhead",
        "DDP trial start-up",
        "Loop parity under torchrun",
        "Makespan",
        "Search efficiency",
        "Compute-bound sweep",
    ], list(section)
    fixed, throughput = section["Fixed cost and whole-process wall"], section["Sweep throughput"]
    peers = ("peer optuna in-process", "peer raytune random (reuse)", "peer raytune bohb (reuse)")
    for contender in ("tuner bohb", "tuner random", *peers):
        _, wall, epochs, rate, best, *ratios = _row(throughput, contender)
        assert float(wall) > 0 and 1 <= float(epochs) <= 3 * 2 and float(rate) > 0, contender
        assert 0 < float(best) <= 1, contender
        if contender.startswith("tuner"):  # vs Optuna, vs Ray Tune's same search
            assert all(r.endswith("x") and float(r[:-1]) > 0 for r in ratios), (contender, ratios)
    assert "| tuner optuna |" not in throughput  # (smoke: tuner's bohb and random only)
    assert "Best peer val_acc" in throughput
    assert _number(fixed, r"wall, ours / peer: \*\*([\d.]+)x") > 0
    assert _number(fixed, r"figure of merit \(issue 50\).*?\*\*([\d.]+)x") > 0
    assert _number(fixed, r"\| \*\*whole sweep\*\* \| \| ([\d.]+) \|") > 0  # (its timeline)
    _, wall, _, best, epochs = _row(fixed, "tuner random")
    assert float(wall) > 0 and 0 < float(best) <= 1 and 1 <= float(epochs) <= 3 * 2
    for step in ("start -> sweep header printed", "start -> first trial's first epoch"):
        assert float(_row(fixed, step)[1]) > 0, step
    overhead = section["Per-trial overhead"]
    assert re.search(r"first report: median \d+ ms, p95 \d+ ms over 4 trials", overhead)
    ddp = section["DDP trial start-up"]
    assert _number(ddp, r"first trial \(new rank processes\), start to first report: median ([\d.]+) s") > 0
    assert _number(ddp, r"later trials \(on the ranks .*?\), start to first report: median ([\d.]+) s") > 0
    parity = section["Loop parity under torchrun"]
    assert _number(parity, r"tuner's loop (\d+) samples/s") > 0
    assert _number(parity, r"hand-written (\d+) samples/s") > 0
    makespan = section["Makespan"]
    assert _number(makespan, r"= \*\*([\d.]+)x\*\*") > 0
    assert len(re.match(r"Makespan \(trials of ([\d., ]+) s", makespan).group(1).split(",")) == 2
    search = section["Search efficiency"]
    for algorithm in ("bohb", "random"):  # epochs to the target, read from the sweeps above
        assert _number(search, rf"- {algorithm}: median (\d+) epochs") >= 1, algorithm
    assert _number(search, r"bohb / random: \*\*([\d.]+)x") > 0
    for contender in ("peer optuna in-process (cnn)", "tuner random"):
        _, wall, epochs, _, best, *_ = _row(section["Compute-bound sweep"], contender)
        assert float(wall) > 0 and float(epochs) >= 1 and 0 < float(best) <= 1, contender


def test_search_bench_smoke_covers_every_task_and_algorithm(tmp_path: Path) -> None:
    """scripts/bench_search.py --smoke: 2 seeds of 12 trials, every task and algorithm, the
    real scheduler and searchers in the simulated controller (seconds)."""
    out_md, png = tmp_path / "search.md", tmp_path / "search.png"
    _smoke("scripts/bench_search.py", "--write", str(out_md), "--plot", str(png))
    text = out_md.read_text()
    for task in TASKS:
        assert f"#### {task.name}: target" in text, task.name
    for algorithm in ("random", "bohb", "optuna", "grid"):
        assert text.count(f"| {algorithm} | ") == len(TASKS), algorithm
    header = next(line for line in text.splitlines() if line.startswith("| algorithm |"))
    assert "| its worst seed |" in header and "| best stopped |" in header
    held = [t.name for t in TASKS if t.held_back]
    assert held and text.index("#### Held back") < min(text.index(f"#### {n}:") for n in held)
    assert png.stat().st_size > 10_000


def test_search_bench_warm_start_smoke(tmp_path: Path) -> None:
    """--warm: for each algorithm, an earlier sweep of the shifted space, then a cold and a
    warm-started sweep of the task (2 seeds, tiny budgets)."""
    out_md = tmp_path / "warm.md"
    _smoke("scripts/bench_search.py", "--warm", "--tasks", "conditional", "--write", str(out_md))
    text = out_md.read_text()
    for algorithm in ("random", "bohb", "optuna"):
        assert f"| conditional | {algorithm} | " in text, algorithm


def test_targets_are_the_best_five_percent_of_the_table(tmp_path: Path) -> None:
    """By hand: 20 final values 1..20 (a loss), one diverged run counted as the worst: the
    5th percentile of the 21 is 2.0 (numpy's linear interpolation: index 1); as a maximised
    metric, the 95th percentile is 19.0 (index 19)."""
    import json

    rows = [{"config": {}, "curve": [99.0, float(v)], "failed": False} for v in range(1, 21)]
    rows.append({"config": {}, "curve": [1.0, float("nan")], "failed": True})
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"rows": rows}))
    loss = Task("t", "benchmarks/tasks/conditional.yaml", str(table))  # direction: min
    assert target(loss) == 2.0
    acc = Task("t", "search_spaces/digits_mlp.yaml", str(table))  # direction: max
    assert target(acc) == 19.0


def test_the_shifted_space_is_half_as_wide_inside_the_task_space() -> None:
    """conditional.yaml: lr loguniform 1e-4..1 (4 decades) becomes 10^-2.5..10^-0.5; momentum
    0..0.99 becomes 0.37125..0.86625; width lograndint 16..512 (5 octaves) 2^5.875..2^8.375 =
    58.7..331.4, so 59..331; the choice and the condition stay."""
    import pytest

    space = shifted(next(t for t in TASKS if t.name == "conditional"))
    assert space["lr"]["low"] == pytest.approx(10**-2.5) and space["lr"]["high"] == pytest.approx(10**-0.5)
    assert space["momentum"]["low"] == pytest.approx(0.37125) and space["momentum"]["high"] == pytest.approx(
        0.86625
    )
    assert space["momentum"]["when"] == {"optimizer": "sgd"}
    assert (space["width"]["low"], space["width"]["high"]) == (59, 331)
    assert space["optimizer"]["values"] == ["sgd", "adam"]


def test_time_to_the_peers_best_by_hand() -> None:
    """The first time the best-so-far reaches the target; the peer's 4-place rounding of
    2/3 (0.6667) is reached by 0.66666; never reached is infinite."""
    curve = [(3.0, 0.5), (4.5, 0.66666), (9.0, 0.9)]
    assert time_to(curve, 0.6667) == 4.5
    assert time_to(curve, 0.9) == 9.0
    assert time_to(curve, 0.95) == float("inf")
    assert time_to([], 0.1) == float("inf")


def test_best_so_far_and_epochs_to_target_by_hand() -> None:
    """A loss (min): a diverged epoch (inf) is never a best; the target is met at the 4th epoch
    spent; never met is infinite, not a number of epochs."""
    values = [2.0, 1.0, float("inf"), 0.4, 0.6]
    events = [Event(f"t{i % 2}", i // 2 + 1, v) for i, v in enumerate(values)]
    curve = best_so_far(events, sign=-1.0)
    assert curve == [2.0, 1.0, 1.0, 0.4, 0.4]
    assert epochs_to(curve, 0.5, sign=-1.0) == 4
    assert epochs_to(curve, 0.1, sign=-1.0) == float("inf")
    assert epochs_to(best_so_far(events[:1], sign=1.0), 1.5, sign=1.0) == 1  # max: 2.0 >= 1.5
