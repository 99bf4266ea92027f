"""Lightning's `Trainer` tuned as it is: `TunerCallback` (docs/how-to/lightning.md).

    from tuner.integrations.lightning import TunerCallback

    tuned = TunerCallback()              # a task.command script; TunerCallback(ctx) in task.train
    trainer = L.Trainer(max_epochs=..., callbacks=[tuned, EarlyStopping("val_loss")])
    trainer.fit(model, datamodule, ckpt_path=tuned.ckpt_path)

Each epoch, once validation and the other callbacks are done, the epoch's logged metrics
(`trainer.callback_metrics`: what `self.log` gave, epoch-level) go to tuner with a checkpoint
written by Lightning itself into the directory tuner gives, RNG states included, so a trial
that is stopped, retried or resumed goes on exactly (`ckpt_path`). In a sweep, Lightning's
own outputs go into the trial's directory (`framework/`), and its default TensorBoard logger
becomes a CSV logger there: tuner's TensorBoard run of the trial already has every logged
number, and a second event file per trial doubled the runs `tuner board` shows. When
Lightning's early stopping (or any callback) ends the fit, the last epoch's report says so
(`stopped_by`: the early stopping's class name, or `should_stop`). When tuner stops a trial,
Lightning ends as it does on an interrupt: its loggers are finalised and its teardown runs (a
script then exits as one ended by SIGTERM, 143, not 0 as Lightning would).
Outside a sweep the callback prints each epoch's metrics and changes nothing else.

Imports `lightning` (or, without it, `pytorch_lightning`): import this module only where
Lightning is installed (`pip install 'tuner[lightning]'`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from typing import Any, Optional

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
except ImportError:  # the older package name, the same API
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger  # type: ignore[no-redef]

from tuner.integrations.bridge import Bridge, numbers, rng_state, set_rng_state

CHECKPOINT = "lightning.ckpt"  # the file in each of tuner's checkpoint directories
_RNG_KEY = "tuner_rng"  # the RNG states, added to Lightning's checkpoint
# Where Lightning's Trainer takes its default `default_root_dir` from (its PL_TRAINER_<ARG>
# defaults), and the value this process last put there (a trial actor runs trial after trial).
ROOT_ENV = "PL_TRAINER_DEFAULT_ROOT_DIR"
_put: Optional[str] = None


class TunerCallback(pl.Callback):
    """Reports each epoch to tuner and checkpoints it; see the module's docstring.

    `ctx`: the `ctx` of a `task.train` function (None in a script). `metrics`: the logged
    names to report (default: every number logged at epoch level)."""

    def __init__(self, ctx: Any = None, metrics: Optional[Sequence[str]] = None):
        super().__init__()
        self.bridge = Bridge(ctx)
        self.metrics = list(metrics) if metrics is not None else None
        self._rng: Optional[dict[str, Any]] = None  # restored from a checkpoint, until training starts
        self._reported = 0  # the epoch reported last
        self._root_default()

    @property
    def ckpt_path(self) -> Optional[str]:
        """Lightning's checkpoint to resume from (`trainer.fit(..., ckpt_path=)`), None when
        the trial starts afresh."""
        where = self.bridge.restore_dir()
        path = os.path.join(where, CHECKPOINT) if where else None
        return path if path and os.path.isfile(path) else None

    # ------------------------------------------------------------------ where outputs go

    def _root_default(self) -> None:
        """In a sweep, the Trainer made next (this callback is made first, to be handed to it)
        writes into the trial's directory from the start, unless it is given `default_root_dir`
        or the environment names one: Lightning's default logger makes its directory and event
        file before any callback's hook, and in the directory every trial runs in, one trial
        removing its empty `lightning_logs` raced another's making it (FileNotFoundError)."""
        global _put
        root = self.bridge.outputs()
        if root is not None and os.environ.get(ROOT_ENV) in (None, _put):
            os.environ[ROOT_ENV] = _put = root

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        global _put
        if _put is not None and os.environ.get(ROOT_ENV) == _put:
            del os.environ[ROOT_ENV]  # (the Trainer has read it: not left to the next one)
            _put = None
        root = self.bridge.outputs()
        if root is None or stage != "fit":
            return
        ours = (os.getcwd(), os.path.abspath(root))
        if os.path.abspath(trainer.default_root_dir) not in ours:
            return  # the user chose where Lightning writes
        # Lightning has no public setter; its ModelCheckpoint reads this in its own setup.
        trainer._default_root_dir = root
        logger = trainer.logger
        if isinstance(logger, TensorBoardLogger) and os.path.abspath(logger.save_dir) in ours:
            # Lightning's default logger (made before any hook, its event file too): a CSV
            # logger in the trial's directory instead, and the empty event file it already
            # made is removed.
            trainer.loggers = [CSVLogger(root), *trainer.loggers[1:]]
            _remove_unused(logger)

    # ------------------------------------------------------------------ RNG in checkpoints

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[_RNG_KEY] = rng_state()

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._rng = checkpoint.get(_RNG_KEY)

    # The RNG goes back to the checkpoint's as late as can be before the resumed epoch draws
    # from it (its DataLoader iterator, made at once on a resume, draws a seed; so does the
    # sanity check's validation loader before that): at the start of fit, and again after
    # the sanity check when it runs.

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._rng is not None:
            set_rng_state(self._rng)

    def on_sanity_check_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._rng is not None:
            set_rng_state(self._rng)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._rng = None

    # ------------------------------------------------------------------ each epoch

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        logged = numbers(dict(trainer.callback_metrics))
        if self.metrics is not None:
            logged = {k: v for k, v in logged.items() if k in self.metrics}
        report: dict[str, Any] = dict(logged)
        if self.bridge.trial_dir is not None:
            save = self.bridge.checkpoint_dir()  # (None off rank 0, where Lightning writes nothing)
            trainer.save_checkpoint(os.path.join(save, CHECKPOINT) if save else os.devnull)
        model = pl_module.state_dict() if self.bridge.ctx is not None else None
        self.bridge.report(trainer.current_epoch + 1, report, model=model)
        self._reported = trainer.current_epoch + 1

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        # Lightning ends fit on SIGTERM with an exit status of 0, which reads as the script
        # ending its training itself: a process ended by SIGTERM says so (tuner's own stop
        # never reads it; a stop from elsewhere, a preempted node, is then retried).
        if type(exception).__name__ == "SIGTERMException" and isinstance(exception, SystemExit):
            exception.code = 128 + signal.SIGTERM

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Early stopping decides after every other callback has had the epoch (Lightning calls
        # its "monitoring" callbacks last): who ended the fit is added to the epoch reported.
        if trainer.should_stop and self._reported:
            self.bridge.report(self._reported, {"stopped_by": _stopper(trainer)})


def _stopper(trainer: pl.Trainer) -> str:
    """Which callback ended the fit: the early stopping that stopped (its class's name), or
    `should_stop` (set by other code)."""
    for c in trainer.early_stopping_callbacks:
        reason = getattr(c, "stopping_reason", None)  # (Lightning 2.6 on)
        stopped = reason is not None and reason.value != 0
        if stopped or (reason is None and c.stopped_epoch == trainer.current_epoch):
            return type(c).__name__
    return "should_stop"


def _remove_unused(logger: TensorBoardLogger) -> None:
    """The event file of a TensorBoard logger that has logged nothing, and its version
    directory (this run's: a new version each run) and `lightning_logs` where empty."""
    here = logger.log_dir
    logger.experiment.close()
    names = os.listdir(here) if os.path.isdir(here) else []
    if not all(n.startswith("events.out.tfevents") for n in names):
        return  # (not only what the logger made: left alone)
    for name in names:  # (two trials starting at once may share the version: either removes)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(here, name))
    for d in (here, os.path.dirname(here)):
        try:
            os.rmdir(d)  # only when empty
        except OSError:
            return
