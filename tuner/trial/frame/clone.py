"""One trial's checkpoint handed to another: `copy_checkpoint(src, dst, epoch)`, the shape of
syne-tune's backend primitive, for every place a trial keeps checkpoints.

Population-based training (tuner.search.pbt) continues a poor trial from a good one's weights:
while both wait at the same epoch, the good one's checkpoint of that epoch replaces the poor
one's own, and the poor one, restarted, resumes from its newest checkpoint as any resumed
trial does. So every way a trial resumes takes the donor's state with nothing of its own to
learn: tuner's loop and hooks (`checkpoint_eNNNNNN.pt`), `task.train` (the same file: its
`ctx.restore()` gives the donor's state), `task.command` (the `checkpoints/epoch_NNNNNN/`
directory the script is restarted on, as $TUNER_RESTORE_DIR), a multi-worker trial (rank 0
reads it and sends it to every rank), and a sweep in object storage (the state file of the
trial's newest checkpoint in the bucket, which Tune hands back when the trial resumes).

Each copy replaces the file or directory at once (a rename; in the bucket, one object PUT),
so a kill mid-copy leaves the trial's own checkpoint or the donor's, never half of one, and
copying again is the same copy. Bytes only: no torch here (the sweep's driver calls it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from typing import Any, Optional

from tuner.sweepdir import (
    BEST_RECORD,
    CHECKPOINT_FILE,
    CHECKPOINT_PATTERN,
    METRICS_FILE,
    SCRIPT_CHECKPOINT_PATTERN,
    SCRIPT_CHECKPOINTS,
    checkpoint_name,
    read_best_checkpoint,
    read_metrics,
    script_checkpoint_name,
)
from tuner.trial.frame.checkpoint import numbered, replace_atomic

_OWN = re.compile(CHECKPOINT_PATTERN)
_SCRIPT = re.compile(SCRIPT_CHECKPOINT_PATTERN)
_PENDING = ".pending-"  # the script's half-made directories (trial.script.api.PENDING): cleaned at its start


class NoCheckpoint(FileNotFoundError):
    """The donor has no checkpoint of the epoch asked for."""


def checkpoint_epoch(trial_dir: str) -> Optional[int]:
    """The epoch of a trial's newest checkpoint in its directory (tuner's file, or a script's
    directory), or None when it has none."""
    epochs = numbered(trial_dir, _OWN) + numbered(os.path.join(trial_dir, SCRIPT_CHECKPOINTS), _SCRIPT)
    return max(epochs, default=None)


def copy_checkpoint(src: str, dst: str, epoch: int) -> str:
    """Make trial directory `dst`'s checkpoint of `epoch` a copy of `src`'s; returns the path
    written. Checkpoints of `dst` past `epoch` are removed (it resumes from `epoch`).
    NoCheckpoint when `src` has no checkpoint of `epoch`."""
    own = os.path.join(src, checkpoint_name(epoch))
    script = os.path.join(src, SCRIPT_CHECKPOINTS, script_checkpoint_name(epoch))
    if os.path.isfile(own):
        final = replace_atomic(
            os.path.join(dst, checkpoint_name(epoch)), lambda tmp: shutil.copyfile(own, tmp)
        )
        _drop_later(dst, _OWN, epoch, lambda e: os.remove(os.path.join(dst, checkpoint_name(e))))
        return final
    if os.path.isdir(script):
        best = read_best_checkpoint(dst)
        if best is not None and int(best["epoch"]) == epoch:
            # Its best epoch's directory becomes the donor's: best.json must not name the
            # donor's state as this trial's (its value at the epoch stays in its journal).
            # (Before the swap: a kill between the two leaves no best.json naming the donor.)
            os.remove(os.path.join(dst, BEST_RECORD))
        root = os.path.join(dst, SCRIPT_CHECKPOINTS)
        os.makedirs(root, exist_ok=True)
        new = tempfile.mkdtemp(dir=root, prefix=_PENDING + "clone-")
        shutil.copytree(script, new, dirs_exist_ok=True)
        final = os.path.join(root, script_checkpoint_name(epoch))
        if os.path.exists(final):  # a directory cannot be replaced by a rename: moved aside first
            old = tempfile.mkdtemp(dir=root, prefix=_PENDING + "replaced-")
            os.replace(final, os.path.join(old, "x"))
            os.replace(new, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(new, final)
        drop = lambda e: shutil.rmtree(os.path.join(root, script_checkpoint_name(e)), ignore_errors=True)  # noqa: E731
        _drop_later(root, _SCRIPT, epoch, drop)
        return final
    raise NoCheckpoint(f"{src} has no checkpoint of epoch {epoch}")


def _drop_later(root: str, pattern: re.Pattern[str], epoch: int, remove: Any) -> None:
    for later in numbered(root, pattern):
        if later > epoch:
            with contextlib.suppress(OSError):
                remove(later)


# ----------------------------------------------------------------------------- object storage


def stored_checkpoint_epoch(fs: Any, trial: str) -> Optional[int]:
    """For a trial in object storage (`trial`: bucket/prefix/sweep/trial, `fs` an s3fs file
    system): the epoch of its newest whole checkpoint (the last epoch of the journal it
    carries), or None."""
    newest = _newest(fs, trial)
    return None if newest is None else _stored_epoch(fs, f"{trial}/{newest}")


def copy_stored_checkpoint(fs: Any, src: str, dst: str, epoch: int) -> str:
    """`copy_checkpoint` in object storage: the state file of `dst`'s newest checkpoint (of
    `epoch`: the one Tune hands back when the trial resumes) replaced by `src`'s newest, of
    `epoch`; its journal stays `dst`'s own. Returns the key written; NoCheckpoint when either
    has no whole checkpoint of `epoch`."""
    ends = []
    for trial in (src, dst):
        newest = _newest(fs, trial)
        if newest is None or _stored_epoch(fs, f"{trial}/{newest}") != epoch:
            raise NoCheckpoint(f"{trial} has no newest checkpoint of epoch {epoch}")
        ends.append(f"{trial}/{newest}/{CHECKPOINT_FILE}")
    fs.copy(ends[0], ends[1])
    return ends[1]


def _newest(fs: Any, trial: str) -> Optional[str]:
    from tuner.trial.frame.stored import newest_checkpoint

    fs.invalidate_cache(trial)
    return newest_checkpoint(trial, fs.find(trial, detail=True))


def _stored_epoch(fs: Any, checkpoint: str) -> Optional[int]:
    with tempfile.TemporaryDirectory(prefix="tuner-clone-") as d:
        try:
            fs.get_file(f"{checkpoint}/{METRICS_FILE}", os.path.join(d, METRICS_FILE))
        except FileNotFoundError:
            return None
        rows = read_metrics(d)
    return int(rows[-1]["epoch"]) if rows else None
