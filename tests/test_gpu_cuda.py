"""The GPU path on a CUDA GPU: fp16 with GradScaler, bf16, the prefetcher, memory share and
probe, GPU statistics, find_batch_size against real OOMs, FSDP2 over NCCL.

Every test here skips itself without CUDA; their CPU counterparts are in test_gpu_features.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.chaos import before_adam_step
from tests.test_loop import DIGITS, SYNTH, hp, train
from tuner.packing import GiB
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.gpu import Gpu, GpuMemoryUnavailable, make_gpu
from tuner.trial.frame.memory import release
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.amp import make_amp
from tuner.trial.loop.optim import build_optimizer
from tuner.trial.loop.prefetch import CudaPrefetcher, Feed, make_feed
from tuner.trial.loop.run import build_parts, optimizer_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda", 0)


def on_gpu(spec: TrialSpec, gpus: float = 1.0) -> TrialSpec:
    return TrialSpec(**{**spec.to_dict(), "gpus_per_worker": gpus})


@pytest.fixture(autouse=True)
def _uncapped() -> Iterator[None]:
    # Tests that claim a share cap this process's allocator (and switch it to expandable
    # segments); the next test starts whole, with the allocator's defaults.
    yield
    torch.cuda.set_per_process_memory_fraction(1.0, CUDA)
    torch.cuda.empty_cache()
    torch._C._accelerator_setAllocatorSettings("expandable_segments:False")


# ----------------------------------------------------------------------------- AMP


def test_auto_picks_bf16_where_the_gpu_has_it_natively_else_fp16() -> None:
    amp = make_amp("auto", CUDA)
    # Not is_bf16_supported(): by default it also counts emulated bf16 (V100, T4).
    assert amp.mode == ("bf16" if torch.cuda.get_device_capability(CUDA) >= (8, 0) else "fp16")
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


def test_training_is_the_same_with_and_without_the_prefetcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Trials benchmark cuDNN's algorithms, and the fastest may not be deterministic: asked
    # for deterministic ones here, two runs differ only if their batches do.
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    spec = on_gpu(TrialSpec(model="cnn", data="digits", max_epochs=2))
    params = hp(channels=8, blocks=1, amp="off", tf32=False)
    on = train(tmp_path / "on", spec, {**params, "prefetch": True})
    off = train(tmp_path / "off", spec, {**params, "prefetch": False})
    for a, b in zip(on.metrics, off.metrics, strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def test_a_dataloader_with_pinned_memory_feeds_the_prefetcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Data not held in memory: DataLoader worker processes, pinned batches, the side-stream
    # copy. The same training with the plain feed (deterministic kernels, IEEE fp32).
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    pinned: list[bool] = []
    load = Feed.load

    def spy(self: Feed, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        pinned.append(batch[0].is_pinned())
        return load(self, batch)

    monkeypatch.setattr(Feed, "load", spy)
    spec = on_gpu(
        TrialSpec(model="cnn", data="synthetic_images", data_args={"samples": 512, "size": 32}, max_epochs=2)
    )
    params = hp(channels=8, blocks=1, amp="off", tf32=False, loader_workers=2, batch_size=64)
    fed = train(tmp_path / "on", spec, {**params, "prefetch": True})
    assert pinned and all(pinned)  # every host batch was in pinned pages
    plain = train(tmp_path / "off", spec, {**params, "prefetch": False})
    assert [m["train_samples"] for m in fed.metrics] == [410, 410]  # 512 less the 20% held out
    for a, b in zip(fed.metrics, plain.metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def test_channels_last_on_cuda_keeps_conv_weights_nhwc(tmp_path: Path) -> None:
    spec = on_gpu(TrialSpec(model="cnn", data="digits", max_epochs=1))
    p = build_parts(hp(channels=8, blocks=2, channels_last=True), spec, LocalSession(str(tmp_path)), CUDA)
    # A conv with several input channels: with one, NCHW and NHWC strides are the same.
    conv = next(m for m in p.model.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels > 1)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()


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


def test_a_claim_counts_this_process_s_own_cache_as_available() -> None:
    total = torch.cuda.mem_get_info(CUDA)[1]
    cached = torch.empty(int(0.7 * total), dtype=torch.uint8, device=CUDA)
    del cached  # freed, but held in this process's cache (an earlier trial of the actor)
    assert torch.cuda.memory_reserved(CUDA) >= 0.7 * total
    part = Gpu(CUDA, wait_s=0).claim(0.5, 0.0, context=0)  # half the GPU: needs the cache
    assert part is not None and torch.cuda.memory_reserved(CUDA) < 0.1 * total


def test_a_whole_gpu_claim_lifts_an_earlier_share_cap() -> None:
    total = torch.cuda.mem_get_info(CUDA)[1]
    Gpu(CUDA, wait_s=0).claim(0.25, 0.1, context=0)  # a packed trial before, in this actor
    Gpu(CUDA, wait_s=0).claim(1.0, 0.1, context=0)
    big = torch.empty(int(0.5 * total), dtype=torch.uint8, device=CUDA)  # twice the old cap
    del big


def test_a_capped_trial_grows_expandable_segments() -> None:
    Gpu(CUDA, wait_s=0).claim(0.5, 0.1, context=0)
    x = torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)
    segments = torch.cuda.memory._snapshot()["segments"]
    mine = [seg for seg in segments if seg["address"] <= x.data_ptr() < seg["address"] + seg["total_size"]]
    assert len(mine) == 1 and mine[0]["is_expandable"]


def test_two_trials_in_one_process_hand_back_their_memory(tmp_path: Path) -> None:
    big = on_gpu(
        TrialSpec(model="mlp", data="synthetic", data_args={"samples": 4096, "features": 1024}, max_epochs=1)
    )
    params = hp(width=4096, depth=4, batch_size=512, optimizer="adam")
    release(CUDA)
    allocated, reserved = torch.cuda.memory_allocated(CUDA), torch.cuda.memory_reserved(CUDA)
    first = train(tmp_path / "a", big, params)
    assert first.metrics[-1]["gpu_mem_reserved_gb"] > 0.5  # weights, grads, Adam: ~0.8 GiB
    # Nothing of the trial is left and its cache is handed back, cuBLAS's workspaces included
    # (32 MiB or more per handle and stream on Hopper: not the trial's 0.8 GiB either way).
    assert torch.cuda.memory_allocated(CUDA) - allocated < 16 * 2**20
    assert torch.cuda.memory_reserved(CUDA) - reserved < 64 * 2**20
    second = train(tmp_path / "b", on_gpu(big, 0.5), params)  # claims half the GPU
    assert "failure" not in second.metrics[-1]


def test_gpu_stats_reach_the_metrics(tmp_path: Path) -> None:
    s = train(tmp_path, on_gpu(DIGITS), hp())
    last = s.metrics[-1]
    assert 0 < last["gpu_mem_peak_gb"] <= last["gpu_mem_reserved_gb"]
    assert last["gpu_mem_used_gb"] > 0
    if make_gpu(CUDA).nvml is not None:  # type: ignore[attr-defined]
        assert 0 <= last["gpu_util"] <= 100


def test_probe_measures_a_peak_and_flags_what_does_not_fit() -> None:
    from tuner.trial.loop.probe import measure

    small = measure(hp(), on_gpu(DIGITS))
    assert 0 < small.peak_allocated <= small.peak_reserved < small.total and not small.oom
    assert small.context > 0  # the CUDA context is outside the allocator
    # 1 GiB of weights, but some 200 GiB of activations for one step of 800k samples.
    many = TrialSpec(
        model="mlp", data="synthetic", data_args={"samples": 1 << 20, "features": 8}, max_epochs=1
    )
    huge = measure(hp(width=16384, depth=2, batch_size=800_000, amp="off"), on_gpu(many))
    assert huge.oom


def test_the_probe_measures_with_the_trial_s_cudnn_and_tf32_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.trial.loop import probe

    seen = []
    real_step = probe.optimizer_step

    def step(*args: object) -> object:  # what the backends are set to while a step runs
        seen.append((torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32))
        return real_step(*args)

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(probe, "optimizer_step", step)
    probe.measure(hp(tf32=True), on_gpu(DIGITS))
    assert seen and set(seen) == {(True, True)}, seen


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


def test_fused_optimizers_on_cuda() -> None:
    model = torch.nn.Linear(8, 4).to(CUDA)
    for name, fused in (("adam", True), ("adamw", True), ("sgd", True), ("rmsprop", None)):
        opt = build_optimizer(model, hp(optimizer=name))
        assert opt.defaults.get("fused") == fused, name
        assert all(opt.state[q] for q in model.parameters()) or name == "sgd"


def test_compile_on_cuda_trains(tmp_path: Path) -> None:
    s = train(tmp_path, on_gpu(TrialSpec(model="cnn", data="digits", max_epochs=2)), hp(compile=True))
    assert s.metrics[-1]["val_acc"] > 0.8


def test_a_real_oom_in_the_optimizer_step_is_retried_and_the_trial_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def allocate_too_much() -> None:  # a real allocation the CUDA allocator refuses
        torch.empty(2 * torch.cuda.mem_get_info(CUDA)[1], dtype=torch.uint8, device=CUDA)

    before_adam_step(monkeypatch, 3, allocate_too_much)  # after the state's step and one real
    s = train(tmp_path, on_gpu(SYNTH), hp(optimizer="adam", batch_size=256))
    last = s.metrics[-1]
    assert "failure" not in last and last["epoch"] == SYNTH.max_epochs
    log = (tmp_path / "trial.log").read_text()
    assert "OOM in the optimizer step" in log and "Tried to allocate" in log  # torch's own message


def _with_strategy(rank: int, root: str, params: dict, spec: dict) -> None:
    # One rank over NCCL: DDP/FSDP as they are, though make_strategy skips them for one worker.
    import tuner.trial.loop.run as loop
    from tuner.trial.loop.parallel import STRATEGIES

    loop.make_strategy = lambda name, world: STRATEGIES[name]()
    session = LocalSession(root)
    loop.run_trial(params, TrialSpec(**spec), session)
    Path(root, "metrics.json").write_text(json.dumps(session.metrics))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_fp16_trains_through_ddp_and_fsdp_over_nccl(tmp_path: Path, strategy: str) -> None:
    from tests.distributed import spawn

    spec = on_gpu(TrialSpec(model="mlp", data="digits", max_epochs=3, strategy=strategy))
    spawn(
        _with_strategy, str(tmp_path), hp(amp="fp16", grad_clip=1.0), spec.to_dict(), world=1, backend="nccl"
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics[-1]["val_acc"] > 0.85 and "failure" not in metrics[-1]
    ckpt = DirCheckpoints(str(tmp_path)).load("cpu")
    assert ckpt["scaler"]["scale"] > 1
    assert ckpt["model"]["1.weight"].dtype == torch.float32  # fp32 master weights, full tensors


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


# ----------------------------------------------------------------------------- a sweep on the GPU


def test_a_packed_sweep_runs_on_the_gpu_end_to_end(tmp_path: Path) -> None:
    # The user's path: the CLI, an embedded Ray that finds the GPU, the memory probe as a Ray
    # task, fractional GPUs, each trial capping its share in a reused actor.
    from tests.conftest import DEBUG, run_cli

    out = run_cli(
        "sweep",
        str(DEBUG),
        "--output",
        str(tmp_path),
        "--num-samples",
        "6",
        "--set",
        "resources.gpus_per_worker=pack",
        "--set",
        "training.amp=auto",
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "debug" / "summary.json").read_text())
    trials = summary["trials"]
    assert len(trials) == 6 and not any(t["failure"] for t in trials)
    for t in trials:
        last = t["last_metrics"]
        assert last["gpu_mem_peak_gb"] > 0 and 0 <= last["gpu_util"] <= 100


def test_a_real_oom_in_a_one_rank_nccl_ddp_trial_backs_off_and_finishes(tmp_path: Path) -> None:
    """The largest configuration of search_spaces/vit_amp.yaml at a batch no GPU holds in one
    forward (about 32 MB of activations a sample in bf16): the first step runs out of memory for
    real, through DDP over NCCL, and halves until it fits."""
    from tests.distributed import spawn

    data = {"samples": 20480, "size": 224, "classes": 10}  # one step of 16384 an epoch
    spec = TrialSpec(model="vit", data="synthetic_images", data_args=data, max_epochs=1, strategy="ddp")
    vit = {"width": 512, "depth": 8, "heads": 8, "patch_size": 16, "mlp_ratio": 4}
    params = hp(amp="bf16", batch_size=16384, eval_batch_size=512, loader_workers=3, **vit)
    spawn(_with_strategy, str(tmp_path), params, on_gpu(spec).to_dict(), world=1, backend="nccl")
    last = json.loads((tmp_path / "metrics.json").read_text())[-1]
    assert "failure" not in last and last["oom_backoffs"] >= 1, last
    assert last["micro_batch"] == 16384 // 2 ** last["oom_backoffs"]
    log = (tmp_path / "trial.log").read_text()
    assert "OOM at micro-batch 16384: retrying the step at 8192" in log and "Tried to allocate" in log
