"""The Lightning example (search_spaces/lightning_digits.py) as tests/test_lightning.py runs it:
in both forms, with a gate before the second epoch (as tests/mode_tasks.py's tasks wait: a
file `<gate>.<pid>`, then until `gate` exists), and alone (`--alone`: each configuration's
epochs as JSON lines, the independent answer a resumed trial is checked against).

    python tests/lightning_task.py --lr 0.05 --gate G --epochs 2      (task.command)
    task.train: tests.lightning_task:train
    python tests/lightning_task.py --alone 0.05 0.1 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import lightning.pytorch as L

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "search_spaces"))

import lightning_digits  # noqa: E402

WIDTH = 32
# The learning rate whose trial Lightning's early stopping ends after its second epoch (no
# improvement of 10 in val_loss: with patience 0, the second check stops it).
EARLY_STOPPED_LR = 0.02


def wait_at_gate(gate: str) -> None:
    if os.path.exists(gate):
        return
    with open(f"{gate}.{os.getpid()}", "w"):
        pass
    while not os.path.exists(gate):
        time.sleep(0.05)


class Gate(L.Callback):
    def __init__(self, gate: str):
        self.gate = gate

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1 and self.gate:
            wait_at_gate(self.gate)


def config_of(lr: float) -> dict[str, Any]:
    stops = lr == EARLY_STOPPED_LR
    return {"lr": lr, "width": WIDTH, "patience": 0 if stops else 3, "min_delta": 10.0 if stops else 0.0}


def train(config: dict[str, Any], ctx: Any) -> None:
    gate = Gate(str(config.get("gate") or ""))
    lightning_digits.fit(config_of(float(config["lr"])), ctx.max_epochs, ctx, [gate])


class Epochs(L.Callback):
    """Each epoch's logged numbers, as a run alone gives them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        row = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.rows.append({"epoch": trainer.current_epoch + 1, **row})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float)
    p.add_argument("--gate", default="")
    p.add_argument("--epochs", type=int)
    p.add_argument("--alone", type=float, nargs="*")
    args = p.parse_args()
    if args.alone is None:
        lightning_digits.fit(config_of(args.lr), args.epochs, None, [Gate(args.gate)])
        return
    for lr in args.alone:
        epochs = Epochs()
        lightning_digits.fit(config_of(lr), args.epochs, None, [epochs])
        print("ALONE " + json.dumps({"lr": lr, "rows": epochs.rows}), flush=True)


if __name__ == "__main__":
    main()
