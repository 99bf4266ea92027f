"""tuner: hyperparameter sweeps of PyTorch models on Ray, from one YAML file.

Public surface: `load_sweep` (read and validate a sweep file), `parse_sweep` (the same from a
dict, e.g. in a notebook), `run_sweep` (run it on Ray), `SweepConfig` and `ConfigError`; for
a training script run by `task.command`: `report`, `checkpoint_dir`, `restore_dir`.
Ray and torch are imported only when a sweep runs (never by `import tuner` in a script).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from tuner.config import ConfigError, SweepConfig, load_sweep, parse_sweep
from tuner.trial.script import checkpoint_dir, report, restore_dir

if TYPE_CHECKING:
    from tuner.cluster.connect import Runtime
    from tuner.driver.sweep import SweepOutcome

__all__ = [
    "ConfigError",
    "SweepConfig",
    "checkpoint_dir",
    "load_sweep",
    "parse_sweep",
    "report",
    "restore_dir",
    "run_sweep",
]
__version__ = "0.1.0"


def run_sweep(cfg: SweepConfig, runtime: Optional[Runtime] = None) -> SweepOutcome:
    """Run `cfg` on Ray: a private local Ray, or the cluster `runtime` names."""
    from tuner.cluster.connect import Runtime as _Runtime
    from tuner.driver.sweep import run_sweep as _run

    return _run(cfg, runtime or _Runtime())
