"""A sweep directory's ground rules on this machine, in one place:

- `<output>/<name>` is a child of output (a name is one path component, never `.` or `..`),
  checked once the path is resolved;
- one tuner run at a time writes a sweep (or a working copy of one in object storage): the
  place's `claim` (tuner.sweepdir.place) creates it and takes an exclusive lock here (`flock`
  on `.tuner.lock`, which names the holder) before Ray starts, and a second run is refused in
  one line; the kernel drops the lock when its holder exits, however it ends;
- which sweep a directory holds: its sweep.yaml, compared field by field (`difference`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from typing import Optional

from tuner.errors import ConfigError
from tuner.sweepdir.files import CODE_FILE, CONFIG_FILE, LOCK_FILE, empty_config_message


def resolve(storage: str, name: str) -> str:
    """`<storage>/<name>`, refused unless it is a directory directly inside storage."""
    path = os.path.normpath(os.path.join(storage, name))
    if not name or os.path.dirname(path) != os.path.normpath(storage):
        raise ConfigError("name", f"'{name}' is not one directory name inside output")
    return path


def make(path: str) -> bool:
    """Create the directory; True if this call created it. Errors name the field at fault."""
    parent = os.path.dirname(path)
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError("output", f"{existing} is a file, not a directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError("name", f"{path} is a file, not a directory")
    try:
        os.makedirs(path)
        return True
    except FileExistsError:
        return False
    except OSError as err:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        field = "output"
        if err.errno == errno.ENAMETOOLONG and len(os.path.basename(path).encode()) > name_max:
            field = "name"  # this filesystem's names are shorter than the usual 255 bytes
        raise ConfigError(field, f"cannot create {path}: {err.strerror}") from None


_command_pid: Optional[int] = None  # the command the user started, when it is not this process


def held_for(pid: int) -> None:
    """Name `pid` as the holder of what this process claims: the `python -m tuner` command the
    user started and can stop, which runs this process as its driver (driver/stopping.py)."""
    global _command_pid
    _command_pid = pid


def holder_pid() -> int:
    """The pid a lock (or a lease in object storage) names as its holder."""
    return _command_pid or os.getpid()


def lock(path: str, field: str, command: str) -> int:
    lock = os.path.join(path, LOCK_FILE)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ConfigError(field, f"cannot write in {path}: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        error = _in_use(path, field, fd)
        os.close(fd)
        raise error from None
    os.ftruncate(fd, 0)
    pid = holder_pid()
    note = {"pid": pid, "host": socket.gethostname(), "command": command, "since": time.time()}
    os.pwrite(fd, json.dumps(note).encode(), 0)
    return fd


def refuse_if_held(path: str, field: str = "") -> None:
    """Refuse a directory another run holds, changing nothing (`resume` asks this first, before
    it reads a sweep.yaml the holder may not have written yet)."""
    try:
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(path, field, fd) from None
    finally:
        os.close(fd)


def _in_use(path: str, field: str, fd: int) -> ConfigError:
    return ConfigError(
        field, f"{path} is in use by another tuner run ({_holder(fd)}); wait for it to end or stop it"
    )


def _holder(fd: int) -> str:
    try:
        note = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(note["since"])))
        return f"`{note['command']}`, pid {int(note['pid'])} on {note['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "holder not yet recorded"


def refuse_existing(path: str) -> None:
    """Never write into a sweep that is already there: results are the user's."""
    if not os.path.isdir(path):
        return
    empty = empty_config_message(path)
    if empty:
        raise ConfigError("name", f"{empty}; or choose another --name")
    if set(os.listdir(path)) - {LOCK_FILE}:
        raise already_held(path)


def already_held(where: str) -> ConfigError:
    """The refusal of a new sweep where one is already (a directory, or an s3:// prefix)."""
    return ConfigError(
        "name",
        f"{where} already holds a sweep; continue it with `python -m tuner resume {where}` "
        "(`--retry-failed` also runs its failed trials again), or choose another --name or --output",
    )


def config_files(path: str) -> list[str]:
    """The files `Claim.write_config` writes in the sweep directory `path`."""
    return [os.path.join(path, CODE_FILE), os.path.join(path, CONFIG_FILE)]


def holds_sweep(path: str) -> bool:
    """Whether `path` holds a sweep (its sweep.yaml), started or finished."""
    return os.path.isfile(os.path.join(path, CONFIG_FILE))


# Where a sweep lives, not what it is: the same sweep may be found from another working
# directory (a relative output), or in a directory renamed since.
_PLACE = ("output", "name")


def difference(there: dict, here: dict) -> Optional[str]:
    """The first field (dotted) in which two sweep configs differ, as "field: A there, B here";
    None when they are the same sweep. Both are sweep.yaml data, read back the same way."""
    there = {k: v for k, v in there.items() if k not in _PLACE}
    here = {k: v for k, v in here.items() if k not in _PLACE}
    return _first_difference(there, here, "")


def _first_difference(a: object, b: object, at: str) -> Optional[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            found = _first_difference(a.get(key), b.get(key), f"{at}.{key}" if at else str(key))
            if found:
                return found
        return None
    if a == b:
        return None
    return f"{at}: {json.dumps(a, default=str)} there, {json.dumps(b, default=str)} here"


def remove_unstarted(path: str) -> None:
    """A new sweep directory that never got its sweep.yaml: removed, if nothing else is in it."""
    try:
        os.remove(os.path.join(path, LOCK_FILE))
        os.rmdir(path)  # only if nothing else appeared in it
    except OSError:
        pass


def recorded(path: str) -> dict:
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
