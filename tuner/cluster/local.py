"""A Ray cluster on this machine, secure by default: `python -m tuner cluster ...`.

    python -m tuner cluster start [--workers N] [--num-cpus N] [--object-store-mb MB] [--tls]
    python -m tuner cluster status | env | stop
    python -m tuner cluster ca DIR | cert DIR --ca CA_DIR [--ip IP ...]
    python -m tuner cluster node -- RAY_START_ARGS   (a node of any cluster: cluster/nodes.py)

Every listening socket is on 127.0.0.1, at random free ports, and token authentication is
on: the token is made (mode 0600) where Ray looks for it if there is none, and never
printed. With `--tls` every process of it speaks mutual TLS (cluster/tls.py): a CA made for
it signs one certificate for this machine, kept in the state directory (key 0600); the
CA's key is never written, so no other certificate it signed exists. `ca` and `cert` make
the same files for clusters of other machines (the recipes in deploy/ use them).

Each node is a `ray start --block` in a session of its own, recorded in the state
directory, so `stop` ends what `start` started (and what that started), never another Ray
on the machine. `--workers N` adds N more nodes, to try multi-node placement on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from tuner.cluster import join as cluster
from tuner.cluster import nodes, tls
from tuner.cluster.join import LOOPBACK
from tuner.cluster.nodes import FORK_DIR_ENV, node_args, node_env
from tuner.errors import ExitCode

STATE_FILE = "cluster.json"
TLS_DIR = "tls"  # in the state directory: this machine's certificate, key and the CA's certificate
READY_TIMEOUT_S = 180.0


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(os.environ.get("TUNER_CLUSTER_DIR") or os.path.join(base, "tuner", "cluster"))


def read_token() -> str:
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:
        return token
    return cluster.token_path().read_text().strip()


def spawn(args: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    import psutil

    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cluster.nodes", *args],
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
            f"error: a cluster started from {state_dir} is running; stop it first: "
            "python -m tuner cluster stop",
            file=sys.stderr,
        )
        return ExitCode.USAGE
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
    # (each node's warm process, its Python workers' source, has its socket there: 0700)
    extra: dict[str, str] = {FORK_DIR_ENV: state["temp_dir"]}
    if args.tls:
        state["tls"] = str(state_dir / TLS_DIR)
        extra |= machine_certificate(state_dir / TLS_DIR).env()
    state["nodes"].append(
        {"name": "head", **spawn(head_args, node_env(True) | extra, state_dir / "head.log")}
    )
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
                {"name": name, **spawn(worker_args, node_env(False) | extra, state_dir / f"{name}.log")}
            )
            save_state(state_dir, state)
        _wait_ready(state, len(state["nodes"]))
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        _stop(state, state_dir, quiet=True)
        return ExitCode.ERRORS
    auth = "token authentication and TLS" if args.tls else "token authentication"
    print(f"[cluster] started {len(state['nodes'])} node(s) on {LOOPBACK} with {auth}")
    _describe(state, state_dir)
    return ExitCode.OK


def machine_certificate(directory: Path) -> tls.Files:
    """A fresh CA's certificate for every process of this machine (its names and addresses);
    the CA's key stays in memory and is gone when this command ends."""
    ips, names = tls.this_machine()
    return tls.new_authority().issue(directory, "tuner cluster node", ips, names)


def tls_files(state: dict[str, Any]) -> Optional[tls.Files]:
    """The TLS files of a cluster started with --tls, else None."""
    if not state.get("tls"):
        return None
    d = Path(state["tls"])
    return tls.Files(d / tls.NODE_CERT, d / tls.NODE_KEY, d / tls.CA_CERT)


