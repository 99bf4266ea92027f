"""The checks of `task.command` against the rest of the sweep file: every parameter reaches
the script one way (a placeholder, or the environment), and nothing is set that only tuner's
own loop would read: the `command` mode's check (config.modes), before Ray starts."""

from __future__ import annotations

from pydantic import BaseModel

from tuner.config.algorithms import ALGORITHMS
from tuner.config.placeholders import BUILTINS, env_name, placeholders
from tuner.config.resources import ResourcesSection
from tuner.config.schedulers import needs_early_stopping
from tuner.config.task import TaskSection
from tuner.errors import ConfigError, warn
from tuner.space.conditions import conditions
from tuner.space.params import ParamT


def check_command(
    task: TaskSection,
    params: dict[str, ParamT],
    algorithm: str,
    training: BaseModel,
    resources: ResourcesSection,
) -> None:
    """Refuse a command whose placeholders and search.params do not meet one to one (unless
    env_params says how the rest reach it), and settings only tuner's own loop honours."""
    assert task.command, "the command mode's check without a command (validation refuses an empty one)"
    for name in params:
        if name in BUILTINS:  # it would replace what tuner fills in, in every trial
            raise ConfigError(
                f"search.params.{name}",
                f"is the name of a placeholder tuner fills ({{{name}}}: {BUILTINS[name]}); "
                "give the parameter another name",
            )
    used = placeholders(task.command)
    for name in used:
        if name not in params and name not in BUILTINS:
            known = ", ".join([*params, *BUILTINS])
            raise ConfigError("task.command", f"placeholder {{{name}}} names no parameter (known: {known})")
        if name in params and conditions(params[name]):
            raise ConfigError(
                "task.command",
                f"placeholder {{{name}}}: search.params.{name} has a when: condition and is absent "
                "from some trials; list it in task.env_params and read it from the environment",
            )
    from_env = list(params) if task.env_params is True else (task.env_params or [])
    for name in from_env:
        if name not in params:
            raise ConfigError("task.env_params", f"'{name}' is not a parameter of search.params")
    for name in params:
        if name not in used and name not in from_env:
            raise ConfigError(
                f"search.params.{name}",
                f"does not reach the command: use {{{name}}} in task.command, or list it in "
                f"task.env_params (the script then reads {env_name(name)} or $TUNER_CONFIG_JSON)",
            )
    for name, field in type(training).model_fields.items():
        if getattr(training, name) != field.get_default():
            raise ConfigError(
                f"training.{name}",
                "task.command runs your script, which would ignore it: pass it as a parameter "
                "(search.params and a {placeholder})",
            )
    _check_resources(resources, task.launcher)
    if needs_early_stopping(ALGORITHMS[algorithm]) and not task.checkpoints:
        warn(
            "task.checkpoints is false: bohb only stops trials (never pauses them), and a trial "
            "retried or resumed after an interruption starts again at epoch 1"
        )


def _check_resources(res: ResourcesSection, launcher: object) -> None:
    if res.gpus_per_worker == "pack":
        raise ConfigError(
            "resources.gpus_per_worker",
            "pack measures tuner's own loop; with task.command give each trial a share (0.25) or 1",
        )
    if res.workers_per_trial > 1 and launcher is None:
        raise ConfigError(
            "resources.workers_per_trial",
            "task.command runs one process per trial; set task.launcher: torchrun to run one per worker",
        )
    if res.strategy != "ddp":
        raise ConfigError("resources.strategy", "task.command runs your script, which chooses its own")
