"""Which loop trains a trial: tuner's own, the user's (`task.train`) or the user's script.

Each is imported only when chosen (torch comes with the first two), wherever the trial runs:
the Tune trial actor, or a DDP rank of the trial's own (trial/launch/ranks.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.trial.frame.spec import TrialSpec


def loop_for(spec: TrialSpec) -> Callable[..., Any]:
    """tuner's own training loop, the user's (task.train), or the user's script (task.command)."""
    if spec.command is not None:
        from tuner.trial.script.run import run_command

        return run_command
    if spec.train:
        from tuner.trial.userloop.run import run_own_loop

        return run_own_loop
    from tuner.trial.loop.run import run_trial

    return run_trial
