"""`training.autotune`'s arms, measured where a trial would run (torch: run in a Ray task).

Each arm builds the trial's parts afresh with its settings (`build_parts`, as a trial does:
same seed, so the same weights and batches), trains `WARMUP_STEPS` optimizer steps, then
`MEASURED_STEPS` between two device synchronisations, and reports samples/s over those and the
mean loss of the last few. Between arms, compiled graphs are dropped (`torch.compiler.reset`),
so each compiled arm pays for and measures its own compile, and memory is handed back.

The search itself (which arm next, the loss guard, the choice) is `tuner.autotune`'s, pure;
this module only measures, as the memory probe (`probe`) measures memory.
"""

from __future__ import annotations

import datetime
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import torch

from tuner import autotune
from tuner.trial.frame.gpu import make_gpu
from tuner.trial.frame.harness import forget_compiled, use_threads
from tuner.trial.frame.memory import TrialOOM, first_line, is_oom, release
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.amp import native_bf16
from tuner.trial.loop.run import build_parts, optimizer_step

# The arm measures the configuration as set: no OOM back-off, no batch-size search.
AS_SET = {"min_micro_batch": 1 << 62, "find_batch_size": False}


def environment(device: torch.device) -> tuple[str, str]:
    """(device name, torch version): with the model fingerprint, the cache's key."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return name, torch.__version__


def device_for(spec: TrialSpec) -> torch.device:
    """The device this process's trial would train on (a Ray task's GPU, else the CPU)."""
    if spec.gpus_per_worker > 0 and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def tune_sizes(
    configs: Sequence[dict[str, Any]],
    spec: TrialSpec,
    searched: Sequence[str],
    budget_s: float,
    task: dict[str, Any],
    cached: dict[str, dict[str, dict[str, Any]]],
) -> list[dict[str, Any]]:
    """Each configuration's result (autotune.Result as JSON, with its model fingerprint under
    "key"): reused from `cached` (fingerprint -> entries) for this device and torch, else
    measured, sharing one budget of `budget_s` seconds."""
    device = device_for(spec)
    name, version = environment(device)
    today = datetime.date.today().isoformat()
    out, t0 = [], time.monotonic()
    for config in configs:
        dims = dimensions_here(config, spec, searched, device)
        key = autotune.fingerprint(task, config, dims)
        result = autotune.reuse(cached.get(key, {}), name, version)
        if result is None:
            left = budget_s - (time.monotonic() - t0)
            result = autotune.Result({}, [], 0.0, budget_s, 1.0)  # the file's settings
            if not dims:
                result.note = "nothing to measure on this device"
            elif left <= 0:
                result.note = "no budget left for this size"
            else:
                try:
                    result = autotune.search(dims, _arms_of(config, spec, device), left)
                except autotune.AutotuneError as err:
                    result.note = str(err)
            result.budget_s = budget_s
            result.device, result.torch, result.measured_on = name, version, today
        out.append({**result.to_json(), "key": key})
    return out


def _arms_of(config: dict[str, Any], spec: TrialSpec, device: torch.device) -> autotune.Measure:
    return lambda settings, left: measure(config, spec, settings, device, left)


def dimensions_here(
    config: dict[str, Any], spec: TrialSpec, searched: Sequence[str], device: torch.device
) -> list[autotune.Dimension]:
    """The settings worth measuring for `config` on `device` (its data looked at once)."""
    from tuner.trial.loop.data import _as_tensors, load_data

    data = load_data(spec.data, spec.data_args, config, spec.search_path)
    return autotune.dimensions(
        searched,
        config,
        cuda=device.type == "cuda",
        images=len(data.input_shape) == 3,
        in_memory=_as_tensors(data.train) is not None,
        cpus=max(1, int(spec.cpus_per_worker)),
        bf16=native_bf16(device),
    )


def measure(
    config: dict[str, Any],
    spec: TrialSpec,
    settings: dict[str, Any],
    device: torch.device,
    seconds_left: float,
    warmup: int = autotune.WARMUP_STEPS,
    steps: int = autotune.MEASURED_STEPS,
) -> autotune.Measurement:
    """One arm: `config` with `settings`, its samples/s over `steps` synced steps and its loss."""
    t0 = time.monotonic()
    deadline = t0 + seconds_left
    threads = int(settings.get("threads") or config.get("threads") or max(1, int(spec.cpus_per_worker)))
    before = torch.get_num_threads()
    use_threads(threads)
    # Each compiled arm compiles for itself, not on graphs an earlier arm left cached.
    forget_compiled()
    gpu = make_gpu(device)
    gpu.configure(tf32=bool(config.get("tf32", True)))
    p = None
    try:
        with tempfile.TemporaryDirectory(prefix="tuner-autotune-") as tmp:
            hp = {**config, **settings, **AS_SET}
            p = build_parts(hp, spec, LocalSession(tmp), device, gpu)
            batches = _steps(p)
            for x, y in islice(batches, warmup):
                optimizer_step(p, x, y)
            gpu.sync()
            start, seen, losses = time.perf_counter(), 0, []
            for x, y in islice(batches, steps):
                losses.append(optimizer_step(p, x, y) / len(y))
                seen += len(y)
                if time.monotonic() > deadline:
                    return _stopped(t0, len(losses), steps)
            gpu.sync()
            elapsed = time.perf_counter() - start
            tail = losses[-autotune.LOSS_STEPS :]
            loss = float(torch.stack(tail).mean()) if tail else math.nan
            return autotune.Measurement(seen / max(elapsed, 1e-9), loss, time.monotonic() - t0)
    except Exception as err:  # noqa: BLE001 - an arm that fails is refused, not the sweep
        why = (
            f"out of memory: {first_line(err)}"
            if isinstance(err, TrialOOM) or is_oom(err)
            else first_line(err)
        )
        return autotune.Measurement(seconds=time.monotonic() - t0, error=f"{type(err).__name__}: {why}")
    finally:
        if p is not None:
            p.close()
        del p
        forget_compiled()
        release(device)
        use_threads(before)


def _stopped(t0: float, done: int, steps: int) -> autotune.Measurement:
    why = f"stopped at the budget after {done} of {steps} timed steps"
    return autotune.Measurement(seconds=time.monotonic() - t0, error=why)


def _steps(p: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Whole training batches, epoch after epoch, as long as asked for. An epoch's partial last
    batch is left out: under compile its new shape would recompile inside the timed steps."""
    if len(p.train) == 0:
        return
    whole_only = len(p.train) >= p.per_rank_batch  # (a split smaller than a batch: all of it)
    epoch = 0
    while True:
        for x, y in p.feed(p.train.train_steps(epoch, p.per_rank_batch)):
            if len(y) == p.per_rank_batch or not whole_only:
                yield x, y
        epoch += 1
