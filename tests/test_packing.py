"""GPU packing from given memory figures (no GPU), and the config rules around GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import DEBUG, cli, debug_config
from tuner import packing
from tuner.config import ConfigError, load_sweep
from tuner.driver import resources
from tuner.packing import GiB, MemoryProfile, NoFit

H100 = 80 * GiB


def profile(peak_gib: float, context_gib: float = 0.5, total: int = H100, oom: bool = False) -> MemoryProfile:
    peak = int(peak_gib * GiB)
    return MemoryProfile("NVIDIA H100 80GB HBM3", total, peak, peak, int(context_gib * GiB), oom=oom)


@pytest.mark.parametrize(
    ("peak_gib", "margin", "cap", "per_gpu"),
    [
        (9.5, 0.1, 16, 7),  # 72 GiB usable / 10 GiB per trial
        (9.5, 0.1, 4, 4),  # capped by max_trials_per_gpu
        (17.5, 0.1, 8, 4),  # 72 / 18 = 4 exactly
        (17.6, 0.1, 8, 3),  # a little more: 3
        (40.0, 0.1, 8, 1),
        (0.01, 0.0, 100, 100),
    ],
)
def test_trials_per_gpu_fit_the_usable_memory(peak_gib: float, margin: float, cap: int, per_gpu: int) -> None:
    p = profile(peak_gib)
    fit = packing.pack(p, margin, cap)
    assert fit.trials_per_gpu == per_gpu
    assert fit.trials_per_gpu * p.need <= packing.usable(H100, margin)  # they all fit at once
    assert fit.trials_per_gpu * fit.fraction <= 1.0  # and Ray places that many on one GPU
    assert packing.tenants(fit.fraction) == per_gpu
    assert fit.budget >= p.peak_reserved  # each trial's cap holds its measured peak
    # The trial side computes the same budget from its fraction alone.
    assert packing.share(H100, fit.fraction, margin, p.context).budget == fit.budget


def test_a_config_that_cannot_fit_is_refused_with_the_figures() -> None:
    with pytest.raises(
        NoFit, match=r"needs 72\.5 GiB at its peak, but one NVIDIA H100 .* has 80\.0 GiB \(72\.0 GiB"
    ):
        packing.pack(profile(72.0), 0.1, 4)
    with pytest.raises(NoFit, match="more than the whole GPU"):
        packing.pack(profile(1.0, oom=True), 0.1, 4)


@pytest.mark.parametrize(("trials", "fraction"), [(1, 1.0), (2, 0.5), (3, 0.3333), (4, 0.25), (7, 0.1428)])
def test_fractions_use_rays_resolution(trials: int, fraction: float) -> None:
    assert packing.fraction_for(trials) == fraction
    assert packing.tenants(fraction) == trials


def test_share_caps_shared_gpus_only() -> None:
    quarter = packing.share(H100, 0.25, 0.1, context=GiB // 2)
    assert quarter.tenants == 4
    assert quarter.budget == int(H100 * 0.9) // 4 - GiB // 2
    assert quarter.cap == pytest.approx(quarter.budget / H100)
    whole = packing.share(H100, 1.0, 0.1)
    assert whole.tenants == 1 and whole.cap == 1.0  # alone on its GPU: the margin is for sharing
    assert packing.share(H100, 0.3, 0.1).tenants == 3  # Ray fits 3 x 0.3, not 4


def test_shortfall_names_what_is_missing() -> None:
    assert packing.shortfall(free=20 * GiB, budget=17 * GiB, total=H100) is None
    why = packing.shortfall(free=10 * GiB, budget=17 * GiB, total=H100)
    assert why is not None and "needs 17.0 GiB" in why and "only 10.0 GiB" in why and "nvidia-smi" in why


def test_concurrency_follows_the_packing() -> None:
    assert packing.concurrency(4, gpus=2) == 8
    assert packing.concurrency(3, gpus=1) == 3
    assert packing.concurrency(1, gpus=0.5) == 1


def test_probe_config_takes_the_memory_hungriest_corner() -> None:
    raw = {
        "name": "p",
        "task": {"model": "vit", "data": "synthetic_images"},
        "search": {
            "params": {
                "width": {"type": "choice", "values": [192, 384, 256]},
                "depth": {"type": "randint", "low": 4, "high": 12},
                "patch_size": {"type": "choice", "values": [16, 8, 32]},
                "amp": {"type": "choice", "values": ["bf16", "off"]},
                "optimizer": {"type": "choice", "values": ["sgd", "adamw"]},
                "batch_size": {"type": "grid", "values": [64, 256]},
                "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
            }
        },
        "training": {"find_batch_size": True},
    }
    from tuner.config import parse_sweep

    cfg = parse_sweep(raw)
    hp = packing.probe_config(cfg.hyperparameters())
    assert (hp["width"], hp["depth"], hp["patch_size"], hp["batch_size"]) == (384, 12, 8, 256)
    assert (hp["amp"], hp["optimizer"], hp["find_batch_size"]) == ("off", "adamw", False)
    assert hp["eval_batch_size"] == 1024  # fixed training values come along
    assert packing.label(hp, ["width", "depth"]) == "the largest configuration (width=384, depth=12)"


# ----------------------------------------------------------------------------- resources.plan

CLUSTER = {"CPU": 16.0, "GPU": 2.0}
NODES = [CLUSTER]


def _section(**kw):
    return load_sweep(DEBUG, {f"resources.{k}": v for k, v in kw.items()}).resources


def test_plan_packs_from_the_probe() -> None:
    res = resources.plan(_section(gpus_per_worker="pack"), CLUSTER, NODES, probe=lambda: profile(17.5))
    assert (res.gpus_per_worker, res.trials_per_gpu, res.max_concurrent) == (0.25, 4, 8)
    assert res.bundle == {"cpu": 1, "gpu": 0.25}
    assert "packed: 4 trials per NVIDIA H100" in res.describe() and "18.0 GiB" in res.describe()


def test_plan_refuses_pack_that_cannot_fit_or_has_no_gpu() -> None:
    with pytest.raises(ConfigError, match=r"resources.gpus_per_worker: pack: .* needs 80\.5 GiB"):
        resources.plan(_section(gpus_per_worker="pack"), CLUSTER, NODES, probe=lambda: profile(80.0))
    with pytest.raises(ConfigError, match="pack measures trials on a GPU, but the cluster has none"):
        resources.plan(
            _section(gpus_per_worker="pack"), {"CPU": 2.0}, [{"CPU": 2.0}], probe=lambda: profile(1)
        )

    def broken() -> MemoryProfile:
        raise RuntimeError("the memory probe of the largest configuration (width=9) failed: ValueError: bad")

    with pytest.raises(ConfigError, match=r"pack: the memory probe .* failed: ValueError: bad"):
        resources.plan(_section(gpus_per_worker="pack"), CLUSTER, NODES, probe=broken)


def test_ddp_workers_start_their_own_only_where_one_node_holds_them_all(tmp_path: Path) -> None:
    two = _section(workers_per_trial=2, cpus_per_worker=2, gpus_per_worker=1)
    big, small = {"CPU": 8.0, "GPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}
    assert resources.plan(two, {"CPU": 10.0, "GPU": 3.0}, [big, small]).one_node
    assert not resources.plan(two, {"CPU": 4.0, "GPU": 2.0}, [small, small]).one_node  # 2 nodes
    assert resources.plan(two, {"CPU": 2.0, "GPU": 1.0}, [small], [(big, 3)]).one_node  # may be added
    assert not resources.plan(_section(workers_per_trial=1), {"CPU": 2.0}, [{"CPU": 2.0}]).one_node
    # The trials start their own workers only with a local or shared sweep directory (URI
    # storage keeps checkpoints through Ray Train), and never for task.command (torchrun's).
    res = resources.plan(two, {"CPU": 10.0, "GPU": 3.0}, [big])
    cfg = debug_config(tmp_path, resources__workers_per_trial=2)
    assert resources.trial_spec(cfg, res, str(tmp_path), str(tmp_path / "debug")).one_node
    assert not resources.trial_spec(cfg, res, "s3://bucket/runs", None).one_node
    bundles = resources.tune_request(res, resources.trial_spec(cfg, res, str(tmp_path), str(tmp_path)))
    assert bundles.bundles == [{"CPU": 2.0, "GPU": 1.0}] * 2 and bundles.head_bundle_is_empty
    assert bundles.strategy == "STRICT_PACK"


def test_plan_of_a_fixed_fraction_does_not_probe() -> None:
    def never() -> MemoryProfile:
        raise AssertionError("probed")

    res = resources.plan(_section(gpus_per_worker=0.25), CLUSTER, NODES, probe=never)
    assert res.gpus_per_worker == 0.25 and res.profile is None


# ----------------------------------------------------------------------------- config rules


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        (
            {"resources.gpus_per_worker": "pack", "resources.workers_per_trial": 2},
            "resources.gpus_per_worker",
            "1-worker",
        ),
        (
            {"resources.gpus_per_worker": 0.5, "resources.workers_per_trial": 2},
            "resources.gpus_per_worker",
            "whole GPUs",
        ),
        ({"resources.strategy": "fsdp"}, "resources.strategy", "workers_per_trial >= 2"),
        (
            {
                "resources.strategy": "fsdp",
                "resources.workers_per_trial": 2,
                "training.find_batch_size": True,
            },
            "training.find_batch_size",
            "fsdp",
        ),
        ({"resources.gpu_memory_margin": 1.0}, "resources.gpu_memory_margin", "less than 1"),
        ({"resources.gpus_per_worker": "half"}, "resources.gpus_per_worker", "auto"),
    ],
)
def test_gpu_settings_that_cannot_work_are_refused(
    overrides: dict, path: str, words: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as err:
        debug_config(tmp_path, **overrides)
    assert err.value.path == path and words in err.value.message


def test_gpu_settings_can_be_searched(tmp_path: Path) -> None:
    cfg = debug_config(
        tmp_path,
        **{
            "search.params.compile": {"type": "choice", "values": [True, False]},
            "search.params.channels_last": True,
        },
    )
    hp = cfg.hyperparameters()
    assert hp["compile"].values == [True, False]  # searched
    assert hp["channels_last"].value is True  # fixed by the file
    assert hp["prefetch"].value is True  # the defaults reach every trial


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_pack_without_a_gpu_is_refused_fast(tmp_path: Path) -> None:
    out = cli("sweep", str(DEBUG), "--output", str(tmp_path), "--set", "resources.gpus_per_worker=pack")
    assert out.returncode == 2, out.stderr
    assert "resources.gpus_per_worker: pack measures trials on a GPU, but the cluster has none" in out.stderr


def test_shipped_gpu_sweep_probes_a_buildable_configuration() -> None:
    from tests.conftest import SPACES
    from tuner.trial.loop.models import build_model

    cfg = load_sweep(SPACES / "vit_amp.yaml")
    assert cfg.resources.gpus_per_worker == "pack" and cfg.search.params["amp"].values == ["bf16", "fp16"]
    hp = packing.probe_config(cfg.hyperparameters(), cfg.search.constraints)
    # 512 % 12 != 0 (search.constraints); of 512 with 8 heads and 384 with 12 (one step down
    # each), the first.
    assert (hp["width"], hp["heads"], hp["depth"], hp["batch_size"]) == (512, 8, 8, 128)
    model = build_model("vit", hp, (3, 224, 224), 10)  # the probe would build this on the GPU
    assert sum(p.numel() for p in model.parameters()) > 10e6
