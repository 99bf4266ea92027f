"""A sweep directory in object storage (`output: s3://bucket/prefix`): checked before Ray
starts, and seen through a local mirror (`Mirror`) by the driver and every reader.

The endpoint and credentials come from the environment the standard way (AWS_ENDPOINT_URL or
AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance
role): botocore's own chain, so tuner agrees with every other AWS tool on the machine. No
message here names a credential; an endpoint is shown without any user:password in it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from tuner.errors import ConfigError
from tuner.sweepdir.files import BEST_RECORD, BEST_WEIGHTS_PATTERN, CONFIG_FILE

CHECK_TIMEOUT_S = 5.0  # connect and read, per attempt: an unreachable endpoint answers nothing
# Error codes of S3 (and of S3-compatible servers) that mean "these credentials are refused".
_REFUSED = {
    "InvalidAccessKeyId": "the access key is not known there",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "InvalidToken": "the session token is not valid",
    "ExpiredToken": "the session token has expired",
    "AccessDenied": "these credentials may not list the bucket",
    "403": "access denied",
}
S3_EXTRA = "pip install 'tuner[s3]'"


def is_uri(output: str) -> bool:
    return "://" in output


def check_output(output: str) -> None:
    """Refuse, as a ConfigError on `output` (one line), an s3:// output that the sweep could not
    write: no client library, an endpoint that does not answer, a bucket that does not exist,
    credentials missing or refused. Other URIs are left to Ray."""
    parts = urlsplit(output)
    if parts.scheme != "s3":
        return
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not bucket:
        raise ConfigError("output", f"{output}: no bucket (expected s3://BUCKET/PREFIX)")
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
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
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
            raise ConfigError("output", f"{output}: bucket '{bucket}' does not exist at {where}") from None
        if code in _REFUSED:
            raise ConfigError(
                "output", f"{output}: {where} refused the credentials ({code}: {_REFUSED[code]})"
            ) from None
        raise ConfigError("output", f"{output}: {where} answered {code or 'an error'}") from None
    except BotoCoreError as err:  # timeouts, bad endpoint URLs, ...: one line, its class and text
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError("output", f"{output}: cannot use the S3 endpoint {where}: {first}") from None


def ray_storage(output: str) -> tuple[str, Any]:
    """(storage_path, storage_filesystem) for Ray's RunConfig: for s3://, the bucket/prefix and
    an s3fs file system. pyarrow's own S3 file system, which Ray would pick for the URI,
    ignores AWS_ENDPOINT_URL (apache/arrow#49643); s3fs follows botocore's chain like every
    other tool, and pickles (to every node) without credentials: each node reads its own
    environment. Other schemes: the URI as it is, for Ray to resolve."""
    parts = urlsplit(output)
    if parts.scheme != "s3":
        return output, None
    import pyarrow.fs as pafs
    import s3fs

    path = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
    return path, pafs.PyFileSystem(pafs.FSSpecHandler(s3fs.S3FileSystem()))


def _client(output: str) -> Any:
    try:
        import botocore.session
        from botocore.config import Config
    except ImportError:
        raise ConfigError("output", f"{output}: S3 output needs botocore and s3fs: {S3_EXTRA}") from None
    config = Config(
        connect_timeout=CHECK_TIMEOUT_S,
        read_timeout=CHECK_TIMEOUT_S,
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


# ----------------------------------------------------------------------------- the mirror

# What a reader never needs from the bucket: the checkpoints trials continue from (Ray's
# checkpoint_NNNNNN/ directories, a trial's own checkpoint_eNNNNNN.pt, a script's epoch_NNNNNN/).
_HEAVY = re.compile(r"(^|/)(checkpoint_\d{6}|checkpoints/epoch_\d{6})/|(^|/)checkpoint_e\d{6}\.pt$")
_WEIGHTS = re.compile("(^|/)" + BEST_WEIGHTS_PATTERN.lstrip("^"))  # a trial's best weights: when asked


def new_sweep(output: str, name: str) -> Optional[Mirror]:
    """The mirror of a new sweep `<output>/<name>` in object storage, checked first (one line,
    before Ray starts): the bucket reachable with our credentials, no sweep there yet. None for
    a URI that is not s3:// (left to Ray)."""
    check_output(output)
    if urlsplit(output).scheme != "s3":
        return None
    mirror = Mirror(f"{output.rstrip('/')}/{name}")
    if mirror.exists():
        raise ConfigError(
            "name",
            f"{mirror.uri} already holds a sweep; continue it with `python -m tuner resume {mirror.uri}` "
            "(`--retry-failed` also runs its failed trials again), or choose another --name or --output",
        )
    import shutil

    shutil.rmtree(mirror.local, ignore_errors=True)  # a copy of a sweep no longer in the bucket
    return mirror


def readable(sweep: str) -> str:
    """A sweep directory a reader can open: `sweep` itself, or for an s3:// sweep its mirror,
    brought up to date (checkpoints and weights stay in the bucket)."""
    return Mirror(sweep).pull() if is_s3(sweep) else sweep


def is_s3(path: str) -> bool:
    return urlsplit(path).scheme == "s3"


def cache_root() -> str:
    """Where mirrors of sweeps in object storage live ($TUNER_CACHE_DIR, else ~/.cache/tuner)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.environ.get("TUNER_CACHE_DIR") or os.path.join(base, "tuner")


class Mirror:
    """A sweep in object storage (`uri`, s3://bucket/prefix/name) and its local mirror: the
    driver writes its own files (sweep.yaml, tuner_trial.json, summary.json, best/, ...) into
    the mirror and pushes them; a reader pulls the sweep into it and reads it as a local
    sweep directory. The trials write to the bucket themselves (Ray uploads their files)."""

    def __init__(self, uri: str, local: Optional[str] = None):
        parts = urlsplit(uri.rstrip("/"))
        if parts.scheme != "s3" or not parts.netloc:
            raise ConfigError("", f"{uri}: only s3:// sweeps are read from object storage")
        self.uri = uri.rstrip("/")
        self.key = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")  # bucket/prefix/name
        self.local = local or os.path.join(cache_root(), "s3", *self.key.split("/"))
        self._fs: Any = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            import s3fs

            self._fs = s3fs.S3FileSystem()
        return self._fs

    def local_path(self, remote: str) -> str:
        """The mirror's path of a path in the sweep (as Ray names it: bucket/prefix/name/...)."""
        rel = remote.rstrip("/")
        for head in (self.uri, self.key):
            if rel == head or rel.startswith(head + "/"):
                rel = rel[len(head) :].lstrip("/")
                break
        else:
            raise ValueError(f"{remote} is not inside {self.uri}")
        return os.path.join(self.local, rel) if rel else self.local

    def _remote(self, local: str) -> str:
        rel = os.path.relpath(local, self.local)
        return self.key if rel == "." else f"{self.key}/{rel}"

    def exists(self) -> bool:
        """Whether the sweep is there: its sweep.yaml."""
        return bool(self.fs.exists(f"{self.key}/{CONFIG_FILE}"))

    def push(self, *local: str) -> None:
        """Upload files (or directories, whole) of the mirror to the same places in the bucket."""
        for path in local:
            if os.path.isdir(path):
                for root, _, files in os.walk(path):
                    for name in files:
                        full = os.path.join(root, name)
                        self.fs.put_file(full, self._remote(full))
            elif os.path.exists(path):
                self.fs.put_file(path, self._remote(path))

    def pull(self, weights: bool = False, only: Optional[str] = None) -> str:
        """Bring the sweep's files into the mirror (new or changed ones only); returns its path.
        Checkpoints stay in the bucket; trials' best weights come with `weights`. `only`: one
        trial's directory (or any sub-path) instead of the whole sweep."""
        self.fs.invalidate_cache()
        top = f"{self.key}/{only}" if only else self.key
        for key, info in self.fs.find(top, detail=True).items():
            rel = key[len(self.key) :].lstrip("/")
            if not rel or _HEAVY.search(rel) or (_WEIGHTS.search(rel) and not weights):
                continue
            dest = os.path.join(self.local, rel)
            size = int(info.get("size") or 0)
            stamp = info.get("LastModified")
            mtime = stamp.timestamp() if stamp is not None else None
            if (
                os.path.isfile(dest)
                and os.path.getsize(dest) == size
                and (mtime is None or abs(os.path.getmtime(dest) - mtime) < 1e-3)
            ):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = dest + ".part"
            self.fs.get_file(key, tmp)
            os.replace(tmp, dest)
            if mtime is not None:
                os.utime(dest, (mtime, mtime))
        os.makedirs(self.local, exist_ok=True)
        return self.local

    def pull_best(self, trial: str) -> None:
        """The weights a trial's best.json names (the trial's uploaded best epoch), from a
        mirror already pulled: only that file, however many older ones the bucket keeps."""
        import json

        try:
            with open(os.path.join(self.local, trial, BEST_RECORD)) as f:
                name = os.path.basename(str(json.load(f).get("weights", "")))
        except (OSError, ValueError, AttributeError):
            return  # no best epoch kept: the reader says so
        if re.match(BEST_WEIGHTS_PATTERN, name):
            self.pull(weights=True, only=f"{trial}/{name}")
