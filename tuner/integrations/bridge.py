"""What a framework's callback needs of tuner, the same in both forms of a trial: a script run
by `task.command` (tuner.report, tuner.checkpoint_dir, tuner.restore_dir: the environment says
where) and the user's loop of `task.train` (its `ctx`). Outside a sweep it does nothing but
print the metrics, so the same code runs alone as before.

A checkpoint is a directory of files the framework wrote. A script's is one of tuner's epoch
directories; a `task.train` trial's goes into the state `ctx.report` checkpoints (the files as
bytes, beside the model's state dict for `best/`), and comes back into a directory of the
trial's when the trial resumes, removed once the trial reports its next epoch.

The RNG states (Python, NumPy, torch's CPU and CUDA generators) go with it: neither Lightning's
checkpoint nor a plain state dict holds them, and without them a resumed trial shuffles and
drops out differently from one that was never interrupted.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from typing import Any, Optional

import torch

from tuner.sweepdir.files import FRAMEWORK_DIR as OUTPUTS
from tuner.trial.script import api

_RESTORED = "restored"  # where a task.train trial's checkpoint comes back to, inside OUTPUTS


class Bridge:
    """tuner as a callback sees it. `ctx`: a `task.train` trial's; None in a script (run by
    `task.command`, or alone)."""

    def __init__(self, ctx: Any = None):
        self.ctx = ctx
        self._restored: Optional[str] = None
        self._consumed = False  # the restored checkpoint loaded, and removed (see `report`)
        self._pending: Optional[str] = None  # a task.train trial's checkpoint being written

    @property
    def trial_dir(self) -> Optional[str]:
        """The trial's directory; None outside a sweep."""
        if self.ctx is not None:
            return getattr(self.ctx, "trial_dir", None)
        return os.environ.get(api.TRIAL_DIR) or None

    @property
    def is_main(self) -> bool:
        return bool(self.ctx.is_main) if self.ctx is not None else os.environ.get("RANK", "0") == "0"

    @property
    def max_epochs(self) -> Optional[int]:
        if self.ctx is not None:
            return int(self.ctx.max_epochs)
        value = os.environ.get(api.MAX_EPOCHS)
        return int(value) if value else None

    def outputs(self) -> Optional[str]:
        """The trial's directory for the framework's own outputs, made; None outside a sweep
        (the framework's defaults apply)."""
        if self.trial_dir is None:
            return None
        path = os.path.join(self.trial_dir, OUTPUTS)
        os.makedirs(path, exist_ok=True)
        return path

    # ------------------------------------------------------------------ checkpoints

    def restore_dir(self) -> Optional[str]:
        """The newest checkpoint's directory when the trial resumes, else None."""
        if self.ctx is None:
            return api.restore_dir()
        if self._consumed:
            return None
        if self._restored is None:
            state = self.ctx.restore()
            if not state or "files" not in state:
                return None
            where = os.path.join(self.outputs() or tempfile.mkdtemp(), _RESTORED)
            shutil.rmtree(where, ignore_errors=True)
            for name, data in state["files"].items():
                path = os.path.join(where, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            self._restored = where
        return self._restored

    def checkpoint_dir(self) -> Optional[str]:
        """An empty directory for this epoch's checkpoint, before `report`; None outside a
        sweep and on ranks other than 0."""
        if self.ctx is None:
            return api.checkpoint_dir()
        if not self.is_main or self.trial_dir is None:
            return None
        if self._pending is None:
            self._pending = tempfile.mkdtemp(prefix=".checkpoint-", dir=self.outputs())
        return self._pending

    def report(self, epoch: int, metrics: dict[str, Any], model: Optional[dict[str, Any]] = None) -> None:
        """One epoch done, with the checkpoint written into `checkpoint_dir()` since the last
        report; `model`: the model's state dict (a `task.train` trial's best weights, `best/`).
        When the scheduler stops a `task.train` trial this does not return."""
        if self.ctx is None:
            api.report(epoch=epoch, **metrics)
            return
        if self._restored is not None:
            # An epoch after the resume: the framework has loaded all of the checkpoint it got
            # back (the Trainer's RNG states only as that epoch began), and the copy would stay
            # in the trial's directory for good; tuner keeps its own checkpoints.
            shutil.rmtree(self._restored, ignore_errors=True)
            self._restored, self._consumed = None, True
        state = None
        if self._pending is not None:
            state = {"files": _files(self._pending), **({"model": model} if model is not None else {})}
            shutil.rmtree(self._pending, ignore_errors=True)
            self._pending = None
        self.ctx.report({"epoch": epoch, **metrics}, state=state)


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for here, _, names in os.walk(root):
        for name in names:
            path = os.path.join(here, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The plain numbers among `values` (0-d tensors and numpy scalars read once)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.item()
        elif hasattr(value, "item") and not isinstance(value, (str, bytes)):
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """Every generator a training step may draw from, as it is now."""
    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        # Plain values and tensors only: a checkpoint is loaded with torch.load's
        # weights_only (Lightning's default), which refuses numpy arrays.
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(_tuples(state["python"]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def _tuples(value: Any) -> Any:
    """Python's RNG state as `random.setstate` wants it (a checkpoint may have made its
    tuples lists)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
