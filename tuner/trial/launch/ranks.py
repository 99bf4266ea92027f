"""A DDP trial's workers, on one node or several, without Ray Train: the trial actor runs them.

Tune reserves the trial's placement group (`resources.tune_request`: one bundle per worker,
packed onto one node when one holds them all, else spread over as few as can; the trial actor
sits in the first bundle, with rank 0). The trial actor (`run_group`) starts one `Rank` actor
in each bundle; rank 0 opens the rendezvous store on its node's address at a port the store
picks itself, the others join it, and they form a gloo (CPU) or NCCL (GPU) process group; each
runs the same loop as a 1-worker trial. What we relied on Ray Train for, kept:

- metrics over all ranks: the loop reduces them; rank 0's session hands each epoch's to this
  actor, which reports it to Tune;
- checkpoints: rank 0 writes them into the trial's directory (local or shared output, as a
  1-worker trial does), or, with URI storage, into a directory this actor hands to Tune with
  the report (rank 0 shares its node); every rank resumes from rank 0's newest, which rank 0
  reads and sends to the others (they may be on nodes that cannot read it);
- retries: a rank that raises or dies fails the trial, Tune retries it up to
  `failure.max_failures`; a rank that hangs in a collective fails it after
  `schedule.trial_timeout` (the process group's timeout), not NCCL's 10 minutes;
- resources returned: the rank actors are killed when the trial ends however it ends, and
  they are this actor's and live in the trial's placement group, so Ray ends them as well
  when Tune stops the trial or removes the group.

This saves Ray Train's controller actor, its worker-group set-up and its 2-second report
polling. Nothing here imports torch at module level: the trial actor never needs it.
"""

from __future__ import annotations

import os
import queue
import shutil
from datetime import timedelta
from typing import Any, Optional

from tuner.trial.frame.spec import TrialSpec, trial_dir_for

LOOPBACK = "127.0.0.1"
END = None  # rank 0's last item: its loop has returned or raised
Report = tuple[dict[str, Any], Optional[str]]  # rank 0's metrics, and a checkpoint directory for Tune
POLL_S = 30.0  # how long one call for rank 0's reports waits for one


