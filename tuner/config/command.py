"""`task.command`: its {name} placeholders, the argument list a trial runs, and the checks of a
command against the rest of the sweep file (every parameter reaches the script one way).

Shared by validation (here, before Ray starts) and the trial that fills the placeholders
(tuner.trial.command), so both read a command the same way. Imports neither Ray nor torch.
"""

from __future__ import annotations

import json
import re
import shlex
import string
from typing import TYPE_CHECKING, Any, Union

from tuner.errors import ConfigError, warn

if TYPE_CHECKING:
    from tuner.config.sections import SweepConfig

# Placeholders every command may use besides the parameters of search.params.
BUILTINS = ("max_epochs", "trial_dir", "trial_id")
Template = Union[str, list[str]]


def words(template: Template) -> list[str]:
    """The command's arguments before filling: a string is split as a shell would (shlex)."""
    if isinstance(template, str):
        try:
            return shlex.split(template)
        except ValueError as err:  # an unclosed quote
            raise ValueError(f"cannot split the command line ({err})") from None
    return list(template)


def placeholders(template: Template) -> list[str]:
    """The names of the {name} placeholders in `template`, in order, once each; a ValueError
    for an empty command, a bad placeholder ({0}, {a.b}, {lr:.3f}) or a stray brace."""
    args = words(template)
    if not args or not args[0].strip():
        raise ValueError("is empty: give the program and its arguments")
    names: list[str] = []
    for arg in args:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
        except ValueError as err:
            raise ValueError(f"{arg!r}: {err} (write a literal brace as {{{{ or }}}})") from None
        for field in fields:
            if not field.isidentifier():
                raise ValueError(f"{arg!r}: placeholder {{{field}}} is not {{name}} of a parameter")
            if field not in names:
                names.append(field)
    # Formatter.parse accepts '{lr!r}' and '{lr:.2f}' as field 'lr'; refuse them: values are
    # written one way only (as_text), documented.
    for arg in args:
        if re.search(r"(?<!\{)\{[A-Za-z_]\w*[!:][^}]*\}", arg):
            raise ValueError(f"{arg!r}: write a placeholder as {{name}}, without a format or conversion")
    return names


def as_text(value: Any) -> str:
    """A parameter's value as the command and the environment get it: a string as it is,
    anything else as JSON (0.001, 1e-05, 64, true, null, [1, 2])."""
    return value if isinstance(value, str) else json.dumps(value)


def fill(template: Template, values: dict[str, Any]) -> list[str]:
    """The argument list: each word's placeholders filled (a value with spaces stays one word)."""
    text = {k: as_text(v) for k, v in values.items()}
    return [arg.format_map(text) for arg in words(template)]


def env_name(param: str) -> str:
    """The environment variable a parameter is also passed in: TUNER_PARAM_<NAME>."""
    return "TUNER_PARAM_" + re.sub(r"[^A-Za-z0-9]", "_", param).upper()


def check_command(cfg: SweepConfig) -> None:
    """Refuse a command whose placeholders and search.params do not meet one to one (unless
    env_params says how the rest reach it), and settings only tuner's own loop honours."""
    task, params = cfg.task, cfg.search.params
    assert task.command is not None
    used = placeholders(task.command)
    for name in used:
        if name not in params and name not in BUILTINS:
            known = ", ".join([*params, *BUILTINS])
            raise ConfigError("task.command", f"placeholder {{{name}}} names no parameter (known: {known})")
        if name in params and params[name].when:
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
    for name, field in type(cfg.training).model_fields.items():
        if getattr(cfg.training, name) != field.get_default():
            raise ConfigError(
                f"training.{name}",
                "task.command runs your script, which would ignore it: pass it as a parameter "
                "(search.params and a {placeholder})",
            )
    _check_resources(cfg)
    if cfg.search.algorithm == "bohb" and not task.checkpoints:
        warn(
            "task.checkpoints is false: bohb only stops trials (never pauses them), and a trial "
            "retried or resumed after an interruption starts again at epoch 1"
        )


def _check_resources(cfg: SweepConfig) -> None:
    res = cfg.resources
    if res.gpus_per_worker == "pack":
        raise ConfigError(
            "resources.gpus_per_worker",
            "pack measures tuner's own loop; with task.command give each trial a share (0.25) or 1",
        )
    if res.workers_per_trial > 1 and cfg.task.launcher is None:
        raise ConfigError(
            "resources.workers_per_trial",
            "task.command runs one process per trial; set task.launcher: torchrun to run one per worker",
        )
    if res.strategy != "ddp":
        raise ConfigError("resources.strategy", "task.command runs your script, which chooses its own")
