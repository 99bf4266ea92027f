"""Driver-side Tune callbacks: trial end status, HParams records, the compact progress view."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, TextIO

from ray.tune import Callback

from tuner.driver.stopping import INTERRUPTED
from tuner.errors import DiskFull, StorageUnavailable
from tuner.results import Outcome, TrialRecord, clock, number, records
from tuner.space.params import Choice, Fixed, Grid, ParamT, values_of
from tuner.sweepdir import (
    HPARAMS_EXPERIMENT_MARKER,
    HPARAMS_SESSION_MARKER,
    NEVER_STARTED,
    NOTICE,
    error_file,
    error_line,
    json_safe,
    read_record,
    recorded_failure,
    trial_disk_full,
    write_record,
)
from tuner.sweepdir.place import Place
from tuner.trial.frame import tb

STATUS_FILE_SUFFIX = ".tuner-status"
# Besides the sweep's metric and every val_* value: what the HParams table shows of a trial.
EXTRA_TAGS = ("train_loss", "samples_per_s", "epoch")


def metric_tags(metrics: Sequence[str], result: dict[str, Any]) -> list[str]:
    """The HParams table's metric columns: the sweep's metric (every objective's, with
    several), every validation value a trial reports (val_loss, and val_<name> of
    task.metrics), then EXTRA_TAGS."""
    numeric = [k for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    tags = [*metrics, *(k for k in numeric if k.startswith("val_")), *(k for k in EXTRA_TAGS if k in numeric)]
    return list(dict.fromkeys(tags))


def trial_dir(trial: Any) -> Optional[str]:
    """The trial's directory; None for a trial that never started (Tune names it on start,
    and asking an unnamed trial for its path raises)."""
    try:
        return trial.path
    except RuntimeError:
        return None


class _Places:
    """Where the driver writes a trial's files: the place's working copy of its directory,
    each file written then pushed to the place (the driver's own files only: a trial of a
    remote place uploads the rest itself)."""

    def __init__(self, place: Optional[Place] = None):
        self.place = place

    def trial(self, trial: Any) -> Optional[str]:
        path = trial_dir(trial)
        return self.place.trial(path) if path and self.place is not None else path

    def saved(self, *paths: str) -> None:
        if self.place is not None:
            self.place.push(*paths)

    def pulled(self, path: str) -> None:
        """A trial's own files (its traceback, its journal) into the working copy."""
        if self.place is not None:
            self.place.pull(only=os.path.basename(path.rstrip("/")))


def trial_name(trial: Any) -> str:
    """The trial as the user sees it: its directory's name, what summary.json calls its
    trial_id (a trial continued by `resume` keeps its directory under a new Tune id)."""
    path = trial_dir(trial)
    return os.path.basename(path.rstrip("/")) if path else str(trial.trial_id)


