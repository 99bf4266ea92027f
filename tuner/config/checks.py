"""Checks of `search.params` against what reads them: the training section and the built-in
models of the catalogue."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from tuner import catalogue
from tuner.errors import ConfigError, validation_message
from tuner.space import ParamT, extremes


def check_param(name: str, param: ParamT, model: str, training: BaseModel) -> None:
    """Refuse a value of `search.params.<name>` that its training field or the built-in model
    would refuse (the whole range: both bounds, or every listed value)."""
    fields = type(training).model_fields
    path = f"search.params.{name}"
    if name in fields:
        for value in extremes(param):
            try:
                setattr(training.model_copy(), name, value)  # validate_assignment checks it
            except ValidationError as err:
                raise ConfigError(path, validation_message(err.errors()[0], value)) from None
        return
    known = catalogue.MODELS.get(model)
    if known is None:  # a user model reads whatever it likes
        return
    if name not in known:
        valid = sorted(set(known) | set(fields))
        raise ConfigError(path, f"not a parameter of model '{model}' or training (valid: {', '.join(valid)})")
    kind, low, high = known[name].kind, known[name].low, known[name].high
    for value in extremes(param):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"must be a number, got {value!r}")
        if kind is int and value != int(value):
            raise ConfigError(path, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(path, f"{value!r} is outside {low}..{high}")
