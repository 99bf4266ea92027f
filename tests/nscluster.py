"""A Ray cluster of separate "machines" on this one: each node in network, mount, PID and UTS
namespaces of its own (Linux, root).

    host (the tests)          10.A.B.1 on bridge tnb<pid>
      ├─ veth ─ node "head"   10.A.B.2   tuner cluster node -- --head  (GCS, dashboard, job API)
      └─ veth ─ node "w1"     10.A.B.3   tuner cluster node -- --address 10.A.B.2:6379

A node starts as `ip netns exec NS unshare --mount --pid --uts --fork --mount-proc python
tests/nscluster.py`: that Python is PID 1 of the node (`node_main` below). It gives the node
private file systems (tmpfs on /tmp, /var/tmp, /dev/shm and the home directory, its own
/etc/hosts; the rest of the machine read-only, like a shared software image), writes the
cluster's token (read from its stdin) to a 0600 file there, starts `ray start --block` (as
`python -m tuner cluster node`, which starts its Python workers as copies of a warm process, as
a real machine's node is started in deploy/slurm/tuner.sbatch) and reaps orphans until that
ends. Every process of the node descends from it, so all keep its one
view of the files; no node sees another's, and the host sees them only through
/proc/PID/root. Killing it ends every process of the node at once, as a power cut would, and
its file systems vanish with them.

Token authentication is on; Ray's servers listen on the node's own address (a server that
binds every interface still binds only the node's: its namespace has no other). With
`tls=True` every node also speaks mutual TLS (tuner/cluster/tls.py): a CA made for the
cluster signs a certificate per node (its address) and one for the host; keys reach a node
on its stdin, as the token does, and are written 0600 on its private file system. Names carry
the pid of the process that made them, so a later run removes what a killed one left behind.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "tnode"  # namespaces: tnode-<tag>-<node>; links: tnb<tag>, tnv<tag>x<i>; tag: <owner pid>c<n>
WORKDIR = "/tmp/work"  # each node's working directory (on its private /tmp)
HOME = "/tmp/home"
TOKEN_PATH = f"{HOME}/.ray/auth_token"
TLS_DIR = f"{HOME}/.ray/tls"  # a node's certificate, key and the CA's certificate
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT = 6379, 8265, 10001
READY_TIMEOUT_S = 180.0


_made = itertools.count()  # clusters made by this process


class NodeExited(RuntimeError):
    """A node's `ray start` ended (while the cluster waited for it)."""


class Unavailable(Exception):
    """Namespaces cannot be made here (not root, no `ip`/`unshare`/`nsenter`, no permission)."""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def sleeping_sweep(name: str, epochs: int = 8) -> str:
    """A sweep file of 4 trials, 2 at a time (one CPU each), whose trials are a script that
    sleeps 1 s an epoch (tests/command_script.py, in the repository every node mounts): at
    least `epochs` seconds each, whatever the load, and almost no CPU.

    For tests that need trials on both nodes of a cluster of 1 CPU each. Ray starts the worker
    node's trial actor while the head's first trial runs, and Tune gives a trial whose actor
    has not started yet the head's actor once that one is free: trials that end before the
    worker's actor is up (a few seconds on a loaded machine) all run on the head."""
    script = ROOT / "tests" / "command_script.py"
    raw = {
        "name": name,
        "metric": "val_loss",
        "direction": "min",
        "task": {"command": f"python {script} --kind api --lr {{lr}} --epochs {{max_epochs}} --sleep 1"},
        "search": {
            "algorithm": "random",
            "num_samples": 4,
            "params": {"lr": {"type": "loguniform", "low": 0.01, "high": 0.1}},
        },
        "schedule": {"max_epochs": epochs, "early_stopping": False},
        "resources": {"cpus_per_worker": 1, "max_concurrent_trials": 2},
    }
    return yaml.safe_dump(raw)


def check_available() -> None:
    """Raise Unavailable with the reason when namespaces cannot be made here."""
    if sys.platform != "linux":
        raise Unavailable("network namespaces need Linux")
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            raise Unavailable(f"`{tool}` is not installed")
    probe = f"{PREFIX}-{os.getpid()}-probe"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        raise Unavailable(f"`ip netns add` failed: {made.stderr.strip()}")
    _sh("ip", "netns", "del", probe, check=False)


