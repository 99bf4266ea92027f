"""A small character-level transformer language model, trained by its own loop (task.train).

The text is the source of Python modules that ship with every Python (no download): by
default `argparse`, `collections` and `typing`, about 250 kB. The model predicts each next
character of `block_size`-character windows (GPT-style: causal self-attention, pre-norm
blocks). Used by char_lm.yaml (the CLI) and notebook_char_lm.py (the Python API).
"""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


def corpus(modules: str, chars: int) -> str:
    """The source text of `modules` (comma-separated names), the first `chars` characters."""
    text = "\n".join(inspect.getsource(importlib.import_module(m.strip())) for m in modules.split(","))
    return text[:chars] if chars > 0 else text


def windows(ids: torch.Tensor, block: int) -> TensorDataset:
    """(x, y) pairs of `block` characters, y shifted by one: one window every `block`."""
    n = (len(ids) - 1) // block
    x = ids[: n * block].view(n, block)
    y = ids[1 : n * block + 1].view(n, block)
    return TensorDataset(x, y)


def datasets(config: dict[str, Any]) -> tuple[TensorDataset, TensorDataset, int]:
    """Train and validation windows (the last 10% of the text) and the vocabulary size."""
    text = corpus(config.get("modules", "argparse,collections,typing"), int(config.get("chars", 0)))
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    ids = torch.tensor([vocab[c] for c in text], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    block = int(config["block_size"])
    return windows(ids[:cut], block), windows(ids[cut:], block), len(vocab)


class CharTransformer(nn.Module):
    """Token and position embeddings, `layers` causal pre-norm transformer blocks, a head."""

    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int, dropout: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(block, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tokens(x) + self.positions(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


def train(config: dict[str, Any], ctx: Any) -> None:
    """The training function of task.train: fn(config, ctx)."""
    train_set, val_set, vocab = datasets(config)
    torch.manual_seed(int(config.get("seed", 0)))
    model = CharTransformer(
        vocab,
        int(config["block_size"]),
        int(config["width"]),
        int(config["layers"]),
        int(config["heads"]),
        float(config.get("dropout", 0.0)),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(config["lr"]), weight_decay=0.1)
    model, optimizer = ctx.prepare(model, optimizer)  # on the device; DDP with 2 workers
    state = ctx.restore()  # None unless the trial resumes (paused, retried, `tuner resume`)
    if state is not None:
        ctx.load_state_dict(model, optimizer, state)
        for group in optimizer.param_groups:  # config's lr, not the checkpoint's (pbt changes it)
            group["lr"] = float(config["lr"])
    batches = ctx.loader(train_set, int(config["batch_size"]))
    val_batches = ctx.loader(val_set, int(config["batch_size"]), shuffle=False)
    for _epoch in range(ctx.epoch, ctx.max_epochs):  # ctx.epoch: epochs done before a resume
        model.train()
        total, steps = torch.zeros((), device=ctx.device), 0
        for x, y in batches:
            with ctx.autocast():  # bf16/fp16 on GPUs (training.amp), nothing on CPU
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            ctx.scaler.scale(loss).backward()  # the scaler: fp16 only, else a pass-through
            ctx.scaler.step(optimizer)
            ctx.scaler.update()
            total += loss.detach()
            steps += 1
        val_loss = evaluate(model, val_batches, ctx)
        ctx.report(
            {"train_loss": total / max(steps, 1), "val_loss": val_loss, "val_bpc": val_loss / math.log(2)},
            state=ctx.state_dict(model, optimizer),  # every worker calls it (FSDP gathers)
        )


@torch.no_grad()
def evaluate(model: nn.Module, batches: Any, ctx: Any) -> torch.Tensor:
    """Mean next-character cross-entropy over this worker's share of the validation text
    (ctx.report averages it over the workers)."""
    model.eval()
    total, count = torch.zeros((), device=ctx.device), 0
    for x, y in batches:
        with ctx.autocast():
            logits = model(x)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
        count += y.numel()
    return total / max(count, 1)
