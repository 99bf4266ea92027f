"""A Ray node whose Python workers are copies of a warm process: the nodes of a cluster tuner
starts on this machine (their free loopback ports, `ray start` arguments and environment:
every socket on 127.0.0.1, token authentication on), and `tuner cluster node`, the same for a
node of any cluster (Slurm's recipe, machines of your own).

The node's `ray start` runs in this process beside a warm process (tuner.cluster.worker_fork),
as a private local Ray's start does, so that a sweep on the cluster starts its trial actors in
milliseconds rather than each importing torch, Ray Tune and tuner (~3 CPU-s each).

    python -m tuner.cluster.nodes RAY_START_ARGS...   (cluster/local.py spawns each node so)
    python -m tuner cluster node -- RAY_START_ARGS... (a node of any cluster)
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import random
import socket
import sys
import tempfile
from typing import Any, Optional

from tuner.cluster import _ray_internals
from tuner.cluster.join import LOOPBACK

FORK_DIR_ENV = "TUNER_NODE_FORK_DIR"  # a private (0700) directory for the warm process's socket

WORKER_PORTS = 200  # ports each node's raylet hands its worker processes
# Ports a node listens on besides the worker range, in `ray start` flag names.
NODE_PORTS = [
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
]
HEAD_PORTS = ["port", "dashboard-port", "ray-client-server-port"]


def free_ports(count: int) -> list[int]:
    """Distinct ports free on loopback now (held together so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def worker_port_range(taken: set[int]) -> tuple[int, int]:
    """A free block of WORKER_PORTS ports below Linux's ephemeral range and above Ray's default."""
    for _ in range(100):
        low = random.randrange(20000, 32000 - WORKER_PORTS)
        block = range(low, low + WORKER_PORTS)
        if not taken.intersection(block) and all(_is_free(p) for p in block):
            taken.update(block)
            return low, low + WORKER_PORTS - 1
    raise RuntimeError("found no free block of ports for Ray workers")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
            return True
        except OSError:
            return False


def node_args(
    head: Optional[dict[str, Any]], cpus: int, object_store_mb: Optional[int], taken: set[int]
) -> tuple[list[str], dict[str, int]]:
    """`ray start` arguments of one node (the head when `head` is None) and its ports."""
    names = NODE_PORTS + (HEAD_PORTS if head is None else [])
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    low, high = worker_port_range(taken | set(ports.values()))
    args = [f"--{k}={v}" for k, v in ports.items()]
    args += ["--block", f"--node-ip-address={LOOPBACK}", f"--num-cpus={cpus}", "--disable-usage-stats"]
    args += [f"--min-worker-port={low}", f"--max-worker-port={high}"]
    if object_store_mb:
        args.append(f"--object-store-memory={object_store_mb * 1024 * 1024}")
    if head is None:
        args += ["--head", f"--dashboard-host={LOOPBACK}", "--include-dashboard=true"]
    else:
        args.append(f"--address={head['gcs']}")
    return args, ports


def node_env(head: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(
        RAY_AUTH_MODE="token",
        # Keeps 127.0.0.1 the node address in every process of the cluster (_ray_internals).
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        **{_ray_internals.USAGE_STATS_ENV: "0"},  # (and nothing sent to say so: below)
        **_ray_internals.no_usage_report(),
        # Jobs are stopped with SIGINT, which Tune turns into a final snapshot, and get a
        # minute for it before SIGKILL (read by the job supervisor, on this machine).
        RAY_JOB_STOP_SIGNAL=os.environ.get("RAY_JOB_STOP_SIGNAL", "SIGINT"),
        RAY_JOB_STOP_WAIT_TIME_S=os.environ.get("RAY_JOB_STOP_WAIT_TIME_S", "60"),
        # `python` in a job's entrypoint is the Python this cluster runs on.
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    )
    if head:
        # The head's metrics servers default to fixed ports that any other Ray here holds too.
        dashboard, autoscaler = free_ports(2)
        env.update(DASHBOARD_METRIC_PORT=str(dashboard), AUTOSCALER_METRIC_PORT=str(autoscaler))
    return env


def ray_start(argv: list[str], where: str = "", loopback: bool = True) -> None:
    """`ray start ARGV` in this process (on loopback: _ray_internals.ray_start_on_loopback), its
    Python workers copied from a warm process started beside it, whose socket goes in the
    private directory `where`. The warm process ends with this one. Without that directory, or
    where copies cannot be made (another Ray, no fork), every worker starts cold, as Ray starts
    it."""
    from tuner.cluster import worker_fork

    if where and _ray_internals.checked():
        worker_fork.start(where)
        atexit.register(worker_fork.stop)
    with _ray_internals.worker_command(worker_fork.LAUNCHER) as copied:
        if not copied:
            worker_fork.stop()
        if loopback:
            _ray_internals.ray_start_on_loopback(argv)
        else:
            _ray_command(["start", *argv])


def _ray_command(argv: list[str]) -> None:
    """The `ray` command, run in this process (its entry point, as Ray's package names it), so
    that what this process set up for the node it starts (worker_command) holds there."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="ray")
    sys.argv = ["ray", *argv]
    script.load()()


def node(args: argparse.Namespace) -> int:
    """`tuner cluster node -- RAY_START_ARGS`: `ray start --block RAY_START_ARGS` here, its
    workers copies of a warm process whose socket lives in a private (0700) temporary
    directory, removed when the node ends (kept if the warm process wrote its log there).
    Token authentication is on unless RAY_AUTH_MODE says otherwise, and a node without a token
    says so in one line before anything starts."""
    from tuner.errors import ExitCode

    argv = list(args.ray_args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if "--block" not in argv:  # (the warm process, and the copies, live as long as this process)
        argv.insert(0, "--block")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ.get(_ray_internals.USAGE_STATS_ENV) == "0":  # (off: nothing sent to say so)
        os.environ.update(_ray_internals.no_usage_report())
    if os.environ["RAY_AUTH_MODE"] == "token" and not _ray_internals.ray_token():
        print(
            "error: RAY_AUTH_MODE=token and no Ray token here: set RAY_AUTH_TOKEN_PATH (a 0600 file "
            "every node can read) or RAY_AUTH_TOKEN, or RAY_AUTH_MODE=disabled",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    from tuner.cluster import worker_fork

    if not (_ray_internals.checked() and worker_fork.usable()):
        print("[tuner] this node's workers start as Ray starts them (no copies here)", flush=True)
        ray_start(argv, loopback=False)
        return ExitCode.OK
    where = tempfile.mkdtemp(prefix="tuner-node-")
    atexit.register(_remove_if_empty, where)  # (after the warm process's end, which runs first)
    print(
        f"[tuner] this node's workers are copies of a warm process; its log, if it has one: {where}",
        flush=True,
    )
    ray_start(argv, where, loopback=False)
    return ExitCode.OK  # (not reached: `ray start` exits this process when its node ends)


def _remove_if_empty(where: str) -> None:
    """The node's private directory, unless its warm process left a log there (what went wrong)."""
    with contextlib.suppress(OSError):
        os.rmdir(where)


def add_parser(verbs: Any) -> None:
    """The `node` verb under `tuner cluster`."""
    p = verbs.add_parser(
        "node",
        help="ray start --block here, its Python workers copies of a warm process (any cluster's node)",
        description="Run `ray start --block RAY_START_ARGS` on this machine as tuner's own nodes "
        "run it: every Python worker of the node starts as a copy of a process that has already "
        "imported torch, Ray Tune and tuner, so trial actors start in milliseconds. For the "
        "nodes of a cluster tuner does not start (deploy/slurm/tuner.sbatch, machines of your "
        "own). Token authentication is on unless RAY_AUTH_MODE says otherwise. Ends with its "
        "node (SIGTERM, Ctrl-C).",
        usage="python -m tuner cluster node -- RAY_START_ARGS...",
    )
    p.add_argument(
        "ray_args",
        nargs=argparse.REMAINDER,
        metavar="-- RAY_START_ARGS",
        help="`ray start` options after `--` (e.g. -- --head --port=6379, or -- --address=HEAD:6379)",
    )
    p.set_defaults(verb_func=node)


if __name__ == "__main__":  # a node of `python -m tuner cluster start` (cluster/local.py spawns it)
    ray_start(sys.argv[1:], os.environ.pop(FORK_DIR_ENV, ""))
