"""The sweep's life in the sweep file: its epoch budget and early stopping (`schedule`), its
time budget and target, who is told when it ends (`notify`), where it is tracked (`tracking`)."""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Any, Literal, Optional, Union
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator, model_validator

from tuner.config.base import Section, one_of
from tuner.config.population import PopulationSection
from tuner.config.schedulers import SCHEDULERS
from tuner.errors import ConfigError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def seconds(value: Union[str, float, int]) -> float:
    """A duration: seconds as a number, or a string of hours, minutes and seconds such as
    `30m`, `2h`, `1h30m` or `90s` (a bare number in the string is seconds)."""
    if isinstance(value, (int, float)):
        out = float(value)
    else:
        text = str(value).strip().replace(" ", "")
        try:
            out = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"'{value}' is not a duration (e.g. 90, 90s, 30m, 2h, 1h30m)") from None
            out = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not out > 0:
        raise ValueError("must be > 0")
    return out


def rungs(grace_epochs: int, max_epochs: int, reduction_factor: float) -> list[int]:
    """The epochs at which ASHA compares a trial with those that reached them before it.

    Ray's milestones (AsyncHyperBandScheduler, one bracket) are grace_epochs * factor**k for
    k < int(log(max/grace) / log(factor) + 1), in floating point as here; one at max_epochs
    compares nothing (a trial stops there first). A trial reports whole epochs, so it meets a
    milestone at the first epoch at or past it.
    """
    count = int(math.log(max_epochs / grace_epochs) / math.log(reduction_factor) + 1)
    milestones = (grace_epochs * reduction_factor**k for k in range(count))
    return sorted({math.ceil(m) for m in milestones if m < max_epochs})


def budgets(schedule: ScheduleSection) -> list[int]:
    """The budgets (epochs) at which BOHB's model learns: ASHA's rungs, then max_epochs."""
    s = schedule
    return rungs(s.grace_epochs, s.max_epochs, s.reduction_factor) + [s.max_epochs]


class CurveSection(Section):
    """The curve stopper (schedule.scheduler: curve)."""

    threshold: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="A trial stops once the probability that it beats the best value any trial "
        "has reached, by schedule.max_epochs, falls below this (its learning curve extrapolated "
        "by an ensemble of curve families, Domhan et al. 2015). Lower stops fewer trials, later.",
    )


