"""Models that fail on purpose, for the robustness tests (`task.model: tests.chaos:<name>`).

Each wraps the built-in MLP and reads its trigger from the trial's hyperparameters, so a
sweep file (search.params) decides which trial fails and how.
"""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from tuner.trial.loop.models import mlp


class _Chaos(nn.Module):
    def __init__(self, config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.net = mlp(config, input_shape, num_classes)
        self.config = config
        self.steps = 0  # training forwards since this model was built (restarts at 0 on resume)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.steps += 1
            self.trip(x)
        return self.net(x)

    def trip(self, x: torch.Tensor) -> None: ...


class _Flaky(_Chaos):
    """Fails once, at training step `fail_at_step`: raises, or with `fail_rank` set, that DDP
    rank's process exits. A marker file (`marker`) makes it happen only once per trial."""

    def trip(self, x: torch.Tensor) -> None:
        if self.steps != int(self.config["fail_at_step"]) or os.path.exists(self.config["marker"]):
            return
        rank = int(self.config.get("fail_rank", -1))
        if rank >= 0:
            import torch.distributed as dist

            if dist.get_rank() != rank:
                return
            open(self.config["marker"], "w").close()
            # Die a few seconds into the epoch, as a real crash would be: Ray Train collects
            # reports every 2 s, and a worker dying sooner can take the last report with it.
            time.sleep(float(self.config.get("die_after_s", 0)))
            os._exit(1)  # the worker dies, as a crashed node's would
        open(self.config["marker"], "w").close()
        raise RuntimeError("flaky: failing once on purpose")


class _OutOfMemory(_Chaos):
    """Raises torch.OutOfMemoryError for training batches above `oom_above` samples; with
    `oom_cpu` set, asks the CPU allocator for more memory than any machine has instead (torch's
    own error: a RuntimeError from c10's allocator)."""

    def trip(self, x: torch.Tensor) -> None:
        if len(x) > int(self.config["oom_above"]):
            if self.config.get("oom_cpu"):
                torch.empty(IMPOSSIBLE_BYTES, dtype=torch.uint8)
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated: batch {len(x)})")


# 2**60 bytes: past any machine's memory and any 64-bit CPU's address space, so the
# allocation fails whatever the system's overcommit policy.
IMPOSSIBLE_BYTES = 1 << 60


