"""The GPU path's settings on CPU: each falls back (or runs) here, and tests what it can.

AMP (bf16 autocast), the feed/prefetcher, channels_last, torch.compile, find_batch_size, GPU
statistics and the memory share. What needs CUDA is in test_gpu_cuda.py (skipped without it).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.test_loop import DIGITS, SYNTH, hp, train
from tuner.config import TrainingSection
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.gpu import Gpu, NoGpu, Nvml, make_gpu, mean_utilisation
from tuner.trial.frame.session import cuda_index
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.amp import make_amp
from tuner.trial.loop.batchsize import largest_fitting
from tuner.trial.loop.data import Batches, TensorData
from tuner.trial.loop.models import build_model
from tuner.trial.loop.prefetch import CudaPrefetcher, Feed, make_feed

CPU = torch.device("cpu")


def _weights(root: Path) -> dict[str, torch.Tensor]:
    return DirCheckpoints(str(root)).load("cpu")["model"]


# ----------------------------------------------------------------------------- AMP


def test_amp_off_is_a_no_op_and_bf16_autocasts_without_a_scaler() -> None:
    off = make_amp("off", CPU)
    assert off.dtype is None and not off.scaler.is_enabled()
    with off.autocast():
        assert not torch.is_autocast_enabled("cpu")
    bf16 = make_amp("bf16", CPU)
    assert bf16.dtype is torch.bfloat16 and not bf16.scaler.is_enabled()  # fp32's exponent range
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype is torch.bfloat16
    assert make_amp("auto", CPU).mode == "off"  # auto never autocasts on CPU


def test_evaluation_runs_under_autocast(tmp_path: Path) -> None:
    (tmp_path / "spy.py").write_text(
        textwrap.dedent("""
        import torch
        SEEN = []

        class Spy(torch.nn.Linear):
            def forward(self, x):
                if not self.training:
                    SEEN.append(torch.is_autocast_enabled("cpu"))
                return super().forward(x)

        def build(config, input_shape, num_classes):
            return Spy(input_shape[0], num_classes)
    """)
    )
    spec = TrialSpec(
        model="spy:build",
        data="synthetic",
        data_args=SYNTH.data_args,
        max_epochs=1,
        search_path=str(tmp_path),
    )
    train(tmp_path / "out", spec, hp(amp="bf16"))
    import spy  # imported by the trial from search_path

    assert spy.SEEN and all(spy.SEEN)


# ----------------------------------------------------------------------------- feed / prefetch


def test_prefetch_falls_back_to_plain_iteration_on_cpu() -> None:
    feed = make_feed(CPU, lambda x: x.float() / 255, prefetch=True)
    assert type(feed) is Feed and not isinstance(feed, CudaPrefetcher)
    batches = [(torch.full((2, 3), 255, dtype=torch.uint8), torch.tensor([0, 1]))] * 3
    out = list(feed(batches))
    assert len(out) == 3 and all(x.dtype is torch.float32 and torch.all(x == 1) for x, _ in out)


def test_results_are_identical_with_prefetch_on_and_off(tmp_path: Path) -> None:
    on = train(tmp_path / "on", DIGITS, hp(prefetch=True))
    off = train(tmp_path / "off", DIGITS, hp(prefetch=False))
    assert [m["val_loss"] for m in on.metrics] == [m["val_loss"] for m in off.metrics]
    for k, v in _weights(tmp_path / "on").items():
        assert torch.equal(v, _weights(tmp_path / "off")[k])


def test_every_rank_evaluates_the_same_number_of_chunks() -> None:
    ds = TensorData(torch.arange(121).float().unsqueeze(1), torch.zeros(121, dtype=torch.long))
    ranks = [Batches(ds, device=CPU, rank=r, world_size=2, seed=0) for r in range(2)]
    chunks = [list(b.eval_chunks(20)) for b in ranks]
    assert len(chunks[0]) == len(chunks[1]) == 4  # 61 and 60 samples, at most 20 at a time
    assert all(len(y) <= 20 for c in chunks for _, y in c)
    seen = sorted(int(v) for c in chunks for x, _ in c for v in x.flatten())
    assert seen == list(range(121))  # each sample once: exact metrics


class _Pids(torch.utils.data.Dataset):
    """Each sample says which process loaded it."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import os

        return torch.tensor([float(os.getpid())]), torch.tensor(i)


