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


def test_a_killed_runs_ended_trials_get_their_session_end_when_the_sweep_goes_on(tmp_path: Path) -> None:
    """The driver killed (-9) after a trial's record said it ended but before its HParams
    session end was written: the next run of the sweep writes it as the trial ended (a trial
    to be continued gets none). Seen under load in test_places: one trial of an s3 sweep
    without its status in TensorBoard, while the same trial on the local place had it."""
    from types import SimpleNamespace

    from tests.tbread import hparams
    from tuner.sweepdir import Place, write_record
    from tuner.sweepdir.files import METRICS_FILE

    place = Place(str(tmp_path))
    first = callbacks.HParamsCallback(place, {}, ["val_acc"])
    ended = {"done_1": "TERMINATED", "failed_2": "TERMINATED", "error_3": "ERROR", "cut_4": "RUNNING"}
    # Ended by their journals, the driver stopped before their records said so: one trained to
    # max_epochs (3), one failed. (Seen in a 1-worker run: a Ctrl-C as a trial reported its last
    # epoch, and its status never written.)
    ended.update(last_5="RUNNING", diverged_6="RUNNING")
    for name, status in ended.items():
        trial = SimpleNamespace(trial_id=name, config={}, path=str(tmp_path / name), last_result={})
        first.on_trial_start(0, [], trial)
        write_record(str(tmp_path / name), {"trial_id": name, "status": status, "started": 0.0})
    (tmp_path / "failed_2" / METRICS_FILE).write_text('{"epoch": 1, "failure": "diverged"}\n')
    rows = "".join(f'{{"epoch": {e}, "val_acc": 0.5}}\n' for e in (1, 2, 3))
    (tmp_path / "last_5" / METRICS_FILE).write_text(rows)
    (tmp_path / "diverged_6" / METRICS_FILE).write_text('{"epoch": 1, "failure": "diverged"}\n')
    (tmp_path / "cut_4" / METRICS_FILE).write_text('{"epoch": 1, "val_acc": 0.5}\n')
    # (killed here: no trial's end written)

    def ends() -> dict[str, object]:
        out = {}
        for name in ended:
            found = hparams(tmp_path / name).get("session_end")
            out[name] = None if found is None else found.status
        return out

    def next_run() -> None:  # a callback of the sweep's next run, set up as Tune does
        again = callbacks.HParamsCallback(place, {}, ["val_acc"])
        again.setup()
        callbacks.CatchUp(place, [again], ("val_acc", "max"), max_epochs=3).setup()

    assert set(ends().values()) == {None}
    next_run()
    want_ok = hparams_status(tb.session_end_summary("success"))
    want_failed = hparams_status(tb.session_end_summary("failure"))
    assert ends() == {
        **{"done_1": want_ok, "failed_2": want_failed, "error_3": want_failed, "cut_4": None},
        **{"last_5": want_ok, "diverged_6": want_failed},
    }
    next_run()  # (a third run adds nothing)
    written = [len(list((tmp_path / n).glob(f"*{callbacks.STATUS_FILE_SUFFIX}"))) for n in ended]
    assert written == [1, 1, 1, 0, 1, 1]


def hparams_status(summary: object) -> object:
    """The status an HParams session-end summary carries, as TensorBoard parses it."""
    from tensorboard.plugins.hparams import metadata

    (value,) = summary.value  # type: ignore[attr-defined]
    return metadata.parse_session_end_info_plugin_data(value.metadata.plugin_data.content).status
