"""A sweep directory read back: per-trial records, the best trial, summary.json.

One reader for every caller (end of a sweep, `resume`, `report`), working from what Ray Tune
left on disk (its experiment state and each trial's result.json), so it also works on a
sweep that is still running or was interrupted.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

SUMMARY_FILE = "summary.json"
TRIAL_END_FILE = "tuner_trial.json"  # written by tuner.callbacks.TrialEndCallback
CONFIG_FILE = "sweep.yaml"
# Keys Tune adds to every result; the rest are the trial's own metrics.
TUNE_KEYS = frozenset(
    "timestamp checkpoint_dir_name done training_iteration trial_id date time_this_iter_s "
    "time_total_s pid hostname node_ip config time_since_restore iterations_since_restore "
    "experiment_tag should_checkpoint checkpoint_path failure_detail".split()
)
FINISHED = ("TERMINATED", "ERROR")


@dataclass
class TrialRecord:
    """One trial as summary.json shows it."""

    trial_id: str
    status: str  # Tune's: PENDING, RUNNING, PAUSED, TERMINATED, ERROR
    config: dict[str, Any]
    last_metrics: dict[str, Any]
    epochs: int
    time_s: float
    failure: Optional[str]  # None, "diverged", "oom", "error: <exception>"
    stopped_early: bool
    best_value: Optional[float]
    best_epoch: Optional[int]
    path: Optional[str] = None
    best_metrics: dict[str, Any] = field(default_factory=dict)


def load_trials(sweep_dir: str) -> list[Any]:
    """Tune's Trial objects from the newest experiment state in `sweep_dir`."""
    from ray.tune import ExperimentAnalysis

    return list(ExperimentAnalysis(sweep_dir).trials)


def final_status(trial: Any) -> str:
    """The trial's status, preferring the end record our callback wrote over Tune's snapshot."""
    path = os.path.join(trial.path, TRIAL_END_FILE) if trial.path else None
    if path and os.path.isfile(path):
        try:
            with open(path) as f:
                return str(json.load(f)["status"])
        except (OSError, ValueError, KeyError):
            pass
    return str(trial.status)


def read_history(trial_path: Optional[str]) -> list[dict[str, Any]]:
    """Every result a trial reported (its result.json), oldest first."""
    if not trial_path:
        return []
    path = os.path.join(trial_path, "result.json")
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
    return rows


def record(trial: Any, metric: str, mode: str, max_epochs: int, hparams: list[str]) -> TrialRecord:
    """Summarise one Tune trial. `hparams`: config keys to show (the searched/fixed ones)."""
    last = dict(trial.last_result or {})
    history = read_history(trial.path)
    metrics = {k: v for k, v in last.items() if k not in TUNE_KEYS}
    failure = last.get("failure")
    status = final_status(trial)
    if status == "ERROR":
        failure = "error: " + _error_line(trial)
    best_row = _best_row(history, metric, mode) if failure is None else None
    epochs = int(last.get("epoch", 0) or 0)
    return TrialRecord(
        trial_id=trial.trial_id,
        status=status,
        config={k: trial.config.get(k) for k in hparams if k in trial.config},
        last_metrics=metrics,
        epochs=epochs,
        time_s=round(float(last.get("time_total_s", 0.0) or 0.0), 3),
        failure=failure,
        stopped_early=status == "TERMINATED" and failure is None and epochs < max_epochs,
        best_value=None if best_row is None else float(best_row[metric]),
        best_epoch=None if best_row is None else int(best_row.get("epoch", 0)),
        path=trial.path,
        best_metrics={} if best_row is None else {k: v for k, v in best_row.items() if k not in TUNE_KEYS},
    )


def _best_row(history: list[dict[str, Any]], metric: str, mode: str) -> Optional[dict[str, Any]]:
    rows = [r for r in history if _finite(r.get(metric)) and "failure" not in r]
    if not rows:
        return None
    pick = max if mode == "max" else min
    return pick(rows, key=lambda r: r[metric])


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _error_line(trial: Any) -> str:
    text = ""
    try:
        text = trial.get_error() or ""
    except Exception:  # noqa: BLE001 - the error file may be gone; say what we know
        pass
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    exc = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit|OOM)\b", ln)]
    line = (exc or lines or ["unknown error"])[-1]
    return line[:200]


def best(records: list[TrialRecord], mode: str) -> Optional[TrialRecord]:
    """The best trial by its best epoch; failed (diverged, oom, error) trials never count."""
    ok = [r for r in records if r.failure is None and r.best_value is not None]
    if not ok:
        return None
    return (max if mode == "max" else min)(ok, key=lambda r: r.best_value)


def summarize(
    records: list[TrialRecord],
    *,
    name: str,
    metric: str,
    mode: str,
    algorithm: str,
    expected_trials: int,
    status: Optional[str] = None,
) -> dict[str, Any]:
    """The summary.json document."""
    top = best(records, mode)
    if status is None:
        unfinished = [r for r in records if r.status not in FINISHED]
        status = "interrupted" if unfinished or len(records) < expected_trials else "completed"
    return {
        "name": name,
        "metric": metric,
        "mode": mode,
        "algorithm": algorithm,
        "status": status,
        "expected_trials": expected_trials,
        "counts": _counts(records),
        "best": None
        if top is None
        else {
            "trial_id": top.trial_id,
            "config": top.config,
            "metrics": top.best_metrics,
            "epoch": top.best_epoch,
        },
        "trials": [
            {k: v for k, v in asdict(r).items() if k not in ("path", "best_metrics")} for r in records
        ],
    }


def _counts(records: list[TrialRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        key = (r.failure or "").split(":")[0] or ("stopped_early" if r.stopped_early else r.status.lower())
        if key == "terminated":
            key = "completed"
        counts[key] = counts.get(key, 0) + 1
    return counts


def write_summary(sweep_dir: str, summary: dict[str, Any]) -> str:
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2, default=str)
    os.replace(tmp, path)  # readers never see half a file
    return path


def read_summary(sweep_dir: str) -> Optional[dict[str, Any]]:
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def leaderboard(records: list[TrialRecord], metric: str, mode: str, top: int = 5) -> str:
    """A short plain-text table of the best trials."""
    ranked = sorted(
        (r for r in records if r.best_value is not None and r.failure is None),
        key=lambda r: r.best_value,
        reverse=mode == "max",
    )[:top]
    if not ranked:
        return "(no trial produced a finite metric)"
    rows = [("trial", metric, "epoch", "status", "config")]
    for r in ranked:
        cfg = " ".join(f"{k}={_short(v)}" for k, v in r.config.items())
        status = "stopped early" if r.stopped_early else _STATUS_WORDS.get(r.status, r.status.lower())
        rows.append((r.trial_id, f"{r.best_value:.4f}", f"{r.best_epoch}/{r.epochs}", status, cfg))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    )


_STATUS_WORDS = {"TERMINATED": "completed"}


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def check_sweep_dir(sweep_dir: str) -> str:
    """`sweep_dir` made absolute, or a ConfigError saying why it is not a sweep directory."""
    from tuner.config import ConfigError

    path = os.path.abspath(sweep_dir)
    if not os.path.isdir(path):
        raise ConfigError("", f"{sweep_dir}: no such directory")
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise ConfigError("", f"{sweep_dir} is not a sweep directory (it has no {CONFIG_FILE})")
    return path
