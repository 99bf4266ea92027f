"""Lightning tuned as it is (tuner.integrations.lightning, issue 51), with the real Lightning,
the shipped example's LightningModule (tests/lightning_task.py runs it), on real Ray.

- task.command and task.train, 2 trials at once: the driver is killed (-9) while both trials
  wait before their second epoch; `tuner resume` continues each from Lightning's own
  checkpoint (RNG states included; a function's carried in ctx.report's state), and every
  epoch equals the same code run alone, exactly. Lightning's outputs are
  in each trial's directory, and no trial has event files of Lightning's beside tuner's
  (`tuner board` showed twice the runs).
- task.train, one trial at a time (so ASHA's decisions are known): a trial's epochs equal the
  same code run alone, ASHA stops the trial that learns nothing at its first rung, Lightning's
  own early stopping ends another (its outcome "stopped itself", not the scheduler's), and
  best/ holds the best epoch's weights, which `tuner.load_best` gives back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, cli, gated_script, gone, kill_9_when, resumed_to_the_end
from tests.test_modes import _waiting
from tuner.sweepdir import read_metrics, trial_dirs

NO_LIGHTNING = "the lightning extra is not installed (pip install 'tuner[lightning]')"
pytest.importorskip("lightning", reason=NO_LIGHTNING)

LRS = [0.05, 0.1]
EPOCHS = 2
TASK = {
    "command": {
        "command": gated_script("tests/lightning_task.py"),
        "checkpoints": True,
    },
    "train": {"train": "tests.lightning_task:train"},
}


def _alone(lrs: list[float], epochs: int, cwd: Path) -> dict[float, list[dict[str, Any]]]:
    """Each learning rate's epochs, the example run alone (no sweep, no tuner callback's work)."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "lightning_task.py"),
            "--alone",
            *map(str, lrs),
            "--epochs",
            str(epochs),
        ],  # fmt: skip
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads(ln[len("ALONE ") :]) for ln in done.stdout.splitlines() if ln.startswith("ALONE ")]
    return {f["lr"]: f["rows"] for f in found}


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[float, list[dict[str, Any]]]:
    return _alone(LRS, EPOCHS, tmp_path_factory.mktemp("alone"))


def _same_epochs(journal: list[dict[str, Any]], alone: list[dict[str, Any]]) -> None:
    assert [r["epoch"] for r in journal] == [r["epoch"] for r in alone]
    for mine, theirs in zip(journal, alone, strict=True):
        for name in ("val_loss", "val_acc", "train_loss"):
            assert mine[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-7), (name, mine, theirs)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("form", ["command", "train"])
def test_a_killed_sweep_resumes_exactly_as_lightning_alone(form: str, tmp_path: Path, alone: Any) -> None:
    gate = tmp_path / "gate"
    had_logs = (ROOT / "lightning_logs").exists()
    raw = {
        "name": f"lightning-{form}",
        "metric": "val_loss",
        "direction": "min",
        "task": TASK[form],
        "search": {"algorithm": "grid", "params": {"lr": {"type": "grid", "values": LRS}, "gate": str(gate)}},
        "schedule": {"max_epochs": EPOCHS, "early_stopping": False},
        "output": str(tmp_path),
    }

    def both_wait_after_epoch_1(sweep: Path) -> bool:
        dirs = trial_dirs(str(sweep))
        return len(_waiting(gate)) == 2 and len(dirs) == 2 and all(read_metrics(d) for d in dirs)

    sweep = kill_9_when(raw, tmp_path, both_wait_after_epoch_1)
    gone(*_waiting(gate))
    gate.touch()
    summary = resumed_to_the_end(sweep, 2)
    for t in summary["trials"]:
        trial = sweep / t["trial_id"]
        journal = read_metrics(str(trial))
        _same_epochs(journal, alone[t["config"]["lr"]])
        assert "resumed at epoch 1" in (trial / "trial.log").read_text()
        # Lightning's outputs are the trial's (its CSV logger's), and TensorBoard's event
        # files in it are tuner's alone.
        assert list((trial / "framework").rglob("metrics.csv")), sorted(trial.rglob("*"))
        assert not (trial / "framework" / "restored").exists()  # (a function's, once loaded)
        events = [p.relative_to(trial) for p in trial.rglob("events.out.tfevents*")]
        assert events and all(p.parent == Path(".") for p in events), events
    assert had_logs or not (ROOT / "lightning_logs").exists()  # (none in the directory it started in)


@pytest.mark.usefixtures("ray_session")
def test_asha_and_lightnings_early_stopping_end_trials_and_best_keeps_weights(
    tmp_path: Path, alone: Any
) -> None:
    import torch

    import tuner
    from tests import lightning_task

    lrs = [lightning_task.EARLY_STOPPED_LR, 0.05, 1e-6]  # in this order, one at a time
    raw = {
        "name": "lightning-asha",
        "metric": "val_loss",
        "direction": "min",
        "task": TASK["train"],
        "search": {"algorithm": "grid", "params": {"lr": {"type": "grid", "values": lrs}}},
        "schedule": {"max_epochs": 3, "grace_epochs": 1, "reduction_factor": 2, "early_stopping": True},
        "resources": {"cpus_per_worker": 2},  # the whole Ray: one trial at a time
        "output": str(tmp_path),
    }
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(json.dumps(raw))
    done = cli("sweep", str(sweep_file), cwd=ROOT, on_session=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sweep = tmp_path / "lightning-asha"
    summary = json.loads((sweep / "summary.json").read_text())
    by_lr = {t["config"]["lr"]: t for t in summary["trials"]}
    journals = {lr: read_metrics(str(sweep / t["trial_id"])) for lr, t in by_lr.items()}
    # The same code alone: the same epochs (its first two).
    _same_epochs(journals[0.05][:EPOCHS], alone[0.05])
    # Lightning's early stopping: two epochs, the last one says who stopped it; its own ending.
    stopped = journals[lightning_task.EARLY_STOPPED_LR]
    assert [r["epoch"] for r in stopped] == [1, 2] and stopped[-1]["stopped_by"] == "EarlyStopping"
    assert not by_lr[lightning_task.EARLY_STOPPED_LR]["stopped_early"]
    # ASHA: the trial that learns nothing is below the others at the first rung.
    assert [r["epoch"] for r in journals[1e-6]] == [1] and "stopped_by" not in journals[1e-6][0]
    assert by_lr[1e-6]["stopped_early"] and by_lr[1e-6]["failure"] is None
    assert summary["counts"] == {"completed": 1, "stopped early": 1, "stopped itself": 1}
    # best/: the best epoch's weights, given back by load_best into the example's module.
    best = summary["best"]
    example = lightning_task.lightning_digits
    model = tuner.load_best(str(sweep), model=example.DigitsMLP(width=lightning_task.WIDTH))
    _, val = example.loaders()
    x, y = val.dataset.tensors
    with torch.no_grad():
        val_loss = torch.nn.functional.cross_entropy(model(x), y).item()
    assert val_loss == pytest.approx(best["metrics"]["val_loss"], rel=1e-5)
