"""What the OOM gates cost a step (tuner/trial/loop/lockstep.py): DDP and FSDP over 2 gloo ranks.

Every collective of a multi-worker step first asks every rank, in one small CPU all-reduce,
whether any ran out of memory: one per DDP gradient bucket and one per FSDP all-gather and
reduce-scatter, plus the step's commit and the update's agreement. This times tuner's
`optimizer_step` on the same trial built with the gates and without them (`NoGate`), the two
alternating in every round, and prints each pair's median and their ratio.

    python scripts/bench_oom_gates.py [ROUNDS]       # default 4; results in BENCHMARKS.md
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MICRO = (64, 16)  # micro-batches of a per-rank batch of 64: 1, then 4 per step
STEPS = 27  # timed, after 3 untimed


def _ranks(rank: int, out: str, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    import tuner.trial.loop.lockstep as lockstep
    import tuner.trial.loop.parallel as parallel
    from tuner.config import TrainingSection
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.loop.run import build_parts, optimizer_step

    torch.set_num_threads(1)
    data = {"samples": 4000, "features": 32, "classes": 3}
    times: list[tuple[str, int, bool, float]] = []
    for r in range(rounds):
        for strategy in ("ddp", "fsdp"):
            for micro in MICRO:
                for gated in (True, False) if r % 2 == 0 else (False, True):
                    parallel.make_gate = lockstep.make_gate if gated else (lambda world: lockstep.NoGate())
                    spec = TrialSpec(
                        model="mlp", data="synthetic", data_args=data, strategy=strategy, workers=2
                    )
                    hp = {**TrainingSection().model_dump(), "amp": "off", "batch_size": 128,
                          "micro_batch": micro, "width": 256, "depth": 2}  # fmt: skip
                    p = build_parts(hp, spec, LocalSession(f"{out}/r{rank}"), torch.device("cpu"))
                    batches = list(p.feed(p.train.train_steps(0, p.per_rank_batch)))[: STEPS + 3]
                    for x, y in batches[:3]:
                        optimizer_step(p, x, y)
                    dist.barrier()
                    t0 = time.perf_counter()
                    for x, y in batches[3:]:
                        optimizer_step(p, x, y)
                    dist.barrier()
                    times.append((strategy, micro, gated, (time.perf_counter() - t0) / STEPS))
                    p.close()
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps(times))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.distributed import spawn

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    with tempfile.TemporaryDirectory() as out:
        spawn(_ranks, out, rounds)
        times: list[Any] = json.loads(Path(out, "times.json").read_text())
    print(f"2 gloo ranks, {rounds} alternating rounds of {STEPS} steps, per-rank batch 64")
    for strategy in ("ddp", "fsdp"):
        for micro in MICRO:
            gated = statistics.median(t for s, m, g, t in times if (s, m, g) == (strategy, micro, True))
            plain = statistics.median(t for s, m, g, t in times if (s, m, g) == (strategy, micro, False))
            print(
                f"{strategy:4} micro-batch {micro:2}: gated {gated * 1e3:6.1f} ms/step, "
                f"without {plain * 1e3:6.1f} ms/step, ratio {gated / plain:.2f}"
            )


if __name__ == "__main__":
    main()
