"""A third-party-style script shaped like a Lightning training run, for task.command tests
(standard library only: it starts fast). What Lightning does by default, it does:

- evaluates the model before training (a sanity check) and reports it as epoch 0 (all but
  the `early` curve, whose trial shows its early stopping alone);
- logs into `lightning_logs/version_N/` relative to the working directory, N one past the
  highest there (Lightning's own versioning: two runs at once may pick the same N);
- saves a checkpoint every epoch (in tuner.checkpoint_dir()) and stops itself when val_loss
  has not improved for `--patience` epochs (Lightning's EarlyStopping), exiting 0.

`--curve` picks val_loss per epoch (epoch 0 first); every curve has the same value at
epochs 1 and 3, ASHA's rungs at the defaults (grace 1, factor 3), so no trial is ever below
another there: the scheduler never stops one, and each ending is the script's own.

    peaks    best at epoch 2, worse after, patience 9: trains every epoch
    stops    best at epoch 2, worse at 3, patience 1: stops itself after epoch 3
    early    worse at epoch 2 than at 1, patience 1: stops itself after epoch 2, before the
             rung at 3
"""

from __future__ import annotations

import argparse
import json
import os
import time

import tuner

CURVES = {  # (EarlyStopping's patience, val_loss at epochs 0, 1, 2, ...)
    "peaks": (9, [2.0, 1.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
    "stops": (1, [2.0, 1.0, 0.4, 0.5, 0.45, 0.4, 0.35]),
    "early": (1, [2.0, 1.0, 1.2, 0.5, 0.4, 0.3, 0.2]),
}


def version_dir(root: str) -> str:
    """Lightning's `lightning_logs/version_N`: one past the highest N there."""
    os.makedirs(root, exist_ok=True)
    found = [int(n.split("_")[1]) for n in os.listdir(root) if n.startswith("version_") and n[8:].isdigit()]
    path = os.path.join(root, f"version_{max(found, default=-1) + 1}")
    os.makedirs(path, exist_ok=True)
    return path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--curve", default="peaks", choices=sorted(CURVES))
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--sleep", type=float, default=0.2)
    args = p.parse_args()
    patience, curve = CURVES[args.curve]
    logs = version_dir("lightning_logs")
    with open(os.path.join(logs, "hparams.json"), "w") as f:
        json.dump(vars(args), f)
    start = 0
    if tuner.restore_dir():
        with open(os.path.join(tuner.restore_dir(), "state.json")) as f:
            start = json.load(f)["epoch"]
    elif args.curve != "early":
        tuner.report(epoch=0, val_loss=curve[0])  # the sanity check: the model as it starts
    best, waited = min(curve[: start + 1]), 0
    for epoch in range(start + 1, args.epochs + 1):
        time.sleep(args.sleep)
        val_loss = curve[epoch]
        save = tuner.checkpoint_dir()
        if save:
            with open(os.path.join(save, "state.json"), "w") as f:
                json.dump({"epoch": epoch, "val_loss": val_loss}, f)
        tuner.report(epoch=epoch, val_loss=val_loss)
        with open(os.path.join(logs, "metrics.csv"), "a") as f:
            f.write(f"{epoch},{val_loss}\n")
        if val_loss < best:
            best, waited = val_loss, 0
        else:
            waited += 1
        if waited >= patience:
            trial_dir = os.environ.get("TUNER_TRIAL_DIR", ".")
            with open(os.path.join(trial_dir, "stopped_itself.txt"), "w") as f:
                f.write(str(epoch))
            return  # EarlyStopping: exit 0 before max_epochs


if __name__ == "__main__":
    main()
