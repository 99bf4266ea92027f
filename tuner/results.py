"""A sweep directory read back: per-trial records, the best trial, summary.json.

One reader for every caller (end of a sweep, `resume`, `report`), working only from files
written synchronously by whoever knows the fact: each trial directory's `tuner_trial.json`
(configuration and status, by the driver's TrialRecordCallback) and `metrics.jsonl` (one line
per epoch, by the trial itself). Ray Tune's own experiment snapshot is not read: it is written
every 10 s or so and can keep stale statuses. So this also works on a sweep that is running,
was interrupted, or whose driver was killed.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from tuner import cluster
from tuner.trial.journal import NOTICE, TRACEBACK_FILE, read_metrics, write_atomic

SUMMARY_FILE = "summary.json"
CONFIG_FILE = "sweep.yaml"
RECORD_FILE = "tuner_trial.json"
TUNE_PARAMS_FILE = "params.json"  # the trial's configuration, written by Tune as it starts
FINISHED = ("TERMINATED", "ERROR")
# Metrics reported for the loop's own bookkeeping rather than as results.
NOT_METRICS = frozenset({"failure_detail", "wall_time", NOTICE})


@dataclass
class TrialRecord:
    """One trial as summary.json shows it."""

    trial_id: str  # its directory name; kept when a resumed sweep continues it
    status: str  # RUNNING (unfinished: interrupted or in progress), TERMINATED, ERROR
    config: dict[str, Any]
    last_metrics: dict[str, Any]
    epochs: int
    time_s: float  # training + evaluation time over all its epochs
    failure: Optional[str]  # None, "diverged", "oom", "error: <exception>"
    stopped_early: bool
    best_value: Optional[float]
    best_epoch: Optional[int]
    path: str = ""
    best_metrics: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


# ----------------------------------------------------------------------------- files


def json_safe(value: Any) -> Any:
    """Plain JSON types (numpy scalars from searchers become Python ones)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def read_record(trial_dir: str) -> Optional[dict[str, Any]]:
    """The trial's record, or None when it is missing, unreadable or not a record."""
    return _read_object(os.path.join(trial_dir, RECORD_FILE))[0]


def _read_object(path: str) -> tuple[Optional[dict[str, Any]], str]:
    """(the JSON object in `path`, "") or (None, why not)."""
    try:
        with open(path) as f:
            value = json.load(f)
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as err:
        return None, f"unreadable: {type(err).__name__}"
    if not isinstance(value, dict) or not isinstance(value.get("config", {}), dict):
        return None, f"not a record (a JSON {type(value).__name__})"
    return value, ""


def write_record(trial_dir: str, record: dict[str, Any]) -> None:
    os.makedirs(trial_dir, exist_ok=True)
    write_atomic(os.path.join(trial_dir, RECORD_FILE), json.dumps(record))


def recovered_record(trial_dir: str) -> Optional[dict[str, Any]]:
    """The trial's record; when that is damaged or missing, one rebuilt from the params.json
    Tune wrote when the trial started (said in one line: its status is then unknown, so it
    counts as unfinished and `resume` continues it from its newest checkpoint). None for a
    directory that is no trial's."""
    record, why = _read_object(os.path.join(trial_dir, RECORD_FILE))
    if record is not None:
        return record
    params_path = os.path.join(trial_dir, TUNE_PARAMS_FILE)
    params, params_why = _read_object(params_path)
    if params is None:
        if why != "missing" or params_why != "missing":
            cluster.warn(
                f"{trial_dir}: {RECORD_FILE} is {why} and {TUNE_PARAMS_FILE} is {params_why}: "
                "this trial is left out"
            )
        return None
    cluster.warn(
        f"{os.path.join(trial_dir, RECORD_FILE)} is {why}: trial read from its {TUNE_PARAMS_FILE} "
        "(status unknown: counted unfinished, `resume` continues it from its newest checkpoint)"
    )
    return {
        "trial_id": os.path.basename(trial_dir),
        "config": json_safe(params),
        "status": "RUNNING",
        "started": os.path.getmtime(params_path),
    }


def trial_dirs(sweep_dir: str) -> list[str]:
    """Directories of the sweep's trials, oldest first."""
    if not os.path.isdir(sweep_dir):
        return []
    found = []
    for name in os.listdir(sweep_dir):
        path = os.path.join(sweep_dir, name)
        record = recovered_record(path) if os.path.isdir(path) else None
        if record is not None:
            started = record.get("started")
            found.append((started if finite(started) else 0.0, name, path))
    return [path for _, _, path in sorted(found)]


