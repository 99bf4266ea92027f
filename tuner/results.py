"""A sweep directory read back: per-trial records, their outcomes, the ranking, summary.json.

One reader for every caller (end of a sweep, `resume`, `report`), working only from files
written synchronously by whoever knows the fact: each trial directory's `tuner_trial.json`
(configuration and status, by the driver's TrialRecordCallback) and `metrics.jsonl` (one line
per epoch, by the trial itself). Ray Tune's own experiment snapshot is not read: it is written
every 10 s or so and can keep stale statuses. So this also works on a sweep that is running,
was interrupted, or whose driver was killed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Optional

from tuner.sweepdir import (
    NEVER_STARTED,
    NOTICE,
    STOPPED_ITSELF,
    SUMMARY_OLDER_DIRECTION,
    error_line,
    finite,
    read_lineage,
    read_metrics,
    read_verdicts,
    recovered_record,
    trial_dirs,
)

FINISHED = ("TERMINATED", "ERROR")
# Metrics reported for the loop's own bookkeeping rather than as results.
NOT_METRICS = frozenset({"failure_detail", "wall_time", NOTICE, STOPPED_ITSELF})


class Outcome(str, Enum):
    """How a trial ended: one vocabulary for summary.json's counts, the CLI's table and the
    report. Computed once per trial (`record`)."""

    COMPLETED = "completed"  # trained to max_epochs
    STOPPED_EARLY = "stopped early"  # stopped by the scheduler (ASHA) at a rung
    STOPPED = "stopped"  # running or paused when the sweep reached its target or spent its time budget
    DIVERGED = "diverged"  # non-finite loss
    OOM = "oom"  # out of memory at the smallest micro-batch
    TIMEOUT = "timeout"
    ERROR = "error"  # its code raised (Tune: ERROR)
    UNFINISHED = "unfinished"  # running now, or cut off when the sweep stopped
    # Its own code ended its training before max_epochs (its early stopping); last, so that
    # the codes of the others stay what older sweeps' TensorBoard columns hold.
    STOPPED_ITSELF = "stopped itself"

    @classmethod
    def parse(cls, word: str) -> Outcome:
        """An outcome from its word, including the words of older summary.json files
        ("stopped_early"); an unknown failure word counts as an error."""
        word = _OLD_WORDS.get(word, word)
        try:
            return cls(word)
        except ValueError:
            return cls.ERROR

    @property
    def failed(self) -> bool:
        return self in (Outcome.DIVERGED, Outcome.OOM, Outcome.TIMEOUT, Outcome.ERROR)

    @property
    def code(self) -> int:
        """The outcome as a number, its place here (TensorBoard's HParams columns hold only
        numbers): 0-2 and 8 ended well, 3-6 failed, 7 unfinished."""
        return list(Outcome).index(self)

    @classmethod
    def legend(cls) -> str:
        """What each code means: `0 completed, 1 stopped early, ...`."""
        return ", ".join(f"{o.code} {o.value}" for o in cls)


_OLD_WORDS = {"stopped_early": Outcome.STOPPED_EARLY.value}


def outcome_of(
    status: str, failure: Optional[str], stopped_early: bool, stopped: bool = False, itself: bool = False
) -> Outcome:
    """The Outcome of a trial from its record's status, its failure, whether ASHA stopped it,
    whether the sweep's end (its target reached) did, and whether its own code did (`itself`)."""
    if failure:
        return Outcome.parse(failure.split(":")[0])
    if stopped:
        return Outcome.STOPPED
    if itself and status == "TERMINATED":
        return Outcome.STOPPED_ITSELF
    if stopped_early:
        return Outcome.STOPPED_EARLY
    return Outcome.COMPLETED if status == "TERMINATED" else Outcome.UNFINISHED


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
    stopped_early: bool  # by the scheduler (ASHA), at a rung
    best_value: Optional[float]
    best_epoch: Optional[int]
    path: str = ""
    best_metrics: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    outcome: Outcome = Outcome.UNFINISHED
    started: Optional[float] = None  # when it first started (time.time()), if known
    ended: Optional[float] = None  # when it ended; None while unfinished
    never_started: bool = False  # Tune failed it before it started (no code of the user's ran)
    stopped_itself: bool = False  # its own code ended training before max_epochs (not a scheduler)
    # A population's member (pbt, pb2): its configuration per epoch range, {"epochs": [first,
    # last], "config": ..., "donor": the trial whose weights the range started from, or None}.
    # Its `config` is then the last range's. None: not a member (or not perturbed yet).
    schedule: Optional[list[dict[str, Any]]] = None
    # Where its configuration came from (start_with, an earlier sweep's path, searcher), as
    # its record says: written when the searcher handed it out. None: not recorded.
    origin: Optional[str] = None
    # The latest judgement of a scheduler that reads whole curves (median, curve): its epoch,
    # whether it stopped the trial, and its numbers (tuner.sweepdir's stopper.jsonl). None: none.
    verdict: Optional[dict[str, Any]] = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def to_run(self) -> bool:
        """Whether `resume` (and `extend`) run it: unfinished, or failed before it started."""
        return not self.finished or self.never_started


