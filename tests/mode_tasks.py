"""The smallest task of each trial mode, for the mode contract (tests/test_modes.py).

Each trains through epoch 1 as usual, then waits at the start of epoch 2 until the file
`config["gate"]` exists, saying so with an empty file `<gate>.<pid>` (its process id): a driver
killed once every trial waits has each of them mid-way, its epoch-1 checkpoint written. With
the gate there from the start (a resumed sweep) nothing waits.

- `data`: 64 training and 32 validation samples of 8 features, 2 classes (tuner's loop);
- `model`: a small MLP that waits at the gate when the loop starts its second training epoch
  (`train()`), for tuner's loop with and without hooks;
- `error`: a metrics hook (reported as val_err);
- `train`: the user's own loop, `fn(config, ctx)`, on the same data and model.
The user's script is tests/mode_script.py (standard library only).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset


def wait_at_gate(gate: str) -> None:
    if os.path.exists(gate):
        return
    with open(f"{gate}.{os.getpid()}", "w"):
        pass
    while not os.path.exists(gate):
        time.sleep(0.05)


def data(config: dict[str, Any]) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])


class Net(nn.Sequential):
    """An MLP that waits at the gate when its second training epoch starts."""

    def __init__(self, gate: str):
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.gate, self.epochs = gate, 0

    def train(self, mode: bool = True) -> Net:
        if mode:
            self.epochs += 1
            if self.epochs == 2:
                wait_at_gate(self.gate)
        return super().train(mode)


def model(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> Net:
    return Net(str(config["gate"]))


def error(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"err": (output.argmax(1) != target).float().mean()}


def train(config: dict[str, Any], ctx: Any) -> None:
    """The user's own loop: SGD on `data` with `Net`, an epoch reported with its state."""
    torch.manual_seed(0)
    net = Net(str(config["gate"]))
    opt = torch.optim.SGD(net.parameters(), lr=float(config["lr"]))
    net, opt = ctx.prepare(net, opt)
    state = ctx.restore()
    if state is not None:
        ctx.load_state_dict(net, opt, state)
    train_set, val_set = data(config)
    batches = ctx.loader(train_set, 16)
    val = ctx.loader(val_set, 32, shuffle=False)
    for _ in range(ctx.epoch, ctx.max_epochs):
        net.train()
        for x, y in batches:
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            val_loss = sum(nn.functional.cross_entropy(net(x), y, reduction="sum") for x, y in val) / 32
        ctx.report({"val_loss": val_loss, "train_loss": loss.detach()}, state=ctx.state_dict(net, opt))
