"""A Ray cluster on this machine, secure by default: what scripts/cluster.sh runs.

    python -m tuner.local_cluster start [--workers N] [--num-cpus N] [--object-store-mb MB]
    python -m tuner.local_cluster status | env | stop

Every listening socket is on 127.0.0.1, at random free ports, and token authentication is
on: the token is made (mode 0600) where Ray looks for it if there is none, and never
printed. Each node is a `ray start --block` in a session of its own, recorded in the state
directory, so `stop` ends what `start` started (and what that started), never another Ray
on the machine. `--workers N` adds N more nodes, to try multi-node placement on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from tuner import cluster

STATE_FILE = "cluster.json"
LOOPBACK = "127.0.0.1"
WORKER_PORTS = 200  # ports each node's raylet hands its worker processes
READY_TIMEOUT_S = 180.0
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


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(os.environ.get("TUNER_CLUSTER_DIR") or os.path.join(base, "tuner", "cluster"))


def read_token() -> str:
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:
        return token
    return cluster.token_path().read_text().strip()


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
    import random

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
        # Keeps 127.0.0.1 the node address in every process of the cluster: see _ray_start.
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


def spawn(args: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    import psutil

    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.local_cluster", "_ray-start", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own session: no terminal signal reaches it
        )
    return {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(), "log": str(log)}


def leader(node: dict[str, Any]) -> Optional[Any]:
    """The node's `ray start` process, if it is still the one we started."""
    import psutil

    try:
        p = psutil.Process(node["pid"])
        return p if abs(p.create_time() - node["create_time"]) < 0.01 and p.is_running() else None
    except psutil.Error:
        return None


def processes(state: dict[str, Any]) -> list[Any]:
    """Every process of the cluster: the nodes' `ray start` processes, their descendants,
    and anything else naming the cluster's private temp directory (orphans)."""
    import psutil

    found: dict[int, Any] = {}
    for node in state["nodes"]:
        p = leader(node)
        if p is None:
            continue
        found[p.pid] = p
        try:
            found.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.Error:
            pass
    temp = state["temp_dir"] + os.sep
    for p in psutil.process_iter(["cmdline"], ad_value=None):
        if any(temp in arg for arg in p.info["cmdline"] or []):
            found.setdefault(p.pid, p)
    return list(found.values())


def load_state(state_dir: Path) -> Optional[dict[str, Any]]:
    path = state_dir / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def save_state(state_dir: Path, state: dict[str, Any]) -> None:
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(state_dir / STATE_FILE)


