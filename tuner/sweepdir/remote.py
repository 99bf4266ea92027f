"""A sweep in object storage (`output: s3://bucket/prefix`): its place (`S3Place`), checked
before Ray starts, held by one driver wherever drivers run, and seen through a working copy.

The endpoint and credentials come from the environment the standard way (AWS_ENDPOINT_URL or
AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance
role): botocore's own chain, so tuner agrees with every other AWS tool on the machine. No
message here names a credential; an endpoint is shown without any user:password in it.

A store that stops answering, or refuses the credentials for a while, is waited for: every
call is retried with backoff for up to `patience_s()` (TUNER_S3_PATIENCE_S, 120 s by default),
the driver's and the trials' alike; past it the sweep stops as if interrupted
(`StorageUnavailable`: one line, exit 130), to be resumed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from tuner.config.storage import StorageURI, parse_uri
from tuner.errors import ConfigError, warn
from tuner.sweepdir.claim import already_held
from tuner.sweepdir.files import BEST_WEIGHTS_PATTERN, CONFIG_FILE, LOCK_FILE
from tuner.sweepdir.lease import Lease
from tuner.sweepdir.patience import REFUSED, T, patience_s, patient
from tuner.sweepdir.place import Place, best_weights_named, cache_root

CHECK_TIMEOUT_S = 5.0  # connect and read, per attempt: an unreachable endpoint answers nothing
S3_EXTRA = "pip install 'tuner[s3]'"


def check_output(output: str) -> None:
    """Refuse, as a ConfigError on `output` (one line), an s3:// output that the sweep could not
    write: no client library, an endpoint that does not answer, a bucket that does not exist,
    credentials missing or refused."""
    uri = parse_uri(output)
    client = _client(output)
    where = _shown(client.meta.endpoint_url)
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    try:
        client.list_objects_v2(Bucket=uri.bucket, Prefix=uri.key, MaxKeys=1)
    except (NoCredentialsError, PartialCredentialsError):
        raise ConfigError(
            "output",
            f"{output}: no S3 credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE)",
        ) from None
    except EndpointConnectionError:
        raise ConfigError("output", f"{output}: the S3 endpoint {where} does not answer{_hint()}") from None
    except ClientError as err:
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            raise ConfigError(
                "output", f"{output}: bucket '{uri.bucket}' does not exist at {where}"
            ) from None
        if code in REFUSED:
            raise ConfigError(
                "output", f"{output}: {where} refused the credentials ({code}: {REFUSED[code]})"
            ) from None
        raise ConfigError("output", f"{output}: {where} answered {code or 'an error'}") from None
    except BotoCoreError as err:  # timeouts, bad endpoint URLs, ...: one line, its class and text
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError("output", f"{output}: cannot use the S3 endpoint {where}: {first}") from None


def _client(output: str, timeout: Optional[float] = CHECK_TIMEOUT_S) -> Any:
    try:
        import botocore.session
        from botocore.config import Config
    except ImportError:
        raise ConfigError("output", f"{output}: S3 output needs botocore and s3fs: {S3_EXTRA}") from None
    config = Config(
        connect_timeout=timeout or 60,
        read_timeout=timeout or 60,
        retries={"max_attempts": 2, "mode": "standard"},
    )
    session = botocore.session.get_session()
    try:
        # An S3-compatible server knows no regions; botocore needs one to sign with.
        region = session.get_config_variable("region") or "us-east-1"
        return session.create_client("s3", region_name=region, config=config)
    except Exception as err:  # noqa: BLE001 - a malformed endpoint or profile: say which
        raise ConfigError("output", f"{output}: cannot set up an S3 client: {err}") from None


def _shown(url: str) -> str:
    """An endpoint URL without any user:password it may carry."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _hint() -> str:
    if os.environ.get("AWS_ENDPOINT_URL_S3"):
        return " (AWS_ENDPOINT_URL_S3)"
    if os.environ.get("AWS_ENDPOINT_URL"):
        return " (AWS_ENDPOINT_URL)"
    return ""


def filesystem() -> Any:
    """An s3fs file system that waits out outages (see `patience_s`)."""
    try:
        from tuner.sweepdir.patient_s3 import PatientS3FileSystem
    except ImportError:
        raise ConfigError("output", f"S3 output needs botocore and s3fs: {S3_EXTRA}") from None
    return PatientS3FileSystem(patience_s=patience_s())


def ray_filesystem() -> Any:
    """The file system Ray is handed for s3:// storage. pyarrow's own S3 file system, which Ray
    would pick for the URI, ignores AWS_ENDPOINT_URL (apache/arrow#49643); s3fs follows
    botocore's chain like every other tool."""
    import pyarrow.fs as pafs

    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem()))


