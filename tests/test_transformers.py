"""Hugging Face's Trainer tuned as it is (tuner.integrations.transformers, issue 51), with the
real transformers, the shipped example's tiny BERT (randomly initialised: nothing is
downloaded; tests/hf_task.py runs it), on real Ray.

- task.command, 2 trials at once: the driver is killed (-9) while both trials wait before their
  second epoch; `tuner resume` continues each from the Trainer's own checkpoint, and every
  epoch equals the same code run alone, exactly. The Trainer's outputs are in each trial's
  directory.
- task.train, 2 trials at once, ASHA (grace 1 of 2 epochs): the trial that learns nothing is
  stopped at the rung whichever trial reached it first (the other two are better there), and
  one of the good two may be; a stopped trial ends at the rung (its journal, its Trainer's
  checkpoints), "stopped early" (not failed, not stopped itself); every epoch equals the same
  code run alone, and the trials keep their best epoch's weights: best/, and
  `tuner.load_best` gives them back into the example's model.

(How a task.train trial's Trainer ends when stopped, and a script's: tests/test_integrations.py.)
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

NO_TRANSFORMERS = "the transformers extra is not installed (pip install 'tuner[transformers]')"
pytest.importorskip("transformers", reason=NO_TRANSFORMERS)

LRS = [0.003, 0.01]
# Learns nothing in an epoch: its eval_loss at the rung (0.692) is worse than either of LRS's
# (0.636, 0.690), so ASHA stops it whatever it is compared with.
STILL = 1e-6
EPOCHS = 2
TASK = {
    "command": {
        "command": gated_script("tests/hf_task.py"),
        "checkpoints": True,
    },
    "train": {"train": "tests.hf_task:train"},
}


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[float, list[dict[str, Any]]]:
    """Each learning rate's epochs, the example run alone (no sweep)."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "hf_task.py"),
            "--alone",
            *map(str, [*LRS, STILL]),
            "--epochs",
            str(EPOCHS),
        ],  # fmt: skip
        cwd=tmp_path_factory.mktemp("alone"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads(ln[len("ALONE ") :]) for ln in done.stdout.splitlines() if ln.startswith("ALONE ")]
    return {f["lr"]: f["rows"] for f in found}


def _same_epochs(journal: list[dict[str, Any]], theirs: list[dict[str, Any]], epochs: int = EPOCHS) -> None:
    theirs = theirs[:epochs]
    assert [r["epoch"] for r in journal] == [r["epoch"] for r in theirs] == list(range(1, epochs + 1))
    for mine, row in zip(journal, theirs, strict=True):
        for name in ("eval_loss", "eval_accuracy", "loss"):
            assert mine[name] == pytest.approx(row[name], rel=1e-6, abs=1e-7), (name, mine, row)


def _raw(form: str, tmp_path: Path, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": f"hf-{form}",
        "metric": "eval_loss",
        "direction": "min",
        "task": TASK[form],
        "search": {"algorithm": "grid", "params": {"lr": {"type": "grid", "values": LRS}, **params}},
        "schedule": {"max_epochs": EPOCHS, "early_stopping": False},
        "output": str(tmp_path),
    }


@pytest.mark.usefixtures("ray_session")
def test_a_killed_script_sweep_resumes_exactly_as_the_trainer_alone(tmp_path: Path, alone: Any) -> None:
    gate = tmp_path / "gate"

    def both_wait_after_epoch_1(sweep: Path) -> bool:
        dirs = trial_dirs(str(sweep))
        return len(_waiting(gate)) == 2 and len(dirs) == 2 and all(read_metrics(d) for d in dirs)

    sweep = kill_9_when(_raw("command", tmp_path, {"gate": str(gate)}), tmp_path, both_wait_after_epoch_1)
    gone(*_waiting(gate))
    gate.touch()
    summary = resumed_to_the_end(sweep, 2)
    for t in summary["trials"]:
        trial = sweep / t["trial_id"]
        _same_epochs(read_metrics(str(trial)), alone[t["config"]["lr"]])
        assert "resumed at epoch 1" in (trial / "trial.log").read_text()
        assert list((trial / "framework").glob("checkpoint-*")), sorted(trial.rglob("*"))


@pytest.mark.usefixtures("ray_session")
def test_asha_stops_function_trials_at_the_rung_and_best_keeps_weights(tmp_path: Path, alone: Any) -> None:
    import torch

    import tuner
    from tests import hf_task

    raw = _raw("train", tmp_path, {})
    raw["search"]["params"]["lr"]["values"] = [*LRS, STILL]  # (in this order: STILL starts last)
    raw["schedule"] = {"max_epochs": EPOCHS, "scheduler": "asha"}  # (grace_epochs: 1, the default)
    sweep_file = tmp_path / "hf.yaml"
    sweep_file.write_text(json.dumps(raw))
    done = cli("sweep", str(sweep_file), cwd=ROOT, on_session=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sweep = tmp_path / "hf-train"
    summary = json.loads((sweep / "summary.json").read_text())
    by_lr = {t["config"]["lr"]: t for t in summary["trials"]}
    assert by_lr[STILL]["stopped_early"], by_lr[STILL]
    for lr, t in by_lr.items():
        trial = sweep / t["trial_id"]
        journal = read_metrics(str(trial))
        epochs = 1 if t["stopped_early"] else EPOCHS
        _same_epochs(journal, alone[lr], epochs)
        assert t["failure"] is None and "stopped_by" not in journal[-1], (t, journal)
        # The Trainer saved its epochs up to the rung, none after (16 steps an epoch).
        steps = sorted(int(p.name.split("-")[1]) for p in (trial / "framework").glob("checkpoint-*"))
        assert steps == [16 * e for e in range(1, epochs + 1)], (lr, steps)
    stopped = sum(t["stopped_early"] for t in summary["trials"])
    assert summary["counts"] == {"completed": 3 - stopped, "stopped early": stopped}, summary["counts"]
    best = summary["best"]
    assert best["config"]["lr"] != STILL
    model = tuner.load_best(str(sweep), model=hf_task.hf_tiny.build_model({}))
    x = hf_task.hf_tiny.Counting(128, seed=2)
    with torch.no_grad():
        logits = model(input_ids=x.x, attention_mask=torch.ones_like(x.x)).logits
    loss = torch.nn.functional.cross_entropy(logits, x.y).item()
    assert loss == pytest.approx(best["metrics"]["eval_loss"], rel=1e-5)
