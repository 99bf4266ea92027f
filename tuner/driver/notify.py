"""`notify.webhook`: one JSON POST when a sweep ends, fails or is interrupted.

The POST is best effort: a webhook that is down, slow (10 s) or answers an error gets one
warning line, and the sweep's exit code is its own. The URL is never printed whole (webhook
URLs carry their secret in the user part, the path or the query): only its scheme and host.
"""

from __future__ import annotations

import base64
import json
import sys
import urllib.error
import urllib.request
from typing import Any, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

from tuner.config.schedule import redacted
from tuner.errors import DiskFull

TIMEOUT_S = 10.0


def post(url: str, payload: dict[str, Any], timeout: float = TIMEOUT_S) -> bool:
    """POST `payload` as JSON; True if the server answered 2xx, else a warning on stderr."""
    body = json.dumps(payload, default=str).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "tuner"}
    parts = urlsplit(url)
    if parts.username is not None:  # user:password@ goes as HTTP basic authentication
        secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(secret).decode()
        host = parts.netloc.rpartition("@")[2]
        url = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (http(s) only)
            answer.read()
        return True
    except urllib.error.HTTPError as err:
        why = f"HTTP {err.code}"
    except (urllib.error.URLError, OSError, ValueError) as err:
        why = str(getattr(err, "reason", err))
    print(f"warning: notify.webhook {redacted(url)}: not notified ({why})", file=sys.stderr)
    return False


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
        "mode": summary.get("mode"),
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
        "error": error,
    }


class Notifying:
    """Around a sweep's run: POSTs its outcome (`done`), or that it failed or was stopped."""

    def __init__(self, url: Optional[str], name: str, sweep_dir: str):
        self.url, self.name, self.sweep_dir = url, name, sweep_dir
        self.sent = False

    def __enter__(self) -> Notifying:
        return self

    def done(self, summary: dict[str, Any]) -> None:
        if self.url and not self.sent:
            self.sent = True
            post(self.url, payload(self.name, self.sweep_dir, summary))

    def __exit__(self, kind: Any, err: Any, tb: Any) -> bool:
        if self.url and not self.sent and kind is not None:
            self.sent = True
            if issubclass(kind, (KeyboardInterrupt, SystemExit, DiskFull)):
                status, error = "interrupted", str(err) if isinstance(err, DiskFull) else None
            else:
                status, error = "failed", f"{kind.__name__}: {err}"
            post(self.url, payload(self.name, self.sweep_dir, None, error and error.splitlines()[0], status))
        return False
