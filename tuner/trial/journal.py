"""Files a trial writes about itself: its metrics, one JSON line per epoch, and tracebacks.

Written by the trial (rank 0) and flushed each epoch, these are what `tuner.results` reads:
Ray's own result.json is written by the driver through a buffer and synced from a staging
directory, so a killed driver loses its tail.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from typing import Any, Optional

METRICS_FILE = "metrics.jsonl"
TRACEBACK_FILE = "traceback.txt"
NOTICE = "notice"  # a result key: what the trial worked around (a damaged checkpoint), for the driver to say


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


class NullMetricsLog:
    """What ranks other than 0 keep: nothing."""

    def resume_at(self, epoch: int) -> None: ...
    def append(self, metrics: dict[str, Any]) -> None: ...


def read_metrics(trial_dir: Optional[str]) -> list[dict[str, Any]]:
    """The epochs a trial recorded, oldest first (a line cut short by a kill is skipped)."""
    if not trial_dir:
        return []
    path = os.path.join(trial_dir, METRICS_FILE)
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if _is_row(row):
                rows.append(row)
    return rows


def _is_row(row: Any) -> bool:
    """An epoch's record as the loop writes it: an object with an integer epoch (valid JSON of
    another shape, written by hand or by another tool, is skipped like a cut-short line)."""
    epoch = row.get("epoch") if isinstance(row, dict) else None
    return isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` at once: readers never see half a file, and a failed write
    (a full disk) leaves neither half a file nor its temporary behind."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_traceback(trial_dir: Optional[str], rank: int) -> None:
    """Save the exception being handled next to the trial's other files."""
    if not trial_dir:
        return
    name = TRACEBACK_FILE if rank == 0 else f"traceback_rank{rank}.txt"
    with open(os.path.join(trial_dir, name), "w") as f:
        f.write(traceback.format_exc())
