"""A model that interrupts its own sweep, for the resume tests (`tests.interrupt:after_builds`).

The driver gets SIGINT (a graceful Ctrl-C) when the `interrupt_at`-th trial model of the sweep
is built, counted in a file under `chaos_dir` (across the sweep's runs: a resumed trial builds
its model again). With one trial at a time that is the moment the first `interrupt_at - 1`
builds' trials have ended, whatever their timing. It fires once per `chaos_dir` and build:
the resumed sweep runs on. `interrupt_at` may list builds ("1,3"): interrupted at each, the
sweep resumed after each interruption is interrupted again at the next. With `hold_builds`: N,
a build returns once N builds have begun (trials that run at once are all mid-way when the
interrupt comes, however fast they train). With `await_stop` (a driver in the test's own
process, inside `heard(chaos_dir)`), the build that interrupts returns only once the driver has
taken the SIGINT (stopping.INTERRUPTED): its trial's first report then finds the sweep
stopping, however fast the trial trains.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
        if config.get("await_stop"):  # (an in-process driver that says when it heard: `heard`)
            waited = time.monotonic()
            while not os.path.exists(os.path.join(chaos, f"heard-{builds}")):
                assert time.monotonic() - waited < HOLD_LIMIT_S, (
                    f"the driver never heard build {builds}'s SIGINT"
                )
                time.sleep(0.01)
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


@contextmanager
def heard(under: str) -> Iterator[None]:
    """In the test's process, around its in-process sweeps: each SIGINT a build fired (a
    fired-N in a chaos directory anywhere under `under`), once the driver has taken it
    (stopping.INTERRUPTED), is acknowledged beside it (heard-N)."""
    import glob
    import threading

    from tuner.driver.stopping import INTERRUPTED

    done = threading.Event()

    def listen() -> None:
        while not done.wait(0.01):
            if INTERRUPTED.is_set():
                for fired in glob.glob(os.path.join(under, "**", "fired-*"), recursive=True):
                    ack = os.path.join(os.path.dirname(fired), "heard-" + fired.rsplit("fired-", 1)[1])
                    if not os.path.exists(ack):
                        open(ack, "w").close()

    thread = threading.Thread(target=listen, name="interrupt-heard", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
