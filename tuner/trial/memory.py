"""GPU memory: releasing it, and what to do when a step runs out of it."""

from __future__ import annotations

import gc

import torch


class TrialOOM(RuntimeError):
    """The micro-batch fell below the minimum and the step still did not fit."""


def release(device: torch.device) -> None:
    """Return cached blocks to the driver so the next trial (or a neighbour) can use them.

    Needed between trials in reused actors and after an OOM: PyTorch's caching allocator
    otherwise keeps the memory of tensors that are gone (the upstream early-stopped-trial
    OOM). `gc.collect` first, since reference cycles can still hold tensors. On CPU there is
    no cache to empty and freed tensors go back at once, so nothing is done: a full
    collection cost ~190 ms per trial in a Ray actor, all of it idle time for the trial's slot.
    """
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def is_oom(err: BaseException) -> bool:
    """torch.OutOfMemoryError, or an allocator RuntimeError saying the same (older paths)."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def halve(micro: int, minimum: int) -> int:
    """The next micro-batch after an OOM; raises TrialOOM below `minimum`."""
    smaller = micro // 2
    if smaller < max(1, minimum):
        raise TrialOOM(f"out of memory at micro-batch {micro} (minimum {minimum})")
    return smaller


def peak_bytes(device: torch.device) -> int:
    """Peak allocated memory since the last reset (0 on CPU, where it is not tracked)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
