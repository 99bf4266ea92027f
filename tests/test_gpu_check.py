"""scripts/gpu_check.py, the first thing a lent GPU runs: its CPU halves run here, through the
same command, each step in its own process under its own timeout, one JSON line each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_gpu_check_runs_its_cpu_halves_and_each_step_says_what_it_saw(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.jsonl"
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--cpu", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    assert [line["step"] for line in lines] == ["loader", "ddp_compile", "compiled_trials", "gpu_tests"]
    assert all(line["ok"] for line in lines), lines
    loader, ddp, trials, gpu = lines
    # The steady rate is the loader's (at most 16 samples a 30 ms batch per worker), measured
    # in whole rounds of the workers; the short window is shown beside it.
    for workers, arm in loader["arms"].items():
        assert arm["steady"] <= int(workers) * 16 / 0.03 * 1.05 and arm["short"] > 0, loader
        assert arm["steps"] % (int(workers) * 8) == 0, loader
    # DDP + compile: Dynamo captured the built-in CNN's training and evaluation, all static.
    assert ddp["frames"]["ok"] > 0 and ddp["training_graphs"] >= 2 and ddp["evaluation_graphs"] >= 1, ddp
    assert ddp["dynamic_graphs"] == 0, ddp
    assert [t["graphs"] > 0 for t in trials["trials"]] == [True] * 4, trials
    assert gpu["skipped"]
    assert done.stdout.splitlines() == out.read_text().splitlines()  # printed as written
