"""A trial's checkpoint: what goes in it, and where it is kept.

What: everything a resumed trial needs to go on exactly. Weights and optimizer state come from
the parallel strategy as full, unsharded state dicts (FSDP gathers them with a collective, so
every rank takes part; only rank 0 hands them on), plus the GradScaler, the learning-rate
schedule, the loop's counters and the random state.

Where: the session decides (tuner.trial.session). A trial in a local or shared sweep
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
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from tuner.trial.loop import Parts

CHECKPOINT_FILE = "state.pt"


@dataclass
class TrainState:
    """What, besides weights and optimizer, a resumed trial needs to go on exactly."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    micro_batch: int = 0  # per-worker forward batch; shrinks on OOM
    oom_backoffs: int = 0


def report_with_checkpoint(p: Parts, metrics: dict[str, Any]) -> None:
    """Report the epoch's metrics with a checkpoint of the trial as it is now."""
    payload = _state_dict(p)  # on every rank: FSDP gathers the full state with a collective
    p.session.report(metrics, payload if p.session.is_main else None)


def _state_dict(p: Parts) -> dict[str, Any]:
    weights, optim = p.strategy.state(p.model, p.optimizer)
    return {
        "model": weights,
        "optimizer": optim,
        "scaler": p.amp.scaler.state_dict(),
        "schedule": p.schedule.state_dict(),
        "state": asdict(p.state),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state(p.device) if p.device.type == "cuda" else None,
    }


def restore(p: Parts) -> bool:
    """Load the session's newest checkpoint into the trial, if it has one; True when it did."""
    # On the CPU: a model sharded because it does not fit one GPU must not be loaded whole
    # onto one; load_state_dict copies each tensor to where its parameter lives.
    payload = p.session.load_checkpoint("cpu")
    if payload is None:
        return False
    p.strategy.load(p.model, p.optimizer, payload["model"], payload["optimizer"])
    p.amp.scaler.load_state_dict(payload["scaler"])
    p.schedule.load_state_dict(payload["schedule"])
    p.state = TrainState(**payload["state"])
    torch.set_rng_state(payload["rng_cpu"].cpu())
    if payload["rng_cuda"] is not None and p.device.type == "cuda":
        torch.cuda.set_rng_state(payload["rng_cuda"].cpu(), p.device)
    return True


# ----------------------------------------------------------------------------- where


_NAME = re.compile(r"^checkpoint_e(\d{6})\.pt$")


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
        return os.path.join(self.root, f"checkpoint_e{epoch:06d}.pt")

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


def save_to_dir(state: dict[str, Any], directory: str) -> None:
    """The layout of checkpoints handed to Ray (Tune with URI storage, Train): one file."""
    torch.save(state, os.path.join(directory, CHECKPOINT_FILE))


def load_from_dir(directory: str, map_location: Any) -> dict[str, Any]:
    return torch.load(os.path.join(directory, CHECKPOINT_FILE), map_location=map_location, weights_only=True)
