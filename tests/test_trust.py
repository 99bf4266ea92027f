"""Results you can trust (issue 17): a resumed sweep runs exactly what it would have run
uninterrupted; a sweep directory is resumed where it is, by one run at a time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import debug_config
from tuner.algorithms import key
from tuner.sweep import SweepOutcome, resume_sweep, run_sweep

pytestmark = pytest.mark.slow
TRIALS = 4
RANGES = {
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "width": {"type": "randint", "low": 8, "high": 32},
}
SEARCHED = {
    "grid": {"lr": {"type": "grid", "values": [0.01, 0.03]}, "width": {"type": "grid", "values": [8, 16]}},
    "random": RANGES,
    "bohb": RANGES,
    "optuna": RANGES,
}
# The n-th trial model built interrupts the sweep (Ctrl-C): during the first trial (none
# finished), the second and the one before last (so that one is still to start).
INTERRUPT_AT = (1, 2, TRIALS - 1)


def _sweep(root: Path, algorithm: str, interrupt_at: int) -> SweepOutcome:
    root.mkdir()
    (root / "chaos").mkdir()
    params: dict[str, Any] = {
        **SEARCHED[algorithm],
        "depth": 1,
        "chaos_dir": str(root / "chaos"),
        "interrupt_at": interrupt_at,
        "driver_pid": os.getpid(),  # in-process: this test's process drives the sweep
    }
    cfg = debug_config(
        root,
        task__model="tests.interrupt:after_builds",
        search__algorithm=algorithm,
        search__params=params,
        search__num_samples=TRIALS,
        schedule__max_epochs=2,
        resources__max_concurrent_trials=1,  # one at a time: the n-th build comes after n-1 ends
    )
    return run_sweep(cfg)


def _configs(outcome: SweepOutcome, algorithm: str) -> list[str]:
    """The searched part of every trial's configuration, as sorted keys."""
    trials = outcome.summary["trials"]
    assert len({t["trial_id"] for t in trials}) == len(trials)
    return sorted(key({k: t["config"][k] for k in SEARCHED[algorithm]}) for t in trials)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algorithm", list(SEARCHED))
def test_resumed_sweep_runs_what_an_uninterrupted_one_runs(tmp_path: Path, algorithm: str) -> None:
    reference = _sweep(tmp_path / "whole", algorithm, interrupt_at=0)
    assert reference.exit_code == 0 and reference.summary["status"] == "completed"
    expected = _configs(reference, algorithm)
    assert len(expected) == TRIALS
    for at in INTERRUPT_AT:
        stopped = _sweep(tmp_path / f"at{at}", algorithm, interrupt_at=at)
        assert stopped.exit_code == 130, (at, stopped.summary["counts"])
        resumed = resume_sweep(stopped.sweep_dir)
        assert resumed.summary["status"] == "completed", (at, resumed.summary["counts"])
        got = _configs(resumed, algorithm)
        if algorithm in ("grid", "random"):  # lists fixed by the seed: the very same trials
            assert got == expected, at
        else:  # model-based: as many trials, none run twice
            assert len(got) == len(set(got)) == TRIALS, (at, got)
