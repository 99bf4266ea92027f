"""Every use of Ray's private API, in one place: what to re-check on a Ray upgrade.

Each function names the Ray source it relies on, as of the Ray version it was checked against
(RAY_CHECKED). Callers get plain values and never import `ray._private`, `ray._raylet`,
`ray.core.generated`, pass ray.init's private arguments or read a scheduler's private
attributes themselves.

The private shortcuts are taken only on the checked Ray (`checked()`); on any other version,
or with TUNER_RAY_FALLBACKS=1, each function takes its public fallback instead: a local Ray
started plainly (its settings through the environment, its API server first, as Ray does),
Ray Tune imported in order after `ray.init` rather than beside it, Ray shut down gracefully
at exit, nothing skipped. The fallbacks cost seconds of start-up and exit, never a result.
A function with no public equivalent (the cluster probes) fails in one line that names it.
tests/test_ray_internals.py checks that every private name used here exists in the installed
Ray, and a sweep, its Ctrl-C and its resume with the fallbacks forced.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Optional

from tuner.errors import ConfigError

RAY_CHECKED = "2.60"  # every private use below was checked against this Ray version
FALLBACKS_ENV = "TUNER_RAY_FALLBACKS"  # set (not 0): the public fallbacks, whatever Ray is installed
LOOPBACK = "127.0.0.1"


@functools.cache
def ray_version() -> str:
    """The installed Ray's version, read without importing Ray ("" when it is missing)."""
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return ""


def checked() -> bool:
    """Whether the private shortcuts may be taken: the installed Ray is the one they were
    checked against, and TUNER_RAY_FALLBACKS does not ask for the public fallbacks."""
    if os.environ.get(FALLBACKS_ENV, "").strip() not in ("", "0"):
        return False
    version = ray_version()
    return version == RAY_CHECKED or version.startswith(RAY_CHECKED + ".")


class RayMismatch(ConfigError):
    """A private Ray function tuner needs, with no public equivalent, is not what it was: one
    line (exit 2) naming it, before anything starts."""


def _mismatch(what: str, err: BaseException) -> RayMismatch:
    return RayMismatch(
        "ray",
        f"{what} is Ray's private API, checked against Ray {RAY_CHECKED}; this Ray "
        f"({ray_version() or 'missing'}) does not have it as it was ({type(err).__name__}: {err})",
    )


def local_init_options(health_check_failures: int) -> dict[str, Any]:
    """ray.init's private arguments for a private local Ray: its node on loopback,
    `health_check_failures` missed health checks (3 s apart) before the GCS declares it dead,
    and idle workers started ahead for the driver only where trial actors can take them.

    Ray starts one idle worker per CPU when the first driver connects (its
    `prestart_worker_first_driver`). With the private shortcuts, trial actors have no
    runtime_env of their own (`plain_trial_actors`) and take those workers: the first trials'
    actors start together, beside the driver's own start, as soon as Tune asks for them
    (BENCHMARKS.md, "Workers started ahead"). With the fallbacks Tune gives each trial actor a
    runtime_env of its own (ray/tune/execution/class_cache.py), so every trial actor, and every
    DDP rank it starts, gets a worker started for it, and idle workers would cost a `tuner sweep`
    of debug.yaml 0.4 s of its 6.5 and 0.8 CPU-seconds for nothing: none are started.

    Checked Ray: `_node_ip_address` and `_system_config` (ray/_private/worker.py: init).
    Fallback: no private arguments; the same settings go through the environment the GCS and
    raylet read at start: RAY_health_check_failure_threshold and RAY_prestart_worker_first_driver
    (every Ray system setting reads its RAY_<name>), and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    (set by join.prepare_local before Ray is imported), under which Ray takes 127.0.0.1 as the
    node's address; the caller then checks that it did (`node_ip`).
    """
    settings: dict[str, Any] = {"health_check_failure_threshold": health_check_failures}
    if checked():
        return {"_node_ip_address": LOOPBACK, "_system_config": settings}
    settings["prestart_worker_first_driver"] = False
    for name, value in settings.items():
        os.environ.setdefault(f"RAY_{name}", str(int(value)))
    return {}


