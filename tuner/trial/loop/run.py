"""One training loop for every mode: in a Tune actor, in a DDP trial's ranks, or locally.

Per epoch: train (micro-batches accumulated to the trial's batch size, AMP, OOM back-off),
evaluate under `inference_mode`, reduce metrics over ranks, checkpoint, report. Everything
mode-specific hides behind objects (Session, Amp, Feed, Gpu, the parallel strategy,
EventWriter/NullWriter), so the body has no branches on rank, AMP, device or strategy.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from tuner.trial.frame.gpu import NoGpu, make_gpu
from tuner.trial.frame.harness import Frame, Progress, failed, guarded, screened, trial_logger
from tuner.trial.frame.memory import TrialOOM, halve, release
from tuner.trial.frame.session import Session
from tuner.trial.frame.settings import Settings
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.frame.watchdog import NoWatchdog
from tuner.trial.loop.amp import make_amp
from tuner.trial.loop.batchsize import fit_micro_batch
from tuner.trial.loop.data import Batches, load_data
from tuner.trial.loop.hooks import make_objective
from tuner.trial.loop.lockstep import attempt
from tuner.trial.loop.models import build_model
from tuner.trial.loop.optim import build_optimizer, build_schedule
from tuner.trial.loop.parallel import make_strategy
from tuner.trial.loop.parts import Parts, TrainState, report_with_checkpoint, restore
from tuner.trial.loop.prefetch import input_format, make_feed
from tuner.trial.loop.step import Stepper


def run_trial(hp: dict[str, Any], spec: TrialSpec, session: Session) -> Optional[dict[str, Any]]:
    """Train one configuration to `spec.max_epochs` (or until stopped); returns last metrics."""
    return guarded(hp, spec, session, lambda frame: _build_and_train(hp, frame))


def _build_and_train(hp: dict[str, Any], f: Frame) -> Optional[dict[str, Any]]:
    # The trial's live objects exist only in this frame: when it returns they are gone.
    parts = build_parts(hp, f.spec, f.session, f.device, f.gpu, f.settings)
    try:
        return _train(parts, f.watchdog)
    finally:
        parts.close()


def build_parts(
    hp: dict[str, Any],
    spec: TrialSpec,
    session: Session,
    device: torch.device,
    gpu: Optional[NoGpu] = None,
    settings: Optional[Settings] = None,
) -> Parts:
    """Data, model, optimizer and the rest of one trial, ready to train on `device`.

    `hp`: the trial's whole configuration (model sizes and user keys too); `settings`: its
    training settings, typed (read from `hp` when not given).
    """
    s = settings or Settings.of(hp)
    torch.manual_seed(s.seed)
    log = trial_logger(session)
    data = load_data(spec.data, spec.data_args, hp, spec.search_path)
    # Built and formatted on the CPU; the strategy moves it (FSDP: only each rank's shard).
    model = build_model(spec.model, hp, data.input_shape, data.num_classes, spec.search_path)
    # Trainable parameters, counted before a strategy wraps or shards the model (FSDP).
    num_params = sum(t.numel() for t in model.parameters() if t.requires_grad)
    fmt = input_format(s.channels_last, data.input_shape, log)
    model = model.to(memory_format=fmt)
    amp = make_amp(s.amp, device, s.eval_precision)
    strategy = make_strategy(spec.strategy, session.world_size)
    net = strategy.wrap(model, device, compile=s.compile, param_dtype=amp.dtype)
    optimizer = build_optimizer(model, s)
    per_rank = max(1, s.batch_size // session.world_size)
    loader_args = dict(
        device=device,
        rank=session.rank,
        world_size=session.world_size,
        seed=s.seed,
        loader_workers=s.loader_workers,
        prepare=data.prepare,
    )
    train, val = Batches(data.train, **loader_args), Batches(data.val, **loader_args)
    steps = math.ceil(len(train) / per_rank)
    schedule = build_schedule(optimizer, s, steps, spec.max_epochs)
    micro = min(s.micro_batch or per_rank, per_rank)
    parts = Parts(
        spec=spec,
        session=session,
        device=device,
        data=data,
        model=model,
        net=net,
        strategy=strategy,
        objective=make_objective(spec.loss, spec.metrics, data.num_classes, spec.search_path),
        optimizer=optimizer,
        schedule=schedule,
        amp=amp,
        feed=make_feed(device, data.prepare, s.prefetch, fmt),
        gpu=gpu or make_gpu(device),
        train=train,
        val=val,
        per_rank_batch=per_rank,
        # No larger than this worker's share of the split: that is one chunk already, and an
        # out-of-memory in evaluation halves from the size that ran.
        eval_batch=max(1, min(s.eval_batch_size, len(val))),
        min_micro=s.min_micro_batch,
        grad_clip=s.grad_clip,
        find_batch_size=s.find_batch_size,
        state=TrainState(micro_batch=micro),
        log=log,
        num_params=num_params,
        settings=s,
    )
    parts.stepper = Stepper(
        net=net, model=model, optimizer=optimizer, strategy=strategy, amp=amp, device=device,
        state=parts.state, min_micro=s.min_micro_batch, grad_clip=s.grad_clip, log=log,
    )  # fmt: skip
    return parts


def _train(p: Parts, watchdog: Optional[NoWatchdog] = None) -> Optional[dict[str, Any]]:
    resumed = restore(p)
    progress = Progress(p.session, p.log, watchdog)
    progress.start(p.state.epoch, resumed, f" (micro-batch {p.state.micro_batch})")
    metrics: Optional[dict[str, Any]] = None
    try:
        if p.find_batch_size and not resumed:  # a resumed trial keeps the micro-batch it had
            p.state.micro_batch = fit_micro_batch(p)
            progress.note(f"find_batch_size: micro-batch {p.state.micro_batch}", 0)
        for epoch in range(p.state.epoch, p.spec.max_epochs):
            backoffs = p.state.oom_backoffs
            metrics = _epoch(p, epoch)
            if p.state.oom_backoffs > backoffs:
                note = f"OOM: micro-batch now {p.state.micro_batch} ({p.state.oom_backoffs} back-offs)"
                progress.note(note, epoch + 1)
            if not progress.record(metrics):
                break
            report_with_checkpoint(p, metrics)  # (the writer flushes itself every few seconds)
            progress.kick()
    except TrialOOM as err:
        # The trial ends, as a result (not a crash): its config does not fit this device.
        metrics = failed(metrics, p.spec, "oom", str(err), p.state.epoch)
        progress.end(metrics)
    finally:
        progress.close()
    return metrics


def _epoch(p: Parts, epoch: int) -> dict[str, Any]:
    p.gpu.start_epoch()
    t0 = time.perf_counter()
    loss_sum, seen = _train_epoch(p, epoch)
    p.gpu.sync()  # the clock counts the queued work too, not just its launch
    train_s = time.perf_counter() - t0
    val_loss_sum, val_seen, val_sums = _evaluate(p)
    names = list(val_sums)  # the same on every rank: the same function made them
    totals = _all_sum(p, [loss_sum, seen, val_loss_sum, val_seen, *val_sums.values()])
    loss_sum, seen, val_loss_sum, val_seen = totals[:4]
    p.state.epoch = epoch + 1
    metrics: dict[str, Any] = {
        "epoch": epoch + 1,
        "train_loss": loss_sum / max(seen, 1),
        "val_loss": val_loss_sum / max(val_seen, 1),
        # Each hook metric's batch means, weighted by batch size over chunks and ranks.
        **{f"val_{name}": total / max(val_seen, 1) for name, total in zip(names, totals[4:], strict=True)},
        "samples_per_s": seen / max(train_s, 1e-9),
        "train_samples": int(seen),
        "epoch_time_s": time.perf_counter() - t0,
        "lr": p.optimizer.param_groups[0]["lr"],
        "world_size": p.session.world_size,
        "micro_batch": p.state.micro_batch,
        "oom_backoffs": p.state.oom_backoffs,
        "num_params": p.num_params,  # an objective of its own (model size), every epoch
        **p.gpu.stats(),
    }
    # Never let NaN reach a scheduler (ASHA's rung cut-offs do not guard against it): a
    # diverged trial reports the worst value, so it is never promoted.
    return screened(metrics, p.spec, epoch + 1)


def _train_epoch(p: Parts, epoch: int) -> tuple[torch.Tensor, int]:
    p.net.train()
    losses: list[torch.Tensor] = []
    seen = 0
    for x, y in p.feed(p.train.train_steps(epoch, p.per_rank_batch)):
        losses.append(optimizer_step(p, x, y))
        seen += len(y)
    # One reduction per epoch, not an accumulation per step: on small models the per-op cost
    # of a step's bookkeeping is a visible share of the step itself.
    loss_sum = (
        torch.stack(losses).sum(dtype=torch.float64) if losses else torch.zeros((), dtype=torch.float64)
    )
    return loss_sum, seen


def optimizer_step(p: Parts, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One step over the per-worker batch (x, y), backing off on OOM on any rank (step.py);
    returns the batch's loss summed over its samples."""
    total = p.stepper.step((x, y), lambda b: p.objective.loss(p.net(b[0]), b[1]))
    p.schedule.step()
    return total


