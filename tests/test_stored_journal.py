"""A checkpoint in object storage carries the trial's journal (tuner.trial.frame.stored):
Ray uploads a checkpoint during the report but the trial's other files in the background, so a
trial killed between the two found a checkpoint one epoch ahead of its journal in the bucket."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from tuner.sweepdir import CHECKPOINT_FILE, METRICS_FILE, read_metrics
from tuner.trial.frame.stored import journal_from, journal_into, newest_checkpoint


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


def _listing(remote: str, objects: dict[str, int]) -> dict[str, dict]:
    """What s3fs's find(remote, detail=True) gives: key -> details, LastModified in seconds."""
    return {
        f"{remote}/{rel}": {"LastModified": datetime.fromtimestamp(t, tz=timezone.utc), "type": "file"}
        for rel, t in objects.items()
    }


def test_the_newest_whole_checkpoint_is_continued_from_never_one_cut_short() -> None:
    remote = "bucket/runs/dk/trial_1"
    whole = {f"checkpoint_000001/{CHECKPOINT_FILE}": 10, f"checkpoint_000001/{METRICS_FILE}": 11}
    # Killed while Ray uploaded epoch 2's checkpoint: its journal landed, its state did not.
    cut = {f"checkpoint_000002/{METRICS_FILE}": 20}
    listed = _listing(remote, {**whole, **cut, METRICS_FILE: 21})
    assert newest_checkpoint(remote, listed) == "checkpoint_000001"
    # A resumed trial numbers from 0 again: the newest upload wins over the higher number.
    again = {f"checkpoint_000000/{CHECKPOINT_FILE}": 30, f"checkpoint_000000/{METRICS_FILE}": 30}
    assert newest_checkpoint(remote, _listing(remote, {**whole, **again})) == "checkpoint_000000"
    # The state without the journal beside whole ones: cut short too.
    state_only = {f"checkpoint_000003/{CHECKPOINT_FILE}": 40}
    assert newest_checkpoint(remote, _listing(remote, {**whole, **state_only})) == "checkpoint_000001"
    # Checkpoints from before they carried the journal: the state alone is whole.
    old = {f"checkpoint_000000/{CHECKPOINT_FILE}": 5, f"checkpoint_000001/{CHECKPOINT_FILE}": 6}
    assert newest_checkpoint(remote, _listing(remote, old)) == "checkpoint_000001"
    assert newest_checkpoint(remote, _listing(remote, {**cut, METRICS_FILE: 21})) is None
