"""The HParams event files the driver writes (tuner.driver.callbacks): one file per summary,
found even when Tune creates a trial's directory beside it at the same moment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner.driver import callbacks
from tuner.trial.frame import tb


def test_a_directory_made_beside_the_event_file_is_not_taken_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    close = tb.EventWriter.close

    def close_while_tune_makes_a_trial_dir(self: tb.EventWriter) -> None:
        close(self)
        (tmp_path / "a1b2c3d4").mkdir()  # as Tune queues a trial in the sweep's root

    monkeypatch.setattr(tb.EventWriter, "close", close_while_tune_makes_a_trial_dir)
    written = callbacks._write(str(tmp_path), tb.session_end_summary("success"), ".experiment")
    assert os.path.basename(written).startswith("events.out.tfevents.") and written.endswith(".experiment")
    assert os.path.isfile(written)
