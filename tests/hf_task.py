"""The Hugging Face example (search_spaces/hf_tiny.py) as tests/test_transformers.py runs it:
in both forms, with a gate before the second epoch (a file `<gate>.<pid>`, then until `gate`
exists, as tests/lightning_task.py), and alone (`--alone`: each configuration's epochs as JSON
lines, the independent answer a resumed trial is checked against).

    python tests/hf_task.py --lr 0.003 --gate G --epochs 2      (task.command)
    task.train: tests.hf_task:train
    python tests/hf_task.py --alone 0.003 0.01 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from transformers import TrainerCallback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "search_spaces"))

import hf_tiny  # noqa: E402


def wait_at_gate(gate: str) -> None:
    if not gate or os.path.exists(gate):
        return
    with open(f"{gate}.{os.getpid()}", "w"):
        pass
    while not os.path.exists(gate):
        time.sleep(0.05)


class Gate(TrainerCallback):
    """Waits before the second epoch, or with `step` after that training step instead (late
    in an epoch: a stop then lands where the Trainer's end of epoch would still evaluate and
    save)."""

    def __init__(self, gate: str, step: int = 0):
        self.gate, self.step = gate, step

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.step and round(state.epoch or 0) == 1:
            wait_at_gate(self.gate)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step and state.global_step == self.step:
            wait_at_gate(self.gate)


def train(config: dict[str, Any], ctx: Any) -> None:
    hf_tiny.fit({"lr": float(config["lr"])}, ctx.max_epochs, ctx, [Gate(str(config.get("gate") or ""))])


class Epochs(TrainerCallback):
    """Each epoch's evaluation and training loss, as a run alone gives them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        losses = [row["loss"] for row in state.log_history if "loss" in row]
        self.rows.append({"epoch": round(state.epoch), "loss": losses[-1], **(metrics or {})})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float)
    p.add_argument("--gate", default="")
    p.add_argument("--gate-step", type=int, default=0)
    p.add_argument("--epochs", type=int)
    p.add_argument("--alone", type=float, nargs="*")
    args = p.parse_args()
    if args.alone is None:
        hf_tiny.fit({"lr": args.lr}, args.epochs, None, [Gate(args.gate, args.gate_step)])
        return
    for lr in args.alone:
        epochs = Epochs()
        hf_tiny.fit({"lr": lr}, args.epochs, None, [epochs])
        print("ALONE " + json.dumps({"lr": lr, "rows": epochs.rows}), flush=True)


if __name__ == "__main__":
    main()
