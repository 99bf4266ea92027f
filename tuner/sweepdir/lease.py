"""One driver per sweep in object storage, wherever the drivers run: a lease in the bucket.

The local lock (sweepdir/claim.py) keeps out a second run that shares the working copy; two
drivers on two machines (or with two caches) share only the bucket. A retried job started
while the first still ran used to run beside it: both drivers ran every trial, and one
removed the other's copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Any, Optional

from tuner.errors import ConfigError, warn
from tuner.sweepdir.claim import holder_pid
from tuner.sweepdir.files import LOCK_FILE
from tuner.sweepdir.patience import patient

# A driver's hold on a sweep (LOCK_FILE in the bucket): renewed every LEASE_BEAT_S; one not
# renewed for LEASE_STALE_S (the store's own clock) is a driver that died elsewhere.
LEASE_BEAT_S = 10.0
LEASE_STALE_S = 90.0


class Lease:
    """The hold of one driver on a sweep in object storage: LOCK_FILE in the bucket, written
    only where there is none (S3's conditional write, `If-None-Match: *`), naming its holder,
    renewed every LEASE_BEAT_S while held (`If-Match`: only while still ours), removed at the
    end. A holder is gone when its lease names this machine and a driver process that no
    longer exists (killed here, or ended under the command that settles what it left), or
    when the store's clock says its lease was last renewed LEASE_STALE_S ago (a driver that
    died elsewhere); its lease is then taken over, again only if unchanged since read."""

    def __init__(self, uri: str, bucket: str, key: str, client: Any, command: str):
        self.uri, self.bucket, self.client, self.command = uri, bucket, client, command
        self.key = f"{key}/{LOCK_FILE}"
        self.etag: Optional[str] = None
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None
        self.since = time.time()
        self.beats = 0  # renewals: each write differs, so that its ETag does

    def _note(self) -> bytes:
        note = {
            "pid": holder_pid(),  # the command the user started (the one it can stop)
            "driver": os.getpid(),  # the process that holds it (a child of that command's)
            "host": socket.gethostname(),
            "command": self.command,
            "since": self.since,
            "beats": self.beats,
        }
        return json.dumps(note).encode()

    def _put(self, wait: bool = True, **condition: str) -> Optional[str]:
        """Write the lease under `condition`; its ETag, or None when the condition failed.
        `wait`: through an outage (patient), else one try."""
        from botocore.exceptions import ClientError

        def call() -> Optional[str]:
            try:
                answer = self.client.put_object(
                    Bucket=self.bucket, Key=self.key, Body=self._note(), **condition
                )
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                if code in (
                    "PreconditionFailed",
                    "412",
                    "ConditionalRequestConflict",
                    "409",
                    "NoSuchKey",
                    "404",
                ):
                    return None
                raise
            return str(answer.get("ETag", ""))

        return patient(self.uri, call) if wait else call()

    def _read(self, wait: bool = True) -> Optional[tuple[dict[str, Any], str, float]]:
        """(the holder's note, the lease's ETag, its age in seconds by the store's clock), or
        None when there is no lease."""
        from botocore.exceptions import ClientError

        def call() -> Optional[tuple[dict[str, Any], str, float]]:
            try:
                got = self.client.get_object(Bucket=self.bucket, Key=self.key)
            except ClientError as err:
                if str(err.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404"):
                    return None
                raise
            try:
                note = json.loads(got["Body"].read() or b"{}")
            except ValueError:
                note = {}
            date = got.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            age = 0.0
            if date and got.get("LastModified") is not None:
                from email.utils import parsedate_to_datetime

                age = (parsedate_to_datetime(date) - got["LastModified"]).total_seconds()
            return (note if isinstance(note, dict) else {}), str(got.get("ETag", "")), age

        return patient(self.uri, call) if wait else call()

    def take(self, field: str) -> None:
        self.etag = self._put(IfNoneMatch="*")
        while self.etag is None:
            held = self._read()
            if held is None:  # released meanwhile
                self.etag = self._put(IfNoneMatch="*")
                continue
            note, etag, age = held
            if not self._gone(note, age):
                raise self._in_use(note, age, field)
            self.etag = self._put(IfMatch=etag)  # taken over, if nobody else did first
            if self.etag is None:
                raise self._in_use(note, age, field)
        self._beat = threading.Thread(target=self._renew, name="tuner-lease", daemon=True)
        self._beat.start()

    def refuse_if_held(self, field: str) -> None:
        held = self._read()
        if held is not None and not self._gone(held[0], held[2]):
            raise self._in_use(held[0], held[2], field)

    def _gone(self, note: dict[str, Any], age: float) -> bool:
        if age > LEASE_STALE_S:
            return True
        driver = note.get("driver", note.get("pid"))
        if note.get("host") == socket.gethostname() and isinstance(driver, int):
            import psutil

            try:  # a zombie is a driver that died and was not yet reaped (its parent killed too)
                return psutil.Process(driver).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True
            except psutil.Error:
                return False  # alive, another user's
        return False

    def _in_use(self, note: dict[str, Any], age: float, field: str) -> ConfigError:
        try:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(note["since"])))
            holder = f"`{note['command']}`, pid {int(note['pid'])} on {note['host']}, since {since}"
        except (KeyError, TypeError, ValueError):
            holder = "holder not recorded"
        return ConfigError(
            field,
            f"{self.uri} is in use by another tuner run ({holder}; its hold was renewed "
            f"{max(age, 0):.0f} s ago); wait for it to end or stop it",
        )

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_BEAT_S):
            self.beats += 1
            try:
                etag = self._put(wait=False, IfMatch=self.etag or "")
            except Exception:  # noqa: BLE001 - the store is out: the next beat tries again
                continue
            if etag is None:
                warn(f"{self.uri}: another tuner run took this sweep over (this run's hold lapsed)")
                return
            self.etag = etag

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=LEASE_BEAT_S)
        with contextlib.suppress(Exception):  # the store out: the lease goes stale by itself
            held = self._read(wait=False)
            if held is not None and held[1] == self.etag:
                self.client.delete_object(Bucket=self.bucket, Key=self.key)
