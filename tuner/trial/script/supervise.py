"""The processes between a trial actor and the training script of `task.command`.

Run as a file (`python supervise.py ACTOR_PID GRACE_S [--record FILE] -- ARGV...`), never
imported from the tuner package: it imports nothing but the standard library and psutil (a
dependency of Ray).

Two processes, because Ray SIGKILLs the direct children of a worker that exits (Ray 2.60,
`RAY_kill_child_processes_on_worker_exit`, on by default), and a process killed with -9 can
clean nothing up:

- the **anchor**, the actor's child, does nothing but wait. It dies with the actor
  (PR_SET_PDEATHSIG: SIGKILL) and passes a SIGTERM, SIGINT or SIGHUP on to the keeper;
- the **keeper**, the anchor's child, learns of the anchor's death, however it came
  (PR_SET_PDEATHSIG: SIGTERM, which it handles), and then ends the script's whole tree. It is
  the subreaper of whatever ARGV starts (PR_SET_CHILD_SUBREAPER: torchrun's workers, which run
  in sessions of their own, stay its descendants even when torchrun itself is killed).

So a driver killed with -9 (Ray then ends the actor, or the actor's worker exits and Ray kills
the anchor) leaves no training behind, even a script that prints nothing. The script itself
gets SIGTERM should the keeper ever be killed with -9 too (its own PR_SET_PDEATHSIG).

On a stop the keeper sends SIGTERM to every descendant, SIGKILL after GRACE_S seconds to those
left; when ARGV exits on its own, whatever it left running goes the same way. `--record FILE`:
the keeper writes the pids (and start times) of itself and the script there as JSON, so a later
attempt of the trial can stop a run that somehow outlived all this (tuner.trial.script.run). The
exit code is ARGV's (128 + the signal's number when a signal ended it).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_stop = False


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _on_signal(signum: int, frame: object) -> None:
    global _stop
    _stop = True


def _end_all(grace_s: float) -> None:
    """SIGTERM to every descendant, then SIGKILL after `grace_s` to those still there."""
    me = psutil.Process()
    for p in me.children(recursive=True):
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not _living(me):
            return
        time.sleep(0.05)
    for p in me.children(recursive=True):
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(me.children(recursive=True), timeout=5)
    _reap()


def _living(me: psutil.Process) -> list[psutil.Process]:
    """Descendants not yet ended (a zombie has ended; one gone meanwhile too)."""
    out = []
    for p in me.children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _reap() -> None:
    """Collect orphans handed to this subreaper, so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _code(status: int) -> int:
    """A wait status as an exit code: the code, or 128 + the signal that ended it."""
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _record(path: str, script: subprocess.Popen) -> None:
    """Who runs the script, for a later attempt to stop if it outlived its trial."""
    me = psutil.Process()
    started = {"keeper": [me.pid, me.create_time()]}
    try:
        started["script"] = [script.pid, psutil.Process(script.pid).create_time()]
    except psutil.Error:  # ended already
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"host": socket.gethostname(), **started}, f)
    os.replace(tmp, path)


def keep(anchor: int, grace_s: float, record: str | None, command: list[str]) -> int:
    """The keeper: run `command`, end its whole tree on a stop or when the anchor dies."""
    for sig in STOPS:
        signal.signal(sig, _on_signal)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != anchor:  # the anchor died before the request above took effect
        return 128 + signal.SIGTERM
    try:
        # The script hears of the keeper's death too (a -9 to both), from the kernel.
        child = subprocess.Popen(command, preexec_fn=lambda: _prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
    except OSError as err:
        print(f"task.command: cannot run {command[0]!r}: {err.strerror}", file=sys.stderr, flush=True)
        return 127
    if record:
        try:
            _record(record, child)
        except OSError:  # (a full or read-only disk: the record is a safety net only)
            pass
    while not _stop:
        code = child.poll()
        if code is not None:
            _end_all(grace_s)  # what the script left behind
            return code if code >= 0 else 128 - code
        if os.getppid() != anchor:
            break
        time.sleep(0.05)
    _end_all(grace_s)  # (it reaps the script too: its own code is lost, and not wanted)
    return 128 + signal.SIGTERM


def main(argv: list[str]) -> int:
    actor, grace_s, rest = int(argv[0]), float(argv[1]), argv[2:]
    record = None
    if rest[:1] == ["--record"]:
        record, rest = rest[1], rest[2:]
    assert rest[:1] == ["--"] and rest[1:], "usage: supervise.py ACTOR_PID GRACE_S [--record FILE] -- ARGV..."
    command = rest[1:]
    # The anchor: dies with the actor, at once.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != actor:
        return 128 + signal.SIGTERM
    anchor = os.getpid()
    keeper = os.fork()
    if keeper == 0:
        code = 1
        try:
            code = keep(anchor, grace_s, record, command)
        finally:
            os._exit(code)

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(keeper, signum)
        except ProcessLookupError:
            pass

    for sig in STOPS:
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(keeper, 0)
            return _code(status)
        except ChildProcessError:
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
