"""Where a trial's checkpoints are kept (what goes in them: tuner.trial.loop.parts).

The session decides (tuner.trial.frame.session). A trial in a local or shared sweep
directory keeps its own, in its own directory (`DirCheckpoints`): one file per epoch, the newest
N kept, written by the trial process itself before it reports, so resuming never depends on
the driver having snapshotted anything. After a crash, a pause by HyperBand, a retry or a
killed driver the trial continues from the newest file there. (Handing checkpoints to Tune
instead makes Tune snapshot the whole experiment every `num_to_keep` checkpoints of any trial,
and still loses trials created since its last snapshot when the driver is killed.) DDP trials
keep theirs the same way (rank 0 writes); with URI storage trials hand theirs to Tune, in one
file each (`save_to_dir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from typing import Any, Optional

from tuner.sweepdir import (
    BEST_RECORD,
    BEST_WEIGHTS_PATTERN,
    CHECKPOINT_FILE,
    CHECKPOINT_PATTERN,
    best_weights_name,
    checkpoint_name,
    finite,
    read_best_record,
    write_atomic,
)

_NAME = re.compile(CHECKPOINT_PATTERN)
_BEST = re.compile(BEST_WEIGHTS_PATTERN)


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
        final = save_atomic(state, self.path(epoch))
        for old in self._epochs()[: -self.keep]:
            os.remove(self.path(old))
        return final

    def load(self, map_location: Any) -> Optional[dict[str, Any]]:
        """The newest readable checkpoint's state (None: none). One that cannot be read (a
        damaged file) is passed over for the one before it, and `notice` says so."""
        import torch

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
    import torch

    return replace_atomic(final, lambda tmp: torch.save(state, tmp))


def replace_atomic(final: str, write: Callable[[str], Any]) -> str:
    """`write(path)` into a temporary beside `final`, then renamed onto it (see save_atomic)."""
    root = os.path.dirname(final)
    os.makedirs(root, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".checkpoint-", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
    except BaseException:
        os.remove(tmp)
        raise
    os.replace(tmp, final)
    return final


class BestCheckpoint:
    """The trial's best epoch's weights beside its newest checkpoints: `best_eNNNNNN.pt` (a
    plain state dict, what `<sweep>/best/model.pt` is a copy of) and `best.json` naming it.

    `offer` is called with every epoch's metrics (rank 0, before the scheduler hears of the
    epoch); when the sweep's metric improves on the best so far (strictly: a tie keeps the
    earlier epoch, as the ranking does) the weights are written, then best.json (each
    atomically), then the older weights removed: best.json always names a whole file of the
    epoch it gives. The best so far survives the process: a resumed trial (paused by a
    scheduler, retried, `tuner resume`) reads best.json back once.
    """

    def __init__(self, trial_dir: str, metric: str, direction: str):
        self.dir, self.metric, self.direction = trial_dir, metric, direction
        self._value: Optional[float] = None
        self._read = False

    def best_value(self) -> Optional[float]:
        if not self._read:
            self._read = True
            held = read_best_record(self.dir)
            self._value = None if held is None else float(held["value"])
        return self._value

    def offer(self, metrics: dict[str, Any], payload: dict[str, Any]) -> bool:
        """Keep `payload`'s weights if `metrics` is the trial's best epoch so far."""
        value = metrics.get(self.metric)
        weights = weights_of(payload)
        if weights is None or "failure" in metrics or not finite(value):
            return False
        held = self.best_value()
        if held is not None and not (value > held if self.direction == "max" else value < held):
            return False
        epoch = int(metrics["epoch"])
        name = best_weights_name(epoch)
        save_atomic(plain_state_dict(weights), os.path.join(self.dir, name))
        record = {"epoch": epoch, "metric": self.metric, "value": float(value), "weights": name}
        write_atomic(os.path.join(self.dir, BEST_RECORD), json.dumps(record))
        for other in os.listdir(self.dir):
            if _BEST.match(other) and other != name:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.dir, other))
        self._value = float(value)
        return True


def weights_of(payload: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The model's state dict in a checkpoint's payload: tuner's loop's `model`, or, for
    `task.train`, the `model` entry of the state the user reported (as `ctx.state_dict`
    gives); None when there is none."""
    import torch

    user = payload.get("user")
    weights = user.get("model") if isinstance(user, dict) else payload.get("model")
    if isinstance(weights, dict) and weights and all(isinstance(v, torch.Tensor) for v in weights.values()):
        return weights
    return None


def plain_state_dict(weights: dict[str, Any]) -> dict[str, Any]:
    """`weights` on the CPU without the prefixes wrappers add to every key (DDP's `module.`,
    torch.compile's `_orig_mod.`): loadable into the bare model."""
    import torch

    out = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}
    while out:
        for prefix in ("module.", "_orig_mod."):
            if all(k.startswith(prefix) for k in out):
                out = {k[len(prefix) :]: v for k, v in out.items()}
                break
        else:
            return out
    return out


def numbered(root: str, pattern: re.Pattern[str]) -> list[int]:
    """The epochs of the entries of `root` named by `pattern` (its group 1), in order."""
    if not os.path.isdir(root):
        return []
    found = (pattern.match(name) for name in os.listdir(root))
    return sorted(int(m.group(1)) for m in found if m)


def save_to_dir(state: dict[str, Any], directory: str) -> None:
    """The layout of checkpoints handed to Ray (Tune with URI storage, Train): one file."""
    import torch

    torch.save(state, os.path.join(directory, CHECKPOINT_FILE))


def load_from_dir(directory: str, map_location: Any) -> dict[str, Any]:
    import torch

    return torch.load(os.path.join(directory, CHECKPOINT_FILE), map_location=map_location, weights_only=True)
