"""A trial trained by the user's own script: `task.command` (docs/how-to/own-script.md).

The trial actor runs the command as a process (`trial.script.process`: started where the sweep was
started, with the trial's GPUs in CUDA_VISIBLE_DEVICES, in its own process group, output to
trial.log) and turns each of its reports into an epoch of the trial, inside the same frame
and through the same `Progress` and session as the other loops: journal, TensorBoard,
scheduler, resume and the report work alike. A report's checkpoint directory becomes the
epoch's checkpoint (`ScriptCheckpoints`) after the journal has the epoch and before the
scheduler hears of it, as the function modes order it. When the scheduler stops the trial
(Tune's report does not return) the process is stopped: SIGTERM, then SIGKILL after a grace.
A non-zero exit is the trial's error (ScriptError: the code and stderr's last lines), and a
script that never reported the metric ends with the function modes' MissingMetricError.

Each run of the script is an attempt with a report file of its own: reports of an earlier run
that is somehow still alive never reach this one (and that run, when it is on this machine, is
stopped first: `stop_stale`). A report of the epoch reported last adds its metrics to that
epoch (a final test metric after training); a report past `max_epochs` ends the run, its
epochs kept. A script that reported its last epoch and does not exit within `task.exit_grace`
seconds is stopped, its epochs kept: the trial is complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import uuid
from typing import Any, Optional

from tuner.config.placeholders import as_text, env_name, fill, placeholders
from tuner.errors import MissingMetricError
from tuner.sweepdir import (
    BEST_RECORD,
    SCRIPT_CHECKPOINT_PATTERN,
    SCRIPT_CHECKPOINTS,
    SCRIPT_CONFIG,
    SCRIPT_REPORTS_PATTERN,
    SCRIPT_RUN,
    finite,
    read_best_checkpoint,
    read_metrics,
    script_reports_name,
    write_atomic,
)
from tuner.sweepdir import script_checkpoint_name as checkpoint_name
from tuner.trial.frame.checkpoint import numbered
from tuner.trial.frame.harness import Frame, Progress, failed, guarded, screened
from tuner.trial.frame.session import Session
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.script import api, command, oom
from tuner.trial.script.process import ScriptProcess, stop_stale

_EPOCH_DIR = re.compile(SCRIPT_CHECKPOINT_PATTERN)
_REPORTS = re.compile(SCRIPT_REPORTS_PATTERN)
POLL_S = 0.1


class ScriptError(Exception):
    """The script failed or reported something unusable. `trial_traceback`: what the trial's
    traceback.txt holds instead of this process's stack (the script's own traceback)."""

    def __init__(self, message: str, trial_traceback: Optional[str] = None):
        super().__init__(message)
        self.trial_traceback = trial_traceback


def run_command(hp: dict[str, Any], spec: TrialSpec, session: Session) -> Optional[dict[str, Any]]:
    """Run the sweep's command as this trial; returns the last metrics it reported."""
    # The frame's training settings are tuner's loop's: the script has its own (hp: theirs).
    # The script trains in its own process, with the trial's GPUs: this actor needs no device
    # (and imports no torch), makes no CUDA context and claims no GPU share for itself.
    return guarded({}, spec, session, lambda frame: _run(hp, spec, frame), trains_here=False)


