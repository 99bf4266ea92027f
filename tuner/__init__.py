"""tuner: hyperparameter sweeps of PyTorch models on Ray, from one YAML file.

Public surface: `load_sweep` (read and validate a sweep file), `run_sweep` (run it on Ray),
`SweepConfig` and `ConfigError`. Ray and torch are imported only when a sweep runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.config import ConfigError, SweepConfig, load_sweep

if TYPE_CHECKING:
    from tuner.driver.sweep import SweepOutcome

__all__ = ["ConfigError", "SweepConfig", "load_sweep", "run_sweep"]
__version__ = "0.1.0"


def run_sweep(cfg: SweepConfig, **kwargs: Any) -> SweepOutcome:
    """Run `cfg` on Ray (see tuner.driver.sweep.run_sweep for the keyword arguments)."""
    from tuner.driver.sweep import run_sweep as _run

    return _run(cfg, **kwargs)
