"""Where a trial reports to: a Tune trial actor, a Ray Train worker, or nothing (local).

The loop talks only to this interface, so the same loop runs in every mode; the Ray
modules are imported only by the session that needs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any, Optional

import torch


class Session:
    """Rank facts plus the two calls the loop needs: the checkpoint to resume, and report."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    trial_dir: Optional[str] = None
    trial_id: str = "local"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, use_gpu: bool) -> torch.device:
        if use_gpu and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[Optional[str]]:
        """The directory of the checkpoint to resume from, or None to start fresh."""
        yield None

    def report(self, metrics: dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        raise NotImplementedError


class LocalSession(Session):
    """No Ray: metrics kept in a list, the last checkpoint in `root/checkpoint`.

    For tests, benchmarks and plain `torchrun` (reads RANK/WORLD_SIZE when set).
    """

    def __init__(self, root: str, resume: bool = False):
        self.trial_dir = root
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.metrics: list[dict[str, Any]] = []
        self._ckpt = os.path.join(root, "checkpoint")
        self._resume = resume
        os.makedirs(root, exist_ok=True)

    def device(self, use_gpu: bool) -> torch.device:
        if use_gpu and torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[Optional[str]]:
        yield self._ckpt if self._resume and os.path.isdir(self._ckpt) else None

    def report(self, metrics: dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        self.metrics.append(dict(metrics))
        if checkpoint_dir is not None:
            shutil.rmtree(self._ckpt, ignore_errors=True)
            shutil.copytree(checkpoint_dir, self._ckpt)


class TuneSession(Session):
    """Inside a Tune trial actor (one worker): ray.tune.report / get_checkpoint."""

    def __init__(self, sweep_dir: Optional[str]):
        from ray import tune

        ctx = tune.get_context()
        self.trial_id = ctx.get_trial_id()
        self.trial_dir = trial_dir_for(ctx.get_trial_dir(), sweep_dir)

    def device(self, use_gpu: bool) -> torch.device:
        # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU: it is device 0 here.
        return torch.device("cuda", 0) if use_gpu and torch.cuda.is_available() else torch.device("cpu")

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[Optional[str]]:
        from ray import tune

        ckpt = tune.get_checkpoint()
        if ckpt is None:
            yield None
            return
        with ckpt.as_directory() as d:
            yield d

    def report(self, metrics: dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        from ray import tune

        ckpt = tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        tune.report(metrics, checkpoint=ckpt)


class TrainSession(Session):
    """Inside a Ray Train worker (DDP): every rank reports, rank 0 with the checkpoint."""

    def __init__(self, trial_dir: Optional[str], trial_id: str):
        import ray.train

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.local_rank = ctx.get_local_rank()
        self.world_size = ctx.get_world_size()
        self.trial_dir, self.trial_id = trial_dir, trial_id

    def device(self, use_gpu: bool) -> torch.device:
        if use_gpu and torch.cuda.is_available():
            import ray.train.torch

            return ray.train.torch.get_device()
        return torch.device("cpu")

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[Optional[str]]:
        import ray.train

        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            yield None
            return
        with ckpt.as_directory() as d:
            yield d

    def report(self, metrics: dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        import ray.train

        ckpt = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.train.report(metrics, checkpoint=ckpt)


def trial_dir_for(staging_dir: str, sweep_dir: Optional[str]) -> str:
    """Where a trial writes its files: straight into the sweep directory when storage is a
    local or shared path; else Ray's local staging directory, which Ray syncs to storage."""
    if sweep_dir is None:
        return staging_dir
    path = os.path.join(sweep_dir, os.path.basename(staging_dir.rstrip("/")))
    os.makedirs(path, exist_ok=True)
    return path
