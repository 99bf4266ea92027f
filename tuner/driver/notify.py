"""`notify.webhook`: one JSON POST when a sweep ends, fails or is interrupted.

The POST is best effort: a webhook that is down, slow or answers an error gets one warning
line, and the sweep's exit code is its own. One deadline covers the whole call (connecting,
sending, the answer's headers and what is read of its body; a per-read timeout let a server
that trickled a byte every 5 s hold the CLI's exit for minutes). A redirect is not followed
(urllib would send the credentials to the other host and turn the POST into a GET without
its body): it is not a delivery and gets a warning naming where it points. At most
ANSWER_BYTES of the answer are read. The URL is never printed whole (webhook URLs carry their
secret in the user part, the path or the query): only its scheme and host.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Optional
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from tuner.config.schedule import redacted
from tuner.driver import stopping
from tuner.errors import DiskFull
from tuner.sweepdir import SUMMARY_OLDER_DIRECTION

TIMEOUT_S = 10.0  # the whole call's deadline
ANSWER_BYTES = 64 * 1024  # what is read of the answer's body, at most


def post(url: str, payload: dict[str, Any], timeout: float = TIMEOUT_S) -> bool:
    """POST `payload` as JSON; True if the server answered 2xx within `timeout` seconds, else a
    warning on stderr."""
    call = _Call(url, json.dumps(payload, default=str).encode(), timeout)
    worker = threading.Thread(target=call.run, name="tuner-notify", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():  # stuck in a read (or a name lookup): its sockets are cut off
        call.abort()
        worker.join(1.0)
        why = f"no answer within {timeout:g} s"
    else:
        why = call.why
    if why is None:
        return True
    print(f"warning: notify.webhook {redacted(url)}: not notified ({why})", file=sys.stderr)
    return False


class _Call:
    """One POST, run in a thread: `why` is None once it was delivered, else why not."""

    def __init__(self, url: str, body: bytes, timeout: float):
        self.url, self.body = url, body
        self.deadline = time.monotonic() + timeout
        self.why: Optional[str] = "not sent"
        self.sockets: list[socket.socket] = []
        self.aborted = False

    def run(self) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "tuner"}
        parts = urlsplit(self.url)
        url = self.url
        if parts.username is not None:  # user:password@ goes as HTTP basic authentication
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(secret).decode()
            host = parts.netloc.rpartition("@")[2]
            url = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
        request = urllib.request.Request(url, data=self.body, method="POST", headers=headers)
        opener = urllib.request.build_opener(_NoRedirect(), _Tracked(self), _TrackedTLS(self))
        try:
            with opener.open(request, timeout=self._left()) as answer:
                answer.read(ANSWER_BYTES)
            self.why = None
        except urllib.error.HTTPError as err:
            self.why = f"HTTP {err.code}" + _redirect_note(url, err)
            err.close()
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
            self.why = str(getattr(err, "reason", err)) or type(err).__name__

    def _left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.01)

    def opened(self, sock: socket.socket) -> None:
        self.sockets.append(sock)
        if self.aborted:  # connected only after the deadline (a slow name lookup)
            self.abort()

    def abort(self) -> None:
        self.aborted = True
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _redirect_note(url: str, err: urllib.error.HTTPError) -> str:
    """For a 3xx answer: where it pointed (host only) and that it was not followed."""
    if not 300 <= err.code < 400:
        return ""
    target = err.headers.get("Location") if err.headers else None
    where = f" to {redacted(urljoin(url, target))}" if target else ""
    return f": a redirect{where}, not followed; set the webhook to the URL that takes the POST"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects come back as HTTPError (urllib's handler would follow them with the
    Authorization header to any host, as a GET without the body)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Tracking:
    """A handler whose connections hand each socket they open to the call, so its deadline
    can cut them off whatever the call is waiting for."""

    call: _Call

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        call = self.call

        class Connection(http_class):  # type: ignore[misc,valid-type]
            def connect(self) -> None:
                super().connect()
                call.opened(self.sock)

        return super().do_open(Connection, req, **kwargs)  # type: ignore[misc]


class _Tracked(_Tracking, urllib.request.HTTPHandler):
    def __init__(self, call: _Call):
        super().__init__()
        self.call = call


class _TrackedTLS(_Tracking, urllib.request.HTTPSHandler):
    def __init__(self, call: _Call):
        super().__init__()
        self.call = call


def payload(
    name: str,
    sweep_dir: str,
    summary: Optional[dict[str, Any]],
    error: Optional[str] = None,
    status: str = "",
) -> dict[str, Any]:
    """What the webhook gets: the sweep, how it ended, its best trial and counts, where it is."""
    if summary is None:  # it failed or was stopped before it had a summary
        return {
            "name": name,
            "status": status or "failed",
            "error": error,
            "results": sweep_dir,
            "best": None,
            "counts": {},
        }
    best = summary.get("best")
    metric = summary.get("metric")
    return {
        "name": name,
        "status": summary.get("status"),
        "metric": metric,
        "direction": summary.get("direction"),
        SUMMARY_OLDER_DIRECTION: summary.get("direction"),  # (its older name, as summary.json's)
        "best": None
        if not best
        else {
            "trial_id": best["trial_id"],
            "value": best["metrics"].get(metric),
            "epoch": best["epoch"],
            "config": best["config"],
        },
        "counts": summary.get("counts", {}),
        "trials": len(summary.get("trials", [])),
        "expected_trials": summary.get("expected_trials"),
        "results": sweep_dir,
        "error": error or summary.get("error"),  # (status failed: what its trials failed with)
    }


class Notifying:
    """Around a sweep's run: POSTs its outcome (`done`), or that it failed or was stopped
    (`ended`), once. In a driver its watcher waits for (driver/stopping.py's `watched`), the
    watcher is told, so that it does not notify again when it ends what is left of the run."""

    def __init__(self, url: Optional[str], name: str, sweep_dir: str):
        self.url, self.name, self.sweep_dir = url, name, sweep_dir
        self.sent = False

    def __enter__(self) -> Notifying:
        return self

    def done(self, summary: dict[str, Any]) -> None:
        self._send(payload(self.name, self.sweep_dir, summary))

    def ended(self, status: str, error: Optional[str] = None) -> None:
        """Before it had a summary: `status` (failed, interrupted) and why, in one line."""
        self._send(payload(self.name, self.sweep_dir, None, error and error.splitlines()[0], status))

    def _send(self, body: dict[str, Any]) -> None:
        if self.url and not self.sent:
            self.sent = True
            post(self.url, body)
            stopping.notified()  # (after: a driver ended mid-POST is notified again, not never)

    def __exit__(self, kind: Any, err: Any, tb: Any) -> bool:
        if kind is not None:
            if issubclass(kind, (KeyboardInterrupt, SystemExit, DiskFull)):
                self.ended("interrupted", str(err) if isinstance(err, DiskFull) else None)
            else:
                self.ended("failed", f"{kind.__name__}: {err}")
        return False