class ScheduleSection(Section):
    """Epoch budget, early stopping, and when the sweep as a whole ends."""

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
    scheduler: Optional[str] = Field(
        None,
        description=f"What decides which trials go on: {' | '.join(SCHEDULERS)} (fifo: every trial "
        "trains to max_epochs; asha: poor trials stop at rungs; moasha: asha ranking several "
        "objectives by Pareto fronts; median: a trial worse than the others' median stops; curve: "
        "a trial whose extrapolated learning curve is unlikely to beat the best stops, "
        "schedule.curve; pbt, pb2: population-based training, schedule.pbt). Default: the "
        "algorithm's (asha for random, optuna and bohb, fifo for grid), fifo with several "
        "objectives (docs/explanation/algorithms.md).",
    )
    early_stopping: Optional[bool] = Field(
        None,
        description="Stop poor trials early: true is schedule.scheduler asha (moasha with several "
        "objectives), false fifo. Default: on for random and optuna, off for grid and with "
        "several objectives; bohb always uses it (asynchronous BOHB).",
    )
    curve: CurveSection = Field(
        default_factory=CurveSection,
        description="The curve stopper (schedule.scheduler: curve): when a trial's extrapolated "
        "learning curve stops it.",
    )
    pbt: PopulationSection = Field(
        default_factory=PopulationSection,
        description="Population-based training (schedule.scheduler: pbt or pb2): how often and how "
        "the population is perturbed (docs/how-to/population.md).",
    )
    trial_timeout: Optional[float] = Field(
        None,
        gt=0,
        description="Seconds a trial may go without finishing an epoch (counted from its start, "
        "then from each epoch; not while it waits in its report for the sweep's driver) before it "
        "is ended as failure: timeout; the sweep goes on. In a trial of several workers it is "
        "also how long a rank waits for the others in one collective. Default: no limit (a "
        "rank that raises or dies still ends its trial at once).",
    )
    time_budget: Optional[float] = Field(
        None,
        description="Wall-clock budget of the sweep: seconds, or e.g. 30m, 2h, 1h30m. Once spent, "
        "no trial starts and running ones stop at their next report; status budget, exit 0. "
        "Counted from the start of this run (a resumed or extended sweep gets it afresh).",
    )
    stop_at: Optional[float] = Field(
        None,
        description="Target of the metric (in its direction: >= for max, <= for min): the sweep "
        "ends as soon as a trial reports it; status target_reached, exit 0.",
    )

    @field_validator("scheduler")
    @classmethod
    def _known_scheduler(cls, value: Optional[str]) -> Optional[str]:
        return value if value is None else one_of(value, SCHEDULERS, "scheduler")

    @field_validator("time_budget", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Optional[float]:
        if value is None or isinstance(value, bool):
            return value  # bool: refused by the type check as "must be a number"
        return seconds(value)

    @model_validator(mode="after")
    def _grace_fits(self) -> ScheduleSection:
        if self.grace_epochs > self.max_epochs:
            raise ConfigError("schedule.grace_epochs", "must be <= schedule.max_epochs")
        return self


class NotifySection(Section):
    """Who is told when the sweep ends."""

    webhook: Optional[str] = Field(
        None,
        description="http(s) URL that gets a JSON POST when the sweep ends, fails or is interrupted "
        "(name, status, best, counts, where the results are). A failed POST is a warning. "
        "Also --notify URL.",
    )

    @field_validator("webhook")
    @classmethod
    def _http_url(cls, value: Optional[str]) -> Optional[str]:
        return value if value is None else webhook_url(value, "notify.webhook")


def webhook_url(value: str, field: str) -> str:
    """`value` if it is an http(s) URL with a host, else a ConfigError naming `field` (the URL
    itself is not repeated: it may hold credentials)."""
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(field, "must be an http:// or https:// URL with a host")
    return value


def redacted(url: str) -> str:
    """A webhook URL fit to print: scheme and host only (user, password, path and query of
    webhook URLs are often their secret)."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}/..."


def without_credentials(url: str) -> str:
    """`url` without the user:password part, as a file may keep it (the path and query stay:
    the address cannot work without them)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class MLflowSection(Section):
    """MLflow tracking: a run per trial, nested under a run of the sweep."""

    uri: str = Field(
        description="Tracking URI: a server (http://127.0.0.1:5000) or a local database "
        "(sqlite:///mlflow.db). Needs the mlflow extra: pip install 'tuner[mlflow]'.",
        min_length=1,
    )
    experiment: Optional[str] = Field(None, description="MLflow experiment. Default: the sweep's name.")

    @field_validator("uri")
    @classmethod
    def _installed(cls, value: str) -> str:
        if importlib.util.find_spec("mlflow") is None:
            raise ValueError("needs MLflow: pip install 'tuner[mlflow]' (or mlflow-skinny)")
        return value


class WandbSection(Section):
    """Weights & Biases tracking: a run per trial, grouped by the sweep."""

    project: Optional[str] = Field(None, description="W&B project. Default: the sweep's name.", min_length=1)
    entity: Optional[str] = Field(
        None,
        description="W&B entity (user or team). Default: W&B's own (WANDB_ENTITY, your default).",
        min_length=1,
    )
    group: Optional[str] = Field(
        None, description="The group the sweep's runs share. Default: the sweep's name.", min_length=1
    )
    mode: Optional[Literal["online", "offline", "disabled"]] = Field(
        None,
        description="online (logs to the W&B server), offline (files only, `wandb sync` later) or "
        "disabled. Default: W&B's own (WANDB_MODE, else online).",
    )
    tags: list[str] = Field(default_factory=list, description="Tags of every run of the sweep.")

    @model_validator(mode="before")
    @classmethod
    def _installed(cls, value: Any) -> Any:
        if importlib.util.find_spec("wandb") is None:
            raise ValueError("needs Weights & Biases: pip install 'tuner[wandb]' (or wandb)")
        return value


class TrackingSection(Section):
    """Experiment trackers the sweep logs to, besides its own directory and TensorBoard."""

    mlflow: Optional[MLflowSection] = Field(
        None, description="Log every trial to MLflow (params, per-epoch metrics, status)."
    )
    wandb: Optional[WandbSection] = Field(
        None,
        description="Log every trial to Weights & Biases as a run (config, per-epoch metrics, "
        "status), grouped by the sweep; `wandb: {}` takes every default. Credentials as W&B reads "
        "them (WANDB_API_KEY, `wandb login`), never in the sweep directory.",
    )