# ----------------------------------------------------------------------------- records


def record(trial_dir: str, metric: str, direction: str, max_epochs: int, hparams: list[str]) -> TrialRecord:
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
    # Epochs reported before a trial failed are results like any other: only the epoch it
    # failed at is not (a later error never discards what a trial reported).
    best_row = best_row_of(rows, metric, direction)
    config = info.get("config") or {}
    lineage = read_lineage(trial_dir)
    schedule = None if lineage is None else schedule_of(lineage["segments"], epochs, hparams)
    if lineage is not None:
        config = lineage["segments"][-1]["config"]
    stopped = info.get("stopped") in (TARGET, BUDGET)
    itself = bool(last.get(STOPPED_ITSELF)) and failure is None and not stopped
    short = status == "TERMINATED" and failure is None and epochs < max_epochs
    stopped_early = short and not stopped and not itself
    outcome = outcome_of(status, failure, stopped_early, stopped, itself)
    return TrialRecord(
        trial_id=str(info.get("trial_id", os.path.basename(trial_dir))),
        status=status,
        config={k: config[k] for k in hparams if k in config},
        last_metrics={k: v for k, v in last.items() if k not in NOT_METRICS},
        epochs=epochs,
        time_s=round(sum(float(r["epoch_time_s"]) for r in rows if finite(r.get("epoch_time_s"))), 3),
        failure=failure,
        stopped_early=stopped_early,
        best_value=None if best_row is None else float(best_row[metric]),
        best_epoch=None if best_row is None else int(best_row.get("epoch", 0)),
        path=trial_dir,
        best_metrics={} if best_row is None else {k: v for k, v in best_row.items() if k not in NOT_METRICS},
        history=rows,
        outcome=outcome,
        started=float(info["started"]) if finite(info.get("started")) else None,
        ended=None if outcome is Outcome.UNFINISHED else _ended(info, rows),
        never_started=status == "ERROR" and bool(info.get(NEVER_STARTED)),
        stopped_itself=outcome is Outcome.STOPPED_ITSELF,
        schedule=schedule,
        origin=str(info["origin"]) if info.get("origin") else None,
        verdict=next(reversed(read_verdicts(trial_dir)), None),
    )


def schedule_of(segments: list[dict[str, Any]], epochs: int, hparams: Sequence[str]) -> list[dict[str, Any]]:
    """A member's lineage as epoch ranges: [{"epochs": [first, last], "config": its `hparams`,
    "donor": the trial whose weights it continued from at the range's start, or None}]."""
    out = []
    for i, seg in enumerate(segments):
        start = int(seg["epoch"])
        end = int(segments[i + 1]["epoch"]) if i + 1 < len(segments) else max(epochs, start)
        config = seg["config"]
        entry = {"epochs": [start + 1, end], "config": {k: config[k] for k in hparams if k in config}}
        out.append({**entry, "donor": seg.get("donor")})
    return out


