"""A trial trained by the user's own loop: `task.train: "pkg.mod:fn"`, called as `fn(config, ctx)`.

It runs where tuner's loop would (the Tune actor with one worker, every rank of a DDP trial with
more) inside the same frame (`harness.guarded`: GPU share, trial log, watchdog, traceback,
memory handed back) and reports through the same session, so journal, checkpoints, resume,
TensorBoard and the report work alike. The micro-batch back-off is `ctx.step` (one optimizer
step that backs off, as tuner's loop does); running out of GPU memory anywhere else ends the
trial as `failure: oom` with a line naming `ctx.step` (with several workers, the rank raises
it, with that line: the trial ends at once, and the trial actor records it as oom,
trial/launch/ranks.py). Any other exception is the trial's error (ERROR, with traceback.txt); the
sweep goes on.
"""

from __future__ import annotations

import inspect
import traceback
from typing import Any, Optional

import torch

from tuner.trial.frame.harness import Frame, Progress, failed, guarded
from tuner.trial.frame.memory import first_line, is_oom, release
from tuner.trial.frame.session import Session
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.data import import_object
from tuner.trial.userloop.console import as_started, import_once
from tuner.trial.userloop.context import TrainContext, TrialEnded


def run_own_loop(hp: dict[str, Any], spec: TrialSpec, session: Session) -> Optional[dict[str, Any]]:
    """Run the user's training function as this trial; returns the last metrics it reported.
    It runs in the directory the sweep was started from, its output copied into trial.log."""
    return guarded(hp, spec, session, lambda frame: _in_start_dir(hp, frame))


def _in_start_dir(hp: dict[str, Any], f: Frame) -> Optional[dict[str, Any]]:
    with as_started(f.spec.start_dir, f.log if f.session.is_main else None):
        return _run(hp, f)


def _run(hp: dict[str, Any], f: Frame) -> Optional[dict[str, Any]]:
    assert f.spec.train, "run_own_loop without task.train"
    ref, log = f.spec.train, f.log if f.session.is_main else None
    fn = import_once(ref, log, f.session.trial_id, lambda: import_object(ref, f.spec.search_path))
    _check_signature(fn, f.spec.train)
    checkpoint = f.session.load_checkpoint("cpu")  # on the CPU: the user's code places it
    progress = Progress(f.session, f.log, f.watchdog)
    ctx = TrainContext(f, progress, checkpoint)
    progress.start(ctx.epoch, checkpoint is not None)
    torch.manual_seed(f.settings.seed)
    try:
        oom = _call(fn, dict(hp), ctx, f)
        if oom is None:
            ctx.flush()  # the last epoch, held until the function returned
            # (ctx.last None: restored, it reported nothing new; the trial actor reports the
            # journal's last epoch again: tuner.trial.frame.journal.report_again)
            if (ctx.last is None or "failure" not in ctx.last) and ctx.epoch < f.spec.max_epochs:
                progress.stopped_itself(ctx.epoch)  # it returned early: its own early stopping
            return ctx.last
        # Outside the except block: the traceback, and with it the user's tensors, is gone.
        release(f.device)
        metrics = failed(ctx.last, f.spec, "oom", f"out of memory: {oom}{OUTSIDE_STEP}", ctx.epoch)
        progress.end(metrics)
        return metrics
    finally:
        ctx.close()
        progress.close()


# What a user's loop that ran out of memory is told (the failure's detail, trial.log).
OUTSIDE_STEP = (
    " (outside ctx.step, which backs off the micro-batch instead: docs/how-to/own-loop.md#out-of-memory)"
)


def _call(fn: Any, config: dict[str, Any], ctx: TrainContext, f: Frame) -> Optional[str]:
    """Run the user's function; the first line of its out-of-memory error, or None."""
    try:
        fn(config, ctx)
    except TrialEnded:
        return None  # recorded and reported already (diverged)
    except Exception as err:  # noqa: BLE001 - only running out of memory is a result
        if not is_oom(err):
            raise
        if f.session.world_size > 1:  # the trial's error: its line says what to use
            raise torch.OutOfMemoryError(f"{first_line(err)}{OUTSIDE_STEP}") from err
        traceback.clear_frames(err.__traceback__)  # the frames hold the step's tensors
        return first_line(err)
    if ctx.last is None and ctx.epoch == 0:  # (restored from an epoch: it has reported before)
        raise RuntimeError(
            f"task.train '{f.spec.train}' returned without calling ctx.report: "
            "report each epoch's metrics (ctx.report({'val_loss': ...}))"
        )
    return None


def _check_signature(fn: Any, name: str) -> None:
    """The sweep file was checked before Ray started; this catches what a check of the source
    could not see (a function made by a decorator or assigned at import)."""
    if not callable(fn):
        raise TypeError(f"task.train: '{name}' is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise TypeError(f"task.train: '{name}' cannot be called as fn(config, ctx)") from None
    except ValueError:  # no signature to read (a builtin): calling it will tell
        pass
