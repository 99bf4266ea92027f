"""Data whose validation accuracy falls as training goes on (`task.data:
tests.best_task:flipped`): the training labels are the validation labels flipped, so a
trial's best epoch is its first and the newest checkpoints never hold it. `data_args.sleep_s`:
seconds each trial waits here first (a slow data source: wall time, no CPU)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import TensorDataset

VAL = 80


def flipped(config: dict[str, Any]) -> tuple[TensorDataset, TensorDataset]:
    time.sleep(float(config.get("sleep_s", 0)))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(320 + VAL, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x[:320], 1 - y[:320]), TensorDataset(x[320:], y[320:])


def accuracy(model: torch.nn.Module) -> tuple[int, int]:
    """(correct, samples) of `model` on the validation split, computed here, not by tuner."""
    _, val = flipped({})
    x, y = val.tensors
    with torch.no_grad():
        return int((model.eval()(x).argmax(1) == y).sum()), len(y)
