"""Waiting for an object store that is out for a while: which errors mean an outage, and one
call retried with backoff for up to `patience_s()` seconds (TUNER_S3_PATIENCE_S, 120 s by
default), then StorageUnavailable: the sweep stops as if interrupted, to be resumed.

The driver's own calls (tuner.sweepdir.remote) and what Ray uploads and downloads for the
trials (tuner.sweepdir.patient_s3) wait alike. Torch-, Ray- and boto-free.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Optional, TypeVar

from tuner.errors import StorageUnavailable

PATIENCE_ENV = "TUNER_S3_PATIENCE_S"
PATIENCE_S = 120.0  # how long a call waits for a store that does not answer, by default
# Error codes of S3 (and of S3-compatible servers) that mean "these credentials are refused".
REFUSED = {
    "InvalidAccessKeyId": "the access key is not known there",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "InvalidToken": "the session token is not valid",
    "ExpiredToken": "the session token has expired",
    "AccessDenied": "these credentials may not list the bucket",
    "403": "access denied",
}
# Answers that mean "not now": the store is overloaded or failing for a moment.
_BUSY = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "500", "502", "503", "504"}
T = TypeVar("T")


def patience_s() -> float:
    """Seconds a call to the store is retried for (TUNER_S3_PATIENCE_S, else PATIENCE_S)."""
    try:
        return max(0.0, float(os.environ.get(PATIENCE_ENV, PATIENCE_S)))
    except ValueError:
        return PATIENCE_S


def outage(err: BaseException) -> Optional[str]:
    """What `err` (or what caused it) says of the store when it is something that passes: it
    does not answer, it is busy, or it refuses the credentials (a key being rotated, a
    policy changed back); None for any other error (a missing key, a bad request)."""
    seen: set[int] = set()
    cur: Optional[BaseException] = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            if code in REFUSED:
                return f"the store refuses the credentials ({code})"
            if code in _BUSY:
                return f"the store answers {code}"
        name = type(cur).__name__
        if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
            return "the endpoint does not answer"
        if name in ("ReadTimeoutError", "ClientConnectorError", "ServerDisconnectedError"):
            return "the endpoint does not answer"
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return "no credentials found"
        if isinstance(cur, (ConnectionError, TimeoutError)) or (
            isinstance(cur, OSError) and cur.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT)
        ):
            return "the endpoint does not answer"
        cur = cur.__cause__ or cur.__context__
    return None


class Waiting:
    """One call's retries: backoff doubling from 0.5 s to 10 s, for up to patience_s()."""

    def __init__(self, patience: Optional[float] = None):
        self.patience = patience_s() if patience is None else patience
        self.since: Optional[float] = None
        self.delay = 0.5

    def next_delay(self, err: BaseException) -> tuple[str, float]:
        """(why, seconds to wait) before the next try; raises `err` itself when it is not an
        outage, StorageUnavailable once the patience is spent."""
        why = outage(err)
        if why is None:
            raise err
        now = time.monotonic()
        self.since = self.since if self.since is not None else now
        left = self.patience - (now - self.since)
        if left <= 0:
            raise StorageUnavailable(why, now - self.since) from err
        delay, self.delay = min(self.delay, left), min(self.delay * 2, 10.0)
        return why, delay


_said_lock = threading.Lock()
_said: dict[str, float] = {}  # place -> when its outage was announced (the driver's lines)


def patient(where: str, call: Callable[[], T], announce: bool = True) -> T:
    """`call()`, retried while the store is out (see `outage`) for up to patience_s(); the
    first failure is said in one line (`announce`), and the store's return."""
    waiting = Waiting()
    while True:
        try:
            result = call()
        except StorageUnavailable:
            raise
        except Exception as err:  # noqa: BLE001 - classified by outage(); others raised as they are
            why, delay = waiting.next_delay(err)
            with _said_lock:
                first = where not in _said
                _said.setdefault(where, time.monotonic())
            if announce and first:
                print(
                    f"[tuner] {where}: {why}; retrying for up to {waiting.patience:g} s ({PATIENCE_ENV})",
                    flush=True,
                )
            time.sleep(delay)
            continue
        if waiting.since is not None:
            with _said_lock:
                since = _said.pop(where, None)
            if announce and since is not None:
                print(
                    f"[tuner] {where}: the store answers again ({time.monotonic() - since:.0f} s)", flush=True
                )
        return result
