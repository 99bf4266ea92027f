"""Which Ray cluster a driver joins, whether that is safe, and where its results go.

A Ray cluster runs whatever code reaches its GCS, client server or job API
(CVE-2023-48022), so we refuse one without authentication unless all of it listens on
loopback only, or the user passes --allow-insecure-cluster. The check needs no token: with
token authentication on, Ray's gRPC servers answer a call without one UNAUTHENTICATED (and
the dashboard serves /api/authentication_mode to anyone).

Everything here runs before `ray.init`, so a refusal is one line and exit 2.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import stat
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tuner.cluster import _ray_internals, tls
from tuner.config import ConfigError
from tuner.errors import warn

# Set by scripts/submit.sh in the job's runtime env: the directory a relative `output` means
# (the job itself runs in a temporary copy of it) and the machine it is on.
SUBMIT_DIR, SUBMIT_HOST = "TUNER_SUBMIT_DIR", "TUNER_SUBMIT_HOST"
TOKEN_HELP = (
    "put the cluster's token in ~/.ray/auth_token, or point RAY_AUTH_TOKEN_PATH at it "
    "(scripts/cluster.sh prints the path it uses)"
)
INSECURE_HELP = (
    "anyone who can reach it can run code there (CVE-2023-48022); start it with token "
    "authentication (scripts/cluster.sh start does), or pass --allow-insecure-cluster"
)
TLS_HELP = (
    "set RAY_USE_TLS=1 and RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY, RAY_TLS_CA_CERT to a "
    "certificate and key its CA signed and that CA's certificate (for a cluster of "
    '`python -m tuner cluster start --tls`: eval "$(python -m tuner cluster env)")'
)
PROBE_TIMEOUT_S = 10.0
LOOPBACK = "127.0.0.1"  # where every socket of a local Ray or cluster of ours listens
# Read by Ray when it is imported: 0 keeps a loopback node address (ray._private.ray_constants).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def in_ray_job() -> bool:
    """True when run as the entrypoint of `ray job submit` (the job sets this variable)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
    return (mapped or ip).is_loopback


@dataclass(frozen=True)
class Target:
    """A cluster to join: its GCS (host:port) or its Ray Client server (ray://host:port)."""

    host: str
    port: int
    client: bool

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"ray://{self.hostport}" if self.client else self.hostport


def target(address: Optional[str]) -> Optional[Target]:
    """The cluster to join: --address, else the cluster of the Ray job we run in, else None.

    None means: start a private local Ray. RAY_ADDRESS alone (say, left in a shell) never
    makes a sweep started by hand join a cluster.
    """
    if not address:
        if not in_ray_job():
            return None
        address = os.environ.get("RAY_ADDRESS", "")  # the job supervisor sets the GCS address
        if not address:
            raise ConfigError("--address", "a Ray job without RAY_ADDRESS: cannot find its cluster")
    if address == "auto":
        address = _auto_address()
    client = address.startswith("ray://")
    rest = address[len("ray://") :] if client else address
    host, sep, port = rest.rpartition(":")
    if "://" in rest or not sep or not host or not port.isdigit():
        raise ConfigError(
            "--address",
            f"expected auto, host:port (the GCS) or ray://host:port, got '{address}' "
            "(submit to a dashboard http:// address with scripts/submit.sh)",
        )
    return Target(host.strip("[]"), int(port), client)


def _auto_address() -> str:
    address = os.environ.get("RAY_ADDRESS") or _ray_internals.find_bootstrap_address()
    if not address:
        raise ConfigError(
            "--address",
            "auto: no running cluster found (RAY_ADDRESS is unset and no `ray start` recorded "
            "one); for a cluster of `python -m tuner cluster start` run "
            '`eval "$(python -m tuner cluster env)"` first',
        )
    return address


