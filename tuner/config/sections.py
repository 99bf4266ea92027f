"""The sweep file: a typed, validated `SweepConfig` (defaults < YAML < CLI flags).

Every field documents itself (the descriptions feed `tuner schema` and docs/), and every
error names the field path it is about, e.g. `search.params.lr.low: must be > 0 for loguniform`.
This module imports neither Ray nor torch, so `tuner validate` answers at once and a bad file
is refused before anything heavy starts.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Optional, Union

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from tuner import catalogue
from tuner.autotune import DEFAULT_BUDGET_S
from tuner.config.algorithms import ALGORITHMS, Algorithm
from tuner.config.algorithms import DEFAULT as DEFAULT_ALGORITHM
from tuner.config.base import MAX_SEED, MAX_TRIALS, OBJECTIVES, Section, one_of
from tuner.config.checks import check_constraints, check_search, check_start_with
from tuner.config.fingerprint import fingerprint as task_fingerprint
from tuner.config.modes import Mode, check_task, mode_of
from tuner.config.objectives import (
    DirectionField,
    MetricField,
    check_several,
    direction_shape,
    directions,
    metric_shape,
    older_spelling,
    pairs,
)
from tuner.config.population import perturbed
from tuner.config.resources import ResourcesSection
from tuner.config.schedule import NotifySection, ScheduleSection, TrackingSection
from tuner.config.schedulers import Scheduler, check_pair
from tuner.config.storage import checked_output
from tuner.config.task import TaskSection
from tuner.errors import ConfigError
from tuner.space.conditions import grid_configs
from tuner.space.params import Fixed, Param, ParamT, Scalar, values_of


class SearchSection(Section):
    """How configurations are chosen."""

    algorithm: str = Field(
        DEFAULT_ALGORITHM,
        description=f"{' | '.join(ALGORITHMS)} (docs/explanation/algorithms.md).",
    )
    num_samples: int = Field(
        10, ge=1, le=MAX_TRIALS, description="Trials to run (grid search runs its full grid instead)."
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of the searcher: same seed, same suggestions.")
    grid_points: int = Field(3, ge=1, le=100, description="Grid search: values tried per numeric range.")
    params: dict[str, Param] = Field(
        default_factory=dict,
        description="Hyperparameters: {type: uniform|loguniform|randint|lograndint, low, high}, "
        "{type: choice|grid, values: [...]}, or a bare value (fixed). Integer bounds are "
        "inclusive. when: {name: value or [values], ...} searches a parameter only where those "
        "parameters have those values (docs/how-to/search-space.md#conditional-parameters).",
    )
    constraints: list[str] = Field(
        default_factory=list,
        description="Expressions every trial's configuration keeps, over parameter names and "
        "numbers: + - * / // % **, comparisons, and/or/not, e.g. 'width % heads == 0' "
        "(docs/how-to/search-space.md#constraints).",
    )

    start_with: list[dict[str, Scalar]] = Field(
        default_factory=list,
        description="Configurations every algorithm runs first, e.g. [{lr: 0.01, optimizer: adam}]: "
        "each may name some parameters of search.params, the rest drawn from the space; they count "
        "towards num_samples and model-based searchers learn from them like any trial "
        "(docs/how-to/warm-start.md#known-starting-points-start_with).",
    )

    warm_start: Union[Literal["auto"], list[str]] = Field(
        default_factory=list,
        description="Earlier sweep directories whose trials this sweep's searcher starts from (told as "
        "history; random search runs their best 5 first), or auto: every sweep in output/ of the same "
        "task. One of another task (fingerprint: task fields, objectives, user modules) is refused "
        "unless warm_start_force (docs/how-to/warm-start.md#earlier-sweeps-warm_start).",
    )
    warm_start_force: bool = Field(
        False, description="Use warm_start sweeps even where their task fingerprint differs."
    )

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        return one_of(value, ALGORITHMS, "algorithm")

    @property
    def record(self) -> Algorithm:
        """The algorithm's record (tuner.config.algorithms): its traits and builder."""
        return ALGORITHMS[self.algorithm]

    @model_validator(mode="after")
    def _expressible(self) -> SearchSection:
        for name, kind in self.record.unsupported(self.params):
            raise ConfigError(
                f"search.params.{name}",
                f"{self.algorithm} cannot search a {kind} parameter (use choice instead)",
            )
        check_search(self.params, self.constraints, self.record, self.grid_points)
        if self.warm_start and not self.record.warm_starts:
            nothing = "grid search runs every combination: nothing to start from"
            raise ConfigError("search.warm_start", nothing)
        return self


