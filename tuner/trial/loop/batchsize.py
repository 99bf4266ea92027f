"""`training.find_batch_size`: the largest micro-batch that fits, found before training.

A binary search over micro-batch sizes, each tried as one real optimizer step (forward,
backward, step: the optimizer's state takes memory too) with out-of-memory caught. The trial's
weights, optimizer, buffers (BatchNorm statistics) and random state are put back afterwards,
so the probe leaves no trace but the micro-batch: `batch_size`, and so the effective batch and
the meaning of `lr`, do not change.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from tuner.trial.frame.memory import TrialOOM, release
from tuner.trial.loop.lockstep import attempt

if TYPE_CHECKING:
    from tuner.trial.loop.parts import Parts


def fit_micro_batch(p: Parts) -> int:
    """The largest micro-batch, up to the per-worker batch, that fits (TrialOOM if none)."""
    x, y = next(p.feed(p.train.train_steps(0, p.per_rank_batch)))

    def fits(m: int) -> bool:
        def one_step() -> None:
            # No gradient collective (DDP): the probe measures memory, not the all-reduce.
            with p.strategy.sync(p.net, last=False):
                with p.amp.autocast():
                    loss = p.objective.loss(p.net(x[:m]), y[:m])
                loss.backward()
            p.optimizer.step()  # the optimizer's state takes memory too

        # Every rank moves to the same next size: out of memory on one is out on all.
        _, short = attempt(p.strategy.gate, one_step, lambda: "forward")
        if short is not None:
            p.strategy.reset(p.net)
            p.strategy.gate.clear()
        p.optimizer.zero_grad(set_to_none=True)
        release(p.device)
        return short is None

    with preserved(p.model, p.optimizer, p.device):
        found = largest_fitting(fits, max(1, p.min_micro), len(y))
    if found is None:
        raise TrialOOM(f"find_batch_size: not even micro-batch {p.min_micro} fits")
    p.log.info("find_batch_size: micro-batch %d of a per-worker batch of %d", found, len(y))
    return found


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> Optional[int]:
    """The largest n in [low, high] with `fits(n)`, or None when not even `low` fits.

    Assumes `fits` holds up to some size and fails above it (memory grows with the batch).
    Tries `high` first: a batch that fits whole costs one try.
    """
    if fits(high):
        return high
    ok, bad = low - 1, high  # fits(ok) (or below the range), not fits(bad)
    while bad - ok > 1:
        mid = (ok + bad) // 2
        if fits(mid):
            ok = mid
        else:
            bad = mid
    return ok if ok >= low else None


@contextmanager
def preserved(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> Iterator[None]:
    """Run the block, then put weights, buffers, optimizer state and RNG back as they were.

    The copy is kept on the CPU: the probe is about device memory, so it must not hold a
    second copy of the weights there.
    """
    weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    optim = copy.deepcopy(_to_cpu(optimizer.state_dict()))
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            optimizer.zero_grad(set_to_none=True)
            model.load_state_dict(weights)
            optimizer.load_state_dict(optim)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
