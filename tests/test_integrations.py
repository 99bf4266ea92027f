"""tuner.integrations.bridge: what the Lightning and Hugging Face callbacks share, without Ray
or either framework (their sweeps: tests/test_lightning.py, tests/test_transformers.py)."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch

from tuner.integrations.bridge import OUTPUTS, Bridge, numbers, rng_state, set_rng_state


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), torch.rand(1).item()


def test_rng_states_survive_a_weights_only_load() -> None:
    """Lightning loads checkpoints with torch.load(weights_only=True), which refused NumPy's
    state as NumPy gives it (a resumed trial failed to load its checkpoint)."""
    saved = io.BytesIO()
    torch.save(rng_state(), saved)
    expected = _draws()
    saved.seek(0)
    set_rng_state(torch.load(saved, weights_only=True))
    assert _draws() == expected


class Ctx:
    """A task.train trial's ctx as the bridge uses it: its directory, report and restore."""

    def __init__(self, trial_dir: Path, restored: Optional[dict[str, Any]] = None):
        self.trial_dir, self.is_main, self.max_epochs = str(trial_dir), True, 3
        self.reports: list[tuple[dict[str, Any], Optional[dict[str, Any]]]] = []
        self.restored = restored

    def report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]] = None) -> None:
        self.reports.append((metrics, state))

    def restore(self) -> Optional[dict[str, Any]]:
        return self.restored


def test_a_task_train_checkpoint_goes_into_the_state_and_comes_back(tmp_path: Path) -> None:
    ctx = Ctx(tmp_path / "t1")
    bridge = Bridge(ctx)
    save = Path(bridge.checkpoint_dir())
    (save / "sub").mkdir()
    (save / "sub" / "weights.bin").write_bytes(b"\x00\x01weights")
    (save / "state.json").write_text("{}")
    bridge.report(1, {"val_loss": 0.5}, model={"w": torch.ones(2)})
    ((metrics, state),) = ctx.reports
    assert metrics == {"epoch": 1, "val_loss": 0.5} and not save.exists()
    assert state["files"] == {"sub/weights.bin": b"\x00\x01weights", "state.json": b"{}"}
    assert torch.equal(state["model"]["w"], torch.ones(2))
    back = Bridge(Ctx(tmp_path / "t1", restored=state)).restore_dir()
    assert back is not None and Path(back).parent == tmp_path / "t1" / OUTPUTS
    assert (Path(back) / "sub" / "weights.bin").read_bytes() == b"\x00\x01weights"
    assert Bridge(Ctx(tmp_path / "t2")).restore_dir() is None


def test_a_restored_checkpoint_is_gone_once_the_trial_reports_again(tmp_path: Path) -> None:
    """The checkpoint a resumed task.train trial got back is the framework's once it reported
    an epoch after it: it was left in the trial's directory for good (a Trainer checkpoint of a
    real model, optimizer included, is gigabytes)."""
    ctx = Ctx(tmp_path / "t1")
    first = Bridge(ctx)
    Path(first.checkpoint_dir(), "model.bin").write_bytes(b"w")
    first.report(1, {"val_loss": 0.5})
    resumed = Bridge(Ctx(tmp_path / "t1", restored=ctx.reports[0][1]))
    back = resumed.restore_dir()
    assert back is not None and Path(back, "model.bin").read_bytes() == b"w"
    Path(resumed.checkpoint_dir(), "model.bin").write_bytes(b"w2")
    resumed.report(2, {"val_loss": 0.4})
    assert not Path(back).exists() and resumed.restore_dir() is None
    assert sorted(p.name for p in (tmp_path / "t1" / OUTPUTS).iterdir()) == []


