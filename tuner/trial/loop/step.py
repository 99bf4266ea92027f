"""One optimizer step over micro-batches that backs off when memory runs out, at any world size.

Tuner's loop runs every step through a `Stepper`, and so does a user's own loop through
`ctx.step` (`tuner/trial/userloop/context.py`). A step is the forward and backward of each
micro-batch of the worker's batch (gradients accumulated to the whole batch's, reduced over
workers by the parallel wrapper), then the optimizer's update.

Out of memory in the forward, the backward, gradient unscaling or clipping, on any rank: every
rank learns of it at the same gate (`lockstep.py`), drops the step's gradients, halves the
micro-batch (twice the micro-batches per step, so the effective batch and the meaning of the
learning rate stay), and runs the same step again. Below `min_micro` the trial ends as `oom`.

Out of memory in the optimizer's update itself is not the micro-batch's doing (the update's
memory does not depend on it; the activations are gone by then): the rank that ran out retries
its own update after handing cached memory back, then once more with the per-parameter
(for-each off) update, which needs far less scratch memory. That is exact only when the failed
update had changed nothing, which the tensors' version counters tell; if it had (part of a
for-each update applied), the step cannot be undone and the trial ends as `oom`. Every rank
agrees on that after each update, so no rank trains on alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from torch import nn

from tuner.trial.frame.memory import TrialOOM, first_line, halve, is_oom, release
from tuner.trial.loop.lockstep import NoGate, Shortfall, attempt

LossOf = Callable[[Any], torch.Tensor]  # a micro-batch -> its mean loss


class Stepper:
    """The steps of one trial (see the module). `state` holds `micro_batch`, `oom_backoffs`
    and `step` (the loop's TrainState, checkpointed with the trial)."""

    def __init__(
        self,
        *,
        net: nn.Module,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        strategy: Any,
        amp: Any,
        device: torch.device,
        state: Any,
        min_micro: int,
        grad_clip: Optional[float],
        log: logging.Logger,
        main: bool = True,
    ):
        self.net, self.model, self.optimizer = net, model, optimizer
        self.strategy, self.amp, self.device, self.state = strategy, amp, device, state
        self.min_micro, self.grad_clip, self.log, self.main = min_micro, grad_clip, log, main
        self.gate: NoGate = strategy.lockstep(net)
        self.world = getattr(self.gate, "world", 1)
        self.phase = "forward"
        self.recoveries: list[float] = []  # seconds from each out-of-memory to the retry

    def step(self, batch: Any, loss_of: LossOf) -> torch.Tensor:
        """Train on `batch` (a tensor, or a tuple/list/dict of tensors split along their first
        dimension), `loss_of(micro_batch)` giving each micro-batch's mean loss; returns the
        batch's loss summed over its samples (detached)."""
        n = batch_size(batch)
        while True:
            total, short = attempt(self.gate, lambda: self._gradients(batch, n, loss_of), lambda: self.phase)
            if short is None:
                break
            self._back_off(short)
        self._update()
        self.state.step += 1
        assert total is not None
        return total

    # ------------------------------------------------------------------ forward and backward

    def _gradients(self, batch: Any, n: int, loss_of: LossOf) -> torch.Tensor:
        """Forward/backward in micro-batches; the gradients equal those of the whole batch."""
        self.strategy.zero_grad(self.optimizer)
        chunks = split(batch, self.state.micro_batch)
        sums = []
        for i, chunk in enumerate(chunks):
            k = batch_size(chunk)
            with self.strategy.sync(self.net, last=i == len(chunks) - 1):
                self.phase = "forward"
                with self.amp.autocast():
                    loss = loss_of(chunk)  # the micro-batch's mean
                self.phase = "backward"
                # Weighted by the micro-batch's share: the gradients sum to the whole batch's mean's.
                self.amp.scaler.scale(loss * (k / n)).backward()
            sums.append(loss.detach() * k)
        self.phase = "optimizer step"
        if self.amp.scaler.is_enabled():
            self.gate.check()  # FSDP: unscaling reduces found-inf over ranks
            self.amp.scaler.unscale_(self.optimizer)  # clip true gradients, not scaled ones
        if self.grad_clip is not None:
            self.gate.check()  # FSDP: the norm is reduced over ranks
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        return sums[0] if len(sums) == 1 else torch.stack(sums).sum()

    def _back_off(self, short: Shortfall) -> None:
        """After a step every rank gave up: put the wrapper's state back, drop the gradients,
        and halve the micro-batch (TrialOOM below the minimum)."""
        self.strategy.reset(self.net)
        self.gate.clear()
        self.strategy.zero_grad(self.optimizer)
        _forget_unscaling(self.amp.scaler, self.optimizer)
        release(self.device)
        before = self.state.micro_batch
        try:
            self.state.micro_batch = halve(before, self.min_micro)
        except TrialOOM as err:
            raise TrialOOM(f"{err}, in the {short.where(self.world)}" + _colon(short.detail)) from None
        self.state.oom_backoffs += 1
        took = time.perf_counter() - short.at
        self.recoveries.append(took)
        self.log.warning(
            "OOM at micro-batch %d: retrying the step at %d (%s, step %d; recovered in %.3f s)%s",
            before, self.state.micro_batch, short.where(self.world), self.state.step, took,
            _colon(short.detail),
        )  # fmt: skip

    # ------------------------------------------------------------------ the update

    def _update(self) -> None:
        """The optimizer's update, retried on this rank where it ran out before changing
        anything; every rank then agrees that every update went through."""
        why = _step_with_retries(self.amp.scaler, self.optimizer, self.device, self.log)
        if not self.gate.agree(why is None):
            where = f"the optimizer step: {why}" if why else "another rank's optimizer step"
            raise TrialOOM(f"out of memory in {where}")
        self.amp.scaler.update()


def _step_with_retries(
    scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, device: torch.device, log: logging.Logger
) -> Optional[str]:
    """None when the update went through; else why it could not."""
    for retry in range(3):
        before = _versions(optimizer)
        try:
            scaler.step(optimizer)
            return None
        except Exception as err:  # noqa: BLE001 - only out-of-memory is handled, the rest raised
            if not is_oom(err):
                raise
            why = first_line(err)
        # Outside the except block: the traceback, and the tensors its frames hold, are gone.
        if _versions(optimizer) != before:
            return f"{why} (partway through the update, which had changed weights or moments)"
        _drop_new_state(optimizer, before)
        release(device)
        if retry == 2:
            return why
        plain = retry == 1 and _per_parameter(optimizer)
        log.warning(
            "OOM in the optimizer step (%s): retrying it%s", why, " one parameter at a time" if plain else ""
        )
    return None  # (not reached)


Versions = tuple[tuple[int, ...], tuple[int, ...]]


def _versions(optimizer: torch.optim.Optimizer) -> Versions:
    """Every parameter's and state tensor's version counter (bumped by each in-place change),
    and how many state entries each parameter has (a lazy first step creates them)."""
    versions, entries = [], []
    for group in optimizer.param_groups:
        for q in group["params"]:
            versions.append(q._version)
            state = optimizer.state.get(q, {})
            entries.append(len(state))
            versions.extend(v._version for v in state.values() if isinstance(v, torch.Tensor))
    return tuple(versions), tuple(entries)


def _drop_new_state(optimizer: torch.optim.Optimizer, before: Versions) -> None:
    """A lazy first step that ran out while making its state leaves some entries half made:
    drop those the failed step created, so the retry makes them whole."""
    params = [q for group in optimizer.param_groups for q in group["params"]]
    for q, had in zip(params, before[1], strict=True):
        if had == 0 and optimizer.state.get(q):
            del optimizer.state[q]


def _per_parameter(optimizer: torch.optim.Optimizer) -> bool:
    """Switch a for-each update to torch's per-parameter one (its scratch memory is one
    parameter's, not all of them at once); False if there was nothing to switch."""
    switched = False
    for group in optimizer.param_groups:
        if "foreach" in group and not group.get("fused") and group["foreach"] is not False:
            group["foreach"] = False
            switched = True
    return switched


def _forget_unscaling(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
    """The GradScaler refuses a second `unscale_` before `update`; the retried step unscales
    its new gradients afresh. (Its per-optimizer record is private; `update` would also move
    the scale, which the abandoned step must not.)"""
    states = getattr(scaler, "_per_optimizer_states", None)
    if scaler.is_enabled() and isinstance(states, dict):
        states.pop(id(optimizer), None)


def _colon(detail: str) -> str:
    return f": {detail}" if detail else ""


def batch_size(batch: Any) -> int:
    """The number of samples in a batch: its first tensor's first dimension."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    values: Sequence[Any] = list(batch.values()) if isinstance(batch, dict) else batch
    for v in values:
        if isinstance(v, torch.Tensor):
            return len(v)
    raise TypeError(f"a batch of {type(batch).__name__} holds no tensor to split into micro-batches")


def split(batch: Any, micro: int) -> list[Any]:
    """The batch in micro-batches of `micro` samples (the batch itself when it fits one)."""
    n = batch_size(batch)
    if micro >= n:
        return [batch]
    if isinstance(batch, torch.Tensor):
        return list(batch.split(micro))
    if isinstance(batch, dict):
        parts = {k: _pieces(v, micro, n) for k, v in batch.items()}
        return [{k: parts[k][i] for k in batch} for i in range(-(-n // micro))]
    columns = [_pieces(v, micro, n) for v in batch]
    return [type(batch)(c[i] for c in columns) if isinstance(batch, tuple) else [c[i] for c in columns]
            for i in range(-(-n // micro))]  # fmt: skip


def _pieces(value: Any, micro: int, n: int) -> list[Any]:
    """A batch's column in micro-batches: tensors split, anything else repeated."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and len(value) == n:
        return list(value.split(micro))
    return [value] * -(-n // micro)