def local_token() -> Optional[str]:
    """The token Ray itself would send (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path and not os.environ.get("RAY_AUTH_TOKEN"):  # Ray raises on a missing file
        try:
            readable = bool(Path(path).read_text().strip())
        except OSError:
            readable = False
        if not readable:
            raise ConfigError("RAY_AUTH_TOKEN_PATH", f"{path} is missing or empty: {TOKEN_HELP}")
    return _ray_internals.ray_token()


def tls_files() -> Optional[tls.Files]:
    """This process's TLS files when RAY_USE_TLS is on (as Ray reads them), else None."""
    try:
        return tls.from_env()
    except ValueError as err:
        raise ConfigError("RAY_USE_TLS", str(err)) from None


def probe(t: Target, token: Optional[str], tls_with: Optional[tls.Files] = None) -> Optional[list[str]]:
    """Call the cluster (with `token`, or without; over TLS with `tls_with`): the addresses of
    its alive nodes, or None when it refuses the call for want of a valid token."""
    import grpc

    try:
        if t.client:
            return _ray_internals.client_nodes(t.hostport, _metadata(token), PROBE_TIMEOUT_S, _read(tls_with))
        return [n.node_manager_address for n in gcs_nodes(t, token, tls_with)]
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            return None
        raise ConfigError("--address", _unanswered(t, err, tls_with)) from None


def _unanswered(t: Target, err: Any, tls_with: Optional[tls.Files]) -> str:
    """Why the cluster at `t` gave no answer, in one line: not there, or TLS on one side only,
    or certificates the other side does not trust."""
    speaks = tls.speaks_tls(t.host, t.port)
    if tls_with is None and speaks:
        return f"the Ray cluster at {t} speaks TLS and this process does not: {TLS_HELP}"
    if tls_with is not None and speaks:
        return (
            f"the Ray cluster at {t} and this process do not accept each other's TLS certificates: "
            f"RAY_TLS_CA_CERT ({tls_with.ca}) must be the cluster's CA, and RAY_TLS_SERVER_CERT "
            "a certificate that CA signed"
        )
    if tls_with is not None and _listening(t):
        return f"the Ray cluster at {t} does not speak TLS, and RAY_USE_TLS is on here: unset it"
    return f"no Ray cluster answers at {t} ({err.code().name.lower()}); is it running?"


