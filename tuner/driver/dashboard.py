"""What TensorBoard shows of tuner's own ranking, written by the driver as results arrive.

Each trial's run gets, beside the scalars the trial writes itself, its best value of each
objective so far (`best/<metric>`, the value tuner ranks it by) and that epoch's number
(`best_epoch/<metric>`), the epochs it trained (`trial/epochs`) and how it ended
(`trial/outcome`, a number: `Outcome.code`); these are HParams columns, so the table sorts and
filters trials the way summary.json, the CLI and the report rank them. With a scheduler that
judges whole curves (median, curve), its judgement of each epoch too (`stopper/...`:
tuner.driver.verdicts), so the table shows why a trial was stopped. A stopped or crashed
trial keeps what it reached: its last values are written when it ends, from the same
`results.record` the summary reads.

The sweep's own run (`<sweep>/sweep`) gets a point each time a trial finishes
(`tuner.history`, tags `sweep/...`): the best so far of each objective, how many trials are
done, running, stopped early and failed, and the epochs spent, at step = trials finished. A resumed or
extended sweep replays what its directory holds first, so its steps continue.

The driver sees every trial mode alike (tuner's loop, hooks, task.train, task.command: all
report through Tune), so nothing here depends on how a trial runs.
"""

from __future__ import annotations

import io
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ray.tune import Callback
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.record_writer import RecordWriter

from tuner.driver.callbacks import trial_dir
from tuner.driver.stopping import INTERRUPTED
from tuner.driver.verdicts import STOPPER
from tuner.history import SweepHistory, descriptions, replay
from tuner.results import Outcome, TrialRecord, best_of, best_row_of, record, records
from tuner.sweepdir import SWEEP_RUN, Place, finite, read_metrics
from tuner.trial.frame import tb

# A trial's scalars written by the driver (HParams columns).
BEST, BEST_EPOCH = "best/", "best_epoch/"  # + the objective's name
EPOCHS, OUTCOME = "trial/epochs", "trial/outcome"


def columns(objectives: Sequence[str]) -> dict[str, tuple[str, str]]:
    """The HParams columns of what tuner ranks by, in order: tag -> (header, description)."""
    ranked = "tuner ranks by it; a failed trial's epochs before it failed count"
    best = {BEST + n: (BEST + n, f"the trial's best {n} ({ranked})") for n in objectives}
    epoch = {BEST_EPOCH + n: (BEST_EPOCH + n, f"the epoch of the trial's best {n}") for n in objectives}
    return {
        **best,
        **epoch,
        OUTCOME: ("outcome", f"how the trial ended: {Outcome.legend()}"),
        EPOCHS: ("epochs", "epochs the trial trained (a failed trial's count the one it failed at)"),
    }


class EventFile:
    """A TensorBoard event file the driver appends to: each write opens the file, appends and
    closes it, then pushes it to the sweep's place (a remote one keeps it in step). No writer
    thread per trial (a sweep may hold hundreds of paused trials), and nothing waits in a
    buffer when the driver is killed. One per run directory and driver."""

    def __init__(self, logdir: str, suffix: str, place: Optional[Place] = None):
        self.logdir, self.place = logdir, place
        self.name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}.{os.getpid()}{suffix}"
        self.described: set[str] = set()  # tags written with their description already

    def scalars(
        self,
        values: dict[str, float],
        step: int,
        wall_time: Optional[float] = None,
        descriptions: Optional[dict[str, str]] = None,
    ) -> None:
        path = os.path.join(self.logdir, self.name)
        events = []
        if not os.path.exists(path):  # (without it, TensorBoard drops steps that go back)
            events.append(Event(wall_time=time.time(), file_version="brain.Event:2"))
        about = {t: d for t, d in (descriptions or {}).items() if t in values and t not in self.described}
        self.described.update(about)
        summary = tb.scalars_summary(values, about)
        events.append(Event(wall_time=wall_time or time.time(), step=step, summary=summary))
        buf = io.BytesIO()
        out = RecordWriter(buf)
        for e in events:
            out.write(e.SerializeToString())
        os.makedirs(self.logdir, exist_ok=True)
        with open(path, "ab") as f:
            f.write(buf.getvalue())
        if self.place is not None:
            self.place.push(path)


@dataclass
class _Live:
    """A trial running under this driver: its best row of each objective so far."""

    path: str
    file: EventFile
    best: dict[str, dict[str, Any]] = field(default_factory=dict)
    epochs: int = 0
    ended: bool = False


