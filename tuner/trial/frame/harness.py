"""What surrounds any training loop of a trial, tuner's own or the user's (`task.train`).

`guarded` runs a loop body inside the trial's frame: the device and its thread count, the
GPU memory share (`gpu.claim`), the trial's log file, the watchdog, the traceback of a failure
and the memory handed back afterwards. `Progress` takes each epoch's metrics to the journal
(metrics.jsonl), TensorBoard and the scheduler, and records the failures a trial ends with as
results (diverged, oom) rather than crashes. Both loops use these, so a trial behaves the same
on disk and towards the driver whichever loop trains it.

A trial that trains in a process of its own (a script's: `trains_here=False`) has the same
frame without a device: its actor never imports torch (about 1 CPU-second and 180 MB per actor).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from tuner import autotune
from tuner.sweepdir import STOPPED_ITSELF, TRIAL_LOG, finite
from tuner.trial.frame.gpu import NoGpu, make_gpu
from tuner.trial.frame.journal import (
    LOG_FORMAT,
    NOTICE,
    MetricsLog,
    NullMetricsLog,
    sole_writer,
    write_traceback,
)
from tuner.trial.frame.memory import release
from tuner.trial.frame.session import Session
from tuner.trial.frame.settings import Settings
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.frame.tb import EventWriter, NullWriter
from tuner.trial.frame.watchdog import NoWatchdog, make_watchdog

if TYPE_CHECKING:
    import torch

WORST = {"max": -math.inf, "min": math.inf}
R = TypeVar("R")


@dataclass
class Frame:
    """What a loop body is given: where it runs and the trial's settings."""

    spec: TrialSpec
    session: Session
    device: Optional[torch.device]  # None: the trial trains in another process (a script)
    gpu: NoGpu
    settings: Settings
    watchdog: NoWatchdog
    log: logging.Logger


def guarded(
    hp: dict[str, Any],
    spec: TrialSpec,
    session: Session,
    body: Callable[[Frame], R],
    trains_here: bool = True,
) -> R:
    """Run `body` as the trial: its GPU share claimed first, its failure written down, its
    memory handed back whatever the ending. `trains_here=False`: the body trains nothing in
    this process (it runs a script), which then gets no device, threads or GPU share."""
    device = session.device(spec.gpus_per_worker > 0) if trains_here else None
    gpu = make_gpu(device) if device is not None else NoGpu()
    main_dir = session.trial_dir if session.is_main else None
    log = trial_logger(session)
    watchdog = make_watchdog(
        spec.trial_timeout, main_dir, spec.metric, WORST[spec.direction], log, before_exit=session.persist_now
    )
    session.held = watchdog.held  # a wait in the report for the driver is no epoch's time
    try:
        # The training settings, typed, once; with training.autotune's choice for this size.
        settings = Settings.of(autotune.applied(hp, spec.autotune))
        if spec.autotune:
            log.info("training.autotune: %s", {k: getattr(settings, k) for k in autotune.DIMENSIONS})
        if trains_here:
            # training.threads, else one thread per CPU Ray gave this worker: more oversubscribes the node.
            use_threads(settings.threads or max(1, int(spec.cpus_per_worker)))
            # Before anything is built: this trial's share of the GPU must be free (gpu.py).
            gpu.claim(spec.gpus_per_worker, spec.gpu_memory_margin, spec.gpu_context_bytes)
            gpu.configure(tf32=settings.tf32)
        with sole_writer(main_dir, log):
            return body(Frame(spec, session, device, gpu, settings, watchdog, log))
    except BaseException as err:
        if isinstance(err, Exception):  # not a scheduler's stop (SystemExit from report)
            # Tune keeps its own error.txt on the driver; this copy is written by the trial
            # itself, so it is in the trial's directory even if the driver is gone. An error
            # from code that ran in another process (a script) carries that code's traceback:
            # the user's, not this process's stack around it.
            write_traceback(session.trial_dir, session.rank, getattr(err, "trial_traceback", None))
        # The traceback's frames hold the trial's model, optimizer and batches: clear their
        # locals, or the memory they hold goes on living with the error (in Tune's hands).
        traceback.clear_frames(err.__traceback__)
        raise
    finally:
        began = time.perf_counter()
        watchdog.stop()
        forget_compiled()
        # Whether finished, stopped by the scheduler or failed: the trial's objects are gone
        # by now, so this returns their memory before the actor runs its next trial.
        if device is not None:
            release(device)
        took = time.perf_counter() - began
        if took > 1.0:  # (a reused actor's next trial waits for this: trainables.WIND_DOWN_S)
            log.info("clean-up after the trial took %.1f s", took)
        _close_files(logging.getLogger(_log_name(session)))  # also when the build failed


def use_threads(n: int) -> None:
    """`n` threads for torch's operators and for Inductor's compile workers. Inductor would
    start one compile process per CPU of the node (16 on a GPU node, 64 for 4 packed trials),
    not per CPU of the trial; its setting is read when Inductor is first imported (the
    environment) and when its pool starts (the config, where already imported)."""
    import torch

    torch.set_num_threads(n)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(n)
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.compile_threads = n  # type: ignore[attr-defined]


def forget_compiled() -> None:
    """Drop Dynamo's compiled graphs. They are cached on code objects every trial of a reused
    actor shares (a model class's forward), one per model size: past Dynamo's recompile
    limit (8) a later trial's model silently ran eager. Only where Dynamo was imported (its
    import costs seconds)."""
    if "torch._dynamo" in sys.modules:
        import torch

        torch.compiler.reset()


