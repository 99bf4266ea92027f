"""One node of a cluster tuner starts on this machine: its free loopback ports, its `ray start`
arguments and environment (every socket on 127.0.0.1, token authentication on), and the node
itself, whose Python workers are copies of a warm process.

The node's `ray start` runs in this process beside a warm process (tuner.cluster.worker_fork),
as a private local Ray's start does, so that a sweep joined to the cluster starts its trial
actors in milliseconds rather than each importing torch, Ray Tune and tuner (~3 CPU-s each).

    python -m tuner.cluster.nodes RAY_START_ARGS...   (cluster/local.py spawns each node so)
"""

from __future__ import annotations

import atexit
import os
import random
import socket
import sys
from typing import Any, Optional

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
        RAY_USAGE_STATS_ENABLED="0",
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


def ray_start(argv: list[str]) -> None:
    """`ray start ARGV` in this process on loopback (_ray_internals.ray_start_on_loopback), its
    Python workers copied from a warm process started beside it, whose socket goes in the
    private directory $TUNER_NODE_FORK_DIR names (cluster/local.py: the cluster's temporary
    directory). The warm process ends with this one. Without that directory, or where copies
    cannot be made (another Ray, no fork), every worker starts cold, as Ray starts it."""
    from tuner.cluster import _ray_internals, worker_fork

    where = os.environ.pop(FORK_DIR_ENV, "")
    if where and _ray_internals.checked():
        worker_fork.start(where)
        atexit.register(worker_fork.stop)
    with _ray_internals.worker_command(worker_fork.LAUNCHER) as copied:
        if not copied:
            worker_fork.stop()
        _ray_internals.ray_start_on_loopback(argv)


if __name__ == "__main__":  # a node of `python -m tuner cluster start` (cluster/local.py spawns it)
    ray_start(sys.argv[1:])
