"""Shared fixtures: one Ray per test session (2 CPUs), the shipped sweep files, tmp sweeps;
and the test tiers (tests/tiers.py marks every test by what it starts)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from tests import stall, tiers

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"
DEBUG = SPACES / "debug.yaml"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help=f"the quick tier only: no Ray, no browser, nothing marked slow; a test over "
        f"{tiers.QUICK_LIMIT_S:g} CPU-s fails ({tiers.LIMIT_ENV} changes the limit)",
    )


def _runs_tests(config: pytest.Config) -> bool:
    """This process runs tests: not pytest-xdist's controller, which hands them to workers
    (`-n N`; TUNER_TEST_WORKERS of scripts/test.sh) and only relays their reports."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_configure(config: pytest.Config) -> None:
    if _runs_tests(config):
        stall.start()  # a test stuck in C code gets its native stacks printed (tests/stall.py)
        # A run begun with SIGINT ignored (a background job of a shell without job control)
        # would hand that on to every sweep it starts, and a sweep keeps an ignored stop signal
        # ignored (driver/stopping.py): the tests that Ctrl-C one need it as a terminal gives it.
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)


# When the running test began (time.monotonic()): what it waits for to settle after its work
# (processes gone, CPUs handed back) may take as long as that work took on this machine.
_TEST_BEGAN = [time.monotonic()]


def settle_s(at_least: float) -> float:
    """How long to wait for something to settle after a test's work: `at_least` seconds, or
    as long as the test has run so far, whichever is longer (a slow machine is slow at both)."""
    return max(at_least, time.monotonic() - _TEST_BEGAN[0])


# With TUNER_TEST_WINDOWS_OUT naming a file, each test appends a line to it: the pytest process,
# the test, its wall-clock start and end and that process's own CPU-s in it. With Linux process
# accounting of the same run, scripts/suite_cpu.py charges every process to its test.
WINDOWS_ENV = "TUNER_TEST_WINDOWS_OUT"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]):
    stall.mark(item.nodeid)
    _TEST_BEGAN[0] = time.monotonic()
    began, cpu = time.time(), time.process_time()
    try:
        return (yield)
    finally:
        stall.mark(None)
        if out := os.environ.get(WINDOWS_ENV):
            line = {"pid": os.getpid(), "test": item.nodeid, "t0": began, "t1": time.time()}
            line["cpu"] = round(time.process_time() - cpu, 3)
            with open(out, "a") as f:  # (one short write: the workers' lines do not interleave)
                f.write(json.dumps(line) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = _group(report.nodeid)
    _TOOK[group] = _TOOK.get(group, 0.0) + report.duration  # (setup, call and teardown)
    if getattr(report, "node", None) is not None:  # xdist's controller relays a worker's report
        return  # (the worker recorded it; a crashed worker's test is not done, and runs again)
    if report.failed:
        stall.record("failed", report.nodeid)
    if report.when == "teardown":
        stall.record("done", report.nodeid)


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if done := stall.done_before():  # the tests a stalled process of this run had finished
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in done])
        items[:] = [i for i in items if i.nodeid not in done]
    tiers.mark(items)
    uses = {i.nodeid: "ns_cluster" for i in items if "ns_cluster" in getattr(i, "fixturenames", ())}
    uses.update({i.nodeid: "gpu" for i in items if i.get_closest_marker("gpu")})
    if strays := [f"{nodeid} ({group})" for nodeid, group in uses.items() if _group(nodeid) != group]:
        raise pytest.UsageError(f"add their files to ONE_WORKER in tests/conftest.py: {strays}")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: see _heavy_groups_first
        items[:] = _heavy_groups_first(items)
    if config.getoption("--quick"):
        keep = [i for i in items if tiers.quick(i)]
        config.hook.pytest_deselected(items=[i for i in items if not tiers.quick(i)])
        items[:] = keep
        tiers.import_shared()


# Files whose tests run in one pytest-xdist worker, one after another: those of the ns_cluster
# fixture (that cluster, two namespaced nodes and an S3 server, starts once) and those marked
# gpu (they measure and fill the one GPU: never two at once).
ONE_WORKER = {
    "tests/test_cluster_faults.py": "ns_cluster",
    "tests/test_cluster_s3.py": "ns_cluster",
    "tests/test_nscluster.py": "ns_cluster",
    "tests/test_gpu_any_training.py": "gpu",
    "tests/test_gpu_cuda.py": "gpu",
}


