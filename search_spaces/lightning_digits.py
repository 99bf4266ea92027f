"""A LightningModule tuned as it is: an MLP on sklearn's 8x8 digits, with Lightning's own
early stopping and logging, and tuner's `TunerCallback` (docs/how-to/lightning.md).

Both forms a sweep can run it in:

- a script, `task.command` (search_spaces/lightning_command.yaml):
      python search_spaces/lightning_digits.py --lr 0.01 --width 64 --epochs 5
  (it runs alone too: each epoch's metrics are printed);
- a function, `task.train: lightning_digits:train` (search_spaces/lightning_train.yaml),
  which also keeps the best epoch's weights: best/, `tuner.load_best(dir, model=DigitsMLP())`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, Optional

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import EarlyStopping
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tuner.integrations.lightning import TunerCallback


class DigitsMLP(L.LightningModule):
    def __init__(self, lr: float = 0.01, width: int = 64, dropout: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Sequence[torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Sequence[torch.Tensor], index: int) -> None:
        x, y = batch
        out = self(x)
        self.log("val_loss", nn.functional.cross_entropy(out, y))
        self.log("val_acc", (out.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def loaders(batch_size: int = 64) -> tuple[DataLoader, DataLoader]:
    """The digits, 80% to train (shuffled each epoch) and 20% to validate."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    split = int(0.8 * len(x))
    train = TensorDataset(x[:split], y[:split])
    val = TensorDataset(x[split:], y[split:])
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=256)


def fit(
    config: dict[str, Any], max_epochs: int, ctx: Any = None, callbacks: Sequence[L.Callback] = ()
) -> L.Trainer:
    """Train one configuration: the same code alone, in a script, or in `task.train`."""
    torch.set_num_threads(1)
    L.seed_everything(int(config.get("seed", 0)), verbose=False)
    model = DigitsMLP(float(config["lr"]), int(config["width"]), float(config.get("dropout", 0.1)))
    tuned = TunerCallback(ctx)
    patience, min_delta = int(config.get("patience", 3)), float(config.get("min_delta", 0))
    stop = EarlyStopping("val_loss", patience=patience, min_delta=min_delta)  # Lightning's own
    trainer = L.Trainer(
        max_epochs=max_epochs,
        callbacks=[tuned, stop, *callbacks],
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
    )
    train, val = loaders()
    trainer.fit(model, train, val, ckpt_path=tuned.ckpt_path)
    return trainer


def train(config: dict[str, Any], ctx: Any) -> None:
    """`task.train: lightning_digits:train`."""
    fit(config, ctx.max_epochs, ctx)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--patience", type=int, default=3, help="Lightning's early stopping on val_loss")
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=10)
    args = p.parse_args(argv)
    fit(vars(args), args.epochs)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
