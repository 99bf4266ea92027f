"""Out of memory on any rank of a DDP or FSDP trial: every rank backs off together.

Two and four ranks in local processes on CPU (gloo, fp32), tuner's own loop: OOMs planned at
random steps, phases (forward, backward, the optimizer step) and ranks (`tests.chaos:oom_at`),
100 over the runs. Every trial goes on to the end, its weights those of an uninterrupted run
at the same effective batch, and each recovery is timed against the run's own steps. The same,
fewer, for a user's own loop through `ctx.step` (`tests.own_loops:stepped`), in the same
processes.
"""

from __future__ import annotations

import json
import logging
import random
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed import spawn
from tests.test_loop import hp
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.spec import TrialSpec

pytestmark = pytest.mark.slow

PER_RANK = 16  # micro-batches of 16 -> 8 -> 4: two halvings a trial (min_micro_batch 4)
DATA = {"samples": 640, "features": 8, "classes": 3}  # 512 training samples
# OOMs per world size (100 over both), most where they are cheap: FSDP's step costs several
# collectives per micro-batch, DDP's one.
INJECTIONS = {"ddp": 35, "fsdp": 15}
OWN_LOOP = 6  # OOMs in one task.train trial per strategy, besides (ctx.step)
RECOVERED = re.compile(r"recovered in ([0-9.]+) s")


def _plan(rng: random.Random, world: int, steps: int, n: int) -> list[list[Any]]:
    """`n` OOMs (n >= 2): two that halve the micro-batch, each on one or more ranks at once
    (forward or backward; on one rank, in any of the step's micro-batches), the rest in the
    optimizer step, at random steps and ranks: [step, phase, rank, forward call]."""
    plan: list[list[Any]] = []
    for i, step in enumerate(sorted(rng.sample(range(steps), 2))):
        phase = rng.choice(["forward", "backward"])
        ranks = rng.sample(range(world), rng.randint(1, min(world, n - len(plan) - (1 - i))))
        call = rng.randrange(2**i) if len(ranks) == 1 else 0  # several ranks: the same attempt
        plan += [[step, phase, r, call] for r in ranks]
    # (Distinct steps and ranks: three on one rank's update would end the trial, as they should.)
    where = rng.sample([(step, r) for step in range(steps) for r in range(world)], n - len(plan))
    return plan + [[step, "step", r, 0] for step, r in where]


