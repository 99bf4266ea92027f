"""A training script for population-based training sweeps (task.command; standard library
and `tuner` only): its "training" adds lr to a score each epoch, and its checkpoint (a JSON
file in tuner.checkpoint_dir()) carries the tag of the trial that began it ("born"), so a test
can see whose checkpoint directory a trial was restarted on. A trial tagged 0.05 fails before
its first epoch (a population goes on without it)."""

import json
import os
import sys

import tuner

config = json.load(open(os.environ["TUNER_CONFIG_JSON"]))
lr, tag = float(config["lr"]), float(config["tag"])
if tag == 0.05:
    sys.exit(3)
state = {"born": tag, "score": 0.0, "epoch": 0}
restore = tuner.restore_dir()
if restore:
    with open(os.path.join(restore, "state.json")) as f:
        state = json.load(f)
for epoch in range(state["epoch"] + 1, int(os.environ["TUNER_MAX_EPOCHS"]) + 1):
    state.update(epoch=epoch, score=state["score"] + lr)
    with open(os.path.join(tuner.checkpoint_dir(), "state.json"), "w") as f:
        json.dump(state, f)
    tuner.report(epoch=epoch, score=state["score"], born=state["born"], lr_used=lr)