def _run(hp: dict[str, Any], spec: TrialSpec, f: Frame) -> Optional[dict[str, Any]]:
    session = f.session
    assert spec.command and session.trial_dir is not None, "run_command without a command"
    record = os.path.join(session.trial_dir, SCRIPT_RUN)
    stop_stale(record, f.log)  # (before its checkpoints are read: it may be writing one)
    root = os.path.join(session.trial_dir, SCRIPT_CHECKPOINTS)
    checkpoints = ScriptCheckpoints(
        root, spec.keep_checkpoints, session.trial_dir, spec.metric, spec.direction
    )
    progress = Progress(session, f.log, f.watchdog)
    params = {k: hp[k] for k in spec.command_params if k in hp}
    retries = 0
    try:
        while True:
            proc, follower = _attempt(spec, params, f, progress, checkpoints, record, retries)
            code = proc.returncode
            if follower.ended is None and code and not follower.complete:
                why = oom.ran_out(getattr(proc.tracebacks.cause(), "line", None), proc.stderr_tail)
                if why is None:
                    raise failure(code, proc, spec.launcher)
                smaller = oom.halved(params, oom.batch_placeholders(spec.command))
                if smaller is None or retries >= spec.oom_retries:
                    return _out_of_memory(f, progress, follower, why, params, retries)
                retries += 1
                _note_retry(f, progress, follower, why, params, smaller, retries)
                params = smaller
                continue
            break
        if code == 0 and follower.ended is None and not follower.complete and follower.last is not None:
            # It exited before max_epochs, on its own: its early stopping, not a scheduler's.
            progress.stopped_itself(follower.epoch)
        if follower.ended is None and code:
            f.log.warning(
                "after its last epoch, %s: its epochs kept", _exit_message(code, list(proc.stderr_tail))
            )
        if follower.last is None:
            if read_metrics(session.trial_dir):  # a resumed run with nothing new: report_again
                return None
            raise MissingMetricError(spec.metric, [])
        follower.flush()
        return follower.last
    finally:
        progress.close()


def _attempt(
    spec: TrialSpec,
    params: dict[str, Any],
    f: Frame,
    progress: Progress,
    checkpoints: ScriptCheckpoints,
    record: str,
    retries: int,
) -> tuple[ScriptProcess, Follower]:
    """One run of the script, from the newest checkpoint, followed to its end."""
    session = f.session
    restored = checkpoints.latest()
    epoch = restored or 0
    progress.start(epoch, restored is not None, " (from the script's checkpoint)")
    checkpoints.clean()
    argv, env = launch(spec, params, session, checkpoints, restored)
    # What trains this configuration again, alone: with the environment that changes results.
    f.log.info("command: %s", command.rerun_line(rerun_env(env, spec), argv))
    # Where the sweep started; on another node of a cluster, where Ray put the job's files.
    cwd = spec.start_dir if spec.start_dir and os.path.isdir(spec.start_dir) else os.getcwd()
    proc = ScriptProcess(argv, cwd, env, env[api.REPORT_FILE], f.log, record=record)
    follower = Follower(f, progress, checkpoints, epoch, {"oom_retries": retries} if retries else {})
    try:
        while not proc.done and not follower.over():
            row = proc.next_report(POLL_S)
            if row is not None and not follower.take(row):
                break  # ended as a result (diverged), or past max_epochs: reported already
    finally:
        proc.stop()  # at once after a stop by the scheduler (its report did not return)
    return proc, follower


def _batch_text(params: dict[str, Any], names: list[str]) -> str:
    return ", ".join(f"{name} {params[name]}" for name in names)


def _note_retry(
    f: Frame,
    progress: Progress,
    follower: Follower,
    why: str,
    params: dict[str, Any],
    smaller: dict[str, Any],
    retries: int,
) -> None:
    """Say that the script ran out of memory and runs again with its batch halved."""
    names = oom.batch_placeholders(f.spec.command)
    text = (
        f"out of memory ({why}): running the script again from its last checkpoint with "
        f"{_batch_text(smaller, names)} (was {_batch_text(params, names)}; failure.oom_retries: "
        f"{retries} of {f.spec.oom_retries})"
    )
    f.log.warning("%s", text)
    progress.note(text, follower.epoch)
    progress.kick()  # the run that starts now gets the watchdog's whole time


def _out_of_memory(
    f: Frame, progress: Progress, follower: Follower, why: str, params: dict[str, Any], retries: int
) -> dict[str, Any]:
    """End the trial as `oom`, a result: the script ran out of memory with no retry left."""
    names = oom.batch_placeholders(f.spec.command)
    if not names:
        after = "the command has no batch-size placeholder to halve ({batch_size})"
    elif retries >= f.spec.oom_retries:
        after = f"at {_batch_text(params, names)}, after {retries} retries (failure.oom_retries)"
    else:
        after = f"at {_batch_text(params, names)}, which cannot be halved"
    metrics = failed(follower.last, f.spec, "oom", f"{why}; {after}", follower.epoch)
    if retries:
        metrics["oom_retries"] = retries
    progress.end(metrics)
    return metrics


