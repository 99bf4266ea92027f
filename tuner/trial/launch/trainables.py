"""The Tune trainable: the loop in the trial actor (1 worker) or in DDP workers.

What trains is the trial's mode (`tuner.config.modes`: tuner's loop, the user's loop or script),
whose function is imported here, in the trial's processes, by the name its record gives. A mode
whose trial actor holds every worker (a script under torchrun) always runs in the actor.

One worker: the loop runs right here, in the (reused) Tune actor. More workers, on one node
or several, with any output: this (reused) actor starts the workers itself, or takes those
its last trial left (`trial.launch.ranks`), and forwards rank 0's (already reduced) metrics
to Tune.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tuner import timeline
from tuner.config.modes import MODES
from tuner.trial.frame.spec import TrialSpec

# How long a reused trial actor waits for a stopped trial's loop to end before it starts the
# next trial: the loop unwinds from its report (the scheduler's stop) through its `finally`
# blocks and the frame's clean-up (the GPU memory handed back). Tune waits 2 s
# (TUNE_FUNCTION_THREAD_TIMEOUT_S), then fails the *next* trial ("Could not re-use actor"):
# on an H200 a packed trial's wind-down took longer, and a user's loop that saves its work in
# a `finally` may take seconds anywhere. Read by Tune in this process at each reuse; a value
# the user set in the environment is kept.
WIND_DOWN_S = 300

# The mode's function (and torch) are imported inside the trainables: they run in the trial processes,
# and the driver, which only names these functions, then starts without importing torch.


def in_actor_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable for one worker per trial."""
    trial = _marked_trial()
    try:
        from tuner.trial.frame.session import TuneSession

        _allow_wind_down()
        session = TuneSession(
            spec.sweep_dir,
            spec.keep_checkpoints,
            spec.metric,
            spec.direction,
            spec.also,
            storage=spec.storage,
        )
        session.show(config, spec.perturbed)
        train = MODES[spec.trial_mode].function()
        timeline.mark("loaded", trial=trial)
        train(config, spec, session)
        if not session.reported:  # (restored at its last epoch, or ended by its own code at once)
            from ray import tune

            from tuner.trial.frame.journal import report_again

            report_again(session.trial_dir, tune.report)
    finally:
        timeline.mark("trial_end", trial=trial)


def group_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable for several workers, started by this actor."""
    trial = _marked_trial()
    try:
        from tuner.trial.launch.ranks import run_group

        _allow_wind_down()
        run_group(config, spec)
    finally:
        timeline.mark("trial_end", trial=trial)


def _marked_trial() -> str:
    """The trial's id, its start marked on the sweep's timeline (tuner.timeline), when kept."""
    if not os.environ.get(timeline.ENV):
        return ""
    from ray import tune

    trial = str(tune.get_context().get_trial_id())
    timeline.mark("trial", trial=trial)
    return trial


def _allow_wind_down() -> None:
    """WIND_DOWN_S for Tune's wait at this actor's next reuse, unless the user set one."""
    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", str(WIND_DOWN_S))


def trainable_for(spec: TrialSpec) -> Callable[..., None]:
    """The function Tune runs for every trial of the sweep."""
    if MODES[spec.trial_mode].in_actor(spec.workers):
        return in_actor_trial
    return group_trial
