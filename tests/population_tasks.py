"""A tiny task for population-based training sweeps (tests/test_population_sweep.py): the
user's own loop, `fn(config, ctx)`, whose state carries the tag of the trial that first made
its weights ("born", reported every epoch: averaged over the workers, so with 2 it is a
trial's own only when every rank restored the same state), so a test can see whose state a
trial continued from. The script beside it: tests/population_script.py."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset


def data() -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])


def train(config: dict[str, Any], ctx: Any) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=float(config["lr"]))
    net, opt = ctx.prepare(net, opt)
    born = float(config["tag"])
    state = ctx.restore()
    if state is not None:
        ctx.load_state_dict(net, opt, state)
        born = float(state["born"])
        for group in opt.param_groups:  # the configuration's lr, not the checkpoint's (PBT changes it)
            group["lr"] = float(config["lr"])
    train_set, val_set = data()
    batches, val = ctx.loader(train_set, 16), ctx.loader(val_set, 32, shuffle=False)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(ctx.epoch, ctx.max_epochs):
        net.train()
        for x, y in batches:
            opt.zero_grad()
            loss_fn(net(x), y).backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            losses = [loss_fn(net(x), y) for x, y in val]
        metrics = {"val_loss": torch.stack(losses).mean(), "born": born, "lr_used": opt.param_groups[0]["lr"]}
        ctx.report(metrics, state={**ctx.state_dict(net, opt), "born": born})
