"""User errors and exit codes: the one place both are defined.

Imports nothing of tuner, so every module (config, cluster, driver, CLI) can use it.
"""

from __future__ import annotations

import re
from enum import IntEnum
from typing import Any


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


def error_line(error: dict[str, Any], value: Any = None) -> str:
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
