"""Users' own training loops (`task.train: tests.own_loops:...`) for the task.train tests.

`regress`: least squares on generated data, a plain loop through every ctx call. Each start
appends `ctx.epoch` to `starts.txt` in the trial's directory (where it began: 0, or the epoch
it resumed at), and each epoch trained its number to `trained.txt`. `config["behave"]` makes
one configuration misbehave at epoch 2: "oom" (torch.OutOfMemoryError), "nan" (a non-finite
val_loss), "boom" (a ValueError), "text" (val_loss "abc"); "slow" sleeps `epoch_s` per epoch so
a test can catch it mid-way; "final" reports a test_loss for the last epoch after the loop;
"linger" takes `linger_s` to wind down however the loop ends (a user's loop saving its work in
a `finally`, also when the scheduler stops it); "early" returns after epoch 2 (its own early
stopping).
"""

from __future__ import annotations

import itertools
import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

# Every model `regress` built, weakly: the memory test checks none outlives its trial.
MODELS: list[weakref.ref] = []


def _data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def regress(config: dict[str, Any], ctx: Any) -> None:
    _note(ctx, "starts.txt", ctx.epoch)
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    MODELS.append(weakref.ref(net))
    opt = torch.optim.SGD(net.parameters(), lr=float(config["lr"]))
    model, opt = ctx.prepare(net, opt)
    state = ctx.restore()
    if state is not None:
        ctx.load_state_dict(model, opt, state)
    train = ctx.loader(_data(256), int(config["batch_size"]))
    val = ctx.loader(_data(64, seed=1), 64, shuffle=False)
    behave = config.get("behave", "ok")
    if behave == "end_when_restored" and state is not None:
        return  # its own early stopping, decided from what it restored
    try:
        _epochs(config, ctx, model, opt, train, val, behave)
    finally:
        if behave == "linger":
            time.sleep(float(config.get("linger_s", 3.0)))


def _epochs(
    config: dict[str, Any], ctx: Any, model: Any, opt: Any, train: Any, val: Any, behave: str
) -> None:
    for epoch in range(ctx.epoch, ctx.max_epochs):
        if behave == "gate" and epoch == 2:  # waits before its third epoch until the gate exists
            gate = str(config["gate"])
            open(gate + ".waiting", "w").close()
            while not os.path.exists(gate):
                time.sleep(0.02)
        if behave == "slow":
            time.sleep(float(config.get("epoch_s", 0.5)))
        model.train()
        for x, y in train:
            with ctx.autocast():
                loss = nn.functional.mse_loss(model(x), y)
            if behave == "oom" and epoch == 1:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (injected)")
            if behave == "boom" and epoch == 1:
                raise ValueError("boom: this configuration fails on purpose")
            opt.zero_grad(set_to_none=True)
            ctx.scaler.scale(loss).backward()
            ctx.scaler.step(opt)
            ctx.scaler.update()
        model.eval()
        with torch.no_grad():
            val_loss = sum(nn.functional.mse_loss(model(x), y, reduction="sum") for x, y in val) / 64
        if behave == "nan" and epoch == 1:
            val_loss = torch.tensor(float("nan"))
        if behave == "text" and epoch == 1:
            val_loss = "abc"
        _note(ctx, "trained.txt", epoch + 1)  # never trimmed: every epoch ever trained
        ctx.report({"val_loss": val_loss, "train_loss": loss.detach()}, state=ctx.state_dict(model, opt))
        if behave == "early" and epoch == 1:
            return
    if behave == "final":
        with torch.no_grad():
            test_loss = sum(nn.functional.mse_loss(model(x), y, reduction="sum") for x, y in val) / 64
        ctx.report({"epoch": ctx.epoch, "test_loss": test_loss})


def _note(ctx: Any, name: str, value: int) -> None:
    if ctx.is_main and ctx.trial_dir:
        with open(os.path.join(ctx.trial_dir, name), "a") as f:
            f.write(f"{value}\n")


def lines(path: Any) -> list[int]:
    """The numbers a trial wrote with _note, in order."""
    return [int(v) for v in open(path).read().split()] if os.path.exists(path) else []


def no_report(config: dict[str, Any], ctx: Any) -> None:
    """Returns without reporting anything."""


def _where_trials_stood(sweep: Path, grid: Any) -> str:
    """Each trial directory's last trial.log lines: where a stalled sweep's trials were; and
    what Tune last heard from each (its epoch, whether done, its error)."""
    out = ["the HyperBand sweep stalled (no trial reported for ten times the longest wait before)"]
    for result in grid:
        m = result.metrics or {}
        out.append(
            f"tune: {Path(result.path).name}: epoch {m.get('epoch')} "
            f"iteration {m.get('training_iteration')} done {m.get('done')} error {result.error!r}"
        )
    for trial in sorted(p for p in sweep.iterdir() if p.is_dir()):
        log = trial / "trial.log"
        tail = log.read_text().splitlines()[-6:] if log.exists() else ["(no trial.log)"]
        # What the trial's code itself did (the epochs it trained, where each run began, its
        # processes), beside what the trial logged: a stalled run shows which of them hung.
        names = ("trained.txt", "starts.txt", "pids.txt")
        files = {n: (trial / n).read_text().split() for n in names if (trial / n).exists()}
        record = trial / "tuner_trial.json"
        status = json.loads(record.read_text()).get("status") if record.exists() else None
        out.append(f"{trial.name}: {status} {files} " + " | ".join(tail))
    return "\n".join(out)


