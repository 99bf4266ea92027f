"""A checkpoint in object storage carries the trial's journal (tuner.trial.frame.stored):
Ray uploads a checkpoint during the report but the trial's other files in the background, so a
trial killed between the two found a checkpoint one epoch ahead of its journal in the bucket."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.sweepdir import METRICS_FILE, read_metrics
from tuner.trial.frame.stored import journal_from, journal_into


def _journal(directory: Path, epochs: list[int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"epoch": e, "val_loss": 1 / e}) + "\n" for e in epochs]
    (directory / METRICS_FILE).write_text("".join(rows))


def _epochs(directory: Path) -> list[int]:
    return [int(r["epoch"]) for r in read_metrics(str(directory))]


def test_a_checkpoint_ahead_of_the_brought_back_journal_gives_the_trial_its_epochs(tmp_path: Path) -> None:
    node_a, ckpt, node_b = tmp_path / "a", tmp_path / "ckpt", tmp_path / "b"
    _journal(node_a, [1, 2, 3])  # epoch 3 recorded, then its checkpoint made
    ckpt.mkdir()
    journal_into(str(ckpt), str(node_a))
    _journal(node_b, [1, 2])  # what reached the bucket of the trial's files before the kill
    journal_from(str(ckpt), str(node_b))
    assert _epochs(node_b) == [1, 2, 3]


def test_a_journal_further_than_the_checkpoint_is_kept_for_the_trim(tmp_path: Path) -> None:
    # Killed after epoch 4's journal line, before its checkpoint: the journal is kept (the
    # trial then trims it back to the checkpoint's epoch 3 and runs epoch 4 again).
    ckpt, here = tmp_path / "ckpt", tmp_path / "here"
    _journal(ckpt, [1, 2, 3])
    _journal(here, [1, 2, 3, 4])
    journal_from(str(ckpt), str(here))
    assert _epochs(here) == [1, 2, 3, 4]
    journal_from(str(tmp_path / "no-journal"), str(here))  # an older checkpoint without one
    assert _epochs(here) == [1, 2, 3, 4]
