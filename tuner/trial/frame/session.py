"""Where a trial reports to: a Tune trial actor, a DDP rank (an actor of the trial), or
nothing (local).

The loop talks only to this interface (rank facts, `load_checkpoint`, `report`), so the same
loop runs in every mode; each session decides where checkpoints go, and the Ray modules are
imported only by the session that needs them. torch too is imported where it is used: the trial
actor of a script's trial (which trains in its own process) never imports it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Optional

from tuner import timeline
from tuner.errors import MissingMetricError
from tuner.trial.frame.checkpoint import BestCheckpoint, DirCheckpoints, load_from_dir, save_to_dir
from tuner.trial.frame.spec import trial_dir_for

if TYPE_CHECKING:
    import torch


class Session:
    """Rank facts plus the two calls the loop needs: the checkpoint to resume, and report."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    trial_dir: Optional[str] = None
    trial_id: str = "local"
    notice: Optional[str] = None  # what load_checkpoint had to pass over, in one line
    metric: Optional[str] = None  # the sweep's metric: the trial's first report must hold it
    best: Optional[BestCheckpoint] = None  # the best epoch's weights (trials in a sweep directory)
    also: tuple[str, ...] = ()  # the other objectives' metrics, with several: likewise
    # The trial's values of the parameters a population perturbs, recorded with every epoch
    # (config/<name> in TensorBoard): its configuration's schedule, epoch by epoch.
    shown: dict[str, Any] = {}
    # Around the wait for the driver in a report: the trial's watchdog has no deadline there
    # (harness.guarded sets it; see Watchdog.held).
    held: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    _reported: bool = False

    @property
    def reported(self) -> bool:
        """Whether this run of the trial has reported an epoch."""
        return self._reported

    def persist_now(self) -> None:
        """The trial's journal and log where the sweep lives, at once (before its watchdog
        ends the process): nothing to do where the trial writes into the sweep itself."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, use_gpu: bool) -> torch.device:
        import torch

        return cuda(torch.cuda.current_device()) if use_gpu and torch.cuda.is_available() else cpu()

    def load_checkpoint(self, map_location: Any) -> Optional[dict[str, Any]]:
        """The newest checkpoint's state to resume from, or None to start fresh."""
        return None

    def report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]]) -> None:
        """Report an epoch's metrics; `state` (rank 0 only) is checkpointed first.

        Every report of a trial passes here, whoever runs the loop. The first must hold the
        sweep's metric (every objective's), or the trial ends with MissingMetricError before
        anything is sent. An epoch better than any before (by the first objective) keeps its
        weights (`best`) before the scheduler hears of it, so a trial stopped at this report
        has them.
        """
        wanted = (self.metric, *self.also) if self.metric is not None else ()
        missing = [name for name in wanted if name not in metrics]
        if not self._reported and missing:
            raise MissingMetricError(missing[0], list(metrics))
        if not self._reported and self.is_main:
            timeline.mark("first_report", trial=self.trial_id)
        self._reported = True
        if self.best is not None and state is not None and self.is_main:
            self.best.offer(metrics, state)
        self._report(metrics, state)

    def show(self, config: dict[str, Any], names: Sequence[str]) -> None:
        """Record the values of `names` in `config` with every epoch (those it has)."""
        self.shown = {name: config[name] for name in names if name in config}

    def keep_best(self, metric: Optional[str], direction: str) -> None:
        """Keep the trial's best epoch's weights in its directory (by `metric` and `direction`)."""
        if metric is not None and self.trial_dir is not None:
            self.best = BestCheckpoint(self.trial_dir, metric, direction)

    def _report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]]) -> None:
        raise NotImplementedError


class LocalSession(Session):
    """No Ray: metrics kept in a list, checkpoints in `root` (the trial's own files).

    For tests, benchmarks and plain `torchrun` (reads RANK/WORLD_SIZE when set).
    """

    def __init__(
        self,
        root: str,
        resume: bool = False,
        keep: int = 2,
        metric: Optional[str] = None,
        direction: str = "max",
        also: Sequence[str] = (),
    ):
        self.trial_dir, self.metric, self.also = root, metric, tuple(also)
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.metrics: list[dict[str, Any]] = []
        self.checkpoints = DirCheckpoints(root, keep)
        self._resume = resume
        os.makedirs(root, exist_ok=True)
        self.keep_best(metric, direction)

    def device(self, use_gpu: bool) -> torch.device:
        import torch

        return cuda(self.local_rank) if use_gpu and torch.cuda.is_available() else cpu()

    def load_checkpoint(self, map_location: Any) -> Optional[dict[str, Any]]:
        if not self._resume:
            return None
        state = self.checkpoints.load(map_location)
        self.notice = self.checkpoints.notice
        return state

    def _report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]]) -> None:
        if state is not None and self.is_main:
            self.checkpoints.save(state, int(metrics["epoch"]))
        self.metrics.append(dict(metrics))


