"""Where a sweep's seconds go: its processes mark the stages they pass, for scripts/timeline.py.

With TUNER_TIMELINE naming a file, the driver and every trial process of a private local Ray
(which inherit the driver's environment) append one JSON line per stage: what, when (epoch
seconds), the process's CPU seconds so far, its pid, and with its first line when the process
was born and whether it was copied from the warm process (tuner.cluster.worker_fork). Unset
(always, outside the benchmark), `mark` is one dictionary look-up. Torch- and Ray-free.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "TUNER_TIMELINE"
COPIED_ENV = "TUNER_WORKER_COPIED"  # set in each Ray worker copied from tuner.cluster.worker_fork
_born: list[int] = []  # the pid that has written its birth (a forked child writes its own)


def mark(what: str, **facts: Any) -> None:
    """Append stage `what` (with `facts`) to $TUNER_TIMELINE, when it is set."""
    path = os.environ.get(ENV)
    if not path:
        return
    pid = os.getpid()
    line: dict[str, Any] = {"what": what, "t": time.time(), "cpu": time.process_time(), "pid": pid, **facts}
    if pid not in _born:
        _born[:] = [pid]
        line["born"] = _process_start(pid)
        line["copied"] = bool(os.environ.get(COPIED_ENV))  # (from the warm process: worker_fork)
    try:
        with open(path, "a") as f:  # one short write: lines of several processes do not mix
            f.write(json.dumps(line) + "\n")
    except OSError:  # a measurement never fails a sweep
        return


def _process_start(pid: int) -> float:
    """When this process started (epoch seconds, to the kernel's 10 ms tick), from /proc
    (Linux: its start in ticks since boot, against the boot clock now); 0.0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
