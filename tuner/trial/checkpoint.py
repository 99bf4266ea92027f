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

from tuner.sweepdir import BEST_CHECKPOINT, CHECKPOINT_FILE, CHECKPOINT_PATTERN, checkpoint_name, finite

_NAME = re.compile(CHECKPOINT_PATTERN)


class DirCheckpoints:
    """Epoch checkpoints as `<root>/checkpoint_eNNNNNN.pt`; writes are atomic (rename)."""

    def __init__(self, root: str, keep: int = 2):
        self.root, self.keep = root, max(1, keep)

    def _epochs(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        found = (_NAME.match(name) for name in os.listdir(self.root))
        return sorted(int(m.group(1)) for m in found if m)

    def path(self, epoch: int) -> str:
        return os.path.join(self.root, checkpoint_name(epoch))

    def latest_epoch(self) -> Optional[int]:
        epochs = self._epochs()
        return epochs[-1] if epochs else None

    def save(self, state: dict[str, Any], epoch: int) -> str:
        final = save_atomic(state, self.path(epoch))
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


def save_atomic(state: Any, final: str) -> str:
    """torch.save to `final` through a temporary in its directory and a rename: a kill
    mid-write leaves a .tmp, never half a file; a failed write (a full disk) not even that."""
    root = os.path.dirname(final)
    os.makedirs(root, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".checkpoint-", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
    except BaseException:
        os.remove(tmp)
        raise
    os.replace(tmp, final)
    return final


class BestCheckpoint:
    """The trial's best epoch's weights, `<trial>/best.pt`, beside its newest checkpoints.

    `offer` is called with every epoch's metrics (rank 0, before the scheduler hears of the
    epoch); when the sweep's metric improves on the best so far (strictly: a tie keeps the
    earlier epoch, as the ranking does), the weights are written atomically as
    {"epoch", "metric", "value", "model"}. The best so far survives the trial's process: a
    trial resumed (paused by a scheduler, retried, `tuner resume`) reads it back once.
    """

    def __init__(self, trial_dir: str, metric: str, mode: str):
        self.path = os.path.join(trial_dir, BEST_CHECKPOINT)
        self.metric, self.mode = metric, mode
        self._value: Optional[float] = None
        self._read = False

    def best_value(self) -> Optional[float]:
        if not self._read:
            self._read = True
            held = read_best(self.path)
            self._value = None if held is None else float(held["value"])
        return self._value

    def offer(self, metrics: dict[str, Any], payload: dict[str, Any]) -> bool:
        """Keep `payload`'s weights if `metrics` is the trial's best epoch so far."""
        value = metrics.get(self.metric)
        weights = weights_of(payload)
        if weights is None or "failure" in metrics or not finite(value):
            return False
        held = self.best_value()
        if held is not None and not (value > held if self.mode == "max" else value < held):
            return False
        best = {"epoch": int(metrics["epoch"]), "metric": self.metric, "value": float(value)}
        save_atomic({**best, "model": weights}, self.path)
        self._value = float(value)
        return True


def weights_of(payload: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The model's state dict in a checkpoint's payload: tuner's loop's `model`, or, for
    `task.train`, the `model` entry of the state the user reported (as `ctx.state_dict`
    gives); None when there is none."""
    user = payload.get("user")
    weights = user.get("model") if isinstance(user, dict) else payload.get("model")
    if isinstance(weights, dict) and weights and all(isinstance(v, torch.Tensor) for v in weights.values()):
        return weights
    return None


def read_best(path: str, map_location: Any = "cpu") -> Optional[dict[str, Any]]:
    """A trial's best.pt ({"epoch", "metric", "value", "model"}), or None (none, or unreadable)."""
    if not os.path.isfile(path):
        return None
    try:
        held = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - damaged (a truncated zip): as if there were none
        return None
    return held if isinstance(held, dict) and finite(held.get("value")) else None


def save_to_dir(state: dict[str, Any], directory: str) -> None:
    """The layout of checkpoints handed to Ray (Tune with URI storage, Train): one file."""
    torch.save(state, os.path.join(directory, CHECKPOINT_FILE))


def load_from_dir(directory: str, map_location: Any) -> dict[str, Any]:
    return torch.load(os.path.join(directory, CHECKPOINT_FILE), map_location=map_location, weights_only=True)
