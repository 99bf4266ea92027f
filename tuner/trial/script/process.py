"""The training script of a `task.command` trial as a running process, seen from its actor.

`ScriptProcess` starts the command under `supervise.py` (its own process group, dies with the
actor), with its working directory and environment; copies its stdout and stderr, line by
line, into trial.log; keeps the last lines of stderr and the tracebacks it printed
(`trial.script.cause`) for the trial's error; and hands out the
reports the script made (`tuner.report` lines appended to the report file, and TUNER_REPORT
lines on stdout) in the order they arrived. `stop` ends it: SIGTERM, SIGKILL after a grace.
`stop_stale` stops an earlier run of the trial's script that is somehow still alive, so the
trial's files have one writer.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import IO, Any, Optional

import psutil

from tuner.trial.script.api import PREFIX
from tuner.trial.script.cause import Tracebacks

SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.py")
STOP_GRACE_S = 10.0  # from SIGTERM to SIGKILL, when a trial is stopped
STDERR_LINES = 20  # the tail of stderr kept for the trial's error
# A report is one epoch's numbers: a longer line is a mistake (an array, a whole log), and
# would be stored again in the journal, Tune's results and TensorBoard.
MAX_REPORT_BYTES = 64 * 1024
MAX_LOG_LINE = 8 * 1024  # of an output line copied into trial.log


class ProtocolError(Exception):
    """A TUNER_REPORT line (or report file line) that is not one JSON object."""


class ScriptProcess:
    """One run of the command; reports through `next_report`, then `returncode`."""

    def __init__(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        report_file: str,
        log: logging.Logger,
        record: Optional[str] = None,
    ):
        self.log, self.report_file = log, report_file
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.tracebacks = Tracebacks()  # what it raised, if it fails
        self._reports: queue.Queue[Any] = queue.Queue()
        self._offset, self._partial = 0, b""
        open(report_file, "ab").close()
        keep = ["--record", record] if record else []
        self.proc = subprocess.Popen(
            [sys.executable, SUPERVISOR, str(os.getpid()), str(STOP_GRACE_S), *keep, "--", *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a terminal's Ctrl-C is not its
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, "out"), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, "err"), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream: IO[bytes], name: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.log.info("%s| %s", name, _cut(line))
            if name == "err":
                self.stderr_tail.append(_cut(line, 500))
                self.tracebacks.feed(_cut(line, 2000))
            elif (text := _report_text(line)) is not None:
                self._reports.put(_parse(text, "stdout line"))
        stream.close()

    def _tail_file(self) -> None:
        """Queue the complete lines appended to the report file since the last look."""
        with open(self.report_file, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line.strip():
                self._reports.put(_parse(line.decode("utf-8", "replace"), "tuner.report line"))
        if len(self._partial) > MAX_REPORT_BYTES:  # no end in sight: never read as a whole
            self._reports.put(_parse(self._partial.decode("utf-8", "replace"), "tuner.report line"))
            self._partial = b""

    def next_report(self, timeout: float) -> Optional[dict[str, Any]]:
        """The next report (a ProtocolError raised for a malformed one); None when there is
        none within `timeout` seconds, or none left once `done`."""
        self._tail_file()
        try:
            item = self._reports.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, ProtocolError):
            raise item
        return item

    @property
    def done(self) -> bool:
        """Exited, its output read to the end and its reports all handed out."""
        if self.proc.poll() is None or any(t.is_alive() for t in self._readers):
            return False
        self._tail_file()
        return self._reports.empty()

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.poll()

    def stop(self) -> None:
        """End the script (a no-op once it has exited): SIGTERM to the supervisor, which
        passes it on and kills what is left after STOP_GRACE_S; then SIGKILL to its group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_S + 10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the supervisor's group: anything left
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for t in self._readers:
            t.join(timeout=5)


def stop_stale(record: str, log: logging.Logger) -> None:
    """Stop an earlier run of this trial's script that is still alive on this machine (its
    supervisor's `record`: pids and start times), before a new run starts: a trial's files
    have one writer. Its reports could not reach this run anyway (each run has its own report
    file); this ends its training, and its writes into the trial's directory."""
    try:
        with open(record) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return
    procs = []
    if isinstance(found, dict) and found.get("host") == socket.gethostname():
        for role in ("keeper", "script"):
            try:
                pid, created = found[role]
                p = psutil.Process(int(pid))
                if abs(p.create_time() - float(created)) < 0.01:  # that process, not a reused pid
                    procs.append(p)
            except (KeyError, TypeError, ValueError, psutil.Error):
                continue
    if procs:
        log.warning(
            "an earlier run of this trial's script is still running (pids %s): stopped",
            [p.pid for p in procs],
        )
        everyone = list(procs)
        for p in procs:
            try:
                everyone += p.children(recursive=True)
            except psutil.Error:
                continue
        for p in procs:  # the keeper ends its tree, the script may save its state
            _signal(p, signal.SIGTERM)
        _, left = psutil.wait_procs(everyone, timeout=STOP_GRACE_S)
        for p in left:
            _signal(p, signal.SIGKILL)
        psutil.wait_procs(left, timeout=5)
    try:
        os.remove(record)
    except OSError:
        pass


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.Error:
        pass


def _cut(line: str, limit: int = MAX_LOG_LINE) -> str:
    """A line shortened to `limit` characters, saying how much was left out."""
    return line if len(line) <= limit else f"{line[:limit]}... [{len(line) - limit} more characters]"


def _report_text(line: str) -> Optional[str]:
    """What follows the prefix of a stdout report line (None: no report), as torchrun's ranks
    leave it on the stdout they share. Each write of a rank stays whole (a pipe keeps a write
    of up to 4 KiB in one piece), but another rank's unfinished line may come before the
    prefix, and its output between the object and the newline (print writes them apart when
    Python's output is unbuffered): the line's one JSON object is the report. Inside a line,
    the prefix counts only when a JSON object follows it (text naming the protocol is no report)."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    text = line[at + len(PREFIX) :].lstrip()
    try:
        found, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        found, end = None, len(text)
    if at > 0 and not isinstance(found, dict):
        return None
    return text[:end]  # at the line's start and not a JSON object: _parse says so


def _parse(text: str, what: str) -> Any:
    if len(text) > MAX_REPORT_BYTES:
        return ProtocolError(
            f"{what} of {len(text)} bytes (at most {MAX_REPORT_BYTES}): report an epoch's numbers, not data"
        )
    try:
        row = json.loads(text)
    except ValueError as err:
        return ProtocolError(f"{what} is not JSON ({err}): {text[:200]}")
    if not isinstance(row, dict):
        return ProtocolError(f"{what} is not a JSON object: {text[:200]}")
    return row
