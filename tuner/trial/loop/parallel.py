"""How the workers of a trial share the model: one worker, DDP, or FSDP2.

Each strategy is an object with the same few calls, so the loop never branches on it:

- `wrap(model, device, compile=, param_dtype=)`: moves the model (built on the CPU) to the
  device and returns what training calls (the model, a DDP wrapper, or the model sharded in
  place by `fully_shard`), compiled where asked in the order each wrapper needs; the optimizer
  is built afterwards, over what `wrap` left.
- `sync(net, last)`: the context of one micro-batch; DDP reduces gradients on the last only.
- `zero_grad(optimizer)`: gradients cleared for the next step (DDP's in place: see there).
- `state(model, optimizer)` / `load(...)`: full, unsharded state dicts, so a checkpoint is the
  same plain `state_dict` whatever the strategy (FSDP gathers it to CPU; every rank calls it).
  The optimizer may be None (weights only).
- `lockstep(net)` / `reset(net)`: the gate every rank answers before each collective of a
  step of `net`, so that an out-of-memory on one rank abandons the step on all (`lockstep.py`),
  and the wrapper's per-step state put back after that. The gates go in when a Stepper first
  steps `net` (tuner's loop, `ctx.step`), not when it is wrapped: a user's loop that steps on
  its own pays nothing for them and keeps DDP's one communication hook for its own.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from tuner.trial.loop.lockstep import Buckets, NoGate, gate_ddp, gate_fsdp, make_gate, reset_ddp, reset_fsdp


class Single:
    """One worker: the model as it is."""

    gate: NoGate = NoGate()

    def wrap(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        compile: bool = False,
        param_dtype: Optional[torch.dtype] = None,
    ) -> nn.Module:
        model.to(device)
        if compile:
            compile_forward(model)
        return model

    def sync(self, net: nn.Module, last: bool) -> AbstractContextManager[Any]:
        return nullcontext()

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        # None, not zeros: the memory is free until backward makes the gradients again.
        optimizer.zero_grad(set_to_none=True)

    def state(
        self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer]
    ) -> tuple[dict, Optional[dict]]:
        return model.state_dict(), None if optimizer is None else optimizer.state_dict()

    def load(
        self,
        model: nn.Module,
        optimizer: Optional[torch.optim.Optimizer],
        weights: dict,
        optim: Optional[dict],
    ) -> None:
        model.load_state_dict(weights)
        if optimizer is not None and optim is not None:
            optimizer.load_state_dict(optim)

    def lockstep(self, net: nn.Module) -> NoGate:
        """The gate of `net`'s steps, its collectives made to ask it first (once per `net`)."""
        return self.gate

    def reset(self, net: nn.Module) -> None:
        """Put the wrapper's per-step state back after a step every rank abandoned."""


class DDP(Single):
    """Every worker holds the whole model; gradients are all-reduced in backward."""

    def wrap(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        compile: bool = False,
        param_dtype: Optional[torch.dtype] = None,
    ) -> nn.Module:
        model.to(device)
        if compile:
            # The model inside, before DDP wraps it: DDP's forward calls it with DDP marked
            # active, so Dynamo still splits its graph at DDP's gradient buckets (all-reduces
            # overlap backward: `optimize_ddp`), and evaluation, which calls the model itself,
            # runs compiled too. Compiling DDP's own call instead captured no frame of a
            # built-in model, an nn.Sequential (torch 2.13: the trial ran eager; see
            # compile_forward).
            compile_forward(model)
        ids = [device.index] if device.type == "cuda" else None
        # Gradients as views into DDP's all-reduce buckets: no second copy of them (4 bytes
        # per parameter in fp32), and no copy into the buckets each step (see zero_grad).
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)

    def sync(self, net: nn.Module, last: bool) -> AbstractContextManager[Any]:
        # All-reduce once per step, on the last micro-batch.
        return nullcontext() if last else net.no_sync()  # type: ignore[operator]

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        # In place: the gradients stay views into DDP's buckets. Set to None, the micro-batches
        # before the last (in `no_sync`, where the reducer does nothing) would accumulate into
        # fresh tensors beside the buckets, the copy gradient_as_bucket_view is there to save,
        # until the last one's reduction copied them in. (Every parameter has a gradient under
        # DDP, which requires it, so zeros step nothing an unused parameter would not.)
        optimizer.zero_grad(set_to_none=False)

    def lockstep(self, net: nn.Module) -> NoGate:
        gate = self._gate()
        buckets: dict[int, Buckets] = self.__dict__.setdefault("_buckets", {})
        if id(net) not in buckets:
            try:
                buckets[id(net)] = gate_ddp(net, gate)
            except RuntimeError as err:  # DDP takes one communication hook
                raise RuntimeError(
                    "this model has a DDP communication hook of its own (register_comm_hook); the "
                    "steps that back off on out-of-memory (tuner's loop, ctx.step) ask every worker "
                    "through one of theirs: step it without ctx.step"
                ) from err
        return gate

    def reset(self, net: nn.Module) -> None:
        reset_ddp(net, self.__dict__["_buckets"][id(net)])

    def _gate(self) -> NoGate:
        """One gate for every model this strategy wraps (a user's loop may prepare several)."""
        if "gate" not in self.__dict__:
            self.gate = make_gate(dist.get_world_size())
        return self.gate


