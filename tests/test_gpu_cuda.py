"""The GPU path on a CUDA GPU: fp16 with GradScaler, bf16, the prefetcher, memory share and
probe, GPU statistics, find_batch_size against real OOMs, FSDP2 over NCCL.

Every test here skips itself without CUDA; their CPU counterparts are in test_gpu_features.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.test_loop import DIGITS, SYNTH, hp, train
from tuner.packing import GiB
from tuner.trial.amp import make_amp
from tuner.trial.checkpoint import DirCheckpoints
from tuner.trial.gpu import Gpu, GpuMemoryUnavailable, make_gpu
from tuner.trial.loop import build_parts, optimizer_step
from tuner.trial.prefetch import CudaPrefetcher, Feed, make_feed
from tuner.trial.session import LocalSession
from tuner.trial.spec import TrialSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda", 0)


def on_gpu(spec: TrialSpec, gpus: float = 1.0) -> TrialSpec:
    return TrialSpec(**{**spec.to_dict(), "gpus_per_worker": gpus})


@pytest.fixture(autouse=True)
def _uncapped() -> Iterator[None]:
    # Tests that claim a share cap this process's allocator; the next test starts whole.
    yield
    torch.cuda.set_per_process_memory_fraction(1.0, CUDA)
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- AMP


def test_auto_picks_bf16_where_supported_else_fp16() -> None:
    amp = make_amp("auto", CUDA)
    assert amp.mode == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    assert amp.scaler.is_enabled() == (amp.mode == "fp16")  # bf16 needs no loss scaling


def test_fp16_trains_with_a_grad_scaler_and_checkpoints_its_scale(tmp_path: Path) -> None:
    s = train(tmp_path, on_gpu(DIGITS), hp(amp="fp16"))
    assert s.metrics[-1]["val_acc"] > 0.85
    ckpt = DirCheckpoints(str(tmp_path)).load("cpu")  # the newest checkpoint of the trial
    assert ckpt["scaler"]["scale"] > 1  # a live scaler, saved for resume


def _parts(tmp_path: Path, **kw: object):
    params = hp(**kw)
    return build_parts(params, on_gpu(SYNTH), LocalSession(str(tmp_path)), CUDA)


def _batch(p) -> tuple[torch.Tensor, torch.Tensor]:
    return next(p.feed(p.train.train_steps(0, p.per_rank_batch)))


def test_fp16_clips_true_gradients_not_scaled_ones(tmp_path: Path) -> None:
    p = _parts(tmp_path, amp="fp16", grad_clip=1e-3, lr=0.0)
    x, y = _batch(p)
    for _ in range(8):  # until a step is not skipped for inf (the first scale may be too high)
        scale = p.amp.scaler.get_scale()
        optimizer_step(p, x, y)
        if p.amp.scaler.get_scale() == scale:
            break
    norm = torch.linalg.vector_norm(torch.stack([q.grad.norm() for q in p.model.parameters()]))
    # Unscaled before clipping: the norm is the clip value. Clipping the scaled gradients
    # (scale 65536) would leave a norm 65536 times smaller after the step unscaled them.
    assert norm.item() == pytest.approx(1e-3, rel=1e-2)


def test_fp16_skips_a_step_with_inf_gradients_and_backs_off_the_scale(tmp_path: Path) -> None:
    p = _parts(tmp_path, amp="fp16")
    x, y = _batch(p)
    before = [q.detach().clone() for q in p.model.parameters()]
    scale = p.amp.scaler.get_scale()
    optimizer_step(p, x * float("inf"), y)
    assert p.amp.scaler.get_scale() < scale
    for a, q in zip(before, p.model.parameters(), strict=True):
        assert torch.equal(a, q)  # the step was skipped


def test_bf16_evaluates_under_autocast_on_cuda(tmp_path: Path) -> None:
    s = train(tmp_path, on_gpu(DIGITS), hp(amp="bf16"))
    assert s.metrics[-1]["val_acc"] > 0.85


# ----------------------------------------------------------------------------- prefetch


def test_prefetcher_yields_what_the_plain_feed_does() -> None:
    batches = [
        (torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8).pin_memory(), torch.arange(8))
        for _ in range(5)
    ]
    prepare = lambda x: x.float().mul_(1 / 255)  # noqa: E731
    fast = make_feed(CUDA, prepare, prefetch=True)
    assert isinstance(fast, CudaPrefetcher)
    plain = Feed(CUDA, prepare)
    for (a, ya), (b, yb) in zip(fast(batches), plain(batches), strict=True):
        assert a.device.type == "cuda" and torch.equal(a, b) and torch.equal(ya, yb)


def test_training_is_the_same_with_and_without_the_prefetcher(tmp_path: Path) -> None:
    spec = on_gpu(TrialSpec(model="cnn", data="digits", max_epochs=2))
    params = hp(channels=8, blocks=1, amp="off")
    on = train(tmp_path / "on", spec, {**params, "prefetch": True})
    off = train(tmp_path / "off", spec, {**params, "prefetch": False})
    for a, b in zip(on.metrics, off.metrics, strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def test_channels_last_on_cuda_keeps_conv_weights_nhwc(tmp_path: Path) -> None:
    spec = on_gpu(TrialSpec(model="cnn", data="digits", max_epochs=1))
    p = build_parts(hp(channels=8, blocks=1, channels_last=True), spec, LocalSession(str(tmp_path)), CUDA)
    conv = next(m for m in p.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


# ----------------------------------------------------------------------------- memory share, stats


def test_a_claimed_share_caps_the_allocator() -> None:
    gpu = Gpu(CUDA, wait_s=0)
    part = gpu.claim(0.25, 0.1, context=0)
    assert part is not None and part.tenants == 4
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(int(part.budget * 1.5), dtype=torch.uint8, device=CUDA)  # beyond its share


def test_a_trial_whose_share_is_held_fails_clearly() -> None:
    free, total = torch.cuda.mem_get_info(CUDA)
    hog = torch.empty(int(free - 0.3 * total), dtype=torch.uint8, device=CUDA)  # leave 30% free
    try:
        with pytest.raises(GpuMemoryUnavailable, match="needs .* GiB of GPU memory free"):
            Gpu(CUDA, wait_s=0).claim(0.5, 0.0, context=0)  # wants 50%
    finally:
        del hog


def test_gpu_stats_reach_the_metrics(tmp_path: Path) -> None:
    s = train(tmp_path, on_gpu(DIGITS), hp())
    last = s.metrics[-1]
    assert 0 < last["gpu_mem_peak_gb"] <= last["gpu_mem_reserved_gb"]
    assert last["gpu_mem_used_gb"] > 0
    if make_gpu(CUDA).nvml is not None:  # type: ignore[attr-defined]
        assert 0 <= last["gpu_util"] <= 100


def test_probe_measures_a_peak_and_flags_what_does_not_fit() -> None:
    from tuner.trial.probe import measure

    small = measure(hp(), on_gpu(DIGITS))
    assert 0 < small.peak_allocated <= small.peak_reserved < small.total and not small.oom
    assert small.context > 0  # the CUDA context is outside the allocator
    # 1 GiB of weights, but some 200 GiB of activations for one step of 800k samples.
    many = TrialSpec(
        model="mlp", data="synthetic", data_args={"samples": 1 << 20, "features": 8}, max_epochs=1
    )
    huge = measure(hp(width=16384, depth=2, batch_size=800_000, amp="off"), on_gpu(many))
    assert huge.oom


def test_find_batch_size_against_real_out_of_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1.5 GiB for the trial: weights + Adam ~0.9 GiB, ~135 KB of activations per sample, so
    # some 4000 of the 7200 training samples fit in one micro-batch.
    monkeypatch.setattr(Gpu, "claim", lambda self, *a, **kw: None)  # keep the cap set here
    torch.cuda.set_per_process_memory_fraction(1.5 * GiB / torch.cuda.mem_get_info(CUDA)[1], CUDA)
    spec = on_gpu(
        TrialSpec(model="mlp", data="synthetic", data_args={"samples": 9000, "features": 1024}, max_epochs=1)
    )
    s = train(tmp_path, spec, hp(width=4096, depth=4, batch_size=8192, find_batch_size=True, amp="off"))
    last = s.metrics[-1]
    assert "failure" not in last, last
    assert 1 <= last["micro_batch"] < 8192


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP over NCCL needs 2 GPUs")
def test_fsdp_over_nccl_matches_ddp(tmp_path: Path) -> None:
    from tests.distributed import run_workers

    spec = on_gpu(
        TrialSpec(model="vit", data="synthetic_images", data_args={"samples": 256, "size": 32}, max_epochs=1)
    )
    params = hp(patch_size=8, width=64, depth=2, heads=2, amp="bf16", batch_size=32)
    ddp = run_workers(
        tmp_path / "ddp", params, TrialSpec(**{**spec.to_dict(), "strategy": "ddp"}), backend="nccl"
    )
    fsdp = run_workers(
        tmp_path / "fsdp", params, TrialSpec(**{**spec.to_dict(), "strategy": "fsdp"}), backend="nccl"
    )
    assert fsdp[0][-1]["val_loss"] == pytest.approx(
        ddp[0][-1]["val_loss"], rel=1e-2
    )  # bf16 reductions differ
