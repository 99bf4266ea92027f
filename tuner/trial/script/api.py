"""What a training script run by `task.command` calls: `tuner.report`, `tuner.checkpoint_dir`,
`tuner.restore_dir` (re-exported by the `tuner` package), and the environment they read.

Standard library only, so `import tuner` in a script costs no torch or Ray import. Outside a
sweep (no TUNER_REPORT_FILE in the environment) `report` prints the metrics (on rank 0 alone
under torchrun) and does nothing else, `checkpoint_dir` and `restore_dir` return None: the
script runs alone as before.

In a sweep the trial (tuner.trial.script.run) sets:

    TUNER_REPORT_FILE     where `report` appends one JSON object per epoch
    TUNER_CHECKPOINT_DIR  the trial's checkpoints, one directory per epoch: epoch_NNNNNN
    TUNER_RESTORE_DIR     the newest of them, when the trial resumes (else unset)
    TUNER_CONFIG_JSON     the trial's parameters as a JSON object
    TUNER_PARAM_<NAME>    each parameter (strings as they are, other values as JSON)
    TUNER_TRIAL_ID, TUNER_TRIAL_DIR, TUNER_MAX_EPOCHS

A script that cannot import tuner prints `TUNER_REPORT {"epoch": 1, "val_loss": 0.5}` instead
(PREFIX, then one JSON object, on a line of its own), optionally with "checkpoint": the path
of a directory it wrote inside $TUNER_CHECKPOINT_DIR for that epoch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Optional

PREFIX = "TUNER_REPORT "  # a stdout line starting with it is a report
REPORT_FILE = "TUNER_REPORT_FILE"
CHECKPOINT_DIR = "TUNER_CHECKPOINT_DIR"
RESTORE_DIR = "TUNER_RESTORE_DIR"
CONFIG_JSON = "TUNER_CONFIG_JSON"
TRIAL_ID, TRIAL_DIR, MAX_EPOCHS = "TUNER_TRIAL_ID", "TUNER_TRIAL_DIR", "TUNER_MAX_EPOCHS"
PENDING = ".pending-"  # a checkpoint being written: not yet an epoch's

_pending: Optional[str] = None  # the directory checkpoint_dir() handed out for this epoch


def _is_main() -> bool:
    """Rank 0, or not a torchrun worker: only its reports and checkpoints count."""
    return os.environ.get("RANK", "0") == "0"


def report(epoch: int, **metrics: Any) -> None:
    """One epoch done: `epoch` counts epochs completed (1 after the first; on from the
    restored epoch after a resume), `metrics` are numbers (or strings; the sweep's metric
    must be a number), e.g. `tuner.report(epoch=3, val_loss=0.21, val_acc=0.93)`. In a sweep
    the trial's scheduler, journal and TensorBoard get them, with the checkpoint written into
    `checkpoint_dir()` since the last report; outside one rank 0 prints them. The epoch
    reported last, reported again, gains the new metrics (a final test metric)."""
    global _pending
    row: dict[str, Any] = {"epoch": _number("epoch", epoch)}
    row.update((k, _number(k, v)) for k, v in metrics.items())
    if not isinstance(row["epoch"], int):
        raise TypeError(f"tuner.report: epoch must be an integer, got {epoch!r}")
    if not _is_main():
        return
    path = os.environ.get(REPORT_FILE)
    if not path:
        _say("tuner.report: " + ", ".join(f"{k}={v}" for k, v in row.items()))
        return
    if _pending is not None:
        row["checkpoint"], _pending = _pending, None
    line = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of an appended line: the trial never reads half of it
    finally:
        os.close(fd)


def _say(text: str) -> None:
    """`text` as one line on stdout in one write: torchrun's ranks share that stdout, and
    another rank's output lands between the writes of a print (its words, its newline) but
    never inside one write of a pipe's size."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by a stream without a file
        print(text, flush=True)
        return
    sys.stdout.flush()  # what the script printed before comes first
    data = (text + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def checkpoint_dir() -> Optional[str]:
    """An empty directory to save this epoch's checkpoint in, before `report`: that report
    makes it the epoch's checkpoint. None outside a sweep, and on ranks other than 0."""
    global _pending
    root = os.environ.get(CHECKPOINT_DIR)
    if not root or not _is_main():
        return None
    if _pending is None or not os.path.isdir(_pending):
        os.makedirs(root, exist_ok=True)
        _pending = tempfile.mkdtemp(prefix=PENDING, dir=root)
    return _pending


def restore_dir() -> Optional[str]:
    """The checkpoint directory to resume from (the newest epoch's, as the script saved it)
    when the trial continues (retried, resumed, paused); None when it starts afresh."""
    return os.environ.get(RESTORE_DIR) or None


def _number(key: str, value: Any) -> Any:
    """A plain number (a 0-d tensor or numpy scalar read once) or a string."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"tuner.report: {key} is a {type(value).__name__}, not a number")
    if isinstance(value, float) and value.is_integer() and key == "epoch":
        return int(value)
    return value  # NaN and inf too: the trial ends as diverged on a non-finite metric