def weights_schedule(trials: Sequence[TrialRecord], trial: TrialRecord, epoch: int) -> list[dict[str, Any]]:
    """The configurations that trained `trial`'s weights of `epoch`, epoch range by range,
    oldest first, through the trials it continued from (a population's lineage followed
    back): [{"trial": ..., "epochs": [first, last], "config": ...}]. A trial without a schedule
    trained them all itself."""
    by_id = {t.trial_id: t for t in trials}
    out: list[dict[str, Any]] = []
    current: Optional[TrialRecord] = trial
    last = epoch
    while current is not None and last > 0:
        ranges = current.schedule or [{"epochs": [1, last], "config": current.config, "donor": None}]
        donor = None
        for seg in reversed(ranges):
            first, end = int(seg["epochs"][0]), int(seg["epochs"][1])
            if first > last:
                continue
            trained = [first, min(end, last)]
            out.append({"trial": current.trial_id, "epochs": trained, "config": seg["config"]})
            if seg.get("donor") is not None:
                donor = str(seg["donor"])
                last = first - 1
                break
        else:
            break
        current = by_id.get(donor) if donor is not None else None
    return out[::-1]


def _ended(info: dict[str, Any], rows: list[dict[str, Any]]) -> Optional[float]:
    """When a finished trial ended: as its record says, else (the driver died before it
    recorded the end) when its last epoch did."""
    for when in (info.get("ended"), rows[-1].get("wall_time") if rows else None, info.get("started")):
        if finite(when):
            return float(when)
    return None


def records(
    sweep_dir: str, metric: str, direction: str, max_epochs: int, hparams: list[str]
) -> list[TrialRecord]:
    """Every trial of the sweep directory."""
    return [record(d, metric, direction, max_epochs, hparams) for d in trial_dirs(sweep_dir)]


def best_row_of(rows: Sequence[dict[str, Any]], metric: str, direction: str) -> Optional[dict[str, Any]]:
    """The row (epoch) of a trial's best value of `metric`; None if no row has a finite one.
    Ties: the earliest row."""
    ok = [r for r in rows if finite(r.get(metric)) and "failure" not in r]
    if not ok:
        return None
    pick = max if direction == "max" else min
    return pick(ok, key=lambda r: r[metric])


def best_of(trial: TrialRecord, metric: str, direction: str) -> Optional[tuple[float, int]]:
    """A trial's best value of `metric` and the epoch it was reached, as the ranking counts
    (of the first objective: `best_value`, `best_epoch`); None without a finite one."""
    row = best_row_of(trial.history, metric, direction)
    return None if row is None else (float(row[metric]), int(row.get("epoch", 0)))


# ----------------------------------------------------------------------------- summary


def ranked(trials: list[TrialRecord], direction: str) -> list[TrialRecord]:
    """Trials with a usable result, best first by their best epoch (ties: the one that
    started first), however they ended: a trial that failed (diverged, oom, timeout, error)
    counts with the epochs it reported before. The one ranking of summary.json's best, the
    CLI's leaderboard and the report."""
    ok = [r for r in trials if r.best_value is not None]
    return sorted(ok, key=lambda r: r.best_value, reverse=direction == "max")  # type: ignore[arg-type,return-value]


def best(trials: list[TrialRecord], direction: str) -> Optional[TrialRecord]:
    """The best trial by its best epoch (a failed trial's epochs before it failed count)."""
    top = ranked(trials, direction)
    return top[0] if top else None


# Summary statuses of a sweep that ended before its planned trials, every started one ended.
BUDGET = "budget"  # schedule.time_budget was spent
TARGET = "target_reached"  # a trial reported schedule.stop_at
FAILED = "failed"  # its first trials all failed with the same error (failure.fail_fast)


