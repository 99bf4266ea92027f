"""The ways a trial runs: one record a mode, chosen once from the task section.

- `loop`: tuner's own loop, on a built-in or your model and data (`task.model`, `task.data`);
- `hooks`: the same loop with your loss or metrics (`task.loss`, `task.metrics`);
- `train`: your own loop, `fn(config, ctx)` (`task.train`);
- `command`: your own script, a process per trial (`task.command`).

A record holds everything the rest of tuner asks about its mode: the task fields that choose it
and those it reads, the function its trials run (named here, imported only in the trial's
process, where torch comes with it), whether the trial actor itself holds every worker,
whether its trials keep weights for `best/` and export and whether tuner can build its model
again, whether the training section applies, what its trials report, and what `validate`
checks for it. `SweepConfig.trial_mode` looks it up; the driver, export, the report and the trial's
launch read the record instead of testing `task.command` or `task.train` themselves.

A fifth mode is one module (its trial function, in a room of its own under `tuner.trial`) and
one entry in `MODES`; tests/test_modes.py then runs it through the contract every mode keeps.
This module imports neither torch nor Ray: `tuner validate` reads it before either starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from tuner.config.checks import check_param
from tuner.config.command import check_command
from tuner.config.resources import ResourcesSection
from tuner.config.task import TaskSection
from tuner.errors import ConfigError
from tuner.space.params import ParamT, values_of

# What tuner's own loop reports every epoch (trial/loop/run.py's `_epoch`; tests/test_loop.py
# checks the two agree), besides val_<name> of the metrics hook (default: val_acc).
LOOP_METRICS = (
    "val_loss", "train_loss", "num_params", "samples_per_s", "train_samples", "epoch_time_s",
    "lr", "world_size", "micro_batch", "oom_backoffs",
    "gpu_mem_peak_gb", "gpu_mem_reserved_gb", "gpu_mem_used_gb", "gpu_util",  # on a GPU
)  # fmt: skip


# What ctx applies of the training section (amp, seed, threads, prepare's compile and
# channels_last, the loaders' workers and prefetch, step's clipping and micro-batches), and
# the batch size and learning rate a loop reads as config["batch_size"], config["lr"].
OWN_LOOP_TRAINING = (
    "batch_size", "lr", "amp", "seed", "threads", "tf32", "compile", "channels_last",
    "loader_workers", "prefetch", "grad_clip", "micro_batch", "min_micro_batch",
)  # fmt: skip


class SweepFile(Protocol):
    """What a mode's check reads of the sweep file: a SweepConfig (config.sections, which
    imports this module) once its sections are valid each on its own."""

    task: TaskSection
    search: Any  # SearchSection
    training: Any  # TrainingSection
    resources: ResourcesSection
    failure: Any  # FailureSection

    @property
    def objectives(self) -> list[tuple[str, str]]: ...

    def hyperparameters(self) -> dict[str, ParamT]: ...


@dataclass(frozen=True)
class Reported:
    """The metrics a mode's trials report: these names, and any name that starts with `prefix`."""

    names: frozenset[str]
    prefix: Optional[str] = None

    def __contains__(self, name: object) -> bool:
        return name in self.names or (self.prefix is not None and str(name).startswith(self.prefix))


