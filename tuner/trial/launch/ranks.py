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
- the group formed in time: the trial actor waits for every rank to have joined the process
  group (`await_joined`) for the group's timeout and `JOIN_GRACE_S` more, then fails the trial
  naming the ranks that did not (NCCL's initialisation blocks, before any watchdog, for as
  long as a peer does not answer: a filtered port, a wrong interface). Between nodes, gloo and
  NCCL talk over the interface that holds the node's Ray address, or the one the user set
  (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`); where neither is known the rank says so and
  fails, rather than take what the host name resolves to and wait;
- retries: a rank that raises or dies fails the trial at once, Tune retries it up to
  `failure.max_failures`; a rank that hangs in a collective fails it after
  `schedule.trial_timeout` (the process group's timeout; unset, no limit, as the setting says),
  not NCCL's 10 minutes;
- the failure's cause: the first rank to raise says so in the rendezvous store before it
  aborts its process group (never destroys it: that could wait for peers blocked in a
  collective); a rank whose collective then fails raises `PeerFailed`, and the trial fails with
  the first rank's own error, its traceback the trial's `traceback.txt`;
- resources returned: the rank actors are killed when the trial fails (or they do not stop
  when Tune stops it, below), and they are this actor's and live in the trial's placement
  group, so Ray ends them as well when Tune stops the actor or removes the group;
- stops: rank 0 waits at each report for this actor's word that Tune took it (`verdict`),
  and passes it to the other ranks (`GroupSession.report`): a trial Tune stops (the
  scheduler, a stop rule) ends at that report on every rank, as a 1-worker trial does in
  Tune's report, and writes no epoch past it.

Warm ranks: Tune reuses the trial actor for the sweep's next trial (with its placement
group), and a trial whose ranks all returned, having run out or been stopped, leaves them to
it (`_KEPT`): the next trial's ranks are the same processes, their imports done
(torch.distributed, and `torch._dynamo`, which DDP's constructor imports), and form a new
process group. Only the first trial of each actor pays the processes' start. A trial that
failed, or whose ranks did not end within STOP_GRACE_S of the stop, kills them: what they
hold is not known to be clean.

This saves Ray Train's controller actor, its worker-group set-up and its 2-second report
polling. Nothing here imports torch at module level: the trial actor never needs it.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Optional

from tuner.config.modes import MODES
from tuner.trial.frame.journal import log_line, report_again, traceback_name
from tuner.trial.frame.memory import is_oom
from tuner.trial.frame.spec import TrialSpec, trial_dir_for

LOOPBACK = "127.0.0.1"
END = None  # rank 0's last item: its loop has returned or raised
Report = tuple[dict[str, Any], Optional[str]]  # rank 0's metrics, and a checkpoint directory for Tune
POLL_S = 30.0  # how long one call for rank 0's reports waits for one
# How long a trial Tune stopped waits for its ranks, stopped at the report, to unwind (their
# `finally` blocks, the GPU memory handed back) before it kills them; a new trial then
# starts new ones (~7 s on 2 cores).
STOP_GRACE_S = 30.0
RANK0_TRACEBACK = "traceback_rank0.txt"  # rank 0's, when another rank's failure is the trial's
KEPT_NOTE = " (kept from the actor's last trial)"  # trial.log's ranks line, for ranks kept
# The rank actors a trial that ended cleanly left to the next trial of this (reused) actor:
# (what they were started for: placement group, workers, CPUs and GPUs each; the actors).
_KEPT: dict[str, tuple[tuple[Any, ...], list[Any]]] = {}


class PeerFailed(RuntimeError):
    """This rank's error came from another rank's failure (rank `first` raised first)."""

    def __init__(self, first: int, rank: int):
        super().__init__(first, rank)  # (the arguments, so that it pickles back as it was)
        self.first = first

    def __str__(self) -> str:
        return f"rank {self.args[0]} failed first; rank {self.args[1]} stopped with it"


FIRST_FAILURE = "tuner/first_failure"  # the rendezvous store's key: the rank that raised first


class Rank:
    """One worker of a trial (a Ray actor in the trial's placement group)."""

    def __init__(self) -> None:
        import torch.distributed  # noqa: F401 - the import, at start-up, while the others start too

        self._reports: queue.Queue[Optional[Report]] = queue.Queue()
        self._store: Any = None
        self._joined: Optional[str] = None  # the run whose process group this rank has joined
        self._join = threading.Condition()
        self._verdicts: queue.Queue[tuple[str, bool]] = queue.Queue()  # rank 0: (trial, go on)

    def where(self) -> tuple[str, str, list[str], Optional[str], int]:
        """(node id, node address, GPU ids, the network interface of that address, process id)
        of this rank."""
        import ray

        ip = ray.util.get_node_ip_address()
        return (
            ray.get_runtime_context().get_node_id(),
            ip,
            [str(g) for g in ray.get_gpu_ids()],
            _interface_of(ip),
            os.getpid(),
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
        `job`: trial_dir, trial_id, run_id (this start of the trial), rank, local_rank,
        local_world, host, port, visible, timeout_s (collectives), join_s (the rendezvous), ifname
        (the network interface between
        nodes, or None on one node or where none was found), checkpoint (rank 0, URI storage:
        Tune's checkpoint to resume from)."""
        import torch.distributed as dist

        from tuner.trial.frame.session import GroupSession, ray_actor_device

        rank, world = job["rank"], spec.workers
        env = dict(
            RANK=rank, LOCAL_RANK=job["local_rank"], WORLD_SIZE=world, LOCAL_WORLD_SIZE=job["local_world"]
        )
        os.environ.update(
            {k: str(v) for k, v in env.items()}, MASTER_ADDR=job["host"], MASTER_PORT=str(job["port"])
        )
        os.environ.update(socket_env(job["ifname"], job["host"], os.environ, self._address()))
        if job["visible"] is not None:
            # Every rank sees its node's GPUs of the trial (as Ray Train arranges): NCCL then
            # talks over them directly; each rank's device is its own GPU's place in this list.
            os.environ["CUDA_VISIBLE_DEVICES"] = job["visible"]
        timeout = timedelta(seconds=job["timeout_s"])
        backend = "nccl" if spec.gpus_per_worker > 0 else "gloo"
        store, failed = None, False
        try:
            store = self._store or dist.TCPStore(
                job["host"],
                job["port"],
                world,
                is_master=False,
                timeout=timedelta(seconds=job.get("join_s", job["timeout_s"])),
            )
            # NCCL: the communicator bound to this rank's GPU now (not guessed at its first
            # collective), which also makes it the current device.
            device = ray_actor_device(True) if backend == "nccl" else None
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world, timeout=timeout,
                device_id=device if device is not None and device.type == "cuda" else None,
            )  # fmt: skip
            # Checkpoints go from rank 0 to the others as objects: over gloo, not NCCL's GPUs.
            objects = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
            with self._join:
                self._joined = job["run_id"]
                self._join.notify_all()

            def send(metrics: dict[str, Any], path: Optional[str]) -> bool:
                self._reports.put((metrics, path))
                return self._verdict_on(job["trial_id"])

            session = GroupSession(
                job["trial_dir"], job["trial_id"], rank, world, spec.keep_checkpoints, send,
                spec.metric, spec.direction, spec.also, local_rank=job["local_rank"],
                own_dir=spec.sweep_dir is not None, tune_checkpoint=job.get("checkpoint"), objects=objects,
            )  # fmt: skip
            session.show(hp, spec.perturbed)
            try:
                MODES[spec.trial_mode].function()(hp, spec, session)
            except SystemExit:
                if not session.stopped:
                    raise  # the user's code exited: Ray ends this process, the trial fails
        except Exception as err:
            failed = True
            first = _claim_failure(store, rank)
            if first != rank:
                raise PeerFailed(first, rank) from err
            raise
        finally:
            self._reports.put(END)
            if dist.is_initialized():
                if failed:
                    # Peers may wait in a collective this rank will not enter: destroying the
                    # group could wait with them (NCCL), up to its timeout. Aborted, the trial
                    # actor hears of the failure now and ends every rank.
                    abort_group()
                else:
                    dist.destroy_process_group()
            self._store = None

    def joined(self, run_id: str, timeout_s: float) -> bool:
        """Whether this rank joined the process group of run `run_id`, waiting up to `timeout_s`."""
        with self._join:
            return self._join.wait_for(lambda: self._joined == run_id, timeout_s)

    @staticmethod
    def _address() -> str:
        import ray

        return ray.util.get_node_ip_address()

    def verdict(self, trial_id: str, go: bool) -> None:
        """Rank 0: Tune took the report of `trial_id` it waits on, and goes on or stops it."""
        self._verdicts.put((trial_id, go))

    def _verdict_on(self, trial_id: str) -> bool:
        """Wait for this trial's verdict (one for another trial, a stopped one's that came
        late, is dropped). No time limit: the trial actor owns this one and ends it."""
        while True:
            trial, go = self._verdicts.get()
            if trial == trial_id:
                return go

    def next_reports(self, timeout: float) -> list[Optional[Report]]:
        """Rank 0's reports not yet taken, waiting up to `timeout` for the first."""
        out: list[Optional[Report]] = []
        try:
            out.append(self._reports.get(timeout=timeout))
            while True:
                out.append(self._reports.get_nowait())
        except queue.Empty:
            return out


# How long the ranks wait for each other to join the rendezvous when the sweep sets no
# schedule.trial_timeout.
RENDEZVOUS_S = 600.0
# A process group's collectives wait schedule.trial_timeout for a rank that does not come;
# unset, "no limit" (torch's own defaults would end them at 10 or 30 minutes, which the sweep
# did not ask for). A rank that raises or dies ends the trial at once either way.
NO_LIMIT_S = 365 * 24 * 3600.0


def collective_timeout_s(spec: TrialSpec) -> float:
    """How long a rank waits for the others in one collective (see NO_LIMIT_S)."""
    return spec.trial_timeout or NO_LIMIT_S


def waits(spec: TrialSpec) -> str:
    """trial.log's word on it."""
    if spec.trial_timeout:
        return f"collectives wait {spec.trial_timeout:g} s for a rank (schedule.trial_timeout)"
    return "collectives wait for a rank without limit (no schedule.trial_timeout)"


def run_group(config: dict[str, Any], spec: TrialSpec) -> None:
    """The Tune function trainable of a DDP trial (see the module)."""
    import ray
    from ray import tune
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ctx = tune.get_context()
    group = ray.util.get_current_placement_group()
    shape = (group.id.hex() if group else None, spec.workers, spec.cpus_per_worker, spec.gpus_per_worker)
    ranks, where = _warm_ranks(shape)
    kept = bool(ranks)
    if not kept:
        actor = ray.remote(Rank)
        ranks = [
            actor.options(
                num_cpus=spec.cpus_per_worker,
                num_gpus=spec.gpus_per_worker,
                max_concurrency=3,  # run, the calls that fetch rank 0's reports, and verdict
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
            ).remote()
            for i in range(spec.workers)
        ]
    clean, forward, trial_dir = False, None, None
    try:
        where = where or ray.get([r.where.remote() for r in ranks])
        one_node = len({w[0] for w in where}) == 1
        host = LOOPBACK if one_node else where[0][1]
        join_s = spec.trial_timeout or RENDEZVOUS_S
        port = ray.get(ranks[0].open_store.remote(host, spec.workers, join_s))
        trial_dir = trial_dir_for(ctx.get_trial_dir(), spec.sweep_dir)
        pids = ", ".join(str(w[4]) for w in where)
        log_line(trial_dir, f"ranks: processes {pids}; {waits(spec)}" + KEPT_NOTE * kept)
        checkpoint = None
        if spec.sweep_dir is None:  # URI storage: Tune's checkpoint (a retry), else the bucket's
            from tuner.trial.frame.stored import continue_from_storage

            checkpoint = tune.get_checkpoint() or continue_from_storage(spec.storage, trial_dir)
        runs, run_id = {}, uuid.uuid4().hex
        for i, (r, place) in enumerate(zip(ranks, placement(where, spec.gpus_per_worker > 0), strict=True)):
            job = dict(
                trial_dir=trial_dir, trial_id=ctx.get_trial_id(), run_id=run_id, rank=i, host=host,
                port=port, timeout_s=collective_timeout_s(spec), join_s=join_s,
                checkpoint=checkpoint if i == 0 else None, **place,
            )  # fmt: skip
            runs[r.run.remote(config, spec, job)] = i
        backend = "nccl" if spec.gpus_per_worker > 0 else "gloo"
        await_joined(ranks, runs, run_id, join_s + JOIN_GRACE_S, backend)
        forward = _Forward(ranks[0], runs, ctx.get_trial_id())
        try:
            forward.run(_reporter(tune))
            clean = True  # every rank returned
            if not forward.forwarded:  # (restored at its last epoch: see journal.report_again)
                report_again(trial_dir, tune.report)
        except SystemExit:  # Tune stopped the trial (from tune.report)
            clean = forward.stop()
            raise
        except Exception as err:
            if is_oom(err):  # a rank ran out of memory where nothing backed off (a user's loop)
                _oom_result(trial_dir, spec, err)
            raise
    finally:
        if clean:
            _KEPT["ranks"] = (shape, ranks)
        else:  # failed, or stopped and not ended in time: a rank may still train or wait
            for r in ranks:
                ray.kill(r)
            if forward is not None and forward.failed:
                _their_traceback(trial_dir, forward.failed)


def _claim_failure(store: Any, rank: int) -> int:
    """Record this rank as the trial's first failure unless one is recorded; the first's rank."""
    if store is None:
        return rank
    try:
        return int(store.compare_set(FIRST_FAILURE, "", str(rank)))
    except Exception:  # noqa: BLE001 - the store went with rank 0: this error is its own
        return rank


def abort_group() -> None:
    """End this process's process groups without waiting for peers. Through torch's private
    `_abort_process_group` (torch 2.4+: every group, and torch's record of them), else each
    group's own `abort`; a torch with neither leaves them to the process's end (the trial actor
    kills failed ranks)."""
    import torch.distributed as dist

    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    try:
        if abort is not None:
            abort()
        elif hasattr(dist.group.WORLD, "abort"):
            dist.group.WORLD.abort()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - the trial has failed already: its own error is the news
        pass


def _warm_ranks(shape: tuple[Any, ...]) -> tuple[list[Any], Optional[list[Any]]]:
    """The ranks the last trial of this actor left, with their `where`, if they were started
    for the same placement group and sizes and are still alive; else none (and any others
    killed)."""
    import ray

    shape_then, ranks = _KEPT.pop("ranks", (None, []))
    if ranks and shape_then == shape:
        try:
            return ranks, ray.get([r.where.remote() for r in ranks], timeout=60)
        except Exception:  # noqa: BLE001 - one died (its node, Ray): start them again
            pass
    for r in ranks:
        ray.kill(r)
    return [], None


# How long past the group's own timeout the trial actor waits for its ranks to join it.
JOIN_GRACE_S = 30.0


class GroupNotFormed(RuntimeError):
    """Ranks of a trial did not join its process group in time."""


def await_joined(
    ranks: list[Any], runs: dict[Any, int], run_id: str, deadline_s: float, backend: str
) -> None:
    """Return once every rank has joined the process group of `run_id`, or as soon as a rank's
    run ends (it failed, or returned: `_Forward` takes it from there); raise GroupNotFormed,
    naming the ranks that did not join, after `deadline_s`."""
    import ray

    pending = {r.joined.remote(run_id, deadline_s): i for i, r in enumerate(ranks)}
    late = []
    while pending:
        ready, _ = ray.wait([*pending, *runs], num_returns=1)
        if ready[0] in runs:
            return
        i = pending.pop(ready[0])
        if not ray.get(ready[0]):
            late.append(i)
    if late:
        raise GroupNotFormed(
            f"ranks {', '.join(map(str, sorted(late)))} did not join the trial's {backend} process group "
            f"within {deadline_s:g} s: a peer that does not answer (a port filtered between the nodes, "
            "a wrong network interface: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)"
        )


def placement(where: list[tuple[Any, ...]], use_gpus: bool) -> list[dict[str, Any]]:
    """Each rank's place, from the ranks' `where` (node id, address, GPU ids, interface, pid):
    its local rank and the ranks on its node, the GPUs the node's ranks see (every rank sees
    them all, as Ray Train arranges: NCCL then talks over them directly), and the interface
    between nodes (None on one node). A GPU rank's local rank is its GPU's index in that list,
    its CUDA index: what `torch.cuda.set_device(LOCAL_RANK)` takes (ranks sharing a GPU, or
    without one, are numbered in rank order)."""
    nodes = [w[0] for w in where]
    several = len(set(nodes)) > 1
    out = []
    for i, w in enumerate(where):
        mine = [j for j, n in enumerate(nodes) if n == w[0]]
        gpus = sorted({g for j in mine for g in where[j][2]}, key=lambda g: (len(g), g))
        if use_gpus:
            mine.sort(key=lambda j: (min((gpus.index(g) for g in where[j][2]), default=len(gpus)), j))
        out.append(
            dict(
                local_rank=mine.index(i),
                local_world=len(mine),
                visible=",".join(gpus) if use_gpus else None,
                ifname=w[3] if several else None,
            )
        )
    return out


SOCKET_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def socket_env(ifname: Optional[str], host: str, env: Mapping[str, str], address: str) -> dict[str, str]:
    """The interface gloo and NCCL use, for a rank of a trial whose rank 0 is at `host`: none
    to set on one node (loopback); between nodes, the one the user set, else `ifname`, the one
    that holds this node's Ray `address`. With neither, an error: gloo and NCCL would take what
    the host name resolves to (127.0.1.1 in Debian's /etc/hosts) and wait for peers that
    cannot reach it, until the group's timeout or, NCCL's initialisation, for good."""
    if host == LOOPBACK:
        return {}
    out = {name: env.get(name) or ifname for name in SOCKET_VARIABLES}
    if all(out.values()):
        return out  # type: ignore[return-value]
    import psutil

    names = ", ".join(sorted(psutil.net_if_addrs())) or "none"
    raise RuntimeError(
        f"this node's Ray address {address} is on none of this node's network interfaces ({names}), "
        f"so the ranks' traffic has no known way out: set {' and '.join(SOCKET_VARIABLES)} on every node"
    )


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


class _Forward:
    """Rank 0's reports to Tune as they come, each answered with Tune's verdict, until every
    rank has returned (`run`); the first rank to fail (raise or die) fails the trial, after
    what rank 0 had already reported is passed on."""

    def __init__(self, rank0: Any, runs: dict[Any, int], trial_id: str) -> None:
        self.rank0, self.runs, self.trial_id = rank0, runs, trial_id
        self.pending = rank0.next_reports.remote(POLL_S)  # the one call for reports out
        self.ended = False  # rank 0 has put END
        self.failed: Optional[int] = None  # the rank whose error is the trial's
        self.forwarded = 0  # reports passed on to Tune

    def run(self, report: Any) -> None:
        while not self.ended or self.runs:
            self._step(report)

    def stop(self) -> bool:
        """Tune stopped the trial at the report rank 0 waits on: tell it, and wait for every
        rank to return. Whether all did within STOP_GRACE_S, with no call for reports left
        out (it would take the next trial's): then they can run another trial."""
        import time

        self.rank0.verdict.remote(self.trial_id, False)
        deadline = time.monotonic() + STOP_GRACE_S
        try:
            while not self.ended or self.runs:
                # (no report should come: rank 0 stopped at its report)
                if not self._step(None, max(0.0, deadline - time.monotonic())):
                    return False
        except Exception:  # noqa: BLE001 - a rank failed: the trial is over, its ranks not kept
            return False
        return True

    def _step(self, report: Optional[Any], timeout: Optional[float] = None) -> bool:
        """Take what comes first: a rank returning (its error raised, after what rank 0 had
        reported is passed on) or rank 0's reports (`_take`). False if nothing came within
        `timeout`."""
        import ray

        waiting = ([] if self.ended else [self.pending]) + list(self.runs)
        ready, _ = ray.wait(waiting, num_returns=1, timeout=timeout)
        if not ready:
            return False
        if ready[0] not in self.runs:
            self._take(report)
            return True
        rank = self.runs.pop(ready[0])
        try:
            ray.get(ready[0])
        except Exception as err:
            self.failed = rank
            first = getattr(getattr(err, "cause", err), "first", None)  # PeerFailed: its cause
            cause = next((ref for ref, i in self.runs.items() if i == first), None)
            if not self.ended and report is not None:
                _report_left(self.pending, report)
            if cause is not None:  # the first failure: its rank raises it promptly (aborted)
                self.failed = self.runs.pop(cause)
                ray.get(cause)
            raise
        return True

    def _take(self, report: Optional[Any]) -> None:
        """The reports the call out returned, each to Tune and its verdict back to rank 0
        (`report` None: the trial is stopped, they go nowhere); a new call unless END was
        among them."""
        import ray

        for item in ray.get(self.pending):
            if item is END:
                self.ended = True
            elif report is not None:
                report(item)  # SystemExit: Tune stopped the trial (see `stop`)
                self.forwarded += 1
                self.rank0.verdict.remote(self.trial_id, True)
        if not self.ended:
            self.pending = self.rank0.next_reports.remote(POLL_S)


def _oom_result(trial_dir: Optional[str], spec: TrialSpec, err: BaseException) -> None:
    """Record the trial's end as `oom` in rank 0's journal, as a 1-worker trial records it:
    running out of memory is a result, never the trial's error (the driver reads the journal's
    last row over Tune's status). Its detail: the failing rank's own message."""
    from tuner.sweepdir import read_metrics
    from tuner.trial.frame.harness import failed
    from tuner.trial.frame.journal import MetricsLog
    from tuner.trial.frame.memory import first_line

    if not trial_dir or not os.path.isdir(trial_dir):
        return
    rows = read_metrics(trial_dir)
    last = rows[-1] if rows else None
    cause = getattr(err, "cause", err)
    epoch = int(last["epoch"]) if last else 0
    MetricsLog(trial_dir).append(failed(last, spec, "oom", first_line(cause), epoch))


def _their_traceback(trial_dir: Optional[str], rank: int) -> None:
    """The failing rank's traceback is the trial's (traceback.txt, which the summary and the
    report read), where that rank wrote it on this node; rank 0's, written when the failure
    reached it, is kept as its own."""
    if not trial_dir or rank == 0:
        return
    theirs = os.path.join(trial_dir, traceback_name(rank))
    if not os.path.isfile(theirs):
        return  # on another node: Tune's error.txt holds it
    ours = os.path.join(trial_dir, traceback_name(0))
    if os.path.isfile(ours):
        os.replace(ours, os.path.join(trial_dir, RANK0_TRACEBACK))
    shutil.copyfile(theirs, ours)


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