def launch(
    spec: TrialSpec,
    params: dict[str, Any],
    session: Session,
    checkpoints: ScriptCheckpoints,
    restored: Optional[int],
) -> tuple[list[str], dict[str, str]]:
    """The argument list and environment of the script's process."""
    trial_dir = str(session.trial_dir)
    values = {"max_epochs": spec.max_epochs, "trial_dir": trial_dir, "trial_id": session.trial_id, **params}
    assert spec.command, "launch without a command"
    argv = fill(spec.command, values)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    argv = command.under_launcher(argv, spec.launcher, spec.workers, torchrun)
    attempt = uuid.uuid4().hex[:12]  # this run's report file: an earlier run's never reach it
    for name in os.listdir(trial_dir):
        if _REPORTS.match(name):  # an earlier run's: those epochs are in the journal
            os.remove(os.path.join(trial_dir, name))
    config_json = os.path.join(trial_dir, SCRIPT_CONFIG)
    with open(config_json, "w") as fh:
        json.dump(params, fh, indent=1)
    env = dict(os.environ)
    # `python`, `torchrun` and the like resolve to the environment tuner runs in first.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # Each process's threads (each rank's, under torchrun) and devices: its worker's share.
    env.update(command.result_env(spec.cpus_per_worker, _gpu_ids(spec)))
    env.update({env_name(k): as_text(v) for k, v in params.items()})
    env.update(
        {
            api.REPORT_FILE: os.path.join(trial_dir, script_reports_name(attempt)),
            api.CHECKPOINT_DIR: checkpoints.root,
            api.CONFIG_JSON: config_json,
            api.TRIAL_ID: session.trial_id,
            api.TRIAL_DIR: trial_dir,
            api.MAX_EPOCHS: str(spec.max_epochs),
        }
    )
    env.pop(api.RESTORE_DIR, None)
    if restored is not None:
        env[api.RESTORE_DIR] = checkpoints.path(restored)
    return argv, env


def rerun_env(env: dict[str, str], spec: TrialSpec) -> dict[str, str]:
    """What of the script's environment changes its results: threads and devices, the
    parameters that reach it only there (no placeholder of theirs in the command), and the
    user's PYTHONHASHSEED and the like when set."""
    placed = set(placeholders(spec.command or []))
    from_env = [env_name(k) for k in spec.command_params if k not in placed]
    keys = [*command.result_env(0, ""), *from_env, *command.PASSED_ON]
    return {k: env[k] for k in keys if k in env}