def node_ip() -> str:
    """The address this driver's Ray node took (public: ray.util.get_node_ip_address)."""
    import ray.util

    return str(ray.util.get_node_ip_address())


def find_bootstrap_address() -> Optional[str]:
    """The GCS address a `ray start` on this machine recorded (Ray 2.60:
    ray._private.services.find_bootstrap_address), or None. Fallback: None (`--address auto`
    then needs RAY_ADDRESS)."""
    if not checked():
        return None
    from ray._private.services import find_bootstrap_address as find

    return find(None)


def ray_token() -> Optional[str]:
    """The token Ray itself would send (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token),
    whatever RAY_AUTH_MODE says (Ray 2.60: ray._raylet.AuthenticationTokenLoader). Fallback:
    the same three places, read here in the order Ray's documentation gives."""
    if not checked():
        return _documented_token()
    from ray._raylet import AuthenticationTokenLoader

    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token(ignore_auth_mode=True):
        return None
    return loader.get_raw_token(ignore_auth_mode=True)


def _documented_token() -> Optional[str]:
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def enable_token_auth() -> None:
    """Make this process's `ray.init` send the token (Ray 2.60:
    ray._private.authentication.authentication_token_setup._enable_token_auth). ray.init turns
    it on by itself only for clusters it finds on its own, never for an explicit address
    (ray/_private/worker.py, "address in (None, 'auto')"). Fallback: RAY_AUTH_MODE=token, the
    documented switch, for this process and what it starts."""
    if not checked():
        os.environ["RAY_AUTH_MODE"] = "token"
        return
    from ray._private.authentication.authentication_token_setup import _enable_token_auth

    _enable_token_auth()


def keep_loopback() -> None:
    """Let this process reach a cluster whose nodes live at 127.0.0.1 (Ray 2.60:
    ray._private.ray_constants.ENABLE_RAY_CLUSTER), even if Ray was imported before
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set. On Linux Ray rewrites a loopback address to
    the machine's own (ray/_private/services.py: resolve_ip_for_localhost), where a
    loopback-only cluster does not listen; it keeps loopback only where multi-node clusters
    are "unsupported". Fallback: that environment variable alone (the caller sets it), which
    Ray reads when it is imported."""
    if not checked():
        return
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def ray_start_on_loopback(argv: list[str]) -> None:
    """`ray start ARGV` keeping a loopback --node-ip-address (Ray 2.60: patches
    ray._private.ray_constants.ENABLE_RAY_CLUSTER and ray._private.services.
    resolve_ip_for_localhost in this process only, then runs ray.scripts.scripts.main).

    The node's processes inherit RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and keep loopback; with
    it, though, `ray start --address` refuses to add a node: hence ENABLE_RAY_CLUSTER here.
    """
    try:
        import ray._private.ray_constants as ray_constants
        import ray._private.services as services
        from ray.scripts.scripts import main
    except ImportError as err:
        raise _mismatch("ray_start_on_loopback (ray._private.services)", err) from None

    ray_constants.ENABLE_RAY_CLUSTER = True
    services.resolve_ip_for_localhost = lambda host: host
    sys.argv = ["ray", "start", *argv]
    main()


def autoscaler_node_groups() -> Optional[list[tuple[dict[str, float], int]]]:
    """The (resources, max nodes) of each node type an autoscaler may add, or None on a
    fixed-size cluster (Ray 2.60: ray._private.state.state.get_cluster_config()). Any failure
    means "fixed", which at worst refuses a request the autoscaler could have served; so does
    the fallback."""
    if not checked():
        return None
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - an absent or changed private API: treat as fixed
        return None
    if config is None or not config.node_group_configs:
        return None
    return [(dict(g.resources), int(g.max_count)) for g in config.node_group_configs if g.max_count != 0]


