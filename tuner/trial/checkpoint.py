"""Where a trial's checkpoints are kept (what goes in them: tuner.trial.state).

The session decides (tuner.trial.session). A trial in a local or shared sweep
directory keeps its own, in its own directory (`DirCheckpoints`): one file per epoch, the newest
N kept, written by the trial process itself before it reports, so resuming never depends on
the driver having snapshotted anything. After a crash, a pause by HyperBand, a retry or a
killed driver the trial continues from the newest file there. (Handing checkpoints to Tune
instead makes Tune snapshot the whole experiment every `num_to_keep` checkpoints of any trial,
and still loses trials created since its last snapshot when the driver is killed.) DDP trials
hand theirs to Ray Train, URI storage to Tune, in one file each (`save_to_dir`).
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Optional

import torch

from tuner.sweepdir import CHECKPOINT_FILE, CHECKPOINT_PATTERN, checkpoint_name

_NAME = re.compile(CHECKPOINT_PATTERN)


class DirCheckpoints:
    """Epoch checkpoints as `<root>/checkpoint_eNNNNNN.pt`; writes are atomic (rename)."""

    def __init__(self, root: str, keep: int = 2):
        self.root, self.keep = root, max(1, keep)

    def _epochs(self) -> list[int]:
        return numbered(self.root, _NAME)

    def path(self, epoch: int) -> str:
        return os.path.join(self.root, checkpoint_name(epoch))

    def latest_epoch(self) -> Optional[int]:
        epochs = self._epochs()
        return epochs[-1] if epochs else None

    def save(self, state: dict[str, Any], epoch: int) -> str:
        os.makedirs(self.root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".checkpoint-", suffix=".tmp")
        os.close(fd)
        try:
            torch.save(state, tmp)
        except BaseException:  # a full disk: no half-written temporary left behind
            os.remove(tmp)
            raise
        final = self.path(epoch)
        os.replace(tmp, final)  # a kill mid-write leaves a .tmp, never half a checkpoint
        for old in self._epochs()[: -self.keep]:
            os.remove(self.path(old))
        return final

    def load(self, map_location: Any) -> Optional[dict[str, Any]]:
        """The newest readable checkpoint's state (None: none). One that cannot be read (a
        damaged file) is passed over for the one before it, and `notice` says so."""
        self.notice: Optional[str] = None
        bad: list[str] = []
        for epoch in reversed(self._epochs()):
            path = self.path(epoch)
            try:
                state = torch.load(path, map_location=map_location, weights_only=True)
            except Exception as err:  # noqa: BLE001 - any damage: a truncated zip, bad pickle, I/O
                bad.append(f"{os.path.basename(path)} ({type(err).__name__})")
                continue
            if bad:
                self.notice = f"unreadable checkpoint {', '.join(bad)}: resumed from {os.path.basename(path)}"
            return state
        if bad:
            self.notice = f"no readable checkpoint ({', '.join(bad)}): started again from epoch 0"
        return None


def numbered(root: str, pattern: re.Pattern[str]) -> list[int]:
    """The epochs of the entries of `root` named by `pattern` (its group 1), in order."""
    if not os.path.isdir(root):
        return []
    found = (pattern.match(name) for name in os.listdir(root))
    return sorted(int(m.group(1)) for m in found if m)


def save_to_dir(state: dict[str, Any], directory: str) -> None:
    """The layout of checkpoints handed to Ray (Tune with URI storage, Train): one file."""
    torch.save(state, os.path.join(directory, CHECKPOINT_FILE))


def load_from_dir(directory: str, map_location: Any) -> dict[str, Any]:
    return torch.load(os.path.join(directory, CHECKPOINT_FILE), map_location=map_location, weights_only=True)
