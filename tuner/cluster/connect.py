"""Connect this driver to Ray: join a cluster (checked first) or start a private local Ray.

`Runtime` says where and how a sweep runs (not part of the sweep file); the CLI builds it
once from its flags. Ray is imported only inside these functions.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Optional

from tuner import timeline
from tuner.cluster import _ray_internals, join, tls, worker_fork
from tuner.cluster.join import LOOPBACK

# Missed health checks (3 s apart, Ray 2.60 default 5) before the GCS gives a local node up.
LOCAL_HEALTH_CHECK_FAILURES = 20
_joined: list[bool] = []  # [whether the workers' output is shown] once this process joined a cluster


@dataclass(frozen=True)
class Runtime:
    """Where and how a sweep runs: the --address, --num-cpus, --verbose and
    --allow-insecure-cluster flags, built once by the CLI."""

    address: Optional[str] = None  # a cluster to join (auto, host:port, ray://host:port)
    num_cpus: Optional[int] = None  # CPUs of the local Ray tuner starts (ignored when joining)
    verbose: bool = False  # Ray's own logs and worker output instead of our progress line
    allow_insecure_cluster: bool = False  # join an open cluster other machines can reach

    def joins_cluster(self) -> bool:
        """True when the sweep joins a cluster (--address, or the job's); False: a local Ray."""
        return join.target(self.address) is not None


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    """The flags a Runtime is built from (where and how a sweep runs)."""
    p.add_argument("--address", help="join this Ray cluster (auto, ray://host:10001, host:6379)")
    p.add_argument("--num-cpus", type=int, metavar="N", help="CPUs of the local Ray it starts")
    p.add_argument(
        "--allow-insecure-cluster",
        action="store_true",
        help="join a cluster without authentication that other machines can reach (unsafe)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="Ray's own logs and worker output")


def runtime_from(args: argparse.Namespace) -> Runtime:
    """The one Runtime of a command, from its flags."""
    return Runtime(
        address=args.address,
        num_cpus=args.num_cpus,
        verbose=args.verbose,
        allow_insecure_cluster=args.allow_insecure_cluster,
    )


def connect(runtime: Runtime, trials_import_torch: bool = True) -> str:
    """Join the cluster at `runtime.address` (or the job's cluster), else start a private
    local Ray; returns "existing", "job", "local" or the address joined.

    A cluster is checked first (join.check): reachable, our token accepted, and not open to
    other machines without authentication unless `allow_insecure_cluster`. Without an
    address we always start our own (`address="local"`): never a leftover cluster whose
    address a killed `ray start` left behind in Ray's temp directory, or RAY_ADDRESS.
    """
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return "existing"
    common: dict[str, Any] = dict(
        logging_level=logging.INFO if runtime.verbose else logging.ERROR,
        log_to_driver=runtime.verbose,
    )
    joining = join.target(runtime.address)
    if joining is not None:
        _local_cluster_tls(joining)  # before Ray's import: it reads RAY_USE_TLS
        import ray

        join.check(joining, runtime.allow_insecure_cluster)
        if runtime.num_cpus:
            join.warn("--num-cpus sizes only a local Ray that tuner starts: ignored")
        _joined[:] = [runtime.verbose]
        if runtime.address:
            ray.init(address=str(joining), **common)
            return str(joining)
        ray.init(**common)  # the job's cluster, from RAY_ADDRESS
        return "job"
    local = join.prepare_local()  # token 0600, every socket on loopback (set before Ray's import)
    # Its one node declared dead ends the sweep: the GCS waits ~1 min for a raylet starved of
    # CPU (a loaded laptop, several Rays on 2 cores) instead of ~15 s.
    local |= _ray_internals.local_init_options(health_check_failures=LOCAL_HEALTH_CHECK_FAILURES)
    if _ray_internals.checked():
        # (its imports beside Ray's and ray.init)
        worker_fork.start(os.environ[join.RAY_TMPDIR], torch=trials_import_torch)
    import ray

    # No dashboard (nothing of ours needs its State API since DDP trials run without Ray
    # Train), and the API server process Ray starts anyway comes after the rest, not first:
    # seconds sooner.
    # Nor a log monitor unless the workers' output is to be shown (--verbose): ~1 s sooner.
    # Nor an autoscaler monitor: one node that never grows has nothing to scale.
    quiet = contextlib.nullcontext() if runtime.verbose else _ray_internals.no_log_monitor()
    # Its Python workers copied from a warm process that imports what a trial imports once,
    # beside this start (tuner.cluster.worker_fork): a trial actor starts in milliseconds.
    with (
        _ray_internals.api_server_after_init(),
        quiet,
        _ray_internals.no_autoscaler_monitor(),
        _ray_internals.worker_command(worker_fork.LAUNCHER) as copied,
    ):
        if not copied:
            worker_fork.stop()
        ray.init(
            address="local",
            num_cpus=runtime.num_cpus,
            include_dashboard=False,
            dashboard_host=LOOPBACK,
            **local,
            **common,
        )
    where = _ray_internals.node_ip()
    if not join.is_loopback(where):
        ray.shutdown()
        raise RuntimeError(
            f"the local Ray came up at {where}, not on loopback: Ray {_ray_internals.ray_version()} "
            f"was imported before tuner could set {join.LOOPBACK_ENV}=0; import Ray after tuner starts it"
        )
    return "local"


def _local_cluster_tls(t: join.Target) -> None:
    """Joining the cluster `python -m tuner cluster start --tls` started (its address) needs
    no exports first: its TLS files go into this process's environment, where Ray reads them."""
    if tls.enabled():
        return
    from tuner.cluster.local import tls_for

    files = tls_for(str(t))
    if files is not None:
        os.environ.update(files.env())


def leave(code: int) -> None:
    """End a `python -m tuner` process that started its own Ray, at once: results are
    printed and written by now, and Ray's graceful shutdown (each of its processes asked to
    stop in turn, then waited for) would keep the user waiting 1.5-2.5 s for nothing.

    Its processes (and what they started: agents, trial workers) are killed, then this
    process exits with `code` without running Ray's exit handler. A process that joined a
    cluster leaves it now (`ray.shutdown`: Ray's exit handler would first sleep half a second
    for the workers' output to reach the console, which tuner shows only with --verbose), runs
    the exit handlers and exits without the interpreter's teardown of Ray's native threads
    (~0.5 s). With --verbose, and in a process that started no Ray, it returns.
    """
    if "ray" not in sys.modules:  # (a command that never started Ray pays no import for it)
        return
    pids = _ray_internals.node_process_ids()  # [] unless this process started the Ray
    if not pids:
        import ray

        if _joined == [False] and ray.is_initialized():
            timeline.mark("leave")
            ray.shutdown()
            _flush()
            atexit._run_exitfuncs()
            os._exit(code)
        return
    timeline.mark("leave")
    import psutil

    _flush()
    nodes, descendants = [], []
    for pid in pids:
        try:
            nodes.append(psutil.Process(pid))
            descendants += nodes[-1].children(recursive=True)
        except psutil.Error:  # already gone
            continue
    for proc in nodes + descendants:  # the raylet first: it starts no worker after this
        try:
            proc.kill()
        except psutil.Error:
            continue
    worker_fork.stop()  # (the workers copied from it end with their launchers, killed above)
    _drop_ended_sessions()
    os._exit(code)  # (init reaps them)


KEEP_RAY_SESSIONS = 5  # Ray's logs of the last local Rays (docs/explanation/ray.md, "Ray's leftovers")


def _drop_ended_sessions() -> None:
    """The session directories earlier sweeps' local Rays left in tuner's private temporary
    directory, but the newest KEEP_RAY_SESSIONS: Ray removes none (~0.5 MB a sweep)."""
    where = os.environ.get(join.RAY_TMPDIR, "")
    if not join.is_private_temp_dir(where):  # (never a Ray directory shared with others)
        return
    for path in _ray_internals.ended_sessions(where, KEEP_RAY_SESSIONS):
        shutil.rmtree(path, ignore_errors=True)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing to keep
            pass
    logging.shutdown()


def quiet_ray(verbose: bool) -> None:
    """Ray's console output and loggers as tuner wants them (all of it with `verbose`)."""
    if not verbose:
        # Tune's new console output prints a configuration box at any verbosity; the legacy
        # reporter at verbose=0 prints nothing, and our Progress callback reports instead.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    # Our callbacks write the CSV/JSON results and TensorBoard files; Ray's TensorBoardX
    # logger would add a second set of event files to every trial.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.WARNING if verbose else logging.ERROR)
    # Tune's driver warnings and errors point at its own ways back (`Tuner.restore`), where
    # tuner's is `tuner resume`, or repeat what tuner reports itself.
    tune_driver = logging.getLogger("ray.tune.tune")
    if not any(isinstance(f, _NotForUsers) for f in tune_driver.filters):
        tune_driver.addFilter(_NotForUsers())


class _NotForUsers(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


def keep_credentials_home() -> None:
    """Before Tune starts trials: none of them is handed the driver's AWS credentials through
    Ray (whose logs would keep them); they find their own (_ray_internals.credentials_stay_home).
    On a Ray where that cannot be done, say so when there are credentials to hand."""
    if _ray_internals.credentials_stay_home():
        return
    present = [name for name in _ray_internals.CREDENTIAL_ENV if os.environ.get(name)]
    if present:
        join.warn(
            f"Ray {_ray_internals.ray_version()} copies {', '.join(present)} from this environment into "
            "every trial actor's runtime env, which its runtime env agent logs; tuner keeps them "
            f"out only on Ray {_ray_internals.RAY_CHECKED}"
        )


def warn_unshared(storage: str) -> None:
    """Warn when a local `storage` path would leave results on other machines."""
    import ray

    warning = join.storage_warning(storage, ray.nodes())
    if warning:
        join.warn(warning)
