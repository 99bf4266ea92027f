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


def test_pack_probes_the_largest_configuration_with_the_settings_autotune_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 49, E4: the memory share is sized from the probe; autotune may then choose amp off
    # (the file's bf16 halves activations) or channels_last (cuDNN's workspaces), heavier than
    # what was probed. So autotune runs first, on the probe's whole GPU, and the probe measures
    # its choice. The Ray task is the seam: what it is handed is what the GPU would measure.
    from tuner import autotune

    cfg = debug_config(
        tmp_path, resources__gpus_per_worker="pack", training__amp="bf16", training__autotune=True
    )
    handed: list[dict] = []
    monkeypatch.setattr(
        resources, "run_task", lambda fn, args, *a, **kw: handed.append(args[0]) or profile(17.5)
    )
    asked: list[resources.TrialResources] = []

    def tune(res: resources.TrialResources) -> dict:
        asked.append(res)
        return autotune.Table([], {}, {"amp": "off", "channels_last": True}).to_json()

    res = resources.plan(cfg.resources, CLUSTER, NODES, probe=resources.pack_probe(cfg, tune))
    assert res.trials_per_gpu == 4
    [measured_on] = asked  # autotune ran once, first, as the probe runs: one worker, a whole GPU
    assert (measured_on.workers, measured_on.gpus_per_worker) == (1, 1.0)
    [hp] = handed
    assert (hp["amp"], hp["channels_last"]) == ("off", True)
    assert hp["width"] == packing.probe_config(cfg.hyperparameters())["width"]  # still the largest


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


