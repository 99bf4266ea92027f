"""Where one sweep lives, as one handle: a directory, or a prefix in object storage.

Every reader and writer of a sweep (the driver and its callbacks, the dashboard, MLflow
tracking, the autotune choice, warm start, resume, extend, report, board, export, load_best)
holds a `Place` and asks it, never a path and a "remote or not" of its own (the shape of
optuna's `BaseStorage` and syne-tune's `TrialBackend`):

- `uri`: the sweep as the user names it, normalised once (an absolute directory, or
  `s3://bucket/prefix/name` without a slash at its end: tuner/config/storage.py);
- `local`: its working copy, where its files are read and written: the directory itself, or
  a mirror of the bucket under the cache (`$TUNER_CACHE_DIR`, else ~/.cache/tuner);
- `exists()`: it holds a sweep (its sweep.yaml);
- `claim(new, command)`: one run at a time wherever the runs are (the lock on this machine:
  sweepdir/claim.py; a lease in the bucket: sweepdir/lease.py), and for an existing sweep its
  working copy brought up to date under it;
- `pull()`, `push(paths)`, `write(path, text)`: the working copy and the place kept in step
  (a write is atomic, and uploaded when the place is remote);
- `ray_storage()`: Ray's storage triple (storage_path, storage_filesystem, name);
- `siblings()`: the other sweeps beside it in output (`search.warm_start: auto`);
- `reader()`: a place to read it from beside a driver that may be writing it.

A new storage scheme is a subclass of `Place` in a module of its own here, one entry in
`SCHEMES`, and its name in tuner/config/storage.py's SCHEMES.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Optional, Union

import tuner.sweepdir.claim as local_lock
from tuner.config.storage import is_uri, parse_uri
from tuner.errors import ConfigError
from tuner.sweepdir.files import BEST_RECORD, CODE_FILE, CONFIG_FILE, check_sweep_dir, write_atomic

if TYPE_CHECKING:
    from tuner.config import SweepConfig

# scheme -> "module:class" of its Place, imported when a place of that scheme is first made.
SCHEMES = {"s3": "tuner.sweepdir.remote:S3Place"}


def place_for(output: str, name: str) -> Place:
    """The place of the sweep `<output>/<name>` (a sweep file's output and name). `name` is
    one directory name inside output (a ConfigError on `name` otherwise)."""
    if is_uri(output):
        where = parse_uri(output)
        if not name or "/" in name or name in (".", ".."):
            raise ConfigError("name", f"'{name}' is not one directory name inside output")
        return _scheme(where.scheme)(where.child(name))
    return Place(local_lock.resolve(os.path.abspath(os.path.expanduser(output)), name))


def place_of(where: str, field: str = "") -> Place:
    """The place of a sweep named by its directory or URI (on the command line, in
    warm_start.json). A URI is refused in one line on `field` when it cannot name a sweep."""
    if is_uri(where):
        uri = parse_uri(where, field)
        if not uri.key:
            raise ConfigError(field, f"{where}: a sweep is a prefix inside the bucket, not the bucket itself")
        return _scheme(uri.scheme)(uri)
    return Place(os.path.abspath(os.path.expanduser(where)))


def cache_root() -> str:
    """Where tuner keeps what it may make again: working copies of sweeps in object storage,
    the autotune cache ($TUNER_CACHE_DIR, else $XDG_CACHE_HOME/tuner or ~/.cache/tuner)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.environ.get("TUNER_CACHE_DIR") or os.path.join(base, "tuner")


def reading(where: Union[str, Place]) -> Place:
    """The place a reader reads a sweep from: one named by its directory or URI is read from a
    copy of its own (never a driver's working copy); a Place is used as it is (the driver's
    own, as its sweep ends)."""
    return where if isinstance(where, Place) else place_of(where).reader()


def _scheme(scheme: str) -> Any:
    module, cls = SCHEMES[scheme].split(":")
    return getattr(importlib.import_module(module), cls)


class Place:
    """A sweep in a directory on this machine (or one every node mounts): its own working copy.

    Subclasses (a sweep in object storage: tuner.sweepdir.remote.S3Place) keep a copy of their
    own and move files between it and the store."""

    remote = False  # whether Ray uploads what a trial writes (SyncConfig's sync_artifacts)

    def __init__(self, path: str):
        self.uri = path
        self.local = path
        self.parent, self.name = os.path.split(path)

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Place) and (type(self), self.uri, self.local) == (
            type(other),
            other.uri,
            other.local,
        )

    def __hash__(self) -> int:
        return hash((type(self), self.uri, self.local))

    # ------------------------------------------------------------------ what is there

    def exists(self) -> bool:
        """Whether it holds a sweep (its sweep.yaml), started or finished."""
        return os.path.isfile(os.path.join(self.local, CONFIG_FILE))

    def check(self) -> None:
        """Refuse (ConfigError on output, one line) a place this run could not use."""

    def read(self, name: str) -> Optional[str]:
        """A file of the sweep (`name` relative to it) as text; None when it is not there."""
        try:
            with open(os.path.join(self.local, name)) as f:
                return f.read()
        except (OSError, UnicodeDecodeError):
            return None

    def siblings(self) -> list[Place]:
        """The other sweeps in the same output, each once however many names (symlinks) lead
        to it, in the order of their names."""
        if not os.path.isdir(self.parent):
            return []
        own = os.path.realpath(self.uri)
        found: dict[str, Place] = {}
        for entry in sorted(os.listdir(self.parent)):
            path = os.path.join(self.parent, entry)
            real = os.path.realpath(path)
            if real == own or not os.path.isfile(os.path.join(path, CONFIG_FILE)):
                continue
            if real not in found or (found[real].uri != real and not os.path.islink(path)):
                found[real] = Place(path)  # the directory's own name where it is listed
        return sorted(found.values(), key=lambda p: p.name)

    # ------------------------------------------------------------------ the lock

    @contextlib.contextmanager
    def lease(self, field: str, command: str) -> Iterator[None]:
        """What keeps runs elsewhere out, held with the local lock (sweepdir/claim.py): nothing
        more for a directory (the lock file is in it, and every run sees it)."""
        yield

    def refuse_if_held(self, field: str = "") -> None:
        """Refuse a sweep another run holds, changing nothing."""
        local_lock.refuse_if_held(self.local, field)

    def refuse_existing(self) -> None:
        """A new sweep: refuse a place that holds one already (results are the user's)."""
        local_lock.refuse_existing(self.local)

    def claim(self, new: bool, command: str) -> AbstractContextManager[Claim]:
        """Hold the sweep for this run (see `claim`)."""
        return claim(self, new, command)

    def unstarted(self, created: bool) -> None:
        """A new sweep refused before it started: what its claim made goes again."""
        if created:
            local_lock.remove_unstarted(self.local)

    # ------------------------------------------------------------------ the working copy

    def pull(self, weights: bool = False, only: Optional[str] = None) -> str:
        """The working copy brought up to date (with trials' best weights when `weights`;
        `only`: one trial's directory, or one file); its path."""
        return self.local

    def push(self, *paths: str) -> None:
        """Files (or directories, whole) of the working copy written back to the place."""

    def write(self, path: str, text: str) -> str:
        """Write a file of the sweep (a path in the working copy, or relative to it) whole or
        not at all, and push it; its path."""
        full = os.path.join(self.local, path)
        write_atomic(full, text)
        self.push(full)
        return full

    def moved(self, src: str, dst: str) -> None:
        """A directory of the working copy moved (`src` to `dst`, relative to it): the same
        in the place."""

    def trial(self, path: str) -> str:
        """The working copy's directory of a trial, from its path as Ray names it."""
        return path

    def pull_best(self, trial: str) -> None:
        """A trial's best weights (named by its best.json) into the working copy."""

    def reader(self) -> Place:
        """The place to read the sweep from while a driver may be writing it: a working copy
        of its own when the place is remote (never the driver's), the directory itself here."""
        return self

    def readable(self) -> str:
        """This place's working copy brought up to date, checked to hold a sweep; its path.
        (A reader asks this of `reading(...)`'s place, the driver of its own.)"""
        return check_sweep_dir(self.pull())

    def config(self, standins: bool = False) -> SweepConfig:
        """Its sweep.yaml, read from a reader's copy (a ConfigError if it holds no sweep)."""
        from tuner.sweepdir.files import read_config

        copy = self.reader()
        copy.pull(only=CODE_FILE)
        copy.pull(only=CONFIG_FILE)
        return read_config(copy.local, standins=standins)

    @property
    def trials_write_here(self) -> Optional[str]:
        """The directory trials write their files into themselves; None when Ray uploads
        them to the place (SyncConfig's sync_artifacts)."""
        return None if self.remote else self.local

    # ------------------------------------------------------------------ Ray

    @property
    def storage(self) -> str:
        """Where the sweep's parent is, as a trial is told it (TrialSpec.storage)."""
        return self.parent

    def ray_storage(self) -> tuple[str, Any, str]:
        """Ray's storage triple: RunConfig's (storage_path, storage_filesystem, name)."""
        return self.parent, None, self.name