class TuneSession(Session):
    """Inside a Tune trial actor (one worker).

    With a local or shared sweep directory the trial keeps its own checkpoints there (see
    `tuner.trial.frame.checkpoint`); with URI storage (s3://...) Tune persists them.
    """

    def __init__(
        self,
        sweep_dir: Optional[str],
        keep: int,
        metric: Optional[str] = None,
        direction: str = "max",
        also: Sequence[str] = (),
        storage: str = "",
    ):
        from ray import tune

        from tuner.trial.frame.stored import continue_from_storage

        self.metric, self.also = metric, tuple(also)
        ctx = tune.get_context()
        self.trial_id = ctx.get_trial_id()
        self.trial_dir = trial_dir_for(ctx.get_trial_dir(), sweep_dir)
        self.own = DirCheckpoints(self.trial_dir, keep) if sweep_dir is not None else None
        # Object storage: its earlier files back in its working directory, its newest checkpoint.
        self.stored = continue_from_storage(storage, self.trial_dir) if sweep_dir is None else None
        self.storage = storage if sweep_dir is None else ""
        # In the trial's directory: the sweep's, or with URI storage its working directory,
        # which Ray uploads with each checkpoint: the best weights reach the bucket from the
        # node that made them.
        self.keep_best(metric, direction)

    def device(self, use_gpu: bool) -> torch.device:
        return ray_actor_device(use_gpu)

    def persist_now(self) -> None:
        from tuner.trial.frame.stored import upload_now

        if self.storage and self.trial_dir:
            upload_now(self.storage, self.trial_dir)

    def load_checkpoint(self, map_location: Any) -> Optional[dict[str, Any]]:
        if self.own is not None:
            state = self.own.load(map_location)
            self.notice = self.own.notice
            return state
        from ray import tune

        return _load_ray_checkpoint(tune.get_checkpoint() or self.stored, map_location, self.trial_dir)

    def _report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]]) -> None:
        from ray import tune

        if state is None:
            with self.held():
                tune.report(metrics)
        elif self.own is not None:
            self.own.save(state, int(metrics["epoch"]))
            with self.held():
                tune.report(metrics)
        else:
            with _temp_checkpoint(state, self.trial_dir) as d, self.held():
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


