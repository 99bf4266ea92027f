"""What reads a finished sweep back (report, export) as users meet it (issue 26, minor items):
a script sweep's "train again" is the script's own command line; readers repeat none of the
sweep's warnings; a sweep on a read-only mount and damaged weights are one line, exit 2; a
script sweep's sweep.yaml lists no `training:` settings (its script trains)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEBUG, ROOT, SPACES, cli, run_cli
from tuner.sweepdir import read_metrics

pytestmark = pytest.mark.slow
WARNING = "task.checkpoints is false: bohb only stops trials"


@pytest.fixture(scope="module")
def script_sweep(tmp_path_factory: pytest.TempPathFactory, ray_session: Any) -> dict[str, Any]:
    """search_spaces/script.yaml (bohb over a plain script) without checkpoints: it warns.
    (Run on the session's Ray, from the repository as a user's shell would be.)"""
    out = tmp_path_factory.mktemp("script")
    done = cli(
        "sweep", str(SPACES / "script.yaml"), "--output", str(out), "--num-samples", "2",
        "--max-epochs", "2", "--set", "task.checkpoints=false", cwd=ROOT, on_session=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert WARNING in done.stderr  # said once, by the sweep
    return {"dir": out / "script", "done": done}


def test_a_script_sweep_s_train_again_is_the_script_s_own_command_line(script_sweep: dict[str, Any]) -> None:
    sweep_dir = script_sweep["dir"]
    report = run_cli("report", str(sweep_dir), "--format", "md")
    assert report.returncode == 0, report.stderr
    summary = json.loads((sweep_dir / "summary.json").read_text())
    best = summary["best"]
    block = report.stdout.split("Train this configuration again", 1)[1].split("```", 2)[1]
    command = block.strip().splitlines()[-1]
    argv = shlex.split(command)
    # After the environment that changes its results: its threads and devices.
    assert argv[:4] == ["env", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "CUDA_VISIBLE_DEVICES="], command
    assert argv[4:6] == ["python", "search_spaces/train_script.py"], command
    assert "tuner" not in argv[1:] and "--epochs" in argv and argv[argv.index("--epochs") + 1] == "2"
    # Run from where the sweep started, it trains the best trial's configuration again: the
    # same seed and threads, the same numbers at the same epoch, bit for bit.
    # (`python` as the user's shell finds it: the environment tuner runs in, activated)
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    again = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PATH": path}
    )
    assert again.returncode == 0, again.stderr
    printed = re.findall(r"tuner.report: epoch=(\d+), val_loss=([\d.e-]+)", again.stdout)
    journal = {r["epoch"]: r["val_loss"] for r in read_metrics(str(sweep_dir / best["trial_id"]))}
    assert printed and all(float(v) == journal[int(e)] for e, v in printed), (printed, journal)


def test_readers_repeat_none_of_the_sweep_s_warnings(script_sweep: dict[str, Any], tmp_path: Path) -> None:
    for args in (["report", "--output", str(tmp_path / "r")], ["export"]):
        done = run_cli(args[0], str(script_sweep["dir"]), *args[1:])
        assert WARNING not in done.stderr, (args, done.stderr)


def test_a_script_sweep_s_sweep_yaml_lists_no_training_settings(script_sweep: dict[str, Any]) -> None:
    stored = (script_sweep["dir"] / "sweep.yaml").read_text()
    assert "\ntraining:" not in stored and "batch_size" not in stored, stored


@pytest.fixture(scope="module")
def loop_sweep(tmp_path_factory: pytest.TempPathFactory, ray_session: Any) -> Path:
    out = tmp_path_factory.mktemp("loop")  # (a sweep to read: run on the session's Ray)
    done = cli(
        "sweep", str(DEBUG), "--output", str(out), "--num-samples", "2", "--max-epochs", "1", on_session=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "debug"


def _read_only(path: Path, *command: str) -> subprocess.CompletedProcess:
    """`python -m tuner COMMAND` with `path` mounted read-only (a mount namespace of its own:
    root writes through file modes)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a read-only mount")
    script = f"mount --bind -o ro {shlex.quote(str(path))} {shlex.quote(str(path))} && exec " + shlex.join(
        [sys.executable, "-m", "tuner", *command]
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if "mount:" in done.stderr or "unshare:" in done.stderr:
        pytest.skip(f"no read-only mount here: {done.stderr.strip()[:200]}")
    return done


def test_report_and_export_of_a_read_only_sweep_are_one_line(loop_sweep: Path) -> None:
    for command in (["report", str(loop_sweep)], ["export", str(loop_sweep), "--format", "torchscript"]):
        done = _read_only(loop_sweep, *command)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"error: --output: cannot write into {loop_sweep}")
        assert "Read-only file system" in done.stderr


def test_torchscript_export_of_damaged_weights_is_one_line(loop_sweep: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(loop_sweep, copy)
    best = json.loads((copy / "summary.json").read_text())["best"]["trial_id"]
    (weights,) = (copy / best).glob("best_e*.pt")
    weights.write_bytes(b"not a state dict")
    done = run_cli("export", str(copy), "--format", "torchscript")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"cannot be rebuilt with its best weights {weights}" in done.stderr
    assert "the file is damaged, or not a state dict" in done.stderr
