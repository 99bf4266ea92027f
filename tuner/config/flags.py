"""The command-line flags that override a sweep file's fields (flags beat the file)."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

import tuner.config.yamlfile as yamlfile
from tuner.config.algorithms import ALGORITHMS
from tuner.errors import ConfigError

# CLI flag -> the field it overrides.
OVERRIDES = {
    "algorithm": "search.algorithm",
    "num_samples": "search.num_samples",
    "seed": "search.seed",
    "max_epochs": "schedule.max_epochs",
    "output": "output",
    "name": "name",
    "notify": "notify.webhook",
}


def add_overrides(p: argparse.ArgumentParser) -> None:
    """The sweep file argument and the flags that override its fields."""
    p.add_argument("file", help="sweep file (YAML), e.g. search_spaces/digits_mlp.yaml")
    p.add_argument("--algorithm", choices=list(ALGORITHMS), help="search.algorithm")
    p.add_argument("--num-samples", type=int, metavar="N", help="search.num_samples")
    p.add_argument("--seed", type=int, help="search.seed")
    p.add_argument("--max-epochs", type=int, metavar="N", help="schedule.max_epochs")
    p.add_argument("--output", metavar="DIR", help="output: results go to DIR/<name>")
    p.add_argument("--name", help="name of the sweep (its directory under output)")
    p.add_argument("--notify", metavar="URL", help="notify.webhook: POST a JSON summary here when it ends")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any field, e.g. --set training.batch_size=128 (VALUE is YAML)",
    )


def add_resume_flag(p: argparse.ArgumentParser) -> None:
    """`sweep --resume-if-exists`, the entrypoint of a job that may be retried (`submit` checks it too)."""
    p.add_argument(
        "--resume-if-exists",
        action="store_true",
        help="if <output>/<name> already holds this sweep (the same file and flags), continue it as "
        "`resume` does (a finished one: nothing to do, exit 0); a different sweep there is refused. "
        "For jobs that may run again: a retried RayJob, a requeued batch job",
    )


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted field -> value, from the flags given (later --set wins)."""
    out = {field: getattr(args, flag) for flag, field in OVERRIDES.items() if getattr(args, flag) is not None}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", f"expected KEY=VALUE, got '{item}'")
        try:
            out[key.strip()] = yamlfile.load(raw)
        except yamlfile.YAMLRefused as err:
            raise ConfigError(key, f"value '{raw}': {err}") from None
        except yaml.YAMLError:
            raise ConfigError(key, f"value '{raw}' is not valid YAML") from None
    return out
