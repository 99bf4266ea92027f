"""A training script for the task.command tests: standard library only (it starts fast), and
it behaves as `--kind` says.

    api         reports with tuner.report, checkpoints with tuner.checkpoint_dir (a JSON file)
    stdout      never imports tuner: prints TUNER_REPORT lines
    crash       writes to stderr, exits 3 before any report
    silent      trains, never reports, exits 0
    crash_once  as api, but its first run exits 3 after reporting (and checkpointing) epoch 2
    ddp         under torchrun: 2 gloo processes, each prints a line and reports its rank (only
                rank 0's count) and the threads of all ranks; val_loss = 3 / epoch + a sum of a million
                random float32 numbers / 10**6 (its last bits follow the thread count)
    shared      as stdout, its lines as they reach a stdout shared with another rank (torchrun's
                workers) that prints too: that rank's unfinished line before the prefix,
                its output between the JSON object and the newline
    text        as api, but reports val_loss "abc" at epoch 2
    huge        as api, but reports val_loss 10**400 at epoch 2 (past a float's range)
    final       as api, then reports the last epoch again with a test_loss
    past        as api, but reports 2 epochs past --epochs
    linger      as api, then sleeps (silent) for 10 minutes instead of exiting
    oom         as api, but with --batch_size above 16 dies at epoch 2 of torch's CUDA
                out-of-memory error, as torch prints it (its traceback on stderr, exit 1)

val_loss = base + 1 / epoch, with base = 10 * lr (0 for crash_once). Each run appends, in the
trial directory, its pid to pids.txt, its first epoch to starts.txt, each epoch it trains to
trained.txt, and "sigterm" to signals.txt when it is sent SIGTERM (it then exits 143); env.json
says where it ran, whether its trial actor has torch (it has no need to import it) and whether
that actor is a copy of tuner's warm process (which imported torch once for every trial).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def _append(name: str, text: str) -> None:
    trial_dir = os.environ.get("TUNER_TRIAL_DIR", ".")
    with open(os.path.join(trial_dir, name), "a") as f:
        f.write(text + "\n")


def _sigterm(signum: int, frame: object) -> None:
    _append("signals.txt", "sigterm")
    sys.exit(143)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="api")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.3)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--hold", help="after epoch 2, wait (silent) until this file exists")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _sigterm)
    if os.environ.get("RANK", "0") == "0":
        _append("pids.txt", str(os.getpid()))
        cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
        copied = bool(os.environ.get("TUNER_WORKER_COPIED"))  # (its actor: a copy of the warm process)
        seen = {"cwd": os.getcwd(), "cuda": cuda, "actor_torch": _actor_has_torch(), "actor_copied": copied}
        _append("env.json", json.dumps(seen))
    if args.kind == "crash":
        print("Traceback (most recent call last):\nValueError: boom: the script fails", file=sys.stderr)
        sys.exit(3)
    if args.kind == "ddp":
        return _ddp(args)
    if args.kind == "shared":
        return _shared(args)
    tuner = None if args.kind == "stdout" else __import__("tuner")
    start = 0
    restore = tuner.restore_dir() if tuner else None
    if restore:
        with open(os.path.join(restore, "state.json")) as f:
            start = json.load(f)["epoch"]
    _append("starts.txt", str(start))
    base = 0.0 if args.kind == "crash_once" else 10 * args.lr
    last = args.epochs + (2 if args.kind == "past" else 0)
    _append("batch_sizes.txt", str(args.batch_size))
    for epoch in range(start + 1, last + 1):
        time.sleep(args.sleep)
        if args.kind == "oom" and epoch == 2 and args.batch_size > 16:
            print(OOM_TRACEBACK.format(batch=args.batch_size), file=sys.stderr)
            sys.exit(1)
        _append("trained.txt", str(epoch))
        metrics: dict = {"val_loss": base + 1 / epoch, "train_loss": base + 1.5 / epoch}
        if epoch == 2 and args.kind in ("text", "huge"):
            metrics["val_loss"] = "abc" if args.kind == "text" else 10**400
        if args.kind == "silent":
            continue
        if tuner is None:
            print("TUNER_REPORT " + json.dumps({"epoch": epoch, **metrics}), flush=True)
            continue
        save = tuner.checkpoint_dir()
        if save:
            with open(os.path.join(save, "state.json"), "w") as f:
                json.dump({"epoch": epoch}, f)
        tuner.report(epoch=epoch, **metrics)
        while args.hold and epoch >= 2 and not os.path.exists(args.hold):
            time.sleep(0.05)  # a test's moment, however fast the machine: released by the test
        if args.kind == "crash_once" and epoch == 2 and not restore:
            time.sleep(0.5)  # the report reaches the trial before the exit does
            sys.exit(3)
    if args.kind == "final" and tuner is not None:
        time.sleep(args.sleep)  # a test set's evaluation, after training
        tuner.report(epoch=args.epochs, test_loss=base + 0.5)
    if args.kind == "linger":
        time.sleep(600)


# What torch prints when a CUDA allocation fails (torch 2.13's message, shortened).
OOM_TRACEBACK = """Traceback (most recent call last):
  File "train.py", line 90, in <module>
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.19 GiB of which 1.02 GiB is free. (batch {batch})"""


def _actor_has_torch() -> bool | None:
    """Whether the Ray trial actor above this process (an ancestor titled ray::...) has torch's
    library mapped; None where there is no such ancestor (run by hand)."""
    pid = os.getppid()
    for _ in range(6):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
            if title.startswith("ray::"):
                with open(f"/proc/{pid}/maps") as f:
                    return "libtorch" in f.read()
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def _shared(args: argparse.Namespace) -> None:
    """Rank 0's `print(PREFIX + json.dumps(row))` under unbuffered output is two writes (the
    text, the newline), each whole on a pipe; rank 1's writes land between them."""
    for epoch in range(1, args.epochs + 1):
        line = "TUNER_REPORT " + json.dumps({"epoch": epoch, "val_loss": 1 / epoch})
        other = f"[rank1] step {epoch}: {{'loss': 2.5}}"  # nanoGPT-style: every rank prints
        writes = [other, line, "\n", "\n"] if epoch % 2 else [line, other, "\n", "\n"]
        for text in writes:
            os.write(1, text.encode())


def _ddp(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import tuner

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = torch.tensor([float(torch.get_num_threads())])
    dist.all_reduce(threads)  # every rank's threads, summed
    for epoch in range(1, args.epochs + 1):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)  # 1 + 2 = 3 with 2 processes
        # A float32 sum of a million numbers: its last bits follow the thread count.
        noise = torch.randn(1_000_000, generator=torch.Generator().manual_seed(epoch)).sum().item()
        val_loss = t.item() / epoch + 1e-6 * noise
        print(f"rank {rank}:", f"epoch {epoch} trained", flush=True)  # every rank prints (nanoGPT)
        tuner.report(epoch=epoch, val_loss=val_loss, rank=rank, world=world, threads=int(threads.item()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
