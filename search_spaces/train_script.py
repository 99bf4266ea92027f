"""A plain training script, tuned as it is by search_spaces/script.yaml (task.command).

It runs alone too:  python search_spaces/train_script.py --lr 0.01 --epochs 5
(tuner.report then prints each epoch, and checkpoint_dir()/restore_dir() are None).

What tuner asks of it: one `tuner.report(epoch=..., val_loss=...)` per epoch, and, to be
continued where it was after an interruption rather than from epoch 1, a checkpoint saved in
`tuner.checkpoint_dir()` before that report and loaded from `tuner.restore_dir()` at start.
What it writes goes to `--out-dir` (the sweep passes each trial's own directory, {trial_dir}:
trials running at once share the directory the sweep started from). Its threads are torch's
default, OMP_NUM_THREADS, which tuner sets to the trial's CPUs (resources.cpus_per_worker).
"""

from __future__ import annotations

import argparse
import os

import torch
from sklearn.datasets import load_digits
from torch import nn

import tuner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out-dir", default="out", help="where the trained model is saved")
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    split = int(0.8 * len(x))
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    if args.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    start = 0
    restore = tuner.restore_dir()  # set when the trial continues (resumed, retried)
    if restore:
        state = torch.load(os.path.join(restore, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"]
    print(f"start epoch {start}", flush=True)

    for epoch in range(start + 1, args.epochs + 1):
        model.train()
        order = torch.randperm(split, generator=torch.Generator().manual_seed(epoch))
        for i in range(0, split, args.batch_size):
            idx = order[i : i + args.batch_size]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            out = model(x[split:])
            val_loss = nn.functional.cross_entropy(out, y[split:]).item()
            val_acc = (out.argmax(1) == y[split:]).float().mean().item()
        save = tuner.checkpoint_dir()  # None when run alone
        if save:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
            torch.save(state, os.path.join(save, "state.pt"))
        print(f"trained epoch {epoch}", flush=True)
        tuner.report(epoch=epoch, val_loss=val_loss, val_acc=val_acc)
    os.makedirs(args.out_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.out_dir, "model.pt"))


if __name__ == "__main__":
    main()