class Follower:
    """Turns the script's reports into the trial's epochs."""

    def __init__(
        self,
        f: Frame,
        progress: Progress,
        checkpoints: ScriptCheckpoints,
        epoch: int,
        extra: Optional[dict[str, Any]] = None,
    ):
        self.f, self.progress, self.checkpoints = f, progress, checkpoints
        self.extra = extra or {}  # added to every epoch's row (oom_retries, after one)
        self.epoch = epoch  # the last epoch reported (or restored)
        self.last: Optional[dict[str, Any]] = None
        self.ended: Optional[str] = None  # the failure the trial ended with as a result
        self.complete = False  # every epoch reported: how the script exits no longer matters
        self._t0 = time.perf_counter()
        self._last_at: Optional[float] = None  # when the last epoch was reported

    def take(self, report: dict[str, Any]) -> bool:
        """Record and report one epoch; False when that ended the run (diverged, or a report
        past max_epochs)."""
        spec = self.f.spec
        row = dict(report)
        epoch, ckpt = row.pop("epoch", None), row.pop("checkpoint", None)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < self.epoch:
            raise ScriptError(
                f"the script reported epoch {epoch!r} after epoch {self.epoch}: report epochs done, "
                "1 after the first, on from the restored checkpoint's after a resume"
            )
        for key, value in row.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ScriptError(f"the script reported {key}={value!r}: metrics are numbers (or strings)")
        if epoch == self.epoch and self.last is None:
            return self._before_training(row, epoch)
        if epoch == self.epoch:
            self._amend(row, epoch)
            return True
        if epoch > spec.max_epochs:
            return self._past_the_end(epoch)
        self.epoch = epoch
        row.update(epoch=epoch, epoch_time_s=time.perf_counter() - self._t0, **self.extra)
        row = screened(row, spec, epoch)
        self.last = row
        if not self.progress.record(row):  # journal first (then checkpoint, then report)
            self.ended = str(row["failure"])
            return False
        if ckpt is not None:
            self.checkpoints.commit(str(ckpt), epoch, row)
        if epoch == spec.max_epochs:
            # Trained. The scheduler hears of this epoch when the script has ended (`flush`):
            # told now, ASHA ends the trial at max_epochs, and the script with it, in the
            # middle of what it does after training (a final test metric, saving the model).
            self.complete, self._last_at = True, time.monotonic()
            self.f.watchdog.stop()  # the time left is the exit's grace, not an epoch's
            return True
        self.f.session.report(row, None)
        self.progress.kick()
        self._t0 = time.perf_counter()
        return True

    def flush(self) -> None:
        """Report the last epoch (with what was added to it since), once the script ended."""
        if self.complete and self.last is not None and self.ended is None:
            self.f.session.report(self.last, None)

    def over(self) -> bool:
        """Whether a script that reported its last epoch has had its grace to exit."""
        grace = self.f.spec.exit_grace
        if self._last_at is None or time.monotonic() - self._last_at < grace:
            return False
        self.f.log.warning(
            "the script reported its last epoch (%d) but had not exited %g s later "
            "(task.exit_grace): stopped, its epochs kept",
            self.epoch,
            grace,
        )
        return True

    def _before_training(self, row: dict[str, Any], epoch: int) -> bool:
        """A report before this run trained an epoch: the model as it starts. At epoch 0 (an
        evaluation before training, as nanoGPT's first eval) it is recorded as epoch 0 in the
        journal and TensorBoard, which no scheduler judges (no epoch was trained); at the
        epoch a resumed run restored (the restored model evaluated again), it is that epoch's,
        recorded already: left as recorded."""
        if epoch > 0:
            self.f.log.info("epoch %d (restored) reported again before training: kept as recorded", epoch)
            return True
        row = screened({**row, "epoch": 0, "epoch_time_s": time.perf_counter() - self._t0}, self.f.spec, 0)
        self.last = row
        done = read_metrics(self.f.session.trial_dir) if self.f.session.is_main else []
        if done and done[-1].get("epoch") == 0 and "failure" not in row:  # a restart's own epoch 0
            self.progress.amend({k: v for k, v in row.items() if k != "epoch"}, 0)
            return True
        if not self.progress.record(row):  # (a non-finite loss before any training: diverged)
            self.ended = str(row["failure"])
            return False
        self._t0 = time.perf_counter()
        return True

    def _amend(self, row: dict[str, Any], epoch: int) -> None:
        """A second report of the epoch reported last (a test metric after training): its new
        metrics join that epoch's; the scheduler has already judged the epoch."""
        assert self.last is not None, "an amend before any report"
        new = {k: v for k, v in row.items() if k not in self.last}
        kept = sorted(k for k in row if k in self.last and row[k] != self.last[k])
        if kept:
            self.f.log.warning("epoch %d reported again: %s kept as first reported", epoch, ", ".join(kept))
        if new:
            self.progress.amend(new, epoch)
            self.last = {**self.last, **new}

    def _past_the_end(self, epoch: int) -> bool:
        spec = self.f.spec
        if self.epoch < spec.max_epochs:
            raise ScriptError(
                f"the script reported epoch {epoch} after epoch {self.epoch}, past the sweep's max_epochs "
                f"({spec.max_epochs}): train $TUNER_MAX_EPOCHS epochs ({{max_epochs}} in the command), "
                "reporting each"
            )
        self.f.log.warning(
            "the script reported epoch %d, past max_epochs (%d): stopped, its epochs kept",
            epoch,
            spec.max_epochs,
        )
        return False