def remove_leftovers() -> list[str]:
    """Namespaces and links of runs whose owner process is gone (a killed pytest): their
    processes killed, then removed. Returns what was removed."""
    removed = []
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}-(\d+)c\d+-\w+", name)
        if m and not _alive(int(m.group(1))):
            _kill_netns(name)
            removed.append(name)
    for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        m = re.match(r"\d+: (tn[bv](\d+)c\d+(x\d+)?)[@:]", line)
        if m and not _alive(int(m.group(2))):
            _sh("ip", "link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


def _kill_netns(name: str) -> None:
    for pid in _sh("ip", "netns", "pids", name, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    deadline = time.monotonic() + 10
    while _sh("ip", "netns", "pids", name, check=False).stdout.split() and time.monotonic() < deadline:
        time.sleep(0.1)
    _sh("ip", "netns", "del", name, check=False)


def _free_subnet() -> str:
    """A 10.A.B.0/24 no interface here uses ("10.A.B")."""
    used = _sh("ip", "-4", "-o", "addr", "show", check=False).stdout
    used += _sh("ip", "-4", "route", "show", check=False).stdout
    rng = secrets.SystemRandom()
    for _ in range(200):
        net = f"10.{rng.randrange(100, 250)}.{rng.randrange(0, 256)}"
        if f" {net}." not in used and f"\n{net}." not in used and not used.startswith(net + "."):
            return net
    raise RuntimeError("found no free 10.x.y.0/24 subnet")


@dataclass
class Node:
    """One machine of the cluster: its name, address and PID 1 (the host's view of its pid)."""

    name: str
    ip: str
    netns: str
    veth: str
    proc: Optional[subprocess.Popen] = None
    log: Optional[Path] = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def path(self, inside: str) -> Path:
        """A path of this node's file system, as the host can reach it (root only)."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class NsCluster:
    """A head and workers in namespaces of their own, with token authentication.

    `env` is each node's environment besides our own variables (say, AWS_* for an S3
    endpoint the nodes reach): it is the nodes' "instance" environment, passed on their
    stdin, never in a command line.
    """

    workers: int = 1
    cpus: int = 1  # per node: the CI machine has 2 cores
    object_store_mb: int = 128
    env: dict[str, str] = field(default_factory=dict)
    base: Optional[Path] = None  # the host's side: logs, the host's copy of the token
    subnet: str = ""
    nodes: list[Node] = field(default_factory=list)
    token: str = ""
    tag: str = ""  # in the names of its namespaces and links
    bridge: str = ""
    tls: bool = False  # every node and the host speak mutual TLS (a CA of the cluster's own)
    authority: Any = None  # tls: the cluster's CA (tuner.cluster.tls.Authority)
    host_tls: Any = None  # tls: the host's files (tuner.cluster.tls.Files)
    others: list[Node] = field(default_factory=list)  # nodes booted by `boot_stranger`

    # -- addresses
    @property
    def host_ip(self) -> str:
        """The host's address on the cluster's network (where a server for the nodes listens)."""
        return f"{self.subnet}.1"

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def gcs(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    @property
    def dashboard(self) -> str:
        return f"http://{self.head.ip}:{DASHBOARD_PORT}"

    @property
    def token_file(self) -> Path:
        assert self.base is not None
        return self.base / "token"

    on_stop: list[Callable[[], None]] = field(default_factory=list)  # (services of the tests)
    s3: Any = None  # the tests' S3 server for the nodes (tests/s3server.py), if `setup` made one

    # -- life
    def start(self, setup: Optional[Callable[[NsCluster], dict[str, str]]] = None) -> NsCluster:
        """Make the network, call `setup` (servers the nodes reach at `host_ip`: it returns
        variables for the nodes' environment), then start the head and the workers."""
        check_available()
        remove_leftovers()
        import tempfile

        self.base = self.base or Path(tempfile.mkdtemp(prefix="tuner-ns-"))
        self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.token = secrets.token_hex(32)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        self.tag = tag = f"{os.getpid()}c{next(_made)}"
        self.bridge = f"tnb{tag}"
        self.subnet = _free_subnet()
        if self.tls:
            from tuner.cluster import tls

            self.authority = tls.new_authority("nscluster CA")
            self.host_tls = self.authority.issue(self.base / "tls", "host", [self.host_ip], [])
        try:
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            _sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            _sh("ip", "link", "set", self.bridge, "up")
            names = ["head"] + [f"w{i}" for i in range(1, self.workers + 1)]
            for i, name in enumerate(names):
                node = Node(name, f"{self.subnet}.{i + 2}", f"{PREFIX}-{tag}-{name}", f"tnv{tag}x{i}")
                self._network(node)
                self.nodes.append(node)
            if setup is not None:
                self.env.update(setup(self))
            for i, node in enumerate(self.nodes):
                # The head first (the workers join its GCS); each node counted in before the
                # next, and booted again if its `ray start` gives up: Ray 2.60 allows a raylet
                # 30 s to register, which a loaded 2-core machine can overrun.
                self._boot_retrying(node, i + 1, dashboard=False)
            self.wait_ready(len(self.nodes))
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self, node: Node) -> None:
        _sh("ip", "netns", "add", node.netns)
        _sh("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _sh("ip", "link", "set", node.veth, "master", self.bridge, "up")
        _sh("ip", "-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        _sh("ip", "-n", node.netns, "link", "set", "eth0", "up")
        _sh("ip", "-n", node.netns, "link", "set", "lo", "up")

    def _boot(
        self,
        node: Node,
        hosts: dict[str, str],
        tls_pem: Optional[tuple[bytes, ...]] = None,
        extra_env: Optional[dict[str, str]] = None,
    ) -> None:
        """Start `node`'s PID 1 and its `ray start`; `tls_pem` (certificate, key, CA) replaces
        the node's own from the cluster's CA (`()`: no TLS at all)."""
        assert self.base is not None
        head = node is self.head
        if tls_pem is None and self.tls:
            tls_pem = (*self.authority.issue_pem(node.name, [node.ip], [node.name]), self.authority.cert_pem)
        args = [
            "--block",
            f"--node-ip-address={node.ip}",
            f"--node-name={node.name}",
            f"--num-cpus={self.cpus}",
            f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            "--disable-usage-stats",
        ]
        if head:
            args += [
                "--head",
                f"--port={GCS_PORT}",
                f"--ray-client-server-port={CLIENT_PORT}",
                "--include-dashboard=true",
                f"--dashboard-host={node.ip}",
                f"--dashboard-port={DASHBOARD_PORT}",
            ]
        else:
            args.append(f"--address={self.gcs}")
        env = {**self.node_env(), **self.env, **(extra_env or {})}
        if not tls_pem:
            env = {k: v for k, v in env.items() if not k.startswith(("RAY_USE_TLS", "RAY_TLS_"))}
        spec = {
            "hostname": node.name,
            "hosts": hosts,
            "token": self.token,
            "tls": [p.decode() for p in tls_pem or ()],
            "keep": _keep_paths(),
            "env": env,
            # `ray start`, its workers copies of a warm process, as a real machine's node is started
            # with tuner installed (deploy/slurm/tuner.sbatch)
            "ray_start": [sys.executable, "-m", "tuner", "cluster", "node", "--", *args],
        }
        node.log = self.base / f"{node.name}.log"
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(
                ["ip", "netns", "exec", node.netns, "unshare", "--mount", "--pid", "--uts", "--fork",
                 "--mount-proc", "--kill-child", sys.executable, __file__],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                start_new_session=True,
            )  # fmt: skip
        assert node.proc.stdin is not None
        node.proc.stdin.write(json.dumps(spec).encode())
        node.proc.stdin.close()
        # `unshare --fork` waits for its child, PID 1 of the node: kill that to end the node.
        node.proc = _Init(node.proc)

    def node_env(self) -> dict[str, str]:
        """What every process of a node (and a driver run there) starts with."""
        return {
            "PATH": os.path.dirname(sys.executable) + os.pathsep + "/usr/local/bin:/usr/bin:/bin",
            "HOME": HOME,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": TOKEN_PATH,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_JOB_STOP_SIGNAL": "SIGINT",
            "RAY_JOB_STOP_WAIT_TIME_S": "60",
            "MPLBACKEND": "Agg",
        } | (_tls_env() if self.tls else {})

    def wait_ready(
        self,
        count: int,
        dashboard: bool = True,
        timeout: float = READY_TIMEOUT_S,
        gone: frozenset = frozenset(),
    ) -> None:
        """Until `count` nodes are alive in the GCS, none of them one of the node ids `gone`
        (a killed node's, which the GCS still counts until its health checks fail), and
        (`dashboard`) the dashboard answers, as seen from the host."""
        from tuner.cluster import join

        target = join.target(self.gcs)
        assert target is not None
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and not node.alive():
                    raise NodeExited(f"node {node.name} exited; its log ends:\n{self.log_tail(node)}")
            try:
                alive = join.gcs_nodes(target, self.token, self.host_tls)
                fresh = [n for n in alive if n.node_id not in gone]
                if (
                    len(fresh) >= count
                    and len(alive) == len(fresh)
                    and (not dashboard or join.dashboard_status(self.dashboard, self.token, 5) == 200)
                ):
                    return
            except Exception as err:  # noqa: BLE001 - not up yet
                last = err
            time.sleep(0.5)
        raise RuntimeError(f"{count} node(s) not ready after {timeout:.0f} s ({last})")

    def log_tail(self, node: Node, lines: int = 30) -> str:
        if node.log is None or not node.log.exists():
            return ""
        return "\n".join(node.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self, node: Node) -> None:
        """Power off a node: SIGKILL to its PID 1 ends every process in it."""
        if node.alive():
            os.kill(node.pid, signal.SIGKILL)
            node.proc.wait(timeout=30)  # type: ignore[union-attr]

    def _boot_retrying(
        self, node: Node, count: int, dashboard: bool, tries: int = 3, gone: frozenset = frozenset()
    ) -> None:
        for attempt in range(1, tries + 1):
            self._boot(node, {n.name: n.ip for n in self.nodes})
            try:
                self.wait_ready(count, dashboard=dashboard, gone=gone)
                return
            except NodeExited:
                if attempt == tries:
                    raise

    def boot_stranger(
        self, name: str, tls_pem: tuple[bytes, ...], env: Optional[dict[str, str]] = None
    ) -> Node:
        """Boot one more machine on the cluster's network whose `ray start` tries to join the
        head with these TLS files (certificate, key, CA; `()`: without TLS) and `env` added to
        its processes' environment; returns at once, joined or not: the caller looks."""
        i = len(self.nodes) + len(self.others)
        node = Node(name, f"{self.subnet}.{i + 2}", f"{PREFIX}-{self.tag}-{name}", f"tnv{self.tag}x{i}")
        self._network(node)
        self.others.append(node)
        self._boot(node, {n.name: n.ip for n in [*self.nodes, node]}, tls_pem, env)
        return node

    def revive(self, node: Node) -> None:
        """Power a killed node on again: a fresh PID 1, empty private file systems, the same
        address; returns once it has joined."""
        assert not node.alive()
        from tuner.cluster import join

        target = join.target(self.gcs)
        assert target is not None
        # The GCS may still count the killed node alive (until its health checks fail): the
        # node is back once the GCS has one of a new id and none of the old ones left.
        alive = join.gcs_nodes(target, self.token, self.host_tls)
        stale = frozenset(n.node_id for n in alive if n.node_manager_address == node.ip)
        self._boot_retrying(node, len(self.nodes), dashboard=True, gone=stale)

    def stop(self) -> None:
        """End every node, remove namespaces and links. Safe to call twice, or half-started."""
        for node in [*self.others, *reversed(self.nodes)]:
            try:
                self.kill(node)
            except (OSError, subprocess.TimeoutExpired):
                pass
            _kill_netns(node.netns)
            _sh("ip", "link", "del", node.veth, check=False)
        if self.bridge:
            _sh("ip", "link", "del", self.bridge, check=False)
        while self.on_stop:
            self.on_stop.pop()()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)

    # -- use
    def host_env(self) -> dict[str, str]:
        """Environment for Ray's CLI and tuner on the host, talking to this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token_file),
            RAY_API_SERVER_ADDRESS=self.dashboard,
            RAY_USAGE_STATS_ENABLED="0",
        )
        if self.host_tls is not None:
            env.update(self.host_tls.env())
        return {**env, **self.env}

    def popen(self, node: Node, argv: list[str], cwd: str = WORKDIR, **kw: Any) -> subprocess.Popen:
        """Start `argv` on `node` (its network, files and processes), as the node's user would:
        the node's environment plus `env`. Its own process group: killpg ends it."""
        env = {**self.node_env(), **self.env, **kw.pop("env", {})}
        cmd = ["nsenter", "-t", str(node.pid), "-n", "-m", "-p", "-u", "--"]
        cmd += ["env", "-i", f"--chdir={cwd}", *[f"{k}={v}" for k, v in env.items()], *argv]
        return subprocess.Popen(cmd, start_new_session=True, **kw)

    def run(
        self, node: Node, argv: list[str], cwd: str = WORKDIR, timeout: float = 300, **kw: Any
    ) -> subprocess.CompletedProcess:
        """`popen`, waited for; killed (its whole group) after `timeout`."""
        proc = self.popen(node, argv, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            tail = f"{out[-3000:]}\n{err[-3000:]}"
            raise AssertionError(f"{argv} on {node.name} ran past {timeout} s:\n{tail}") from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def put(self, node: Node, inside: str, data: bytes | str) -> None:
        """Write a file on `node` (as if copied there by scp)."""
        path = node.path(inside)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    def files(self, node: Node, inside: str = "/tmp") -> list[str]:
        """Every file under `inside` on `node` (paths as the node sees them)."""
        top = node.path(inside)
        return sorted("/" + str(p.relative_to(node.path("/"))) for p in top.rglob("*") if p.is_file())


class _Init:
    """The node's PID 1 seen from the host: `unshare --fork` waits on it, so the pid to kill
    is its child. Behaves as the Popen of that child (poll, wait, pid)."""

    def __init__(self, unshare: subprocess.Popen):
        self.unshare = unshare
        self.pid = self._child(unshare.pid)

    @staticmethod
    def _child(pid: int) -> int:
        # ip netns exec execs unshare (same pid), which forks PID 1 of the node.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                children = []
            if children:
                return int(children[0])
            time.sleep(0.02)
        raise RuntimeError("the node's first process never started")

    def poll(self) -> Optional[int]:
        return self.unshare.poll()

    def wait(self, timeout: Optional[float] = None) -> int:
        return self.unshare.wait(timeout)


def _tls_env() -> dict[str, str]:
    """Ray's TLS variables for a node's files (node_main writes them)."""
    return {
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": f"{TLS_DIR}/node.crt",
        "RAY_TLS_SERVER_KEY": f"{TLS_DIR}/node.key",
        "RAY_TLS_CA_CERT": f"{TLS_DIR}/ca.crt",
    }


def _keep_paths() -> list[str]:
    """What a node must still see where a private file system goes over it: this repository,
    the virtual environment and the Python it runs on."""
    paths = {str(ROOT), sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(paths)


# ---------------------------------------------------------------------------------------
# Inside a node: PID 1


_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 32, 4096, 16384
PRIVATE = ["/tmp", "/var/tmp", "/dev/shm"]


def _mount(
    source: Optional[str], target: str, fstype: Optional[str], flags: int, data: Optional[str]
) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _private_files(keep: list[str]) -> None:
    """tmpfs over PRIVATE and the home directory; what must stay visible under them is bound
    back (read-only), through a descriptor opened before it was hidden; the rest read-only."""
    home = os.path.expanduser("~")
    tops = PRIVATE + ([home] if home not in ("/", "") and os.path.isdir(home) else [])
    held = {k: os.open(k, os.O_PATH) for k in keep if any(_under(k, t) for t in tops)}
    for top in tops:
        _mount("tmpfs", top, "tmpfs", 0, "mode=1777,size=1g")
    for path, fd in held.items():
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
        _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
        os.close(fd)
    # The machine's own files: readable, never written (a software image shared by the nodes).
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _hosts(names: dict[str, str], hostname: str) -> None:
    text = "127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in names.items())
    Path("/tmp/hosts").write_text(text)
    _mount("/tmp/hosts", "/etc/hosts", None, _MS_BIND, None)
    Path("/tmp/hostname").write_text(hostname + "\n")
    _mount("/tmp/hostname", "/etc/hostname", None, _MS_BIND, None)


def node_main() -> int:
    """PID 1 of a node: set its files up, run `ray start --block`, reap orphans, end with it."""
    spec = json.loads(sys.stdin.read())
    import socket

    socket.sethostname(spec["hostname"])
    _private_files(spec["keep"])
    _hosts(spec["hosts"], spec["hostname"])
    for d in (WORKDIR, os.path.dirname(TOKEN_PATH)):
        os.makedirs(d, mode=0o700, exist_ok=True)
    secrets_ = [(TOKEN_PATH, spec["token"])]
    if spec["tls"]:
        os.makedirs(TLS_DIR, mode=0o700, exist_ok=True)
        names = [f"{TLS_DIR}/{n}" for n in ("node.crt", "node.key", "ca.crt")]
        secrets_ += list(zip(names, spec["tls"], strict=True))
    for path, text in secrets_:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    os.chdir(WORKDIR)
    ray = subprocess.Popen(spec["ray_start"], env=spec["env"], stdin=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, lambda *_: ray.send_signal(signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: ray.send_signal(signal.SIGTERM))
    while True:  # PID 1 reaps every orphan of the node
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if pid == ray.pid:
            print(f"[node] ray start ended ({status})", flush=True)
            return 0


if __name__ == "__main__":
    sys.exit(node_main())