def flaky(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _Flaky(config, input_shape, num_classes)


def oom_above(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _OutOfMemory(config, input_shape, num_classes)


def _refuse_broken_width(config: dict[str, Any]) -> None:
    """A user bug: the model cannot be built for width == `broken_width`."""
    if int(config["width"]) == int(config["broken_width"]):
        raise ValueError(f"cannot build a layer of width {config['width']}")


def broken_width(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user bug: this model cannot be built for width == `broken_width`."""
    _refuse_broken_width(config)
    return mlp(config, input_shape, num_classes)


class _EvalOutOfMemory(_Chaos):
    """Raises torch.OutOfMemoryError for evaluation chunks above `eval_oom_above` samples."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and len(x) > int(self.config["eval_oom_above"]):
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated: evaluation chunk {len(x)})")
        return super().forward(x)


def eval_oom_above(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _EvalOutOfMemory(config, input_shape, num_classes)


def before_adam_step(monkeypatch: Any, call: int, action: Any) -> None:
    """Run `action()` before the `call`-th `torch.optim.Adam.step` of this test (the first is
    the one that makes the optimizer's state when a trial is built)."""
    step = torch.optim.Adam.step
    calls = {"n": 0}

    def wrapped(self: torch.optim.Optimizer, *args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == call:
            action()
        return step(self, *args, **kw)

    monkeypatch.setattr(torch.optim.Adam, "step", wrapped)


class _Slow(_Chaos):
    """Sleeps `step_sleep_s` every training step: epochs long enough to catch a trial mid-way."""

    def trip(self, x: torch.Tensor) -> None:
        time.sleep(float(self.config["step_sleep_s"]))


def slow(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _Slow(config, input_shape, num_classes)


class _Hang(_Chaos):
    """Hangs for good at training step `hang_at_step` when its width is `hang_width`; with
    `hang_rank` set, only that DDP rank hangs (the others then wait for it in a collective).
    As it hangs, the trial's watchdog (schedule.trial_timeout, on rank 0) sees its whole
    timeout pass (`timeout_passes`): a test's healthy trials get a timeout no machine's epochs
    reach, and the hung one is ended within the watchdog's next look, on any machine."""

    def trip(self, x: torch.Tensor) -> None:
        if (
            self.steps == int(self.config["hang_at_step"])
            and self.config["width"] == self.config["hang_width"]
        ):
            rank = int(self.config.get("hang_rank", -1))
            mine = 0
            if rank >= 0:
                import torch.distributed as dist

                mine = dist.get_rank()
            if mine == 0:
                timeout_passes()
            if rank >= 0 and mine != rank:
                return
            threading.Event().wait()  # blocked in C, like a deadlock: nothing Python can interrupt


def timeout_passes() -> None:
    """The clock of this process's trial watchdog (tuner/trial/frame/watchdog.py) jumps past any
    deadline: it ends the trial as timed out when it next looks (within a second)."""
    from tuner.trial.frame import watchdog

    watchdog.time = SimpleNamespace(monotonic=lambda: time.monotonic() + 1e9)  # type: ignore[assignment]


def hang(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _Hang(config, input_shape, num_classes)


class _Diverging(_Chaos):
    """Outputs infinities from its first training step: the loss is not finite (diverged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * float("inf")


def fault(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The failure the trial's `fault` names, for one sweep of several failures side by side:
    `error` (a user bug: the model cannot be built), `oom` (out of memory above `oom_above`
    samples a batch), `diverge` (non-finite outputs), `none` (the built-in MLP)."""
    kind = config["fault"]
    if kind == "error":
        _refuse_broken_width({**config, "broken_width": config["width"]})  # whatever its width
    if kind == "oom":
        return _OutOfMemory(config, input_shape, num_classes)
    if kind == "diverge":
        return _Diverging(config, input_shape, num_classes)
    return mlp(config, input_shape, num_classes)


def broken_or_hang(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """`broken_width`'s user bug at that width, else `hang`'s model (hangs at `hang_width`)."""
    _refuse_broken_width(config)
    return _Hang(config, input_shape, num_classes)


# ----------------------------------------------------------------------------- OOM on schedule


class Injections:
    """Out-of-memory errors planned for chosen (step, phase, rank, call): `oom_at` in the
    trial's configuration, a list of [step, phase, rank, call] (phase "forward", "backward" or
    "step"; call: which forward of that step, counting retries). Each happens once. Steps are
    counted by a global optimizer hook (the state-making step at lr 0 not counted), so that a
    model, its backward and the optimizer all see the same clock, one per process."""

    def __init__(self) -> None:
        self.plan: list[list[Any]] = []
        self.step = 0
        self.forwards = 0  # training forwards in this step so far
        self.fired: list[tuple[int, str, float]] = []  # (step, phase, perf_counter) of each
        self.step_ends: list[float] = []  # perf_counter at the end of every optimizer step
        self.hooks: list[Any] = []

    def reset(self, plan: list[list[Any]]) -> None:
        for h in self.hooks:
            h.remove()
        self.__init__()  # type: ignore[misc]
        self.plan = [list(p) for p in plan]
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.hooks = [
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]

    def due(self, phase: str, call: int = -1) -> bool:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        for i, (step, ph, r, at) in enumerate(self.plan):
            if step == self.step and ph == phase and r == rank and (call < 0 or call >= at):
                del self.plan[i]
                self.fired.append((step, phase, time.perf_counter()))
                return True
        return False

    def _counted(self, optimizer: torch.optim.Optimizer) -> bool:
        return any(g["lr"] > 0 for g in optimizer.param_groups)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._counted(optimizer) and self.due("step"):
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: optimizer step {self.step})")

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._counted(optimizer):
            self.step += 1
            self.forwards = 0
            self.step_ends.append(time.perf_counter())


INJECTIONS = Injections()


class _BackwardOOM(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if INJECTIONS.due("backward"):
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: backward at step {INJECTIONS.step})")
        return grad


class _Midway(nn.Module):
    """Between two FSDP units: a forward out of memory after the first unit gathered, a
    backward one after the later units reduced their gradients."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return x
        INJECTIONS.forwards += 1
        if INJECTIONS.due("forward", INJECTIONS.forwards - 1):
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: forward at step {INJECTIONS.step})")
        return _BackwardOOM.apply(x)


class _Scheduled(nn.Module):
    def __init__(self, width: int, features: int, classes: int):
        super().__init__()
        self.a, self.b, self.c = (
            nn.Linear(features, width),
            nn.Linear(width, width),
            nn.Linear(width, classes),
        )
        self.midway = _Midway()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.midway(torch.relu(self.a(x)))
        return self.c(torch.relu(self.b(x)))

    def fsdp_units(self) -> list[nn.Module]:
        return [self.a, self.b, self.c]


def oom_at(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """An MLP of two FSDP units that runs out of memory as `oom_at` plans (see Injections)."""
    INJECTIONS.reset(config.get("oom_at") or [])
    return _Scheduled(int(config["width"]), input_shape[0], num_classes)


class _RankFaults(_Chaos):
    """On one rank of a DDP trial, at training forward `at_step`: `raise_width` raises (the
    time it did written to `marker`), `oom_width` runs out of memory (and again at each step in
    `oom_steps`, "3,18"); other widths train as the MLP does."""

    def trip(self, x: torch.Tensor) -> None:
        import torch.distributed as dist

        c = self.config
        if dist.get_rank() != int(c["fault_rank"]):
            return
        if c["width"] == c.get("raise_width") and self.steps == int(c["at_step"]):
            with open(c["marker"], "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError(f"rank {c['fault_rank']} fails on purpose at step {self.steps}")
        if c["width"] == c.get("oom_width") and str(self.steps) in str(c["oom_steps"]).split(","):
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated, rank {c['fault_rank']})")


def rank_faults(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _RankFaults(config, input_shape, num_classes)