def start(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    old = load_state(state_dir)
    if old and any(leader(n) for n in old["nodes"]):
        print(
            f"error: a cluster started from {state_dir} is running; stop it first: scripts/cluster.sh stop",
            file=sys.stderr,
        )
        return 2
    if old:
        _stop(old, state_dir, quiet=True)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    token_from = cluster.ensure_token()
    cpus = args.num_cpus or max(1, (os.cpu_count() or 1) // (args.workers + 1))
    # Ray's sockets live under the temp dir: keep its path short (Unix sockets: 107 bytes).
    state: dict[str, Any] = {
        "temp_dir": tempfile.mkdtemp(prefix="tuner-ray-"),
        "token": token_from,
        "nodes": [],
    }
    taken: set[int] = set()
    head_args, ports = node_args(None, cpus, args.object_store_mb, taken)
    head_args += ["--node-name=head", f"--temp-dir={state['temp_dir']}/head"]
    state.update(
        gcs=f"{LOOPBACK}:{ports['port']}",
        dashboard=f"http://{LOOPBACK}:{ports['dashboard-port']}",
        client=f"ray://{LOOPBACK}:{ports['ray-client-server-port']}",
    )
    state["nodes"].append({"name": "head", **spawn(head_args, node_env(True), state_dir / "head.log")})
    save_state(state_dir, state)
    try:
        _wait_ready(state, 1)
        for i in range(1, args.workers + 1):
            name = f"worker-{i}"
            worker_args, _ = node_args(state, args.worker_cpus or cpus, args.object_store_mb, taken)
            # A temp dir of its own: nodes sharing one also share runtime_resources/, and a
            # node that no longer needs a job's working_dir deletes it under the job's
            # driver (its cwd vanished mid-run on this machine). Real nodes never share.
            worker_args += [f"--node-name={name}", f"--temp-dir={state['temp_dir']}/{name}"]
            state["nodes"].append(
                {"name": name, **spawn(worker_args, node_env(False), state_dir / f"{name}.log")}
            )
            save_state(state_dir, state)
        _wait_ready(state, len(state["nodes"]))
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        _stop(state, state_dir, quiet=True)
        return 1
    print(f"[cluster] started {len(state['nodes'])} node(s) on {LOOPBACK} with token authentication")
    _describe(state, state_dir)
    return 0


def _wait_ready(state: dict[str, Any], nodes: int) -> None:
    """Until `nodes` nodes are alive and the dashboard (jobs, State API) answers."""
    target = cluster.target(state["gcs"])
    assert target is not None
    token = read_token()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for node in state["nodes"]:
            if leader(node) is None:
                tail = Path(node["log"]).read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(
                    f"node {node['name']} exited; its log ({node['log']}) ends:\n" + "\n".join(tail)
                )
        try:
            if (
                len(cluster.gcs_nodes(target, token)) >= nodes
                and cluster.dashboard_status(state["dashboard"], token, 5) == 200
            ):
                return
        except Exception:  # noqa: BLE001 - not up yet: GCS or dashboard still starting
            pass
        time.sleep(1)
    raise RuntimeError(
        f"the cluster was not ready after {READY_TIMEOUT_S:.0f} s (logs in {state['temp_dir']})"
    )


def _describe(state: dict[str, Any], state_dir: Path) -> None:
    print(f"  jobs, dashboard: {state['dashboard']}")
    print(f"  GCS address:     {state['gcs']}   (python -m tuner sweep FILE --address {state['gcs']})")
    print(f"  Ray client:      {state['client']}")
    print(f"  token:           {state['token']} (never printed)")
    print(f"  state and logs:  {state_dir}, {state['temp_dir']}")
    print("  submit a sweep:  scripts/submit.sh search_spaces/debug.yaml")
    print('  ray CLI here:    eval "$(scripts/cluster.sh env)"; ray job list; ray status')


def status(args: argparse.Namespace, state: dict[str, Any]) -> int:
    alive = [n for n in state["nodes"] if leader(n)]
    target = cluster.target(state["gcs"])
    assert target is not None
    try:
        nodes = cluster.gcs_nodes(target, read_token())
    except Exception as err:  # noqa: BLE001 - report, whatever the GCS says
        up = f"{len(alive)} of {len(state['nodes'])} node processes alive"
        print(f"[cluster] not answering at {state['gcs']} ({up}): {err}")
        return 1
    cpus = sum(n.resources_total.get("CPU", 0) for n in nodes)
    print(f"[cluster] running: {len(nodes)} node(s) alive, {cpus:g} CPUs, token authentication")
    for n in nodes:
        role = "head" if n.is_head_node else "worker"
        print(
            f"  {n.node_name or role:10s} {role:6s} {n.node_manager_address}  node id {n.node_id.hex()[:12]}"
        )
    _describe(state, args.state_dir)
    return 0


def env(args: argparse.Namespace, state: dict[str, Any]) -> int:
    """Shell exports that point Ray's own CLI (and --address auto) at this cluster."""
    exports = {
        "RAY_ADDRESS": state["gcs"],
        "RAY_API_SERVER_ADDRESS": state["dashboard"],
        "RAY_AUTH_MODE": "token",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    if not os.environ.get("RAY_AUTH_TOKEN") and os.environ.get("RAY_AUTH_TOKEN_PATH"):
        exports["RAY_AUTH_TOKEN_PATH"] = os.environ["RAY_AUTH_TOKEN_PATH"]
    for k, v in exports.items():
        print(f"export {k}={v}")
    return 0


def stop(args: argparse.Namespace, state: dict[str, Any]) -> int:
    _stop(state, args.state_dir)
    return 0


def _stop(state: dict[str, Any], state_dir: Path, quiet: bool = False) -> None:
    """SIGTERM each node's `ray start` (workers first; it stops its own processes), then end
    whatever of the cluster outlived it. Only processes of this cluster are signalled."""
    import psutil

    procs = processes(state)
    for node in reversed(state["nodes"]):
        p = leader(node)
        if p is not None:
            p.terminate()
            psutil.wait_procs([p], timeout=30)
    rest = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in rest:
        _signal(p, kill=False)
    _, alive = psutil.wait_procs(rest, timeout=10)
    for p in alive:
        _signal(p, kill=True)
    shutil.rmtree(state["temp_dir"], ignore_errors=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    if not quiet:
        print(f"[cluster] stopped {len(procs)} process(es) of the cluster started from {state_dir}")


def _signal(p: Any, kill: bool) -> None:
    import psutil

    try:
        p.kill() if kill else p.terminate()
    except psutil.Error:
        pass


def _ray_start(argv: list[str]) -> None:
    """`ray start ARGV`, keeping 127.0.0.1 as this node's address.

    On Linux Ray turns a loopback --node-ip-address (and a loopback --address) into the
    machine's own address (ray/_private/services.py: resolve_ip_for_localhost), so the GCS,
    raylet and agents would listen on every interface. It keeps loopback where
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which the node's processes inherit; but with it,
    `ray start --address` refuses to add a node, hence the two patches of this process only.
    """
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray.scripts.scripts import main

    ray_constants.ENABLE_RAY_CLUSTER = True
    services.resolve_ip_for_localhost = lambda host: host
    sys.argv = ["ray", "start", *argv]
    main()


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help="where the cluster is recorded (default: $TUNER_CLUSTER_DIR or ~/.local/state/tuner/cluster)",
    )
    parser = argparse.ArgumentParser(
        prog="scripts/cluster.sh",
        description="A Ray cluster on this machine for `ray job submit`: every port on 127.0.0.1, "
        "token authentication on. `stop` ends only what `start` started.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("start", parents=[common], help="start a head (and --workers more nodes) on 127.0.0.1")
    p.add_argument(
        "--workers", type=int, default=0, metavar="N", help="more nodes joining the head (default 0)"
    )
    p.add_argument(
        "--num-cpus",
        type=int,
        metavar="N",
        help="CPUs of the head (default: this machine's, split among nodes)",
    )
    p.add_argument(
        "--worker-cpus", type=int, metavar="N", help="CPUs of each further node (default: as the head)"
    )
    p.add_argument(
        "--object-store-mb", type=int, metavar="MB", help="object store of each node (default: Ray's)"
    )
    for name, func, text in [
        ("status", status, "the nodes and addresses of the cluster"),
        ("env", env, "shell exports that point Ray's CLI at the cluster"),
        ("stop", stop, "stop what start started"),
    ]:
        sub.add_parser(name, parents=[common], help=text).set_defaults(func=func)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_ray-start"]:
        _ray_start(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    if args.command == "start":
        return start(args)
    state = load_state(args.state_dir)
    if not state:  # stdout stays empty, for `eval "$(scripts/cluster.sh env)"`
        print(f"no cluster started from {args.state_dir}", file=sys.stderr)
        return 0 if args.command == "stop" else 1
    return int(args.func(args, state))


if __name__ == "__main__":
    sys.exit(main())
