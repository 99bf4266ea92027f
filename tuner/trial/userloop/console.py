"""Where the user's own loop (`task.train`) runs, and where what it prints goes.

Ray starts each trial in a working directory of its own, so a user's `open("data.txt")`
found nothing, and a trial actor's output is Ray's worker log, which the sweep's console
does not show: `print()` reached no file of the trial. `as_started` runs the function in the
directory the sweep was started from (as a `task.command` script runs), and copies what it
writes to sys.stdout and sys.stderr, line by line, into trial.log as `out| ...` and
`err| ...` (as a script's output is), besides where it went before.

A reused actor imports the user's module once, for its first trial: what the import printed
(a library's banner, a warning Python shows once per process) reached that trial's log only.
`import_once` keeps those lines and writes them again, under a line naming the trial they came
from, into the log of each later trial of the process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Optional, TextIO, TypeVar

T = TypeVar("T")
# Per user module (task.train's "pkg.mod:fn"): the trial this process first imported it for,
# and the lines the import printed.
_FIRST_IMPORT: dict[str, tuple[str, list[str]]] = {}


@contextlib.contextmanager
def as_started(start_dir: Optional[str], log: Optional[logging.Logger]) -> Iterator[None]:
    """Run the block in `start_dir` (when it exists here: on another node of a cluster it may
    not), with its output copied into `log` (None: left alone, as on ranks other than 0)."""
    before = os.getcwd()
    if start_dir and os.path.isdir(start_dir):
        os.chdir(start_dir)
    streams = (sys.stdout, sys.stderr)
    out = err = None
    if log is not None:
        sys.stdout = out = LineLog(log, "out", streams[0])
        sys.stderr = err = LineLog(log, "err", streams[1])
    try:
        yield
    finally:
        for copy in (out, err):
            if copy is not None:
                copy.end()
        sys.stdout, sys.stderr = streams
        with contextlib.suppress(OSError):  # (Ray's trial directory, unless removed meanwhile)
            os.chdir(before)


class LineLog(io.TextIOBase):
    """A text stream whose complete lines go to `log` (and everything to `also`)."""

    def __init__(self, log: logging.Logger, name: str, also: Optional[TextIO]):
        super().__init__()
        self.log, self.name, self.also = log, name, also
        self._partial = ""
        self._lock = threading.Lock()  # print() from the user's threads too

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            for line in lines:
                self.log.info("%s| %s", self.name, line.rstrip("\r"))
        if self.also is not None:
            with contextlib.suppress(Exception):  # (a closed stream must not end the trial)
                self.also.write(text)
        return len(text)

    def flush(self) -> None:
        if self.also is not None:
            with contextlib.suppress(Exception):
                self.also.flush()

    def fileno(self) -> int:  # what subprocesses and faulthandler ask for: the real stream's
        if self.also is None:
            raise io.UnsupportedOperation("fileno")
        return self.also.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.also, "encoding", None) or "utf-8"

    def end(self) -> None:
        """The last line, without its newline, to the log. (Not `close`: a thread of the user's
        that outlives the function may still write to it.)"""
        with self._lock:
            if self._partial:
                self.log.info("%s| %s", self.name, self._partial)
                self._partial = ""
        self.flush()


def import_once(ref: str, log: Optional[logging.Logger], trial_id: str, load: Callable[[], T]) -> T:
    """`load()`, the import of the user's `ref`; what it printed (copied into `log` as it
    was printed) is kept, and written again into the `log` of every later trial of this
    process, whose import finds the module loaded and prints nothing."""
    first = _FIRST_IMPORT.get(ref)
    if first is not None:
        if log is not None and first[1]:
            log.info(
                "printed once by this process (pid %d) when it imported %s, for trial %s:",
                os.getpid(), ref, first[0],
            )  # fmt: skip
            for line in first[1]:
                log.info("%s", line)
        return load()
    lines: list[str] = []
    keep = _Keep(lines)
    if log is not None:
        log.addHandler(keep)
    try:
        loaded = load()
    finally:
        if log is not None:
            log.removeHandler(keep)
    _FIRST_IMPORT[ref] = (trial_id, lines)  # (not when the import failed: the next one prints again)
    return loaded


class _Keep(logging.Handler):
    """Keeps the output lines (`out| ...`, `err| ...`) logged while it is attached."""

    def __init__(self, into: list[str]):
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("out| ", "err| ")):
            self.into.append(message)
