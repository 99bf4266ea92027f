"""Optimizers by name and the learning-rate schedule (a per-step factor of the base lr)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Union

import torch

from tuner import catalogue
from tuner.trial.frame.settings import Settings

# name -> (class, its options from the trial's settings, whether it has a fused CUDA
# kernel). weight_decay unset means the optimizer's own default (AdamW's 0.01, the others' 0).
OptionsFn = Callable[[Settings], dict[str, Any]]


def _decay(s: Settings, default: float = 0.0) -> float:
    return default if s.weight_decay is None else s.weight_decay


def _momentum(s: Settings) -> dict[str, Any]:
    return {"momentum": s.momentum, "weight_decay": _decay(s)}


OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], OptionsFn, bool]] = {
    "sgd": (torch.optim.SGD, _momentum, True),
    "adam": (torch.optim.Adam, lambda s: {"weight_decay": _decay(s)}, True),
    "adamw": (torch.optim.AdamW, lambda s: {"weight_decay": _decay(s, 0.01)}, True),
    "rmsprop": (torch.optim.RMSprop, _momentum, False),
}
assert tuple(OPTIMIZERS) == catalogue.OPTIMIZERS, "an optimizer without its catalogue entry"


def build_optimizer(model: torch.nn.Module, hp: Union[Settings, Mapping[str, Any]]) -> torch.optim.Optimizer:
    """The optimizer `settings.optimizer` over the model's parameters, its state already made.

    On CUDA the fused kernel where there is one: one launch for all parameters, and under fp16
    the GradScaler hands it the inf check on the device (a for-each optimizer makes the host
    wait for `found_inf` every step).
    """
    s = hp if isinstance(hp, Settings) else Settings.of(hp)
    cls, options, has_fused = OPTIMIZERS[s.optimizer]
    params = [q for q in model.parameters() if q.requires_grad]
    kwargs = {"lr": s.lr, **options(s)}
    if has_fused and params and all(q.is_cuda and q.is_floating_point() for q in params):
        kwargs["fused"] = True
    optimizer = cls(params, **kwargs)
    init_state(optimizer)
    return optimizer


def init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state now rather than in its first `step`.

    Adam's two moments alone take twice the weights' memory. Made here, they are in place
    before the memory probe and `find_batch_size` measure a step, and an out-of-memory can no
    longer strike halfway through the first real step (a fused/for-each step that failed
    there would have updated some moments and not others). One step with zero gradients at
    learning rate 0 creates the state and leaves the weights as they are; the state is then
    zeroed, which is what a fresh optimizer starts from (Adam's moments and step count; SGD's
    momentum buffer: a zero buffer times momentum plus the first gradient is that gradient).
    """
    params = [q for group in optimizer.param_groups for q in group["params"] if q.requires_grad]
    if not params:
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for q in params:
        q.grad = torch.zeros_like(q)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    try:
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        for q in params:
            q.grad = None
    with torch.no_grad():
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()


def set_hyperparameters(optimizer: torch.optim.Optimizer, schedule: Any, s: Settings) -> None:
    """The trial's settings on an optimizer and schedule whose state came from a checkpoint:
    its learning rate (at the schedule's step), weight decay and momentum are the
    configuration's, not the checkpoint's. The same values on a plain resume (the expression
    LambdaLR itself computes); the new ones after population-based training continued the
    trial from another's checkpoint with a perturbed configuration."""
    options = OPTIMIZERS[s.optimizer][1](s)
    for group in optimizer.param_groups:
        group.update({k: v for k, v in options.items() if k in group})
    if isinstance(schedule, torch.optim.lr_scheduler.LambdaLR):
        schedule.base_lrs = [s.lr for _ in optimizer.param_groups]
        for group, factor in zip(optimizer.param_groups, schedule.lr_lambdas, strict=True):
            group["initial_lr"] = s.lr
            group["lr"] = s.lr * factor(schedule.last_epoch)
    else:
        for group in optimizer.param_groups:
            group["lr"] = s.lr


def lr_factor(s: Settings, steps_per_epoch: int, max_epochs: int) -> Callable[[int], float]:
    """Step -> multiple of the base lr: linear warm-up, then constant or cosine to 0."""
    warmup = max(0, round(s.warmup_epochs * steps_per_epoch))
    total = max(1, max_epochs * steps_per_epoch)
    cosine = s.lr_schedule == "cosine"

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
    optimizer: torch.optim.Optimizer, s: Settings, steps_per_epoch: int, max_epochs: int
) -> Any:
    """A per-step LambdaLR for warm-up or cosine decay, else the constant schedule."""
    if s.lr_schedule == "constant" and not s.warmup_epochs:
        return ConstantSchedule()
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(s, steps_per_epoch, max_epochs))
