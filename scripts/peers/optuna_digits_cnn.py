"""Peer baseline: an in-process Optuna sweep (TPE + Hyperband pruning) of a small CNN on digits.

Written the way ../shared/peers/optuna_digits.py is, on the work of `search_spaces/digits_cnn.yaml`
with the benchmark's heavier space (scripts/bench_compute.py): blocks of conv3x3-BN-ReLU(-maxpool),
channels doubling per block; lr in [3e-4, 3e-2] log, channels in {32, 48, 64}, blocks in {2, 3},
dropout in [0, 0.5], optimizer in {adam, adamw}; batch 64, cosine decay over MAX_EPOCHS; up to
MAX_EPOCHS epochs per trial. torch keeps its default threads (every core), as a user's script
would. Prints one JSON line; its "bests" are [seconds since this process started, val_acc] at
each epoch that beat every earlier one (of any trial).

usage: python optuna_digits_cnn.py N_TRIALS MAX_EPOCHS SEED
"""

import json
import math
import sys
import time

import numpy as np
import optuna
import psutil
import torch
import torch.nn as nn
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

N_TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
MAX_EPOCHS = int(sys.argv[2]) if len(sys.argv) > 2 else 15
SEED = int(sys.argv[3]) if len(sys.argv) > 3 else 0
STARTED = psutil.Process().create_time()
X, y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
Xtr, Xva, ytr, yva = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
Xtr, Xva, ytr, yva = map(torch.tensor, (Xtr, Xva, ytr, yva))
epochs_spent, bests = 0, []


def cnn(channels, blocks, dropout):
    layers, c_in, size = [], 1, 8
    for b in range(blocks):
        c_out = channels * 2**b
        conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        layers += [conv, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
        if size >= 4:
            layers.append(nn.MaxPool2d(2))
            size //= 2
        c_in = c_out
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c_in, 10)]
    return nn.Sequential(*layers, *head)


def objective(trial):
    global epochs_spent
    lr = trial.suggest_float("lr", 3e-4, 3e-2, log=True)
    channels = trial.suggest_categorical("channels", [32, 48, 64])
    blocks = trial.suggest_int("blocks", 2, 3)
    dropout = trial.suggest_float("dropout", 0.0, 0.5)
    opt_name = trial.suggest_categorical("optimizer", ["adam", "adamw"])
    torch.manual_seed(SEED)
    model = cnn(channels, blocks, dropout)
    opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[opt_name](model.parameters(), lr=lr)
    total = MAX_EPOCHS * math.ceil(len(Xtr) / 64)
    cosine = lambda step: 0.5 * (1 + math.cos(math.pi * min(1.0, step / total)))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine)
    g = torch.Generator().manual_seed(SEED)
    acc = 0.0
    for epoch in range(MAX_EPOCHS):
        perm = torch.randperm(len(Xtr), generator=g)
        model.train()
        for i in range(0, len(Xtr), 64):
            idx = perm[i : i + 64]
            loss = nn.functional.cross_entropy(model(Xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            acc = (model(Xva).argmax(1) == yva).float().mean().item()
        epochs_spent += 1
        if not bests or round(acc, 4) > bests[-1][1]:
            bests.append([round(time.time() - STARTED, 3), round(acc, 4)])
        trial.report(acc, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return acc


optuna.logging.set_verbosity(optuna.logging.WARNING)
t0 = time.time()
study = optuna.create_study(
    direction="maximize",
    sampler=optuna.samplers.TPESampler(seed=SEED),
    pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=MAX_EPOCHS, reduction_factor=3),
)
study.optimize(objective, n_trials=N_TRIALS)
print(
    json.dumps(
        {
            "peer": "optuna-inprocess-cnn",
            "trials": N_TRIALS,
            "wall_s": round(time.time() - t0, 2),
            "best_val_acc": round(study.best_value, 4),
            "epochs_spent": epochs_spent,
            "best": study.best_params,
            "bests": bests,
        }
    )
)
