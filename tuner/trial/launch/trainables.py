"""The Tune trainable: the loop in the trial actor (1 worker) or in DDP workers.

The loop is tuner's own (`trial.loop.run`) or the user's (`task.train`, `trial.userloop.run`), or
the user's script (`task.command`, `trial.script.run`), which always runs in the trial actor:
with torchrun, that actor holds every worker's resources and runs all of its processes.

One worker: the loop runs right here, in the (reused) Tune actor. More workers, on one node
or several, with any output: this actor starts the workers itself (`trial.launch.ranks`) and
forwards rank 0's (already reduced) metrics to Tune.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.trial.frame.spec import TrialSpec
from tuner.trial.launch.loops import loop_for

# The loop (and torch) are imported inside the trainables: they run in the trial processes,
# and the driver, which only names these functions, then starts without importing torch.


def in_actor_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable for one worker per trial."""
    from tuner.trial.frame.session import TuneSession

    session = TuneSession(
        spec.sweep_dir, spec.keep_checkpoints, spec.metric, spec.mode, spec.also, storage=spec.storage
    )
    loop_for(spec)(config, spec, session)


def group_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable for several workers, started by this actor."""
    from tuner.trial.launch.ranks import run_group

    run_group(config, spec)


def trainable_for(spec: TrialSpec) -> Callable[..., None]:
    """The function Tune runs for every trial of the sweep."""
    if spec.workers == 1 or spec.command is not None:
        return in_actor_trial
    return group_trial
