"""The workers of a trial give up a step together: out-of-memory on one rank, never a hang.

A rank that runs out of memory partway through a step leaves its peers waiting in the next
collective it will not enter (a DDP bucket's all-reduce, an FSDP unit's all-gather), until the
group's timeout. So every collective inside a step passes a `Gate` first: one all-reduce of a
few integers on the CPU, asking whether every rank got this far. A rank that ran out of memory
does not enter the step's next collective; it answers the gate its peers wait at with its
failure instead (`Gate.fail`). Every rank then knows at the same gate, abandons the step
(`PeerOOM`), and `reset` puts the parallel wrapper's per-step state back, so that the step can
be run again. Ranks therefore make the same sequence of gate calls whatever happens: the step's
gates up to the failure, then one that says so.

`attempt(fn)` runs one such piece of work (a step's forward and backward, an evaluation, a
probe of `find_batch_size`) and returns whether it went through on every rank, and if not where
and on which rank it ran out. One worker has no peers: its gate is `NoGate`, and `attempt`
then only catches the out-of-memory.

The gates hook into the wrappers' own communication: a DDP communication hook before each
gradient bucket's all-reduce, FSDP2's custom all-gather and reduce-scatter before each unit's.
The gate's group is the default one under gloo and a gloo group of its own under NCCL: its
all-reduce is a host-side question, so it never waits for the GPU's queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from tuner.trial.frame.memory import first_line, is_oom

R = TypeVar("R")
PHASES = ("forward", "backward", "optimizer step", "evaluation")


@dataclass(frozen=True)
class Shortfall:
    """Where a step ran out of memory: the lowest rank that did, and in which phase."""

    rank: int
    phase: str
    detail: str = ""  # the failing rank's own error line (empty on its peers)
    at: float = 0.0  # time.perf_counter() when this rank learned of it

    def where(self, world_size: int) -> str:
        """ "forward" (one worker), "backward on rank 1" (several)."""
        return self.phase if world_size == 1 else f"{self.phase} on rank {self.rank}"

    def __str__(self) -> str:
        return f"{self.phase} on rank {self.rank}" + (f": {self.detail}" if self.detail else "")


class PeerOOM(Exception):
    """Another rank ran out of memory in this step: every rank abandons it (see the module)."""

    def __init__(self, shortfall: Shortfall):
        super().__init__(f"out of memory on {shortfall}")
        self.shortfall = shortfall


class NoGate:
    """One worker: nobody to ask."""

    shortfall: Optional[Shortfall] = None

    def check(self) -> None: ...

    def passed(self) -> bool:
        return True

    def fail(self, phase: str, detail: str = "", at: float = 0.0) -> Shortfall:
        self.shortfall = Shortfall(0, phase, detail, at or time.perf_counter())
        return self.shortfall

    def agree(self, ok: bool) -> bool:
        return ok

    def clear(self) -> None:
        self.shortfall = None


class Gate(NoGate):
    """The question every rank answers before each collective of a step (see the module).

    Once an answer was "no", the gate stays shut without asking again until `clear`: a rank
    that learned of the failure in a DDP hook goes through the rest of its backward without
    communicating, and its commit check then raises at once.
    """

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world = rank, world_size
        # NCCL's collectives run on the GPU; this question is the host's, so it goes over gloo.
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        self.shortfall = None

    def check(self) -> None:
        """Before a collective: raise PeerOOM if any rank ran out of memory in this step."""
        if not self.passed():
            assert self.shortfall is not None
            raise PeerOOM(self.shortfall)

    def passed(self) -> bool:
        """Whether every rank got this far (asked once per gate, until a "no")."""
        if self.shortfall is None:
            self.shortfall = self._ask(None)
        return self.shortfall is None

    def fail(self, phase: str, detail: str = "", at: float = 0.0) -> Shortfall:
        """This rank ran out of memory (at `at`, perf_counter): answer the gate its peers
        wait at (once)."""
        if self.shortfall is None:
            self.shortfall = self._ask(PHASES.index(phase))
        assert self.shortfall is not None
        mine = self.shortfall.rank == self.rank
        self.shortfall = Shortfall(
            self.shortfall.rank, self.shortfall.phase, detail if mine else "", at or self.shortfall.at
        )
        return self.shortfall

    def agree(self, ok: bool) -> bool:
        """True only if every rank says so (a question outside any step)."""
        flag = torch.tensor([int(ok)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def clear(self) -> None:
        self.shortfall = None

    def _ask(self, phase: Optional[int]) -> Optional[Shortfall]:
        # The lowest failing rank and its phase, in one MIN: rank * len(PHASES) + phase.
        none = self.world * len(PHASES)
        code = torch.tensor([none if phase is None else self.rank * len(PHASES) + phase])
        dist.all_reduce(code, op=dist.ReduceOp.MIN, group=self.group)
        value = int(code.item())
        if value == none:
            return None
        return Shortfall(value // len(PHASES), PHASES[value % len(PHASES)], at=time.perf_counter())


def make_gate(world_size: int) -> NoGate:
    """The gate of a trial's workers (a process group must exist when there are several)."""
    return Gate(dist.get_rank(), world_size) if world_size > 1 else NoGate()


