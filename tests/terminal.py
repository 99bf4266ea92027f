"""A terminal for tests: a command run as the foreground job of a small shell on a
pseudo-terminal, as a user's shell runs it. `type` sends keys (Ctrl-Z: the kernel stops the
foreground group, as a real terminal's does), `fg` continues the job, `hang_up` closes the
terminal: the kernel hangs it up and signals the shell, which passes SIGHUP (and SIGCONT) on to
its job as bash does, then exits with the job's exit code once it ends. What the terminal
showed until then is in `log`."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

CTRL_Z = b"\x1a"

# The shell: the terminal's controlling process; its job a process group of its own, in the
# terminal's foreground, begun with the signals' default dispositions.
SHELL = """
import fcntl, os, signal, subprocess, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGTSTP):  # (whatever the tests had)
    signal.signal(s, signal.SIG_DFL)
job = subprocess.Popen(sys.argv[1:], process_group=0)
os.tcsetpgrp(0, job.pid)

def hangup(signum, frame):
    for s in (signal.SIGHUP, signal.SIGCONT):
        try:
            os.killpg(job.pid, s)
        except ProcessLookupError:
            pass

signal.signal(signal.SIGHUP, hangup)
code = job.wait()
sys.exit(code if code >= 0 else 128 - code)
"""


class Terminal:
    """`argv` run in a shell on a terminal; `proc` is the shell (its exit code is the job's)."""

    def __init__(self, argv: list[str], log: Path, **popen: Any):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SHELL, *argv], stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True, **popen,
        )  # fmt: skip
        os.close(slave)
        self.log = log
        self._open = True
        self._reader = threading.Thread(target=self._show, args=(open(log, "wb"),), daemon=True)
        self._reader.start()

    def _show(self, out: Any) -> None:
        with out:
            while self._open:
                if select.select([self.master], [], [], 0.05)[0]:
                    try:
                        data = os.read(self.master, 1 << 16)
                    except OSError:  # (every writer gone)
                        return
                    if not data:
                        return
                    out.write(data)
                    out.flush()

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def fg(self) -> None:
        """As the shell's `fg`: the stopped job, still in the foreground, continues."""
        import psutil

        for job in psutil.Process(self.proc.pid).children():
            os.killpg(job.pid, signal.SIGCONT)

    def hang_up(self) -> None:
        self._open = False
        self._reader.join()  # (not reading it when it closes: a read would keep it open)
        os.close(self.master)
