"""A model that interrupts its own sweep, for the resume tests (`tests.interrupt:after_builds`).

The driver gets SIGINT (a graceful Ctrl-C) when the `interrupt_at`-th trial model of the sweep
is built, counted in a file under `chaos_dir`. With one trial at a time that is the moment the
first `interrupt_at - 1` trials have ended, whatever their timing. It fires once per
`chaos_dir`: the resumed sweep runs to its end.
"""

from __future__ import annotations

import fcntl
import os
import signal
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
    fired = os.path.join(chaos, "fired")
    if builds == int(config["interrupt_at"]) and not os.path.exists(fired):
        open(fired, "w").close()
        os.kill(int(config["driver_pid"]), signal.SIGINT)
    return mlp(config, input_shape, num_classes)