class MetricError(Exception):
    """A report whose objective is not a number: the trial ends (ERROR, with the report in
    its traceback) before any scheduler or searcher sees the value."""


def screened(row: dict[str, Any], spec: TrialSpec, epoch: int) -> dict[str, Any]:
    """An epoch's metrics as the trial records them, whoever reported them (tuner's loop,
    `ctx.report`, a script). An objective (the sweep's metric; each, with several) that is not
    a number raises MetricError; an objective or a loss (a name ending in "loss") that is not
    finite (NaN, inf, an integer past a float's range) makes the row the trial's failure:
    diverged."""
    names = (spec.metric, *spec.also)
    for name in names:
        value = row.get(name)
        if name in row and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise MetricError(
                f"reported {name}={_short(value)} at epoch {epoch}: the sweep's metric must be a number"
            )
    for key, value in row.items():
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if numeric and (key in names or key.endswith("loss")) and not finite(value):
            return failed(row, spec, "diverged", f"non-finite {key} at epoch {epoch}", epoch)
    return row


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def failed(
    metrics: Optional[dict[str, Any]], spec: TrialSpec, failure: str, detail: str, epoch: int
) -> dict[str, Any]:
    """The result a trial ends with when it fails as a result (diverged, oom): the worst value
    of the metric, so a scheduler never promotes it and it is never chosen as best."""
    out = {**(metrics or {}), spec.metric: WORST[spec.direction]}
    out.update(failure=failure, failure_detail=detail, epoch=epoch)
    return out


class Progress:
    """Each epoch's metrics to the journal, TensorBoard and the session (rank 0 writes files)."""

    def __init__(self, session: Session, log: logging.Logger, watchdog: Optional[NoWatchdog] = None):
        self.session, self.log = session, log
        self.watchdog = watchdog or NoWatchdog()
        main_dir = session.trial_dir if session.is_main else None
        self.writer = EventWriter(main_dir) if main_dir else NullWriter()
        self.journal = MetricsLog(main_dir) if main_dir else NullMetricsLog()
        self.notice: Optional[str] = None

    def start(self, epoch: int, resumed: bool, detail: str = "") -> None:
        """The trial starts at `epoch` (epochs done): later journal lines will run again."""
        self.journal.resume_at(epoch)
        if resumed:
            self.log.info("resumed at epoch %d%s", epoch, detail)
            self.note(f"resumed at epoch {epoch}", epoch)
        self.notice = self.session.notice  # passed over a damaged checkpoint: the driver prints it
        if self.notice:
            self.log.warning("%s", self.notice)
            self.note(self.notice, epoch)

    def note(self, text: str, step: int) -> None:
        self.writer.text("trial/log", text, step)

    def record(self, metrics: dict[str, Any]) -> bool:
        """Record an epoch before it is reported (with its checkpoint, by the caller, then
        `kick`); False for a failure, which is reported here, without one, and ends the trial."""
        # (The caller reports, not a callback: a closure over the trial's objects would keep
        # them alive in the traceback of an error raised while reporting.)
        self.writer.scalars(metrics, int(metrics["epoch"]))
        self.writer.scalars({f"config/{k}": v for k, v in self.session.shown.items()}, int(metrics["epoch"]))
        if self.notice:
            metrics[NOTICE], self.notice = self.notice, None
        # Journal first, then checkpoint, then report: a kill between any two leaves a
        # journal that the resumed trial trims back to its checkpoint's epoch.
        self.journal.append(metrics)
        if "failure" in metrics:
            self.note(f"{metrics['failure']}: {metrics.get('failure_detail', '')}", int(metrics["epoch"]))
            self.session.report(metrics, None)
            return False
        return True

    def amend(self, metrics: dict[str, Any], epoch: int) -> None:
        """Add `metrics` to `epoch`, recorded already (and reported: the scheduler has judged
        it): a final metric after training, such as a test loss."""
        self.writer.scalars(metrics, epoch)
        self.journal.amend(metrics, epoch)

    def stopped_itself(self, epoch: int) -> None:
        """The trial's own code ended its training after `epoch`, before max_epochs (its own
        early stopping): its last row says so, for the record (no scheduler stopped it)."""
        self.log.info("the trial's code ended its training after epoch %d (its own early stopping)", epoch)
        self.journal.amend({STOPPED_ITSELF: True}, epoch)

    def kick(self) -> None:
        """The epoch is reported: the watchdog gives the next one its time."""
        self.watchdog.kick()

    def end(self, metrics: dict[str, Any]) -> None:
        """Record and report the failure a trial ends with outside an epoch (oom)."""
        self.log.warning("%s: %s", metrics["failure"], metrics.get("failure_detail", ""))
        self.note(f"{metrics['failure']}: {metrics.get('failure_detail', '')}", int(metrics["epoch"]))
        self.journal.append(metrics)
        self.session.report(metrics, None)

    def close(self) -> None:
        self.writer.close()


def _log_name(session: Session) -> str:
    return f"tuner.trial.{session.trial_id}"


def trial_logger(session: Session) -> logging.Logger:
    """The trial's logger: trial.log in its directory (rank 0), nothing elsewhere."""
    log = logging.getLogger(_log_name(session))
    log.propagate = False
    log.setLevel(logging.INFO)
    _close_files(log)
    if session.is_main and session.trial_dir:
        handler = logging.FileHandler(os.path.join(session.trial_dir, TRIAL_LOG))
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
    return log


def _close_files(log: logging.Logger) -> None:
    # Only our file handlers: test runners attach their own to non-propagating loggers.
    for handler in [h for h in log.handlers if isinstance(h, logging.FileHandler)]:
        handler.close()
        log.removeHandler(handler)
