"""The live objects of one trial (`Parts`), and what of them a checkpoint holds.

A checkpoint holds everything a resumed trial needs to go on exactly. Weights and optimizer
state come from the parallel strategy as full, unsharded state dicts (FSDP gathers them with
a collective, so every rank takes part; only rank 0 hands them on), plus the GradScaler, the
learning-rate schedule, the loop's counters and the random state. Where it is kept is the
session's business (tuner.trial.frame.checkpoint). Helpers (batchsize, probe) take `Parts` from
here, never from the loop.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from tuner.trial.frame.gpu import NoGpu
    from tuner.trial.frame.session import Session
    from tuner.trial.frame.settings import Settings
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.loop.amp import Amp
    from tuner.trial.loop.data import Batches, DataBundle
    from tuner.trial.loop.hooks import Objective
    from tuner.trial.loop.parallel import Single
    from tuner.trial.loop.prefetch import Feed


@dataclass
class TrainState:
    """What, besides weights and optimizer, a resumed trial needs to go on exactly."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    micro_batch: int = 0  # per-worker forward batch; shrinks on OOM
    oom_backoffs: int = 0


@dataclass
class Parts:
    """The live objects of one trial (kept together so helpers take one argument)."""

    spec: TrialSpec
    session: Session
    device: torch.device
    data: DataBundle
    model: nn.Module  # not DDP-wrapped (FSDP shards in place): checkpoints and evaluation use it
    net: nn.Module  # what training calls: the model, or its DDP wrapper
    strategy: Single  # how workers share the model (parallel.py)
    objective: Objective  # the loss and the evaluation metrics (hooks.py)
    optimizer: torch.optim.Optimizer
    schedule: Any  # LambdaLR, or optim.ConstantSchedule
    amp: Amp
    feed: Feed  # stored batches -> model inputs on the device (prefetch.py)
    gpu: NoGpu  # memory share and per-epoch stats (gpu.py)
    train: Batches
    val: Batches
    per_rank_batch: int
    eval_batch: int
    min_micro: int
    grad_clip: Optional[float]
    find_batch_size: bool
    state: TrainState
    log: logging.Logger
    num_params: int = 0  # the model's trainable parameters (an objective: metric num_params)
    settings: Optional[Settings] = None  # the trial's training settings (restore applies them)
    stepper: Any = None  # its optimizer steps, backing off on OOM (step.Stepper; over `state`)

    def close(self) -> None:
        """End what outlives a reference: the DataLoaders' worker processes."""
        self.train.close()
        self.val.close()


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
    if p.settings is not None:  # the configuration's lr, weight decay, momentum: not the checkpoint's
        from tuner.trial.loop.optim import set_hyperparameters

        set_hyperparameters(p.optimizer, p.schedule, p.settings)
    if p.stepper is not None:
        p.stepper.state = p.state
    torch.set_rng_state(payload["rng_cpu"].cpu())
    if payload["rng_cuda"] is not None and p.device.type == "cuda":
        torch.cuda.set_rng_state(payload["rng_cuda"].cpu(), p.device)
    return True
