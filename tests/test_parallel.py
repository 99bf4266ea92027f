"""DDP and FSDP2 trials in two local processes on CPU (gloo): the loop a trial's workers run."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed import _trial, run_workers, spawn
from tests.test_loop import hp
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.models import build_model

pytestmark = pytest.mark.slow

# 605 samples: 121 validation samples split 61/60 over two ranks; with eval chunks of 20 the
# ranks would run 4 and 3 forwards, and a sharded model's forward is a collective.
DATA = {"samples": 605, "features": 8, "classes": 3}
SPEC = TrialSpec(model="mlp", data="synthetic", data_args=DATA, max_epochs=2)
PARAMS = hp(batch_size=64, micro_batch=16, eval_batch_size=20, grad_clip=1.0, width=32)


def _spec(strategy: str, epochs: int = 2) -> TrialSpec:
    return TrialSpec(**{**SPEC.to_dict(), "strategy": strategy, "max_epochs": epochs})


def test_compiled_fsdp_matches_ddp_and_checkpoints_a_full_state_dict(tmp_path: Path) -> None:
    ddp = run_workers(tmp_path / "ddp", PARAMS, _spec("ddp"))
    fsdp = run_workers(tmp_path / "fsdp", {**PARAMS, "compile": True}, _spec("fsdp"))
    assert [m["world_size"] for m in fsdp[0]] == [2, 2]
    # Both average the same gradients over the same global batch: the same training.
    for a, b in zip(ddp[0], fsdp[0], strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
    assert [m["val_loss"] for m in fsdp[0]] == [m["val_loss"] for m in fsdp[1]]  # reduced over ranks
    # The checkpoint is a plain, unsharded state dict: it loads into an unwrapped model.
    weights = DirCheckpoints(str(tmp_path / "fsdp")).load("cpu")["model"]
    model = build_model("mlp", PARAMS, (8,), 3)
    model.load_state_dict(weights)
    ddp_weights = DirCheckpoints(str(tmp_path / "ddp")).load("cpu")["model"]
    for k, v in ddp_weights.items():
        torch.testing.assert_close(weights[k], v, rtol=1e-4, atol=1e-5)


def test_fsdp_resume_continues_exactly(tmp_path: Path) -> None:
    straight = run_workers(tmp_path / "straight", PARAMS, _spec("fsdp", 3))
    run_workers(tmp_path / "parts", PARAMS, _spec("fsdp", 2))
    resumed = run_workers(tmp_path / "parts", PARAMS, _spec("fsdp", 3), resume=True)
    assert [m["epoch"] for m in resumed[0]] == [3]
    assert resumed[0][-1]["val_loss"] == pytest.approx(straight[0][-1]["val_loss"], rel=1e-5)


def _scaler_over_shards(rank: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = [q.to_local().clone() for q in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0]))
    scaler.scale(loss).backward()
    if rank == 1:  # an overflow in one rank's shard only
        list(model.parameters())[2].grad.to_local()[0, 0] = float("inf")
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    skipped = all(torch.equal(a, q.to_local()) for a, q in zip(before, model.parameters(), strict=True))
    Path(out, f"rank{rank}").write_text(f"{skipped} {scaler.get_scale()}")


def test_grad_scaler_skips_the_step_on_every_rank_when_one_shard_overflows(tmp_path: Path) -> None:
    # What fp16 with FSDP relies on: torch.amp.GradScaler over FSDP2's DTensor gradients
    # reduces found-inf over ranks (a sharded scaler is not needed), so no rank steps alone.
    spawn(_scaler_over_shards, str(tmp_path))
    assert {(tmp_path / f"rank{r}").read_text() for r in range(2)} == {"True 512.0"}


def _sharded(rank: int, out: str, param_dtype: str) -> None:
    from tuner.trial.loop.parallel import FSDP

    dtype = getattr(torch, param_dtype) if param_dtype else None
    torch.manual_seed(0)
    model = build_model("vit", {"patch_size": 4, "width": 32, "depth": 2, "heads": 2}, (3, 16, 16), 10)
    whole = sum(q.numel() * q.element_size() for q in model.parameters())
    FSDP().wrap(model, torch.device("cpu"), param_dtype=dtype)
    mine = sum(q.to_local().numel() * q.to_local().element_size() for q in model.parameters())
    gathered = []
    # After FSDP's own pre-forward hook, which gathers the unit's parameters.
    model.blocks[0].register_forward_pre_hook(lambda m, _: gathered.append(str(m.norm1.weight.dtype)))
    model(torch.randn(2, 3, 16, 16))
    Path(out, f"rank{rank}.json").write_text(json.dumps([whole, mine, gathered]))


@pytest.mark.parametrize("param_dtype", ["", "bfloat16"])
def test_fsdp_keeps_a_shard_per_rank_and_gathers_in_the_amp_dtype(tmp_path: Path, param_dtype: str) -> None:
    spawn(_sharded, str(tmp_path), param_dtype)
    (whole, a, gathered_a), (_, b, gathered_b) = (
        json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)
    )
    assert a + b == whole and max(a, b) < 0.55 * whole  # each rank holds about half
    want = "torch.bfloat16" if param_dtype else "torch.float32"
    assert gathered_a == gathered_b == [want]  # gathered for compute in the AMP dtype


def test_find_batch_size_agrees_over_ddp_ranks(tmp_path: Path) -> None:
    from tests.test_gpu_features import PICKY, picky_spec

    spec = TrialSpec(**{**picky_spec(tmp_path).to_dict(), "strategy": "ddp"})
    # Rank r's model runs out of memory above 20 - 4r samples: every rank must use 16.
    out = run_workers(tmp_path / "run", {**PARAMS, **PICKY, "micro_batch": None}, spec)
    assert {m["micro_batch"] for ranks in out for m in ranks} == {16}


@pytest.mark.usefixtures("ray_session")
def test_fsdp_sweep_checkpoints_a_full_state_dict(tmp_path: Path) -> None:
    from tests.conftest import assert_resources_returned, debug_config
    from tuner.driver.sweep import run_sweep

    cfg = debug_config(
        tmp_path,
        name="fsdp",
        search__num_samples=1,
        resources__workers_per_trial=2,
        resources__strategy="fsdp",
        schedule__max_epochs=2,
        schedule__grace_epochs=2,
        training__batch_size=64,
    )
    try:
        out = run_sweep(cfg)
    finally:
        _remove_leftover_placement_groups()
    assert out.exit_code == 0, out.summary
    (trial,) = out.summary["trials"]
    assert trial["last_metrics"]["world_size"] == 2 and trial["epochs"] == 2
    run = Path(out.sweep_dir) / trial["trial_id"]
    weights = DirCheckpoints(str(run)).load("cpu")["model"]
    assert_resources_returned()
    assert weights["1.weight"].shape == (trial["config"]["width"], 8)  # gathered, not a shard


def _remove_leftover_placement_groups() -> None:
    """Free what a finished Train run may still hold, so later tests in this Ray get CPUs.

    Tune ends a trial actor as soon as its last result is in; the Train controller it owns
    dies with it, possibly before removing its workers' placement group. Ray 2.60's
    PlacementGroupCleaner is the backstop, but its monitor thread dies with "Found multiple
    active Ray instances" where other Ray clusters run on the same machine (as on a shared
    CI box), and the placement group then holds its CPUs for good.
    """
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    for pg_id, info in placement_group_table().items():
        if info["state"] != "REMOVED":
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))


def test_ddp_gradients_are_views_into_its_buckets() -> None:
    """gradient_as_bucket_view: one copy of the gradients (DDP's buckets), also after
    zero_grad(set_to_none=True) and a second step, as the loop runs them."""
    import torch.distributed as dist

    from tuner.trial.loop.parallel import make_strategy

    # An in-memory store: this runs in pytest's own process, where a FileStore's C++ teardown can
    # wait on its file without end (pytorch/pytorch#31467: it assumes more than one rank).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = build_model("mlp", {"width": 16, "depth": 2}, (8,), 3, None)
        net = make_strategy("ddp", 2).wrap(model, torch.device("cpu"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            net(torch.randn(4, 8)).sum().backward()
            optimizer.step()
        grads = [q.grad for q in model.parameters()]
        assert all(g is not None for g in grads)
        # A small model fills one bucket: every gradient lies in that bucket's storage.
        assert len({g.untyped_storage().data_ptr() for g in grads}) == 1  # type: ignore[union-attr]
    finally:
        # DDP's reducer holds the group: let it go while the group is up. Freed after
        # destroy_process_group (when this function returned), ProcessGroupGloo's destructor
        # once waited without end to join its threads, in pytest's own process (py-spy's
        # native stack of the stall, 2026-11-28).
        net = optimizer = grads = None  # noqa: F841
        gc.collect()  # (and any reference cycle through the module)
        dist.destroy_process_group()


def test_ddp_gradients_stay_bucket_views_through_accumulation(tmp_path: Path) -> None:
    """Issue 49, E7: under accumulation the first micro-batches run in `no_sync`, where DDP's
    reducer does not touch the gradients; zeroed to None at each step, they are then fresh
    tensors beside the buckets (the copy gradient_as_bucket_view saves), until the last
    micro-batch copies them in. Zeroed in place, they stay views into the one bucket."""
    import torch.distributed as dist

    from tuner.trial.frame.session import LocalSession
    from tuner.trial.loop.run import build_parts, optimizer_step

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    p: Any = None
    hooks: list[Any] = []
    try:
        # Rank 0 of 2 (on a group of one, as autotune's arms run): 32 samples a step, in 2.
        session = LocalSession(str(tmp_path))
        session.world_size = 2
        p = build_parts(PARAMS, _spec("ddp"), session, torch.device("cpu"))
        assert (p.per_rank_batch, p.state.micro_batch) == (32, 16)
        batches = p.feed(p.train.train_steps(0, p.per_rank_batch))
        optimizer_step(p, *next(batches))  # the first synced backward makes them bucket views
        seen: set[int] = set()
        for q in p.model.parameters():
            hooks.append(q.register_post_accumulate_grad_hook(lambda q: seen.add(_storage(q.grad))))
        for _ in range(2):
            optimizer_step(p, *next(batches))
        buckets = {_storage(q.grad) for q in p.model.parameters()}
        assert len(buckets) == 1  # a small model fills one bucket
        assert seen == buckets  # every micro-batch accumulated into it, none into a copy
    finally:
        for h in hooks:
            h.remove()
        if p is not None:
            p.close()
        p = hooks = None  # (as above: DDP's reducer goes before the group)
        gc.collect()
        dist.destroy_process_group()


def _storage(t: Any) -> int:
    return int(t.untyped_storage().data_ptr())


def _compiled_ddp(rank: int, root: str) -> None:
    """One rank of a compiled DDP trial, every graph Dynamo hands a backend noted: whether
    gradients were on (training, or evaluation) and whether it has dynamic sizes."""
    graphs: list[list[bool]] = []

    def noting(gm: torch.fx.GraphModule, inputs: list) -> Any:
        graphs.append([torch.is_grad_enabled(), any(isinstance(i, torch.SymInt) for i in inputs)])
        return gm.forward

    real = torch.compile
    torch.compile = lambda fn=None, **kw: real(fn, **{**kw, "backend": noting})  # type: ignore[assignment]
    try:
        spec = {**_spec("ddp").to_dict(), "workers": 2}
        _trial(rank, root, {**PARAMS, "micro_batch": None, "compile": True}, spec, False)
    finally:
        torch.compile = real
    Path(root, f"graphs-{rank}.json").write_text(json.dumps(graphs))


def test_a_compiled_ddp_trial_trains_and_evaluates_compiled_graphs_of_static_shapes(tmp_path: Path) -> None:
    """Issue 49, E2, E9, E8: the built-in MLP (an nn.Sequential) in a 2-rank DDP trial with
    training.compile. Each rank's training step and its evaluation are compiled (Dynamo hands
    the backend their graphs), and no graph has dynamic sizes: 242 samples a rank in steps of
    32 end in a partial step every epoch, which must not turn the full steps' graph dynamic."""
    spawn(_compiled_ddp, str(tmp_path))
    for rank in range(2):
        graphs = json.loads((tmp_path / f"graphs-{rank}.json").read_text())
        assert any(grad for grad, _ in graphs), f"rank {rank} trained eagerly: {graphs}"
        assert any(not grad for grad, _ in graphs), f"rank {rank} evaluated eagerly: {graphs}"
        assert not any(dynamic for _, dynamic in graphs), f"rank {rank}: dynamic graphs {graphs}"