def asha_rungs(scheduler: Any) -> Iterator[tuple[float, dict[str, float]]]:
    """(milestone, {trial_id: value * metric_op}) of every rung of an AsyncHyperBandScheduler,
    from the top down (Ray 2.60: `_brackets[i]._rungs`; tests/test_bohb.py checks it).
    Fallback: no rungs (a resumed sweep's rungs start empty, as a new sweep's do)."""
    if not checked():
        return
    for bracket in scheduler._brackets:
        yield from bracket._rungs


TlsFiles = Optional[tuple[bytes, bytes, bytes]]  # (certificate chain, private key, CA certificate)


def _channel(hostport: str, tls: TlsFiles) -> Any:
    """A gRPC channel to a Ray server: plain, or mutual TLS with `tls` as Ray's own
    channels under RAY_USE_TLS (ray/_private/grpc_utils.py, init_grpc_channel)."""
    import grpc

    if tls is None:
        return grpc.insecure_channel(hostport)
    cert, key, ca = tls
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    return grpc.secure_channel(hostport, credentials)


def gcs_alive_nodes(
    hostport: str, metadata: Optional[list[tuple[str, str]]], timeout: float, tls: TlsFiles = None
) -> list[Any]:
    """The GCS's alive nodes (GcsNodeInfo messages) over its gRPC API (Ray 2.60:
    ray.core.generated NodeInfoGcsService.GetAllNodeInfo); raises grpc.RpcError."""
    try:
        from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError as err:
        raise _mismatch("gcs_alive_nodes (ray.core.generated.gcs_service_pb2)", err) from None

    with _channel(hostport, tls) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        reply = stub.GetAllNodeInfo(
            gcs_service_pb2.GetAllNodeInfoRequest(), timeout=timeout, metadata=metadata
        )
    return [n for n in reply.node_info_list if n.state == gcs_pb2.GcsNodeInfo.ALIVE]


def client_nodes(
    hostport: str, metadata: Optional[list[tuple[str, str]]], timeout: float, tls: TlsFiles = None
) -> list[str]:
    """Node addresses from a Ray Client server (Ray 2.60: ray.core.generated RayletDriver.
    ClusterInfo); raises grpc.RpcError when the ping is refused, and gives [] (unknown) where
    the server will not list its nodes."""
    import json

    import grpc

    try:
        from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc
    except ImportError as err:
        raise _mismatch("client_nodes (ray.core.generated.ray_client_pb2)", err) from None

    kinds = ray_client_pb2.ClusterInfoType
    with _channel(hostport, tls) as channel:
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        ping = ray_client_pb2.ClusterInfoRequest(type=kinds.PING)
        stub.ClusterInfo(ping, timeout=timeout, metadata=metadata)  # raises if refused
        try:
            request = ray_client_pb2.ClusterInfoRequest(type=kinds.NODES)
            reply = stub.ClusterInfo(request, timeout=timeout, metadata=metadata)
            return [n["NodeManagerAddress"] for n in json.loads(reply.json) if n.get("Alive")]
        except (grpc.RpcError, ValueError, KeyError, TypeError):
            return []


@contextlib.contextmanager
def api_server_after_init() -> Iterator[None]:
    """`ray.init` inside starts its API server process after it has started everything
    else, not before the raylet (Ray 2.60: ray._private.node.Node.start_api_server, called
    from start_head_processes). With `include_dashboard=False` Ray still starts the
    dashboard process (one module: usage statistics) and waits for it to publish its
    address before it starts the raylet: about 1.5 s of every sweep's start-up on 2 cores.
    Started on a thread of its own once `ray.init` returns, it comes up beside the first
    trials instead. (Never started, the dashboard agent would log a traceback every second,
    looking for its address.) The thread stays: Ray binds the process to the thread that
    started it (PR_SET_PDEATHSIG). Fallback: Ray starts it as it does, first."""
    if not checked():
        yield
        return
    from ray._private import node

    original = node.Node.start_api_server
    deferred: list[tuple[Any, dict[str, Any]]] = []

    def later(self: Any, **kwargs: Any) -> None:
        self._webui_url = None
        deferred.append((self, kwargs))

    node.Node.start_api_server = later  # type: ignore[method-assign]
    try:
        yield
    finally:
        node.Node.start_api_server = original  # type: ignore[method-assign]
    for head, kwargs in deferred:
        threading.Thread(target=_start_and_stay, args=(original, head, kwargs), daemon=True).start()