def _evaluate(p: Parts) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """Loss sum, samples and each metric's sum of the validation split (sums of batch means
    times batch sizes); on out-of-memory on any rank the evaluation chunk halves on every rank
    and evaluation starts over (it changes nothing, so it can)."""
    gate = p.strategy.gate
    while True:
        result, short = attempt(gate, lambda: _evaluate_in_chunks(p), lambda: "evaluation")
        if result is not None:
            return result
        assert short is not None
        p.strategy.reset(p.net)
        gate.clear()
        release(p.device)
        before = p.eval_batch
        p.eval_batch = halve(before, 1)
        where = "" if p.session.world_size == 1 else f" ({short.where(p.session.world_size)})"
        p.log.warning(
            "OOM in evaluation at %d samples%s: evaluating in chunks of %d", before, where, p.eval_batch
        )


@torch.inference_mode()
def _evaluate_in_chunks(p: Parts) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    # Not DDP's wrapper: its forward would broadcast buffers, a collective for nothing here.
    # FSDP's sharded model gathers parameters in forward: every rank runs as many chunks.
    p.model.eval()
    loss_sum = torch.zeros((), device=p.device, dtype=torch.float64)
    sums: dict[str, torch.Tensor] = {}
    seen = 0
    for x, y in p.feed(p.val.eval_chunks(p.eval_batch)):
        with p.amp.eval_autocast():
            out = p.model(x).float()
        n = len(y)
        # Every chunk is measured, an empty one too (a rank's share may be one short): the
        # metrics' names must be the same on every rank; an empty chunk's means weigh 0.
        loss, values = p.objective.loss(out, y), p.objective.metrics(out, y)
        if n:
            loss_sum += loss.double() * n
        for name, v in values.items():
            sums[name] = sums.get(name, torch.zeros_like(v)) + (v * n if n else 0.0)
        seen += n
    return loss_sum, seen, sums


def _all_sum(p: Parts, values: list[Any]) -> list[float]:
    """Sum over ranks (one all-reduce; also the epoch's only device sync)."""
    t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=p.device) for v in values])
    if p.session.world_size > 1:
        dist.all_reduce(t)
    return t.tolist()