class FSDP(DDP):
    """FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded over workers.

    Each unit (`model.fsdp_units()` where the model defines it, e.g. the ViT's blocks; else the
    root's direct children that hold parameters) is sharded, then the root. A unit's
    parameters are gathered for its forward and backward and freed after, so peak memory is
    about one unit's full weights plus every unit's shard.

    The model is sharded while still on the CPU: `fully_shard` moves each rank's shard to the
    device, so no GPU ever holds the whole model. Under AMP the units gather their parameters
    in the AMP dtype and reduce gradients in fp32 (`MixedPrecisionPolicy`): half the all-gather
    traffic, and no fp32 copy of a gathered unit kept beside autocast's low-precision one.
    Gradients are reduce-scattered after every micro-batch: skipping it (DDP's `no_sync`)
    would keep every unit's full unsharded gradient until the last micro-batch, which is the
    memory FSDP is chosen to save.
    """

    def wrap(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        compile: bool = False,
        param_dtype: Optional[torch.dtype] = None,
    ) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for unit in fsdp_units(model):
            if compile:
                compile_forward(unit)  # per unit, before sharding (FSDP2's hooks stay outside the graph)
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model  # sharded in place: training and evaluation call the same module

    def sync(self, net: nn.Module, last: bool) -> AbstractContextManager[Any]:
        return nullcontext()

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)  # FSDP2's gradients are sharded, not in buckets

    def lockstep(self, net: nn.Module) -> NoGate:
        gate = self._gate()
        gated: set[int] = self.__dict__.setdefault("_gated", set())
        if id(net) not in gated:
            gate_fsdp(net, gate)
            gated.add(id(net))
        return gate

    def reset(self, net: nn.Module) -> None:
        reset_fsdp(net)

    def state(
        self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer]
    ) -> tuple[dict, Optional[dict]]:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        # A collective: every rank gathers, rank 0 receives the full tensors (on CPU, so the
        # GPU never holds a second full copy); other ranks get empty dicts.
        opts = _full_options(cpu_offload=True)
        weights = get_model_state_dict(model, options=opts)
        if optimizer is None:
            return weights, None
        return weights, get_optimizer_state_dict(model, optimizer, options=opts)

    def load(
        self,
        model: nn.Module,
        optimizer: Optional[torch.optim.Optimizer],
        weights: dict,
        optim: Optional[dict],
    ) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        # Every rank read the full checkpoint; each keeps its own shard of it.
        opts = _full_options()
        set_model_state_dict(model, weights, options=opts)
        if optimizer is not None and optim is not None:
            set_optimizer_state_dict(model, optimizer, optim, options=opts)


def _full_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The submodules FSDP shards one by one (see FSDP)."""
    units = getattr(model, "fsdp_units", None)
    if callable(units):
        return list(units())
    return [m for m in model.children() if any(True for _ in m.parameters())]


STRATEGIES: dict[str, type[Single]] = {"ddp": DDP, "fsdp": FSDP}


def compile_forward(module: nn.Module) -> None:
    """torch.compile a module's forward, in place: its state_dict keys stay its own (no
    `_orig_mod.`). Not `Module.compile()`: that compiles the module's call, and on torch's own
    classes (nn.Sequential, as the built-in models are) Dynamo skips those frames as torch's
    code, so nothing was compiled (torch 2.13: no graph captured, the trial ran eager).

    The first dimension of each tensor argument, the batch, is marked static: an epoch's
    partial last batch (and evaluation's chunks) then get graphs of their own shapes, and the
    full batches keep theirs. Left to Dynamo, the second batch size seen turns the graph
    dynamic in it, and from then on the full batches run that dynamic graph (the newest is
    tried first), with the kernels it can specialise less."""
    compiled = torch.compile(module.forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        for a in args:
            if isinstance(a, torch.Tensor) and a.dim() > 0:
                torch._dynamo.mark_static(a, 0)
        return compiled(*args, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def make_strategy(name: str, world_size: int) -> Single:
    """`resources.strategy` for a trial of `world_size` workers (one worker: no wrapper)."""
    return Single() if world_size == 1 else STRATEGIES[name]()
