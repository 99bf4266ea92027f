"""`schedule.pbt`: population-based training's settings (schedule.scheduler: pbt or pb2), and
what validate refuses for it before Ray starts.

A population is `search.num_samples` trials trained side by side; every `interval` epochs
they wait for each other, the worst `quantile` of them continue from the best `quantile`'s
checkpoints with a perturbed copy of the donor's configuration (pbt: log ranges multiplied or
divided by `factor`, linear ranges shifted by `shift` of their width, integers rounded,
choices drawn afresh with probability `resample`; pb2: numeric values chosen by a GP bandit
that models how each configuration improved the metric). The parameters perturbed are
`perturb`; the others stay as the donor had them (they go with its weights).

A parameter can be perturbed only where a trial can change it between epochs, continuing
from a checkpoint: not one that changes the weights' shapes (a built-in model's sizes), nor
one whose state would not carry over (the optimizer, the lr schedule, AMP). For tuner's own
loop the training settings it reads again on a resume are known; your loop and your script
read their configuration themselves, so any of their parameters may be perturbed.
Imports neither torch nor Ray.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from tuner import catalogue
from tuner.config.base import Section
from tuner.errors import ConfigError
from tuner.space.params import Fixed, Grid, LogRandInt, LogUniform, RandInt, Uniform

# Training settings tuner's loop applies again when a trial resumes from a checkpoint
# (trial/loop/optim.py: set_hyperparameters; grad clipping and the batch are read each step).
TRAINING_PERTURBABLE = ("lr", "momentum", "weight_decay", "grad_clip", "batch_size", "warmup_epochs")
# Why the other training settings cannot change between epochs.
_TRAINING_FIXED = {
    "optimizer": "the checkpoint's optimizer state is another optimizer's",
    "lr_schedule": "the checkpoint's schedule state is another schedule's",
    "amp": "the checkpoint's gradient scaler is another precision's",
    "seed": "a trial's seed is drawn once, at its start",
}
NUMERIC = (Uniform, LogUniform, RandInt, LogRandInt)


class PopulationSection(Section):
    """Population-based training (schedule.scheduler: pbt or pb2)."""

    interval: Optional[int] = Field(
        None,
        ge=1,
        description="Epochs between perturbations: every trial waits at each multiple of it for the "
        "others, then the worst continue from the best. Default: a quarter of schedule.max_epochs "
        "(at least 1).",
    )
    quantile: float = Field(
        0.25,
        gt=0,
        le=0.5,
        description="Share of the population that continues from another trial at each "
        "perturbation (the worst), and of those it continues from (the best).",
    )
    resample: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Chance that a perturbed parameter is drawn afresh from its range instead of "
        "moved (pbt; pb2: choices only, its model picks numbers).",
    )
    factor: float = Field(
        1.25,
        gt=1,
        description="pbt: a log range's value is multiplied or divided by this.",
    )
    shift: float = Field(
        0.1,
        gt=0,
        le=1,
        description="pbt: a linear range's value moves up or down by this share of its width "
        "(integers by at least 1).",
    )
    perturb: Optional[list[str]] = Field(
        None,
        description="The parameters of search.params that are perturbed; the others go with the "
        "donor's weights unchanged. Default: every searched one a trial can change between epochs "
        "(tuner's loop: lr, momentum, weight_decay, grad_clip, batch_size, warmup_epochs, dropout; "
        "task.train and task.command: all).",
    )

    def every(self, max_epochs: int) -> int:
        """The interval in epochs (its default: a quarter of max_epochs, at least 1)."""
        return self.interval if self.interval is not None else max(1, max_epochs // 4)


def perturbation_epochs(interval: int, max_epochs: int) -> list[int]:
    """The epochs at which the population waits and is perturbed (none at max_epochs)."""
    return list(range(interval, max_epochs, interval))


def _why_fixed(name: str, cfg: Any) -> str:
    """Why tuner's own loop cannot change parameter `name` between epochs ("" if it can)."""
    mode, model = cfg.trial_mode.name, cfg.task.model or ""
    if mode not in ("loop", "hooks") or name in TRAINING_PERTURBABLE or name == "dropout":
        return ""
    if name in _TRAINING_FIXED:
        return _TRAINING_FIXED[name]
    if name in catalogue.MODELS.get(model, {}):
        return "it sizes the model: the donor's weights have the donor's shapes"
    if name in type(cfg.training).model_fields:
        return "tuner's loop reads it once, at a trial's start"
    return ""


def perturbed(cfg: Any) -> list[str]:
    """The parameters a population sweep perturbs: schedule.pbt.perturb, or its default."""
    wanted = cfg.schedule.pbt.perturb
    if wanted is not None:
        return list(wanted)
    mode = cfg.trial_mode.name
    searched = {k: p for k, p in cfg.search.params.items() if not isinstance(p, (Fixed, Grid))}
    if mode in ("loop", "hooks"):
        return [k for k in searched if k in TRAINING_PERTURBABLE or k == "dropout"]
    return list(searched)


def check_population(cfg: Any) -> None:
    """What pbt and pb2 refuse (one line each, the field named): a population of one, an
    interval that leaves no perturbation, nothing to perturb, a parameter that cannot change
    between epochs, a script's checkpoints in object storage."""
    pop, schedule, search = cfg.schedule.pbt, cfg.schedule, cfg.search
    name = schedule.scheduler  # (pbt and pb2 are never a default: named there)
    if search.num_samples < 2:
        raise ConfigError("search.num_samples", f"{name} evolves a population: at least 2 trials")
    every = pop.every(schedule.max_epochs)
    if schedule.max_epochs < 2:  # (no interval has a perturbation before it)
        raise ConfigError(
            "schedule.max_epochs", f"{schedule.max_epochs}: {name} perturbs trials between epochs: at least 2"
        )
    if not perturbation_epochs(every, schedule.max_epochs):
        raise ConfigError(
            "schedule.pbt.interval",
            f"{every} leaves no perturbation before schedule.max_epochs ({schedule.max_epochs}): "
            "make it smaller",
        )
    mode = cfg.trial_mode.name
    for key in pop.perturb or []:
        p = search.params.get(key)
        if p is None:
            raise ConfigError("schedule.pbt.perturb", f"'{key}' is not in search.params")
        if isinstance(p, Fixed):
            raise ConfigError(f"search.params.{key}", "is fixed: schedule.pbt.perturb has nothing to perturb")
        if isinstance(p, Grid):
            raise ConfigError(
                f"search.params.{key}", "a grid's values are taken in turn: perturb a choice instead"
            )
        why = _why_fixed(key, cfg)
        if why:
            raise ConfigError(
                f"search.params.{key}",
                f"cannot change between epochs ({why}); leave it out of schedule.pbt.perturb: it then "
                "goes with the donor's weights",
            )
    chosen = perturbed(cfg)
    if not chosen:
        raise ConfigError(
            "schedule.pbt.perturb",
            "nothing to perturb: search no parameter a trial can change between epochs "
            f"({', '.join(TRAINING_PERTURBABLE)}, dropout), or name yours here",
        )
    if name == "pb2" and not any(isinstance(search.params[k], NUMERIC) for k in chosen):
        raise ConfigError(
            "schedule.pbt.perturb",
            "pb2 models numeric ranges and none is perturbed (choices only): use pbt",
        )
    if mode == "command" and str(cfg.output).startswith("s3://"):
        raise ConfigError(
            "output",
            f"{name} with task.command hands one trial's checkpoint directory to another; with s3:// "
            "output a script's checkpoints stay on the node that wrote them: use a directory every "
            "node mounts",
        )
