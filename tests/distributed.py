"""Running the training loop in several local processes (gloo), as Ray Train's workers would."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tuner.cluster.nodes import free_ports
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.run import run_trial


def spawn(fn: Callable[..., None], *args: Any, world: int = 2, backend: str = "gloo") -> None:
    """Run `fn(rank, *args)` in `world` processes joined in one process group."""
    mp.spawn(_entry, args=(world, free_ports(1)[0], backend, fn, args), nprocs=world, join=True)


def _entry(rank: int, world: int, port: int, backend: str, fn: Callable[..., None], args: tuple) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one GPU per rank, as Ray Train gives them
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        fn(rank, *args)
        # No rank tears gloo down while another is still in a collective: that race aborted
        # a rank now and then ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # And none goes through the interpreter's finalization after it: gloo's work objects still
    # referenced (the DDP model's, until the last garbage collection) are destroyed there, and
    # that aborted a rank once more in a full tier (the same words). What the rank made is in
    # its files already; this process is the test's, not a trial's.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _trial(rank: int, root: str, hp: dict, spec: dict, resume: bool) -> None:
    session = LocalSession(root, resume=resume)
    run_trial(hp, TrialSpec(**spec), session)
    Path(root, f"metrics-{rank}.json").write_text(json.dumps(session.metrics))


def run_workers(
    root: Path,
    hp: dict[str, Any],
    spec: TrialSpec,
    world: int = 2,
    resume: bool = False,
    backend: str = "gloo",
) -> list[list[dict]]:
    """One trial in `world` processes sharing `root`; every rank's reported metrics."""
    root.mkdir(parents=True, exist_ok=True)
    spec_dict = {**spec.to_dict(), "workers": world}
    spawn(_trial, str(root), hp, spec_dict, resume, world=world, backend=backend)
    return [json.loads((root / f"metrics-{r}.json").read_text()) for r in range(world)]
