"""Ctrl-C and SIGTERM during a sweep: tuner's own signal handler, not Tune's.

The first SIGINT (Ctrl-C) or SIGTERM (`ray job stop`, a batch system) sets INTERRUPTED, and
Tune, asked through a Stopper (limits.UserStopped), ends the experiment at its next step:
running trials stop at their next report with their checkpoints kept, and are recorded as
unfinished (callbacks.TrialRecordCallback), for `tuner resume` to continue. A second stops at
once (KeyboardInterrupt). Tune's own SIGINT handler is switched off through its documented
TUNE_DISABLE_SIGINT_HANDLER: whether a trial was stopped by the user is decided from tuner's
own flag and the trial's state, never from the wording of one of Tune's log lines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

# Set by the first stop signal of the running sweep: the trials Tune stops after it were cut
# short by the user, not finished.
INTERRUPTED = threading.Event()
STOPPING = "[tuner] stopping: trials end at their next report, state is saved; Ctrl-C again to stop at once"


@contextlib.contextmanager
def user_stops() -> Iterator[None]:
    """Around Tune's fit(): the first SIGINT or SIGTERM stops the sweep gracefully, the next
    at once. Outside the main thread (where no handler can be set) Python's defaults stay."""
    INTERRUPTED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    again = before[signal.SIGINT] if callable(before[signal.SIGINT]) else signal.default_int_handler

    def first(signum: int, frame: Any) -> None:
        INTERRUPTED.set()
        signal.signal(signal.SIGINT, again)  # the next one stops at once
        try:
            print(STOPPING, file=sys.stderr, flush=True)
        except (OSError, ValueError, RuntimeError):  # a closed stream, or one in mid-write
            pass

    tune_handler = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, first)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        for s, handler in before.items():
            if handler is not None:  # (None: set outside Python, and not ours to restore)
                signal.signal(s, handler)
        if tune_handler is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = tune_handler