def attempt(
    gate: NoGate, fn: Callable[[], R], phase: Callable[[], str]
) -> tuple[Optional[R], Optional[Shortfall]]:
    """Run `fn` on every rank: (its result, None) when it went through everywhere, else (None,
    where it ran out of memory). `phase()` says where this rank is (asked when it runs out).
    Any other error is raised. The caller then resets what `fn` left half done."""
    try:
        result = fn()
        gate.check()  # the commit: every rank got through
        return result, None
    except PeerOOM as err:
        return None, err.shortfall
    except Exception as err:  # noqa: BLE001 - only out-of-memory is handled, the rest raised
        if not is_oom(err):
            raise
        detail, at = first_line(err), time.perf_counter()
    # Outside the except block: the traceback, and the step's tensors its frames hold, are gone.
    return None, gate.fail(phase(), detail, at)


# ---------------------------------------------------------------------- the wrappers' hooks


class Buckets:
    """The gradient all-reduces a DDP backward has in flight (they write into the buckets the
    gradients are views of: a retried step must not start before they are done)."""

    def __init__(self) -> None:
        self.pending: list[torch.futures.Future[Any]] = []

    def wait(self) -> None:
        for fut in self.pending:
            try:
                fut.wait()
            except Exception:  # noqa: BLE001 - its gradients are dropped anyway
                pass
        self.pending.clear()


def gate_ddp(net: nn.Module, gate: NoGate) -> Buckets:
    """Every gradient bucket's all-reduce asks the gate first; once it said no, the rest of the
    backward reduces nothing (its gradients are dropped with the step)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buckets = Buckets()

    # (No annotations: DDP checks them against its own, which this module's postponed
    # annotations would turn into strings.)
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        if gate.passed():
            buckets.pending = [f for f in buckets.pending if not f.done()]
            fut = allreduce_hook(None, bucket)  # type: ignore[arg-type]
            buckets.pending.append(fut)
            return fut
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    net.register_comm_hook(None, hook)  # type: ignore[operator]
    return buckets


def reset_ddp(net: nn.Module, buckets: Buckets) -> None:
    """DDP's per-step state after an abandoned step, as every rank needs it for the next try.

    The all-reduces in flight finish first (every rank started them). The reducer of a rank
    whose backward stopped partway still expects that backward's buckets ("Expected to have
    finished reduction in the prior iteration"): its state is reset (on every rank, so all
    rebuild their buckets at the same later step). The buffers are broadcast again at the
    retry's first forward on every rank, as at any step's.
    """
    buckets.wait()
    reducer = getattr(net, "reducer", None)
    reset = getattr(reducer, "_reset_state", None)  # private (torch 2.1+): no public equivalent
    if reset is not None:
        reset()
    elif reducer is not None:  # a torch without it: the next synced backward would raise
        raise RuntimeError("this torch's DDP cannot be reset after a failed step (no Reducer._reset_state)")
    net.require_forward_param_sync = True  # type: ignore[assignment]


# What FSDP2's own comms call (torch 2.13 names them *_single; older, *_tensor).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _GatedAllGather:
    """FSDP2's all-gather (`FSDPModule.set_custom_all_gather`), asking the gate first."""

    def __init__(self, gate: NoGate):
        self.gate = gate

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    # (FSDP passes these by name.)
    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Any:
        self.gate.check()
        return _ALL_GATHER(output_tensor, input_tensor, group=group, async_op=async_op)


class _GatedReduceScatter(_GatedAllGather):
    """FSDP2's reduce-scatter (`FSDPModule.set_custom_reduce_scatter`), asking the gate first."""

    def __call__(  # type: ignore[override]
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        self.gate.check()
        return _REDUCE_SCATTER(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def gate_fsdp(model: nn.Module, gate: NoGate) -> None:
    """Every FSDP unit's all-gather and reduce-scatter asks the gate first; a "no" raises
    PeerOOM out of the forward or backward, which `reset_fsdp` recovers from."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(_GatedAllGather(gate))  # type: ignore[arg-type]
            module.set_custom_reduce_scatter(_GatedReduceScatter(gate))  # type: ignore[arg-type]


def reset_fsdp(model: nn.Module) -> None:
    """FSDP2's per-iteration state after a forward or backward aborted partway: torch's
    supported recovery (`reset_iter_state` on the root: waits for collectives in flight,
    reshards every unit, clears the iteration's trackers)."""
    model.reset_iter_state()  # type: ignore[operator]