@dataclass(frozen=True)
class Mode:
    """One way a trial runs (see the module)."""

    name: str
    title: str  # what it is, in messages: "your own script"
    chosen_by: tuple[str, ...]  # task fields that choose it when set (none: the default mode)
    fields: tuple[str, ...]  # the task fields it reads; every other one keeps its default
    runs: str  # "module:function" a trial calls as fn(config, spec, session)
    check: Callable[[SweepFile], None]  # what validate refuses for this mode, before Ray starts
    needs: tuple[str, ...] = ()  # task fields it cannot go without
    # It builds its own model and data: a field of tuner's loop beside it is refused with
    # f"{alone}, which would ignore it". None: tuner builds them.
    alone: Optional[str] = None
    # The trial actor itself holds every worker's CPUs and GPUs and runs all of the trial's
    # processes (a script under torchrun): no ranks of its own, actors reused.
    actor_holds_workers: bool = False
    keeps_weights: bool = True  # a trial keeps its best epoch's weights: best/, export
    # Its trial actors import torch (those of a script do not: its own processes do).
    actor_imports_torch: bool = True
    # Its trials run in the directory the sweep was started from, all in that one (relative
    # inputs resolve as in a run alone; relative outputs are shared: driver/workdir.py warns).
    shares_start_dir: bool = False
    # A trial keeps its best epoch's checkpoint directory instead (a script's own, in whatever
    # format it writes): best/checkpoint/ is a copy, export and load_best name it.
    best_checkpoint: bool = False
    no_weights: str = ""  # why a trial of this mode may have none (export says it; "": no reason)
    cannot_rebuild: Optional[str] = None  # why tuner cannot build its model again (None: it can)
    reads_training: bool = True  # the training section (amp, batch_size, ...) applies
    # The training settings its trials' configuration holds at their defaults (None: all;
    # a setting the sweep file sets is held too): what the trial's code is given, and what
    # tuner_trial.json and best/config.json then list, never defaults only tuner's loop reads.
    training_given: Optional[tuple[str, ...]] = None
    command_line: bool = False  # a trial runs the user's command line (the report shows it)
    reports: Optional[Callable[[TaskSection], Reported]] = None  # None: the user's code names them

    def function(self) -> Callable[..., Any]:
        """The trial function, imported now (call it in the trial's process: torch)."""
        module, name = self.runs.split(":")
        fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return fn

    def in_actor(self, workers: int) -> bool:
        """Whether a trial runs in its Tune actor alone, on the actor's one bundle: one worker,
        or an actor that holds every worker itself. Else the actor starts the trial's ranks
        (trial/launch/ranks.py)."""
        return workers == 1 or self.actor_holds_workers


def mode_of(task: TaskSection) -> Mode:
    """The mode the task section chooses: the first whose `chosen_by` field is set."""
    for mode in MODES.values():
        if any(getattr(task, name) is not None for name in mode.chosen_by):
            return mode
    return MODES[DEFAULT]


def check_task(task: TaskSection) -> None:
    """Refuse a task field its mode would ignore, or one it needs and lacks (the first named)."""
    mode = mode_of(task)
    for name, field in type(task).model_fields.items():  # in order: the first is named
        # Any value but the default (sweep.yaml writes model: null, data_args: {} back).
        if name in mode.fields or getattr(task, name) == field.get_default(call_default_factory=True):
            continue
        owner = next(m for m in MODES.values() if name in m.fields)
        if owner.alone and name not in owner.chosen_by:  # e.g. task.launcher without a command
            raise ConfigError(f"task.{name}", f"goes with task.{owner.chosen_by[0]} ({owner.title}) only")
        raise ConfigError(
            f"task.{name}",
            f"{mode.alone}, which would ignore it: remove it (it builds its own model and data; "
            "fixed values go in search.params)",
        )
    for name in mode.needs:
        if getattr(task, name) is None:
            others = ", or ".join(f"task.{m.chosen_by[0]}: {m.title}" for m in MODES.values() if m.alone)
            raise ConfigError(f"task.{name}", f"required field is missing (or {others})")


# ----------------------------------------------------------------------------- each mode's checks


def _params(cfg: SweepFile) -> None:
    for name, param in cfg.search.params.items():
        check_param(name, param, cfg.task.model or "", cfg.training)


def _reported(cfg: SweepFile) -> None:
    """Refuse an objective the mode's trials never report (it would end every trial with
    "metric ... is not among the values the trial reported")."""
    reports = mode_of(cfg.task).reports
    assert reports is not None
    reported = reports(cfg.task)
    for name, _ in cfg.objectives:
        if name in reported:
            continue
        hook = (
            "val_<name> of each {name: value} task.metrics returns"
            if reported.prefix
            else "val_acc (class targets), or val_<name> of task.metrics' {name: value}"
        )
        raise ConfigError(
            "metric",
            f"tuner's loop never reports '{name}': it reports val_loss, train_loss, num_params, "
            f"samples_per_s, epoch_time_s and {hook}",
        )


