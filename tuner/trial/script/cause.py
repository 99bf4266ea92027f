"""Why a script failed, from what it wrote on stderr: the Python traceback it ended with.

A script that raises prints its traceback on stderr and exits 1; that exception's line is what
the user would call the failure (`AttributeError: 'GPTConfig' object has no attribute
'flash'`), not the exit code, nor the last lines of stderr. Under torchrun those are torchrun's
own: its ChildFailedError with a banner of pids and timestamps (`exitcode : 1 (pid: 4976) |
error_file: <N/A> | ...`), which differed from trial to trial, so `failure.fail_fast` never
saw two trials fail alike. torchrun's workers print their tracebacks on the same stderr, each
line prefixed `[rankN]: ` once the process group is up (torch >= 2.2), and the banner names
the rank that failed first ("Root Cause (first observed failure)").

`Tracebacks` reads stderr line by line (prefixes kept apart, so two ranks failing at once do
not mix) and keeps the tracebacks it saw; `cause` picks the failure: the root cause rank's
last traceback under torchrun, else the last traceback that is not torchrun's own, else the
last line that looks like an exception (a SyntaxError has no "Traceback" header).
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import Optional

HEADER = "Traceback (most recent call last):"
CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# A worker's line as torch.distributed prints it ("[rank1]: ...") or torchrun's --tee ("[default0]:...").
_PREFIX = re.compile(r"^(\[(?:rank|default)\d+\]:) ?")
_RANK = re.compile(r"^\[(?:rank|default)(\d+)\]:$")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
EXCEPTION = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt|OOM)\b")
# torchrun's own exceptions (its ChildFailedError, a signal it got): never the user's failure.
LAUNCHER = re.compile(r"^torch\.distributed\.elastic\.")
MAX_LINES = 200  # of one traceback: its start and its end are kept
MAX_KEPT = 16  # tracebacks remembered (the last ones)
MESSAGE_LINES = 20  # read after an exception's line: its message's, or a chain's next part


@dataclass(frozen=True)
class Cause:
    """A failure: its exception line, its traceback as printed (prefixes removed), and the
    rank that printed it (None: not a torchrun worker's, or before its process group)."""

    line: str
    text: str
    rank: Optional[int] = None


class _Open:
    """A traceback being read: its lines, and its exception line once seen."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.dropped = 0
        self.exception: Optional[str] = None
        self.after = 0  # lines read since the exception's

    def add(self, line: str) -> None:
        if len(self.lines) >= MAX_LINES:  # keep the start and the end: drop from the middle
            del self.lines[MAX_LINES // 2]
            self.dropped += 1
        self.lines.append(line)

    def text(self) -> str:
        lines = list(self.lines)
        if self.dropped:
            lines.insert(MAX_LINES // 2, f"  ... [{self.dropped} lines left out]")
        return "\n".join(lines)


class Tracebacks:
    """The Python tracebacks in a stream of stderr lines, per line prefix."""

    def __init__(self) -> None:
        self.done: collections.deque[Cause] = collections.deque(maxlen=MAX_KEPT)
        self._open: dict[str, _Open] = {}
        self._last_exception: Optional[str] = None  # any line that looks like one
        self._root: Optional[int] = None  # the rank torchrun names as the first to fail
        self._in_root = False

    def feed(self, line: str) -> None:
        m = _PREFIX.match(line)
        key, body = (m.group(1), line[m.end() :]) if m else ("", line)
        if not m:
            self._banner(body)
        if EXCEPTION.match(body) and not LAUNCHER.match(body):
            self._last_exception = body.strip()
        tb = self._open.get(key)
        if body.startswith(HEADER):
            if tb is not None and tb.exception is not None and not self._chained(tb):
                self._close(key)  # a traceback of its own, not the next of a chain
                tb = None
            if tb is None:
                tb = self._open[key] = _Open()
            tb.add(body)
            tb.exception, tb.after = None, 0
        elif tb is None:
            return
        elif tb.exception is None:  # its frames, then the exception's line at the margin
            tb.add(body)
            if body and not body[0].isspace() and body.strip() not in CHAINED:
                tb.exception = body.strip()
        elif tb.after < MESSAGE_LINES:  # the exception's message may go on; a chain may follow
            tb.add(body)
            tb.after += 1
        else:
            self._close(key)

    def _chained(self, tb: _Open) -> bool:
        return any(ln.strip() in CHAINED for ln in tb.lines[-3:])

    def _close(self, key: str) -> None:
        tb = self._open.pop(key, None)
        if tb is None or tb.exception is None:
            return
        rank = _RANK.match(key)
        self.done.append(Cause(tb.exception, tb.text().rstrip("\n"), int(rank.group(1)) if rank else None))

    def _banner(self, body: str) -> None:
        """torchrun's banner: "Root Cause (first observed failure):" then "rank : N (...)"."""
        if body.startswith("Root Cause (first observed failure)"):
            self._in_root = True
        elif self._in_root and (m := _ROOT_RANK.match(body)):
            self._root, self._in_root = int(m.group(1)), False

    def cause(self) -> Optional[Cause]:
        """The failure the stream ended with, as the user would name it; None if it shows none."""
        for key in list(self._open):
            self._close(key)
        found = [c for c in self.done if not LAUNCHER.match(c.line)]
        first = [c for c in found if c.rank == self._root] if self._root is not None else []
        if first or found:
            return (first or found)[-1]
        if self._last_exception:
            return Cause(self._last_exception, self._last_exception)
        return None

    @property
    def root_rank(self) -> Optional[int]:
        """The rank torchrun named as the first to fail, if it did."""
        return self._root
