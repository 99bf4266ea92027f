"""The char_lm sweep from Python, as in a notebook: the same task.train contract as the YAML.

In a notebook, run the cells below (or `python search_spaces/notebook_char_lm.py` from the
repository root). The training function must live in a module Ray's workers can import (here
search_spaces/char_lm.py; from a notebook, write yours to a file beside it, e.g. with
`%%writefile my_loop.py`, and name it "my_loop:train"): a function defined in the notebook
itself cannot be imported by name in a trial.
"""

from __future__ import annotations

from typing import Any

import tuner


def sweep_config(**settings: Any) -> tuner.SweepConfig:
    """The sweep as a dict, validated like a sweep file (a ConfigError names a bad field);
    `settings` replace top-level sections or keys (e.g. output=..., schedule={...})."""
    return tuner.parse_sweep(
        {
            "name": "char-lm-notebook",
            "task": {"train": "search_spaces.char_lm:train"},
            "metric": "val_loss",
            "direction": "min",
            "search": {
                "algorithm": "random",
                "num_samples": 4,
                "params": {
                    "lr": {"type": "loguniform", "low": 3e-4, "high": 3e-3},
                    "width": 64,
                    "layers": {"type": "choice", "values": [1, 2]},
                    "heads": 4,
                    "block_size": 64,
                    "chars": 100_000,
                },
            },
            "schedule": {"max_epochs": 4, "grace_epochs": 1, "reduction_factor": 2},
            "resources": {"gpus_per_worker": "auto"},
            "training": {"batch_size": 64, "amp": "auto"},
            "output": "runs",
            **settings,
        }
    )


if __name__ == "__main__":
    outcome = tuner.run_sweep(sweep_config())  # a private local Ray; runtime= for a cluster
    print(outcome.table)
    best = outcome.summary["best"]
    if best:
        print(f"best val_loss {best['metrics']['val_loss']:.3f} (epoch {best['epoch']}): {best['config']}")
