"""User errors, warnings and exit codes: the one place they are defined.

Imports nothing of tuner, so every module (config, cluster, driver, CLI) can use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Iterator
from enum import IntEnum
from typing import Any, Optional


class ExitCode(IntEnum):
    """What `python -m tuner ...` exits with."""

    OK = 0  # every planned trial finished and there is a best trial; a command succeeded
    ERRORS = 1  # some trial ended in an error, no trial produced a usable result, or a command failed
    USAGE = 2  # bad input: nothing started, nothing written
    INTERRUPTED = 130  # Ctrl-C / SIGTERM; `tuner resume` continues


EXIT_HELP = "Exit codes: 0 ok, 1 failed trials or no result, 2 bad input, 130 interrupted."


class ConfigError(Exception):
    """A user mistake in a sweep file or flag; `str()` is one line naming the field path.

    Not a ValueError on purpose: pydantic would wrap it and lose the path.
    """

    def __init__(self, path: str, message: str):
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}" if path else message)


class MissingMetricError(Exception):
    """A trial's first report lacks the sweep's metric: the trial ends at once (ERROR) instead
    of reporting nothing to its scheduler epoch after epoch; `str()` is one line."""

    def __init__(self, metric: str, reported: list[str]):
        listed = ", ".join(reported) or "none"
        super().__init__(
            f"metric '{metric}' is not among the values the trial reported ({listed}); "
            "set metric: to one of them, or report it (task.metrics' {name: value} is reported "
            "as val_<name>)"
        )


class DiskFull(Exception):
    """The disk under the sweep filled up: the sweep stops as if interrupted, to be resumed."""

    def __init__(self, sweep_dir: str, cause: str):
        super().__init__(
            f"the disk under {sweep_dir} is full ({cause}); the sweep stopped. Kept: every finished "
            "trial and each unfinished trial's newest checkpoint. Free some space, then continue "
            f"with: python -m tuner resume {sweep_dir}"
        )


class StorageUnavailable(Exception):
    """The sweep's object storage did not answer (or refused the credentials) for longer than
    tuner waits for it: the sweep stops as if interrupted, to be resumed."""

    def __init__(self, why: str, waited: float, where: str = ""):
        self.why, self.waited, self.where = why, waited, where
        super().__init__(self.line())

    def line(self) -> str:
        at = f"{self.where}: " if self.where else ""
        again = (
            f" with: python -m tuner resume {self.where}" if self.where else " with `python -m tuner resume`"
        )
        return (
            f"{at}{self.why} for {self.waited:.0f} s; the sweep stopped. Kept: every finished trial "
            f"and each unfinished trial's newest checkpoint in the store. Once it answers, continue{again}"
        )

    def at(self, where: str) -> StorageUnavailable:
        """The same, saying which sweep."""
        return StorageUnavailable(self.why, self.waited, where)

    def __reduce__(self) -> tuple[Any, ...]:  # (raised in a trial, it crosses Ray pickled)
        return (StorageUnavailable, (self.why, self.waited, self.where))


def storage_unavailable(err: BaseException) -> Optional[StorageUnavailable]:
    """The StorageUnavailable that `err` is, or was caused by (raised in a Tune callback, it
    reaches the driver wrapped by Ray)."""
    seen: set[int] = set()
    cur: Optional[BaseException] = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, StorageUnavailable):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


_FULL = (errno.ENOSPC, errno.EDQUOT)
FULL_WORDS = ("No space left on device", "Disk quota exceeded", f"[Errno {errno.ENOSPC}]")


def disk_full(err: BaseException) -> Optional[str]:
    """The line saying the disk is full, if that is what `err` (or what caused it) means."""
    seen: set[int] = set()
    cur: Optional[BaseException] = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _FULL:
            return os.strerror(cur.errno)
        text = str(cur)
        if any(w in text for w in FULL_WORDS):  # wrapped by Ray or pyarrow as text
            return "No space left on device"
        cur = cur.__cause__ or cur.__context__
    return None


_warned: set[str] = set()
_hushed = 0  # > 0: inside `hushed()`


def warn(message: str) -> None:
    """A warning on stderr, once per process (paths are resolved more than once)."""
    if message not in _warned and not _hushed:
        _warned.add(message)
        print(f"[tuner] warning: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def hushed() -> Iterator[None]:
    """No warnings within: a sweep's file read back by a command that only reads it (report,
    export): what it warns about was said when the sweep ran."""
    global _hushed
    _hushed += 1
    try:
        yield
    finally:
        _hushed -= 1


def validation_message(error: dict[str, Any], value: Any = None) -> str:
    """One of pydantic's validation errors as the message of a ConfigError."""
    kind, msg = error["type"], error["msg"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; `tuner schema` lists the valid keys)"
    msg = re.sub(r"^(Value|Assertion) error, ", "", msg)
    msg = msg[:1].lower() + msg[1:]
    if value is not None and repr(value) not in msg:
        msg = f"{msg} (got {value!r})"
    return msg