def tls_for(address: str) -> Optional[tls.Files]:
    """The TLS files of the cluster `python -m tuner cluster start --tls` recorded, if its
    GCS or Ray Client server is `address` (so `tuner sweep --address` joins it as is)."""
    state = load_state(default_state_dir())
    if not state or address.removeprefix("ray://") not in (
        state["gcs"],
        state["client"].removeprefix("ray://"),
    ):
        return None
    return tls_files(state)


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
                len(cluster.gcs_nodes(target, token, tls_files(state))) >= nodes
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
    if state.get("tls"):
        print(f"  TLS:             {state['tls']} (this machine's certificate, its key, the CA's)")
    print(f"  state and logs:  {state_dir}, {state['temp_dir']}")
    print("  submit a sweep:  python -m tuner submit YOUR_SWEEP.yaml")
    print('  ray CLI here:    eval "$(python -m tuner cluster env)"; ray job list; ray status')


def secret_files(state: dict[str, Any]) -> list[Path]:
    """The cluster's files only its user may read: the token file (unless the token came
    from RAY_AUTH_TOKEN) and, with --tls, this machine's private key."""
    found = [] if os.environ.get("RAY_AUTH_TOKEN") else [cluster.token_path()]
    files = tls_files(state)
    return found + ([files.key] if files is not None else [])


def status(args: argparse.Namespace, state: dict[str, Any]) -> int:
    for path in secret_files(state):  # (said first: also when the cluster does not answer)
        cluster.warn_if_exposed(path)
    alive = [n for n in state["nodes"] if leader(n)]
    target = cluster.target(state["gcs"])
    assert target is not None
    try:
        nodes = cluster.gcs_nodes(target, read_token(), tls_files(state))
    except Exception as err:  # noqa: BLE001 - report, whatever the GCS says
        up = f"{len(alive)} of {len(state['nodes'])} node processes alive"
        print(f"[cluster] not answering at {state['gcs']} ({up}): {err}")
        return ExitCode.ERRORS
    cpus = sum(n.resources_total.get("CPU", 0) for n in nodes)
    auth = "token authentication" + (" and TLS" if state.get("tls") else "")
    print(f"[cluster] running: {len(nodes)} node(s) alive, {cpus:g} CPUs, {auth}")
    for n in nodes:
        role = "head" if n.is_head_node else "worker"
        print(
            f"  {n.node_name or role:10s} {role:6s} {n.node_manager_address}  node id {n.node_id.hex()[:12]}"
        )
    _describe(state, args.state_dir)
    return ExitCode.OK


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
    files = tls_files(state)
    if files is not None:  # Ray's CLI and any driver must speak TLS to it
        exports.update(files.env())
    for k, v in exports.items():
        print(f"export {k}={v}")
    return ExitCode.OK


