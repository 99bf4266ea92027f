"""What a trial needs to know besides its hyperparameters (built by the driver).

Plain data, importing neither torch nor Ray, so it pickles cheaply into every trial.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Union

from tuner.config.modes import MODES


@dataclass(frozen=True)
class TrialSpec:
    """The static part of every trial of a sweep; hyperparameters come per trial."""

    model: str
    data: str
    data_args: dict[str, Any] = field(default_factory=dict)
    # How the trial runs: a name of tuner.config.modes.MODES (the loop, the user's, a script).
    trial_mode: str = "loop"
    # The user's own loop, 'pkg.mod:fn' (task.train): model and data are then empty.
    train: Optional[str] = None
    # The user's own script (task.command, a template with {name} placeholders), its
    # launcher (torchrun or None) and the parameters it is given (search.params' names).
    command: Optional[Union[str, list[str]]] = None
    launcher: Optional[str] = None
    command_params: tuple[str, ...] = ()
    exit_grace: float = 30.0  # seconds a script has to exit after its last epoch's report
    # The user's loss and metrics hooks ("pkg.mod:fn"); None: tuner's defaults (trial/loop/hooks.py).
    loss: Optional[str] = None
    metrics: Optional[str] = None
    max_epochs: int = 10
    metric: str = "val_acc"
    direction: str = "max"
    # The other objectives' metrics, with several (`metric` is the first): reported too.
    also: tuple[str, ...] = ()
    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    strategy: str = "ddp"
    # Share of GPU memory no trial counts on, and the CUDA context the probe measured (None:
    # an estimate); see tuner.packing.share.
    gpu_memory_margin: float = 0.1
    gpu_context_bytes: Optional[int] = None
    max_failures: int = 0
    oom_retries: int = 3  # a script that ran out of memory runs again with its batch halved
    keep_checkpoints: int = 2
    # Seconds a trial may go without finishing an epoch (None: no limit); see trial/frame/watchdog.py.
    trial_timeout: Optional[float] = None
    # Directory user modules ("pkg.mod:fn") are imported from: where the sweep was started.
    search_path: Optional[str] = None  # where user modules are imported from (os.pathsep-joined)
    start_dir: Optional[str] = None  # the driver's working directory (task.command runs there)
    # Where the sweep's parent is (tuner.sweepdir.place: Place.storage): an absolute local or
    # shared path, or an s3:// URI.
    storage: str = ""
    # The same as a local directory when storage is a path; None for URIs.
    sweep_dir: Optional[str] = None
    # training.autotune's choice per model size (tuner.autotune.Table as JSON); None: off.
    autotune: Optional[dict[str, Any]] = None
    # The parameters a population perturbs (schedule.scheduler: pbt, pb2): each trial shows
    # its values as scalars over the epochs (TensorBoard's config/<name>).
    perturbed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The mode alone says what runs: a field that chooses a mode running another function
        # (command=... in a spec left at the default mode) would be ignored without a word.
        mode = MODES[self.trial_mode]
        other = {f for m in MODES.values() if m.runs != mode.runs for f in m.chosen_by}
        stray = sorted(f for f in other if getattr(self, f, None) is not None)
        if stray:
            raise ValueError(f"TrialSpec: {stray[0]} is set but trial_mode is {self.trial_mode!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trial_dir_for(staging_dir: str, sweep_dir: Optional[str]) -> str:
    """Where a trial writes its files: straight into the sweep directory when storage is a
    local or shared path; else the trial's working directory on its node, which Ray uploads
    to storage (`SyncConfig(sync_artifacts=True)`). (Tune's trial directory, `staging_dir`, is
    the driver's staging copy: on another node it does not exist.)"""
    if sweep_dir is None:
        return os.getcwd()  # Ray 2.60 starts each trial in its working directory
    path = os.path.join(sweep_dir, os.path.basename(staging_dir.rstrip("/")))
    os.makedirs(path, exist_ok=True)
    return path