def test_ddp_workers_are_packed_on_one_node_where_one_holds_them_all(tmp_path: Path) -> None:
    two = _section(workers_per_trial=2, cpus_per_worker=2, gpus_per_worker=1)
    big, small = {"CPU": 8.0, "GPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}
    assert resources.plan(two, {"CPU": 10.0, "GPU": 3.0}, [big, small]).one_node
    assert not resources.plan(two, {"CPU": 4.0, "GPU": 2.0}, [small, small]).one_node  # 2 nodes
    assert resources.plan(two, {"CPU": 2.0, "GPU": 1.0}, [small], [(big, 3)]).one_node  # may be added
    assert not resources.plan(_section(workers_per_trial=1), {"CPU": 2.0}, [{"CPU": 2.0}]).one_node
    # Every DDP trial starts its own workers (any output): a bundle per worker, the trial
    # actor in an empty head bundle, on one node where one holds them all, else on few.
    cfg = debug_config(tmp_path, resources__workers_per_trial=2)
    for nodes, strategy in [([big], "STRICT_PACK"), ([small, small], "PACK")]:
        res = resources.plan(two, {"CPU": 10.0, "GPU": 3.0}, nodes)
        for storage, sweep_dir in [(str(tmp_path), str(tmp_path)), ("s3://bucket/runs", None)]:
            bundles = resources.tune_request(res, resources.trial_spec(cfg, res, storage, sweep_dir))
            assert bundles.bundles == [{"CPU": 2.0, "GPU": 1.0}] * 2 and bundles.head_bundle_is_empty
            assert bundles.strategy == strategy


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


H100_NODE = {"CPU": 8.0, "GPU": 2.0, "accelerator_type:H100": 1.0}
A100_NODE = {"CPU": 16.0, "GPU": 4.0, "accelerator_type:A100": 1.0}


def test_a_gpu_kind_keeps_trials_on_its_nodes_and_counts_only_them(tmp_path: Path) -> None:
    mixed = {"CPU": 24.0, "GPU": 6.0, "accelerator_type:H100": 1.0, "accelerator_type:A100": 1.0}
    res = resources.plan(
        _section(accelerator_type="H100", gpus_per_worker="auto"), mixed, [A100_NODE, H100_NODE]
    )
    assert res.bundle == {"cpu": 1.0, "gpu": 1.0, "accelerator_type:H100": 0.001}
    assert res.max_concurrent is None and res.gpus_per_worker == 1.0
    # DDP: every worker's bundle asks for the kind, and only H100 nodes count: 3 workers of 1
    # GPU do not fit on one (the A100 node would hold them), so they may span nodes.
    three = _section(accelerator_type="H100", workers_per_trial=3, gpus_per_worker=1)
    res = resources.plan(three, mixed, [A100_NODE, H100_NODE, H100_NODE])
    assert not res.one_node and res.max_concurrent == 1  # 4 H100 GPUs: one trial at a time
    cfg = debug_config(tmp_path, resources__workers_per_trial=3)
    pg = resources.tune_request(res, resources.trial_spec(cfg, res, str(tmp_path), str(tmp_path)))
    assert pg.bundles == [{"CPU": 1.0, "GPU": 1.0, "accelerator_type:H100": 0.001}] * 3
    assert pg.strategy == "PACK"
    # A kind no node has: refused, naming the kinds there are.
    with pytest.raises(ConfigError, match=r"no node has L4 GPUs \(this cluster's: A100, H100\)") as err:
        resources.plan(_section(accelerator_type="L4", gpus_per_worker=1), mixed, [A100_NODE, H100_NODE])
    assert err.value.path == "resources.accelerator_type"
    # An autoscaler may add the kind: not refused.
    l4_type = {"CPU": 4.0, "GPU": 1.0, "accelerator_type:L4": 1.0}
    l4 = _section(accelerator_type="L4", gpus_per_worker=1)
    assert resources.plan(l4, mixed, [H100_NODE], [(l4_type, 2)]).accelerator == "L4"


def test_pack_refuses_mixed_gpu_kinds_unless_one_is_chosen() -> None:
    mixed = {"CPU": 24.0, "GPU": 6.0}
    with pytest.raises(
        ConfigError, match="this cluster has A100, H100: set resources.accelerator_type"
    ) as err:
        resources.plan(
            _section(gpus_per_worker="pack"), mixed, [A100_NODE, H100_NODE], probe=lambda: profile(17.5)
        )
    assert err.value.path == "resources.gpus_per_worker"
    res = resources.plan(
        _section(gpus_per_worker="pack", accelerator_type="H100"), mixed, [A100_NODE, H100_NODE],
        probe=lambda: profile(17.5),
    )  # fmt: skip
    assert res.trials_per_gpu == 4 and res.max_concurrent == 8  # the H100 node's 2 GPUs only
    assert res.bundle["accelerator_type:H100"] == 0.001


def test_several_gpus_per_worker_of_a_ddp_trial_are_refused() -> None:
    # Each rank trains on one GPU: the others would be held and idle.
    with pytest.raises(ConfigError, match="2: each worker of a multi-worker trial trains on one GPU; "
                       "use 1 with workers_per_trial: 4") as err:  # fmt: skip
        _section(workers_per_trial=2, gpus_per_worker=2)
    assert err.value.path == "resources.gpus_per_worker"
    assert _section(workers_per_trial=1, gpus_per_worker=2).gpus_per_worker == 2  # one worker: its own


def test_a_gpu_kind_is_refused_in_one_line_before_ray_starts(tmp_path: Path) -> None:
    # This machine has no GPU: no kind of GPU can be had (a local Ray would have none).
    kind = ["--set", "resources.accelerator_type=H100"]
    out = cli(
        "sweep", str(DEBUG), "--output", str(tmp_path), *kind, "--set", "resources.gpus_per_worker=auto"
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: resources.accelerator_type: no node has H100 GPUs (this cluster's: none); "
        "Ray names the kinds as in ray.util.accelerators"
    ], out.stderr
    zero = cli("validate", str(DEBUG), *kind)  # (debug.yaml: gpus_per_worker: 0)
    assert zero.returncode == 2, zero.stderr
    assert "resources.accelerator_type: H100: a GPU kind, but gpus_per_worker is 0" in zero.stderr
