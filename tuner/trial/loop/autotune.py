"""`training.autotune`'s arms, measured where a trial would run (torch: run in a Ray task).

Each arm builds the trial's parts afresh with its settings (`build_parts`, as a trial does:
same seed, so the same weights and batches; a DDP or FSDP trial's rank 0, its share of the
batch, with its strategy on a process group of one), trains `WARMUP_STEPS` optimizer steps,
takes the batches its loader holds ready untimed, then times a window of steps in segments
between device synchronisations (`tuner.autotune` says how long and why), and reports samples/s
over the window, the spread of its segments' rates, and the mean loss of the same steps in
every arm. Between arms, compiled graphs are dropped (`torch.compiler.reset`), so each compiled
arm pays for and measures its own compile, and memory is handed back.

The search itself (which arm next, the loss guard, the choice) is `tuner.autotune`'s, pure;
this module only measures, as the memory probe (`probe`) measures memory.
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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


def environment(device: torch.device) -> tuple[str, str, str]:
    """(device name, torch version, GPU driver version): with the model fingerprint, the
    cache's key. The driver is the kernel module's version ("" on CPU, or where it cannot be
    read): a new driver brings new kernels' speeds, so a choice is measured again."""
    if device.type != "cuda":
        return "CPU", torch.__version__, ""
    return torch.cuda.get_device_name(device), torch.__version__, gpu_driver()


def gpu_driver(path: str = "/proc/driver/nvidia/version") -> str:
    """The NVIDIA kernel module's version ("580.159.04"), read from where the driver states
    it on Linux; "" where there is none (another vendor's GPU, another system)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else ""


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
    "key"): reused from `cached` (fingerprint -> entries) for this device, torch and driver,
    else measured, sharing one budget of `budget_s` seconds."""
    device = device_for(spec)
    name, version, driver = environment(device)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out, t0 = [], time.monotonic()
    with one_rank_group(spec, device):
        for config in configs:
            dims = dimensions_here(config, spec, searched, device)
            key = autotune.fingerprint(task, config, dims, spec.workers, spec.strategy)
            result = autotune.reuse(cached.get(key, {}), name, version, driver)
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
                result.device, result.torch, result.driver, result.measured_on = name, version, driver, now
            out.append({**result.to_json(), "key": key})
    return out


@contextmanager
def one_rank_group(spec: TrialSpec, device: torch.device) -> Iterator[None]:
    """A process group of this one process, for the arms of a trial of several workers: they
    wrap the model in the trial's strategy (DDP, FSDP), whose constructors talk to a group."""
    import torch.distributed as dist

    if spec.workers <= 1 or dist.is_initialized():
        yield
        return
    cuda = device.type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1,
        device_id=device if cuda else None,
    )  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()


class ArmSession(LocalSession):
    """Rank 0 of the trial's `world` workers, for an arm: its share of the batch and of the data."""

    def __init__(self, root: str, world: int):
        super().__init__(root)
        self.rank, self.local_rank, self.world_size = 0, 0, max(1, world)


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
) -> autotune.Measurement:
    """One arm: `config` with `settings`, its steady samples/s (and their spread) over a timed
    window, and its loss."""
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
            p = build_parts(hp, spec, ArmSession(tmp, spec.workers), device, gpu)
            return _timed(p, gpu, warmup, deadline, t0)
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


class _Budget(Exception):
    """The budget ran out inside the arm's steps."""


class _Overrun(Exception):
    """A longer window ran past OVERRUN_S: the machine slowed down under it."""


