"""A small character-level GRU language model (task.train): the search benchmark's task whose
good region is small and conditional (issue 32). Adam is good only at large learning rates,
SGD is slow everywhere in 9 epochs, so the best configurations are one optimizer's corner of
the space. The text: the source of Python modules that ship with Python (search_spaces/char_lm.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from search_spaces.char_lm import datasets


class CharGRU(nn.Module):
    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.gru = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(self.embed(x))[0])


def train(config: dict[str, Any], ctx: Any) -> None:
    """fn(config, ctx): lr, optimizer (sgd | adam), width; reports val_loss (nats/char)."""
    train_set, val_set, vocab = datasets(config)
    torch.manual_seed(int(config.get("seed", 0)))
    model = CharGRU(vocab, int(config["width"]))
    lr = float(config["lr"])
    if config["optimizer"] == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model, optimizer = ctx.prepare(model, optimizer)
    state = ctx.restore()
    if state is not None:
        ctx.load_state_dict(model, optimizer, state)
    batches = ctx.loader(train_set, int(config["batch_size"]))
    val_batches = ctx.loader(val_set, int(config["batch_size"]), shuffle=False)
    for _epoch in range(ctx.epoch, ctx.max_epochs):
        model.train()
        for x, y in batches:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in val_batches:
                total += float(F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum"))
                count += y.numel()
        val_loss = total / max(count, 1)
        ctx.report({"val_loss": val_loss if math.isfinite(val_loss) else float("nan")})