class DiskFull(Exception):
    """The disk under the sweep filled up: the sweep stops as if interrupted, to be resumed."""

    def __init__(self, sweep_dir: str, cause: str):
        super().__init__(
            f"the disk under {sweep_dir} is full ({cause}); the sweep stopped. Kept: every finished "
            "trial and each unfinished trial's newest checkpoint. Free some space, then continue "
            f"with: python -m tuner resume {sweep_dir}"
        )


_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("No space left on device", "Disk quota exceeded", f"[Errno {errno.ENOSPC}]")


def disk_full(err: BaseException) -> Optional[str]:
    """The line saying the disk is full, if that is what `err` (or what caused it) means."""
    seen: set[int] = set()
    cur: Optional[BaseException] = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _FULL:
            return os.strerror(cur.errno)
        text = str(cur)
        if any(w in text for w in _FULL_WORDS):  # wrapped by Ray or pyarrow as text
            return "No space left on device"
        cur = cur.__cause__ or cur.__context__
    return None


def trial_disk_full(trial_dir: str) -> bool:
    """Whether the trial's saved error says the disk was full."""
    return any(w in error_line(trial_dir) for w in _FULL_WORDS)


def remove_temporaries(sweep_dir: str) -> None:
    """Temporary files of writes a full disk cut short (ours end in .tmp)."""
    for pattern in ("*.tmp", ".*.tmp"):  # glob leaves hidden names out of "*"
        for path in glob.glob(os.path.join(glob.escape(sweep_dir), "**", pattern), recursive=True):
            with contextlib.suppress(OSError):
                os.remove(path)


# ----------------------------------------------------------------------------- records


def record(trial_dir: str, metric: str, mode: str, max_epochs: int, hparams: list[str]) -> TrialRecord:
    """Summarise one trial directory. `hparams`: the config keys to show."""
    info = recovered_record(trial_dir) or {}
    rows = read_metrics(trial_dir)
    last = rows[-1] if rows else {}
    failure = None if last.get("failure") is None else str(last["failure"])
    epochs = int(last.get("epoch", 0) or 0)
    status = str(info.get("status", "RUNNING"))
    if status not in FINISHED and (failure or epochs >= max_epochs):
        # It finished (or failed as a result) but the driver died before recording it.
        status = "TERMINATED"
    if status == "ERROR" and failure is None:  # (a timeout's is in the journal already)
        failure = "error: " + error_line(trial_dir)
    best_row = _best_row(rows, metric, mode) if failure is None else None
    config = info.get("config") or {}
    return TrialRecord(
        trial_id=str(info.get("trial_id", os.path.basename(trial_dir))),
        status=status,
        config={k: config[k] for k in hparams if k in config},
        last_metrics={k: v for k, v in last.items() if k not in NOT_METRICS},
        epochs=epochs,
        time_s=round(sum(float(r["epoch_time_s"]) for r in rows if finite(r.get("epoch_time_s"))), 3),
        failure=failure,
        stopped_early=status == "TERMINATED" and failure is None and epochs < max_epochs,
        best_value=None if best_row is None else float(best_row[metric]),
        best_epoch=None if best_row is None else int(best_row.get("epoch", 0)),
        path=trial_dir,
        best_metrics={} if best_row is None else {k: v for k, v in best_row.items() if k not in NOT_METRICS},
        history=rows,
    )


def records(sweep_dir: str, metric: str, mode: str, max_epochs: int, hparams: list[str]) -> list[TrialRecord]:
    """Every trial of the sweep directory."""
    return [record(d, metric, mode, max_epochs, hparams) for d in trial_dirs(sweep_dir)]


def full_config(trial_dir: str) -> dict[str, Any]:
    """Everything the trial ran with (searched and fixed values, training defaults)."""
    return dict((recovered_record(trial_dir) or {}).get("config") or {})


def _best_row(rows: list[dict[str, Any]], metric: str, mode: str) -> Optional[dict[str, Any]]:
    ok = [r for r in rows if finite(r.get(metric)) and "failure" not in r]
    if not ok:
        return None
    pick = max if mode == "max" else min
    return pick(ok, key=lambda r: r[metric])


