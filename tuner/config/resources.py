"""`resources:` of the sweep file: what each trial asks Ray for (workers, CPUs, GPUs, sharing).

A module of its own, as `task` is: a trial mode's checks (`config.modes`, `config.command`)
read these two sections, and `sections`, which holds the whole sweep file, imports the modes.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from tuner.config.base import Section
from tuner.errors import ConfigError


class ResourcesSection(Section):
    """What each trial gets from Ray."""

    workers_per_trial: int = Field(
        1,
        ge=1,
        description="1: train inside the Tune trial; >1: DDP (or FSDP) workers, started by the "
        "trial on one node when one holds them all, else on as few nodes as can, and kept for the "
        "next trial Tune runs in the same trial actor.",
    )
    cpus_per_worker: float = Field(1, gt=0, description="CPUs per worker (torch threads).")
    gpus_per_worker: Union[Literal["auto", "pack"], float] = Field(
        "auto",
        description="GPUs per worker; fractions (0.25) share a GPU. auto: 1 when the cluster "
        "has GPUs, else 0. pack: measure the peak memory of the space's largest configuration "
        "on one GPU first, then share each GPU among as many trials as fit (1 worker per trial).",
    )
    accelerator_type: Optional[str] = Field(
        None,
        min_length=1,
        description="Only nodes with this kind of GPU, as Ray names it (H100, A100, L4, ...: "
        "ray.util.accelerators); a kind no node has is refused before trials start. "
        "Default: any GPU.",
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
        if isinstance(gpus, (int, float)) and gpus > 1 and workers > 1:
            # Each rank trains on one device; more GPUs per worker would be held and idle.
            raise ConfigError(
                "resources.gpus_per_worker",
                f"{gpus:g}: each worker of a multi-worker trial trains on one GPU; use 1 with "
                f"workers_per_trial: {workers * int(gpus)}",
            )
        if self.accelerator_type is not None and gpus == 0:
            raise ConfigError(
                "resources.accelerator_type",
                f"{self.accelerator_type}: a GPU kind, but gpus_per_worker is 0; "
                "set it to a number, auto or pack",
            )
        if self.strategy == "fsdp" and workers < 2:
            raise ConfigError("resources.strategy", "fsdp shards over workers: set workers_per_trial >= 2")
        return self
