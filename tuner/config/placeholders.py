"""`task.command`'s {name} placeholders and the argument list a trial runs.

Shared by validation (config.task, config.command: before Ray starts) and the trial that fills
the placeholders (tuner.trial.script.run), so both read a command the same way.
"""

from __future__ import annotations

import json
import re
import shlex
import string
from typing import Any, Union

# Placeholders every command may use besides the parameters of search.params (no parameter
# may take their names), and what they are.
BUILTINS = {
    "max_epochs": "schedule.max_epochs",
    "trial_dir": "the trial's directory",
    "trial_id": "the trial's id",
}
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
