"""Shared fixtures: one Ray per test session (2 CPUs), the shipped sweep files, tmp sweeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"
DEBUG = SPACES / "debug.yaml"


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray with 2 CPUs, shared by every test that runs sweeps in-process."""
    import ray

    from tuner.cluster.connect import Runtime, connect, quiet_ray

    quiet_ray(verbose=False)
    connect(Runtime(num_cpus=2))
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A real S3-compatible server (moto's) on loopback that checks credentials; its `env()`
    is what a client needs (AWS_ENDPOINT_URL and a key)."""
    from tests import s3server

    server = s3server.start("127.0.0.1", tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ns_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A Ray head and one worker node (1 CPU each), each a separate "machine": network, mount,
    PID and UTS namespaces of its own (tests/nscluster.py), token authentication on, with an
    S3 server (moto) on the host that the nodes reach (`cluster.s3`; its variables are in the
    nodes' environment). Skips, saying why, where namespaces cannot be made."""
    from tests import s3server
    from tests.nscluster import NsCluster, Unavailable

    cluster = NsCluster(workers=1, cpus=1, base=tmp_path_factory.mktemp("nscluster"))

    def storage(c: NsCluster) -> dict[str, str]:
        assert c.base is not None
        c.s3 = s3server.start(c.host_ip, c.base / "moto.log")
        c.on_stop.append(c.s3.stop)
        return c.s3.env()

    try:
        cluster.start(setup=storage)
    except Unavailable as why:
        pytest.skip(f"no namespaced cluster here: {why}")
    yield cluster
    cluster.stop()


def assert_resources_returned(within_s: float = 10.0) -> None:
    """Every CPU and GPU of the test's Ray is free again (its view lags a little)."""
    import ray

    deadline = time.monotonic() + within_s
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        held = {k: total[k] - free.get(k, 0) for k in ("CPU", "GPU") if k in total}
        if not any(held.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(held.values()), f"still held after the sweep: {held}"


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


def contains(p: Any, value: Any) -> bool:
    """Whether `value` is one the parameter can produce (the contract tests' check)."""
    from tuner.space import LogRandInt, LogUniform, RandInt, Uniform, values_of

    listed = values_of(p)
    if listed is not None and not isinstance(p, (RandInt, LogRandInt)):
        return value in listed
    if isinstance(p, (RandInt, LogRandInt)):
        return isinstance(value, int) and p.low <= value <= p.high
    assert isinstance(p, (Uniform, LogUniform))
    return isinstance(value, float) and p.low <= value <= p.high


def kill_9_when(
    raw: dict, tmp_path: Path, ready: Any, timeout: float = 240, sig: int = signal.SIGKILL
) -> Path:
    """Run the sweep `raw` (a dict, written as JSON, which is YAML) in a driver process, kill it
    with -9 (or `sig`) once `ready(sweep_dir)` holds; its sweep directory (the driver's output
    in driver.log beside it)."""
    sweep_file = tmp_path / f"{raw['name']}.yaml"
    sweep_file.write_text(json.dumps(raw))
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "sweep", str(sweep_file)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    sweep = Path(raw["output"]) / raw["name"]
    deadline = time.time() + timeout
    while time.time() < deadline and not ready(sweep):
        if proc.poll() is not None:  # it ended (or never started) before the moment came
            log.flush()
            pytest.fail(f"the driver exited {proc.returncode} first:\n" + log_tail(tmp_path / "driver.log"))
        time.sleep(0.1)
    os.kill(proc.pid, sig)
    proc.wait(timeout=120)
    return sweep


def log_tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def resumed_to_the_end(sweep: Path, trials: int) -> dict:
    """`tuner resume` of `sweep` run to its end: its summary (every trial there)."""
    out = run_cli("resume", str(sweep), timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == trials
    return summary
