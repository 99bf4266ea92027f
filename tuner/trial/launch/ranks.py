"""A DDP trial whose workers fit on one node, without Ray Train: the trial actor runs them.

Tune reserves the trial's placement group (`resources.tune_request`: an empty head bundle for
the trial actor, one bundle per worker, all on one node). The trial actor (`run_group`)
starts one `Rank` actor in each bundle, they join a gloo (CPU) or NCCL (GPU) process group on
127.0.0.1, and each runs the same loop as a Ray Train worker would. What we relied on Ray
Train for, kept:

- metrics over all ranks: the loop reduces them; rank 0's session hands each epoch's to this
  actor, which reports it to Tune;
- retries from checkpoints: rank 0 writes the trial's checkpoints into its directory before it
  reports (as a 1-worker trial does); a rank that raises or dies fails the trial, Tune retries
  it up to `failure.max_failures` and every rank resumes from the newest checkpoint;
- resources returned: the rank actors are killed when the trial ends however it ends, and
  they are this actor's and live in the trial's placement group, so Ray ends them as well
  when Tune stops the trial or removes the group.

This saves Ray Train's controller actor, its worker-group set-up and its 2-second report
polling. Nothing here imports torch at module level: the trial actor never needs it.
"""

from __future__ import annotations

import os
import queue
import socket
from typing import Any, Optional

from tuner.config.modes import MODES
from tuner.trial.frame.spec import TrialSpec, trial_dir_for

LOOPBACK = "127.0.0.1"
END = None  # rank 0's last item: its loop has returned or raised
POLL_S = 30.0  # how long one call for rank 0's reports waits for one


class Rank:
    """One worker of a trial (a Ray actor in the trial's placement group)."""

    def __init__(self) -> None:
        import torch.distributed  # noqa: F401 - the import, at start-up, while the others start too

        self._reports: queue.Queue[Optional[dict[str, Any]]] = queue.Queue()

    def free_port(self) -> int:
        """A free TCP port on this node (rank 0's: the process group meets there)."""
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            return int(s.getsockname()[1])

    def gpu_ids(self) -> list[str]:
        import ray

        return [str(g) for g in ray.get_gpu_ids()]

    def run(
        self,
        hp: dict[str, Any],
        spec: TrialSpec,
        trial_dir: str,
        trial_id: str,
        rank: int,
        port: int,
        visible: Optional[str],
    ) -> None:
        """Join the process group and train; returns when the loop does, raises what it raises."""
        import torch.distributed as dist

        from tuner.trial.frame.session import GroupSession

        world = spec.workers
        env = dict(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=world, LOCAL_WORLD_SIZE=world)
        os.environ.update({k: str(v) for k, v in env.items()}, MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
        if visible is not None:
            # Every rank sees the trial's GPUs (as Ray Train arranges): NCCL then talks over
            # them directly; each rank's device is its own GPU's place in this list.
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        try:
            backend = "nccl" if spec.gpus_per_worker > 0 else "gloo"
            address = f"tcp://{LOOPBACK}:{port}"
            dist.init_process_group(backend, init_method=address, rank=rank, world_size=world)
            session = GroupSession(
                trial_dir, trial_id, rank, world, spec.keep_checkpoints, self._reports.put,
                spec.metric, spec.mode, spec.also,
            )  # fmt: skip
            MODES[spec.trial_mode].function()(hp, spec, session)
        finally:
            self._reports.put(END)

    def next_reports(self, timeout: float) -> list[Optional[dict[str, Any]]]:
        """Rank 0's reports not yet taken, waiting up to `timeout` for the first."""
        out: list[Optional[dict[str, Any]]] = []
        try:
            out.append(self._reports.get(timeout=timeout))
            while True:
                out.append(self._reports.get_nowait())
        except queue.Empty:
            return out


def run_group(config: dict[str, Any], spec: TrialSpec) -> None:
    """The Tune function trainable of a DDP trial whose workers share one node (see the module)."""
    import ray
    from ray import tune
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ctx = tune.get_context()
    group = ray.util.get_current_placement_group()
    actor = ray.remote(Rank)
    ranks = [
        actor.options(
            num_cpus=spec.cpus_per_worker,
            num_gpus=spec.gpus_per_worker,
            max_concurrency=2,  # run, and the calls that fetch rank 0's reports
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
        ).remote()
        for i in range(spec.workers)
    ]
    try:
        visible = None
        if spec.gpus_per_worker > 0:
            ids = {g for each in ray.get([r.gpu_ids.remote() for r in ranks]) for g in each}
            visible = ",".join(sorted(ids, key=lambda g: (len(g), g)))
        port = ray.get(ranks[0].free_port.remote())
        trial_dir = trial_dir_for(ctx.get_trial_dir(), spec.sweep_dir)
        runs = {
            r.run.remote(config, spec, trial_dir, ctx.get_trial_id(), i, port, visible): i
            for i, r in enumerate(ranks)
        }
        _forward(ranks[0], runs, tune.report)
    finally:
        for r in ranks:
            ray.kill(r)


def _forward(rank0: Any, runs: dict[Any, int], report: Any) -> None:
    """Report rank 0's metrics as they come until every rank has returned; the first rank to
    fail (raise or die) fails the trial, after what rank 0 had already reported is passed on."""
    import ray

    pending = rank0.next_reports.remote(POLL_S)
    ended = False
    while not ended or runs:
        ready, _ = ray.wait(([] if ended else [pending]) + list(runs), num_returns=1)
        if ready[0] in runs:
            runs.pop(ready[0])
            try:
                ray.get(ready[0])
            except Exception:
                if not ended:
                    _report_left(pending, report)
                raise
            continue
        for item in ray.get(pending):
            if item is END:
                ended = True
            else:
                report(item)
        if not ended:
            pending = rank0.next_reports.remote(POLL_S)


def _report_left(pending: Any, report: Any) -> None:
    """Pass on reports rank 0 made before another rank failed (none if rank 0 is gone)."""
    import ray

    try:
        ready, _ = ray.wait([pending], timeout=1.0)
        items = ray.get(ready[0]) if ready else []
    except Exception:  # noqa: BLE001 - rank 0 died too: its reports went with it
        return
    for item in items:
        if item is not END:
            report(item)
