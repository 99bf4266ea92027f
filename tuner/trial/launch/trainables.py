"""The Tune trainable: the loop in the trial actor (1 worker) or in DDP workers.

What trains is the trial's mode (`tuner.config.modes`: tuner's loop, the user's loop or script),
whose function is imported here, in the trial's processes, by the name its record gives. A mode
whose trial actor holds every worker (a script under torchrun) always runs in the actor.

One worker: the loop runs right here, in the (reused) Tune actor, and pays no Ray Train
start-up. More workers on one node, in a local or shared sweep directory (`spec.one_node`):
this actor starts the workers itself (`trial.launch.ranks`). Otherwise (workers over several nodes,
or URI storage) it becomes a small driver that runs a `TorchTrainer` whose workers run the same
loop; `TuneReportCallback` forwards rank 0's (already reduced) metrics to Tune. The Train run
is named after nothing but the trial directory it lives in, so a retried or resumed trial
finds its checkpoints and continues instead of starting again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tuner.config.modes import MODES
from tuner.trial.frame.spec import TrialSpec, trial_dir_for

# The mode's function (and torch) are imported inside the trainables: they run in the trial processes,
# and the driver, which only names these functions, then starts without importing torch.

TRAIN_RUN_NAME = "train"


def in_actor_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable for one worker per trial."""
    from tuner.trial.frame.session import TuneSession

    session = TuneSession(
        spec.sweep_dir, spec.keep_checkpoints, spec.metric, spec.mode, spec.also, storage=spec.storage
    )
    MODES[spec.trial_mode].function()(config, spec, session)


def group_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable for several workers on one node, started by this actor."""
    from tuner.trial.launch.ranks import run_group

    run_group(config, spec)


def ddp_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable that drives a Ray Train TorchTrainer (DDP, several workers)."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    ctx = tune.get_context()
    trial_dir = trial_dir_for(ctx.get_trial_dir(), spec.sweep_dir)
    use_gpu = spec.gpus_per_worker > 0
    per_worker = {"CPU": spec.cpus_per_worker}
    if use_gpu:
        per_worker["GPU"] = spec.gpus_per_worker
    trainer = TorchTrainer(
        _ddp_worker,
        train_loop_config={
            "hp": config,
            "spec": spec,
            "trial_dir": trial_dir,
            "trial_id": ctx.get_trial_id(),
        },
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=spec.workers, use_gpu=use_gpu, resources_per_worker=per_worker
        ),
        run_config=ray.train.RunConfig(
            name=TRAIN_RUN_NAME,
            storage_path=_train_storage(spec, trial_dir),
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=spec.keep_checkpoints),
        ),
    )
    trainer.fit()


def _ddp_worker(cfg: dict[str, Any]) -> None:
    from tuner.trial.frame.session import TrainSession

    spec = cfg["spec"]
    local = spec.sweep_dir is not None  # (rank 0 keeps the best epoch's weights there)
    session = TrainSession(cfg["trial_dir"], cfg["trial_id"], spec.metric, spec.mode, spec.also, local)
    MODES[spec.trial_mode].function()(cfg["hp"], spec, session)


def _train_storage(spec: TrialSpec, trial_dir: str) -> str:
    # Train keeps its checkpoints inside the trial's directory: <trial>/train/checkpoint_*.
    if spec.sweep_dir is not None:
        return trial_dir
    return f"{spec.storage.rstrip('/')}/{os.path.basename(trial_dir.rstrip('/'))}"


def trainable_for(spec: TrialSpec) -> Callable[..., None]:
    """The function Tune runs for every trial of the sweep."""
    if MODES[spec.trial_mode].reuses_actors(spec.workers):  # (the trial runs in the actor)
        return in_actor_trial
    return group_trial if spec.one_node else ddp_trial