def test_outside_a_sweep_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("TUNER_REPORT_FILE", "TUNER_CHECKPOINT_DIR", "TUNER_RESTORE_DIR", "TUNER_TRIAL_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    bridge = Bridge()
    assert (bridge.outputs(), bridge.checkpoint_dir(), bridge.restore_dir()) == (None, None, None)
    bridge.report(2, {"val_loss": 0.25})
    assert "epoch=2, val_loss=0.25" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_numbers_are_plain_floats() -> None:
    values = {"a": torch.tensor(0.5), "b": np.float32(2.0), "c": 3, "v": torch.ones(2), "s": "x", "t": True}
    got = numbers(values)
    assert got == {"a": 0.5, "b": 2.0, "c": 3.0}


@pytest.mark.slow  # (each framework's import and a few epochs in a process: seconds)
@pytest.mark.parametrize(
    ("task", "step", "reported"),
    [("lightning_task.py", 0, [1]), ("hf_task.py", 16 + 13, [1]), ("hf_task.py", 32, [1, 2])],
)
def test_a_script_stopped_by_sigterm_ends_its_training_and_says_so(
    task: str, step: int, reported: list[int], tmp_path: Path
) -> None:
    """SIGTERM, as a stopped trial's script gets it, while the script waits in its second
    epoch (Lightning's before it; the Trainer's after its step `step`, of 16 an epoch): training
    ends at the next step with the whole epochs reported and checkpointed, and the script exits
    143 (Lightning's own handling exits 0, which read as the script ending its training itself).
    The Trainer's end of an epoch cut short evaluated and saved it, and the callback reported
    that part-epoch as epoch 2 (1.8 rounds to 2), its checkpoint too; an epoch whose last step
    was done is whole, and is evaluated, saved and reported."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("lightning" if task.startswith("lightning") else "transformers")
    root = Path(__file__).resolve().parents[1]
    trial, gate = tmp_path / "trial", tmp_path / "gate"
    trial.mkdir()
    env = {**os.environ, "TUNER_TRIAL_DIR": str(trial), "TUNER_REPORT_FILE": str(trial / "reports.jsonl"),
           "TUNER_CHECKPOINT_DIR": str(trial / "checkpoints")}  # fmt: skip
    argv = [sys.executable, str(root / "tests" / task), "--lr", "0.01", "--gate", str(gate), "--epochs", "3"]
    if step:  # (the Trainer's: 512 samples, 32 a step)
        argv += ["--gate-step", str(step)]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while not list(tmp_path.glob("gate.*")):
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # (pending before the gate opens: handled first)
    gate.touch()
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-3000:]
    rows = [json.loads(line) for line in (trial / "reports.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == reported and all(os.path.isdir(r["checkpoint"]) for r in rows), rows
    assert "stopped_by" not in rows[-1]  # (tuner's stop, not the script's own)


class StoppingCtx(Ctx):
    """A task.train trial's ctx whose scheduler stops the trial at its first report: `report`
    raises SystemExit(0) there, as Ray's report does when the scheduler stopped the trial."""

    def report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]] = None) -> None:
        super().report(metrics, state)
        raise SystemExit(0)


@pytest.mark.slow  # (transformers' import and an epoch of the example: seconds)
def test_a_function_trial_stopped_at_its_report_ends_through_the_trainers_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's stop at a task.train trial's report (ctx.report does not return) ends the
    Trainer as its own early stopping does: no further step, evaluation or checkpoint, then its
    end of training (the best weights loaded, every callback's on_train_end, a user's W&B run
    finished there), and only then the stop goes on out of `trainer.train()`. It went straight
    through the Trainer from the callback's on_save, and no on_train_end ran."""
    pytest.importorskip("transformers")
    from transformers import TrainerCallback

    from tests.hf_task import hf_tiny

    monkeypatch.chdir(tmp_path)

    ended: list[tuple[int, bool]] = []

    class Ended(TrainerCallback):
        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ended.append((state.global_step, control.should_training_stop))

    ctx = StoppingCtx(tmp_path / "trial")
    with pytest.raises(SystemExit) as stop:
        hf_tiny.fit({"lr": 0.01}, 3, ctx, [Ended()])
    assert stop.value.code == 0
    assert [m["epoch"] for m, _ in ctx.reports] == [1] and ctx.reports[0][1] is not None
    assert ended == [(16, True)]  # (512 samples, 32 a step)
    assert sorted(p.name for p in (tmp_path / "trial" / OUTPUTS).glob("checkpoint-*")) == ["checkpoint-16"]


@pytest.mark.slow  # (Lightning's import: seconds)
def test_in_a_sweep_lightning_writes_nothing_where_every_trial_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Trainer made after tuner's callback (made first, to be handed to it) has the trial's
    directory as its root from the start: its default logger, which makes its directory and
    event file before any callback's hook, makes nothing in the directory every trial runs in
    (where one trial removing its empty `lightning_logs` raced another's making it: a trial
    failed with FileNotFoundError, seen once in a tier). The Trainer read that default: it is
    gone from the environment; a root the user gives stands."""
    import os

    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import CSVLogger

    from tuner.integrations.lightning import ROOT_ENV, TunerCallback

    trial, shared = tmp_path / "trial", tmp_path / "shared"
    trial.mkdir()
    shared.mkdir()
    monkeypatch.chdir(shared)
    monkeypatch.setenv("TUNER_TRIAL_DIR", str(trial))
    monkeypatch.delenv(ROOT_ENV, raising=False)
    quiet = {"enable_progress_bar": False, "enable_model_summary": False}
    tuned = TunerCallback()
    trainer = lightning.Trainer(max_epochs=1, callbacks=[tuned], **quiet)
    assert Path(trainer.default_root_dir) == trial / "framework"
    assert trainer.logger is not None and trainer.logger.experiment is not None  # (as Lightning does first)
    assert list(shared.iterdir()) == []
    tuned.setup(trainer, lightning.LightningModule(), "fit")
    assert ROOT_ENV not in os.environ
    assert isinstance(trainer.logger, CSVLogger) and not list(trial.rglob("events.out.tfevents*"))
    mine = tmp_path / "mine"
    chosen = lightning.Trainer(default_root_dir=str(mine), callbacks=[TunerCallback()], **quiet)
    assert Path(chosen.default_root_dir) == mine
    os.environ.pop(ROOT_ENV, None)