def _timed(p: Any, gpu: Any, warmup: int, deadline: float, t0: float) -> autotune.Measurement:
    """Warm-up, the loader's buffer, then the timed window (see `window_steps`)."""
    batches = _steps(p)
    losses: list[torch.Tensor] = []
    count = [0, 0]  # optimizer steps taken, timed steps taken
    cut = [math.inf]  # the clock's reading at which a longer window is cut

    def step(timed: bool) -> int:
        x, y = next(batches)
        loss = optimizer_step(p, x, y)
        count[0] += 1
        if autotune.LOSS_AT - autotune.LOSS_STEPS < count[0] <= autotune.LOSS_AT:
            losses.append(loss / len(y))
        if timed:
            count[1] += 1
        if count[0] > warmup:
            now = time.monotonic()
            if now > deadline:
                raise _Budget
            if now > cut[0]:
                raise _Overrun
        return len(y)

    workers = p.train.workers()
    window, timed = window_steps(workers), 0
    kept: tuple[int, list[float]] = (0, [])  # the last complete window: its steps, its rates
    try:
        for _ in range(warmup):
            step(False)
        for _ in range(untimed_steps(warmup, p.train.buffered(), workers)):
            step(False)
        while True:
            # Up to the start of a round, whose first batch is waited for: the clock starts
            # once it is here.
            for _ in range((-count[0]) % max(1, workers) + 1):
                step(False)
            if timed:
                cut[0] = time.monotonic() + OVERRUN_S
            started = time.perf_counter()
            rates = _window(step, gpu, window)
            elapsed = time.perf_counter() - started
            kept = (window, rates)
            rate = statistics.median(rates)
            paced = window * p.per_rank_batch / rate  # seconds at its own pace
            timed += 1
            if paced >= autotune.MIN_WINDOW_S or window >= autotune.MAX_STEPS or timed == MAX_WINDOWS:
                break
            window = longer_window(window, paced, elapsed, workers)
    except _Budget:
        why = f"stopped at the budget after {count[1]} of {window} timed steps"
        return autotune.Measurement(seconds=time.monotonic() - t0, error=why)
    except _Overrun:
        # The arm keeps the window it completed: shorter than MIN_WINDOW_S at its pace, but
        # measured whole, where the longer one would have run on into the budget.
        window, rates = kept
        rate = statistics.median(rates)
    loss = float(torch.stack(losses).mean()) if losses else math.nan
    ordered = sorted(rates)
    spread = (ordered[-2] - ordered[1]) / 2 / rate  # the fastest and slowest segments left out
    seconds = time.monotonic() - t0
    return autotune.Measurement(rate, loss, seconds, spread=spread, steps=window, segments=rates)


def _window(step: Any, gpu: Any, window: int) -> list[float]:
    """The samples/s of each of the SEGMENTS segments of `window` timed steps."""
    gpu.sync()
    rates, mark = [], time.perf_counter()
    for _ in range(autotune.SEGMENTS):
        n = sum(step(True) for _ in range(window // autotune.SEGMENTS))
        gpu.sync()
        now = time.perf_counter()
        rates.append(n / max(now - mark, 1e-9))
        mark = now
    return rates


# Windows an arm times at most (each longer than the last), and the real seconds a longer
# window is planned for at most (at the pace the last one really took: the machine's other
# work included, which the median leaves out of the pace).
MAX_WINDOWS = 3
MAX_WINDOW_S = 10.0
# A longer window still running this many real seconds after it began (planned for at most
# MAX_WINDOW_S) met a machine that slowed down under it, a load that came and may stay: it is
# cut, and the arm keeps its last complete window, rather than run on into the budget and fail.
OVERRUN_S = 3 * MAX_WINDOW_S


def longer_window(window: int, paced: float, elapsed: float, workers: int) -> int:
    """A window long enough for MIN_WINDOW_S at the arm's pace (`window` steps in `paced`
    seconds; a fifth more, for the pace to vary), at least twice `window`, in whole rounds; at
    most MAX_STEPS, and at most MAX_WINDOW_S at the pace the last one took (`elapsed`)."""
    rounds = max(1, workers) * autotune.SEGMENTS
    wanted = max(math.ceil(window * 1.2 * autotune.MIN_WINDOW_S / max(paced, 1e-6)), 2 * window)
    most = min(autotune.MAX_STEPS, int(window * MAX_WINDOW_S / max(elapsed, 1e-6)))
    return max(window, min(-(-wanted // rounds) * rounds, most // rounds * rounds))


def untimed_steps(done: int, buffered: int, workers: int) -> int:
    """Steps to take untimed after `done` warm-up steps: at least the `buffered` batches the
    loader may hold ready, and one more (a CUDA feed holds one ahead), filled while the
    warm-up's slow steps ran (timed, they would read as speed the loader does not have); then
    up to the end of a round of its `workers`, which start a pass together and deliver in
    rounds, so that the next batch, waited for before the clock starts, begins a round."""
    if workers <= 0:
        return 0
    least = done + buffered + 1
    return -(-least // workers) * workers - done


def window_steps(workers: int) -> int:
    """Timed steps of an arm whose loader has `workers` processes: at least MIN_STEPS, whole
    rounds of the workers in each of the SEGMENTS segments, and enough rounds that one
    round's phase at either end moves the rate by less than MIN_GAIN (a loader of many
    workers delivers in bursts of them); at most MAX_STEPS."""
    rounds = max(1, workers) * autotune.SEGMENTS
    least = max(autotune.MIN_STEPS, math.ceil(max(1, workers) / autotune.MIN_GAIN))
    return min(-(-least // rounds) * rounds, max(rounds, autotune.MAX_STEPS // rounds * rounds))


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