def _no_script_retries(cfg: SweepFile) -> None:
    """failure.oom_retries reruns a script; a loop backs off inside the trial instead. (Its
    value, not whether it was written: sweep.yaml writes every field back.)"""
    if cfg.failure.oom_retries != type(cfg.failure).model_fields["oom_retries"].default:
        raise ConfigError(
            "failure.oom_retries",
            "task.command only: tuner's loop and ctx.step back off the micro-batch inside the trial "
            "(training.min_micro_batch)",
        )


def _tuners_loop(cfg: SweepFile) -> None:
    _reported(cfg)
    _params(cfg)
    _no_script_retries(cfg)


def _users_loop(cfg: SweepFile) -> None:
    """Settings only tuner's own loop can honour are refused."""
    _params(cfg)
    _no_script_retries(cfg)
    if cfg.resources.gpus_per_worker == "pack":
        raise ConfigError(
            "resources.gpus_per_worker",
            "pack measures tuner's own loop; with task.train give each trial a share (0.25)",
        )
    if True in (values_of(cfg.hyperparameters().get("find_batch_size")) or []):
        where = "search.params" if "find_batch_size" in cfg.search.params else "training"
        raise ConfigError(f"{where}.find_batch_size", "tuner's own loop only: task.train runs yours")
    if cfg.training.autotune:
        raise ConfigError("training.autotune", "measures tuner's own loop; task.train runs yours")
    if "fp32" in (values_of(cfg.hyperparameters().get("eval_precision")) or []):
        where = "search.params" if "eval_precision" in cfg.search.params else "training"
        raise ConfigError(f"{where}.eval_precision", "tuner's own loop only: task.train evaluates yours")


def _users_script(cfg: SweepFile) -> None:
    check_command(cfg.task, cfg.search.params, cfg.search.algorithm, cfg.training, cfg.resources)


def _loop_reports(task: TaskSection) -> Reported:
    # val_<name> of each {name: value} the metrics hook returns; val_acc without one.
    if task.metrics is not None:
        return Reported(frozenset(LOOP_METRICS), prefix="val_")
    return Reported(frozenset((*LOOP_METRICS, "val_acc")))


MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (  # in the order they are chosen: the first whose field is set
        Mode(
            name="command",
            title="your own script",
            chosen_by=("command",),
            fields=("command", "launcher", "checkpoints", "env_params", "exit_grace"),
            runs="tuner.trial.script.run:run_command",
            check=_users_script,
            alone="task.command runs your script",
            actor_holds_workers=True,
            keeps_weights=False,
            actor_imports_torch=False,
            best_checkpoint=True,
            shares_start_dir=True,
            no_weights="task.command: your script keeps its own weights; tuner keeps the best epoch's "
            "checkpoint only when the script saves one in tuner.checkpoint_dir()",
            cannot_rebuild="task.command: your script builds its own model and reads its own checkpoints; "
            "tuner keeps the best epoch's checkpoint directory as the script wrote it",
            reads_training=False,
            training_given=(),
            command_line=True,
        ),
        Mode(
            name="train",
            title="your own loop",
            chosen_by=("train",),
            fields=("train",),
            runs="tuner.trial.userloop.run:run_own_loop",
            check=_users_loop,
            alone="task.train runs your own loop",
            no_weights="task.train keeps the model in the state it reports: ctx.report(metrics, "
            "state=ctx.state_dict(model, optimizer)), or any state with a 'model' state dict",
            cannot_rebuild="this sweep trained your own loop's model: tuner cannot build it. Load "
            "model.pt into your model (tuner.load_best(sweep_dir, model=YourModel(...))); --format "
            "state_dict",
            training_given=OWN_LOOP_TRAINING,
            shares_start_dir=True,
        ),
        Mode(
            name="hooks",
            title="tuner's own loop with your loss or metrics",
            chosen_by=("loss", "metrics"),
            fields=("model", "data", "data_args", "loss", "metrics"),
            runs="tuner.trial.loop.run:run_trial",
            check=_tuners_loop,
            needs=("model", "data"),
            reports=_loop_reports,
        ),
        Mode(
            name="loop",
            title="tuner's own loop",
            chosen_by=(),
            fields=("model", "data", "data_args"),
            runs="tuner.trial.loop.run:run_trial",
            check=_tuners_loop,
            needs=("model", "data"),
            reports=_loop_reports,
        ),
    )
}
DEFAULT = "loop"
