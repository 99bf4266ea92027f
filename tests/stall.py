"""What a stalled test was doing below Python: its process's native stacks.

A test stuck inside C code (a lock in a C++ library, a destructor the garbage collector ran)
is out of pytest-timeout's reach, and faulthandler (`faulthandler_timeout` in pyproject.toml,
which ends the run) prints Python frames only: such a stall shows as a test whose own frame is
missing. DUMP_AFTER_S into a test (past its timeout, before faulthandler's limit), this prints
the native stacks of every thread of pytest's process (py-spy, which Ray installs beside
Python), and whether a garbage collection was under way, to the terminal.

Under scripts/test.sh (STALLED_ENV set) the process then ends at once with STALL_EXIT, the
stalled test's id in that file, and test.sh runs the tests not yet run in a new process
(PROGRESS_ENV: every finished test, and every failure, of the first): one stall costs its
11 minutes, not the rest of the run, and still fails nothing silently."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

DUMP_AFTER_S = float(os.environ.get("TUNER_TEST_STALL_S", "660"))  # timeout 600 s, a minute more
STALL_EXIT = 75  # the process's exit status after a stall (sysexits' EX_TEMPFAIL)
STALLED_ENV = "TUNER_TEST_STALLED"  # a file: the stalled test's id is written there
PROGRESS_ENV = "TUNER_TEST_PROGRESS"  # a file: "done <id>" / "failed <id>" lines, appended
RESUME_ENV = "TUNER_TEST_RESUME"  # "1": deselect the tests PROGRESS_ENV lists as done
_now: dict[str, Any] = {"test": None, "since": 0.0, "gc": None}


def start(dump_after_s: float = DUMP_AFTER_S) -> None:
    """Watch the tests of this process from now on (pytest_configure)."""
    fd = os.dup(sys.stderr.fileno())  # the terminal: a test's own stderr is captured
    gc.callbacks.append(_on_gc)
    threading.Thread(target=_watch, args=(fd, dump_after_s), name="stall-watch", daemon=True).start()


def mark(test: Optional[str]) -> None:
    """`test` starts now (None: between tests)."""
    _now.update(test=test, since=time.monotonic())


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    _now["gc"] = (time.monotonic(), info["generation"]) if phase == "start" else None


def _watch(fd: int, dump_after_s: float) -> None:
    dumped = None
    while True:
        time.sleep(5.0)
        test, since = _now["test"], _now["since"]
        if test is None or (test, since) == dumped or time.monotonic() - since < dump_after_s:
            continue
        dumped = (test, since)
        os.write(fd, report(test, time.monotonic() - since).encode(errors="replace"))
        if stalled := os.environ.get(STALLED_ENV):
            Path(stalled).write_text(test + "\n")
            os._exit(STALL_EXIT)


def record(kind: str, test: str) -> None:
    """Append "`kind` `test`" ("done": its teardown ended; "failed": a phase of it failed) to
    PROGRESS_ENV's file, when set."""
    if path := os.environ.get(PROGRESS_ENV):
        with open(path, "a") as f:
            f.write(f"{kind} {test}\n")


def done_before() -> set[str]:
    """The tests an earlier process of this run finished (RESUME_ENV set), to deselect."""
    path = os.environ.get(PROGRESS_ENV)
    if os.environ.get(RESUME_ENV) != "1" or not path or not os.path.exists(path):
        return set()
    return {ln[5:] for ln in Path(path).read_text().splitlines() if ln.startswith("done ")}


def report(test: str, for_s: float) -> str:
    """The native stacks of this process's threads, under a line naming the test."""
    collecting = _now["gc"]
    head = f"\n[stall] {test} has run {for_s:.0f} s; " + (
        f"a garbage collection (generation {collecting[1]}) started "
        f"{time.monotonic() - collecting[0]:.0f} s ago"
        if collecting
        else "no garbage collection under way"
    )
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return head + "; no py-spy to show native stacks\n"
    try:
        out = subprocess.run(
            [spy, "dump", "--native", "--pid", str(os.getpid())], capture_output=True, text=True, timeout=120
        )
        stacks = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError) as e:
        stacks = f"py-spy failed: {e}\n"
    return f"{head}; native stacks (py-spy):\n{stacks}\n"
