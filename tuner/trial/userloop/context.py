"""`ctx`: what a user's own training loop (`task.train: "pkg.mod:fn"`, `fn(config, ctx)`) gets.

The same pieces tuner's own loop is made of, offered one by one: the device and rank facts,
AMP (`autocast`, `scaler`), the parallel strategy (`prepare`: DDP/FSDP, compile,
channels_last), an optimizer step that backs off when memory runs out (`step`), batches on the
device (`loader`: distributed sampler, pinned memory, the CUDA prefetcher), and the session
(`report`, `restore`). `report` is one epoch: its metrics go to the journal, TensorBoard and
the scheduler, its `state` to a checkpoint written before the scheduler hears of the epoch, so
a trial that is paused, retried or resumed after a killed driver continues from there
(`restore`, `epoch`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, NoReturn, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from tuner.trial.frame.harness import Frame, Progress, failed, screened
from tuner.trial.frame.memory import TrialOOM
from tuner.trial.loop.amp import make_amp
from tuner.trial.loop.data import Batches
from tuner.trial.loop.parallel import make_strategy
from tuner.trial.loop.parts import TrainState
from tuner.trial.loop.prefetch import Batch, Feed, input_format, make_feed
from tuner.trial.loop.step import Stepper, batch_size


class TrialEnded(BaseException):
    """Raised by `report` after recording a failure (diverged): the user's loop must not go
    on. A BaseException, like the SystemExit Ray raises in `report` when the scheduler stops
    or pauses a trial, so an `except Exception` in the user's loop does not catch it."""


