"""The `task` section: what a trial trains. A built-in or your model and data (with your loss
and metrics, optionally), your own loop (`train`), or your own script (`command`).

Each field checked on its own here; which fields go together is the mode's business (the mode
the section chooses: `config.modes`), and the checks of a mode against the rest of the sweep
file are that mode's too (for a command: `config.command`)."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator

from tuner import catalogue
from tuner.config.base import Section
from tuner.config.functions import check_function
from tuner.config.placeholders import placeholders


class TaskSection(Section):
    """What is trained: a model family and a dataset (optionally your loss and metrics), your
    own training loop, or your own training script."""

    model: Optional[str] = Field(
        None,
        description="Built-in model (mlp, cnn, vit) or 'package.module:function' with "
        "signature fn(config, input_shape, num_classes) -> torch.nn.Module (num_classes is "
        "None when the targets are not class indices). Required unless train is set.",
    )
    data: Optional[str] = Field(
        None,
        description="Built-in dataset (digits, synthetic, synthetic_images) or "
        "'package.module:function' with signature fn(config) -> (train_dataset, val_dataset) "
        "returning map-style datasets of (x, y), y of any dtype and shape. Required unless "
        "train is set.",
    )
    data_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the dataset, e.g. samples/features/classes for synthetic.",
    )
    loss: Optional[str] = Field(
        None,
        description="'package.module:function' with signature fn(output, target) -> scalar "
        "tensor, the mean over the batch. Default: cross-entropy (class targets).",
    )
    metrics: Optional[str] = Field(
        None,
        description="'package.module:function' with signature fn(output, target) -> {name: "
        "scalar tensor}, means over the batch; reported as val_<name>, weighted by batch size "
        "over all evaluation batches and workers. Default: acc for class targets.",
    )
    train: Optional[str] = Field(
        None,
        description="Your own training loop instead of tuner's: 'package.module:function' with "
        "signature fn(config, ctx), run in every trial (on every worker); it builds its own "
        "model and data and reports each epoch with ctx.report (docs/how-to/own-loop.md). Not "
        "with model, data, data_args, loss or metrics.",
    )

    command: Optional[Union[str, list[str]]] = Field(
        None,
        description="Your own training script, run as a process per trial: a command line (split "
        "as a shell would, but run without one) or a list of arguments, with {name} filled from "
        "the trial's search.params (and {max_epochs}, {trial_dir}, {trial_id}), e.g. 'python "
        "train.py --lr {lr} --epochs {max_epochs}'. The script reports each epoch with "
        "tuner.report(epoch=..., name=value) or a stdout line (docs/how-to/own-script.md). "
        "Not with model, data, data_args, loss, metrics or train.",
    )
    launcher: Optional[Literal["torchrun"]] = Field(
        None,
        description="torchrun: run the command as `torchrun --nproc-per-node N <command>` with N "
        "= resources.workers_per_trial, in one trial holding all N workers' CPUs and GPUs; only "
        "rank 0's reports count. Default: the command as it is (one process).",
    )
    checkpoints: bool = Field(
        False,
        description="The command saves a checkpoint each epoch (in tuner.checkpoint_dir()) and "
        "resumes from tuner.restore_dir(): a retried, resumed or paused trial then continues "
        "where it was, instead of starting again at epoch 1.",
    )
    env_params: Union[bool, list[str]] = Field(
        False,
        description="Parameters your command reads from the environment (TUNER_PARAM_<NAME>) or "
        "from the JSON file at $TUNER_CONFIG_JSON instead of from a {name} placeholder; true: "
        "all of them. Every other parameter of search.params must have a placeholder.",
    )

    exit_grace: float = Field(
        30.0,
        ge=0,
        description="Seconds the command has to exit after it reported its last epoch (to save "
        "its model, or report a final metric for that epoch) before it is stopped; its epochs are "
        "kept either way, and the trial counts as complete.",
    )

    @field_validator("model", "data")
    @classmethod
    def _known_or_importable(cls, value: Optional[str], info: Any) -> Optional[str]:
        builtin = tuple(catalogue.MODELS) if info.field_name == "model" else catalogue.DATA
        if value is None:
            return value
        if ":" not in value:
            if value not in builtin:
                raise ValueError(
                    f"unknown {info.field_name} '{value}' (built-in: {', '.join(builtin)}; "
                    "or 'package.module:function')"
                )
            return value
        args = ("config", "input_shape", "num_classes") if info.field_name == "model" else ("config",)
        check_function(f"task.{info.field_name}", value, None, args)
        return value

    @field_validator("loss", "metrics")
    @classmethod
    def _hook(cls, value: Optional[str], info: Any) -> Optional[str]:
        if value is not None:
            check_function(f"task.{info.field_name}", value, None, ("output", "target"))
        return value

    @field_validator("train")
    @classmethod
    def _train_callable(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            check_function("task.train", value, None, ("config", "ctx"))
        return value

    @field_validator("command")
    @classmethod
    def _command_shape(cls, value: Optional[Union[str, list[str]]]) -> Optional[Union[str, list[str]]]:
        if value is not None:
            placeholders(value)  # a ValueError names what is wrong with it
        return value
