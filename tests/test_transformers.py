"""Hugging Face's Trainer tuned as it is (tuner.integrations.transformers, issue 51), with the
real transformers, the shipped example's tiny BERT (randomly initialised: nothing is
downloaded; tests/hf_task.py runs it), on real Ray.

- task.command, 2 trials at once: the driver is killed (-9) while both trials wait before their
  second epoch; `tuner resume` continues each from the Trainer's own checkpoint, and every
  epoch equals the same code run alone, exactly. The Trainer's outputs are in each trial's
  directory.
- task.train, 2 trials at once: every epoch equals the same code run alone, and the trials keep
  their best epoch's weights: best/, and `tuner.load_best` gives them back into the example's
  model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, cli, kill_9_when, resumed_to_the_end
from tests.test_modes import _gone, _waiting
from tuner.sweepdir import read_metrics, trial_dirs

NO_TRANSFORMERS = "the transformers extra is not installed (pip install 'tuner[transformers]')"
pytest.importorskip("transformers", reason=NO_TRANSFORMERS)

LRS = [0.003, 0.01]
EPOCHS = 2
TASK = {
    "command": {
        "command": ["python", "tests/hf_task.py", "--lr", "{lr}", "--gate", "{gate}", "--epochs",
                    "{max_epochs}"],  # fmt: skip
        "checkpoints": True,
    },
    "train": {"train": "tests.hf_task:train"},
}


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[float, list[dict[str, Any]]]:
    """Each learning rate's epochs, the example run alone (no sweep)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "hf_task.py"), "--alone", *map(str, LRS), "--epochs",
         str(EPOCHS)],  # fmt: skip
        cwd=tmp_path_factory.mktemp("alone"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads(ln[len("ALONE ") :]) for ln in done.stdout.splitlines() if ln.startswith("ALONE ")]
    return {f["lr"]: f["rows"] for f in found}


def _same_epochs(journal: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    assert [r["epoch"] for r in journal] == [r["epoch"] for r in theirs] == [1, 2]
    for mine, row in zip(journal, theirs, strict=True):
        for name in ("eval_loss", "eval_accuracy", "loss"):
            assert mine[name] == pytest.approx(row[name], rel=1e-6, abs=1e-7), (name, mine, row)


def _raw(form: str, tmp_path: Path, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": f"hf-{form}",
        "metric": "eval_loss",
        "mode": "min",
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
    _gone(_waiting(gate))
    gate.touch()
    summary = resumed_to_the_end(sweep, 2)
    for t in summary["trials"]:
        trial = sweep / t["trial_id"]
        _same_epochs(read_metrics(str(trial)), alone[t["config"]["lr"]])
        assert "resumed at epoch 1" in (trial / "trial.log").read_text()
        assert list((trial / "framework").glob("checkpoint-*")), sorted(trial.rglob("*"))


@pytest.mark.usefixtures("ray_session")
def test_a_function_sweep_trains_as_alone_and_keeps_its_best_weights(tmp_path: Path, alone: Any) -> None:
    import torch

    import tuner
    from tests import hf_task

    sweep_file = tmp_path / "hf.yaml"
    sweep_file.write_text(json.dumps(_raw("train", tmp_path, {})))
    done = cli("sweep", str(sweep_file), cwd=ROOT, on_session=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sweep = tmp_path / "hf-train"
    summary = json.loads((sweep / "summary.json").read_text())
    for t in summary["trials"]:
        _same_epochs(read_metrics(str(sweep / t["trial_id"])), alone[t["config"]["lr"]])
    best = summary["best"]
    model = tuner.load_best(str(sweep), model=hf_task.hf_tiny.build_model({}))
    x = hf_task.hf_tiny.Counting(128, seed=2)
    with torch.no_grad():
        logits = model(input_ids=x.x, attention_mask=torch.ones_like(x.x)).logits
    loss = torch.nn.functional.cross_entropy(logits, x.y).item()
    assert loss == pytest.approx(best["metrics"]["eval_loss"], rel=1e-5)