class TrainingSection(Section):
    """Training-loop defaults. Any of them can also be searched or fixed in search.params."""

    batch_size: int = Field(64, ge=1, description="Samples per optimizer step, summed over workers.")
    micro_batch: Optional[int] = Field(
        None,
        ge=1,
        description="Largest batch one worker runs forward at once; larger batches are "
        "accumulated. Default: the whole per-worker batch.",
    )
    min_micro_batch: int = Field(
        1,
        ge=1,
        description="On out-of-memory the micro-batch halves (accumulation doubles); below this "
        "the trial ends with failure oom.",
    )
    amp: Literal["off", "bf16", "fp16", "auto"] = Field(
        "auto",
        description="Mixed precision: off | bf16 | fp16 (with GradScaler) | auto (bf16 on GPUs "
        "that support it, else fp16; off on CPU).",
    )
    eval_precision: Literal["amp", "fp32"] = Field(
        "amp",
        description="Evaluation's precision: amp (under training.amp's autocast, as training) or "
        "fp32 (without autocast: validation metrics free of bf16/fp16 rounding, the evaluation "
        "slower). No effect when amp is off. tuner's own loop only.",
    )
    lr: float = Field(1e-3, gt=0, description="Learning rate.")
    optimizer: str = Field("adam", description=f"One of: {', '.join(catalogue.OPTIMIZERS)}.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD/RMSprop momentum.")
    weight_decay: Optional[float] = Field(
        None,
        ge=0,
        description="Weight decay (decoupled for adamw). Default: the optimizer's own "
        "(0.01 for adamw, else 0).",
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="constant, or cosine decay to 0 over schedule.max_epochs."
    )
    warmup_epochs: float = Field(0, ge=0, description="Linear learning-rate warm-up, in epochs.")
    grad_clip: Optional[float] = Field(None, gt=0, description="Clip the gradient norm to this.")
    eval_batch_size: int = Field(1024, ge=1, description="Batch size of evaluation.")
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed of weights and shuffling (the same for every trial)."
    )
    loader_workers: int = Field(
        0, ge=0, description="DataLoader worker processes (datasets not held in memory)."
    )
    prefetch: bool = Field(
        True,
        description="GPU: copy the next batch to the device on a side CUDA stream, and turn "
        "stored integers into floats there, while the current batch computes. CPU: plain "
        "iteration (no effect).",
    )
    channels_last: bool = Field(
        False,
        description="Image models and inputs in channels_last memory format (NHWC): faster "
        "convolutions with AMP on tensor-core GPUs. Ignored for inputs that are not images.",
    )
    compile: bool = Field(
        False,
        description="torch.compile the model (in place, so checkpoints keep their keys); "
        "costs compile time when a trial starts and on new batch shapes.",
    )
    find_batch_size: bool = Field(
        False,
        description="Before training, find the largest micro-batch that fits in memory (binary "
        "search, OOM caught) up to the per-worker batch. batch_size, so the effective batch, "
        "stays as set; only the micro-batch (accumulation) changes. Not with fsdp.",
    )
    tf32: bool = Field(
        True,
        description="CUDA: fp32 matmuls and convolutions on TF32 tensor cores (Ampere and later; "
        "10-bit mantissa inputs, fp32 accumulation), several times faster than IEEE fp32. "
        "Matters where amp is off; false for IEEE fp32. CPU: no effect.",
    )
    threads: Optional[int] = Field(
        None,
        ge=1,
        description="torch's threads per worker (intra-op). Default: resources.cpus_per_worker "
        "(more oversubscribes the node).",
    )
    autotune: Union[bool, int] = Field(
        False,
        description="Before the first trial, measure short arms of the space's model sizes on "
        "the trials' device (amp, compile, channels_last, loader_workers on a GPU; compile, "
        "channels_last, threads on CPU) and run every trial with the fastest whose loss stays "
        "within 5% of the fp32 eager arm; settings search.params searches are kept. A number: "
        f"its budget in seconds; true: {DEFAULT_BUDGET_S}; false or 0: off. Choices are cached "
        "per model, device and torch version (docs: GPUs, training.autotune).",
    )

    @field_validator("amp", mode="before")
    @classmethod
    def _yaml_amp(cls, value: Any) -> Any:
        return amp_from_yaml(value)

    @field_validator("autotune", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> int:
        if isinstance(value, bool):  # true: the default budget; false: off
            return DEFAULT_BUDGET_S if value else 0
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"must be true, false or a budget in whole seconds >= 0, got {value!r}")
        return value

    @field_validator("optimizer")
    @classmethod
    def _known_optimizer(cls, value: str) -> str:
        return one_of(value, catalogue.OPTIMIZERS, "optimizer")