def _listening(t: Target) -> bool:
    try:
        socket.create_connection((t.host, t.port), timeout=PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def gcs_nodes(t: Target, token: Optional[str], tls_with: Optional[tls.Files] = None) -> list[Any]:
    """The GCS's alive nodes (GcsNodeInfo messages); raises grpc.RpcError."""
    return _ray_internals.gcs_alive_nodes(t.hostport, _metadata(token), PROBE_TIMEOUT_S, _read(tls_with))


def _read(files: Optional[tls.Files]) -> Optional[tuple[bytes, bytes, bytes]]:
    return files.read() if files is not None else None


def _metadata(token: Optional[str]) -> Optional[list[tuple[str, str]]]:
    return [("authorization", f"Bearer {token}")] if token else None


def require_safe(where: str, loopback_only: bool, allow_insecure: bool) -> None:
    """Refuse a cluster without authentication that other machines can reach."""
    if loopback_only:
        return
    if not allow_insecure:
        raise ConfigError("--address", f"the Ray cluster at {where} has no authentication: {INSECURE_HELP}")
    warn(f"the Ray cluster at {where} has no authentication (--allow-insecure-cluster)")


def check(t: Target, allow_insecure: bool = False) -> None:
    """Make sure joining `t` is safe and that `ray.init` will speak its authentication.

    Raises ConfigError (one line) for an unreachable cluster, a missing or rejected token,
    TLS on one side only or certificates not accepted, or an open cluster reachable from
    other machines.
    """
    files = tls_files()
    nodes = probe(t, None, files)
    if nodes is not None:  # it answered without a token: authentication is off
        # No node list (a Ray Client server may not give one) is no proof of loopback.
        loopback = is_loopback(t.host) and bool(nodes) and all(is_loopback(a) for a in nodes)
        require_safe(str(t), loopback, allow_insecure)
    else:
        token = local_token()
        if token is None:
            raise ConfigError(
                "--address", f"the Ray cluster at {t} needs a token and none is set: {TOKEN_HELP}"
            )
        nodes = probe(t, token, files)
        if nodes is None:
            raise ConfigError("--address", f"the Ray cluster at {t} rejected our token: {TOKEN_HELP}")
        _speak_token_auth()
    if nodes and all(is_loopback(a) for a in nodes):
        _keep_loopback()


def _speak_token_auth() -> None:
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        _ray_internals.enable_token_auth()


def _keep_loopback() -> None:
    """Let this process reach a cluster whose nodes live at 127.0.0.1 (see _ray_internals)."""
    os.environ[LOOPBACK_ENV] = "0"
    _ray_internals.keep_loopback()


def token_path() -> Path:
    """Where Ray reads its token from (and, for a new local cluster, writes one)."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token"))


def ensure_token() -> str:
    """Where Ray will read the token from; makes one (0600) if there is none. Never prints it.

    Ray 2.60 turns token authentication on for a new local cluster and, without a token,
    writes one to ~/.ray/auth_token with the process umask (0644: any user of the machine
    could read it and join). Made here first, it is private; an existing readable one is
    named in a warning.
    """
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN environment variable"
    path = token_path()
    if path.is_file() and path.read_text().strip():
        warn_if_exposed(path)
        return str(path)
    import secrets

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # 256 bits, like `ray get-auth-token --generate`
    os.chmod(path, 0o600)  # O_CREAT's mode applies to a new file only
    return str(path)


def warn_if_exposed(path: Path) -> bool:
    """Warn (with the chmod to run) when a secret file (a token, a private key) can be read by
    other users of this machine; whether it can."""
    try:
        exposed = bool(path.stat().st_mode & 0o077)
    except OSError:  # gone: nothing to expose
        return False
    if exposed:
        warn(f"{path} can be read by other users of this machine: chmod 600 {path}")
    return exposed


def prepare_local() -> dict[str, Any]:
    """Before `ray.init` starts a private local Ray: its token private, its sockets on loopback.

    Returns the extra `ray.init` arguments. With the node address 127.0.0.1 every server the
    embedded Ray starts (GCS, raylet, object manager, the agents and the Prometheus
    `/metrics` endpoints of the dashboard, agent and autoscaler) binds loopback, not every
    interface (ray/dashboard/head.py, reporter_agent.py: "is_localhost(ip)"); the address
    itself is one of _ray_internals.local_init_options.
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "disabled":
        ensure_token()
    _keep_loopback()
    os.environ[RAY_TMPDIR] = private_temp_dir()
    return {}


RAY_TMPDIR = "RAY_TMPDIR"  # where Ray makes its temporary directory, ray/ (default: $TMPDIR or /tmp)


def private_temp_dir() -> str:
    """A directory only this user can enter, for a private local Ray's temporary directory
    (`<it>/ray/session_*`: sockets, logs, runtime envs), as `tuner cluster start` keeps its own.

    Ray makes every directory of its own world-writable (ray/_common/utils.py,
    try_to_create_directory: chmod 0777) and its logs 0644, so what it logs (the runtime envs
    its agent sets up, the command lines of its processes) can be read by every user of the
    machine unless a directory above is closed to them: this one, `tuner-<uid>` under
    $RAY_TMPDIR (or where Ray would put `ray/`), mode 0700. Where that name is taken by
    something not ours (another user made it first), a fresh one is made instead."""
    linux = sys.platform.startswith("linux")
    base = os.environ.get(RAY_TMPDIR) or (tempfile.gettempdir() if linux else "/tmp")
    if is_private_temp_dir(base):
        return base  # (chosen before: by this process for an earlier Ray, or the one that started it)
    path = os.path.join(base, f"tuner-{os.getuid()}")
    try:
        os.makedirs(base, exist_ok=True)  # (as Ray would make it)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:  # a base we cannot write: Ray would fail there too, with its own message
        return base
    if os.path.isdir(path) and not os.path.islink(path) and os.stat(path).st_uid == os.getuid():
        os.chmod(path, 0o700)  # (ours: closed again if it was opened)
        return path
    return tempfile.mkdtemp(prefix="tuner-", dir=base)


def is_private_temp_dir(path: str) -> bool:
    """Whether `path` is a directory `private_temp_dir` made (its name, its mode)."""
    return os.path.basename(path).startswith("tuner-") and _private(path)


def _private(path: str) -> bool:
    """A directory of this user's that no other user can enter."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def dashboard_auth(url: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """The dashboard's authentication mode ("token" or "disabled"); it answers anyone."""
    body = _get_json(url.rstrip("/") + "/api/authentication_mode", None, timeout)
    return str(body.get("authentication_mode", "unknown"))


def dashboard_status(url: str, token: Optional[str], timeout: float = PROBE_TIMEOUT_S) -> int:
    """HTTP status of an authenticated dashboard call (200, or 401/403 when refused)."""
    try:
        _get_json(url.rstrip("/") + "/api/version", token, timeout)
        return 200
    except urllib.error.HTTPError as err:
        return err.code


def dashboard_nodes(url: str, token: Optional[str], timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """Addresses of the alive nodes, from the dashboard's state API."""
    body = _get_json(url.rstrip("/") + "/api/v0/nodes?limit=1000", token, timeout)
    rows = body.get("data", {}).get("result", {}).get("result", [])
    return [r["node_ip"] for r in rows if r.get("state") == "ALIVE"]


def _get_json(url: str, token: Optional[str], timeout: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
        return json.loads(r.read().decode() or "{}")


def output_base(output: str) -> str:
    """Where a relative `output` was meant, for a driver run by `ray job submit`.

    The job runs in a temporary copy of its working directory (deleted with the cluster);
    scripts/submit.sh says which directory the copy came from.
    """
    if "://" in output or os.path.isabs(os.path.expanduser(output)) or not in_ray_job():
        return output
    submit_dir, host = os.environ.get(SUBMIT_DIR), os.environ.get(SUBMIT_HOST)
    if submit_dir and host == socket.gethostname() and os.path.isdir(submit_dir):
        return os.path.join(submit_dir, output)
    where = f"{host}:{submit_dir}" if submit_dir else "a directory this driver cannot see"
    warn(
        f"output '{output}' is relative and this job came from {where}: results stay in the "
        "job's temporary copy of its working directory, which Ray deletes with the cluster; "
        "use an absolute path on shared storage or object storage (s3://)"
    )
    return output


def storage_warning(storage: str, nodes: list[dict[str, Any]]) -> Optional[str]:
    """A warning when a local `storage` path would leave results on other machines."""
    if "://" in storage:
        return None
    alive = [n for n in nodes if n.get("Alive")]
    away = [n for n in alive if not _on_this_host(n)]
    if not away:
        return None
    return (
        f"{len(away)} of {len(alive)} nodes are on other machines and output {storage} is a "
        "local path: Ray (>= 2.7) does not copy trial results between nodes, so trials that "
        "run there leave their results there unless the path is shared by every node; use "
        "object storage (s3://) or a shared file system"
    )


def _on_this_host(node: dict[str, Any]) -> bool:
    # Every node of a one-machine cluster may be 127.0.0.1: compare the machine's name too.
    if node.get("NodeManagerHostname") != socket.gethostname():
        return False
    address = str(node.get("NodeManagerAddress", ""))
    return is_loopback(address) or address in _local_addresses()


def _local_addresses() -> set[str]:
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