@contextlib.contextmanager
def no_log_monitor() -> Iterator[None]:
    """`ray.init` inside starts no log monitor (Ray 2.60: ray._private.node.Node.
    start_log_monitor, called from start_ray_processes; `ray start --include-log-monitor`
    is the public switch, which `ray.init` lacks). Its one job on a private local Ray is to
    copy the workers' output to a driver that asked for it (`log_to_driver`), and tuner asks
    only with --verbose; the trials' output is in their trial.log. Started, it imports Ray
    and polls the session's logs for the whole sweep (~1.4 CPU-s a sweep on 2 cores).
    Fallback: Ray starts it."""
    with _not_started("start_log_monitor"):
        yield


@contextlib.contextmanager
def no_autoscaler_monitor() -> Iterator[None]:
    """`ray.init` inside starts no autoscaler monitor (Ray 2.60: ray._private.node.Node.
    start_monitor, called from start_head_processes unless RayParams.no_monitor, which
    `ray start --no-monitor` sets and `ray.init` cannot). A private local Ray is one node
    that never grows: it has nothing to scale, and no one asks what it reports (`ray
    status`); started, the monitor imports Ray and polls the GCS for the whole sweep (~0.45
    CPU-s of a sweep's start on 2 cores). Fallback: Ray starts it."""
    with _not_started("start_monitor"):
        yield


@contextlib.contextmanager
def worker_command(setup: str) -> Iterator[bool]:
    """`ray.init` inside starts a raylet whose Python workers start with the script `setup`
    (an absolute path) where Ray's own `setup_worker.py` stands (Ray 2.60: ray._private.
    ray_constants.SETUP_WORKER_FILENAME, which ray._private.node.Node.__init__ joins to Ray's
    workers directory, an absolute path staying whole, and services.start_raylet puts first
    in the raylet's --python_worker_command, followed by default_worker.py and its
    arguments). Yields whether it did; tuner.cluster.worker_launch falls back to Ray's own
    script for anything it does not serve. Fallback: Ray's own script (every worker starts
    cold)."""
    if not checked():
        yield False
        return
    import ray._private.ray_constants as ray_constants

    original = ray_constants.SETUP_WORKER_FILENAME
    ray_constants.SETUP_WORKER_FILENAME = setup
    try:
        yield True
    finally:
        ray_constants.SETUP_WORKER_FILENAME = original


@contextlib.contextmanager
def _not_started(method: str) -> Iterator[None]:
    """Within: ray._private.node.Node.`method` (one process it starts) does nothing. Where
    this Ray is not the checked version, nothing changes (Ray starts the process)."""
    if not checked():
        yield
        return
    from ray._private import node

    original = getattr(node.Node, method)
    setattr(node.Node, method, lambda self: None)
    try:
        yield
    finally:
        setattr(node.Node, method, original)


def _start_and_stay(start: Any, head: Any, kwargs: dict[str, Any]) -> None:
    import logging

    # A Ray shut down while this one starts (a sweep that fails at once) leaves it an error
    # line about its KV client on the console: this thread's records are not the user's.
    me = threading.get_ident()
    logging.getLogger("ray._private.services").addFilter(lambda record: record.thread != me)
    try:
        start(head, **kwargs)
    except Exception:  # noqa: BLE001 - a sweep does not need it
        return
    threading.Event().wait()


def skip_callback_usage_tag() -> None:
    """Tune's fit() no longer counts our callbacks for Ray's usage statistics (Ray 2.60:
    ray.air._internal.usage.tag_callbacks, called from ray/tune/tune.py). To count them it
    imports every integration it knows, MLflow included where MLflow is installed: 1.4-2.8 s
    of the driver's start-up for a tag. Fallback: the tag is counted."""
    if not checked():
        return
    from ray.air._internal import usage

    usage.tag_callbacks = lambda callbacks: False


# The credentials Ray Tune copies from the driver's environment into every trial actor's
# runtime_env (Ray 2.60: ray/tune/execution/class_cache.py, ENV_VARS_TO_PROPAGATE).
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")