# ----------------------------------------------------------------------------- the place

# What a reader never needs from the bucket: the checkpoints trials continue from (Ray's
# checkpoint_NNNNNN/ directories, a trial's own checkpoint_eNNNNNN.pt, a script's epoch_NNNNNN/).
_HEAVY = re.compile(r"(^|/)(checkpoint_\d{6}|checkpoints/epoch_\d{6})/|(^|/)checkpoint_e\d{6}\.pt$")
_WEIGHTS = re.compile("(^|/)" + BEST_WEIGHTS_PATTERN.lstrip("^"))  # a trial's best weights: when asked


class S3Place(Place):
    """A sweep in object storage (`uri`: s3://bucket/prefix/name) and its working copy under
    the cache: the driver writes its own files (sweep.yaml, tuner_trial.json, summary.json,
    best/, ...) there and pushes them; a reader pulls the sweep into a copy of its own and
    reads it as a local sweep directory. The trials write to the bucket themselves (Ray
    uploads their files)."""

    remote = True

    def __init__(self, where: StorageURI, role: str = "s3"):
        self.where = where
        self.uri = str(where)
        self.name = where.name
        self.parent = str(where.parent)
        self.key = where.path  # bucket/prefix/name: the place as s3fs and Ray name it
        self.role = role
        # The driver's copy, or a reader's ("s3-read"): a reader never shares the driver's
        # files, nor their temporaries (a report beside a finishing driver reverted its records).
        self.local = os.path.join(cache_root(), role, where.bucket, *where.key.split("/"))
        self._fs: Any = None
        self._client: Any = None  # botocore's, for the lease (conditional writes)
        self._lease: Optional[Lease] = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = filesystem()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_client": None, "_lease": None}

    def _patient(self, call: Callable[[], T]) -> T:
        return patient(self.uri, call)

    # ------------------------------------------------------------------ what is there

    def exists(self) -> bool:
        return bool(self._patient(lambda: self.fs.exists(f"{self.key}/{CONFIG_FILE}")))

    def check(self) -> None:
        check_output(self.uri)

    def _held_sweep(self) -> None:
        if not self.exists():
            raise ConfigError("", f"{self.uri} is not a sweep (it has no {CONFIG_FILE})")

    def readable(self) -> str:
        self._held_sweep()  # (said of the bucket, not of the copy)
        return super().readable()

    def config(self, standins: bool = False) -> Any:
        self._held_sweep()
        return super().config(standins)

    def read(self, name: str) -> Optional[str]:
        def call() -> Optional[str]:
            try:
                return self.fs.cat_file(f"{self.key}/{name}").decode()
            except (FileNotFoundError, UnicodeDecodeError):
                return None

        return self._patient(call)

    def siblings(self) -> list[Place]:
        parent = self.where.parent

        def call() -> list[str]:
            self.fs.invalidate_cache(parent.path)
            try:
                return [e["name"] for e in self.fs.ls(parent.path, detail=True) if e["type"] == "directory"]
            except FileNotFoundError:
                return []

        found = []
        for path in sorted(self._patient(call)):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if name in ("", ".", "..") or name == self.name:
                continue
            other = S3Place(parent.child(name), role="s3-read")
            if other.exists():
                found.append(other)
        return found

    # ------------------------------------------------------------------ the lock

    @contextlib.contextmanager
    def lease(self, field: str, command: str) -> Iterator[None]:
        """The sweep held in the bucket (LOCK_FILE there, written only if absent): a driver on
        another machine, or with another cache, is refused in one line as on this one."""
        lease = self._lease_of(command)
        lease.take(field)
        self._lease = lease
        try:
            yield
        finally:
            self._lease = None
            lease.release()

    def _lease_of(self, command: str) -> Lease:
        if self._client is None:
            self._client = _client(self.uri, timeout=None)
        return Lease(self.uri, self.where.bucket, self.where.key, self._client, command)

    def refuse_if_held(self, field: str = "") -> None:
        super().refuse_if_held(field)
        self._lease_of("").refuse_if_held(field)

    def refuse_existing(self) -> None:
        if self.exists():
            raise already_held(self.uri)
        _clear(self.local)  # a copy of a sweep no longer in the bucket

    def unstarted(self, created: bool) -> None:
        _clear(self.local)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(self.local, LOCK_FILE))
            os.rmdir(self.local)

    # ------------------------------------------------------------------ the working copy

    def local_path(self, remote: str) -> str:
        """The working copy's path of a path in the sweep (as Ray names it: bucket/prefix/name/...)."""
        rel = remote.rstrip("/")
        for head in (self.uri, self.key):
            if rel == head or rel.startswith(head + "/"):
                rel = rel[len(head) :].lstrip("/")
                break
        else:
            raise ValueError(f"{remote} is not inside {self.uri}")
        return os.path.join(self.local, rel) if rel else self.local

    def trial(self, path: str) -> str:
        return self.local_path(path)

    def moved(self, src: str, dst: str) -> None:
        old, new = f"{self.key}/{src}", f"{self.key}/{dst}"
        keys = self._patient(lambda: self.fs.find(old))  # (object by object: a prefix is no directory)
        for key in keys:
            self._patient(lambda k=key: self.fs.copy(k, new + k[len(old) :]))
        if keys:
            self._patient(lambda: self.fs.rm(keys))

    def _remote(self, local: str) -> str:
        rel = os.path.relpath(local, self.local)
        if rel.startswith(".."):
            raise ValueError(f"{local} is not inside the working copy {self.local}")
        return self.key if rel == "." else f"{self.key}/{rel}"

    def push(self, *paths: str) -> None:
        for path in paths:
            if os.path.isdir(path):
                for root, _, files in os.walk(path):
                    for name in files:
                        full = os.path.join(root, name)
                        self._put(full)
            elif os.path.exists(path):
                self._put(path)

    def _put(self, path: str) -> None:
        target = self._remote(path)
        self._patient(lambda: self.fs.put_file(path, target))

    def pull(self, weights: bool = False, only: Optional[str] = None) -> str:
        """The working copy brought up to date (new or changed files only). Checkpoints stay
        in the bucket; trials' best weights come with `weights`. A key that would land outside
        the working copy (a name `..`, `.` or empty in it: anyone who may write the bucket
        can make one) is left in the bucket, with a warning."""
        top = f"{self.key}/{only}" if only else self.key

        def listing() -> dict[str, Any]:
            self.fs.invalidate_cache()
            return dict(self.fs.find(top, detail=True))

        skipped = []
        for key, info in self._patient(listing).items():
            rel = key[len(self.key) :].lstrip("/") if key.startswith(self.key + "/") else ""
            if not rel or rel == LOCK_FILE:
                continue
            if any(n in ("", ".", "..") for n in rel.split("/")):
                skipped.append(rel)
                continue
            if _HEAVY.search(rel) or (_WEIGHTS.search(rel) and not weights):
                continue
            self._get(key, rel, info)
        if skipped:
            warn(
                f"{self.uri}: {len(skipped)} object(s) whose keys lead outside the sweep were not "
                f"copied (e.g. {skipped[0]!r}); someone wrote them into the bucket beside it"
            )
        os.makedirs(self.local, exist_ok=True)
        return self.local

    def _get(self, key: str, rel: str, info: dict[str, Any]) -> None:
        dest = os.path.join(self.local, *rel.split("/"))
        size = int(info.get("size") or 0)
        stamp = info.get("LastModified")
        mtime = stamp.timestamp() if stamp is not None else None
        if (
            os.path.isfile(dest)
            and os.path.getsize(dest) == size
            and (mtime is None or abs(os.path.getmtime(dest) - mtime) < 1e-3)
        ):
            return
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        # A temporary of this process's own: another process pulling the same file at once
        # (a reader beside the driver, two readers) never writes into it.
        fd, tmp = tempfile.mkstemp(
            dir=os.path.dirname(dest), prefix=f".{os.path.basename(dest)}.", suffix=".part"
        )
        os.close(fd)
        try:
            self._patient(lambda: self.fs.get_file(key, tmp))
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        if mtime is not None:
            os.utime(dest, (mtime, mtime))

    def pull_best(self, trial: str) -> None:
        """The weights a trial's best.json names (the trial's uploaded best epoch), from a copy
        already pulled: only that file, however many older ones the bucket keeps."""
        name = best_weights_named(self, trial)
        if name and re.match(BEST_WEIGHTS_PATTERN, name):
            self.pull(weights=True, only=f"{trial}/{name}")

    def reader(self) -> Place:
        return self if self.role == "s3-read" else S3Place(self.where, role="s3-read")

    # ------------------------------------------------------------------ Ray

    @property
    def storage(self) -> str:
        return self.parent

    def ray_storage(self) -> tuple[str, Any, str]:
        return self.where.parent.path, ray_filesystem(), self.name


def _clear(path: str) -> None:
    """Empty a working copy, keeping its lock file (held by this run)."""
    if not os.path.isdir(path):
        return
    for entry in os.listdir(path):
        if entry == LOCK_FILE:
            continue
        full = os.path.join(path, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(full)
