"""The user's script of the mode contract (tests/test_modes.py): standard library only.

val_loss = 1 / epoch + lr, one epoch a report, a checkpoint a JSON file of the epoch; it
resumes from tuner.restore_dir(). Before its second epoch it waits at the gate as the tasks of
tests/mode_tasks.py do (a file `<gate>.<pid>`, then until `gate` exists).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import tuner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float)
    p.add_argument("--gate")
    p.add_argument("--epochs", type=int)
    args = p.parse_args()
    start, restore = 0, tuner.restore_dir()
    if restore is not None:
        with open(os.path.join(restore, "state.json")) as f:
            start = json.load(f)["epoch"]
    for epoch in range(start + 1, args.epochs + 1):
        if epoch == 2 and not os.path.exists(args.gate):
            with open(f"{args.gate}.{os.getpid()}", "w"):
                pass
            while not os.path.exists(args.gate):
                time.sleep(0.05)
        with open(os.path.join(tuner.checkpoint_dir(), "state.json"), "w") as f:
            json.dump({"epoch": epoch}, f)
        tuner.report(epoch=epoch, val_loss=1 / epoch + args.lr)


if __name__ == "__main__":
    main()