def credentials_stay_home() -> bool:
    """Ray Tune no longer copies the driver's AWS credentials into its trial actors'
    runtime_env; whether that is so.

    Tune's `_ActorClassCache.get` puts each of ENV_VARS_TO_PROPAGATE that the driver's
    environment holds into the `env_vars` of the runtime_env it creates every trial actor
    with (and a DDP trial's rank actors inherit); the runtime env agent of every node logs
    each runtime_env it sets up, secret included, into `session_*/logs/runtime_env_agent.log`
    (0644), and the GCS keeps it with the actor. Without them a trial finds its credentials
    as every other process does: a private local Ray's workers inherit the driver's
    environment through the raylet, and a cluster's nodes read their own (an instance role,
    their environment, a job's runtime_env), as docs/how-to/cluster.md says.

    Checked Ray: `ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE`, read by `get` at each
    call, replaced by the same names without the credentials. Fallback: no public switch;
    nothing is changed and False is returned (the caller warns; the private local Ray's
    temporary directory is 0700 either way)."""
    if not checked():
        return False
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE = {
        name for name in class_cache.ENV_VARS_TO_PROPAGATE if name not in CREDENTIAL_ENV
    }
    return True


def plain_trial_actors() -> bool:
    """Tune's trial actors get no runtime_env of their own unless the driver's environment holds
    a variable Tune hands on; whether that is so.

    Tune's `_ActorClassCache.get` adds DEFAULT_ENV_VARS, `PL_DISABLE_FORK=1` (for Lightning
    1.7, ray-project/ray#28197; Lightning reads it no longer since 1.8: NVML; tuner needs 2.1),
    to the `env_vars` of every trial actor's runtime_env. A runtime_env of its own keeps an
    actor off the workers Ray starts ahead for the job (a worker serves one runtime_env) and
    sends each actor's worker through the node's runtime env agent: every trial actor waited
    for a worker started for it. With it empty a trial actor takes a worker already up (the
    private local Ray starts them ahead: `local_init_options`; a cluster's nodes do by Ray's
    default).

    Checked Ray: `ray.tune.execution.class_cache.DEFAULT_ENV_VARS`, read by `get` at each call,
    emptied. Fallback: nothing is changed and False is returned (each trial actor's worker is
    started for it, as before)."""
    if not checked():
        return False
    from ray.tune.execution import class_cache

    class_cache.DEFAULT_ENV_VARS = {}
    return True


def node_process_ids() -> list[int]:
    """Pids of the processes this driver's `ray.init` started (GCS, raylet, monitor, log
    monitor, API server; Ray 2.60: ray._private.worker._global_node.all_processes), or []
    when this process started no Ray of its own. Fallback: [] (tuner.cluster.connect.leave
    then leaves Ray to shut down gracefully at exit)."""
    if not checked():
        return []
    from ray._private import worker

    node = worker._global_node
    if node is None or not getattr(node, "head", False):
        return []
    return [info.process.pid for infos in node.all_processes.values() for info in infos]


def ended_sessions(temp_dir: str, keep: int) -> list[str]:
    """The session directories (logs, sockets, runtime environments) that private local Rays
    left in `temp_dir`/ray whose drivers have ended, all but the newest `keep` of them: Ray
    never removes a session directory. Checked Ray: ray/_private/node.py names the session
    of a head that `ray.init` starts `session_<date>_<time>_<microseconds>_<pid>`, the pid of
    the process that started it (the driver; tuner's local Ray ends with it: connect.leave,
    the raylet watching its driver). Fallback: [] (they stay, as Ray leaves them)."""
    if not checked():
        return []
    import re

    name = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+)")
    try:
        sessions = sorted(e.name for e in os.scandir(os.path.join(temp_dir, "ray")) if name.fullmatch(e.name))
    except OSError:
        return []
    ended = []
    for session in sessions[: max(0, len(sessions) - keep)]:  # (the names sort by their start)
        pid = int(name.fullmatch(session).group(1))  # type: ignore[union-attr]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            ended.append(os.path.join(temp_dir, "ray", session))
        except OSError:  # alive, someone else's
            continue
    return ended