class TrainContext:
    """The `ctx` of `fn(config, ctx)`; see docs/how-to/own-loop.md."""

    def __init__(self, frame: Frame, progress: Progress, checkpoint: Optional[dict[str, Any]]):
        self._frame, self._progress = frame, progress
        session = frame.session
        self.device: torch.device = frame.device
        self.rank: int = session.rank
        self.local_rank: int = session.local_rank
        self.world_size: int = session.world_size
        self.is_main: bool = session.is_main
        self.trial_dir: Optional[str] = session.trial_dir
        self.max_epochs: int = frame.spec.max_epochs
        # Epochs reported so far, those before a resume included: `report` counts on from it.
        self.epoch: int = int(checkpoint["epoch"]) if checkpoint else 0
        self._amp = make_amp(frame.settings.amp, frame.device)
        self.scaler: torch.amp.GradScaler = self._amp.scaler
        if checkpoint and checkpoint.get("scaler"):
            self.scaler.load_state_dict(checkpoint["scaler"])
        self._restored = checkpoint["user"] if checkpoint else None
        self._strategy = make_strategy(frame.spec.strategy, self.world_size)
        self._models: dict[int, nn.Module] = {}  # id(what prepare returned) -> the model in it
        self._loaders: list[Batches] = []
        self.last: Optional[dict[str, Any]] = None  # the last epoch's metrics, as recorded
        self._pending = False  # the last epoch is recorded, and reported at `flush`
        self._held: Optional[dict[str, Any]] = None  # its checkpoint
        self._t0 = time.perf_counter()
        # `step`'s micro-batch (0: the whole batch, until memory runs out) and back-offs, kept
        # in the checkpoint: a resumed trial does not run out at the same size again.
        steps = (checkpoint or {}).get("steps") or {}
        self._steps = TrainState(
            micro_batch=int(steps.get("micro_batch") or frame.settings.micro_batch or 0),
            oom_backoffs=int(steps.get("oom_backoffs", 0)),
        )
        self._steppers: dict[tuple[int, int], Stepper] = {}
        self._backoffs_reported = self._steps.oom_backoffs
        frame.gpu.start_epoch()

    # ------------------------------------------------------------------ training pieces

    def autocast(self) -> AbstractContextManager[Any]:
        """The forward pass's mixed precision (`training.amp`); does nothing when off."""
        return self._amp.autocast()

    def prepare(
        self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None
    ) -> tuple[nn.Module, Optional[torch.optim.Optimizer]]:
        """`model` moved to the device and wrapped for the trial's workers (DDP, or FSDP2
        sharding), compiled and in channels_last where `training` asks; `optimizer` (built
        over `model`'s parameters) over what training now updates."""
        s = self._frame.settings
        if s.channels_last:  # applies to 4-D weights only (convolutions)
            model = model.to(memory_format=torch.channels_last)
        names = {id(p): n for n, p in model.named_parameters()}
        net = self._strategy.wrap(model, self.device, compile=s.compile, param_dtype=self._amp.dtype)
        self._models[id(net)] = model
        if optimizer is not None:
            optimizer = _rebind(optimizer, model, names)
        return net, optimizer

    def step(
        self,
        net: nn.Module,
        optimizer: torch.optim.Optimizer,
        batch: Any,
        loss_fn: Callable[..., torch.Tensor],
        *,
        clip: Optional[float] = None,
    ) -> torch.Tensor:
        """One optimizer step over `batch` that backs off when memory runs out; returns the
        batch's mean loss (detached).

        `batch` is a tensor, a tuple or list of tensors (`loss_fn(*micro_batch)`), or a dict
        of them (`loss_fn(micro_batch)`), split along the first dimension; `loss_fn` returns a
        micro-batch's mean loss, calling `net` (what `prepare` returned). Gradients are zeroed,
        accumulated over micro-batches to the whole batch's, reduced over workers, unscaled
        (fp16), clipped to `clip` (a norm; default `training.grad_clip`) and stepped with
        `ctx.scaler`. On out-of-memory on any
        worker, every worker drops the step, halves the micro-batch (twice the micro-batches:
        the effective batch stays) and runs it again; below `training.min_micro_batch` the
        trial ends as `failure: oom` (this does not return). Your learning-rate schedule is
        yours to step after it.
        """
        stepper = self._steppers.get((id(net), id(optimizer)))
        if stepper is None:
            stepper = Stepper(
                net=net, model=self._models.get(id(net), net), optimizer=optimizer,
                strategy=self._strategy, amp=self._amp, device=self.device, state=self._steps,
                min_micro=self._frame.settings.min_micro_batch, log=self._frame.log,
                grad_clip=self._frame.settings.grad_clip if clip is None else clip,
            )  # fmt: skip
            self._steppers[(id(net), id(optimizer))] = stepper
        n = batch_size(batch)
        self._steps.micro_batch = self._steps.micro_batch or n
        unpacked = isinstance(batch, (tuple, list))
        try:
            total = stepper.step(batch, (lambda b: loss_fn(*b)) if unpacked else loss_fn)
        except TrialOOM as err:
            self._end("oom", str(err))
        return total / n

    def loader(self, dataset: Dataset, batch_size: int, shuffle: bool = True) -> Loader:
        """Batches of `dataset` on the device: each pass is an epoch. `batch_size` is summed
        over workers, as `training.batch_size` is: each worker gets its share of every batch.
        shuffle=True: reshuffled every epoch (the same order after a resume); False: each
        worker's share in order, unpadded (for evaluation)."""
        s = self._frame.settings
        batches = Batches(
            dataset,
            device=self.device,
            rank=self.rank,
            world_size=self.world_size,
            seed=s.seed,
            loader_workers=s.loader_workers,
        )
        self._loaders.append(batches)
        fmt = torch.contiguous_format
        if s.channels_last:
            first = dataset[0]
            x = first if isinstance(first, torch.Tensor) else first[0]
            fmt = input_format(True, tuple(torch.as_tensor(x).shape), self._frame.log)
        feed = make_feed(self.device, _as_is, s.prefetch, fmt)
        return Loader(self, batches, feed, max(1, batch_size // self.world_size), shuffle)

    def state_dict(
        self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None
    ) -> dict[str, Any]:
        """{"model": ..., "optimizer": ...}: full, unsharded state dicts whatever the strategy
        (no DDP `module.` prefix; FSDP gathers them, so every worker must call this)."""
        weights, optim = self._strategy.state(self._models.get(id(model), model), optimizer)
        return {"model": weights} if optim is None else {"model": weights, "optimizer": optim}

    def load_state_dict(
        self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer], state: dict[str, Any]
    ) -> None:
        """Load what `state_dict` gave (every worker calls it; FSDP keeps each its shard)."""
        inner = self._models.get(id(model), model)
        self._strategy.load(inner, optimizer, state["model"], state.get("optimizer"))

    # ------------------------------------------------------------------ the session

    def restore(self) -> Optional[dict[str, Any]]:
        """The `state` of the newest checkpoint when the trial resumes (paused and resumed,
        retried, `tuner resume`), else None. Tensors come back on the CPU."""
        return self._restored

    def report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]] = None) -> None:
        """One epoch done: `metrics` (numbers, averaged over the workers) to the scheduler,
        the journal and TensorBoard; `state` (rank 0's) checkpointed first. When the
        scheduler stops or pauses the trial this does not return (nor after a non-finite
        metric: the trial ends as diverged). With `metrics["epoch"]` equal to the epoch
        reported last (`ctx.epoch`), its metrics are added to that epoch instead (a final test
        metric after training; the scheduler has judged the epoch already)."""
        if self.last is not None and "epoch" in metrics and int(metrics["epoch"]) == self.epoch:
            self._amend(self._row({k: v for k, v in metrics.items() if k != "epoch"}))
            return
        row = self._row(metrics)
        self.epoch += 1
        row["epoch"] = self.epoch
        row["epoch_time_s"] = time.perf_counter() - self._t0
        row.update(self._frame.gpu.stats())
        if self._steppers:  # as tuner's loop reports them
            row.update(micro_batch=self._steps.micro_batch, oom_backoffs=self._steps.oom_backoffs)
            if self._steps.oom_backoffs > self._backoffs_reported:
                note = (
                    f"OOM: micro-batch now {self._steps.micro_batch} ({self._steps.oom_backoffs} back-offs)"
                )
                self._progress.note(note, self.epoch)
                self._backoffs_reported = self._steps.oom_backoffs
        row = screened(row, self._frame.spec, self.epoch)
        payload = None
        if state is not None and self.is_main:
            payload = {"epoch": self.epoch, "user": state, "scaler": self.scaler.state_dict()}
            if self._steppers:
                payload["steps"] = {
                    "micro_batch": self._steps.micro_batch,
                    "oom_backoffs": self._steps.oom_backoffs,
                }
        self.last = row
        if not self._progress.record(row):
            raise TrialEnded(row.get("failure"))
        if self.epoch >= self.max_epochs:
            # The last epoch reaches the scheduler when the function returns (`flush`): told
            # now, ASHA ends the trial at max_epochs inside this call, and code after the
            # loop (a final test metric, saving the model) would never run.
            self._pending, self._held = True, payload
        else:
            self._frame.session.report(row, payload)
        self._progress.kick()
        self._frame.gpu.start_epoch()
        self._t0 = time.perf_counter()

    def _end(self, failure: str, detail: str) -> NoReturn:
        """End the trial as `failure` (a result, recorded and reported): the user's loop stops."""
        metrics = failed(self.last, self._frame.spec, failure, detail, self.epoch)
        self._pending, self._held = False, None
        self._progress.end(metrics)
        self.last = metrics
        raise TrialEnded(failure)

    def flush(self) -> None:
        """Report the last epoch (with what was added to it since), once the function returned."""
        if self._pending and self.last is not None:
            held, self._pending, self._held = self._held, False, None
            self._frame.session.report(self.last, held)

    def _amend(self, row: dict[str, Any]) -> None:
        assert self.last is not None
        new = {k: v for k, v in row.items() if k not in self.last}
        kept = sorted(k for k in row if k in self.last and row[k] != self.last[k])
        if kept:
            self._frame.log.warning(
                "epoch %d reported again: %s kept as first reported", self.epoch, ", ".join(kept)
            )
        if new:
            self._progress.amend(new, self.epoch)
            self.last = {**self.last, **new}

    def _row(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Plain numbers (0-d tensors read once), averaged over ranks; strings kept."""
        if "epoch" in metrics and int(metrics["epoch"]) != self.epoch + 1:
            raise ValueError(
                f"ctx.report: metrics['epoch'] is {metrics['epoch']} but this is epoch "
                f"{self.epoch + 1} (tuner counts one epoch per report, on from a checkpoint: "
                "leave 'epoch' out, or start your loop at ctx.epoch; the epoch reported last adds "
                "to that epoch)"
            )
        numbers: dict[str, float] = {}
        row: dict[str, Any] = {}
        for key, value in metrics.items():
            if key == "epoch":
                continue
            if isinstance(value, str):
                row[key] = value
            elif isinstance(value, (int, float, torch.Tensor)) and not isinstance(value, bool):
                numbers[key] = value.item() if isinstance(value, torch.Tensor) else value
            else:
                raise TypeError(f"ctx.report: metric '{key}' is a {type(value).__name__}, not a number")
        if self.world_size > 1 and numbers:
            # One all-reduce of every number (ranks report the same keys, in any order).
            keys = sorted(numbers)
            t = torch.tensor([float(numbers[k]) for k in keys], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            numbers = dict(zip(keys, (t / self.world_size).tolist(), strict=True))
        return {**numbers, **row}

    def close(self) -> None:
        for batches in self._loaders:
            batches.close()


class Loader:
    """An epoch of batches per pass (`for x, y in loader`), on the device."""

    def __init__(self, ctx: TrainContext, batches: Batches, feed: Feed, per_rank: int, shuffle: bool):
        self.ctx, self.batches, self.feed = ctx, batches, feed
        self.per_rank, self.shuffle = per_rank, shuffle

    def __iter__(self) -> Iterator[Batch]:
        if self.shuffle:  # the epoch being trained picks the order
            return self.feed(self.batches.train_steps(self.ctx.epoch, self.per_rank))
        return self.feed(self.batches.eval_chunks(self.per_rank))

    def __len__(self) -> int:
        if self.shuffle:
            return math.ceil(len(self.batches) / self.per_rank)
        share = math.ceil(len(self.batches.ds) / self.batches.world)  # type: ignore[arg-type]
        return max(1, math.ceil(share / self.per_rank))


def _as_is(x: torch.Tensor) -> torch.Tensor:
    return x  # a user's inputs are theirs: token ids stay integers


def _rebind(
    optimizer: torch.optim.Optimizer, model: nn.Module, names: dict[int, str]
) -> torch.optim.Optimizer:
    """The optimizer over the model's parameters as they are after wrapping. DDP and moving to
    a device keep the parameter objects (the optimizer as it was); FSDP2 replaces them with
    sharded ones: the same optimizer class and groups, rebuilt over those."""
    now = dict(model.named_parameters())
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if all(now.get(names.get(id(p), "")) is p for p in held):
        return optimizer
    if optimizer.state:
        raise ValueError("ctx.prepare: pass the optimizer before its first step (its state cannot move)")
    groups = []
    for group in optimizer.param_groups:
        if any(id(p) not in names for p in group["params"]):
            raise ValueError("ctx.prepare: the optimizer updates parameters that are not the model's")
        groups.append({**group, "params": [now[names[id(p)]] for p in group["params"]]})
    return type(optimizer)(groups)
