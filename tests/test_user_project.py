"""A sweep of a third-party `task.train` from the user's own project directory, as a user runs
it (`python -m tuner sweep sweep.yaml` there, 2 trials at once) (issue 26, items 9 and 11):
the function opens a relative file and prints; its metric is tiny (a loss of ~1e-4)."""

from __future__ import annotations

import io
import json
import re
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow

# Two trials whose best losses differ in the third significant digit, both below 1e-4: four
# fixed decimals showed 0.0001 for each.
SCALES = (7.59e-05, 9.27e-05)
TRAIN = textwrap.dedent(
    """
    import sys

    def train(config, ctx):
        with open("data.txt") as f:  # relative: where the sweep was started
            rows = f.read().split()
        print(f"read {len(rows)} rows for scale {config['scale']}")
        print("a note on stderr", file=sys.stderr)
        for epoch in range(ctx.epoch, ctx.max_epochs):
            ctx.report({"val_loss": config["scale"] * (1 + 1 / (epoch + 1)) / 2 * len(rows) / 3})
        print("done", end="")  # a last line without its newline
    """
)
SWEEP = textwrap.dedent(
    f"""
    name: tiny
    task:
      train: mytrain:train
    metric: val_loss
    direction: min
    search:
      algorithm: grid
      params:
        scale: {{type: grid, values: [{SCALES[0]}, {SCALES[1]}]}}
    schedule:
      max_epochs: 2
    output: runs
    """
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("project")
    (root / "mytrain.py").write_text(TRAIN)
    (root / "data.txt").write_text("1 2 3\n")
    (root / "sweep.yaml").write_text(SWEEP)
    done = run_cli("sweep", "sweep.yaml", cwd=root, env={"PYTHONPATH": str(ROOT)})
    sweep_dir = root / "runs" / "tiny"
    report = run_cli("report", str(sweep_dir), cwd=root, env={"PYTHONPATH": str(ROOT)})
    return {"root": root, "done": done, "dir": sweep_dir, "report": report}


def test_task_train_runs_where_the_sweep_started_and_its_output_is_in_trial_log(
    project: dict[str, Any],
) -> None:
    done = project["done"]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((project["dir"] / "summary.json").read_text())
    assert summary["counts"] == {"completed": 2}, summary["counts"]
    for t in summary["trials"]:
        log = (project["dir"] / t["trial_id"] / "trial.log").read_text()
        assert f"out| read 3 rows for scale {t['config']['scale']}" in log, log
        assert "err| a note on stderr" in log and "out| done" in log, log


def test_tiny_metrics_keep_their_significant_digits(project: dict[str, Any]) -> None:
    done, summary = project["done"], json.loads((project["dir"] / "summary.json").read_text())
    assert done.returncode == 0, done.stderr[-3000:]
    best = {t["config"]["scale"]: t["best_value"] for t in summary["trials"]}
    # Each loss as a user reads it: 5 significant digits, in the CLI's table and best line,
    # the lines of trials that ended, and the report.
    shown = {s: f"{best[s]:.5g}" for s in SCALES}
    assert shown[SCALES[0]] != shown[SCALES[1]] and "e-05" in shown[SCALES[0]]
    for s in SCALES:
        assert re.search(rf"\n\S+\s+{re.escape(shown[s])}\s+2/2\s+completed\s+scale=", done.stdout), (
            done.stdout
        )
        assert f"val_loss {shown[s]} at epoch 2" in done.stdout
        assert f"| {shown[s]} |" in (project["dir"] / "report.md").read_text()
    assert f"val_loss={shown[SCALES[0]]} (epoch 2)" in done.stdout
    assert "0.0001 " not in done.stdout


def test_the_status_line_shows_significant_digits() -> None:
    # The live line of a terminal (a pseudo-terminal is more than this needs): the best value
    # so far, as the callback draws it.
    from tuner.driver.callbacks import Progress

    progress = Progress("val_loss", "min", 4, stream=io.StringIO())
    for trial_id, value in (("a", 9.27e-05), ("b", 7.59e-05)):
        trial = SimpleNamespace(trial_id=trial_id, path=f"/runs/tiny/{trial_id}")
        progress.on_trial_result(0, [], trial, {"val_loss": value})
    running = [SimpleNamespace(status="RUNNING", trial_id=i) for i in "ab"]
    assert "best val_loss 7.59e-05 (b)" in progress.line(running)
