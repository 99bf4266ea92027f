"""A model that interrupts its own sweep, for the resume tests (`tests.interrupt:after_builds`).

The driver gets SIGINT (a graceful Ctrl-C) when the `interrupt_at`-th trial model of the sweep
is built, counted in a file under `chaos_dir` (across the sweep's runs: a resumed trial builds
its model again). With one trial at a time that is the moment the first `interrupt_at - 1`
builds' trials have ended, whatever their timing. It fires once per `chaos_dir` and build:
the resumed sweep runs on. `interrupt_at` may list builds ("1,3"): interrupted at each, the
sweep resumed after each interruption is interrupted again at the next. With `hold_builds`: N,
a build returns once N builds have begun (trials that run at once are all mid-way when the
interrupt comes, however fast they train).
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from typing import Any

from torch import nn

from tuner.trial.loop.models import mlp


def after_builds(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    chaos = config["chaos_dir"]
    with open(os.path.join(chaos, "builds"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        builds = len(f.read()) + 1
        f.write("x")
    fired = os.path.join(chaos, f"fired-{builds}")
    at = {int(n) for n in str(config["interrupt_at"]).split(",")}
    if builds in at and not os.path.exists(fired):
        open(fired, "w").close()
        os.kill(int(config["driver_pid"]), signal.SIGINT)
    hold = int(config.get("hold_builds", 0))
    waited = time.monotonic()
    while builds < hold and _builds(chaos) < hold:
        # Only a broken sweep (the other trial never starting) waits this long: the test fails.
        assert time.monotonic() - waited < HOLD_LIMIT_S, f"build {builds} waited for build {hold}"
        time.sleep(0.05)
    return mlp(config, input_shape, num_classes)


HOLD_LIMIT_S = 600.0


def _builds(chaos: str) -> int:
    with open(os.path.join(chaos, "builds")) as f:
        return len(f.read())