def _group(nodeid: str) -> str:
    """Which tests one pytest-xdist worker runs together: a file's (its module's fixtures, such
    as test_cluster.py's two-node cluster, start once), or ONE_WORKER's group of files."""
    path = nodeid.split("::", 1)[0]
    return ONE_WORKER.get(path, path)


def _heavy_groups_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The longest groups first, each in its own order: the workers hand out groups in this
    order, and a long one started last would leave one worker running it alone at the end.
    A group's length is its seconds in a full run recorded in DURATIONS; without a record, its
    tests that are not quick (Ray, a browser, slow) times the recorded seconds of such a test."""
    heavy: dict[str, int] = {}
    for item in items:
        heavy[_group(item.nodeid)] = heavy.get(_group(item.nodeid), 0) + (not tiers.quick(item))
    took = _recorded()
    rates = sorted(took[g] / heavy[g] for g in took if heavy.get(g))
    rate = rates[len(rates) // 2] if rates else 1.0
    cost = {g: took.get(g, n * rate) for g, n in heavy.items()}
    rank = {group: i for i, group in enumerate(sorted(heavy, key=lambda g: (-cost[g], g)))}
    return sorted(items, key=lambda item: rank[_group(item.nodeid)])  # (stable: each group's order)


# Seconds each group of tests took in a full run: the order of the next runs. `scripts/test.sh`
# writes a full tier's into DURATIONS_ENV's file (test-artifacts/durations.json); copied to
# DURATIONS after a run that passed, it orders the runs after it (a group it lacks is
# estimated, see _heavy_groups_first).
DURATIONS = ROOT / "tests" / "durations.json"
DURATIONS_ENV = "TUNER_TEST_DURATIONS_OUT"
_TOOK: dict[str, float] = {}


def _recorded() -> dict[str, float]:
    try:
        took = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(g): float(s) for g, s in took.items()} if isinstance(took, dict) else {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or the one process) adds this run's seconds per group to the file
    DURATIONS_ENV names (a second process after a stall adds what it ran)."""
    out = os.environ.get(DURATIONS_ENV)
    if not out or hasattr(session.config, "workerinput") or not _TOOK:
        return
    try:
        took = json.loads(Path(out).read_text())
    except (OSError, ValueError):
        took = {}
    for group, seconds in _TOOK.items():
        took[group] = round(took.get(group, 0.0) + seconds, 1)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(dict(sorted(took.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n N` (TUNER_TEST_WORKERS): whole groups of tests (`_group`) to a worker at a time. (xdist's
    own `--dist loadgroup` marks cannot do it under pytest 9: it renames node ids that pytest
    no longer lets it rename.)"""
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # (the order of _heavy_groups_first, not by size)

    class Groups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return Groups(config, log)


pytest_runtest_call = tiers.pytest_runtest_call  # (the quick tier's CPU-s per test)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if item.config.getoption("--quick"):
        tiers.police(item, call, report)
    return report


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray with 2 CPUs, shared by every test that runs sweeps in-process."""
    import ray

    from tuner.cluster.connect import Runtime, connect, quiet_ray

    quiet_ray(verbose=False)
    connect(Runtime(num_cpus=2))
    yield ray
    ray.shutdown()


# How long a test's trial actors may take to hand the shared Ray's CPUs back after its sweep
# returned (Tune ends them gracefully: a stopped script has its grace, a loop its `finally`).
SHARED_RAY_IDLE_S = 60.0


@pytest.fixture(autouse=True)
def _shared_ray_handed_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the shared Ray starts with all of its CPUs free, and hands them all back.

    A sweep's trial actors end after `fit` returns; one that never ends would leave the next
    in-process sweep waiting for a CPU until its timeout, with nothing to say why. So each
    such test first waits for the CPUs, and after it, the test whose actors kept them fails
    here, naming the processes left (a teardown error, its own result kept)."""
    if "ray_session" not in request.fixturenames:
        yield
        return
    _wait_for_idle_ray(f"before {request.node.nodeid}: an earlier test's")
    yield
    _wait_for_idle_ray(f"{request.node.nodeid}'s")


def _wait_for_idle_ray(whose: str) -> None:
    import ray

    if not ray.is_initialized():
        return
    total = ray.cluster_resources().get("CPU", 0.0)
    wait_s = settle_s(SHARED_RAY_IDLE_S)
    deadline = time.monotonic() + wait_s
    while (free := ray.available_resources().get("CPU", 0.0)) < total:
        if time.monotonic() > deadline:
            left = subprocess.run(["ps", "-eo", "pid,etimes,args"], capture_output=True, text=True).stdout
            actors = [ln.strip() for ln in left.splitlines() if "ray::" in ln and "Agent" not in ln]
            pytest.fail(
                f"{whose} trial actors still held {total - free:g} of the shared Ray's {total:g} CPUs "
                f"{wait_s:.0f} s after its sweep; its Ray processes: {actors}"
            )
        time.sleep(0.2)


# `python -m tuner ARGS` as a user runs it, reporting (on the line DRIVER_MODULES) whether the
# driver had imported Ray and torch once the sweep was over, just before it ends its Ray.
CLI_PROBE = """
import runpy, sys
import tuner.cluster.connect as connect
leave = connect.leave
def reporting_leave(code):
    print('DRIVER_MODULES', 'ray' in sys.modules, 'torch' in sys.modules, flush=True)
    leave(code)
connect.leave = reporting_leave
sys.argv = ['tuner', *sys.argv[1:]]
runpy.run_module('tuner', run_name='__main__', alter_sys=True)
"""


@dataclass
class CliSweep:
    """What one `python -m tuner sweep debug.yaml` left behind (see the cli_sweep fixture)."""

    args: list[str]  # the command's arguments
    run: subprocess.CompletedProcess
    sweep_dir: Path
    driver_modules: list[str]  # ["True"/"False" Ray imported, the same for torch]
    left: list[str]  # its processes still alive a few seconds after it exited ("pid name")
    ray_logs: Path  # its Ray's log directory
    ray_tmp: Path  # its $RAY_TMPDIR: what its Ray left on disk is under it
    secrets: list[str]  # AWS credentials (made up) it had in its environment, as a user's shell may
    marks: list[dict[str, Any]]  # the stages its processes passed (TUNER_TIMELINE: tuner/timeline.py)
    sessions: dict[str, bool]  # Ray session directories of earlier Rays put there first: whether left


def processes_left(mark: str, within_s: float = 5.0) -> list[str]:
    """Processes whose environment has TUNER_TEST_MARK=mark (Ray's inherit the driver's) still
    alive after `within_s` seconds, or as long as the test has run (`settle_s`): "pid name"
    each; a killed one may take the kernel a moment."""
    import psutil

    deadline = time.monotonic() + settle_s(within_s)
    while True:
        found = []
        for proc in marked(mark):
            with contextlib.suppress(psutil.Error):
                found.append(f"{proc.pid} {proc.name()}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def marked(mark: str) -> list:
    """The live processes (psutil's) whose environment has TUNER_TEST_MARK=mark."""
    import psutil

    found = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("TUNER_TEST_MARK") == mark and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


@pytest.fixture(scope="session")
def cli_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliSweep]:
    """debug.yaml swept once per test session by `python -m tuner sweep` in a process of its
    own, as a user runs it (3 trials of 1 epoch, its own local Ray of 2 CPUs: one trial actor
    runs two trials, one after the other); the tests of
    the CLI's output, the driver's imports and what outlives the driver read this one run."""
    import uuid

    out = tmp_path_factory.mktemp("cli")
    mark = uuid.uuid4().hex
    ray_tmp = Path("/tmp") / f"tn{mark[:8]}"  # short: Ray's socket paths must fit 107 bytes
    args = ["sweep", str(DEBUG), "--output", str(out), "--name", "s"]
    args += ["--num-samples", "3", "--max-epochs", "1", "--num-cpus", "2"]
    secrets = {name: f"{name.lower()}-{uuid.uuid4().hex}" for name in AWS_CREDENTIALS}
    marks = out / "timeline.jsonl"
    env = {**os.environ, "TUNER_TEST_MARK": mark, "RAY_TMPDIR": str(ray_tmp), "TUNER_TIMELINE": str(marks)}
    env.update(secrets)
    earlier = _earlier_sessions(ray_tmp / f"tuner-{os.getuid()}" / "ray")
    try:
        run = subprocess.run(
            [sys.executable, "-c", CLI_PROBE, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        left = processes_left(mark)  # SIGKILLed: gone at once, bar the kernel's tear-down
        modules = [ln.split()[1:] for ln in run.stdout.splitlines() if ln.startswith("DRIVER_MODULES")]
        logs = next(ray_tmp.glob("*/ray/session_*/logs"), ray_tmp)
        # (the driver's line first: `python -m tuner` watches its driver from a parent process,
        # which imports neither and reports after it)
        driver_modules = modules[0] if modules else []
        stages = [json.loads(line) for line in marks.read_text().splitlines()] if marks.exists() else []
        sessions = {name: (path / "x").exists() for name, path in earlier.items()}
        secret = [*secrets.values()]
        yield CliSweep(args, run, out / "s", driver_modules, left, logs, ray_tmp, secret, stages, sessions)
    finally:
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)


def _earlier_sessions(ray_dir: Path) -> dict[str, Path]:
    """Session directories as earlier local Rays leave them in tuner's private directory
    (join.private_temp_dir): 7 of drivers that ended, one of a driver still running (this
    process), the oldest, and a directory of another name; each holds a file, x."""
    ray_dir.parent.parent.mkdir()  # ($RAY_TMPDIR)
    ray_dir.parent.mkdir(mode=0o700)
    ray_dir.mkdir()
    ended = 2**22 + 1  # (past Linux's PID_MAX_LIMIT: no process ever has it, nor will during the sweep)
    names = [f"session_2026-01-01_00-00-00_000000_{os.getpid()}", "kept_by_the_user"]
    names += [f"session_2026-01-0{day}_10-00-00_123456_{ended}" for day in range(2, 9)]
    for name in names:
        (ray_dir / name).mkdir()
        (ray_dir / name / "x").write_text("")
    return {name: ray_dir / name for name in names}


# The AWS credentials a user's shell may hold (Ray Tune 2.60 copied them all into every trial
# actor's runtime env, and Ray's logs kept them: issue 44).
AWS_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def files_holding(secrets: list[str], *roots: Path) -> list[str]:
    """Every file under `roots` (symbolic links not followed) holding one of `secrets`."""
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                try:
                    data = path.read_bytes()
                except OSError:  # a socket, or gone meanwhile
                    continue
                found += [f"{path}: {s[:12]}..." for s in secrets if s.encode() in data]
    return found


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A real S3-compatible server (moto's) on loopback that checks credentials; its `env()`
    is what a client needs (AWS_ENDPOINT_URL and a key)."""
    from tests import s3server

    server = s3server.start("127.0.0.1", tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3, monkeypatch: pytest.MonkeyPatch):
    """The test's environment pointing at the server, the standard way (no AWS_PROFILE, no ~/.aws)."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return s3


class _NsClusterHolder:
    """The session's namespaced cluster: started when a test first asks for it, stopped after
    the last test of its group in this worker (`pytest_runtest_teardown`: its nodes and S3
    server would otherwise idle for the rest of the run), started again should another ask."""

    def __init__(self, factory: pytest.TempPathFactory):
        self.factory, self.cluster, self.unavailable = factory, None, ""

    def get(self) -> Any:
        from tests import s3server
        from tests.nscluster import NsCluster, Unavailable

        if self.unavailable:
            pytest.skip(self.unavailable)
        if self.cluster is not None:
            return self.cluster
        cluster = NsCluster(workers=1, cpus=1, base=self.factory.mktemp("nscluster"))

        def storage(c: NsCluster) -> dict[str, str]:
            assert c.base is not None
            c.s3 = s3server.start(c.host_ip, c.base / "moto.log")
            c.on_stop.append(c.s3.stop)
            return c.s3.env()

        try:
            cluster.start(setup=storage)
        except BaseException as why:
            cluster.stop()  # (what it had started)
            if not isinstance(why, Unavailable):
                raise
            self.unavailable = f"no namespaced cluster here: {why}"
            pytest.skip(self.unavailable)
        self.cluster = cluster
        return cluster

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


_NS_HOLDER: list[_NsClusterHolder] = []


@pytest.fixture(scope="session")
def _ns_cluster_holder(tmp_path_factory: pytest.TempPathFactory):
    holder = _NsClusterHolder(tmp_path_factory)
    _NS_HOLDER.append(holder)
    yield holder
    holder.stop()
    _NS_HOLDER.remove(holder)


@pytest.fixture
def ns_cluster(_ns_cluster_holder: _NsClusterHolder):
    """A Ray head and one worker node (1 CPU each), each a separate "machine": network, mount,
    PID and UTS namespaces of its own (tests/nscluster.py), token authentication on, with an
    S3 server (moto) on the host that the nodes reach (`cluster.s3`; its variables are in the
    nodes' environment), one for the tests of its group (ONE_WORKER). Skips, saying why, where
    namespaces cannot be made."""
    return _ns_cluster_holder.get()


def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    uses = "ns_cluster" in getattr(item, "fixturenames", ())
    if uses and _NS_HOLDER and "ns_cluster" not in getattr(nextitem, "fixturenames", ()):
        _NS_HOLDER[0].stop()  # (the group's last test in this worker: see _NsClusterHolder)


def assert_resources_returned(within_s: float = 10.0) -> None:
    """Every CPU and GPU of the test's Ray is free again (its view lags a little): within
    `within_s` seconds, or as long as the test has run (`settle_s`)."""
    import ray

    deadline = time.monotonic() + settle_s(within_s)
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        held = {k: total[k] - free.get(k, 0) for k in ("CPU", "GPU") if k in total}
        if not any(held.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(held.values()), f"still held after the sweep: {held}"


# What points Ray's CLI and tuner at some other cluster: dropped from a test cluster's environment.
OTHER_CLUSTER = (
    "RAY_ADDRESS",
    "RAY_API_SERVER_ADDRESS",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_MODE",
    "RAY_JOB_CONFIG_JSON_ENV_VAR",
)


def cluster_env(base: Path) -> dict[str, str]:
    """The environment for a `tuner cluster` of a test: its state and token under `base`
    (never ~/.ray or the user's state directory), nothing pointing at another cluster."""
    env = {k: v for k, v in os.environ.items() if k not in OTHER_CLUSTER}
    env.update(TUNER_CLUSTER_DIR=str(base / "state"), RAY_AUTH_TOKEN_PATH=str(base / "token"))
    return env


def debug_config(tmp_path: Path, **overrides: Any):
    """debug.yaml with results under tmp_path and dotted overrides ("search.algorithm")."""
    from tuner.config import load_sweep

    return load_sweep(
        DEBUG, {"output": str(tmp_path), **{k.replace("__", "."): v for k, v in overrides.items()}}
    )


def run_cli(
    *args: str, cwd: Path = ROOT, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m tuner ARGS` in a subprocess, as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


@dataclass
class Ran:
    """What an in-process CLI call gave (the fields of subprocess.CompletedProcess)."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, cwd: Optional[Path] = None, env: Optional[dict] = None, on_session: bool = False) -> Ran:
    """`python -m tuner ARGS` in this process: tuner.cli.main with its output captured and a
    SystemExit's code kept; the working directory, environment and sys.path are restored.

    For commands that end before any Ray starts (refusals, validate, report, export, --help):
    a call that gets as far as starting a Ray fails the test instead. With `on_session` (for a
    test that uses the ray_session fixture) a sweep, resume or extend runs on the session's
    Ray: the CLI's words, output and exit code without a Ray of its own to start. `run_cli`
    runs a command in a process of its own, as a user does."""
    import tuner.cluster.connect
    import tuner.driver.sweep
    import tuner.errors
    from tuner.cli import main

    def no_ray(*_: Any, **__: Any) -> None:
        raise AssertionError(f"cli{args} would start a Ray: run it with run_cli, in its own process")

    if on_session:
        import ray

        assert ray.is_initialized(), "cli(on_session=True) runs on the ray_session fixture's Ray"
    out, err = io.StringIO(), io.StringIO()
    environ, path = dict(os.environ), list(sys.path)
    with pytest.MonkeyPatch.context() as mp:
        # As a process of its own: its warnings said once, whatever this process said before.
        mp.setattr(tuner.errors, "_warned", set())
        if not on_session:
            mp.setattr(tuner.driver.sweep, "connect", no_ray)
            mp.setattr(tuner.cluster.connect, "connect", no_ray)
        if cwd is not None:
            mp.chdir(cwd)
        try:
            os.environ.update(env or {})
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code: Any = main(list(args))
                except SystemExit as done:  # argparse's errors and --help; `raise SystemExit(130)`
                    code = done.code
                    if isinstance(code, str):  # printed to stderr, exit 1 (as Python does)
                        print(code, file=sys.stderr)
                        code = 1
        finally:
            os.environ.clear()
            os.environ.update(environ)
            sys.path[:] = path
    return Ran(int(code or 0), out.getvalue(), err.getvalue())


def contains(p: Any, value: Any) -> bool:
    """Whether `value` is one the parameter can produce (the contract tests' check)."""
    from tuner.space.params import LogRandInt, LogUniform, RandInt, Uniform, values_of

    listed = values_of(p)
    if listed is not None and not isinstance(p, (RandInt, LogRandInt)):
        return value in listed
    if isinstance(p, (RandInt, LogRandInt)):
        return isinstance(value, int) and p.low <= value <= p.high
    assert isinstance(p, (Uniform, LogUniform))
    return isinstance(value, float) and p.low <= value <= p.high


def gated_script(path: str) -> list[str]:
    """task.command of a test script that takes --lr, --gate and --epochs (it waits at the gate
    file before its second epoch: tests/mode_script.py, lightning_task.py, hf_task.py)."""
    return ["python", path, "--lr", "{lr}", "--gate", "{gate}", "--epochs", "{max_epochs}"]


def kill_9_when(
    raw: dict, tmp_path: Path, ready: Any, timeout: float = 240, sig: int = signal.SIGKILL
) -> Path:
    """Run the sweep `raw` (a dict, written as JSON, which is YAML) in a driver process, kill it
    with -9 (or `sig`) once `ready(sweep_dir)` holds; its sweep directory (the driver's output
    in driver.log beside it)."""
    sweep_file = tmp_path / f"{raw['name']}.yaml"
    sweep_file.write_text(json.dumps(raw))
    sweep = Path(raw["output"]) / raw["name"]
    command = [sys.executable, "-m", "tuner", "sweep", str(sweep_file)]
    _killed_when(command, sweep, tmp_path / "driver.log", ready, timeout, sig)
    return sweep


def kill_9_resuming_when(sweep: Path, tmp_path: Path, ready: Any, timeout: float = 240) -> None:
    """`tuner resume sweep` in a driver process, killed with -9 once `ready(sweep)` holds (its
    output appended to resume.log beside the sweep's driver.log)."""
    command = [sys.executable, "-m", "tuner", "resume", str(sweep)]
    _killed_when(command, sweep, tmp_path / "resume.log", ready, timeout, signal.SIGKILL)


def _killed_when(command: list[str], sweep: Path, log: Path, ready: Any, timeout: float, sig: int) -> None:
    out = open(log, "a")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout  # (a hang guard)
    while time.time() < deadline and not ready(sweep):
        if proc.poll() is not None:  # it ended (or never started) before the moment came
            out.flush()
            pytest.fail(f"the driver exited {proc.returncode} first:\n" + log_tail(log))
        time.sleep(0.1)
    os.kill(proc.pid, sig)
    proc.wait(timeout=120)
    if sig == signal.SIGKILL:
        unheld(sweep)  # (its driver, a child process, lets the sweep go a moment later)


def unheld(sweep: Path, within_s: float = 120) -> None:
    """Wait until no run holds the sweep directory: `python -m tuner` killed with -9 takes its
    driver (a child process, tuner/driver/stopping.py) down with it, a moment later."""
    from tuner.config import ConfigError
    from tuner.sweepdir import refuse_if_held

    deadline = time.monotonic() + settle_s(within_s)  # (a hang guard)
    while True:
        try:
            refuse_if_held(str(sweep))
            return
        except ConfigError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def gone(*pids: int, within_s: float = 120) -> None:
    """Wait until the processes are gone (a zombie counts as gone): the trials of a driver killed
    with -9 live on a moment, until Ray ends them, and none may write once the test goes on."""
    import psutil

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + settle_s(within_s)  # (a hang guard)
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"processes of the killed driver still alive: {pids}"
        time.sleep(0.05)


def log_tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def resumed_to_the_end(sweep: Path, trials: int) -> dict:
    """`tuner resume` of `sweep` run to its end on the session's Ray (the test uses the
    ray_session fixture; what a resume in a process of its own adds: tests/test_resume.py):
    its summary (every trial there)."""
    out = cli("resume", str(sweep), on_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == trials
    return summary