def amp_from_yaml(value: Any) -> Any:
    """YAML 1.1 reads `amp: off` as false (and `on` as true): take them as off and auto."""
    if value is False:
        return "off"
    if value is True:
        return "auto"
    return value


FAIL_FAST_DEFAULT = 3


class FailureSection(Section):
    """Checkpoints, retries, and when failing trials stop the sweep."""

    max_failures: int = Field(
        0, ge=0, description="Retries of a crashed trial, each from its last checkpoint."
    )
    fail_fast: Union[bool, int] = Field(
        FAIL_FAST_DEFAULT,
        description="Stop the sweep when the first N trials to end all failed with the same error "
        "(their code raised it: a missing file, a bug), saying it in one line; status failed, "
        "exit 1, and `tuner resume` runs the rest once it is fixed. A trial that ends any other "
        "way first (finished, stopped early, diverged, oom, timeout) lets the sweep run on. "
        f"0 or false: never; true: {FAIL_FAST_DEFAULT}.",
    )

    @field_validator("fail_fast", mode="before")
    @classmethod
    def _count(cls, value: Any) -> int:
        if isinstance(value, bool):  # as Ray's FailureConfig(fail_fast=True) reads
            return FAIL_FAST_DEFAULT if value else 0
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"must be a whole number >= 0 (0: never) or true/false, got {value!r}")
        return value

    oom_retries: int = Field(
        3,
        ge=0,
        description="task.command: a script that runs out of memory (torch's out-of-memory error "
        "in its output) ends its trial as failure oom; with a batch-size placeholder in the "
        "command ({batch_size}, or any name ending in batch_size) it first runs again from its "
        "last checkpoint with that value halved, up to this many times (the record says so: "
        "trial.log, oom_retries in its epochs). 0: never. tuner's loop and ctx.step back off "
        "inside the trial instead, keeping the effective batch (training.min_micro_batch).",
    )
    keep_checkpoints: int = Field(
        2,
        ge=1,
        description="Checkpoints kept per trial (newest), besides the best epoch's weights "
        "(best_eNNNNNN.pt).",
    )


