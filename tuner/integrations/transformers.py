"""Hugging Face's `Trainer` tuned as it is: `TunerCallback` (docs/how-to/transformers.md).

    from tuner.integrations.transformers import TunerCallback

    tuned = TunerCallback()              # a task.command script; TunerCallback(ctx) in task.train
    args = TrainingArguments(tuned.output_dir or "out", num_train_epochs=...,
                             eval_strategy="epoch", save_strategy="epoch")
    trainer = Trainer(model, args, train_dataset=..., eval_dataset=..., callbacks=[tuned])
    trainer.train(resume_from_checkpoint=tuned.resume_from_checkpoint)

Each epoch, once the Trainer has evaluated and saved its checkpoint (the model, optimizer,
scheduler and RNG states: what `resume_from_checkpoint` restores exactly), the epoch's
evaluation metrics (`eval_loss`, your `compute_metrics`' `eval_*`) and its last training loss
(`loss`) go to tuner, with that checkpoint copied into the directory tuner gives. `output_dir`
is the trial's own directory (`framework/`) in a sweep. When the Trainer's early stopping ends
training, the last epoch's report says so (`stopped_by: should_training_stop`). When tuner
stops a trial (a script's by SIGTERM: after the current step; a `task.train` trial's at its
report), the Trainer ends as its own early stopping ends it, its end of training included
(the best model loaded, the callbacks' `on_train_end`), and then this callback's
`on_train_end` ends `trainer.train()`: a script exits as one ended by SIGTERM (143), a
`task.train` function does not go on. So list it last among the callbacks. Outside a sweep
it prints each epoch's metrics.

Needs `eval_strategy="epoch"` and `save_strategy="epoch"` (one report an epoch, with its
checkpoint): other strategies are refused when training starts. Imports transformers: import
this module only where it is installed (`pip install 'tuner[transformers]'`).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading
from collections.abc import Sequence
from typing import Any, Optional

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from tuner.integrations.bridge import Bridge, numbers

CHECKPOINT = "checkpoint"  # the Trainer's checkpoint directory inside each of tuner's
_SKIP = ("epoch", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


class TunerCallback(TrainerCallback):
    """Reports each epoch to tuner with the Trainer's checkpoint; see the module's docstring.

    `ctx`: the `ctx` of a `task.train` function (None in a script). `metrics`: the names to
    report (default: every number the evaluation gave, and the training loss)."""

    def __init__(self, ctx: Any = None, metrics: Optional[Sequence[str]] = None):
        self.bridge = Bridge(ctx)
        self.metrics = list(metrics) if metrics is not None else None
        self._evaluated: dict[str, float] = {}
        self._reported = 0
        self._stop_asked = threading.Event()
        self._cut = False  # a stop ended training inside an epoch
        self._before: Any = None  # the SIGTERM handler before ours
        self._stopped: Optional[BaseException] = None  # a task.train trial's stop, from its report

    @property
    def output_dir(self) -> Optional[str]:
        """The trial's directory for the Trainer's outputs (`TrainingArguments(output_dir=)`);
        None outside a sweep."""
        return self.bridge.outputs()

    @property
    def resume_from_checkpoint(self) -> Optional[str]:
        """The Trainer's checkpoint to resume from (`trainer.train(resume_from_checkpoint=)`),
        None when the trial starts afresh."""
        where = self.bridge.restore_dir()
        path = os.path.join(where, CHECKPOINT) if where else None
        return path if path and os.path.isdir(path) else None

    # ------------------------------------------------------------------ the run

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.bridge.trial_dir is None:
            return
        wrong = [
            name
            for name in ("eval_strategy", "save_strategy")
            if str(getattr(getattr(args, name), "value", getattr(args, name))) != "epoch"
        ]
        if wrong:
            raise ValueError(
                f"tuner's TunerCallback needs TrainingArguments({wrong[0]}='epoch'): one report an epoch"
            )
        if self.bridge.ctx is None and threading.current_thread() is threading.main_thread():
            # A script stopped by tuner gets SIGTERM: the Trainer ends after this step instead
            # of the process dying mid-write.
            self._before = signal.signal(signal.SIGTERM, lambda *_: self._stop_asked.set())

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._stop_asked.is_set():
            control.should_training_stop = True
            # After an epoch's last step the epoch is whole: evaluated, saved and reported as
            # any other (a SIGTERM from elsewhere, a preempted node, then loses no epoch).
            epoch = state.epoch or 0.0
            self._cut = not math.isclose(epoch, round(epoch), abs_tol=1e-6)
            if self._cut:
                control.should_evaluate = control.should_save = False

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # The epoch a stop cut short ends here too, and the Trainer's flow (its first callback)
        # has just asked for an evaluation and a checkpoint: of part of an epoch, which would be
        # reported as a whole one once past its half (`round(state.epoch)`), and could outlast
        # the stop's grace before SIGKILL.
        if self._cut:
            control.should_evaluate = control.should_save = False

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._before is not None:
            signal.signal(signal.SIGTERM, self._before)
            self._before = None
        if self._stopped is not None:
            # The Trainer's end ran (every callback listed before this one had its
            # on_train_end): the stop goes on out of `trainer.train()` as the report raised it.
            stopped, self._stopped = self._stopped, None
            raise stopped
        if self._stop_asked.is_set():
            # Training ended cleanly; the process still ends as one stopped by SIGTERM (an exit
            # status of 0 would read as the script ending its training itself).
            raise SystemExit(128 + signal.SIGTERM)

    # ------------------------------------------------------------------ each epoch

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        metrics = {k: v for k, v in (kwargs.get("metrics") or {}).items() if k not in _SKIP}
        losses = [row["loss"] for row in state.log_history if "loss" in row]
        self._evaluated = numbers({**({"loss": losses[-1]} if losses else {}), **metrics})
        if self.metrics is not None:
            self._evaluated = {k: v for k, v in self._evaluated.items() if k in self.metrics}

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        epoch = int(round(state.epoch or 0))
        if epoch <= self._reported or self._cut:  # (not an epoch's end)
            return
        save = self.bridge.checkpoint_dir()
        if save:
            written = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            shutil.copytree(written, os.path.join(save, CHECKPOINT))
        report: dict[str, Any] = dict(self._evaluated)
        early = control.should_training_stop and state.global_step < state.max_steps
        if early and not self._stop_asked.is_set():
            # Asked to stop before its planned steps, by a callback's on_evaluate (the
            # Trainer's EarlyStoppingCallback), which the Trainer does not name; not by tuner.
            report["stopped_by"] = "should_training_stop"
        model = kwargs.get("model")
        weights = model.state_dict() if model is not None and self.bridge.ctx is not None else None
        self._reported = epoch
        try:
            self.bridge.report(epoch, report, model=weights)
        except SystemExit as stop:
            # A task.train trial the scheduler stopped at this report (`ctx.report` does not
            # return): the Trainer ends as its own early stopping ends it, with no further step,
            # evaluation or checkpoint, and its end of training; on_train_end raises the stop.
            self._stopped = stop
            self._stop_asked.set()
            control.should_training_stop = True
