"""scripts/pytest_resuming.sh (what scripts/test.sh runs) with tests/stall.py: a test stuck
inside C code has its native stacks printed and its process ended, the tests not yet run go on
in a new process, and the verdict still counts a failure before the stall, and a second stall."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scripts/pytest_resuming.sh", "-q", "-p", "no:cacheprovider", *args, "tests/stall_probe.py"],
        cwd=ROOT,
        env={**os.environ, "TUNER_TEST_STALL_S": "4", **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


STALLED = "tests/stall_probe.py::test_blocks_in_c_code"


@pytest.mark.parametrize(
    "env, rc, stalls",
    [({}, 0, 1), ({"PROBE_FAIL": "1"}, 1, 1), ({"PROBE_STALL_AGAIN": "1"}, 75, 2)],
    ids=["stall-only", "failure-before-the-stall", "second-stall"],
)
def test_a_stalled_test_is_dumped_and_the_rest_run_in_a_new_process(
    env: dict[str, str], rc: int, stalls: int
) -> None:
    out = _run(**env)
    assert out.returncode == rc, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr.count(f"[stall] {STALLED} has run") == stalls, out.stderr[-3000:]
    assert "clock_nanosleep" in out.stderr  # py-spy's native frame of the call that blocks
    if shutil.which("gdb"):  # and every thread's stack, C++ threads included
        assert "every thread's stack (gdb):" in out.stderr and "\n#0 " in out.stderr, out.stderr[-3000:]
    assert f"{STALLED} stalled inside C code" in out.stderr and "after 2 tests had finished" in out.stderr
    if stalls == 1:  # the new process ran the stalled test and the one after it, and no other
        assert "2 passed, 2 deselected" in out.stdout, out.stdout[-3000:]
    failed_before = "FAILED tests/stall_probe.py::test_fails_before" in out.stderr
    assert failed_before == ("PROBE_FAIL" in env)


def test_a_stall_in_an_xdist_worker_ends_that_worker_and_the_test_runs_again() -> None:
    """As scripts/test.sh runs the suite (in xdist workers): the watcher of the worker that
    stalled ends it, xdist's controller counts its test as crashed and, replacing no worker,
    ends the run; the new process runs what was not done, the stalled test too: it passes
    there, so the run passes."""
    out = _run("-n", "2", "--max-worker-restart", "0")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr.count(f"[stall] {STALLED} has run") == 1, out.stderr[-3000:]
    assert f"{STALLED} stalled inside C code" in out.stderr
    assert f"crashed while running '{STALLED}'" in out.stdout + out.stderr, out.stdout[-3000:]
    summaries = [ln for ln in out.stdout.splitlines() if " in " in ln and ("passed" in ln or "failed" in ln)]
    assert "failed" not in summaries[-1] and "passed" in summaries[-1], out.stdout[-3000:]
