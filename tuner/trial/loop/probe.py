"""The memory probe of `gpus_per_worker: pack`: one configuration's peak on one whole GPU.

A few real optimizer steps and one evaluation chunk of the configuration, built exactly as a
trial builds it, with no OOM back-off (the probe measures the configuration as set). It runs
as a Ray task holding a whole GPU, before the sweep's trials start; `tuner.packing` turns the
figures into trials per GPU.
"""

from __future__ import annotations

import sys
import tempfile
from itertools import islice
from typing import Any

import torch

from tuner.packing import MemoryProfile
from tuner.trial.frame.gpu import make_gpu
from tuner.trial.frame.harness import forget_compiled
from tuner.trial.frame.memory import TrialOOM, is_oom, release
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.settings import Settings
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.run import build_parts, optimizer_step

# Enough steps for the optimizer's state and the allocator's steady state to appear.
PROBE_STEPS = 3
# The first OOM ends the probe (halve() refuses to go below this) and it is not searched.
AS_SET = {"min_micro_batch": sys.maxsize, "find_batch_size": False}


def measure(hp: dict[str, Any], spec: TrialSpec, steps: int = PROBE_STEPS) -> MemoryProfile:
    """Peak memory of a trial of `hp` on this process's CUDA device."""
    device = torch.device("cuda", torch.cuda.current_device())
    # The device as a trial configures it (trial/frame/harness.py): cuDNN's benchmark tries
    # algorithms whose workspaces a trial's peak includes, TF32 as the trial has it.
    gpu = make_gpu(device)
    gpu.configure(tf32=Settings.of(hp).tf32)
    torch.cuda.reset_peak_memory_stats(device)
    oom = False
    with tempfile.TemporaryDirectory(prefix="tuner-probe-") as tmp:
        p = None
        try:
            # Building takes memory too: the weights, and the optimizer's state (made then).
            p = build_parts({**hp, **AS_SET}, spec, LocalSession(tmp), device, gpu)
            for x, y in islice(p.feed(p.train.train_steps(0, p.per_rank_batch)), steps):
                optimizer_step(p, x, y)
            p.model.eval()
            x, _ = next(p.feed(p.val.eval_chunks(p.eval_batch)))
            with torch.inference_mode(), p.amp.autocast():
                p.model(x)
            torch.cuda.synchronize(device)
        except Exception as err:  # noqa: BLE001 - only running out of memory is an answer
            if not (isinstance(err, TrialOOM) or is_oom(err)):
                raise
            oom = True
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        profile = MemoryProfile(
            device_name=torch.cuda.get_device_name(device),
            total=total,
            peak_allocated=torch.cuda.max_memory_allocated(device),
            peak_reserved=torch.cuda.max_memory_reserved(device),
            # Measured last: CUDA loads kernels and library handles lazily, on first use.
            # Anything else on this GPU is counted too, which errs on the safe side.
            context=max(0, total - free - reserved),
            oom=oom,
        )
        if p is not None:
            p.close()
        del p
    forget_compiled()  # (a later task in this Ray worker compiles for itself)
    release(device)
    return profile