class Rank:
    """One worker of a trial (a Ray actor in the trial's placement group)."""

    def __init__(self) -> None:
        import torch.distributed  # noqa: F401 - the import, at start-up, while the others start too

        self._reports: queue.Queue[Optional[Report]] = queue.Queue()
        self._store: Any = None

    def where(self) -> tuple[str, str, list[str], Optional[str]]:
        """(node id, node address, GPU ids, the network interface of that address) of this rank."""
        import ray

        ip = ray.util.get_node_ip_address()
        return (
            ray.get_runtime_context().get_node_id(),
            ip,
            [str(g) for g in ray.get_gpu_ids()],
            _interface_of(ip),
        )

    def open_store(self, host: str, world: int, timeout_s: float) -> int:
        """Rank 0: the rendezvous store, listening at a port it picks itself (never one picked,
        released and bound again, which another process may take in between); returns it."""
        import torch.distributed as dist

        self._store = dist.TCPStore(
            host, 0, world, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return int(self._store.port)

    def run(self, hp: dict[str, Any], spec: TrialSpec, job: dict[str, Any]) -> None:
        """Join the process group and train; returns when the loop does, raises what it raises.
        `job`: trial_dir, trial_id, rank, local_rank, local_world, host, port, visible,
        timeout_s, ifname (the network interface between nodes, or None on one node),
        checkpoint (rank 0, URI storage: Tune's checkpoint to resume from)."""
        import torch.distributed as dist

        from tuner.trial.frame.session import GroupSession
        from tuner.trial.launch.loops import loop_for

        rank, world = job["rank"], spec.workers
        env = dict(
            RANK=rank, LOCAL_RANK=job["local_rank"], WORLD_SIZE=world, LOCAL_WORLD_SIZE=job["local_world"]
        )
        os.environ.update(
            {k: str(v) for k, v in env.items()}, MASTER_ADDR=job["host"], MASTER_PORT=str(job["port"])
        )
        if job["ifname"]:  # gloo and NCCL would otherwise take what the host name resolves to
            os.environ.setdefault("GLOO_SOCKET_IFNAME", job["ifname"])
            os.environ.setdefault("NCCL_SOCKET_IFNAME", job["ifname"])
        if job["visible"] is not None:
            # Every rank sees its node's GPUs of the trial (as Ray Train arranges): NCCL then
            # talks over them directly; each rank's device is its own GPU's place in this list.
            os.environ["CUDA_VISIBLE_DEVICES"] = job["visible"]
        timeout = timedelta(seconds=job["timeout_s"])
        backend = "nccl" if spec.gpus_per_worker > 0 else "gloo"
        try:
            store = self._store or dist.TCPStore(
                job["host"], job["port"], world, is_master=False, timeout=timeout
            )
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
            # Checkpoints go from rank 0 to the others as objects: over gloo, not NCCL's GPUs.
            objects = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
            send = lambda *item: self._reports.put(item)  # noqa: E731 - (metrics, checkpoint dir)
            session = GroupSession(
                job["trial_dir"], job["trial_id"], rank, world, spec.keep_checkpoints, send,
                spec.metric, spec.mode, spec.also, local_rank=job["local_rank"],
                own_dir=spec.sweep_dir is not None, tune_checkpoint=job.get("checkpoint"), objects=objects,
            )  # fmt: skip
            loop_for(spec)(hp, spec, session)
        finally:
            self._reports.put(END)
            if dist.is_initialized():
                dist.destroy_process_group()
            self._store = None

    def next_reports(self, timeout: float) -> list[Optional[Report]]:
        """Rank 0's reports not yet taken, waiting up to `timeout` for the first."""
        out: list[Optional[Report]] = []
        try:
            out.append(self._reports.get(timeout=timeout))
            while True:
                out.append(self._reports.get_nowait())
        except queue.Empty:
            return out


# A process group's collectives wait this long for a rank that does not come (torch's
# default for gloo is 30 minutes, NCCL's 10) when the sweep sets no schedule.trial_timeout.
DEFAULT_TIMEOUT_S = 600.0


def run_group(config: dict[str, Any], spec: TrialSpec) -> None:
    """The Tune function trainable of a DDP trial (see the module)."""
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
        where = ray.get([r.where.remote() for r in ranks])
        nodes = [w[0] for w in where]
        one_node = len(set(nodes)) == 1
        host = LOOPBACK if one_node else where[0][1]
        timeout_s = spec.trial_timeout or DEFAULT_TIMEOUT_S
        port = ray.get(ranks[0].open_store.remote(host, spec.workers, timeout_s))
        trial_dir = trial_dir_for(ctx.get_trial_dir(), spec.sweep_dir)
        checkpoint = None
        if spec.sweep_dir is None:  # URI storage: Tune's checkpoint (a retry), else the bucket's
            from tuner.trial.frame.stored import continue_from_storage

            checkpoint = tune.get_checkpoint() or continue_from_storage(spec.storage, trial_dir)
        runs = {}
        for i, r in enumerate(ranks):
            mine = [j for j, n in enumerate(nodes) if n == nodes[i]]
            gpus = sorted({g for j in mine for g in where[j][2]}, key=lambda g: (len(g), g))
            job = dict(
                trial_dir=trial_dir, trial_id=ctx.get_trial_id(), rank=i, local_rank=mine.index(i),
                local_world=len(mine), host=host, port=port, timeout_s=timeout_s,
                visible=",".join(gpus) if spec.gpus_per_worker > 0 else None,
                ifname=None if one_node else where[i][3],
                checkpoint=checkpoint if i == 0 else None,
            )  # fmt: skip
            runs[r.run.remote(config, spec, job)] = i
        _forward(ranks[0], runs, _reporter(tune))
    finally:
        for r in ranks:
            ray.kill(r)


def _interface_of(ip: str) -> Optional[str]:
    """The name of this node's network interface that holds `ip` (Ray's node address)."""
    import socket

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


def _reporter(tune: Any) -> Any:
    """tune.report for rank 0's reports: a checkpoint directory with one (URI storage; rank 0
    wrote it on this node) goes to Tune with the metrics, then is removed."""

    def report(item: Report) -> None:
        metrics, path = item
        if path is None:
            tune.report(metrics)
            return
        try:
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(path))
        finally:
            shutil.rmtree(path, ignore_errors=True)

    return report


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
