"""A synthetic objective whose good region is small and conditional, modelled on the
char-level GRU of issue 32 (benchmarks/tasks/char_gru.py, where adam is good only at learning
rates of 3e-3 and more): the search benchmark's cheap conditional task.

A validation loss (nats per character) falling from 4.2 towards a floor:
- adam's floor is lowest (1.0) at lr 0.006 and rises fast on either side (+0.8 half a decade
  off): about 6% of the space is within reach of the best;
- sgd's floor is 1.15 at best (lr 0.3, momentum 0.95: `momentum` applies only to sgd), so the
  best configurations are all adam;
- sgd with a large learning rate falls fastest: at the first rungs sgd leads, the trap that
  turns a model fitted early away from adam;
- adam diverges above lr 0.05, sgd above 1 (NaN after a few epochs);
- width (16..512) matters a little; noise 0.03/sqrt(epoch), seeded by configuration and epoch.

With a second objective, `cost` (the width, to be minimised), it is the benchmark's task of
several objectives (`both`, `train_both`): its Pareto front is known from every configuration's
curve, without running anything.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

START = 4.2


def floor(c: dict[str, Any]) -> float:
    width_off = math.log2(c["width"] / 128)
    if c["optimizer"] == "adam":
        return 1.0 + 0.8 * (math.log10(c["lr"] / 0.006) / 0.5) ** 2 + 0.02 * width_off**2
    momentum = c.get("momentum", 0.9)
    return 1.15 + 0.6 * math.log10(c["lr"] / 0.3) ** 2 + 4 * (0.95 - momentum) ** 2 + 0.02 * width_off**2


def mean_loss(c: dict[str, Any], epoch: int) -> float:
    diverges = 0.05 if c["optimizer"] == "adam" else 1.0
    if c["lr"] > diverges and epoch >= 3:
        return math.nan
    if c["optimizer"] == "adam":
        tau = 3 * (0.006 / c["lr"]) ** 0.8
    else:
        tau = 0.8 * (0.3 / c["lr"]) ** 0.8 * (2 - c.get("momentum", 0.9))
    base = min(floor(c), 3.5)
    return base + (START - base) / (1 + epoch / tau) ** 2


def loss(c: dict[str, Any], epoch: int, rng: Any = None) -> float:
    """The loss after `epoch` epochs, noise seeded by the configuration and the epoch (`rng`
    unused: the benchmark's Curve signature)."""
    searched = {k: c[k] for k in ("optimizer", "lr", "width", "momentum") if k in c}
    noise = random.Random(f"{json.dumps(searched, sort_keys=True)}:{epoch}")
    return mean_loss(searched, epoch) + noise.gauss(0.0, 0.03 / math.sqrt(epoch))


def train(config: dict[str, Any], ctx: Any) -> None:
    """task.train: one report a (simulated) epoch."""
    for epoch in range(ctx.epoch + 1, ctx.max_epochs + 1):
        ctx.report({"val_loss": loss(config, epoch)}, state={"epoch": epoch})


def cost(c: dict[str, Any]) -> float:
    """A second objective (min): the width, which the loss prefers near 128."""
    return float(c["width"]) / 512.0


def both(c: dict[str, Any], epoch: int, rng: Any = None) -> dict[str, float]:
    """Both objectives after `epoch` epochs (`rng` unused: the benchmark's Curve)."""
    return {"val_loss": loss(c, epoch), "cost": cost(c)}


def train_both(config: dict[str, Any], ctx: Any) -> None:
    """task.train with both objectives: one report a (simulated) epoch."""
    for epoch in range(ctx.epoch + 1, ctx.max_epochs + 1):
        ctx.report(both(config, epoch), state={"epoch": epoch})
