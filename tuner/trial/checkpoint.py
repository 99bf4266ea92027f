"""A trial's checkpoint: one file with everything a resumed trial needs to go on exactly.

Weights and optimizer state come from the parallel strategy as full, unsharded state dicts
(FSDP gathers them with a collective, so every rank takes part; only rank 0 writes), plus the
GradScaler, the learning-rate schedule, the loop's counters and the random state.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

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
    """Report the epoch's metrics to the session with a checkpoint of the trial as it is now."""
    payload = _state_dict(p)  # on every rank: FSDP gathers the full state with a collective
    ckpt_dir = tempfile.mkdtemp(prefix="tuner-ckpt-") if p.session.is_main else None
    try:
        if ckpt_dir is not None:
            torch.save(payload, os.path.join(ckpt_dir, CHECKPOINT_FILE))
        p.session.report(metrics, ckpt_dir)  # Ray copies the directory into storage
    finally:
        if ckpt_dir is not None:
            shutil.rmtree(ckpt_dir, ignore_errors=True)


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
    """Load the session's checkpoint into the trial, if it has one; True when it did."""
    with p.session.resume_dir() as d:
        if d is None:
            return False
        # On the CPU: a model sharded because it does not fit one GPU must not be loaded
        # whole onto one; load_state_dict copies each tensor to where its parameter lives.
        payload = torch.load(os.path.join(d, CHECKPOINT_FILE), map_location="cpu", weights_only=True)
    p.strategy.load(p.model, p.optimizer, payload["model"], payload["optimizer"])
    p.amp.scaler.load_state_dict(payload["scaler"])
    p.schedule.load_state_dict(payload["schedule"])
    p.state = TrainState(**payload["state"])
    torch.set_rng_state(payload["rng_cpu"].cpu())
    if payload["rng_cuda"] is not None and p.device.type == "cuda":
        torch.cuda.set_rng_state(payload["rng_cuda"].cpu(), p.device)
    return True