def test_a_split_keeps_one_loader_and_its_worker_processes_for_the_whole_trial() -> None:
    batches = Batches(_Pids(), device=CPU, rank=0, world_size=1, seed=0, loader_workers=2)
    seen = []
    for epoch in range(3):
        steps = list(batches.train_steps(epoch, 8))
        order = [int(i) for _, y in steps for i in y]
        assert sorted(order) == list(range(40))  # every sample once, in the epoch's own order
        seen.append(({int(x) for x, _ in steps for x in x.flatten()}, order))
        chunks = list(batches.eval_chunks(16))
        assert [int(i) for _, y in chunks for i in y] == list(range(40))
    pids = [p for p, _ in seen]
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]  # the same two workers throughout
    assert seen[0][1] != seen[1][1]  # reshuffled each epoch
    loader = batches._loader
    assert loader is not None and loader.persistent_workers
    batches.close()
    assert batches._loader is None


# ----------------------------------------------------------------------------- channels_last, compile


def test_channels_last_formats_model_and_inputs(tmp_path: Path) -> None:
    feed = make_feed(CPU, lambda x: x.float(), prefetch=True, memory_format=torch.channels_last)
    (x, _), *_ = feed([(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2))])
    assert x.is_contiguous(memory_format=torch.channels_last)
    spec = TrialSpec(model="cnn", data="digits", max_epochs=2)
    params = hp(channels=8, blocks=2)
    last = train(tmp_path / "nhwc", spec, {**params, "channels_last": True})
    first = train(tmp_path / "nchw", spec, params)
    # The same convolutions in another memory layout: equal up to summation order.
    assert last.metrics[-1]["val_loss"] == pytest.approx(first.metrics[-1]["val_loss"], rel=1e-3)


def test_channels_last_on_non_images_is_ignored_with_a_warning(tmp_path: Path) -> None:
    s = train(tmp_path, SYNTH, hp(channels_last=True))
    assert s.metrics[-1]["val_acc"] > 0.5
    assert "channels_last ignored" in (tmp_path / "trial.log").read_text()


@pytest.mark.slow  # torch.compile on CPU: 2-5 s, at the quick tier's limit
def test_compile_trains_and_keeps_checkpoint_keys(tmp_path: Path) -> None:
    spec = TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 2})
    s = train(tmp_path, spec, hp(compile=True))
    assert s.metrics[-1]["val_acc"] > 0.8
    plain = build_model("mlp", hp(), (1, 8, 8), 10)
    assert set(_weights(tmp_path)) == set(plain.state_dict())  # no "_orig_mod." prefixes


# ----------------------------------------------------------------------------- find_batch_size

PICKY_MODULE = """
import os
import torch


class Picky(torch.nn.Module):
    \"\"\"Runs out of 'memory' above `limit` samples per forward (less 4 per rank).\"\"\"

    def __init__(self, limit, features, classes):
        super().__init__()
        self.limit, self.lin = limit, torch.nn.Linear(features, classes)

    def forward(self, x):
        if self.training and len(x) > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (test model: {len(x)} > {self.limit})")
        return self.lin(x.flatten(1))


def build(config, input_shape, num_classes):
    limit = int(config["limit"]) - 4 * int(os.environ.get("RANK", 0))
    return Picky(limit, input_shape[0], num_classes)
"""
PICKY = {"limit": 20, "find_batch_size": True}


def picky_spec(tmp: Path, epochs: int = 2) -> TrialSpec:
    """A trial of a model that 'runs out of memory' above a batch size, loaded from tmp."""
    (tmp / "picky.py").write_text(PICKY_MODULE)
    return TrialSpec(
        model="picky:build",
        data="synthetic",
        data_args=SYNTH.data_args,
        max_epochs=epochs,
        search_path=str(tmp),
    )


def test_find_batch_size_finds_the_largest_micro_batch_and_keeps_the_step(tmp_path: Path) -> None:
    spec = picky_spec(tmp_path)
    found = train(tmp_path / "found", spec, hp(batch_size=64, **PICKY))
    assert [m["micro_batch"] for m in found.metrics] == [20, 20]
    assert all(m["oom_backoffs"] == 0 for m in found.metrics)
    # The probe's steps are undone: the same training as micro_batch 20 set by hand, whose
    # accumulated steps are those of the whole batch of 64.
    by_hand = train(tmp_path / "hand", spec, hp(batch_size=64, limit=20, micro_batch=20))
    assert [m["val_loss"] for m in found.metrics] == [m["val_loss"] for m in by_hand.metrics]
    assert (
        "find_batch_size: micro-batch 20 of a per-worker batch of 64"
        in (tmp_path / "found" / "trial.log").read_text()
    )


def test_find_batch_size_with_nothing_that_fits_ends_as_oom(tmp_path: Path) -> None:
    s = train(
        tmp_path / "out",
        picky_spec(tmp_path),
        hp(batch_size=64, min_micro_batch=4, limit=3, find_batch_size=True),
    )
    (last,) = s.metrics
    assert last["failure"] == "oom" and "not even micro-batch 4 fits" in last["failure_detail"]
    assert last["val_acc"] == -float("inf")


