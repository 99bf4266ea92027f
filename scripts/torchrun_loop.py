"""Loop parity: tuner's trial loop vs a hand-written DDP loop, under torchrun, same work.

usage: python -m torch.distributed.run --nproc_per_node 2 scripts/torchrun_loop.py ours|hand OUT.json
       [--samples N] [--features F] [--classes C] [--width W] [--depth D] [--batch B] [--epochs E]

Both train the same MLP on the same in-memory synthetic data with DDP over gloo, one torch
thread per process, global batch B, Adam; each prints the training samples/s of every epoch.
The hand-written loop is what a careful user writes: a seeded permutation per epoch, this
rank's share, tensor slicing (no per-sample DataLoader), no checkpoints, no logging.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    from tuner.trial.loop.data import load_data

    bundle = load_data("synthetic", _data_args(args), {})
    return bundle.train.x, bundle.train.y  # the very tensors tuner's loop trains on


def _data_args(args: argparse.Namespace) -> dict:
    return {"samples": args.samples, "features": args.features, "classes": args.classes}


def hand(args: argparse.Namespace) -> list[float]:
    from tuner.trial.loop.models import mlp

    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data(args)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        mlp({"width": args.width, "depth": args.depth}, (args.features,), args.classes)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    per_rank = args.batch // world
    rates = []
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(epoch)
        mine = torch.randperm(len(y), generator=g)[rank::world]
        t0 = time.perf_counter()
        for i in range(0, len(mine), per_rank):
            idx = mine[i : i + per_rank]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        seen = torch.tensor([float(len(mine))])
        dist.all_reduce(seen)
        rates.append(seen.item() / (time.perf_counter() - t0))
    return rates


def ours(args: argparse.Namespace) -> list[float]:
    from tuner.config import TrainingSection
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.loop.run import run_trial

    hp = {
        **TrainingSection().model_dump(),
        "amp": "off",
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": args.batch,
        "width": args.width,
        "depth": args.depth,
    }
    spec = TrialSpec(model="mlp", data="synthetic", data_args=_data_args(args), max_epochs=args.epochs)
    with tempfile.TemporaryDirectory(prefix="parity-") as out:
        session = LocalSession(out)
        run_trial(hp, spec, session)
        return [m["samples_per_s"] for m in session.metrics]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("which", choices=["ours", "hand"])
    p.add_argument("out")
    for name, default in [
        ("samples", 16384),
        ("features", 64),
        ("classes", 10),
        ("width", 256),
        ("depth", 2),
        ("batch", 256),
        ("epochs", 5),
    ]:
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rates = (ours if args.which == "ours" else hand)(args)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"which": args.which, "samples_per_s": rates, "world_size": dist.get_world_size()}, f)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown of gloo threads


if __name__ == "__main__":
    main()
