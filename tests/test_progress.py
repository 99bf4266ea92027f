"""The progress a sweep prints (driver/callbacks.py's Progress), driven as Tune drives it, without
Ray: a line per trial that ends, and on a terminal one live line whose last state agrees with
the table printed under it."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _trial(trial_dir: Path, status: str = "RUNNING", **last: Any) -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=trial_dir.name, path=str(trial_dir), status=status, last_result=last, config={}
    )


def test_each_trials_done_line_gives_its_best_epoch_not_its_last(tmp_path: Path) -> None:
    from tuner.driver.callbacks import Progress

    out = io.StringIO()  # not a terminal: a line per trial that ends
    progress = Progress("val_loss", "min", 1, stream=out)
    trial = _trial(tmp_path / "a")
    progress.on_trial_start(0, [trial], trial)
    for epoch, value in enumerate([0.5, 0.3, 0.4], start=1):
        progress.on_trial_result(0, [trial], trial, {"epoch": epoch, "val_loss": value})
    trial.last_result = {"epoch": 3, "val_loss": 0.4, "done": True}
    progress.on_trial_complete(0, [trial], trial)
    assert out.getvalue().startswith(
        "[tuner] trial a done after 3 epoch(s): best val_loss 0.3 at epoch 2 · 1/1 done"
    )


def test_after_ctrl_c_the_live_line_says_what_the_table_under_it_says(tmp_path: Path) -> None:
    """Ctrl-C: trial b is stopped at its next report, unfinished (its record says so, and
    `resume` continues it), and its journal holds an epoch whose report the driver never took
    in. The live line counts b as unfinished, not done, and its last state gives the counts
    and the best of the summary the table is printed from."""
    from tuner.driver.callbacks import Progress, TrialRecordCallback
    from tuner.driver.stopping import INTERRUPTED
    from tuner.results import leaderboard, records, summarize
    from tuner.trial.frame.journal import MetricsLog

    screen = _Terminal()
    progress, recorder = Progress("val_loss", "min", 2, stream=screen), TrialRecordCallback()
    a, b = _trial(tmp_path / "a"), _trial(tmp_path / "b")
    for t in (a, b):
        recorder.on_trial_start(0, [a, b], t)
        progress.on_trial_start(0, [a, b], t)

    def report(t: SimpleNamespace, epoch: int, value: float, seen: bool = True) -> None:
        MetricsLog(t.path).append({"epoch": epoch, "val_loss": value})  # what the trial itself keeps
        if seen:
            progress.on_trial_result(0, [a, b], t, {"epoch": epoch, "val_loss": value})

    for epoch, value in enumerate([0.5, 0.45, 0.47], start=1):
        report(a, epoch, value)
    a.last_result, a.status = {"epoch": 3, "val_loss": 0.47, "done": True}, "TERMINATED"
    for callback in (recorder, progress):
        callback.on_trial_complete(0, [a, b], a)
    report(b, 1, 0.4)
    report(b, 2, 0.2, seen=False)  # trained and journaled; the report was cut off by the stop
    try:
        INTERRUPTED.set()
        b.last_result = {"epoch": 1, "val_loss": 0.4}
        for callback in (recorder, progress):
            callback.on_trial_complete(0, [a, b], b)
        b.status = "TERMINATED"  # (as Tune marks a trial it stopped)
        progress._last_draw = 0.0
        progress.on_step_end(0, [a, b])
        assert (
            "1/2 done · 0 running · 0 pending · 1 unfinished" in screen.getvalue().rsplit("\r\033[K", 1)[-1]
        )
    finally:
        INTERRUPTED.clear()
    trials = records(str(tmp_path), "val_loss", "min", 3, [])  # (3 epochs planned: b cut off after 2)
    summary = summarize(
        trials, name="s", metric="val_loss", direction="min", algorithm="random", expected_trials=2
    )
    table = leaderboard(trials, [("val_loss", "min")])
    progress.close(summary)
    last = screen.getvalue().rsplit("\r\033[K", 1)[-1]
    assert last.startswith(
        "[tuner] 1/2 done · 0 running · 0 pending · 1 unfinished · best val_loss 0.2 (b) · "
    )
    assert summary["counts"] == {"completed": 1, "unfinished": 1} and summary["best"]["trial_id"] == "b"
    assert table.splitlines()[1].split()[:2] == ["b", "0.2"], table  # the table's best row