def finite(v: Any) -> bool:
    """A real, finite number (not a bool, NaN or inf)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def error_file(trial_dir: str) -> str:
    """The file with the trial's full traceback: ours (the trial's), else Tune's."""
    ours = os.path.join(trial_dir, TRACEBACK_FILE)
    return ours if os.path.isfile(ours) else os.path.join(trial_dir, "error.txt")


def error_line(trial_dir: str) -> str:
    """The last line of the trial's error (its exception), at most 200 characters."""
    text = ""
    for name in (TRACEBACK_FILE, "error.txt"):  # ours (the trial's), then Tune's
        try:
            with open(os.path.join(trial_dir, name)) as f:
                text = f.read()
            break
        except OSError:
            continue
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    exc = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit|OOM)\b", ln)]
    return (exc or lines or ["unknown error (see the trial's error.txt)"])[-1][:200]


# ----------------------------------------------------------------------------- summary


def best(trials: list[TrialRecord], mode: str) -> Optional[TrialRecord]:
    """The best trial by its best epoch; failed (diverged, oom, error) trials never count."""
    ok = [r for r in trials if r.failure is None and r.best_value is not None]
    if not ok:
        return None
    return (max if mode == "max" else min)(ok, key=lambda r: r.best_value)


def summarize(
    trials: list[TrialRecord],
    *,
    name: str,
    metric: str,
    mode: str,
    algorithm: str,
    expected_trials: int,
) -> dict[str, Any]:
    """The summary.json document. status: completed, or interrupted (resume continues it)."""
    top = best(trials, mode)
    done = sum(1 for r in trials if r.finished)
    status = "completed" if done >= expected_trials and done == len(trials) else "interrupted"
    hidden = ("path", "best_metrics", "history")
    return {
        "name": name,
        "metric": metric,
        "mode": mode,
        "algorithm": algorithm,
        "status": status,
        "expected_trials": expected_trials,
        "counts": _counts(trials),
        "best": None
        if top is None
        else {
            "trial_id": top.trial_id,
            "config": top.config,
            "metrics": top.best_metrics,
            "epoch": top.best_epoch,
        },
        "trials": [{k: v for k, v in asdict(r).items() if k not in hidden} for r in trials],
    }


def _counts(trials: list[TrialRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in trials:
        if r.failure:
            key = r.failure.split(":")[0]
        elif r.stopped_early:
            key = "stopped_early"
        elif r.status == "TERMINATED":
            key = "completed"
        else:
            key = "unfinished"
        counts[key] = counts.get(key, 0) + 1
    return counts


def write_summary(sweep_dir: str, summary: dict[str, Any]) -> str:
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    write_atomic(path, json.dumps(summary, indent=2, default=str))
    return path


def read_summary(sweep_dir: str) -> Optional[dict[str, Any]]:
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def leaderboard(trials: list[TrialRecord], metric: str, mode: str, top: int = 5) -> str:
    """A short plain-text table of the best trials."""
    ranked = sorted(
        (r for r in trials if r.best_value is not None and r.failure is None),
        key=lambda r: r.best_value,
        reverse=mode == "max",
    )[:top]
    if not ranked:
        return "(no trial produced a finite metric)"
    rows = [("trial", metric, "epoch", "status", "config")]
    for r in ranked:
        cfg = " ".join(f"{k}={short(v)}" for k, v in r.config.items())
        status = "stopped early" if r.stopped_early else _STATUS_WORDS.get(r.status, r.status.lower())
        rows.append((r.trial_id, f"{r.best_value:.4f}", f"{r.best_epoch}/{r.epochs}", status, cfg))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    )


_STATUS_WORDS = {"TERMINATED": "completed", "RUNNING": "unfinished"}


def short(v: Any) -> str:
    """A value as a leaderboard shows it (floats to 4 significant digits)."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def resources_of(trial_dir: str) -> dict[str, Any]:
    """What one worker of the trial had (workers, cpus_per_worker, gpus_per_worker), as the
    driver resolved it (gpus_per_worker: auto depends on the cluster)."""
    found = (read_record(trial_dir) or {}).get("resources")
    return dict(found) if isinstance(found, dict) else {}


def check_sweep_dir(sweep_dir: str) -> str:
    """`sweep_dir` made absolute, or a ConfigError saying why it is not a sweep directory."""
    from tuner.config import ConfigError

    path = os.path.abspath(sweep_dir)
    if not os.path.isdir(path):
        raise ConfigError("", f"{sweep_dir}: no such directory")
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise ConfigError("", f"{sweep_dir} is not a sweep directory (it has no {CONFIG_FILE})")
    return path
