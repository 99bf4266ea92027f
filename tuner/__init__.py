"""tuner: hyperparameter sweeps of PyTorch models on Ray, from one YAML file.

Public surface: `load_sweep` (read and validate a sweep file), `parse_sweep` (the same from a
dict, e.g. in a notebook), `run_sweep` (run it on Ray), `load_best` (a sweep's best model),
`SweepConfig` and `ConfigError`; for a training script run by `task.command`: `report`,
`checkpoint_dir`, `restore_dir`. Ray and torch are imported only when a sweep runs (torch also
by `load_best`; never by `import tuner` in a script).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from tuner.config import ConfigError, SweepConfig, load_sweep, parse_sweep
from tuner.trial.script.api import checkpoint_dir, report, restore_dir
from tuner.version import __version__ as __version__  # (the version, for users)

if TYPE_CHECKING:
    from torch import nn

    from tuner.cluster.connect import Runtime
    from tuner.driver.sweep import SweepOutcome

__all__ = [
    "ConfigError",
    "SweepConfig",
    "checkpoint_dir",
    "load_best",
    "load_sweep",
    "parse_sweep",
    "report",
    "restore_dir",
    "run_sweep",
]


def run_sweep(cfg: SweepConfig, runtime: Optional[Runtime] = None) -> SweepOutcome:
    """Run `cfg` on Ray: a private local Ray, or the cluster `runtime` names."""
    from tuner.cluster.connect import Runtime as _Runtime
    from tuner.driver.sweep import run_sweep as _run

    return _run(cfg, runtime or _Runtime())


def load_best(sweep_dir: str, model: Optional[nn.Module] = None, trial: Optional[str] = None) -> nn.Module:
    """The sweep's best trial's best weights in its model (eval mode, on the CPU).

    Built-in and `task.model` models are rebuilt from the trial's configuration (user
    functions imported from the current directory). A `task.train` sweep's model is yours:
    pass it built as your loop built it (`model=`); its weights are the `"model"` entry of
    the state your loop reported (`ctx.report(metrics, state=ctx.state_dict(model, opt))`).
    `trial`: that trial's best epoch instead. A ConfigError says why there is none.
    """
    from tuner.view.export import load_best as _load

    loaded: Any = _load(sweep_dir, model, trial)
    return loaded
