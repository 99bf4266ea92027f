"""The trial-mode contract: every mode of tuner.config.modes keeps the same promises.

One sweep per mode, its smallest task (tests/mode_tasks.py, tests/mode_script.py): 2 trials
at once (the default), 2 epochs, on real Ray. Each mode

- is chosen by its task section, and refuses a task field it would ignore, in one line that
  names the field;
- runs and resumes: the sweep's driver is killed (-9) while both trials wait mid-way, past
  their epoch-1 checkpoints; `tuner resume` continues each from there (its trial.log says
  "resumed at epoch 1", its epoch-1 line is kept as it was) to its last epoch;
- reports: every epoch of every trial has the objective, and a mode that says what its trials
  report (`Mode.reports`: tuner's loop) reports nothing else;
- exports or refuses: a mode that keeps weights has `best/` holding the weights of the sweep's
  best epoch (the lowest val_loss of any trial's journal), and `tuner.load_best` gives a model
  with them (the user's model passed in where tuner cannot build one, which then says why); a
  mode that keeps none writes no `best/`, and export says why.

A mode added to MODES without a task here fails test_every_mode_has_a_contract_task.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import tuner
from tests.conftest import cli, gated_script, gone, kill_9_when
from tests.mode_tasks import Net
from tuner.config import ConfigError, parse_sweep
from tuner.config.modes import MODES
from tuner.results import NOT_METRICS
from tuner.sweepdir import BEST_DIR, EXPORT_FILES, SUMMARY_FILE, TRIAL_LOG, read_metrics, trial_dirs
from tuner.trial.frame.spec import TrialSpec
from tuner.view.export import export

LOOP = {"model": "tests.mode_tasks:model", "data": "tests.mode_tasks:data"}
SCRIPT = gated_script("tests/mode_script.py")
TASKS: dict[str, dict[str, Any]] = {
    "loop": LOOP,
    "hooks": {**LOOP, "metrics": "tests.mode_tasks:error"},
    "train": {"train": "tests.mode_tasks:train"},
    "command": {"command": SCRIPT, "checkpoints": True},
}
# A value other than the default of each task field that chooses no mode (the refusal check).
STRAY = {"model": "mlp", "data": "digits", "launcher": "torchrun", "checkpoints": True, "exit_grace": 1.0}


def _raw(name: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "name": f"mode-{name}",
        "metric": "val_loss",
        "direction": "min",
        "task": TASKS[name],
        "search": {
            # Two trials of different configurations (random search may draw one twice).
            "algorithm": "grid",
            "params": {"lr": {"type": "choice", "values": [0.05, 0.1]}, "gate": str(tmp_path / "gate")},
        },
        "schedule": {"max_epochs": 2, "early_stopping": False},  # both trials reach epoch 2
        "output": str(tmp_path),
    }


def _waiting(gate: Path) -> list[int]:
    """The processes waiting at the gate (each left a file `<gate>.<pid>`)."""
    return [int(p.suffix[1:]) for p in gate.parent.glob(f"{gate.name}.*")]


def test_every_mode_has_a_contract_task() -> None:
    assert set(TASKS) == set(MODES)


@pytest.mark.parametrize("name", list(MODES))
def test_every_mode_names_a_trial_function_in_a_room_of_trial(name: str) -> None:
    """`Mode.runs` is read only when a trial starts: a typo would fail every trial, not validate."""
    module, function = MODES[name].runs.split(":")
    path = Path(tuner.__file__).parent.parent / (module.replace(".", "/") + ".py")
    assert module.startswith("tuner.trial.") and path.is_file(), MODES[name].runs
    defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
    assert function in defined, MODES[name].runs


def test_a_trial_spec_runs_its_mode_only() -> None:
    """What a trial runs is its spec's mode: a field of another mode's function beside it is
    refused (a spec built with command=... and the default mode once ran tuner's loop)."""
    TrialSpec(model="", data="", trial_mode="command", command=["python", "x.py"])
    TrialSpec(model="mlp", data="digits", metrics="tests.mode_tasks:error")  # hooks: the same loop
    with pytest.raises(ValueError, match="command is set but trial_mode is 'loop'"):
        TrialSpec(model="", data="", command=["python", "x.py"])
    with pytest.raises(ValueError, match="train is set but trial_mode is 'command'"):
        TrialSpec(model="", data="", trial_mode="command", command=["x"], train="a:b")


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("name", list(TASKS))
def test_every_mode_keeps_the_contract(name: str, tmp_path: Path) -> None:
    mode, raw = MODES[name], _raw(name, tmp_path)
    # Chosen by its task section; a field it would ignore is refused, by name.
    assert parse_sweep(copy.deepcopy(raw)).trial_mode is mode
    stray = next(f for f in STRAY if f not in mode.fields)
    bad = copy.deepcopy(raw)
    bad["task"][stray] = STRAY[stray]
    with pytest.raises(ConfigError) as refused:
        parse_sweep(bad)
    assert refused.value.path == f"task.{stray}", refused.value

    # Runs; killed while both trials wait mid-way, past their epoch-1 checkpoints.
    gate = tmp_path / "gate"
    sweep = kill_9_when(raw, tmp_path, lambda _: len(_waiting(gate)) == 2)
    gone(*_waiting(gate))  # (none may go on writing once the gate opens)
    before = {d: read_metrics(d) for d in trial_dirs(str(sweep))}
    assert len(before) == 2 and all([r["epoch"] for r in rows] == [1] for rows in before.values()), before

    # Resumes: each trial from its checkpoint, to its last epoch.
    gate.touch()
    out = cli("resume", str(sweep), on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"resuming mode-{name}: 0 trials finished, 2 to continue" in out.stdout, out.stdout
    summary = json.loads((sweep / SUMMARY_FILE).read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == 2, summary
    journals = {d: read_metrics(d) for d in trial_dirs(str(sweep))}
    for d, rows in journals.items():
        assert [r["epoch"] for r in rows] == [1, 2] and rows[0] == before[d][0], (d, rows)
        assert "resumed at epoch 1" in (Path(d) / TRIAL_LOG).read_text(), d

    # Reports: the objective every epoch; what the mode says its trials report, and no more.
    rows = [r for journal in journals.values() for r in journal]
    assert all(isinstance(r["val_loss"], float) and math.isfinite(r["val_loss"]) for r in rows), rows
    if mode.reports is not None:
        declared = mode.reports(parse_sweep(copy.deepcopy(raw)).task)
        reported = {k for r in rows for k in r} - NOT_METRICS - {"epoch"}
        assert {k for k in reported if k not in declared} == set(), reported

    # Exports, or refuses saying why.
    if mode.best_checkpoint:  # (a script's: its best epoch's own checkpoint directory, copied)
        best = json.loads((sweep / BEST_DIR / "metrics.json").read_text())
        assert best["val_loss"] == min(r["val_loss"] for r in rows), best
        kept = json.loads((sweep / BEST_DIR / "checkpoint" / "state.json").read_text())
        assert kept == {"epoch": best["epoch"]}, kept
        with pytest.raises(ConfigError, match=re.escape(mode.cannot_rebuild)):
            tuner.load_best(str(sweep))
        return
    if not mode.keeps_weights:
        assert not (sweep / BEST_DIR).exists()
        with pytest.raises(ConfigError, match=re.escape(mode.no_weights)):
            export(str(sweep))
        return
    best = json.loads((sweep / BEST_DIR / "metrics.json").read_text())
    assert best["val_loss"] == min(r["val_loss"] for r in rows), best
    weights = torch.load(sweep / BEST_DIR / EXPORT_FILES["state_dict"])
    if mode.cannot_rebuild is None:
        model = tuner.load_best(str(sweep))
    else:
        with pytest.raises(ConfigError, match=re.escape(mode.cannot_rebuild)):
            tuner.load_best(str(sweep))
        model = tuner.load_best(str(sweep), model=Net(str(gate)))
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