def _trials(world: int) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """For each strategy, a run without OOMs, then runs with them until its share is planned."""
    rng = random.Random(46 + world)
    steps = 512 // (PER_RANK * world)
    out = []
    for strategy, share in INJECTIONS.items():
        spec = TrialSpec(
            model="tests.chaos:oom_at", data="synthetic", data_args=DATA, max_epochs=1, strategy=strategy
        ).to_dict()
        spec["workers"] = world
        base = hp(batch_size=PER_RANK * world, width=16, min_micro_batch=4, grad_clip=1.0)
        out.append((f"{strategy}-reference", base, spec))
        left = share
        while left:
            n = rng.randint(5, 8)
            n = left if left - n < 5 else n  # the last run takes what is left
            out.append((f"{strategy}-{len(out)}", {**base, "oom_at": _plan(rng, world, steps, n)}, spec))
            left -= n
        own = {
            **spec,
            "trial_mode": "train",
            "train": "tests.own_loops:stepped",
            "metric": "val_loss",
            "direction": "min",
        }
        out.append((f"own-{strategy}-reference", base, own))
        out.append((f"own-{strategy}-1", {**base, "oom_at": _plan(rng, world, steps, OWN_LOOP)}, own))
    return out


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _run_all(rank: int, root: str, trials: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
    from tests.chaos import INJECTIONS
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.loop.run import run_trial
    from tuner.trial.userloop.run import run_own_loop

    lines = _Lines()  # every rank's warnings (only rank 0 has a trial.log)
    logging.getLogger("tuner.trial.local").addHandler(lines)
    for name, params, spec in trials:
        lines.lines.clear()
        session = LocalSession(str(Path(root, name)))
        (run_own_loop if spec["train"] else run_trial)(params, TrialSpec(**spec), session)
        record = {
            "metrics": session.metrics,
            "fired": len(INJECTIONS.fired),
            "left": [p for p in INJECTIONS.plan if p[2] == rank],  # its own, not yet happened
            "fired_steps": [step for step, _, _ in INJECTIONS.fired],
            "step_ends": INJECTIONS.step_ends,
            "warnings": lines.lines,
        }
        Path(root, name, f"rank{rank}.json").write_text(json.dumps(record))
    if len(trials) and trials[0][2]["workers"] == 2:  # in the same processes (issue 50)
        _own_hooks(rank, str(Path(root, "hooks")))


def _weights(trial_dir: Path) -> dict[str, torch.Tensor]:
    payload = DirCheckpoints(str(trial_dir)).load("cpu")
    return payload["user"]["model"] if "user" in payload else payload["model"]


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_backs_off_together_and_trains_as_if_uninterrupted(tmp_path: Path, world: int) -> None:
    trials = _trials(world)
    spawn(_run_all, str(tmp_path), trials, world=world)
    injected = recoveries = 0
    slowest_step, times = 0.0, []
    for name, params, _ in trials:
        ranks = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in range(world)]
        last = ranks[0]["metrics"][-1]
        assert "failure" not in last and last["epoch"] == 1, (name, last)
        assert all(r["left"] == [] for r in ranks), f"{name}: an OOM was planned but never happened"
        injected += sum(r["fired"] for r in ranks)
        if "oom_at" not in params:
            continue
        assert last["oom_backoffs"] == 2 and last["micro_batch"] == 4, (name, last)
        # The same effective batch throughout: the weights of the run that never ran out.
        ours, ref = _weights(tmp_path / name), _weights(tmp_path / f"{name.rpartition('-')[0]}-reference")
        for k in ref:
            torch.testing.assert_close(ours[k], ref[k], rtol=1e-4, atol=1e-6)
        # Recovery: from the OOM (or the news of it) to the step's retry, the longest over ranks.
        per_rank = [[float(x) for x in RECOVERED.findall(" ".join(r["warnings"]))] for r in ranks]
        assert {len(r) for r in per_rank} == {2}, per_rank
        times += [max(t) for t in zip(*per_rank, strict=True)]
        recoveries += 2
        for r in ranks:  # the steps no OOM touched, as the yardstick
            ends, hit = r["step_ends"], set(r["fired_steps"])
            normal = [b - a for i, (a, b) in enumerate(zip(ends, ends[1:], strict=False)) if i + 1 not in hit]
            slowest_step = max(slowest_step, *normal)
    assert injected == sum(INJECTIONS.values()) + 2 * OWN_LOOP  # 50 at each world size: 100 over both
    print(
        f"\n{world} ranks: {injected} OOMs, {recoveries} back-offs; recovery median "
        f"{statistics.median(times):.3f} s, longest {max(times):.3f} s; "
        f"slowest normal step {slowest_step:.3f} s"
    )
    # Bounded by the run's own pace, not the machine's: a peer reaches its next gate within a step.
    assert max(times) <= max(2.0, 2 * slowest_step), times
    if world == 2:
        _a_users_own_ddp_communication_hook_is_theirs(tmp_path / "hooks")


def _own_hooks(rank: int, root: str) -> None:
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.userloop.run import run_own_loop

    for then_step in (False, True):
        spec = TrialSpec(
            model="", data="", trial_mode="train", train="tests.own_loops:own_comm_hook", max_epochs=1,
            metric="val_loss", direction="min", workers=2,
        )  # fmt: skip
        session = LocalSession(str(Path(root, f"step{int(then_step)}")))
        try:
            run_own_loop({"batch_size": 32, "then_step": then_step}, spec, session)
            outcome = session.metrics
        except RuntimeError as err:
            outcome = str(err)
        Path(root, f"step{int(then_step)}", f"rank{rank}.json").write_text(json.dumps(outcome))


def _a_users_own_ddp_communication_hook_is_theirs(tmp_path: Path) -> None:
    # The gates go in at the first step that backs off, not at ctx.prepare: a loop that steps
    # on its own registers its own hook (DDP takes one), and a hook of its own with ctx.step is
    # refused in a line that says so.
    for rank in range(2):
        own = json.loads((tmp_path / "step0" / f"rank{rank}.json").read_text())
        assert isinstance(own, list), own  # (on error, its message)
        assert own[-1]["epoch"] == 1 and own[-1]["hook_calls"] == 4, own  # 128 samples, 32 a step: 4 steps
        refused = json.loads((tmp_path / "step1" / f"rank{rank}.json").read_text())
        assert "has a DDP communication hook of its own" in str(refused), refused
