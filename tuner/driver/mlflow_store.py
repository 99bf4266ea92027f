"""The MLflow store of `tracking.mlflow`, asked briefly and refused in one line.

MLflow's client retries a failed HTTP request 7 times with exponential back-off (about 4
minutes, for rate limits) and waits 120 s for each answer: a server that is down held a sweep
silently for minutes, then ended it with a traceback. Before Ray starts, `check` asks the store
once (one try, at most REQUEST_TIMEOUT_S) and turns any failure into a ConfigError naming the field (exit
2). While the sweep runs, `brief()` bounds each call the same way, so a store that fails
mid-sweep costs seconds, not minutes (tracking.py then warns once and goes on without it).
Torch- and Ray-free; imports mlflow only when called.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from tuner.errors import ConfigError

FIELD = "tracking.mlflow.uri"
REQUEST_TIMEOUT_S = 10
# MLflow 3 sends usage events to its makers from every process that imports it (a thread
# fetching https://config.mlflow-telemetry.io, then posting records) unless told not to. The
# driver imports it on the user's behalf, for the store they named and nothing else: off,
# unless the user set either variable themselves.
TELEMETRY_ENV, DO_NOT_TRACK_ENV = "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"


def no_telemetry() -> None:
    """Before MLflow's import: its telemetry off, unless the user said otherwise."""
    if TELEMETRY_ENV not in os.environ and DO_NOT_TRACK_ENV not in os.environ:
        os.environ[TELEMETRY_ENV] = "true"


@contextlib.contextmanager
def brief(retries: int = 2) -> Iterator[None]:
    """MLflow's HTTP requests within: at most `retries` more tries after the first, 1 s and 2 s
    apart, of at most REQUEST_TIMEOUT_S each (MLflow's environment variables; the user's own
    settings of them win)."""
    wanted = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S),
    }
    added = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def check(uri: str, experiment: str) -> None:
    """Ask the store for the sweep's experiment; a ConfigError naming the field if it cannot
    answer (a server down or refusing, a database that cannot be opened)."""
    no_telemetry()
    from mlflow.tracking import MlflowClient

    try:
        with brief(retries=0):
            MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
    except Exception as err:  # noqa: BLE001 - whatever the store says, it is one line
        raise ConfigError(FIELD, f"the MLflow store does not answer: {one_line(err)}") from None


_ERRNO = re.compile(r"\[Errno -?\d+\][^'\"()\]]*")


def one_line(err: BaseException) -> str:
    """An MLflow error in one short line: the OS's reason where one is inside (MLflow wraps
    a refused connection in three layers of repr), the database's own error under
    SQLAlchemy's, else the exception's first line."""
    text = str(err)
    found = _ERRNO.findall(text)
    if found:
        return found[-1].strip().rstrip(":,")
    cause = getattr(err, "orig", None)  # SQLAlchemy's DBAPIError: the driver's exception
    if isinstance(cause, BaseException):
        err, text = cause, str(cause)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(err).__name__}: {(lines or [''])[0][:200]}"