def stop(args: argparse.Namespace, state: dict[str, Any]) -> int:
    _stop(state, args.state_dir)
    return ExitCode.OK


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
    rest = [p for p in procs if _alive(p)]
    for p in rest:
        _signal(p, kill=False)
    _, alive = psutil.wait_procs(rest, timeout=10)
    for p in alive:
        _signal(p, kill=True)
    shutil.rmtree(state["temp_dir"], ignore_errors=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    if not quiet:
        print(f"[cluster] stopped {len(procs)} process(es) of the cluster started from {state_dir}")


def _alive(p: Any) -> bool:
    """Running and no zombie; a process that ends while it is asked is not (NoSuchProcess)."""
    import psutil

    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _signal(p: Any, kill: bool) -> None:
    import psutil

    try:
        p.kill() if kill else p.terminate()
    except psutil.Error:
        pass


def make_ca(args: argparse.Namespace) -> int:
    """`cluster ca DIR`: a new CA, ca.crt and ca.key (0600) in DIR (0700)."""
    directory: Path = args.directory
    if (directory / tls.CA_KEY).exists():
        print(f"error: {directory / tls.CA_KEY} exists; remove it first to make a new CA", file=sys.stderr)
        return ExitCode.USAGE
    cert = tls.new_authority().save(directory)
    print(f"[cluster] CA made: {cert} (give it to every node and driver), {directory / tls.CA_KEY} (0600: "
          "only where certificates are issued)", file=sys.stderr)  # fmt: skip
    return ExitCode.OK


def make_cert(args: argparse.Namespace) -> int:
    """`cluster cert DIR --ca CA_DIR`: a certificate for this machine, signed by the CA; prints
    the exports that make Ray (`ray start`, a driver) use it."""
    try:
        authority = tls.Authority.load(args.ca)
    except (OSError, ValueError) as err:
        print(f"error: --ca: cannot read the CA in {args.ca}: {err}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        left = authority.days_left()
    except ValueError as err:
        print(f"error: --ca: {args.ca}: {err}", file=sys.stderr)
        return ExitCode.USAGE
    days: float = tls.VALID_DAYS
    if left < days:  # a certificate outliving its CA would be refused from the CA's end on
        days = left
        end = authority.valid()[1]
        print(f"[cluster] the CA expires on {end:%Y-%m-%d} UTC: the certificate ends then too; "
              "make a new CA before that", file=sys.stderr)  # fmt: skip
    ips, names = tls.this_machine()
    files = authority.issue(args.directory, args.name, ips + args.ip, names + args.dns, days=days)
    for k, v in files.env().items():
        print(f"export {k}={v}")
    return ExitCode.OK


def add_parser(sub: Any) -> None:
    """`cluster start|status|env|stop` under the CLI's subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help="where the cluster is recorded (default: $TUNER_CLUSTER_DIR or ~/.local/state/tuner/cluster)",
    )
    parser = sub.add_parser(
        "cluster",
        help="a Ray cluster on this machine for `submit` (127.0.0.1, token authentication)",
        description="A Ray cluster on this machine for `ray job submit`: every port on 127.0.0.1, "
        "token authentication on. `stop` ends only what `start` started.",
    )
    parser.set_defaults(func=run)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser(
        "start", parents=[common], help="start a head (and --workers more nodes) on 127.0.0.1"
    )
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
    p.add_argument(
        "--tls",
        action="store_true",
        help="encrypt the cluster's traffic (mutual TLS, a CA of its own); `env` exports the files",
    )
    p = verbs.add_parser("ca", help="make a CA for a TLS cluster: DIR/ca.crt, DIR/ca.key (0600)")
    p.add_argument("directory", type=Path, metavar="DIR", help="where the CA goes (made 0700)")
    p.set_defaults(verb_func=make_ca)
    p = verbs.add_parser(
        "cert",
        help="a certificate for this machine signed by a CA (prints the RAY_USE_TLS exports)",
        description="Issue DIR/node.crt, DIR/node.key (0600) and DIR/ca.crt for this machine, "
        "naming its host name and addresses, signed by the CA in --ca; prints the exports "
        "that make `ray start` and drivers here speak TLS with them.",
    )
    p.add_argument("directory", type=Path, metavar="DIR", help="where this machine's files go (made 0700)")
    p.add_argument("--ca", type=Path, required=True, metavar="CA_DIR", help="where ca.crt and ca.key are")
    p.add_argument("--ip", action="append", default=[], help="another address of this machine")
    p.add_argument("--dns", action="append", default=[], help="another name of this machine")
    p.add_argument("--name", default="tuner cluster node", help="the certificate's common name")
    p.set_defaults(verb_func=make_cert)
    nodes.add_parser(verbs)
    for name, func, text in [
        ("status", status, "the nodes and addresses of the cluster"),
        ("env", env, "shell exports that point Ray's CLI at the cluster"),
        ("stop", stop, "stop what start started"),
    ]:
        verbs.add_parser(name, parents=[common], help=text).set_defaults(verb_func=func)


def run(args: argparse.Namespace) -> int:
    """Run the `cluster` verb of parsed arguments."""
    if args.verb == "start":
        return start(args)
    if args.verb in ("ca", "cert", "node"):
        return int(args.verb_func(args))
    state = load_state(args.state_dir)
    if not state:  # stdout stays empty, for `eval "$(python -m tuner cluster env)"`
        print(f"no cluster started from {args.state_dir}", file=sys.stderr)
        return ExitCode.OK if args.verb == "stop" else ExitCode.ERRORS
    return int(args.verb_func(args, state))
