"""Optimizers by name and the learning-rate schedule (a per-step factor of the base lr)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

OptimizerFn = Callable[[Iterable[torch.nn.Parameter], dict[str, Any]], torch.optim.Optimizer]


def _decay(hp: dict[str, Any], default: float = 0.0) -> float:
    # weight_decay unset means the optimizer's own default (AdamW's is 0.01, the others' 0).
    wd = hp.get("weight_decay")
    return default if wd is None else float(wd)


OPTIMIZERS: dict[str, OptimizerFn] = {
    "sgd": lambda p, hp: torch.optim.SGD(
        p, lr=hp["lr"], momentum=float(hp.get("momentum", 0.9)), weight_decay=_decay(hp)
    ),
    "adam": lambda p, hp: torch.optim.Adam(p, lr=hp["lr"], weight_decay=_decay(hp)),
    "adamw": lambda p, hp: torch.optim.AdamW(p, lr=hp["lr"], weight_decay=_decay(hp, 0.01)),
    "rmsprop": lambda p, hp: torch.optim.RMSprop(
        p, lr=hp["lr"], momentum=float(hp.get("momentum", 0.9)), weight_decay=_decay(hp)
    ),
}


def build_optimizer(model: torch.nn.Module, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """The optimizer `hp['optimizer']` over the model's parameters."""
    return OPTIMIZERS[str(hp["optimizer"])](model.parameters(), {**hp, "lr": float(hp["lr"])})


def lr_factor(hp: dict[str, Any], steps_per_epoch: int, max_epochs: int) -> Callable[[int], float]:
    """Step -> multiple of the base lr: linear warm-up, then constant or cosine to 0."""
    warmup = max(0, round(float(hp.get("warmup_epochs", 0)) * steps_per_epoch))
    total = max(1, max_epochs * steps_per_epoch)
    cosine = hp.get("lr_schedule", "constant") == "cosine"

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class ConstantSchedule:
    """The learning rate as the optimizer has it: what a LambdaLR of factor 1 does, minus its
    per-step work (on small models each step's overhead is a visible share of the step)."""

    def step(self) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def build_schedule(
    optimizer: torch.optim.Optimizer, hp: dict[str, Any], steps_per_epoch: int, max_epochs: int
) -> Any:
    """A per-step LambdaLR for warm-up or cosine decay, else the constant schedule."""
    if hp.get("lr_schedule", "constant") == "constant" and not float(hp.get("warmup_epochs", 0)):
        return ConstantSchedule()
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(hp, steps_per_epoch, max_epochs))
