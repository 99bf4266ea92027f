"""What the OOM gates cost a step (tuner/trial/loop/lockstep.py): DDP and FSDP over 2 gloo ranks.

Every collective of a multi-worker step first asks every rank, in one small CPU all-reduce,
whether any ran out of memory: one per DDP gradient bucket and one per FSDP all-gather and
reduce-scatter, plus the step's commit and the update's agreement. This times tuner's
`optimizer_step` on the same trial built with the gates and without them (`NoGate`), the two
alternating in every round, and prints each pair's median, their ratio, and how many gates a
step asked.

    python scripts/bench_oom_gates.py [--model tiny|mlp|vit] [--steps N]   # results in BENCHMARKS.md

`tiny` is a step of a few milliseconds (what the gates cost at their worst: every gate is a
round trip between the processes, as long as the step's own work); `mlp` (a 4 x 1024 MLP,
per-rank batch 256) and `vit` (ViT-Tiny-sized: 6 blocks of width 192, on 64 x 64 images in 16 x 16
patches, per-rank batch 16) are steps of 50-200 ms on one CPU thread, the size a CPU trial
worth tuning has.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM = 3  # untimed steps before each timed run
GATE_ROUNDS = 500  # gates timed alone

# name -> (model, data, data_args, model sizes, per-rank batch, micro-batches, timed steps)
PRESETS: dict[str, tuple[str, str, dict[str, Any], dict[str, Any], int, tuple[int, ...], int]] = {
    "tiny": ("mlp", "synthetic", {"samples": 4000, "features": 32, "classes": 3},
             {"width": 256, "depth": 2}, 64, (64, 16), 60),
    "mlp": ("mlp", "synthetic", {"samples": 8000, "features": 512, "classes": 10},
            {"width": 1024, "depth": 4}, 256, (256, 64), 30),
    "vit": ("vit", "synthetic_images", {"samples": 800, "size": 64, "classes": 10},
            {"patch_size": 16, "width": 192, "depth": 6, "heads": 3}, 16, (16, 4), 30),
}  # fmt: skip


def _ranks(rank: int, out: str, preset: str, steps: int, micros: list[int]) -> None:
    import torch
    import torch.distributed as dist

    import tuner.trial.loop.lockstep as lockstep
    import tuner.trial.loop.parallel as parallel
    from tuner.config import TrainingSection
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.loop.run import build_parts, optimizer_step

    model, data, data_args, sizes, per_rank, _, _ = PRESETS[preset]
    torch.set_num_threads(1)
    asked = {"n": 0}  # the gates' all-reduces

    def counted(self: Any, phase: Any) -> Any:
        asked["n"] += 1
        return ask(self, phase)

    def agreed(self: Any, ok: bool) -> bool:
        asked["n"] += 1
        return agree(self, ok)

    ask, agree = lockstep.Gate._ask, lockstep.Gate.agree
    lockstep.Gate._ask, lockstep.Gate.agree = counted, agreed  # type: ignore[method-assign]
    # One gate alone: the round trip every gate of a step costs (the rest is waiting for the
    # slower rank, which a step without gates waits for at its next collective instead).
    gate = lockstep.make_gate(2)
    alone = []
    for _ in range(GATE_ROUNDS):
        t0 = time.perf_counter()
        gate.passed()
        alone.append(time.perf_counter() - t0)
        gate.clear()
    rows: list[tuple[str, int, list[float], list[float], float]] = []
    for strategy in ("ddp", "fsdp"):
        for micro in micros:
            parts = {}
            for gated in (True, False):
                parallel.make_gate = lockstep.make_gate if gated else (lambda world: lockstep.NoGate())
                spec = TrialSpec(model=model, data=data, data_args=data_args, strategy=strategy, workers=2)
                hp = {**TrainingSection().model_dump(), "amp": "off", "batch_size": 2 * per_rank,
                      "micro_batch": micro, **sizes}  # fmt: skip
                p = build_parts(hp, spec, LocalSession(f"{out}/r{rank}-{gated}"), torch.device("cpu"))
                batches = list(p.feed(p.train.train_steps(0, p.per_rank_batch)))
                parts[gated] = (p, batches)
            times: dict[bool, list[float]] = {True: [], False: []}
            asked["n"] = 0
            for i in range(WARM + steps):
                # Step by step, alternating which goes first: the machine's load of the moment
                # falls on both alike.
                for gated in (True, False) if i % 2 == 0 else (False, True):
                    p, batches = parts[gated]
                    x, y = batches[i % len(batches)]
                    dist.barrier()
                    t0 = time.perf_counter()
                    optimizer_step(p, x, y)
                    dist.barrier()
                    if i >= WARM:
                        times[gated].append(time.perf_counter() - t0)
            rows.append((strategy, micro, times[True], times[False], asked["n"] / (WARM + steps)))
            for p, _ in parts.values():
                p.close()
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps({"gate": statistics.median(alone), "rows": rows}))


def main() -> None:
    import sys

    sys.path.insert(0, str(ROOT))
    from tests.distributed import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(PRESETS), default="tiny")
    parser.add_argument("--steps", type=int, help="timed steps of each (default: the preset's)")
    parser.add_argument("--micro-batches", type=int, nargs="+", help="micro-batches a step (default 1 and 4)")
    args = parser.parse_args()
    preset = PRESETS[args.model]
    steps = args.steps or preset[6]
    with tempfile.TemporaryDirectory() as out:
        micros = [preset[4] // m for m in args.micro_batches] if args.micro_batches else list(preset[5])
        spawn(_ranks, out, args.model, steps, micros)
        found = json.loads(Path(out, "times.json").read_text())
    rows: list[Any] = found["rows"]
    print(f"{args.model}: 2 gloo ranks, {steps} steps each, gated and not alternating step by step")
    print(f"one gate alone: {found['gate'] * 1e6:.0f} us (median of {GATE_ROUNDS})")
    for strategy, micro, gated, plain, gates in rows:
        pairs = sorted(g / p for g, p in zip(gated, plain, strict=True))
        q1, q3 = pairs[len(pairs) // 4], pairs[3 * len(pairs) // 4]
        on, off = statistics.median(gated), statistics.median(plain)
        print(
            f"{strategy:4} {preset[4] // micro} micro-batch(es): gated {on * 1e3:7.1f} ms, "
            f"without {off * 1e3:7.1f} ms; ratio of medians {on / off:.3f}, median pair "
            f"{statistics.median(pairs):.3f} (quartiles {q1:.3f}-{q3:.3f}); {gates:.0f} gates a step, "
            f"their round trips {gates * found['gate'] / off:.2%} of the step"
        )


if __name__ == "__main__":
    main()
