"""The training script of a `task.command` trial as a running process, seen from its actor.

`ScriptProcess` starts the command under `supervise.py` (its own process group, dies with the
actor), with its working directory and environment; copies its stdout and stderr, line by
line, into trial.log; keeps the last lines of stderr for the trial's error; and hands out the
reports the script made (`tuner.report` lines appended to the report file, and TUNER_REPORT
lines on stdout) in the order they arrived. `stop` ends it: SIGTERM, SIGKILL after a grace.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import IO, Any, Optional

from tuner.trial.script import PREFIX

SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.py")
STOP_GRACE_S = 10.0  # from SIGTERM to SIGKILL, when a trial is stopped
STDERR_LINES = 20  # the tail of stderr kept for the trial's error


class ProtocolError(Exception):
    """A TUNER_REPORT line (or report file line) that is not one JSON object."""


class ScriptProcess:
    """One run of the command; reports through `next_report`, then `returncode`."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], report_file: str, log: logging.Logger):
        self.log, self.report_file = log, report_file
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._reports: queue.Queue[Any] = queue.Queue()
        self._offset, self._partial = 0, b""
        open(report_file, "ab").close()
        self.proc = subprocess.Popen(
            [sys.executable, SUPERVISOR, str(os.getpid()), str(STOP_GRACE_S), "--", *argv],
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
            self.log.info("%s| %s", name, line)
            if name == "err":
                self.stderr_tail.append(line)
            elif line.startswith(PREFIX):
                self._reports.put(_parse(line[len(PREFIX) :], "stdout line"))
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


def _parse(text: str, what: str) -> Any:
    try:
        row = json.loads(text)
    except ValueError as err:
        return ProtocolError(f"{what} is not JSON ({err}): {text[:200]}")
    if not isinstance(row, dict):
        return ProtocolError(f"{what} is not a JSON object: {text[:200]}")
    return row
