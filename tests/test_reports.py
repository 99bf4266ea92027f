"""What trials report, the way users' code reports it (issue 26), at the default concurrency
(two trials at once) under random search with ASHA, the default scheduler:

- an objective that is not a number ends its trial (its earlier epochs kept) and never the
  sweep, a script's or `ctx.report`'s; one past a float's range ends it as diverged;
- a final metric after training (the last epoch reported again) joins that epoch;
- a script that reports past max_epochs, or that never exits after its last epoch (even
  under schedule.trial_timeout), keeps its epochs and completes.

(`schedule.stop_at` at the default concurrency: tests/test_life.py.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, debug_config
from tests.test_command import _raw, _scripts_of
from tuner.config import parse_sweep
from tuner.driver.sweep import AlreadyFinished, resume_sweep, run_sweep
from tuner.sweepdir import read_metrics


def _by(summary: dict[str, Any], key: str) -> dict[Any, dict[str, Any]]:
    return {t["config"][key]: t for t in summary["trials"]}


@pytest.mark.parametrize("algorithm", ["random", "grid"])
@pytest.mark.usefixtures("ray_session")
def test_a_metric_that_is_not_a_number_ends_its_trial_never_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    monkeypatch.chdir(ROOT)  # the scripts run where the sweep starts
    raw = _raw(tmp_path, name=f"nan-{algorithm}")
    raw["search"]["algorithm"] = algorithm
    raw["search"]["params"] = {
        "kind": {"type": "grid", "values": ["text", "api", "huge"]},
        "lr": 0.01,
        "sleep": 0.2,
    }
    raw["search"]["num_samples"] = 3
    raw["schedule"] = {"max_epochs": 3, "grace_epochs": 1, "reduction_factor": 2}
    out = run_sweep(parse_sweep(raw))
    summary = json.loads((Path(out.sweep_dir) / "summary.json").read_text())
    kinds = _by(summary, "kind")
    assert out.exit_code == 1 and summary["status"] == "completed", summary["counts"]
    text, huge, api = kinds["text"], kinds["huge"], kinds["api"]
    assert text["status"] == "ERROR" and "val_loss='abc' at epoch 2" in text["failure"], text
    assert "must be a number" in text["failure"]
    assert huge["failure"] == "diverged", huge
    last = read_metrics(str(Path(out.sweep_dir) / huge["trial_id"]))[-1]
    assert last["failure_detail"] == "non-finite val_loss at epoch 2"
    assert api["status"] == "TERMINATED" and api["failure"] is None and api["epochs"] == 3
    # The epochs before the bad report are results (val_loss = 10 * lr + 1 / epoch).
    for t in (text, huge):
        assert t["best_epoch"] == 1 and math.isclose(t["best_value"], 0.1 + 1.0), t
        assert [r["epoch"] for r in read_metrics(str(Path(out.sweep_dir) / t["trial_id"]))][0] == 1
    with pytest.raises(AlreadyFinished):  # and nothing is left that could crash a resume
        resume_sweep(out.sweep_dir)


@pytest.mark.usefixtures("ray_session")
def test_ctx_report_of_a_string_ends_the_trial_and_a_final_metric_joins_the_last_epoch(
    tmp_path: Path,
) -> None:
    cfg = debug_config(
        tmp_path,
        name="own",
        metric="val_loss",
        direction="min",
        task={"train": "tests.own_loops:regress"},
        search__params={
            "behave": {"type": "grid", "values": ["text", "final", "ok"]},
            "lr": 0.05,
            "batch_size": 32,
        },
        search__num_samples=3,
        schedule__max_epochs=3,
    )
    out = run_sweep(cfg)
    behaves = _by(out.summary, "behave")
    text, final, ok = behaves["text"], behaves["final"], behaves["ok"]
    assert text["status"] == "ERROR" and "val_loss='abc' at epoch 2" in text["failure"], text
    assert final["status"] == "TERMINATED" and final["epochs"] == 3 and final["failure"] is None, final
    # ASHA stops a trial at max_epochs when it hears of that epoch: the last epoch reached it
    # once the function returned, so the code after the loop ran, and its metric is there.
    rows = read_metrics(str(Path(out.sweep_dir) / final["trial_id"]))
    assert [r["epoch"] for r in rows] == [1, 2, 3] and "test_loss" in rows[-1]
    assert final["last_metrics"]["test_loss"] == rows[-1]["test_loss"] > 0
    # The same configuration without the final report trained the same epochs.
    assert final["last_metrics"]["val_loss"] == ok["last_metrics"]["val_loss"]


@pytest.mark.usefixtures("ray_session")
def test_a_script_after_its_last_epoch_final_metric_past_the_end_never_exiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    raw = _raw(tmp_path, name="after")
    raw["task"]["exit_grace"] = 6
    # Every trial trains to its last epoch: no early stopping (ASHA would compare the trials'
    # first epochs in whatever order two trials started together report them).
    raw["search"]["params"] = {
        "kind": {"type": "grid", "values": ["final", "past", "linger"]},
        "lr": {"type": "grid", "values": [0.03, 0.02, 0.01]},
        "sleep": 0.3,
    }
    raw["search"]["num_samples"] = 3
    # A watchdog that fired after the last epoch used to make the best trial a timeout.
    raw["schedule"] = {"max_epochs": 3, "early_stopping": False, "trial_timeout": 4}
    out = run_sweep(parse_sweep(raw))
    assert out.exit_code == 0 and out.summary["status"] == "completed", out.summary
    kinds = _by(out.summary, "kind")
    sweep = Path(out.sweep_dir)
    for kind, t in kinds.items():
        assert t["status"] == "TERMINATED" and t["failure"] is None and t["epochs"] == 3, (kind, t)
    assert out.summary["counts"] == {"completed": 3}
    final = kinds["final"]
    assert math.isclose(final["last_metrics"]["test_loss"], 10 * 0.03 + 0.5)
    assert read_metrics(str(sweep / final["trial_id"]))[-1]["test_loss"] == final["last_metrics"]["test_loss"]
    past_log = (sweep / kinds["past"]["trial_id"] / "trial.log").read_text()
    assert "reported epoch 4, past max_epochs (3): stopped" in past_log
    linger_log = (sweep / kinds["linger"]["trial_id"] / "trial.log").read_text()
    assert "had not exited 6 s later" in linger_log and "timeout" not in linger_log
    assert out.summary["best"]["trial_id"] == kinds["linger"]["trial_id"]
    assert not _scripts_of(sweep)  # the lingering script was stopped
