"""The GPU as a trial sees it: its share of memory, and per-epoch statistics.

`make_gpu(device)` gives the loop one object whatever the device: `NoGpu` on CPU (claims
nothing, measures nothing), `Gpu` on CUDA. Before a trial on a shared GPU builds anything,
`claim` checks that its share of the GPU's memory is free (Ray's GPU fractions are logical
only: nothing stops a neighbour from holding more than its part) and caps PyTorch's allocator
at that share, so a trial that outgrows it runs out of memory itself instead of crashing its
neighbours. Each epoch, `stats` gives utilisation (NVML, when it can be loaded) and memory
figures for TensorBoard and the trial's results.

torch is imported where it is used: a trial actor that trains nothing itself (a script's) gets
a `NoGpu` without importing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from tuner.packing import CONTEXT_ESTIMATE, GiB, Share, share, shortfall
from tuner.trial.frame.memory import expandable_segments, release

if TYPE_CHECKING:
    import torch

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

    def configure(self, tf32: bool) -> None:
        """Process-wide CUDA settings for this trial's kernels."""

    def start_epoch(self) -> None: ...

    def sync(self) -> None:
        """Wait for the device's queued work, so a clock read after it counts that work."""

    def stats(self) -> dict[str, float]:
        return {}


class Gpu(NoGpu):
    """One CUDA device: memory share, peaks per epoch, utilisation through `nvml`."""

    def __init__(self, device: torch.device, nvml: Optional[Nvml] = None, wait_s: float = CLAIM_WAIT_S):
        self.device, self.nvml, self.wait_s = device, nvml, wait_s

    def claim(self, fraction: float, margin: float, context: Optional[int] = None) -> Optional[Share]:
        # Cached blocks of this process (an earlier trial of a reused actor) are this trial's
        # to use: hand them back first, then count what is still reserved as available too.
        import torch

        release(self.device)
        free, total = self._available()
        part = share(total, fraction, margin, CONTEXT_ESTIMATE if context is None else context)
        if part.tenants == 1:
            # Alone on its GPU a trial takes what there is: refusing it because a desktop's
            # display holds a little of it would help no one. An earlier trial's cap in this
            # process (a packed sweep before) is lifted.
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
            return part
        # Under a cap, fragmentation turns into OOMs well below the cap: segments that grow
        # in place instead of new fixed-size ones.
        expandable_segments()
        deadline = time.monotonic() + self.wait_s
        while (why := shortfall(free, part.budget, total)) is not None:
            if time.monotonic() > deadline:
                raise GpuMemoryUnavailable(f"this trial ({fraction:g} GPU, {part.tenants} per GPU) {why}")
            time.sleep(1.0)
            free, total = self._available()
        torch.cuda.set_per_process_memory_fraction(part.cap, self.device)
        return part

    def configure(self, tf32: bool) -> None:
        import torch

        # TF32 tensor cores for fp32 matmuls and convolutions: IEEE fp32 matmuls run several
        # times slower on Ampere and later, for precision training does not need.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        # Time each convolution's algorithms once per shape and keep the fastest (cuDNN's
        # heuristic pick is often not it); shapes are fixed within a trial.
        torch.backends.cudnn.benchmark = True

    def _available(self) -> tuple[int, int]:
        """Free device memory plus this process's cached blocks (reserved but not allocated:
        tensors still alive in this process are not available), and the total."""
        import torch

        free, total = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + max(cached, 0), total

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def start_epoch(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)
        if self.nvml is not None:
            self.nvml.mark()

    def stats(self) -> dict[str, float]:
        import torch

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
    """GPU utilisation over an epoch from NVML's own sample buffer (no polling thread).

    `mark` remembers the newest sample's own timestamp (NVML promises only a "CPU timestamp",
    not wall-clock microseconds); `utilisation` averages the samples after it. NVML samples
    every 1/6 s or so: an epoch shorter than that has none, and NVML says NOT_FOUND; the
    current utilisation stands in then.
    """

    def __init__(self, lib: Any, handle: Any):
        self.lib, self.handle = lib, handle
        self.since = 0

    def _samples(self, since: int) -> Sequence[Any]:
        try:
            _, samples = self.lib.nvmlDeviceGetSamples(
                self.handle, self.lib.NVML_GPU_UTILIZATION_SAMPLES, since
            )
        except self.lib.NVMLError_NotFound:
            return []  # no sample newer than `since`
        return samples

    def mark(self) -> None:
        try:
            self.since = max((s.timeStamp for s in self._samples(0)), default=self.since)
        except self.lib.NVMLError as err:
            log.debug("NVML samples unavailable: %s", err)

    def utilisation(self) -> Optional[float]:
        """Mean utilisation (%) since `mark`, or the current value where samples are missing."""
        try:
            mean = mean_utilisation(self._samples(self.since), self.since)
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
        import torch

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
