"""The GPU as a trial sees it: its share of memory, and per-epoch statistics.

`make_gpu(device)` gives the loop one object whatever the device: `NoGpu` on CPU (claims
nothing, measures nothing), `Gpu` on CUDA. Before a trial on a shared GPU builds anything,
`claim` checks that its share of the GPU's memory is free (Ray's GPU fractions are logical
only: nothing stops a neighbour from holding more than its part) and caps PyTorch's allocator
at that share, so a trial that outgrows it runs out of memory itself instead of crashing its
neighbours. Each epoch, `stats` gives utilisation (NVML, when it can be loaded) and memory
figures for TensorBoard and the trial's results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch

from tuner.packing import CONTEXT_ESTIMATE, GiB, Share, share, shortfall

log = logging.getLogger(__name__)

# A neighbour that just ended may still be handing memory back (its process exiting, or its
# actor emptying its cache): wait this long for a trial's share before giving up.
CLAIM_WAIT_S = 30.0


class GpuMemoryUnavailable(RuntimeError):
    """The trial's share of GPU memory is held by something else."""


class NoGpu:
    """CPU: nothing to claim, nothing to measure."""

    def claim(self, fraction: float, margin: float, context: Optional[int] = None) -> Optional[Share]:
        return None

    def start_epoch(self) -> None: ...

    def stats(self) -> dict[str, float]:
        return {}


class Gpu(NoGpu):
    """One CUDA device: memory share, peaks per epoch, utilisation through `nvml`."""

    def __init__(self, device: torch.device, nvml: Optional[Nvml] = None, wait_s: float = CLAIM_WAIT_S):
        self.device, self.nvml, self.wait_s = device, nvml, wait_s

    def claim(self, fraction: float, margin: float, context: Optional[int] = None) -> Optional[Share]:
        free, total = torch.cuda.mem_get_info(self.device)
        part = share(total, fraction, margin, CONTEXT_ESTIMATE if context is None else context)
        if part.tenants == 1:
            # Alone on its GPU a trial takes what there is: refusing it because a desktop's
            # display holds a little of it would help no one.
            return part
        deadline = time.monotonic() + self.wait_s
        while (why := shortfall(free, part.budget, total)) is not None:
            if time.monotonic() > deadline:
                raise GpuMemoryUnavailable(f"this trial ({fraction:g} GPU, {part.tenants} per GPU) {why}")
            time.sleep(1.0)
            free, total = torch.cuda.mem_get_info(self.device)
        torch.cuda.set_per_process_memory_fraction(part.cap, self.device)
        return part

    def start_epoch(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        if self.nvml is not None:
            self.nvml.mark()

    def stats(self) -> dict[str, float]:
        free, total = torch.cuda.mem_get_info(self.device)
        out = {
            "gpu_mem_peak_gb": torch.cuda.max_memory_allocated(self.device) / GiB,
            "gpu_mem_reserved_gb": torch.cuda.max_memory_reserved(self.device) / GiB,
            "gpu_mem_used_gb": (total - free) / GiB,  # the whole device: neighbours included
        }
        util = self.nvml.utilisation() if self.nvml is not None else None
        if util is not None:
            out["gpu_util"] = util  # the whole device: packed neighbours add to it
        return out


class Nvml:
    """GPU utilisation over an epoch from NVML's own sample buffer (no polling thread)."""

    def __init__(self, lib: Any, handle: Any, clock: Callable[[], float] = time.time):
        self.lib, self.handle, self.clock = lib, handle, clock
        self.since = 0

    def mark(self) -> None:
        self.since = int(self.clock() * 1e6)  # NVML timestamps: CPU time in microseconds

    def utilisation(self) -> Optional[float]:
        """Mean utilisation (%) since `mark`, or the current value where samples are missing."""
        try:
            _, samples = self.lib.nvmlDeviceGetSamples(
                self.handle, self.lib.NVML_GPU_UTILIZATION_SAMPLES, self.since
            )
            mean = mean_utilisation(samples, self.since)
            if mean is not None:
                return mean
            return float(self.lib.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except self.lib.NVMLError as err:
            log.debug("NVML utilisation unavailable: %s", err)
            return None


def mean_utilisation(samples: Sequence[Any], since: int) -> Optional[float]:
    """Mean of NVML utilisation samples (`.timeStamp` us, `.sampleValue.uiVal` %) after `since`."""
    values = [s.sampleValue.uiVal for s in samples if s.timeStamp > since]
    return sum(values) / len(values) if values else None


def open_nvml(device: torch.device) -> Optional[Nvml]:
    """NVML for `device` (found by UUID: indices differ under CUDA_VISIBLE_DEVICES), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()  # reference-counted: safe in every trial of a reused actor
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return Nvml(pynvml, handle)
    except Exception as err:  # noqa: BLE001 - no NVML means no utilisation, not a failed trial
        log.info("GPU utilisation not reported (NVML: %s)", err)
        return None


def make_gpu(device: torch.device) -> NoGpu:
    """What the loop talks to about its device."""
    if device.type != "cuda":
        return NoGpu()
    return Gpu(device, open_nvml(device))
