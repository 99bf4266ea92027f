"""What a stalled test was doing below Python, and a run that goes on past it.

A test stuck inside C code (a lock in a C++ library, a destructor the garbage collector ran)
is out of pytest-timeout's reach, and faulthandler (`faulthandler_timeout` in pyproject.toml,
which ends the run) prints Python frames only: such a stall shows as a test whose own frame is
missing. A watcher process (a process, not a thread: a thread would need the GIL, which a stuck
thread may hold) reads which test runs since when; DUMP_AFTER_S into one (past its timeout,
before faulthandler's limit) it prints the native stacks of pytest's process to the terminal:
its Python threads' (py-spy, which Ray installs beside Python), then every thread's (gdb).

Under scripts/pytest_resuming.sh (STALLED_ENV set) the watcher then writes the stalled test's
id there and kills pytest's process and everything it started, and the script runs the tests
not yet finished in a new process (PROGRESS_ENV: every finished test, and every failure, of
the first): one stall costs its 11 minutes, not the rest of the run, and hides no failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

DUMP_AFTER_S = float(os.environ.get("TUNER_TEST_STALL_S", "660"))  # timeout 600 s, a minute more
STALLED_ENV = "TUNER_TEST_STALLED"  # a file: the stalled test's id is written there
PROGRESS_ENV = "TUNER_TEST_PROGRESS"  # a file: "done <id>" / "failed <id>" lines, appended
RESUME_ENV = "TUNER_TEST_RESUME"  # "1": deselect the tests PROGRESS_ENV lists as done
_state: dict[str, Optional[Path]] = {"path": None}


def start() -> None:
    """Start the watcher of this pytest process (pytest_configure)."""
    fd, path = tempfile.mkstemp(prefix="tuner-test-now-")
    os.close(fd)
    _state["path"] = Path(path)
    terminal = os.dup(sys.stderr.fileno())  # a test's own stderr is captured; this is not
    subprocess.Popen(
        [sys.executable, __file__, str(os.getpid()), path, str(DUMP_AFTER_S)],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        pass_fds=(terminal,),
        start_new_session=True,  # a Ctrl-C of the run is not its
    )
    os.close(terminal)


def mark(test: Optional[str]) -> None:
    """`test` starts now (None: between tests)."""
    if (path := _state["path"]) is not None:
        path.write_text(f"{time.time()} {test or ''}")


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


# ----------------------------------------------------------------------------- the watcher


def watch(pid: int, now_file: Path, dump_after_s: float) -> None:
    """Until `pid` ends: dump its native stacks when one test has run `dump_after_s`; then,
    under STALLED_ENV, end it and its descendants."""
    dumped = None
    try:
        while _alive(pid):
            time.sleep(2.0)
            try:
                since, _, test = now_file.read_text().partition(" ")
                started = float(since)
            except (OSError, ValueError):
                continue
            if not test or (test, started) == dumped or time.time() - started < dump_after_s:
                continue
            dumped = (test, started)
            sys.stdout.write(f"\n[stall] {test} has run {time.time() - started:.0f} s; {_stacks(pid)}\n")
            sys.stdout.flush()
            if stalled := os.environ.get(STALLED_ENV):
                Path(stalled).write_text(test + "\n")
                _kill_tree(pid)
                return
    finally:
        now_file.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _gdb_args(pid: int) -> list[str]:
    return ["-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 25"]


def _stacks(pid: int) -> str:
    """py-spy's native stacks of the Python threads, then gdb's of every thread (the C++
    threads of Ray and torch have no Python state, and py-spy skips them), where installed."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    gdb = shutil.which("gdb")
    runs = [
        ("native stacks of pytest's Python threads (py-spy)", spy, ["dump", "--native", "--pid", str(pid)]),
        ("every thread's stack (gdb)", gdb, _gdb_args(pid)),
    ]
    out = []
    for title, tool, args in runs:
        if tool is None:
            out.append(f"{title}: not installed\n")
            continue
        try:
            done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=180)
            out.append(f"{title}:\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.SubprocessError) as e:
            out.append(f"{title}: failed: {e}\n")
    return "\n".join(out)


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (Ray's, servers', the browser's)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    for p in [p for p in tree if p != os.getpid()]:  # (this watcher is one of pytest's)
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    watch(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
