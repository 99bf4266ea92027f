"""The sweep file: a typed, validated `SweepConfig` (defaults < YAML < CLI flags).

Every field documents itself (the descriptions feed `tuner schema` and the README), and every
error names the field path it is about, e.g. `search.params.lr.low: must be > 0 for loguniform`.
This module imports neither Ray nor torch, so `tuner validate` answers at once and a bad file
is refused before anything heavy starts.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tuner import yamlfile
from tuner.space import ALGORITHM_KINDS, Fixed, Param, ParamT, grid_size, unsupported, values_of

BUILTIN_MODELS = ("mlp", "cnn", "vit")
BUILTIN_DATA = ("digits", "synthetic", "synthetic_images")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
AMP_MODES = ("off", "bf16", "fp16", "auto")
# Metrics every trial reports each epoch; `metric` must be one of the first three.
OBJECTIVES = {"val_acc": "max", "val_loss": "min", "train_loss": "min"}
# Most trials one sweep may plan: the driver lists grid and random configurations up front
# (a 10^11-point grid took 4 GB before its first trial), and no sweep here needs more.
MAX_TRIALS = 10_000
# Seeds reach numpy's RandomState (searchers) and torch: both take 0..2**32-1 in common.
MAX_SEED = 2**32 - 1

# Hyperparameters the built-in models read: name -> (type, smallest, largest).
MODEL_PARAMS: dict[str, dict[str, tuple[type, float, float]]] = {
    "mlp": {"width": (int, 1, math.inf), "depth": (int, 0, 64), "dropout": (float, 0, 0.99)},
    "cnn": {"channels": (int, 1, 4096), "blocks": (int, 1, 16), "dropout": (float, 0, 0.99)},
    "vit": {
        "patch_size": (int, 1, 1024),
        "width": (int, 8, math.inf),
        "depth": (int, 1, 128),
        "heads": (int, 1, 256),
        "mlp_ratio": (float, 0.25, 16),
        "dropout": (float, 0, 0.99),
    },
}


class ConfigError(Exception):
    """A user mistake in a sweep file or flag; `str()` is one line naming the field path.

    Not a ValueError on purpose: pydantic would wrap it and lose the path.
    """

    def __init__(self, path: str, message: str):
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}" if path else message)


class _Section(BaseModel):
    # validate_default: a float field's int default (warmup_epochs: 0) is 0.0 from the start,
    # as it is once sweep.yaml is read back; allow_inf_nan: `lr: .inf` is no learning rate.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1: `num_samples: true` is a mistake, not one trial.
        if (
            isinstance(value, bool)
            and info.field_name
            and _numeric_only(cls.model_fields[info.field_name].annotation)
        ):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


def _numeric_only(annotation: Any) -> bool:
    """A field that takes numbers and no bool (int, float, Optional[float], "auto" or float)."""
    kinds = get_args(annotation) or (annotation,)
    return bool({int, float} & set(kinds)) and bool not in kinds


class TaskSection(_Section):
    """What is trained: a model family and a dataset."""

    model: str = Field(
        description="Built-in model (mlp, cnn, vit) or 'package.module:function' with "
        "signature fn(config, input_shape, num_classes) -> torch.nn.Module."
    )
    data: str = Field(
        description="Built-in dataset (digits, synthetic, synthetic_images) or "
        "'package.module:function' with signature fn(config) -> (train_dataset, val_dataset) "
        "returning map-style datasets of (x, y)."
    )
    data_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the dataset, e.g. samples/features/classes for synthetic.",
    )

    @field_validator("model", "data")
    @classmethod
    def _known_or_importable(cls, value: str, info: Any) -> str:
        builtin = BUILTIN_MODELS if info.field_name == "model" else BUILTIN_DATA
        if ":" not in value:
            if value not in builtin:
                raise ValueError(
                    f"unknown {info.field_name} '{value}' (built-in: {', '.join(builtin)}; "
                    "or 'package.module:function')"
                )
            return value
        check_importable(value)
        return value


class SearchSection(_Section):
    """How configurations are chosen."""

    algorithm: str = Field(
        "random", description="grid | random | bohb | optuna (see README: Search algorithms)."
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
        "inclusive.",
    )

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        if value not in ALGORITHM_KINDS:
            raise ValueError(f"unknown algorithm '{value}' (valid: {', '.join(ALGORITHM_KINDS)})")
        return value

    @model_validator(mode="after")
    def _expressible(self) -> SearchSection:
        for name, kind in unsupported(self.algorithm, self.params):
            raise ConfigError(
                f"search.params.{name}",
                f"{self.algorithm} cannot search a {kind} parameter (use choice instead)",
            )
        if self.algorithm == "grid":
            size = grid_size(self.params, self.grid_points)
            if size > MAX_TRIALS:
                raise ConfigError(
                    "search.params",
                    f"a grid of {size:,} combinations is more than the {MAX_TRIALS:,} trials a sweep "
                    "may run (fewer values, a smaller grid_points, or random search)",
                )
        return self


class ScheduleSection(_Section):
    """Epoch budget and early stopping."""

    max_epochs: int = Field(10, ge=1, description="Epochs a trial trains at most.")
    grace_epochs: int = Field(
        1,
        ge=1,
        description="Epochs every trial gets before it can be stopped early: ASHA's first rung, and "
        "for bohb also the smallest budget its model learns from.",
    )
    reduction_factor: float = Field(
        3,
        ge=1.1,
        description="ASHA: 1/reduction_factor of trials go on at each rung. At least 1.1: "
        "closer to 1 the rungs (one per power of the factor) grow without bound.",
    )
    early_stopping: Optional[bool] = Field(
        None,
        description="Stop poor trials early with ASHA. Default: on for random and optuna, off "
        "for grid; bohb always uses it (asynchronous BOHB).",
    )
    trial_timeout: Optional[float] = Field(
        None,
        gt=0,
        description="Seconds a trial may go without finishing an epoch (counted from its start, "
        "then from each epoch) before it is ended as failure: timeout; the sweep goes on. "
        "Default: no limit.",
    )

    @model_validator(mode="after")
    def _grace_fits(self) -> ScheduleSection:
        if self.grace_epochs > self.max_epochs:
            raise ConfigError("schedule.grace_epochs", "must be <= schedule.max_epochs")
        return self


class ResourcesSection(_Section):
    """What each trial gets from Ray."""

    workers_per_trial: int = Field(
        1, ge=1, description="1: train inside the Tune trial; >1: DDP (or FSDP) with Ray Train workers."
    )
    cpus_per_worker: float = Field(1, gt=0, description="CPUs per worker (torch threads).")
    gpus_per_worker: Union[Literal["auto", "pack"], float] = Field(
        "auto",
        description="GPUs per worker; fractions (0.25) share a GPU. auto: 1 when the cluster "
        "has GPUs, else 0. pack: measure the peak memory of the space's largest configuration "
        "on one GPU first, then share each GPU among as many trials as fit (1 worker per trial).",
    )
    gpu_memory_margin: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="Share of each GPU's memory no trial counts on (fragmentation, other "
        "processes). Shared GPUs: each trial's memory is capped at its part of the rest.",
    )
    max_trials_per_gpu: int = Field(
        4, ge=1, description="pack: most trials sharing one GPU, however small they are."
    )
    max_concurrent_trials: Optional[int] = Field(
        None, ge=1, description="Trials running at once (default: as many as resources allow)."
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="Multi-worker strategy: ddp (default; every worker holds the whole model) or "
        "fsdp (FSDP2 shards parameters, gradients and optimizer state over the workers, for "
        "models that do not fit one GPU).",
    )

    @field_validator("gpus_per_worker", mode="before")
    @classmethod
    def _gpu_word(cls, value: Any) -> Any:
        # Without this a typo is reported against one member of the union, not the field.
        if isinstance(value, str) and value not in ("auto", "pack"):
            raise ValueError(f"must be a number, auto or pack, not '{value}'")
        return value

    @field_validator("gpus_per_worker")
    @classmethod
    def _gpu_amount(cls, value: Union[str, float]) -> Union[str, float]:
        if isinstance(value, str):
            return value
        if value < 0:
            raise ValueError("must be >= 0, auto or pack")
        if value > 1 and value != int(value):
            raise ValueError("above 1 must be a whole number (Ray shares only fractions of one)")
        return value

    @model_validator(mode="after")
    def _multi_worker(self) -> ResourcesSection:
        gpus, workers = self.gpus_per_worker, self.workers_per_trial
        if gpus == "pack" and workers > 1:
            raise ConfigError(
                "resources.gpus_per_worker",
                "pack shares GPUs between 1-worker trials; set workers_per_trial: 1",
            )
        if isinstance(gpus, (int, float)) and 0 < gpus < 1 and workers > 1:
            # NCCL refuses two ranks of one process group on the same GPU, and Ray may place
            # two workers of a trial on one GPU when each asks for a fraction.
            raise ConfigError(
                "resources.gpus_per_worker",
                f"{gpus:g}: workers of one multi-worker trial need whole GPUs (NCCL cannot put "
                "two ranks on one GPU); use 1, or workers_per_trial: 1",
            )
        if self.strategy == "fsdp" and workers < 2:
            raise ConfigError("resources.strategy", "fsdp shards over workers: set workers_per_trial >= 2")
        return self


class TrainingSection(_Section):
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
    lr: float = Field(1e-3, gt=0, description="Learning rate.")
    optimizer: str = Field("adam", description=f"One of: {', '.join(OPTIMIZERS)}.")
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

    @field_validator("amp", mode="before")
    @classmethod
    def _yaml_amp(cls, value: Any) -> Any:
        return amp_from_yaml(value)

    @field_validator("optimizer")
    @classmethod
    def _known_optimizer(cls, value: str) -> str:
        if value not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer '{value}' (valid: {', '.join(OPTIMIZERS)})")
        return value


def amp_from_yaml(value: Any) -> Any:
    """YAML 1.1 reads `amp: off` as false (and `on` as true): take them as off and auto."""
    if value is False:
        return "off"
    if value is True:
        return "auto"
    return value


class FailureSection(_Section):
    """Checkpoints and retries."""

    max_failures: int = Field(
        0, ge=0, description="Retries of a crashed trial, each from its last checkpoint."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept per trial (newest).")


class SweepConfig(_Section):
    """A whole sweep: what to train, how to search, and where results go."""

    name: str = Field(
        description="Sweep name; results go to <output>/<name>. One directory name: letters, "
        "digits, '.', '_' and '-', not '.' or '..'.",
        pattern=r"^[A-Za-z0-9._-]+$",
        max_length=255,  # NAME_MAX of common filesystems
    )
    task: TaskSection
    metric: str = Field("val_acc", description="Metric to optimise: val_acc, val_loss, ...")
    mode: Optional[Literal["max", "min"]] = Field(
        None, description="max or min; default: max for val_acc, min for losses."
    )
    search: SearchSection = Field(default_factory=SearchSection)
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    failure: FailureSection = Field(default_factory=FailureSection)
    output: str = Field("runs", description="Directory (or storage URI) under which <name>/ is written.")

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

    @field_validator("name")
    @classmethod
    def _one_directory(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError(
                f"'{value}' is not a directory of its own (it would write into output or its parent)"
            )
        return value

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in OBJECTIVES:
            raise ValueError(f"unknown metric '{value}' (valid: {', '.join(OBJECTIVES)})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        if self.search.algorithm == "bohb" and self.schedule.early_stopping is False:
            raise ConfigError(
                "schedule.early_stopping",
                "bohb always stops early (ASHA); use random or optuna to turn it off",
            )
        natural = OBJECTIVES[self.metric]
        if self.mode is None:
            self.mode = natural  # type: ignore[assignment]
        elif self.mode != natural:
            raise ConfigError("mode", f"{self.metric} is to be {natural}imised, not {self.mode}")
        for name, param in self.search.params.items():
            _check_param(name, param, self.task.model, self.training)
        fit = self.hyperparameters()["find_batch_size"]
        if self.resources.strategy == "fsdp" and True in (values_of(fit) or []):
            # A rank that runs out of memory inside a sharded forward leaves the others
            # waiting in an all-gather for ever; the probe cannot be made safe there.
            where = "search.params" if "find_batch_size" in self.search.params else "training"
            raise ConfigError(f"{where}.find_batch_size", "does not work with resources.strategy: fsdp")
        return self

    def hyperparameters(self) -> dict[str, ParamT]:
        """The trial-facing parameters: training defaults, overlaid by search.params."""
        base: dict[str, ParamT] = {
            k: Fixed(value=v) for k, v in self.training.model_dump().items() if v is not None
        }
        base.update(self.search.params)
        return base


def _check_param(name: str, param: ParamT, model: str, training: TrainingSection) -> None:
    path = f"search.params.{name}"
    if name in TrainingSection.model_fields:
        for value in _probe_values(param):
            try:
                setattr(training.model_copy(), name, value)  # validate_assignment checks it
            except ValidationError as err:
                raise ConfigError(path, _message(err.errors()[0], value)) from None
        return
    known = MODEL_PARAMS.get(model)
    if known is None:  # a user model reads whatever it likes
        return
    if name not in known:
        valid = sorted(set(known) | set(TrainingSection.model_fields))
        raise ConfigError(path, f"not a parameter of model '{model}' or training (valid: {', '.join(valid)})")
    kind, low, high = known[name]
    for value in _probe_values(param):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"must be a number, got {value!r}")
        if kind is int and value != int(value):
            raise ConfigError(path, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(path, f"{value!r} is outside {low}..{high}")


def _probe_values(param: ParamT) -> list[Any]:
    listed = values_of(param)
    if listed is not None:
        return listed
    return [param.low, param.high]  # type: ignore[union-attr]


def check_importable(spec: str) -> None:
    """Refuse a 'package.module:function' that cannot be found, without importing torch.

    The module is located (its parent packages are imported, as Python must) and its source
    scanned for a top-level definition of the name; the module itself runs only in trials.
    """
    module, _, attr = spec.partition(":")
    if not module or not attr.isidentifier():
        raise ValueError(f"'{spec}' is not of the form package.module:function")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:
        raise ValueError(f"cannot import module '{module}' ({err})") from None
    if found is None:
        raise ValueError(f"cannot import module '{module}' (not found from {Path.cwd()})")
    origin = found.origin
    if origin and origin.endswith(".py"):
        tree = ast.parse(Path(origin).read_text(), filename=origin)
        if attr not in _top_level_names(tree):
            raise ValueError(f"module '{module}' has no function '{attr}'")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


# ----------------------------------------------------------------------------- loading


def load_sweep(path: Union[str, Path], overrides: Optional[dict[str, Any]] = None) -> SweepConfig:
    """Read, override and validate a sweep file; raises ConfigError with the field path."""
    raw = read_yaml(path)
    for dotted, value in (overrides or {}).items():
        set_dotted(raw, dotted, value)
    return parse_sweep(raw)


def read_yaml(path: Union[str, Path]) -> dict[str, Any]:
    """The file's top-level mapping, or a ConfigError saying what is wrong with it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("", f"{p}: no such file")
    try:
        raw = yamlfile.load(p.read_text())
    except yamlfile.YAMLRefused as err:
        raise ConfigError("", f"{p}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError("", f"{p}: YAML syntax error{where}: {problem}") from None
    if raw is None:
        raise ConfigError("", f"{p}: the file is empty")
    if not isinstance(raw, dict):
        raise ConfigError("", f"{p}: expected a mapping of keys (name:, task:, ...) at the top")
    return raw


def parse_sweep(raw: dict[str, Any]) -> SweepConfig:
    """Validate a raw mapping; the first problem becomes a ConfigError."""
    try:
        return SweepConfig.model_validate(raw)
    except ConfigError:
        raise
    except ValidationError as err:
        first = err.errors()[0]
        path, message = _path(first["loc"]), _message(first)
        # Range checks span two fields, so they name theirs in the message ("low: ...").
        field = re.match(r"^(low|high|values): (.*)$", message)
        if field:
            path, message = f"{path}.{field.group(1)}", field.group(2)
        raise ConfigError(path, message) from None


def set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested mapping, creating mappings on the way."""
    keys = dotted.split(".")
    node = raw
    for key in keys[:-1]:
        nxt = node.get(key)
        if nxt is None:
            nxt = node[key] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(dotted, f"cannot set inside '{key}', which is not a mapping")
        node = nxt
    node[keys[-1]] = value


_PARAM_TAGS = {"uniform", "loguniform", "randint", "lograndint", "choice", "grid", "fixed"}


def _path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    # The discriminated union puts the parameter type in the location; users never wrote it.
    if len(parts) >= 4 and parts[:2] == ["search", "params"] and parts[3] in _PARAM_TAGS:
        del parts[3]
        if parts[-1] == "value":
            parts.pop()
    return ".".join(parts)


def _message(error: dict[str, Any], value: Any = None) -> str:
    kind, msg = error["type"], error["msg"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; `tuner schema` lists the valid keys)"
    msg = re.sub(r"^(Value|Assertion) error, ", "", msg)
    msg = msg[:1].lower() + msg[1:]
    if value is not None and repr(value) not in msg:
        msg = f"{msg} (got {value!r})"
    return msg


def to_yaml(cfg: SweepConfig) -> str:
    """The resolved config as YAML (what a trial really ran with)."""
    data = cfg.model_dump(mode="json", exclude_none=False)
    data["search"]["params"] = {
        k: (p.value if isinstance(p, Fixed) else p.model_dump(mode="json"))
        for k, p in cfg.search.params.items()
    }
    return yamlfile.dump(data)


def settled(cfg: SweepConfig) -> tuple[SweepConfig, str]:
    """(the config as its sweep.yaml reads back, that file's text).

    A sweep runs with the read-back config, so `resume`, which has only the file, rebuilds
    exactly the configurations the first run planned and started (a float field's int
    default once came back as 0.0 and matched no started trial).
    """
    text = to_yaml(cfg)
    return parse_sweep(yamlfile.load(text)), text


def reference_markdown() -> str:
    """The sweep-file reference as a Markdown table, from the field descriptions."""
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                rows.append(f"| **`{path}`** | | {_md(model_doc(sub))} |")
                walk(sub, path + ".")
                continue
            if field.is_required():
                default = "required"
            elif field.default_factory is not None:
                default = f"`{field.default_factory()}`"
            else:
                default = f"`{field.default}`"
            rows.append(f"| `{path}` | {default} | {_md(field.description or '')} |")

    walk(SweepConfig, "")
    return "\n".join(rows) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def model_doc(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


def json_schema() -> dict[str, Any]:
    """JSON Schema of the sweep file, for editors (yaml-language-server)."""
    schema = SweepConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tuner sweep file"
    return schema