class SweepConfig(Section):
    """A whole sweep: what to train, how to search, and where results go."""

    # Where the sweep's own modules are imported from (config.functions.code_dirs): set by
    # load_sweep, recorded in the sweep directory, handed to every trial. Not a YAML key.
    _code_dirs: list[str] = PrivateAttr(default_factory=list)

    @property
    def code_dirs(self) -> list[str]:
        return list(self._code_dirs) or [os.getcwd()]

    @code_dirs.setter
    def code_dirs(self, dirs: list[str]) -> None:
        self._code_dirs = list(dirs)
        self._fingerprint = None

    _fingerprint: Optional[dict[str, Any]] = PrivateAttr(default=None)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What makes two sweeps the same task (tuner.config.fingerprint), computed once: the
        user modules' files are read at the first ask, so code.json, warm starts and the
        autotune cache key agree even when a file changes while the sweep starts."""
        if self._fingerprint is None:
            task = self.task.model_dump(mode="json")
            self._fingerprint = task_fingerprint(task, self.objectives, self.code_dirs)
        return self._fingerprint

    name: str = Field(
        description="Sweep name; results go to <output>/<name>. One directory name: letters, "
        "digits, '.', '_' and '-', not '.' or '..'.",
        pattern=r"^[A-Za-z0-9._-]+$",
        max_length=255,  # NAME_MAX of common filesystems
    )
    task: TaskSection
    metric: MetricField = Field(
        "val_acc",
        description="What to optimise: any value the trials report each epoch (val_acc, "
        "val_loss, train_loss, num_params, or val_<name> of task.metrics); or a list of them, "
        "several objectives: the sweep finds their Pareto front (summary.json's pareto); the "
        "first is what best and the ranking use (docs/how-to/search-space.md#several-objectives).",
    )
    direction: DirectionField = Field(
        None,
        description=f"max or min (a list, one per metric, with several). Default for the "
        f"metrics tuner knows ({', '.join(OBJECTIVES)}): max for val_acc, min for the others; "
        "required for any other metric. `mode` is its older spelling, still read.",
    )
    search: SearchSection = Field(default_factory=SearchSection)
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    failure: FailureSection = Field(default_factory=FailureSection)
    notify: NotifySection = Field(default_factory=NotifySection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    output: str = Field(
        "runs",
        description="Directory under which <name>/ is written: a local path, a path every node of "
        "a cluster mounts (NFS), or object storage (s3://bucket/prefix; endpoint and credentials "
        "from the environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).",
    )

    @model_validator(mode="before")
    @classmethod
    def _yaml_amp_param(cls, raw: Any) -> Any:
        # The same YAML trap inside search.params.amp (bare value, or choice/grid values).
        # Re-run on assignment (validate_assignment) with sections already parsed: skip then.
        search = raw.get("search") if isinstance(raw, dict) else None
        params = search.get("params") if isinstance(search, dict) else None
        if isinstance(params, dict) and "amp" in params:
            amp = params["amp"]
            if isinstance(amp, dict) and isinstance(amp.get("values"), list):
                params["amp"] = {**amp, "values": [amp_from_yaml(v) for v in amp["values"]]}
            else:
                params["amp"] = amp_from_yaml(amp)
        return raw

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, raw: Any) -> Any:
        return older_spelling(raw)  # `mode:` of the files written before `direction:`

    @field_validator("metric", "direction", mode="before")
    @classmethod
    def _objective_shape(cls, value: Any, info: ValidationInfo) -> Any:
        return metric_shape(value) if info.field_name == "metric" else direction_shape(value)

    @field_validator("output")
    @classmethod
    def _a_directory(cls, value: str) -> str:
        # s3:// is read back through tuner's handle of the place (sweepdir/place.py); other
        # URIs trained their trials and then reported nothing (issue 26 item 5): refused, as
        # is a key with `..` in it (config/storage.py).
        return checked_output(value)

    @field_validator("name")
    @classmethod
    def _one_directory(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError(
                f"'{value}' is not a directory of its own (it would write into output or its parent)"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        check_task(self.task)  # the fields of one mode, and those it needs
        each = directions(self.metric, self.direction)
        self.__dict__["direction"] = each if isinstance(self.metric, list) else each[0]  # (no re-validation)
        check_several(len(each), self.algorithm)
        scheduler = check_pair(self)  # the algorithm with its scheduler
        if scheduler.clones and self.schedule.pbt.perturb is None:
            # Resolved once, as sweep.yaml then records it (no re-validation).
            self.schedule.pbt.__dict__["perturb"] = perturbed(self)
        if "autotune" in self.search.params:
            raise ConfigError(
                "search.params.autotune",
                "training.autotune is the sweep's, not a trial's: set it under training",
            )
        self.trial_mode.check(self)  # what its mode refuses: tuner's loop, your loop, your script
        check_constraints(self.search, self.hyperparameters())
        check_start_with(self.search, self.hyperparameters())
        fit = self.hyperparameters().get("find_batch_size")
        if self.resources.strategy == "fsdp" and True in (values_of(fit) or []):
            # A rank that runs out of memory inside a sharded forward leaves the others
            # waiting in an all-gather for ever; the probe cannot be made safe there.
            where = "search.params" if "find_batch_size" in self.search.params else "training"
            raise ConfigError(f"{where}.find_batch_size", "does not work with resources.strategy: fsdp")
        return self

    @property
    def algorithm(self) -> Algorithm:
        """The search algorithm's record (tuner.config.algorithms)."""
        return self.search.record

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler the sweep runs with (tuner.config.schedulers): schedule.scheduler, or
        what schedule.early_stopping and the algorithm choose."""
        return check_pair(self)

    @property
    def trial_mode(self) -> Mode:
        """How its trials run: the mode its task section chooses (config.modes)."""
        return mode_of(self.task)

    @property
    def objectives(self) -> list[tuple[str, str]]:
        """(metric, direction) of each objective, the first first."""
        return pairs(self.metric, self.direction)

    @property
    def objective(self) -> str:
        """The first objective's metric: what best, the ranking and Ray Tune's own metric use."""
        return self.objectives[0][0]

    @property
    def objective_direction(self) -> str:
        """The first objective's direction (max or min): with `objective`, what best and the
        ranking use (`direction` is the field as written: one, or a list with several)."""
        return self.objectives[0][1]

    def expected_trials(self) -> int:
        """Trials the sweep runs in all: num_samples, or for grid search the grid's size and
        the start_with configurations run before it."""
        if self.algorithm.runs_grid:
            grid = grid_configs(self.hyperparameters(), self.search.grid_points, self.search.constraints)
            return len(grid) + len(self.search.start_with)
        return self.search.num_samples

    def hyperparameters(self) -> dict[str, ParamT]:
        """The trial-facing parameters: training settings, overlaid by search.params. Those of
        the settings the trial mode gives its trials (`Mode.training_given`: a script none, your
        loop what ctx applies) and those the sweep file sets."""
        given, chosen = self.trial_mode.training_given, self.training.model_fields_set
        base: dict[str, ParamT] = {
            k: Fixed(value=v)
            for k, v in self.training.model_dump().items()
            if v is not None and (given is None or k in given or k in chosen)
        }
        base.update(self.search.params)
        return base
