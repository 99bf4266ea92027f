"""The process between a trial actor and the training script of `task.command`.

Run as a file (`python supervise.py ACTOR_PID GRACE_S -- ARGV...`), never imported from the
tuner package: it imports nothing but the standard library and psutil (a dependency of Ray).

It starts ARGV and outlives nothing: on Linux it asks to receive SIGTERM when the actor that
started it dies (PR_SET_PDEATHSIG, so a driver killed with -9, whose Ray then ends the actor,
leaves no training behind) and becomes the subreaper of whatever ARGV starts
(PR_SET_CHILD_SUBREAPER: torchrun's workers, which run in sessions of their own, stay its
descendants even when torchrun itself is killed). On SIGTERM, SIGINT or SIGHUP it sends
SIGTERM to every descendant, SIGKILL after GRACE_S seconds to those left; when ARGV exits on
its own, whatever it left running goes the same way. It exits with ARGV's exit code (128 + the
signal's number when a signal ended it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

import psutil

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
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


def main(argv: list[str]) -> int:
    actor, grace_s, sep, command = int(argv[0]), float(argv[1]), argv[2], argv[3:]
    assert sep == "--" and command, "usage: supervise.py ACTOR_PID GRACE_S -- ARGV..."
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != actor:  # the actor died before the request above took effect
        return 128 + signal.SIGTERM
    try:
        child = subprocess.Popen(command)
    except OSError as err:
        print(f"task.command: cannot run {command[0]!r}: {err.strerror}", file=sys.stderr, flush=True)
        return 127
    while not _stop:
        code = child.poll()
        if code is not None:
            _end_all(grace_s)  # what the script left behind
            return code if code >= 0 else 128 - code
        if os.getppid() != actor:
            break
        time.sleep(0.05)
    _end_all(grace_s)  # (it reaps the script too: its own code is lost, and not wanted)
    return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
