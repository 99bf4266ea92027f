"""Files a trial writes about itself: its metrics, one JSON line per epoch, tracebacks, and
the format of its log (trial.log: rank 0's logger, `harness.trial_logger`, and `log_line`).

Written by the trial (rank 0) and flushed each epoch, these are what `tuner.results` reads
(through tuner.sweepdir, which names the files): Ray's own result.json is written by the
driver through a buffer and synced from a staging directory, so a killed driver loses its
tail.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

from tuner.sweepdir import METRICS_FILE, NOTICE, TRACEBACK_FILE, TRIAL_LOG, read_metrics, write_atomic

__all__ = [
    "LOG_FORMAT",
    "NOTICE",
    "MetricsLog",
    "NullMetricsLog",
    "report_again",
    "sole_writer",
    "log_line",
    "read_metrics",
    "write_atomic",
    "write_traceback",
]

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"  # a line of trial.log


def log_line(trial_dir: str, message: str) -> None:
    """One INFO line in the trial's log, from a process other than the one whose logger
    writes it (rank 0's); nothing where the trial has no directory here."""
    if not os.path.isdir(trial_dir):
        return
    record = logging.makeLogRecord({"msg": message, "levelname": "INFO"})
    with open(os.path.join(trial_dir, TRIAL_LOG), "a") as f:
        f.write(logging.Formatter(LOG_FORMAT).format(record) + "\n")


def report_again(trial_dir: Optional[str], report: Callable[[dict[str, Any]], None]) -> None:
    """Report the journal's last epoch again, for a run of a trial that ended without a report
    of its own: it was restored at its last epoch (recorded, then the driver was killed before
    Tune heard of it: the resumed run has nothing left to train), or its own code ended it at
    once. Tune then ends the trial with that epoch's metrics, as the run that recorded it would
    have, rather than with none (which fails the whole sweep where a scheduler or searcher
    names the metric). Nothing when the trial has no epoch recorded."""
    rows = read_metrics(trial_dir) if trial_dir else []
    if rows:
        report({k: v for k, v in rows[-1].items() if k != "wall_time"})


@contextmanager
def sole_writer(trial_dir: Optional[str], log: logging.Logger) -> Iterator[None]:
    """This run of the trial as the only writer of its directory while it runs (an exclusive
    `flock` on the directory itself: no file of its own, dropped by the kernel however the
    process ends).

    A run of the trial that is still alive holds it: the trial process of a driver killed with
    -9, which Ray ends a moment after the driver, may still append an epoch and save its
    checkpoint after a resumed sweep has read the trial as unfinished. This run waits until it
    is gone and then reads the journal and checkpoints as that run left them, never while they
    change under it. Where the filesystem has no such locks (some network ones), nothing.
    """
    fd = -1
    if trial_dir and os.path.isdir(trial_dir):
        with contextlib.suppress(OSError):
            fd = os.open(trial_dir, os.O_RDONLY)
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.warning("an earlier run of this trial is still writing its files: waiting until it ends")
                fcntl.flock(fd, fcntl.LOCK_EX)
                log.info("the earlier run of this trial ended: this one continues from its files")
            except OSError:
                pass  # (no locks here)
        yield
    finally:
        if fd >= 0:
            os.close(fd)


class MetricsLog:
    """Appends one line per epoch; on resume, drops lines past the checkpoint's epoch."""

    def __init__(self, trial_dir: str):
        self.path = os.path.join(trial_dir, METRICS_FILE)

    def resume_at(self, epoch: int) -> None:
        """Keep the history up to `epoch` (the checkpoint's): later epochs will run again."""
        rows = read_metrics(os.path.dirname(self.path))
        kept = [r for r in rows if int(r.get("epoch", 0)) <= epoch]
        if len(kept) != len(rows):
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def append(self, metrics: dict[str, Any]) -> None:
        row = {**metrics, "wall_time": round(time.time(), 3)}  # when the epoch ended
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def amend(self, metrics: dict[str, Any], epoch: int) -> None:
        """Add `metrics` to the last line, when it is `epoch`'s."""
        rows = read_metrics(os.path.dirname(self.path))
        if not rows or int(rows[-1].get("epoch", -1)) != epoch:
            return
        rows[-1] = {**rows[-1], **metrics}
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in rows))


class NullMetricsLog:
    """What ranks other than 0 keep: nothing."""

    def resume_at(self, epoch: int) -> None: ...
    def append(self, metrics: dict[str, Any]) -> None: ...
    def amend(self, metrics: dict[str, Any], epoch: int) -> None: ...


def traceback_name(rank: int) -> str:
    """The file a rank's traceback goes to: rank 0's is the trial's (traceback.txt)."""
    return TRACEBACK_FILE if rank == 0 else f"traceback_rank{rank}.txt"


def write_traceback(trial_dir: Optional[str], rank: int, text: Optional[str] = None) -> None:
    """Save the exception being handled (or `text`, a traceback from elsewhere) next to the
    trial's other files."""
    if not trial_dir:
        return
    with open(os.path.join(trial_dir, traceback_name(rank)), "w") as f:
        f.write(traceback.format_exc() if text is None else text)
