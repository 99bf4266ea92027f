"""Ray's private API behind a version gate (tuner/cluster/_ray_internals.py).

The canary: every private name tuner uses exists in the installed Ray, as it was when checked
(no Ray is started). The gate: on another Ray, or with TUNER_RAY_FALLBACKS=1, the public
fallbacks are taken. A sweep, its Ctrl-C and its resume with the fallbacks forced are in
tests/test_resume.py; a local Ray on loopback with them in tests/test_local_ray.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tuner.cluster import _ray_internals, submit

# (module, attribute path) of every private name _ray_internals uses.
PRIVATE = [
    ("ray._private.services", "find_bootstrap_address"),
    ("ray._private.services", "resolve_ip_for_localhost"),
    ("ray._raylet", "AuthenticationTokenLoader.instance"),
    ("ray._raylet", "AuthenticationTokenLoader.has_token"),
    ("ray._raylet", "AuthenticationTokenLoader.get_raw_token"),
    ("ray._raylet", "Config.health_check_failure_threshold"),
    ("ray._private.authentication.authentication_token_setup", "_enable_token_auth"),
    ("ray._private.ray_constants", "ENABLE_RAY_CLUSTER"),
    ("ray._private.ray_constants", "SETUP_WORKER_FILENAME"),
    ("ray._private.ray_constants", "DASHBOARD_CLIENT_MAX_SIZE"),
    ("ray._private.ray_constants", "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"),
    ("ray._private.ray_constants", "get_runtime_env_default_excludes"),
    ("ray._private.runtime_env.packaging", "_dir_travel"),
    ("ray._private.runtime_env.packaging", "_get_excludes"),
    ("ray._private.state", "state.get_cluster_config"),
    ("ray._private.node", "Node.start_api_server"),
    ("ray._private.node", "Node.start_log_monitor"),
    ("ray._private.node", "Node.start_monitor"),
    ("ray._private.worker", "_global_node"),
    ("ray.air._internal.usage", "tag_callbacks"),
    ("ray.tune.execution.class_cache", "ENV_VARS_TO_PROPAGATE"),
    ("ray.tune.execution.class_cache", "DEFAULT_ENV_VARS"),
    ("ray.core.generated.gcs_pb2", "GcsNodeInfo.ALIVE"),
    ("ray.core.generated.gcs_service_pb2", "GetAllNodeInfoRequest"),
    ("ray.core.generated.gcs_service_pb2_grpc", "NodeInfoGcsServiceStub"),
    ("ray.core.generated.ray_client_pb2", "ClusterInfoRequest"),
    ("ray.core.generated.ray_client_pb2", "ClusterInfoType.PING"),
    ("ray.core.generated.ray_client_pb2", "ClusterInfoType.NODES"),
    ("ray.core.generated.ray_client_pb2_grpc", "RayletDriverStub"),
]


def _get(module: str, path: str) -> object:
    obj: object = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("module, path", PRIVATE, ids=[f"{m}.{p}" for m, p in PRIVATE])
def test_every_private_name_exists_in_the_installed_ray(module: str, path: str) -> None:
    _get(module, path)


def test_tunes_trial_actors_get_no_credential_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune's own class cache (what creates every trial actor) builds a runtime env without the
    AWS credentials of the environment, and still with the other names it hands on (no Ray is
    started: the runtime env is an option of the actor class)."""
    from ray.tune.execution.class_cache import _ActorClassCache

    for name in _ray_internals.CREDENTIAL_ENV:
        monkeypatch.setenv(name, f"secret-{name}")
    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")  # (one Tune hands on: not a secret)
    assert _ray_internals.credentials_stay_home()

    class Trainable:
        pass

    env_vars = _ActorClassCache().get(Trainable)._default_options["runtime_env"]["env_vars"]
    assert not any(v.startswith("secret-") for v in env_vars.values()), env_vars
    assert env_vars.get("RAY_CHDIR_TO_TRIAL_DIR") == "0"