class GroupSession(Session):
    """One rank of a DDP trial whose workers are actors of the trial (trial/launch/ranks.py).

    Rank 0 hands each epoch's metrics, already reduced over the ranks by the loop, to `send`;
    the trial actor forwards them to Tune. Its checkpoints go into the trial's directory
    (`own_dir`: local or shared output, like a 1-worker trial's), else (URI storage) into a
    new directory given to `send` with the metrics, which the trial actor, on rank 0's node,
    hands to Tune.
    Every rank resumes from rank 0's newest checkpoint (its own, or `tune_checkpoint`): rank 0
    reads it and sends it to the others over the process group (`objects`: a CPU group where
    the main one is NCCL), since they may be on nodes that cannot read it.
    A trial stops at its report, as a 1-worker trial does inside Tune's report: `send` returns
    once the trial actor has handed the epoch to Tune, with whether Tune lets the trial go
    on; rank 0 passes that to every rank (`objects`, else the process group), and on a stop
    every rank raises SystemExit there (`stopped` then says so). No rank trains or writes an
    epoch Tune has not let it, and the processes stay fit for another trial.
    """

    def __init__(
        self,
        trial_dir: str,
        trial_id: str,
        rank: int,
        world_size: int,
        keep: int,
        send: Callable[[dict[str, Any], Optional[str]], bool],
        metric: Optional[str] = None,
        direction: str = "max",
        also: Sequence[str] = (),
        local_rank: Optional[int] = None,
        own_dir: bool = True,
        tune_checkpoint: Any = None,
        objects: Any = None,
    ):
        self.trial_dir, self.trial_id, self.metric, self.also = trial_dir, trial_id, metric, tuple(also)
        self.rank, self.world_size = rank, world_size
        self.local_rank = rank if local_rank is None else local_rank
        self.own = DirCheckpoints(trial_dir, keep) if own_dir else None
        self._tune_checkpoint, self._objects = tune_checkpoint, objects
        self._send = send
        self._go = True  # rank 0: what the trial actor said of the last report
        self.stopped = False  # Tune stopped the trial at a report (SystemExit was raised)
        if self.is_main:
            self.keep_best(metric, direction)

    def report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]]) -> None:
        import torch

        super().report(metrics, state)
        go = torch.tensor([1 if self._go else 0])
        if self.world_size > 1:
            import torch.distributed as dist

            dist.broadcast(go, src=0, group=self._objects)
        if not go.item():
            self.stopped = True
            raise SystemExit(0)

    def device(self, use_gpu: bool) -> torch.device:
        return ray_actor_device(use_gpu)

    def load_checkpoint(self, map_location: Any) -> Optional[dict[str, Any]]:
        state = None
        if self.is_main and self.own is not None:
            state = self.own.load(map_location)
            self.notice = self.own.notice
        elif self.is_main:
            state = _load_ray_checkpoint(self._tune_checkpoint, map_location, self.trial_dir)
        if self.world_size > 1:
            import torch.distributed as dist

            box = [state]
            dist.broadcast_object_list(box, src=0, group=self._objects)
            state = box[0]
        return state

    def _report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]]) -> None:
        if not self.is_main:
            return  # the loop reduced the metrics over ranks: rank 0's stand for all
        path = None
        if state is not None and self.own is not None:
            self.own.save(state, int(metrics["epoch"]))
        elif state is not None:  # the trial actor reports it to Tune, then removes it
            from tuner.trial.frame.stored import journal_into

            path = tempfile.mkdtemp(prefix="tuner-ckpt-")
            save_to_dir(state, path)
            journal_into(path, self.trial_dir)
        with self.held():  # until the trial actor has handed the epoch to Tune, and back
            self._go = self._send(dict(metrics), path)


def cpu() -> torch.device:
    import torch

    return torch.device("cpu")


def ray_actor_device(use_gpu: bool) -> torch.device:
    """The device of a Ray actor that holds GPUs (its first), else the CPU."""
    import torch

    if not (use_gpu and torch.cuda.is_available()):
        return cpu()
    import ray

    return cuda(cuda_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")))


def cuda(index: int) -> torch.device:
    """CUDA device `index`, made this process's current device: kernels, NCCL and
    `torch.cuda.*` calls without a device then all go to the trial's GPU."""
    import torch

    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def cuda_index(ray_gpu_ids: Sequence[Any], visible: Optional[str]) -> int:
    """The CUDA index of a Ray actor's (first) GPU.

    Ray sets CUDA_VISIBLE_DEVICES to the actor's GPUs, so its GPU id is found in that list (at
    0); with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES it leaves the variable alone and every
    GPU is visible, so the id is the index.
    """
    if not ray_gpu_ids:
        import torch

        return torch.cuda.current_device()
    gpu = str(ray_gpu_ids[0])
    if visible is None:
        return int(gpu)
    listed = [v.strip() for v in visible.split(",")]
    if gpu not in listed:
        # Not a guess: GPU 0 of this list is another trial's (or another rank's).
        raise RuntimeError(
            f"Ray gave this process GPU {gpu}, not among CUDA_VISIBLE_DEVICES={visible}: "
            "something changed CUDA_VISIBLE_DEVICES after Ray set it"
        )
    return listed.index(gpu)


@contextmanager
def _temp_checkpoint(state: dict[str, Any], trial_dir: Optional[str] = None) -> Iterator[str]:
    """A temporary directory holding `state` (and the trial's journal, from `trial_dir`); Ray
    copies it into storage during report."""
    from tuner.trial.frame.stored import journal_into

    with tempfile.TemporaryDirectory(prefix="tuner-ckpt-") as d:
        save_to_dir(state, d)
        if trial_dir:
            journal_into(d, trial_dir)
        yield d


def _load_ray_checkpoint(
    ckpt: Any, map_location: Any, trial_dir: Optional[str] = None
) -> Optional[dict[str, Any]]:
    """The state in a checkpoint Ray handed back (Tune's or Train's), or None without one; the
    journal it carries into `trial_dir` where that goes further than the trial's own."""
    from tuner.trial.frame.stored import journal_from

    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        if trial_dir:
            journal_from(d, trial_dir)
        return load_from_dir(d, map_location)
