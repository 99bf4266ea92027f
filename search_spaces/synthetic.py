"""A synthetic multi-fidelity objective with a known optimum, as a `task.train` loop
(search_spaces/synthetic.yaml), milliseconds an epoch: the search benchmark's cheap task
(scripts/bench_search.py), and a sweep you can run to watch an algorithm at work.

A validation loss that falls from 2.3 towards a floor set by the configuration:

- the floor is lowest (OPTIMUM, 0.05) at sgd, lr 0.1, width 256, dropout 0.2, weight decay
  1e-3; adam's best learning rate is 0.003 and its floor 0.03 higher (lr and optimizer
  interact), and the best dropout grows with the width;
- a larger learning rate falls faster (curves cross: the best at 3 epochs is rarely the best
  at 81), wide networks with little dropout overfit (their loss climbs again late);
- above a learning rate that depends on the optimizer the run diverges (NaN) after a few
  epochs that look promising;
- noise with a standard deviation of 0.05/sqrt(epoch): large at the first rung, small at the end.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

OPTIMUM = 0.05  # the floor at the best configuration (BEST)
BEST = {"optimizer": "sgd", "lr": 0.1, "width": 256, "dropout": 0.2, "weight_decay": 1e-3}
START = 2.3  # the loss before training: ln(10), ten classes guessed uniformly
BEST_LR = {"sgd": 0.1, "adam": 0.003}
DIVERGES_ABOVE = {"sgd": 0.5, "adam": 0.03}


def floor(c: dict[str, Any]) -> float:
    """The loss the configuration converges to."""
    opt = c["optimizer"]
    lr_off = math.log10(c["lr"] / BEST_LR[opt])
    width_off = math.log2(c["width"] / 256)
    best_dropout = min(0.6, max(0.0, 0.2 + 0.1 * width_off))
    return (
        OPTIMUM
        + (0.03 if opt == "adam" else 0.0)
        + 0.08 * lr_off**2
        + 0.01 * width_off**2
        + 0.4 * (c["dropout"] - best_dropout) ** 2
        + 0.01 * (math.log10(c["weight_decay"]) + 3) ** 2
    )


def mean_loss(c: dict[str, Any], epoch: int) -> float:
    """The noiseless loss after `epoch` epochs (NaN once diverged)."""
    opt = c["optimizer"]
    if c["lr"] > DIVERGES_ABOVE[opt] and epoch >= max(2, round(6 * DIVERGES_ABOVE[opt] / c["lr"])):
        return math.nan
    tau = 4 * (BEST_LR[opt] / c["lr"]) ** 0.7 * (1 + 2 * c["dropout"])  # epochs to fall
    overfit = 0.002 * max(0.0, math.log2(c["width"] / 64)) * max(0.0, 0.3 - c["dropout"])
    base = floor(c)
    return base + (START - base) / (1 + epoch / tau) ** 2 + overfit * epoch


def loss(c: dict[str, Any], epoch: int, rng: Any = None) -> float:
    """The loss a run reports after `epoch` epochs: the mean plus noise 0.05/sqrt(epoch),
    seeded by the configuration and the epoch (a resumed trial, and the benchmark's simulated
    trial, report what a sweep's trial does). `rng` is unused: the benchmark's Curve signature."""
    searched = {k: c[k] for k in BEST}
    noise = random.Random(f"{json.dumps(searched, sort_keys=True)}:{epoch}")
    return mean_loss(searched, epoch) + noise.gauss(0.0, 0.05 / math.sqrt(epoch))


def train(config: dict[str, Any], ctx: Any) -> None:
    """task.train: one report a (simulated) epoch, milliseconds each."""
    for epoch in range(ctx.epoch + 1, ctx.max_epochs + 1):
        ctx.report({"val_loss": loss(config, epoch)}, state={"epoch": epoch})
