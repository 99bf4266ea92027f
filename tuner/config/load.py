"""Reading a sweep file: YAML, `--set` overrides, validation into a SweepConfig; and back."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import ValidationError

import tuner.config.yamlfile as yamlfile
from tuner.config.functions import code_dirs, importing_from
from tuner.config.objectives import OLDER_SPELLING
from tuner.config.schedule import without_credentials
from tuner.config.sections import SweepConfig
from tuner.errors import ConfigError, validation_message, warn
from tuner.space.params import KINDS, Fixed

SPELLINGS = ("direction", OLDER_SPELLING)  # max/min: the key, and its older spelling


def load_sweep(
    path: Union[str, Path], overrides: Optional[dict[str, Any]] = None, imports: Sequence[str] = ()
) -> SweepConfig:
    """Read, override and validate a sweep file; raises ConfigError with the field path.

    The sweep's own modules (task.model: "mymod:fn") are found from the current directory,
    then the file's directory, then `imports`; trials import them from the same places."""
    raw = read_yaml(path)
    for dotted, value in (overrides or {}).items():
        if dotted in SPELLINGS and value is not None:  # (replaces the file's, in either spelling)
            for spelling in SPELLINGS:
                raw.pop(spelling, None)
        set_dotted(raw, dotted, value)
    dirs = code_dirs(str(path), *imports)
    with importing_from(dirs):
        cfg = parse_sweep(raw)
    cfg.code_dirs = dirs
    return cfg


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
        path, message = _path(first["loc"]), validation_message(first)
        # Range checks span two fields, so they name theirs in the message ("low: ...").
        field = re.match(r"^(low|high|values|when(?:\.[^:]+)?): (.*)$", message)
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


def _path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    # The discriminated union puts the parameter type in the location; users never wrote it.
    if len(parts) >= 4 and parts[:2] == ["search", "params"] and parts[3] in KINDS:
        del parts[3]
        if parts[-1] == "value":
            parts.pop()
    return ".".join(parts)


# URLs whose user:password a sweep directory never keeps (it is copied, shared, uploaded).
CREDENTIAL_FIELDS = {
    "notify.webhook": "resume and extend take them again from --notify URL",
    "tracking.mlflow.uri": "resume and extend need them from the environment "
    "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or the database's own)",
}


def to_yaml(cfg: SweepConfig, credentials: bool = False) -> str:
    """The resolved config as YAML (what a trial really ran with); URLs without their
    user:password unless `credentials`."""
    data = cfg.model_dump(mode="json", exclude_none=False)
    if not credentials:
        _drop_credentials(data)
    given = cfg.trial_mode.training_given
    if not cfg.trial_mode.reads_training:  # (your script): tuner's loop settings do not apply
        del data["training"]  # (validation keeps them at their defaults, which read back)
    elif given is not None:  # (your loop): what it is given, as `hyperparameters` reads it back
        set_ = cfg.training.model_fields_set
        data["training"] = {k: v for k, v in data["training"].items() if k in given or k in set_}
    data["search"]["params"] = {
        k: (p.value if isinstance(p, Fixed) else _param_yaml(p.model_dump(mode="json", exclude_none=True)))
        for k, p in cfg.search.params.items()
    }
    return yamlfile.dump(data)


def _drop_credentials(data: dict[str, Any]) -> None:
    for dotted, how in CREDENTIAL_FIELDS.items():
        *path, key = dotted.split(".")
        node: Any = data
        for k in path:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(key), str):
            kept = without_credentials(node[key])
            if kept != node[key]:
                node[key] = kept
                warn(f"{dotted}: the sweep directory keeps its URL without the user:password; {how}")


def _param_yaml(data: dict[str, Any]) -> dict[str, Any]:
    """A parameter as written: its type first, `when:` last."""
    when = data.pop("when", None)
    return {**data, "when": when} if when is not None else data


def settled(cfg: SweepConfig) -> tuple[SweepConfig, str]:
    """(the config as its sweep.yaml reads back, that file's text).

    A sweep runs with the read-back config, so `resume`, which has only the file, rebuilds
    exactly the configurations the first run planned and started (a float field's int
    default once came back as 0.0 and matched no started trial).
    """
    text = to_yaml(cfg)
    with importing_from(cfg.code_dirs):  # (this run still has the credentials the file lacks)
        back = parse_sweep(yamlfile.load(to_yaml(cfg, credentials=True)))
    back.code_dirs = cfg.code_dirs
    return back, text