@pytest.mark.parametrize("limit", [1, 7, 20, 63, 64, 100])
def test_largest_fitting_binary_search(limit: int) -> None:
    tried: list[int] = []

    def fits(n: int) -> bool:
        tried.append(n)
        return n <= limit

    assert largest_fitting(fits, 1, 64) == min(limit, 64)
    assert len(tried) <= 1 + 7  # the whole batch, then a binary search over 1..64
    assert largest_fitting(lambda n: False, 4, 64) is None


# ----------------------------------------------------------------------------- CUDA settings


def test_tf32_follows_the_setting_and_cudnn_benchmarks_its_convolutions() -> None:
    # Process-wide flags that need no GPU to be set: set, read back, restored.
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, cudnn_benchmark())
    gpu = Gpu(torch.device("cuda", 0))
    try:
        gpu.configure(tf32=False)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert cudnn_benchmark()
        gpu.configure(tf32=True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
        torch.backends.cudnn.benchmark = before[2]
    assert TrainingSection().tf32  # on unless a sweep says otherwise


def cudnn_benchmark() -> bool:
    return bool(torch.backends.cudnn.benchmark)


@pytest.mark.parametrize(
    ("ids", "visible", "index"),
    [
        ([3], "3", 0),  # Ray set CUDA_VISIBLE_DEVICES to the actor's GPU
        ([3], "1,3", 1),  # two GPUs visible to the actor, its own second
        ([3], None, 3),  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: every GPU visible
        (["GPU-a1"], "GPU-f0,GPU-a1", 1),  # UUIDs
    ],
)
def test_a_ray_actor_finds_its_own_gpu(ids: list[Any], visible: Any, index: int) -> None:
    assert cuda_index(ids, visible) == index


def test_a_gpu_that_is_not_visible_is_an_error_naming_both_not_gpu_0() -> None:
    # Issue 49, E10: GPU 0 is another trial's (or another rank's) GPU; training there
    # silently was the fall-back.
    with pytest.raises(RuntimeError, match=r"GPU 3, not among CUDA_VISIBLE_DEVICES=0,1"):
        cuda_index([3], "0,1")


# ----------------------------------------------------------------------------- GPU stats and share


def test_no_gpu_claims_nothing_and_reports_nothing(tmp_path: Path) -> None:
    gpu = make_gpu(CPU)
    assert type(gpu) is NoGpu
    assert gpu.claim(0.25, 0.1) is None and gpu.stats() == {}
    s = train(tmp_path, SYNTH, hp())
    assert not any(k.startswith("gpu_") for k in s.metrics[-1])


def _sample(ts: int, value: int) -> Any:
    return SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=value))


class FakeNvml:
    """The few pynvml calls Nvml makes, answering as NVML does: the samples newer than
    `since`, or NVML_ERROR_NOT_FOUND when there is none."""

    NVML_GPU_UTILIZATION_SAMPLES = 1

    class NVMLError(Exception):
        pass

    class NVMLError_NotFound(NVMLError):  # noqa: N801 - pynvml's name
        pass

    def __init__(self, samples: list[Any], current: int = 55, broken: bool = False):
        self.samples, self.current, self.broken = samples, current, broken

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, since: int) -> tuple[int, list[Any]]:
        if self.broken:
            raise self.NVMLError("not supported")
        newer = [s for s in self.samples if s.timeStamp > since]
        if not newer:
            raise self.NVMLError_NotFound("not found")
        return 1, newer

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=self.current)


def test_nvml_utilisation_is_the_mean_of_the_epochs_samples() -> None:
    assert mean_utilisation([_sample(5, 100), _sample(20, 40), _sample(30, 60)], since=10) == 50
    assert mean_utilisation([], since=0) is None
    # Timestamps on NVML's own clock, far from wall-clock microseconds: the mark is the
    # newest sample's timestamp, so only samples taken after it count.
    lib = FakeNvml([_sample(5_000, 10), _sample(7_000, 20)])
    nvml = Nvml(lib, handle=None)
    nvml.mark()
    assert nvml.since == 7_000
    lib.samples += [_sample(8_000, 90), _sample(9_000, 70)]
    assert nvml.utilisation() == 80  # the epoch's two samples
    nvml.mark()
    # An epoch shorter than NVML's sampling period: NOT_FOUND, the current value stands in.
    assert nvml.utilisation() == 55
    assert Nvml(FakeNvml([]), handle=None).utilisation() == 55  # no samples at all
    assert Nvml(FakeNvml([], broken=True), handle=None).utilisation() is None