class Dashboard(Callback):
    """Writes each trial's best values and outcome, and the sweep's own run (see the module).

    Comes after TrialRecordCallback and SweepLimits among the callbacks: a trial's end is read
    back from the record they write."""

    def __init__(self, place: Place, objectives: Sequence[tuple[str, str]], max_epochs: int):
        self.place, self.sweep_dir = place, place.local
        self.objectives, self.max_epochs = list(objectives), max_epochs
        self.metric, self.direction = self.objectives[0]
        self.live: dict[str, _Live] = {}  # by Tune's trial id
        self.history = SweepHistory(self.objectives)
        self.run = EventFile(os.path.join(place.local, SWEEP_RUN), ".sweep", place)

    def setup(self, **info: Any) -> None:
        # What earlier runs of this sweep finished (resume, extend): the points go on from there.
        self.history = replay(self._records(), self.objectives)

    def ended_earlier(self, ended: Mapping[str, TrialRecord]) -> None:
        """(CatchUp) A trial that finished as the last driver was killed, after its record and
        before its last values here (a remote place's pull widens that moment): its columns
        would say unfinished for good, as it never runs again. Its end is written now."""
        for name, done in ended.items():
            path = os.path.join(self.sweep_dir, name)
            if _last_outcome(path) == Outcome.UNFINISHED.code:
                self._write_trial(_Live(path, EventFile(path, ".tuner-best", self.place)), done)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        path = trial_dir(trial)
        if path:
            path = self.place.trial(path)  # (its working copy's, for a remote place)
            self.history.started(_name(path))
            if trial.trial_id not in self.live:
                self.live[trial.trial_id] = _Live(path, EventFile(path, ".tuner-best", self.place))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        live = self.live.get(trial.trial_id)
        epoch = result.get("epoch")
        if live is None or not isinstance(epoch, int) or isinstance(epoch, bool):
            return
        if not live.epochs and epoch > 1:  # resumed: its epochs so far are in its journal
            for row in read_metrics(live.path):
                if isinstance(row.get("epoch"), int) and row["epoch"] < epoch:
                    self._fold(live, row)
        self._fold(live, result)
        self.history.epoch(_name(live.path), epoch)
        values: dict[str, float] = {EPOCHS: live.epochs, OUTCOME: Outcome.UNFINISHED.code}
        for name, row in live.best.items():
            values[BEST + name], values[BEST_EPOCH + name] = row[name], row["epoch"]
        # the scheduler's judgement of this epoch, if it makes one (tuner.driver.verdicts)
        values.update({k: float(v) for k, v in result.items() if k.startswith(STOPPER) and finite(v)})
        live.file.scalars(values, epoch)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if INTERRUPTED.is_set() and not (trial.last_result or {}).get("done"):
            return  # stopped by a Ctrl-C: unfinished, for `resume` (as TrialRecordCallback)
        self._end(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        # Trials the sweep's target stopped get no completion (SweepLimits records them); and
        # a remote place's trials whose journals were not uploaded yet when they completed.
        for trial in trials:
            self._end(trial, last=True)

    def _fold(self, live: _Live, row: dict[str, Any]) -> None:
        live.epochs = max(live.epochs, int(row["epoch"]))
        for name, direction in self.objectives:
            candidates = [r for r in (live.best.get(name), row) if r is not None]
            found = best_row_of(candidates, name, direction)  # (the ranking's rule, ties the earlier)
            if found is not None:
                live.best[name] = {name: float(found[name]), "epoch": int(found["epoch"])}

    def _end(self, trial: Any, last: bool = False) -> None:
        """The trial's last values, and the sweep's point, from its record as summary.json
        reads it; nothing for a trial that never started here or has not finished. A trial
        of a remote place uploads its journal as its actor stops, after Tune completed it:
        one whose journal is behind its results is written at the experiment's end (`last`),
        once every actor has stopped."""
        live = self.live.get(trial.trial_id)
        if live is None or live.ended:
            return
        self.place.pull(only=_name(live.path))
        done = record(live.path, self.metric, self.direction, self.max_epochs, [])
        if done.outcome is Outcome.UNFINISHED or (done.epochs < live.epochs and not last):
            return
        live.ended = True
        self._write_trial(live, done)
        point = self.history.ended(done, done.ended or time.time())
        if point is not None:
            self.run.scalars(point.scalars(), point.done, point.time, descriptions(self.objectives))

    def _write_trial(self, live: _Live, done: TrialRecord) -> None:
        values: dict[str, float] = {EPOCHS: done.epochs, OUTCOME: done.outcome.code}
        for name, direction in self.objectives:
            found = best_of(done, name, direction)
            if found is not None:
                values[BEST + name], values[BEST_EPOCH + name] = found
        live.file.scalars(values, max(done.epochs, live.epochs))

    def _records(self) -> list[TrialRecord]:
        return records(self.sweep_dir, self.metric, self.direction, self.max_epochs, [])


def _last_outcome(trial_path: str) -> Optional[float]:
    """The last `trial/outcome` the drivers wrote of a trial (its .tuner-best files, oldest
    driver's first); None when there is none."""
    # (the raw loader: EventFileLoader hands scalars back migrated into tensors)
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    def started(name: str) -> tuple[int, float]:  # (events.out.tfevents.<time>.<host>.<pid>.tuner-best)
        stamp = name.split(".")[3]
        return int(stamp) if stamp.isdigit() else 0, os.path.getmtime(os.path.join(trial_path, name))

    try:
        names = [
            n
            for n in os.listdir(trial_path)
            if n.startswith("events.out.tfevents.") and n.endswith(".tuner-best")
        ]
    except OSError:
        return None
    last = None
    for name in sorted(names, key=started):
        for raw in RawEventFileLoader(os.path.join(trial_path, name)).Load():
            event = Event.FromString(raw)
            last = next((v.simple_value for v in event.summary.value if v.tag == OUTCOME), last)
    return last


def _name(path: str) -> str:
    """A trial's name in the sweep directory (its record's trial_id; a resumed trial keeps it)."""
    return os.path.basename(path.rstrip("/"))
