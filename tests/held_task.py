"""benchmarks' conditional task.train (`train_both`), whose N-th fresh start waits for a file.

With TUNER_TEST_HOLD=DIR:N in the trials' environment, the N-th trial to start from nothing
(counted in DIR across the sweep's runs) writes DIR/waiting (its pid) and waits, before its first report,
until DIR/go exists. With one trial at a time that is a moment when every earlier trial has
ended and every report has been judged, however fast the machine: a driver killed then leaves
no report unjudged (tests/test_stoppers_sweep.py says why that matters)."""

from __future__ import annotations

import fcntl
import os
import time
from typing import Any

from benchmarks.tasks.conditional import train_both


def train_both_held(config: dict[str, Any], ctx: Any) -> None:
    hold = os.environ.get("TUNER_TEST_HOLD")
    if hold and ctx.epoch == 0:
        gate, at = hold.rsplit(":", 1)
        with open(os.path.join(gate, "starts"), "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            starts = len(f.read()) + 1
            f.write("x")
        if starts == int(at):
            with open(os.path.join(gate, "waiting"), "w") as f:
                f.write(str(os.getpid()))  # (the test waits for it to be gone, once killed)
            while not os.path.exists(os.path.join(gate, "go")):
                time.sleep(0.05)
    train_both(config, ctx)