# What `ray.init` imports on first use (Ray 2.60, listed from sys.modules before and after it).
_INIT_MODULES = (
    "ray._private.node",
    "ray._private.services",
    "ray._private.state",
    "ray._private.runtime_env.uv_runtime_env_hook",
    "ray.dashboard.optional_deps",
    "ray.autoscaler._private.cli_logger",
    "ray.autoscaler._private.util",
    "ray.autoscaler.v2.utils",
)


def imports_beside_init() -> bool:
    """Whether Ray Tune may be imported on another thread while `ray.init` runs (after
    `import_for_init`): on the checked Ray, whose imports were listed; on another, a new
    circular import between the two could fail now and then, so Tune is imported in order."""
    return checked()


def import_for_init() -> None:
    """Import, on this thread, the modules `ray.init` would import: another thread can then
    import Ray Tune while `ray.init` runs without the two meeting inside one package's
    circular imports. A module missing from another Ray is skipped (ray.init imports what
    it needs)."""
    import importlib

    for name in _INIT_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def upload_limit() -> Optional[int]:
    """The most bytes a Ray cluster's dashboard takes in one upload (a job's working directory,
    zipped); None where not checked. Checked Ray: ray_constants.DASHBOARD_CLIENT_MAX_SIZE, the
    dashboard's aiohttp client_max_size (a bigger upload is answered with HTTP 413, which
    `ray job submit` prints as a traceback). Fallback: None; the caller checks nothing."""
    if not checked():
        return None
    from ray._private import ray_constants

    return int(ray_constants.DASHBOARD_CLIENT_MAX_SIZE)


def working_dir_files(root: str, excludes: list[str]) -> Optional[list[tuple[str, int]]]:
    """The files (path inside `root`, bytes) that `ray job submit` packs into the job's
    working directory: its zip stores them uncompressed. None where not checked.

    Checked Ray: ray._private.runtime_env.packaging._zip_files, walked as it walks
    (`_dir_travel` with `_get_excludes`): .gitignore unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1,
    .rayignore at every level, the runtime env's `excludes` after
    ray_constants.get_runtime_env_default_excludes(); files only (an empty directory adds a
    name). Fallback: None; the caller checks nothing and Ray answers as it does."""
    if not checked():
        return None
    import logging
    from pathlib import Path

    from ray._private import ray_constants
    from ray._private.runtime_env import packaging

    include_gitignore = os.environ.get(ray_constants.RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"
    top = Path(root).absolute()
    every = ray_constants.get_runtime_env_default_excludes() + list(excludes)
    found: list[tuple[str, int]] = []

    def add(path: Path) -> None:
        if path.is_file():
            found.append((str(path.relative_to(top)), path.stat().st_size))

    quiet = logging.getLogger("tuner.working_dir_files")  # Ray logs which ignore files it read
    quiet.setLevel(logging.CRITICAL + 1)
    quiet.propagate = False
    excluded = [packaging._get_excludes(top, every)]
    packaging._dir_travel(top, excluded, add, include_gitignore=include_gitignore, logger=quiet)
    return found


USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"  # Ray's public switch of its usage statistics


def no_usage_report() -> dict[str, str]:
    """The environment that keeps a node started with usage statistics off
    (RAY_USAGE_STATS_ENABLED=0) from telling Ray's server that they are off: with them off, a
    node started by `ray start` still posts one report saying so to https://usage-stats.ray.io/
    when its dashboard starts (Ray 2.60: dashboard/modules/usage_stats/usage_stats_head.py,
    `_report_disabled_usage_sync`; a Ray that `ray.init` starts sends nothing). Checked Ray: its
    report URL (RAY_USAGE_STATS_REPORT_URL, read by usage_lib._usage_stats_report_url, for its
    tests) made empty, so the request fails before anything is sent (logged at debug level).
    Fallback: nothing; that one report is sent."""
    return {"RAY_USAGE_STATS_REPORT_URL": ""} if checked() else {}
