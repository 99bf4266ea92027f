"""The benchmark script stays runnable: every section at toy sizes (its numbers mean nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from bench import have_peers  # noqa: E402

pytestmark = pytest.mark.slow


def test_bench_smoke_runs_every_section(tmp_path: Path) -> None:
    out_md = tmp_path / "bench.md"
    done = subprocess.run(
        [sys.executable, "scripts/bench.py", "--smoke", "--write", str(out_md)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out_md.read_text()
    for heading in (
        "Sweep throughput",
        "Per-trial overhead",
        "DDP trial start-up",
        "Loop parity",
        "Makespan",
        "Search efficiency",
    ):
        assert f"### {heading}" in text, heading
    for contender in ("tuner bohb", "tuner random", "tuner optuna"):
        assert f"| {contender} |" in text, contender
    peers = ("peer optuna in-process", "peer raytune random (reuse)", "peer raytune bohb (reuse)")
    if have_peers():  # ../shared/peers (or TUNER_PEERS) beside this checkout: they run too
        for contender in peers:
            assert f"| {contender} |" in text, contender
        assert "Best peer val_acc" in text
    else:  # a checkout without them says so instead of inventing ratios
        assert not any(f"| {c} |" in text for c in peers)
        assert "No peers:" in text