def _stalled() -> Any:
    """A Tune stopper that ends a sweep whose trials stopped reporting: no result for ten times
    the longest wait between two results so far (at least a minute: the first comes after the
    trial processes start). Paced by the sweep itself, so a slow machine is no stall."""
    from ray.tune.stopper import Stopper

    class Stalled(Stopper):
        def __init__(self) -> None:
            self.last, self.gap, self.fired = time.monotonic(), 0.0, False

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            now = time.monotonic()
            self.gap, self.last = max(self.gap, now - self.last), now
            return False

        def stop_all(self) -> bool:
            self.fired = self.fired or time.monotonic() - self.last > max(60.0, 10 * self.gap)
            return self.fired

    return Stalled()


def hyperband_resumes(storage: Path, space: dict[str, Any], in_flight: int = 0, **task: Any) -> int:
    """Run trials of `task` (TrialSpec fields: trial_mode="train", train=..., or
    trial_mode="command", command=...) for 6 epochs, a grid in `space`, under synchronous
    HyperBand, where a trial that reaches its rung waits, PAUSED, for the bracket; check that
    no trial reported an epoch twice (its journal), that every restart began where its reported
    epochs ended, and that no run trained past its last report more than `in_flight` epochs (a
    loop waits in its report: 0; a script runs on while its report travels to the scheduler,
    so the epoch it began before the pause reached it is begun again: 1; its trained.txt);
    the number of restarts."""
    from ray import tune
    from ray.tune.schedulers import HyperBandScheduler

    from tuner.sweepdir import read_metrics
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.launch.trainables import in_actor_trial

    root = Path(__file__).resolve().parents[1]
    spec = TrialSpec(
        model="",
        data="",
        max_epochs=6,
        metric="val_loss",
        direction="min",
        search_path=str(root),
        start_dir=str(root),
        storage=str(storage),
        sweep_dir=str(storage / "hb"),
        **task,
    )
    # The last rung's trials run on to their end rather than pause there (stop_last_trials):
    # Ray 2.60's HyperBand, when a bracket finishes, stops its PAUSED trials but not one still
    # pausing (saving), which then stays PAUSED and the sweep waits for it until its time
    # budget (hung so in CI: every trial trained, one paused at max_t). Pauses at the earlier
    # rung, the resumes this checks, are untouched.
    scheduler = HyperBandScheduler(
        time_attr="epoch", max_t=spec.max_epochs, reduction_factor=2, stop_last_trials=False
    )
    # A sweep that stalls ends with what each trial last logged, not with the test's timeout
    # and no word of where it stood.
    stalled = _stalled()
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(in_actor_trial, spec=spec), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", scheduler=scheduler),
        run_config=tune.RunConfig(storage_path=str(storage), name="hb", verbose=0, stop=stalled),
    )
    grid = tuner.fit()
    assert not stalled.fired, _where_trials_stood(storage / "hb", grid)
    assert not grid.errors
    resumed = 0
    for trial in sorted(p for p in (storage / "hb").iterdir() if (p / "trained.txt").exists()):
        trained, starts = lines(trial / "trained.txt"), lines(trial / "starts.txt")
        journal = [r["epoch"] for r in read_metrics(str(trial))]
        assert journal == list(range(1, len(journal) + 1)), (trial.name, journal)  # none twice
        # Every restart began where the reported epochs ended, never at 0 again; what a run
        # trained past that (its epoch in flight) is at most `in_flight` epochs.
        assert starts[0] == 0 and all(0 < s <= len(journal) for s in starts[1:]), (trial.name, starts)
        for before, then in itertools.pairwise(trained):
            if then != before + 1:
                assert then - 1 in starts[1:] and 0 < before - then + 1 <= in_flight, (
                    trial.name,
                    trained,
                    starts,
                )
        assert 0 <= trained[-1] - (journal or [0])[-1] <= in_flight, (trial.name, trained, journal)
        resumed += len(starts) - 1
    print(f"HyperBand resumed trials {resumed} times")
    return resumed


def stepped(config: dict[str, Any], ctx: Any) -> None:
    """tests.chaos's MLP that runs out of memory as `config["oom_at"]` plans, trained through
    `ctx.step` on fixed data (512 samples, 8 features, 3 classes)."""
    from tests.chaos import oom_at

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    data = TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long())
    torch.manual_seed(0)
    net = oom_at(config, (8,), 3)
    model, opt = ctx.prepare(net, torch.optim.Adam(net.parameters(), lr=float(config["lr"])))
    train = ctx.loader(data, int(config["batch_size"]))
    for _ in range(ctx.epoch, ctx.max_epochs):
        model.train()
        for xb, yb in train:
            loss = ctx.step(model, opt, (xb, yb), lambda a, b: nn.functional.cross_entropy(model(a), b))
        ctx.report({"val_loss": loss}, state=ctx.state_dict(model, opt))


def own_comm_hook(config: dict[str, Any], ctx: Any) -> None:
    """A DDP loop with a communication hook of its own (as PowerSGD's or a compression hook is
    registered), stepping on its own; with `config["then_step"]`, through ctx.step after it.
    Reports how many buckets its hook reduced."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=g)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    calls = {"n": 0}

    # (No annotations: DDP checks a hook's against its own, and this module's are strings.)
    def counted(state, bucket):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counted)
    for _ in range(ctx.epoch, ctx.max_epochs):
        for xb, yb in ctx.loader(data, int(config["batch_size"])):
            if config.get("then_step"):
                loss = ctx.step(model, opt, (xb, yb), lambda a, b: nn.functional.cross_entropy(model(a), b))
                continue
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
        ctx.report({"val_loss": float(loss), "hook_calls": calls["n"]})
