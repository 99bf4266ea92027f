"""GPU memory: releasing it, and what to do when a step runs out of it."""

from __future__ import annotations

import gc
import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    cuBLAS's workspaces (one per handle and stream, tens of MiB each on Hopper) are live
    allocations that `empty_cache` cannot return: they are dropped first.
    """
    if device.type == "cuda":
        import torch

        gc.collect()
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()


# What torch's allocators say when an allocation fails: CUDA's, HIP's, MPS's "... out of memory",
# and the CPU allocator's own words (c10's alloc_cpu.cpp: "DefaultCPUAllocator: can't allocate
# memory: you tried to allocate N bytes", or "not enough memory" where it does not use
# posix_memalign). Read in exceptions and in a script's stderr (tuner/trial/script/oom.py).
OOM_WORDS = r"out of memory|DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"
_SAYS_OOM = re.compile(OOM_WORDS, re.IGNORECASE)


def is_oom(err: BaseException) -> bool:
    """torch.OutOfMemoryError (torch.cuda's too, and Ray's error carrying one from another
    process: it subclasses its cause's class), or an allocator RuntimeError saying the same
    (the CPU allocator's; older paths). By the class's name: no torch needed to ask (a script's
    trial actor has none)."""
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(err).__mro__):
        return True
    return isinstance(err, RuntimeError) and _SAYS_OOM.search(str(err)) is not None


def first_line(err: BaseException) -> str:
    """The first line of an error's message (a CUDA OOM says what it tried to allocate there)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def halve(micro: int, minimum: int) -> int:
    """The next micro-batch after an OOM; raises TrialOOM below `minimum`."""
    smaller = micro // 2
    if smaller < max(1, minimum):
        raise TrialOOM(f"out of memory at micro-batch {micro} (minimum {minimum})")
    return smaller


EXPANDABLE = "expandable_segments:True"


def expandable_segments() -> bool:
    """Let this process's CUDA allocator grow segments in place (PyTorch's
    `expandable_segments`), unless the user configured the allocator; True when set here.

    For trials under a memory cap: with fixed-size segments, memory freed in one segment cannot
    serve a larger request, and a capped trial runs out of memory well below its cap. Set at
    run time (it applies to segments created from now on), so it also works in a reused actor
    whose CUDA allocator is already running.
    """
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        return False
    import torch

    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:  # torch < 2.9
        setter = torch.cuda.memory._set_allocator_settings
    setter(EXPANDABLE)
    return True