class Claim:
    """A sweep this run holds; `write_config` puts sweep.yaml in it atomically (and pushes it
    to the sweep's place when that is remote)."""

    def __init__(self, place: Place):
        self.place = place
        self.path = place.local
        self.config_written = False

    def write_config(
        self, text: str, code_dirs: Optional[list[str]] = None, fingerprint: Optional[dict] = None
    ) -> None:
        """sweep.yaml, and beside it (first) where the sweep imports its own modules from and
        its task fingerprint (tuner.search.warm; kept from the file when not given)."""
        written = []
        if code_dirs is not None:
            code = {"import_from": code_dirs}
            if fingerprint is None:
                fingerprint = local_lock.recorded(os.path.join(self.path, CODE_FILE)).get("fingerprint")
            if fingerprint is not None:
                code["fingerprint"] = fingerprint
            write_atomic(os.path.join(self.path, CODE_FILE), json.dumps(code))
            written.append(os.path.join(self.path, CODE_FILE))
        target = os.path.join(self.path, CONFIG_FILE)
        tmp = os.path.join(self.path, f".{CONFIG_FILE}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)  # readers see the old file or the whole new one, never a part
        self.place.push(*written, target)  # (code.json first: a reader of sweep.yaml finds both)
        self.config_written = True


@contextmanager
def claim(place: Place, new: bool, command: str) -> Iterator[Claim]:
    """Hold `place` for this run. `new`: a sweep, refusing a place that holds one; else it
    must exist (resume), and its working copy is brought up to date under the lock. A new
    sweep that never got its sweep.yaml (the run was refused before it started) leaves nothing
    behind. The local lock keeps runs on this machine out; `place.lease` those elsewhere."""
    field = "name" if new else ""
    created = local_lock.make(place.local) if new or place.remote else False
    fd = local_lock.lock(place.local, field, command)
    try:
        with place.lease(field, command):
            if new:
                place.refuse_existing()
            else:
                place.pull()
            held = Claim(place)
            try:
                yield held
            finally:
                if new and not held.config_written:
                    place.unstarted(created)
    finally:
        os.close(fd)


def best_weights_named(place: Place, trial: str) -> Optional[str]:
    """The file name of a trial's best weights, as its best.json names it (None if none)."""
    try:
        with open(os.path.join(place.local, trial, BEST_RECORD)) as f:
            return os.path.basename(str(json.load(f).get("weights", ""))) or None
    except (OSError, ValueError, AttributeError):
        return None