class TrialRecordCallback(Callback):
    """Keeps each trial's record file (tuner_trial.json) in its directory.

    Written when a trial starts (id, configuration, RUNNING) and when it ends (TERMINATED or
    ERROR). Together with the trial's own metrics journal and checkpoints this is what
    `tuner.results` and `tuner resume` read; Tune's experiment snapshot can lag the truth
    (a trial HyperBand stops while PAUSED keeps PAUSED there, Ray 2.60) and holds nothing
    created since it was last written. Tune fires no completion for trials it merely tears
    down on Ctrl-C, and the completion it fires for a trial a first Ctrl-C stopped at its next
    report is not taken as one: those stay RUNNING here, unfinished, to be resumed.
    """

    def __init__(
        self,
        resources: Optional[dict[str, Any]] = None,
        place: Optional[Place] = None,
        handed: Optional[dict[str, str]] = None,
    ):
        self.resources = resources or {}  # per trial, as resolved for this cluster
        self.places = _Places(place)
        # Tune trial id -> its configuration's origin, filled by the searcher as it hands
        # each out (SearchPlan.handed): recorded with the trial, not reconstructed later.
        self.handed = handed if handed is not None else {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        path = self.places.trial(trial)
        if not path:
            return
        record = read_record(path) or self._new(path, trial)
        record.update(status="RUNNING", tune_trial_id=trial.trial_id)
        record.pop(NEVER_STARTED, None)  # (one Tune failed before it started, run by a resume)
        self.places.saved(write_record(path, record))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if INTERRUPTED.is_set() and not (trial.last_result or {}).get("done"):
            # Stopped at its next report by a Ctrl-C, neither finished nor stopped by the
            # scheduler (Tune marks those done): it stays unfinished, for `resume` to continue.
            return
        self._end(trial, "TERMINATED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        lost = _storage_lost(trial)
        if lost is not None:  # not the trial's fault either, as a full disk below
            raise lost
        path = self.places.trial(trial)
        if path:
            self.places.pulled(path)
        if path and trial_disk_full(path):
            # Not the trial's fault: it stays unfinished, and the sweep stops to be resumed.
            raise DiskFull(os.path.dirname(path.rstrip("/")), "No space left on device")
        self._end(trial, "ERROR")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        # A trial Tune failed before it started (a reused actor that could not be reset,
        # Ray 2.60) gets no on_trial_error: recorded here as ended with Tune's error.txt, not
        # left out of the sweep's trials (which made a finished sweep "interrupted"), and
        # marked as never started: no code of the user's ran, so `resume` runs it.
        for trial in trials:
            path = self.places.trial(trial)
            if trial.status == "ERROR" and path and read_record(path) is None:
                record = {**self._new(path, trial), "status": "ERROR", "ended": time.time()}
                record[NEVER_STARTED] = True
                self.places.saved(write_record(path, record))

    def _end(self, trial: Any, status: str) -> None:
        path = self.places.trial(trial)
        record = read_record(path) if path else None
        if path and record is not None:
            record.update(status=status, ended=time.time())
            self.places.saved(write_record(path, record))

    def _new(self, path: str, trial: Any) -> dict[str, Any]:
        return {
            "trial_id": os.path.basename(path.rstrip("/")),
            "config": json_safe(trial.config),
            "resources": self.resources,
            "started": time.time(),
            "tune_trial_id": trial.trial_id,
            **({"origin": self.handed[trial.trial_id]} if trial.trial_id in self.handed else {}),
        }


def _storage_lost(trial: Any) -> Optional[StorageUnavailable]:
    """The trial's object storage stopped answering for longer than tuner waits (its error, as
    Tune keeps it on the driver, is tuner's StorageUnavailable): the sweep stops to be resumed,
    the trial unfinished."""
    path = getattr(trial, "error_file", None)
    try:
        with open(path) as f:  # type: ignore[arg-type]
            text = f.read()
    except (OSError, TypeError):
        return None
    found = re.search(r"StorageUnavailable: (.+?) for (\d+) s; the sweep stopped", text)
    return None if found is None else StorageUnavailable(found.group(1), float(found.group(2)))


def hparam_domains(params: dict[str, ParamT]) -> dict[str, Any]:
    """Domains for TensorBoard's HParams: a list of values, or a (low, high) interval."""
    domains: dict[str, Any] = {}
    for name, p in params.items():
        if isinstance(p, (Fixed, Choice, Grid)):
            domains[name] = values_of(p)
        else:
            domains[name] = (p.low, p.high)  # type: ignore[union-attr]
    return domains


class CatchUp(Callback):
    """At the start of a sweep's run: the trials an earlier run ended, read once as the sweep's
    results read them (`results.record`: by its record, or by its journal where the driver died
    before recording the end), handed to every callback that keeps something of a trial's end
    through its `ended_earlier(ended)` (trial directory name -> its TrialRecord). An earlier run
    killed outright (kill -9, its node lost) or stopped by Ctrl-C as a trial ended can leave a
    trial ended without those callbacks having heard; each writes now what it would have written
    then, and nothing where it had. Comes after them among the callbacks: their setup has run."""

    def __init__(self, place: Place, callbacks: Sequence[Any], objective: tuple[str, str], max_epochs: int):
        self.sweep_dir, self.objective, self.max_epochs = place.local, objective, max_epochs
        self.hooks = [cb.ended_earlier for cb in callbacks if callable(getattr(cb, "ended_earlier", None))]

    def setup(self, **info: Any) -> None:
        if not self.hooks:
            return
        metric, direction = self.objective
        found = records(self.sweep_dir, metric, direction, self.max_epochs, [])
        ended = {os.path.basename(t.path): t for t in found if t.outcome is not Outcome.UNFINISHED}
        if ended:
            for hook in self.hooks:
                hook(ended)


class HParamsCallback(Callback):
    """Writes TensorBoard HParams: experiment at the sweep root, a session per trial.

    The experiment (domains and metric columns) is written at the sweep's first result; the
    session start is written when a trial starts (so running and failed trials appear
    in the HParams table), its end status when it ends. The columns: `first` (what tuner
    ranks by: `dashboard.columns`, written by `dashboard.Dashboard`), then the values the trial
    reported last (its own scalars).
    """

    def __init__(
        self,
        place: Place,
        domains: dict[str, Any],
        metrics: Sequence[str],
        first: Optional[dict[str, tuple[str, str]]] = None,
    ):
        self.sweep_dir, self.domains, self.metrics = place.local, domains, list(metrics)
        self.places = _Places(place)
        self.first = dict(first or {})  # columns before the reported ones: tag -> (header, description)
        self._started: set[str] = set()
        self._described = False

    def ended_earlier(self, ended: Mapping[str, TrialRecord]) -> None:
        """(CatchUp) A trial an earlier run of the sweep ended without writing its session's
        end here (that driver killed or stopped between the two): written now, as it ended."""
        for name, done in ended.items():
            path = os.path.join(self.sweep_dir, name)
            if not os.path.exists(os.path.join(path, HPARAMS_SESSION_MARKER)):
                continue
            if not any(n.endswith(STATUS_FILE_SUFFIX) for n in os.listdir(path)):
                summary = tb.session_end_summary("failure" if done.outcome.failed else "success")
                self.places.saved(_write(path, summary, STATUS_FILE_SUFFIX))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        # The experiment is described at the first result: only then are the names of the
        # values trials report known (task.metrics may add any val_<name>).
        if self._described:
            return
        self._described = True
        marker = os.path.join(self.sweep_dir, HPARAMS_EXPERIMENT_MARKER)
        if os.path.exists(marker):  # resumed: the experiment is already described
            return
        os.makedirs(self.sweep_dir, exist_ok=True)
        last = metric_tags(self.metrics, result)
        labels = {t: (f"{t} (last)", f"the {t} the trial reported last") for t in last}
        labels.update(self.first)
        summary = tb.experiment_summary(self.domains, [*self.first, *last], labels)
        written = _write(self.sweep_dir, summary, ".experiment")
        open(marker, "w").close()
        self.places.saved(written, marker)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        path = self.places.trial(trial)
        if trial.trial_id in self._started or not path:
            return
        self._started.add(trial.trial_id)
        marker = os.path.join(path, HPARAMS_SESSION_MARKER)
        if os.path.exists(marker):  # paused and resumed, or a resumed sweep
            return
        os.makedirs(path, exist_ok=True)
        hparams = {k: trial.config.get(k) for k in self.domains if k in trial.config}
        written = _write(path, tb.session_start_summary(hparams), ".session")
        open(marker, "w").close()
        self.places.saved(written, marker)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        failed = bool((trial.last_result or {}).get("failure"))
        self._end(trial, "failure" if failed else "success")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "failure")

    def _end(self, trial: Any, status: str) -> None:
        path = self.places.trial(trial)
        # (A trial removed before it started, by a spent time budget or fail_fast, has no
        # session: its directory, made by Tune as it queued it, is removed as empty.)
        if path and os.path.isdir(path) and trial.trial_id in self._started:
            self.places.saved(_write(path, tb.session_end_summary(status), STATUS_FILE_SUFFIX))


def _write(logdir: str, summary: Any, suffix: str) -> str:
    """Write one summary as an event file of its own in `logdir`; its path."""
    before = set(os.listdir(logdir)) if os.path.isdir(logdir) else set()
    writer = tb.EventWriter(logdir, suffix=suffix)
    writer.summary(summary)
    writer.close()
    # (Only event files of this suffix: in the sweep's root Tune may make a trial's
    # directory at the same moment.)
    new = sorted(
        n for n in set(os.listdir(logdir)) - before if n.startswith("events.out.") and n.endswith(suffix)
    )
    assert len(new) == 1, new  # one event file per writer
    return os.path.join(logdir, new[0])


class Progress(Callback):
    """One live status line on a terminal; a line per finished trial otherwise.

    `[tuner] 12/30 done · 2 running · 16 pending · best val_acc 0.9822 (a1b2c_00003) · 0:14`

    Trials a Ctrl-C stopped at their next report count as unfinished, as their records say
    (TrialRecordCallback). The line's last state, once the sweep has ended, is drawn from its
    summary (`close`): the table printed under it is read from the same trial records, where a
    report the driver never took in (a trial stopped at once) is still counted.
    """

    def __init__(
        self, metric: str, direction: str, total: int, stream: Optional[TextIO] = None, done: int = 0
    ):
        self.metric, self.direction, self.total = metric, direction, total
        self.done_before = done  # trials a resumed sweep had already finished
        self._stream = stream  # None: sys.stdout, looked up when writing
        self.live = self.stream.isatty()
        self.best: Optional[tuple[float, str]] = None
        self.failed: set[str] = set()  # crashed, diverged or out of memory
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self.started: set[str] = set()
        self.cut_short: set[str] = set()  # stopped by a Ctrl-C at a report: unfinished, resumable
        self.trial_best: dict[str, tuple[float, int]] = {}  # trial id -> its best value, that epoch
        # Why the scheduler stopped a trial, if it says: fn(trial, brief) (tuner.driver.verdicts)
        self.explain: Optional[Callable[[Any, bool], Optional[str]]] = None
        self.last_stop: Optional[str] = None  # the latest, on the live line

    def setup(self, **info: Any) -> None:
        self.t0 = time.monotonic()
        one_line_ray_errors()

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks with the experiment (tuner.pkl); a stream does not pickle.
        return {**self.__dict__, "_stream": None}

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if result.get(NOTICE):
            self.say(f"[tuner] trial {trial_name(trial)}: {result[NOTICE]}")
        value = result.get(self.metric)
        if "failure" in result:
            self.failed.add(trial.trial_id)
        why = self.explain(trial, True) if self.explain is not None else None
        if why is not None:
            self.last_stop = f"stopped {trial_name(trial)}: {why}"
        if "failure" in result or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        if self._better(value, self.best):
            self.best = (float(value), trial_name(trial))
        if self._better(value, self.trial_best.get(trial.trial_id)):  # (ties: the earlier epoch)
            self.trial_best[trial.trial_id] = (float(value), int(result.get("epoch", 0) or 0))

    def _better(self, value: float, than: Optional[tuple[float, Any]]) -> bool:
        return than is None or (value > than[0] if self.direction == "max" else value < than[0])

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        now = time.monotonic()
        if self.live and now - self._last_draw > 0.5:
            self._last_draw = now
            self._put("\r\033[K" + self._fit(self.line(trials)))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if INTERRUPTED.is_set() and not (trial.last_result or {}).get("done"):
            self.cut_short.add(trial.trial_id)  # (as TrialRecordCallback: it stays unfinished)
            self._ended(trials, trial, "stopped")
            return
        self._ended(trials, trial, "done")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.failed.add(trial.trial_id)
        self._ended(trials, trial, "ERROR")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.started.add(trial.trial_id)

    def _ended(self, trials: list, trial: Any, how: str) -> None:
        if trial.trial_id not in self.started:  # removed before it started (a spent time budget)
            return
        last = trial.last_result or {}
        if how == "ERROR":  # one line instead of Ray's traceback (--verbose shows that)
            status = "" if self.live else f" · {self.line(trials, prefix=False)}"
            self.say(f"[tuner] trial {trial_name(trial)} failed: {failed_line(trial_dir(trial))}{status}")
            return
        if self.live:
            # Failures are news worth a line of their own; other endings show in the status.
            if last.get("failure"):
                detail = last.get("failure_detail") or f"at epoch {last.get('epoch', 0)}"
                self._put(f"\r\033[K[tuner] trial {trial_name(trial)} {last['failure']}: {detail}\n")
            return
        note = last.get("failure") or how
        epochs = last.get("epoch", 0)
        best = self.trial_best.get(trial.trial_id)
        value = (
            f"no {self.metric}"
            if best is None
            else f"best {self.metric} {number(best[0])} at epoch {best[1]}"
        )
        resumable = ", unfinished: resume continues it" if how == "stopped" else ""
        why = self.explain(trial, False) if self.explain is not None and not last.get("failure") else None
        because = "" if why is None else f" (stopped early: {why})"
        self._put(
            f"[tuner] trial {trial_name(trial)} {note} after {epochs} epoch(s){resumable}: {value}"
            f"{because} · {self.line(trials, prefix=False, ending=trial)}\n"
        )

    def say(self, line: str) -> None:
        """A line of its own (above the live status line on a terminal)."""
        self._put(("\r\033[K" if self.live else "") + line + "\n")

    def close(self, summary: dict[str, Any]) -> None:
        """The live line's last state, once the sweep has ended, from its summary (the table's
        source): its counts and best as the records have them. (At the experiment's end the
        line drawn last stays until then.)"""
        if not self.live:
            return
        trials = summary.get("trials") or []
        counts = {k: int(v) for k, v in (summary.get("counts") or {}).items()}
        unfinished = counts.get(Outcome.UNFINISHED.value, 0)
        failed = sum(n for word, n in counts.items() if Outcome.parse(word).failed)
        best = summary.get("best")
        shown = None if not best else (best["metrics"].get(self.metric), str(best["trial_id"]))
        parts = self._parts(
            len(trials) - unfinished, 0, 0, max(self.total - len(trials), 0), unfinished, failed, shown
        )
        parts.append(clock(time.monotonic() - self.t0))
        self._put("\r\033[K[tuner] " + " · ".join(parts) + "\n")

    def _put(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:  # a terminal that hung up: its SIGHUP is on the way (driver/stopping.py)
            pass

    def line(self, trials: list, prefix: bool = True, ending: Any = None) -> str:
        counts: dict[str, int] = {}
        for t in trials:
            # Tune calls on_trial_complete before it marks the trial TERMINATED.
            status = "TERMINATED" if t is ending and t.status not in ("TERMINATED", "ERROR") else t.status
            if t.trial_id in self.cut_short:
                status = "UNFINISHED"
            counts[status] = counts.get(status, 0) + 1
        done = self.done_before + counts.get("TERMINATED", 0) + counts.get("ERROR", 0)
        pending = max(self.total - self.done_before - len(trials), 0) + counts.get("PENDING", 0)
        parts = self._parts(
            done, counts.get("RUNNING", 0), counts.get("PAUSED", 0), pending,
            counts.get("UNFINISHED", 0), len(self.failed), self.best,
        )  # fmt: skip
        elapsed = time.monotonic() - self.t0
        parts.append(clock(elapsed))
        done_here = done - self.done_before
        if 0 < done_here and done < self.total and not INTERRUPTED.is_set():
            parts.append(f"eta ~{clock(elapsed / done_here * (self.total - done))}")
        if self.last_stop and prefix:  # (last: the first cut on a narrow terminal; a finished
            parts.append(self.last_stop)  # trial's own line says why it stopped)
        return ("[tuner] " if prefix else "") + " · ".join(parts)

    def _parts(
        self, done: int, running: int, paused: int, pending: int, unfinished: int, failed: int, best: Any
    ) -> list[str]:
        parts = [f"{done}/{self.total} done", f"{running} running"]
        if paused:
            parts.append(f"{paused} paused")
        parts.append(f"{pending} pending")
        if unfinished:
            parts.append(f"{unfinished} unfinished")
        if failed:
            parts.append(f"{failed} failed")
        if best:
            parts.append(f"best {self.metric} {number(best[0])} ({best[1]})")
        return parts

    @staticmethod
    def _fit(line: str) -> str:
        # A line wider than the terminal wraps, and "\r" then redraws only its last row.
        width = shutil.get_terminal_size((120, 24)).columns - 1
        return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def failed_line(trial_dir: Optional[str]) -> str:
    """A failed trial's error in one line, and where its full traceback is."""
    if not trial_dir:
        return "see Ray's log"
    if last := recorded_failure(trial_dir):  # ended by the trial itself: its journal says why
        return f"{last['failure']}: {last.get('failure_detail', '')}"
    return f"{error_line(trial_dir)} (full traceback: {error_file(trial_dir)})"


class _OneLineErrors(logging.Filter):
    """Ray's errors in one line each, without their tracebacks; a failed trial's is dropped
    (Progress says it in a line naming the traceback's file)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Trial task failed for trial"):
            return False
        err = record.exc_info[1] if record.exc_info else None
        if err is not None:
            message += f" {type(err).__name__}: {(str(err).strip().splitlines() or [''])[-1]}"
        lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
        if err is not None or len(lines) > 1:  # a traceback inside the message: its ends
            record.msg = (lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}")[:400]
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def one_line_ray_errors() -> None:
    """Install _OneLineErrors on the handlers of Ray's loggers (not for --verbose)."""
    for handler in logging.getLogger("ray").handlers:
        if not any(isinstance(f, _OneLineErrors) for f in handler.filters):
            handler.addFilter(_OneLineErrors())