def test_tunes_trial_actors_get_no_runtime_env_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing in the environment for Tune to hand on, a trial actor's class has an empty
    runtime env (Tune's default adds PL_DISABLE_FORK to every one), so it can take a worker Ray
    started ahead; a name Tune hands on still makes one."""
    from ray.tune.execution import class_cache

    # Tune's own default (an earlier sweep in this process may have emptied it already)
    monkeypatch.setattr(class_cache, "DEFAULT_ENV_VARS", {"PL_DISABLE_FORK": "1"})
    for name in class_cache.ENV_VARS_TO_PROPAGATE:
        monkeypatch.delenv(name, raising=False)

    class Trainable:
        pass

    assert class_cache._ActorClassCache().get(Trainable)._default_options["runtime_env"] != {}
    assert _ray_internals.plain_trial_actors()
    assert class_cache._ActorClassCache().get(Trainable)._default_options["runtime_env"] == {}
    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")
    options = class_cache._ActorClassCache().get(Trainable)._default_options
    assert options["runtime_env"] == {"env_vars": {"RAY_CHDIR_TO_TRIAL_DIR": "0"}}


def test_the_files_counted_for_a_job_are_those_ray_packs(tmp_path: Path) -> None:
    """What `tuner submit` counts (working_dir_files) is what Ray zips for the job, file for
    file and byte for byte: its zip stores them uncompressed, and the ignore files and
    excludes leave out the same files."""
    import zipfile

    from ray._private.runtime_env import packaging

    root = tmp_path / "project"
    made = {"a.py": 10, "data/x.bin": 5000, "data/skip.tmp": 7, "logs/l.txt": 3, ".git/c": 9}
    for name, size in made.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(bytes(size))
    (root / ".gitignore").write_text("*.tmp\n")
    (root / "data" / ".rayignore").write_text("nothing-here\n")
    files = _ray_internals.working_dir_files(str(root), ["logs/"])
    assert files is not None
    zipped = tmp_path / "p.zip"
    packaging.create_package(str(root), zipped, include_gitignore=True, excludes=["logs/", ".git"])
    with zipfile.ZipFile(zipped) as z:
        packed = {i.filename: i.compress_size for i in z.infolist() if not i.is_dir()}
    assert dict(files) == packed == {"a.py": 10, "data/x.bin": 5000, ".gitignore": 6, "data/.rayignore": 13}
    assert 0 <= submit.packed_size(files) - zipped.stat().st_size < 100  # headers, near enough


def test_the_private_behaviour_relied_on_is_as_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed Ray is the checked one, and what tuner counts on beyond names holds."""
    import ray
    from ray._private import node, ray_constants
    from ray.tune.schedulers import AsyncHyperBandScheduler

    assert _ray_internals.ray_version() == ray.__version__
    assert ray.__version__.startswith(_ray_internals.RAY_CHECKED + "."), "re-check _ray_internals"
    init = inspect.getsource(ray.init)
    assert 'kwargs.pop("_node_ip_address"' in init and 'kwargs.pop("_system_config"' in init
    source = inspect.getsource(node.Node)
    assert "self._webui_url" in source  # what the deferred start of the API server sets
    assert "self.head = " in source and "self.all_processes: dict" in source  # read by node_process_ids
    assert "self.start_log_monitor()" in source  # the one start no_log_monitor skips
    assert "self.start_monitor()" in source  # the one start no_autoscaler_monitor skips
    # ended_sessions: a head's session is named after the process that started it
    assert 'self._session_name = f"session_{date_str}_{os.getpid()}"' in source
    # worker_command: the set-up script joined to Ray's workers directory (an absolute path
    # stays whole), first in the raylet's worker command, default_worker.py beside it
    assert "ray_constants.SETUP_WORKER_FILENAME" in source
    workers = Path(node.__file__).parent / "workers"
    assert (workers / ray_constants.SETUP_WORKER_FILENAME).is_file() and (
        workers / "default_worker.py"
    ).is_file()
    from ray._private import services

    start = " ".join(inspect.getsource(services.start_raylet).split())
    assert "start_worker_command = ( [ sys.executable, setup_worker_path, ]" in start
    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    asha = AsyncHyperBandScheduler(metric="m", mode="max", max_t=9, grace_period=1, reduction_factor=3)
    milestones = [m for m, rung in _ray_internals.asha_rungs(asha) if isinstance(rung, dict)]
    assert milestones == [9, 3, 1], milestones
    for name in _ray_internals._INIT_MODULES:
        importlib.import_module(name)
    # no_usage_report: the report URL read from the environment where the report is sent
    from ray._common.usage import usage_lib

    monkeypatch.setenv("RAY_USAGE_STATS_REPORT_URL", "")
    assert usage_lib._usage_stats_report_url() == ""
    head = importlib.util.find_spec("ray.dashboard.modules.usage_stats.usage_stats_head")
    assert head is not None and head.origin is not None  # (read, not imported: the dashboard's imports)
    disabled = Path(head.origin).read_text().split("def _report_disabled_usage_sync", 1)[1]
    assert "report_usage_data(ray_usage_lib._usage_stats_report_url(), data)" in disabled.split("def ", 1)[0]
    # `ray start`'s entry point, read from its source: importing it imports Ray Serve (seconds).
    spec = importlib.util.find_spec("ray.scripts.scripts")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


def test_the_public_fallbacks_are_read_where_we_set_them() -> None:
    """Tune reads TUNE_DISABLE_SIGINT_HANDLER (tuner handles Ctrl-C itself); Ray's config
    reads RAY_health_check_failure_threshold (the fallback of `_system_config`)."""
    import ray.tune.tune

    assert "TUNE_DISABLE_SIGINT_HANDLER" in inspect.getsource(ray.tune.tune)
    probe = "import ray._raylet as r; print(r.Config.health_check_failure_threshold())"
    env = {**os.environ, "RAY_health_check_failure_threshold": "17"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "17", out.stderr


def _private_uses(path: Path) -> list[str]:
    """Where a module imports Ray's private modules, passes ray.init's private arguments, or
    reads the words of a Tune log line."""
    private = ("ray._private", "ray._raylet", "ray.core.generated", "ray.air._internal")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            names = []
        uses = [n for n in names if n.startswith(private)]
        if isinstance(node, ast.keyword) and node.arg in ("_system_config", "_node_ip_address"):
            uses.append(node.arg)
        if isinstance(node, ast.Constant) and "Stop signal received" in str(node.value):
            uses.append(node.value)
        found += [f"{path.name}:{node.lineno}: {use}" for use in uses]
    return found


def test_no_module_outside_ray_internals_uses_rays_private_api() -> None:
    outside = [p for p in sorted((ROOT / "tuner").rglob("*.py")) if p.name != "_ray_internals.py"]
    assert [use for p in outside for use in _private_uses(p)] == []
    assert _private_uses(ROOT / "tuner" / "cluster" / "_ray_internals.py")  # (the scan sees them)


def test_the_gate_takes_the_fallbacks_on_another_ray_or_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_ray_internals.FALLBACKS_ENV, raising=False)
    monkeypatch.delenv("RAY_health_check_failure_threshold", raising=False)
    assert _ray_internals.checked()
    assert set(_ray_internals.local_init_options(20)) == {"_node_ip_address", "_system_config"}
    for forced in ("1", "yes"):
        monkeypatch.setenv(_ray_internals.FALLBACKS_ENV, forced)
        assert not _ray_internals.checked()
    monkeypatch.setenv(_ray_internals.FALLBACKS_ENV, "0")
    assert _ray_internals.checked()
    monkeypatch.setattr(_ray_internals, "ray_version", lambda: "2.61.0")
    assert not _ray_internals.checked()
    # Each function then takes its public way.
    assert _ray_internals.local_init_options(20) == {}
    assert os.environ["RAY_health_check_failure_threshold"] == "20"
    assert _ray_internals.upload_limit() is None and _ray_internals.working_dir_files(".", []) is None
    assert _ray_internals.node_process_ids() == [] and _ray_internals.find_bootstrap_address() is None
    assert _ray_internals.autoscaler_node_groups() is None and not _ray_internals.imports_beside_init()
    assert list(_ray_internals.asha_rungs(object())) == []
    with _ray_internals.api_server_after_init(), _ray_internals.no_autoscaler_monitor():
        pass
    monkeypatch.setenv("RAY_AUTH_TOKEN", " t0ken \n")
    assert _ray_internals.ray_token() == "t0ken"
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    # (set first so that monkeypatch puts it back as it was: a RAY_AUTH_MODE=token left in
    # this process would make a later ray.init skip refreshing Ray's cached auth mode, and its
    # client would then send no token to a GCS that wants one)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_AUTH_MODE")
    _ray_internals.enable_token_auth()
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_the_fallback_token_is_read_where_ray_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token (Ray's
    token authentication guide, in that order)."""
    monkeypatch.setenv(_ray_internals.FALLBACKS_ENV, "1")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert _ray_internals.ray_token() is None
    home = tmp_path / ".ray" / "auth_token"
    home.parent.mkdir()
    home.write_text("from-home\n")
    assert _ray_internals.ray_token() == "from-home"
    named = tmp_path / "named"
    named.write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(named))
    assert _ray_internals.ray_token() == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert _ray_internals.ray_token() == "from-env"


def test_a_private_use_without_a_fallback_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster probe (generated gRPC stubs) on a Ray without them: a ConfigError, which the
    CLI prints as one line (exit 2), naming the function and the checked Ray version."""
    import ray.core.generated as generated

    monkeypatch.delattr(generated, "gcs_service_pb2", raising=False)
    monkeypatch.setitem(sys.modules, "ray.core.generated.gcs_service_pb2", None)  # import fails
    with pytest.raises(_ray_internals.RayMismatch) as caught:
        _ray_internals.gcs_alive_nodes("127.0.0.1:1", None, 1.0)
    line = str(caught.value)
    assert line.startswith("ray: gcs_alive_nodes") and "checked against Ray 2.60" in line
    assert "\n" not in line
