"""The sweep as a whole, as its trials finish: the best value so far of each objective, how
many trials run, stopped early or failed, and the epochs spent.

One computation for every reader: the driver feeds it live (trials starting, epochs reported,
trials ending) and writes each point to TensorBoard's sweep run; `replay` feeds it the same
events from a sweep directory for the report and `tuner compare`, and for a resumed sweep,
whose points then continue where they stopped. A trial's best value is the one the ranking
uses (`results.best_of`: a failed trial's epochs before it failed count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from tuner.results import Outcome, TrialRecord, best_of
from tuner.sweepdir import finite

# The sweep run's scalars (step: trials finished), in a group of their own: a trial's run has
# best/<metric> by epoch, and one tag would draw both on one chart.
BEST = "sweep/best/"  # + each objective's name
DONE, RUNNING = "sweep/done", "sweep/running"
STOPPED_EARLY, FAILED = "sweep/stopped_early", "sweep/failed"
EPOCHS = "sweep/epochs_spent"
_ABOUT = {
    DONE: "trials finished (completed, stopped, stopped early or failed). Step: trials finished.",
    RUNNING: "trials started and not finished when the step's trial finished (paused ones too).",
    STOPPED_EARLY: "trials the scheduler stopped early, of those finished.",
    FAILED: "trials that failed (diverged, out of memory, timed out, raised), of those finished.",
    EPOCHS: "epochs trained by every trial of the sweep when the step's trial finished.",
}


def descriptions(objectives: Sequence[tuple[str, str]]) -> dict[str, str]:
    """What each of the sweep run's scalars means (shown beside its chart)."""
    best = {
        BEST + name: f"the best {name} of the trials finished so far (what tuner ranks by; a failed "
        "trial's epochs before it failed count). Step: trials finished; Relative: wall time."
        for name, _ in objectives
    }
    return {**best, **_ABOUT}


@dataclass
class Point:
    """The sweep when its `done`-th trial finished."""

    done: int  # trials finished (the step)
    time: float  # when (seconds since the epoch)
    trial_id: str  # the trial that finished
    trial_best: dict[str, float]  # its best value of each objective (those it has)
    best: dict[str, float]  # the best so far of each objective (those any finished trial has)
    running: int
    stopped_early: int
    failed: int
    epochs: int

    def scalars(self) -> dict[str, float]:
        """The point as the sweep run's TensorBoard scalars (tag: value)."""
        return {
            **{BEST + name: v for name, v in self.best.items()},
            DONE: self.done,
            RUNNING: self.running,
            STOPPED_EARLY: self.stopped_early,
            FAILED: self.failed,
            EPOCHS: self.epochs,
        }


@dataclass
class SweepHistory:
    """The running state, fed one event at a time; `points` holds one per finished trial."""

    objectives: Sequence[tuple[str, str]]  # (metric, direction), the first the one ranked by
    points: list[Point] = field(default_factory=list)
    best: dict[str, float] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    epochs: dict[str, int] = field(default_factory=dict)  # the furthest epoch of each trial
    stopped_early: int = 0
    failed: int = 0

    def started(self, trial_id: str) -> None:
        if trial_id not in self.finished:
            self.running.add(trial_id)

    def epoch(self, trial_id: str, epoch: int) -> None:
        """A trial reported `epoch` (a resumed trial repeats those after its checkpoint)."""
        self.epochs[trial_id] = max(self.epochs.get(trial_id, 0), int(epoch))

    def ended(self, trial: TrialRecord, when: float) -> Optional[Point]:
        """A trial finished (any outcome but unfinished): the sweep's new point; None for a
        trial counted already or not finished."""
        if trial.trial_id in self.finished or trial.outcome is Outcome.UNFINISHED:
            return None
        self.finished.add(trial.trial_id)
        self.running.discard(trial.trial_id)
        self.epoch(trial.trial_id, trial.epochs)
        self.stopped_early += trial.outcome is Outcome.STOPPED_EARLY
        self.failed += trial.outcome.failed
        mine: dict[str, float] = {}
        for name, direction in self.objectives:
            found = best_of(trial, name, direction)
            if found is None:
                continue
            mine[name] = found[0]
            old = self.best.get(name)
            if old is None or (found[0] > old if direction == "max" else found[0] < old):
                self.best[name] = found[0]
        point = Point(
            done=len(self.finished),
            time=when,
            trial_id=trial.trial_id,
            trial_best=mine,
            best=dict(self.best),
            running=len(self.running),
            stopped_early=self.stopped_early,
            failed=self.failed,
            epochs=sum(self.epochs.values()),
        )
        self.points.append(point)
        return point


_START, _EPOCH, _END = 0, 1, 2  # (at equal times: starts, then epochs, then ends)


def replay(trials: Sequence[TrialRecord], objectives: Sequence[tuple[str, str]]) -> SweepHistory:
    """The history of a sweep directory's trials (`results.records`): their starts, epochs
    and ends fed in the order they happened, as the driver fed them live."""
    events: list[tuple[float, int, int, TrialRecord, int]] = []
    for i, t in enumerate(trials):
        times = [float(r["wall_time"]) for r in t.history if finite(r.get("wall_time"))]
        start = t.started if t.started is not None else (times[0] if times else t.ended)
        if start is not None:
            events.append((start, _START, i, t, 0))
        events += [
            (float(r["wall_time"]), _EPOCH, i, t, int(r["epoch"]))
            for r in t.history
            if finite(r.get("wall_time"))
        ]
        if t.ended is not None:
            events.append((t.ended, _END, i, t, 0))
    history = SweepHistory(objectives)
    for when, kind, _, t, epoch in sorted(events, key=lambda e: e[:3]):
        if kind == _START:
            history.started(t.trial_id)
        elif kind == _EPOCH:
            history.epoch(t.trial_id, epoch)
        else:
            history.ended(t, when)
    return history


def curve(
    points: Sequence[Point], metric: str
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(each finished trial's best `metric`, the best so far where it changed) against trials
    finished: the report's and `tuner compare`'s view of the sweep run's `sweep/best/<metric>`."""
    dots = [(float(p.done), p.trial_best[metric]) for p in points if metric in p.trial_best]
    steps: list[tuple[float, float]] = []
    for p in points:
        if metric in p.best and (not steps or p.best[metric] != steps[-1][1]):
            steps.append((float(p.done), p.best[metric]))
    return dots, steps
