"""Data whose validation accuracy falls as training goes on (`task.data:
tests.best_task:flipped`): the training labels are the validation labels flipped, so a
trial's best epoch is its first and the newest checkpoints never hold it. `data_args.sleep_s`:
seconds each trial waits here first (a slow data source: wall time, no CPU). `held`: the same
data, one trial of which waits at its second epoch (tests/test_places.py's moment to kill)."""

from __future__ import annotations

import os
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


class _Held(torch.utils.data.Dataset):
    """A training split that holds its trial at its second pass while the file `gate` exists."""

    def __init__(self, inner: TensorDataset, gate: str):
        self.inner, self.gate, self.calls = inner, gate, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        self.calls += 1
        if self.calls > len(self.inner) + 16:  # past the first pass (and a look at its shape)
            while os.path.exists(self.gate):
                time.sleep(0.05)
        return self.inner[i]


def held(config: dict[str, Any]) -> tuple[Any, TensorDataset]:
    """`flipped`'s data; the trial whose lr is `data_args.hold_lr` waits at its second epoch,
    its first reported and checkpointed, while the file `data_args.gate` exists."""
    train, val = flipped(config)
    if float(config["lr"]) == float(config["hold_lr"]):
        return _Held(train, str(config["gate"])), val
    return train, val
