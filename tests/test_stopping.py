"""The stop signals of a watched driver (tuner/driver/stopping.py), without Ray: a command's
watcher and its driver as `python -m tuner` makes them, around a run that waits to be stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

# The command: SIGHUP ignored as nohup leaves it; its run waits inside user_stops until a stop
# signal, having said it is ready.
COMMAND = """
import os, signal, sys, time
from tuner.driver.stopping import INTERRUPTED, user_stops, watched
signal.signal(signal.SIGHUP, signal.SIG_IGN)

def run():
    with user_stops():
        open(sys.argv[1], "w").close()
        while not INTERRUPTED.wait(0.01):
            pass
        return 130

sys.exit(watched(run, lambda code, notified: 99))
"""


def _ignored(pid: int) -> int:
    """The signals the kernel discards for `pid` (its SigIgn mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn for {pid}")


def test_a_signal_ignored_when_the_command_began_stays_ignored_in_watcher_and_driver(tmp_path: Path) -> None:
    """`nohup python -m tuner sweep ...` runs on when its terminal closes: the watcher and the
    driver keep ignoring SIGHUP (they stopped the sweep: nohup's users lost it at logout). A
    signal not ignored stops it gracefully as before."""
    import psutil

    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", COMMAND, str(ready)], cwd=ROOT, start_new_session=True)
    try:
        while not ready.exists():  # (the driver inside user_stops: both have their handlers)
            assert proc.poll() is None, proc.returncode
            time.sleep(0.01)
        (driver,) = psutil.Process(proc.pid).children()
        for pid in (proc.pid, driver.pid):
            mask = _ignored(pid)
            assert mask >> (signal.SIGHUP - 1) & 1, f"{pid} handles SIGHUP"
            assert not mask >> (signal.SIGTERM - 1) & 1
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=600) == 130  # (a hang guard)
    finally:
        proc.kill()
        proc.wait()
