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
