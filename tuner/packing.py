"""GPU packing arithmetic: how many trials share one GPU, and how much memory each may hold.

Ray's fractional GPUs are logical only: four trials at 0.25 GPU each see the whole device, and
one that allocates more than a quarter takes the memory its neighbours need, so they crash.
Hence two halves:

- `gpus_per_worker: pack` measures the peak memory of the space's largest configuration on one
  GPU (`tuner.trial.loop.probe`), and `pack` turns that figure into trials per GPU and Ray's fraction;
  a configuration that cannot fit a whole GPU is refused before any trial starts.
- Every trial on a shared GPU caps its own allocator at its share (`share`, applied in
  `tuner.trial.frame.gpu`), so a trial that outgrows its share runs out of memory by itself (and
  backs off or ends as `failure: oom`) instead of taking its neighbours down.

Sizes are bytes. Pure functions, importing neither torch nor Ray: tested from given figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any, Optional

from tuner.space.constraints import allows
from tuner.space.params import ParamT, grid_values, values_of

GiB = 1024**3
# What a CUDA context (driver state, kernels, cuBLAS/cuDNN handles) holds per process, outside
# PyTorch's allocator. The probe measures it; this stands in where nothing was measured
# (CUDA 12 with lazy module loading: about 0.3-0.6 GiB, more on older CUDA).
CONTEXT_ESTIMATE = 512 * 1024**2
# Ray accounts GPU fractions in units of 1/10000.
RAY_GPU_RESOLUTION = 10_000


class NoFit(ValueError):
    """The measured configuration does not fit one GPU; the message says by how much."""


@dataclass(frozen=True)
class MemoryProfile:
    """What the probe measured for one configuration on one whole GPU."""

    device_name: str
    total: int  # the device's memory
    peak_allocated: int  # torch.cuda.max_memory_allocated: live tensors at the peak
    peak_reserved: int  # torch.cuda.max_memory_reserved: what the allocator held (>= allocated)
    context: int  # used on the device besides the allocator's reserve (CUDA context)
    oom: bool = False  # the probe itself ran out of memory
    label: str = "the largest configuration"  # what was measured, for messages

    @property
    def need(self) -> int:
        """Device memory one trial of this configuration occupies at its peak."""
        return self.peak_reserved + self.context


@dataclass(frozen=True)
class Packing:
    """How a sweep shares its GPUs."""

    trials_per_gpu: int
    fraction: float  # gpus_per_worker Ray gets: trials_per_gpu of them fit on one GPU
    budget: int  # allocator bytes each trial may hold


@dataclass(frozen=True)
class Share:
    """What one trial at `fraction` of a GPU may use."""

    tenants: int  # trials Ray can place on the GPU at this fraction
    budget: int  # bytes this trial's allocator may hold
    cap: float  # torch.cuda.set_per_process_memory_fraction value; 1.0: not capped


def usable(total: int, margin: float) -> int:
    """Memory trials may count on after the safety margin."""
    return int(total * (1.0 - margin))


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def pack(profile: MemoryProfile, margin: float, max_per_gpu: int) -> Packing:
    """Trials per GPU and Ray's fraction from a measured peak; NoFit when not even one fits."""
    room = usable(profile.total, margin)
    if profile.oom or profile.need > room:
        peak = "more than the whole GPU" if profile.oom else gib(profile.need)
        raise NoFit(
            f"{profile.label} needs {peak} at its peak, but one {profile.device_name} "
            f"has {gib(profile.total)} ({gib(room)} after the {margin:g} margin)"
        )
    per_gpu = min(max_per_gpu, room // profile.need)
    return Packing(
        trials_per_gpu=per_gpu,
        fraction=fraction_for(per_gpu),
        budget=room // per_gpu - profile.context,
    )


def fraction_for(trials_per_gpu: int) -> float:
    """The largest fraction of which `trials_per_gpu` fit on one GPU in Ray's accounting."""
    return math.floor(RAY_GPU_RESOLUTION / trials_per_gpu) / RAY_GPU_RESOLUTION


def tenants(fraction: float) -> int:
    """Trials of one sweep that Ray places on one GPU when each asks for `fraction`."""
    if fraction >= 1:
        return 1
    return max(1, math.floor(1.0 / fraction + 1e-6))


def share(total: int, fraction: float, margin: float, context: int = CONTEXT_ESTIMATE) -> Share:
    """A trial's part of a GPU: equal parts of the usable memory, less its CUDA context.

    A trial alone on its GPU (fraction >= 1) is not capped: the margin is there for sharing.
    """
    n = tenants(fraction)
    budget = max(0, usable(total, margin) // n - context)
    return Share(tenants=n, budget=budget, cap=1.0 if n == 1 else budget / total)


def shortfall(free: int, budget: int, total: int) -> Optional[str]:
    """Why a trial cannot start with `free` bytes on its GPU, or None when its share is there."""
    if free >= budget:
        return None
    held = total - free
    return (
        f"needs {gib(budget)} of GPU memory free to start but only {gib(free)} of {gib(total)} is: "
        f"{gib(held)} is held by other processes (see nvidia-smi). Lower "
        "resources.max_trials_per_gpu, raise gpus_per_worker, or end the processes holding it"
    )


def concurrency(trials_per_gpu: int, gpus: float, workers: int = 1) -> int:
    """Trials that run at once when every GPU of the cluster holds `trials_per_gpu`."""
    return max(1, math.floor(trials_per_gpu * gpus + 1e-9) // workers)


# ----------------------------------------------------------------------------- the probe's config

# Names whose memory grows as the value falls (fewer, larger patches: fewer tokens).
SMALLER_IS_LARGER = {"patch_size"}
# Categorical values ordered from most memory to least.
MEMORY_ORDER: dict[str, list[Any]] = {
    "amp": ["off", "auto", "bf16", "fp16"],  # fp32 activations are the largest
    "optimizer": ["adamw", "adam", "rmsprop", "sgd"],  # two state tensors per parameter vs one
    "compile": [False, True],  # eager keeps every intermediate; fusion frees some
    "prefetch": [True, False],  # a second batch is on the device
}


def probe_config(params: dict[str, ParamT], constraints: Sequence[str] = ()) -> dict[str, Any]:
    """The configuration of the space that should need the most memory.

    Numbers take their largest value (smallest for `patch_size`), known categoricals their
    most memory-hungry value (MEMORY_ORDER), other choices their first. The probe measures
    the configuration as set: it never searches a batch size itself. Where that breaks a
    constraint (width 512 with 12 heads, under `width % heads == 0`), the configuration that
    keeps them with the values nearest the top overall (the least sum of each value's rank,
    largest first, among grid values: an estimate).
    """
    config = {name: _largest(name, param) for name, param in params.items()}
    if not allows(constraints, config):
        config = _nearest_allowed(params, constraints) or config
    config["find_batch_size"] = False
    return config


def _nearest_allowed(params: dict[str, ParamT], constraints: Sequence[str]) -> Optional[dict[str, Any]]:
    names = list(params)
    ranked = [_by_size(n, params[n]) for n in names]
    best: Optional[tuple[int, dict[str, Any]]] = None
    for i, combo in enumerate(product(*[range(len(r)) for r in ranked])):
        if i >= PROBE_CANDIDATES:
            break
        config = {n: ranked[j][k] for j, (n, k) in enumerate(zip(names, combo, strict=True))}
        if (best is None or sum(combo) < best[0]) and allows(constraints, config):
            best = (sum(combo), config)
    return best[1] if best else None


PROBE_CANDIDATES = 100_000


def _by_size(name: str, param: ParamT) -> list[Any]:
    """The values `_nearest_allowed` tries, the most memory-hungry first."""
    first = _largest(name, param)
    rest = [v for v in grid_values(param, 5) if v != first]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rest)
    if numbers:
        rest.sort(reverse=name not in SMALLER_IS_LARGER)
    return [first, *rest]


def label(config: dict[str, Any], searched: Iterable[str]) -> str:
    """'the largest configuration (width=512, ...)', naming the searched parameters."""
    shown = ", ".join(f"{k}={config[k]}" for k in searched if k in config)
    return f"the largest configuration ({shown})" if shown else "the configuration"


def _largest(name: str, param: ParamT) -> Any:
    listed = values_of(param)
    if listed is None:
        return param.low if name in SMALLER_IS_LARGER else param.high  # type: ignore[union-attr]
    order = MEMORY_ORDER.get(name)
    if order is not None:
        known = [v for v in order if v in listed]
        return known[0] if known else listed[0]
    numbers = [v for v in listed if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) == len(listed):
        return min(numbers) if name in SMALLER_IS_LARGER else max(numbers)
    return listed[0]
