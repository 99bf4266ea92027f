"""`schedule.trial_timeout`: a trial that goes too long without finishing an epoch is ended.

A hung trial (a deadlock, a stuck data source, a collective waiting on a dead peer) would
otherwise hold its resources, and the sweep, forever. A thread of the trial's process (rank 0)
waits for the loop to finish each epoch; when `timeout_s` passes without one, it records the
failure in the trial's journal (`failure: timeout`, the worst metric, so the trial is never
promoted or best), writes every thread's stack to trial.log (where it hung), and ends the
process: Tune sees the trial fail and the rest of the sweep goes on. The hung thread itself
cannot be interrupted from Python (it may be blocked in C), hence the process exit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Optional

from tuner.trial.frame.journal import MetricsLog, read_metrics

TIMEOUT = "timeout"


class NoWatchdog:
    """What a trial without a timeout (or a rank other than 0) keeps: nothing."""

    def kick(self) -> None: ...
    def stop(self) -> None: ...

    def held(self) -> AbstractContextManager[None]:
        """Around the wait in the scheduler's report (`Session.held`)."""
        return contextlib.nullcontext()


class Watchdog(NoWatchdog):
    """Ends the trial process when `kick` is not called for `timeout_s` seconds."""

    def __init__(
        self,
        timeout_s: float,
        trial_dir: str,
        metric: str,
        worst: float,
        log: Optional[logging.Logger] = None,
        before_exit: Optional[Callable[[], None]] = None,
    ):
        self.timeout_s, self.trial_dir, self.metric, self.worst = timeout_s, trial_dir, metric, worst
        self.log = log or logging.getLogger(__name__)
        self.before_exit = before_exit  # the journal and log where the sweep lives (object storage)
        self._deadline = time.monotonic() + timeout_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tuner-watchdog", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """An epoch finished: the trial has another `timeout_s` for the next."""
        self._deadline = time.monotonic() + self.timeout_s

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No deadline while the trial waits in its report for the sweep's driver (Tune hands
        the report to the scheduler before the trial goes on: milliseconds, unless the driver
        is busy or stopped, or a scheduler pauses the trial at a rung, as Tune's synchronous
        HyperBand does): that time is not the epoch's, and a stalled driver is no hung trial.
        The next epoch gets `timeout_s` from the report's return."""
        self._deadline = math.inf
        try:
            yield
        finally:
            self.kick()

    def _watch(self) -> None:
        while not self._stopped.wait(max(0.0, min(self._deadline - time.monotonic(), 1.0))):
            if time.monotonic() >= self._deadline:
                self._expire()

    def _expire(self) -> None:
        rows = read_metrics(self.trial_dir)
        epoch = int(rows[-1]["epoch"]) if rows else 0
        detail = (
            f"no epoch finished within {self.timeout_s:g} s (schedule.trial_timeout); stacks in trial.log"
        )
        MetricsLog(self.trial_dir).append(
            {"epoch": epoch, self.metric: self.worst, "failure": TIMEOUT, "failure_detail": detail}
        )
        self.log.error("timeout: %s\n%s", detail, _stacks())
        for handler in self.log.handlers:
            handler.flush()
        if self.before_exit is not None:
            try:
                self.before_exit()
            except Exception:  # noqa: BLE001 - the store out too: the trial ends all the same
                self.log.exception("timeout: the journal could not be uploaded")
        os._exit(1)  # the hung thread cannot be stopped from here; the trial's process can


def make_watchdog(
    timeout_s: Optional[float],
    trial_dir: Optional[str],
    metric: str,
    worst: float,
    log: Any = None,
    before_exit: Optional[Callable[[], None]] = None,
) -> NoWatchdog:
    """A watchdog for the trial's main rank when a timeout is set, else one that does nothing."""
    if not timeout_s or not trial_dir:
        return NoWatchdog()
    return Watchdog(timeout_s, trial_dir, metric, worst, log, before_exit)


def _stacks() -> str:
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
        for ident, frame in frames.items()
        if names.get(ident) != "tuner-watchdog"
    )