def summarize(
    trials: list[TrialRecord],
    *,
    name: str,
    metric: str,
    direction: str,
    algorithm: str,
    expected_trials: int,
    ended: Optional[str] = None,
    objectives: Sequence[tuple[str, str]] = (),
    environment: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """The summary.json document. status: completed; interrupted (resume continues it); or,
    every started trial having ended, why the sweep ended before its planned trials: `ended`
    (budget: schedule.time_budget spent; target_reached: schedule.stop_at met; failed: the
    first trials all failed with the same error, which `error` then says, and the sweep stopped
    the rest, failure.fail_fast).
    `metric`/`direction`: the first objective (a file written before `direction` says `mode`:
    sweepdir.read_summary reads both); with several `objectives`, the document also lists
    them and their Pareto front (`pareto`). `environment`: what the run that writes it ran on
    (tuner.environment), as environment.json keeps it."""
    top = best(trials, direction)
    # A population's best: the configurations that trained its weights, range by range (the
    # last: its best epoch's, which may precede the configuration it ended with).
    schedule = (
        None if top is None or top.schedule is None else weights_schedule(trials, top, top.best_epoch or 0)
    )
    done = sum(1 for r in trials if r.finished)
    status = "completed" if done >= expected_trials and done == len(trials) else "interrupted"
    cut = any(r.outcome is Outcome.STOPPED for r in trials)  # by the sweep's end: not completed
    errors = [r.failure.removeprefix("error: ") for r in trials if r.outcome is Outcome.ERROR and r.failure]
    if ended == FAILED:  # (trials it cut off count as unfinished: resume runs them)
        status = FAILED if errors else status  # (no error among them: interrupted, as it stands)
    elif ended and done == len(trials) and (status == "interrupted" or ended == TARGET or cut):
        status = ended
    hidden = (
        "path",
        "best_metrics",
        "history",
        "outcome",
        "started",
        "ended",
        "never_started",
        "schedule",
        "origin",
        "verdict",
    )
    return {
        "name": name,
        "metric": metric,
        "direction": direction,
        SUMMARY_OLDER_DIRECTION: direction,  # (its older name: scripts that read it go on working)
        "algorithm": algorithm,
        "status": status,
        "expected_trials": expected_trials,
        "counts": counts(trials),
        "best": None
        if top is None
        else {
            "trial_id": top.trial_id,
            "config": schedule[-1]["config"] if schedule else top.config,
            "metrics": top.best_metrics,
            "epoch": top.best_epoch,
            **({"schedule": schedule} if schedule is not None else {}),
        },
        **(
            {"objectives": [[n, m] for n, m in objectives], "pareto": pareto(trials, objectives)}
            if len(objectives) > 1
            else {}
        ),
        **({"error": max(errors, key=errors.count)} if status == FAILED else {}),
        **({"environment": environment} if environment else {}),
        "trials": [
            {
                **{k: v for k, v in asdict(r).items() if k not in hidden},
                **({NEVER_STARTED: True} if r.never_started else {}),
                **({"schedule": r.schedule} if r.schedule is not None else {}),
                **({"origin": r.origin} if r.origin else {}),
                **({"verdict": r.verdict} if r.verdict is not None else {}),
            }
            for r in trials
        ],
    }


def counts(trials: list[TrialRecord]) -> dict[str, int]:
    """How many trials ended which way, in Outcome's order (words as Outcome says them)."""
    found = [r.outcome for r in trials]
    return {o.value: found.count(o) for o in Outcome if o in found}


def pareto(trials: list[TrialRecord], objectives: Sequence[tuple[str, str]]) -> list[str]:
    """The ids of the trials no other trial dominates, in the trials' order.

    Each trial counts with its values of every objective at its best epoch of the first
    (`best_metrics`: a failed trial's, of the epochs before it failed); those missing a
    finite value of one never count. A
    trial dominates another when it is at least as good in every objective and better in one,
    so trials of equal values are all on the front, or all off it.
    """
    signs = [1.0 if direction == "max" else -1.0 for _, direction in objectives]
    names = [n for n, _ in objectives]
    points = [
        (r.trial_id, tuple(s * v for s, v in zip(signs, values, strict=True)))
        for r in trials
        if (values := objective_values(r, names)) is not None
    ]
    # Best first, lexicographically: a trial that dominates another comes before it, so each
    # needs comparing with the front found so far only.
    front: list[tuple[float, ...]] = []
    on: set[str] = set()
    for trial_id, p in sorted(points, key=lambda t: t[1], reverse=True):
        if not any(_dominates(q, p) for q in front):
            front.append(p)
            on.add(trial_id)
    return [r.trial_id for r in trials if r.trial_id in on]


def objective_values(r: TrialRecord, names: Sequence[str]) -> Optional[tuple[float, ...]]:
    """A trial's values of `names` at its best epoch of the first objective; None for one
    without a finite value of each."""
    values = [r.best_metrics.get(n) for n in names]
    if not all(finite(v) for v in values):
        return None
    return tuple(float(v) for v in values)  # type: ignore[arg-type]


def _dominates(q: tuple[float, ...], p: tuple[float, ...]) -> bool:
    """Whether q is at least p everywhere and more somewhere (every objective maximised)."""
    return all(a >= b for a, b in zip(q, p, strict=True)) and q != p


PARETO_ROWS = 15  # most rows of the CLI's table with several objectives


def leaderboard(trials: list[TrialRecord], objectives: Sequence[tuple[str, str]], top: int = 5) -> str:
    """A short plain-text table of the best trials by the first objective. With several
    objectives: a column of each, the Pareto front's trials too (marked `*`), best first."""
    metric, direction = objectives[0]
    best_first = ranked(trials, direction)
    several = len(objectives) > 1
    front = set(pareto(trials, objectives)) if several else set()
    shown = [r for i, r in enumerate(best_first) if i < top or r.trial_id in front][: max(top, PARETO_ROWS)]
    if not shown:
        return "(no trial produced a finite metric)"
    names = [n for n, _ in objectives]
    rows = [("trial", *names, "epoch", "status", *(["pareto"] if several else []), "config")]
    for r in shown:
        rows.append(
            (
                r.trial_id,
                *(number(r.best_metrics.get(n)) for n in names),
                f"{r.best_epoch}/{r.epochs}",
                r.outcome.value,
                *(["*" if r.trial_id in front else ""] if several else []),
                config_label(r.config),
            )
        )
    cells = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(cells)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:cells], widths, strict=True)) + "  " + row[cells]
        for row in rows
    ]
    left = len(front - {r.trial_id for r in shown})
    return "\n".join(lines + ([f"(and {left} more on the Pareto front: summary.json)"] if left else []))


METRIC_DIGITS = 5  # significant digits of a metric wherever tuner shows one


def number(v: Any, digits: int = METRIC_DIGITS) -> str:
    """A metric's value as tuner shows it (the live status line, the CLI's table and best line,
    the report, compare): integers whole, other numbers to `digits` significant digits, so
    7.59e-05 and 9.27e-05 stay apart (4 fixed decimals showed 0.0001 for both); "-" for a
    missing, NaN or infinite value."""
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return f"{v:.{digits}g}" if finite(v) else "-"


def short(v: Any) -> str:
    """A value as a leaderboard shows it (numbers to 4 significant digits)."""
    return number(v, 4) if isinstance(v, float) else str(v)


def clock(seconds: float) -> str:
    """Whole seconds as m:ss, or h:mm:ss from an hour on."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def config_label(config: dict[str, Any]) -> str:
    """A configuration in one line: `lr=0.01 width=64`."""
    return " ".join(f"{k}={short(v)}" for k, v in config.items())