class ScriptCheckpoints:
    """The script's checkpoints: `<root>/epoch_NNNNNN/`, one directory per epoch, the newest
    `keep` kept, and the trial's best epoch's besides (the best by the sweep's metric of
    those with a checkpoint), named in the trial's best.json as tuner's loop names its best
    weights: so `best/`, `tuner export` and a user find it (`sweepdir.read_best_checkpoint`).
    A directory the script filled becomes an epoch's by a rename, so a directory with that
    name is complete; `.pending-*` ones are what a stopped script was writing."""

    def __init__(self, root: str, keep: int, trial_dir: str = "", metric: str = "", direction: str = "min"):
        self.root, self.keep = root, max(1, keep)
        self.trial_dir, self.metric, self.direction = trial_dir, metric, direction
        os.makedirs(root, exist_ok=True)
        # The best so far survives the process: a resumed trial reads it back.
        self.best = read_best_checkpoint(trial_dir) if trial_dir else None

    def epochs(self) -> list[int]:
        return numbered(self.root, _EPOCH_DIR)

    def path(self, epoch: int) -> str:
        return os.path.join(self.root, checkpoint_name(epoch))

    def latest(self) -> Optional[int]:
        return (self.epochs() or [None])[-1]

    def clean(self) -> None:
        """Remove what an earlier run was writing when it ended."""
        for name in os.listdir(self.root):
            if name.startswith(api.PENDING):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def commit(self, directory: str, epoch: int, metrics: Optional[dict[str, Any]] = None) -> None:
        """Make `directory` (inside root) epoch `epoch`'s checkpoint (of these `metrics`); drop
        the oldest, never the best epoch's."""
        src = os.path.realpath(directory)
        if os.path.dirname(src) != os.path.realpath(self.root) or not os.path.isdir(src):
            raise ScriptError(
                f"checkpoint {directory!r} of epoch {epoch} is not a directory in $TUNER_CHECKPOINT_DIR "
                f"({self.root}); use tuner.checkpoint_dir()"
            )
        final = self.path(epoch)
        if os.path.exists(final):  # an earlier run's, past the one it resumed from
            shutil.rmtree(final)
        os.replace(src, final)
        self._offer(metrics or {}, epoch)
        best = None if self.best is None else int(self.best["epoch"])
        for old in self.epochs()[: -self.keep]:
            if old != best:
                shutil.rmtree(self.path(old), ignore_errors=True)

    def _offer(self, metrics: dict[str, Any], epoch: int) -> None:
        """best.json names this epoch if its metric beats the best so far (a tie keeps the
        earlier epoch, as the ranking does); written before older directories go."""
        value = metrics.get(self.metric)
        if not self.trial_dir or not finite(value) or "failure" in metrics:
            return
        held = None if self.best is None else float(self.best["value"])
        if held is not None and not (value > held if self.direction == "max" else value < held):
            return
        name = os.path.relpath(self.path(epoch), self.trial_dir)
        record = {"epoch": epoch, "metric": self.metric, "value": float(value), "checkpoint": name}
        write_atomic(os.path.join(self.trial_dir, BEST_RECORD), json.dumps(record))
        self.best = {**record, "checkpoint": self.path(epoch)}


def _gpu_ids(spec: TrialSpec) -> str:
    """The trial's GPUs as CUDA_VISIBLE_DEVICES lists them ("" for none: the script sees none)."""
    if spec.gpus_per_worker <= 0:
        return ""
    import ray

    return ",".join(str(i) for i in ray.get_gpu_ids())


def failure(code: int, proc: ScriptProcess, launcher: Optional[str]) -> ScriptError:
    """The error of a script that exited with `code`: the exception it raised (under torchrun,
    the rank that failed first), its own traceback for the trial's traceback.txt; else the
    exit code and stderr's last lines."""
    cause = proc.tracebacks.cause()
    if cause is None:
        return ScriptError(_exit_message(code, list(proc.stderr_tail)))
    who = "" if cause.rank is None else f", rank {cause.rank}"
    if launcher == "torchrun" and proc.tracebacks.root_rank is not None:
        who = f", rank {proc.tracebacks.root_rank} failed first (torchrun)"
    where = f"task.command ended with {_code_word(code)}{who}"
    return ScriptError(f"{cause.line} ({where})", f"{where}; the script's traceback:\n{cause.text}\n")


def _code_word(code: int) -> str:
    """`exit code N`, with the signal's name when a signal ended it (128 + its number)."""
    what = f"exit code {code}"
    if code > 128:
        try:
            import signal

            what += f" ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return what


def _exit_message(code: int, tail: list[str]) -> str:
    """One line: the exit code (the signal, if one ended it) and stderr's last lines."""
    what = _code_word(code)
    lines = [ln.strip() for ln in tail if ln.strip()][-5:]
    return f"task.command ended with {what}" + (f"; stderr ends: {' | '.join(lines)}" if lines else "")
