"""Memory in the trial loop, on CPU: what a trial leaves behind when it ends, the optimizer's
state made up front, and out-of-memory outside the micro-batch loop (optimizer step,
evaluation), injected as torch.OutOfMemoryError as a GPU would raise it."""

from __future__ import annotations

import gc
import math
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import tuner.trial.frame.harness as harness
import tuner.trial.loop.run as loop
from tests.chaos import before_adam_step
from tests.test_loop import SYNTH, hp, train
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.settings import Settings
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.optim import OPTIMIZERS, build_optimizer
from tuner.trial.loop.run import build_parts, run_trial

CPU = torch.device("cpu")

# ----------------------------------------------------------------------------- release


class _Stop(Exception):
    pass


@pytest.mark.parametrize("ending", ["finished", "raised", "stopped"])
def test_the_trial_is_gone_before_its_memory_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    # `release` empties the CUDA cache: that frees only blocks no tensor uses any more, so by
    # then nothing may still reference the trial's model, even while its error propagates.
    models: list[weakref.ref] = []
    build = loop.build_model

    def tracked_build(*args: Any) -> torch.nn.Module:
        model = build(*args)
        models.append(weakref.ref(model))
        return model

    alive_at_release: list[bool] = []

    def spy_release(device: torch.device) -> None:
        gc.collect()  # as release does on CUDA: cycles count as gone
        alive_at_release.append(any(ref() is not None for ref in models))

    monkeypatch.setattr(loop, "build_model", tracked_build)
    monkeypatch.setattr(harness, "release", spy_release)  # the trial's frame calls it

    end_trial(run_trial, SYNTH, tmp_path, ending)
    assert models and alive_at_release == [False]


def end_trial(run: Any, spec: TrialSpec, root: Path, ending: str) -> None:
    """Run a trial that ends as `ending`: finished, raised (at its first report: the user's
    code failed) or stopped (SystemExit, what Tune's report raises when the scheduler stops
    or pauses it)."""

    class Session(LocalSession):
        def report(self, metrics: dict[str, Any], state: Any) -> None:
            super().report(metrics, state)
            if ending == "raised":
                raise _Stop("the user's code failed")
            if ending == "stopped":
                raise SystemExit

    if ending == "finished":
        run(hp(), spec, Session(str(root)))
        return
    with pytest.raises((_Stop, SystemExit)):
        run(hp(), spec, Session(str(root)))


# ----------------------------------------------------------------------------- optimizer state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_state_exists_before_the_first_step_and_changes_nothing(name: str) -> None:
    params = hp(optimizer=name, lr=0.05, weight_decay=0.01, momentum=0.9)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    twin.load_state_dict(model.state_dict())
    ours = build_optimizer(model, params)
    if name != "sgd" or params["momentum"]:
        assert len(ours.state) == len(list(model.parameters()))  # made at build time
    assert torch.equal(model[0].weight, twin[0].weight)  # building it moved no weight
    cls, options, _ = OPTIMIZERS[name]
    fresh = cls(twin.parameters(), lr=0.05, **options(Settings.of(params)))  # torch's own, state made lazily
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    for _ in range(3):
        for net, opt in ((model, ours), (twin, fresh)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)  # bit for bit the same training


# ----------------------------------------------------------------------------- OOM outside micro-batches


def test_oom_in_the_optimizer_step_before_it_changed_anything_is_retried_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def oom() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    before_adam_step(monkeypatch, 4, oom)  # after the state's step and two real ones
    s = train(tmp_path / "a", SYNTH, hp(optimizer="adam", batch_size=256))  # 2 steps an epoch
    monkeypatch.undo()
    train(tmp_path / "b", SYNTH, hp(optimizer="adam", batch_size=256))
    assert [m["epoch"] for m in s.metrics] == [1, 2] and "failure" not in s.metrics[-1]
    assert s.metrics[-1]["oom_backoffs"] == 0  # the micro-batch is not what the update needs
    log = (tmp_path / "a" / "trial.log").read_text()
    assert "OOM in the optimizer step (CUDA out of memory. Tried to allocate 2.00 GiB" in log
    a = DirCheckpoints(str(tmp_path / "a")).load("cpu")["model"]
    b = DirCheckpoints(str(tmp_path / "b")).load("cpu")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same update, run once


def test_oom_partway_through_the_optimizer_step_ends_the_trial_as_oom_with_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts: list[Any] = []
    monkeypatch.setattr(loop, "build_parts", lambda *a, **k: parts.append(build_parts(*a, **k)) or parts[-1])

    def oom_after_a_change() -> None:  # as a for-each update that ran out after its first moments
        moment = next(iter(parts[-1].optimizer.state.values()))["exp_avg"]
        with torch.no_grad():
            moment.mul_(0.9)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    before_adam_step(monkeypatch, 4, oom_after_a_change)
    s = train(tmp_path, SYNTH, hp(optimizer="adam", batch_size=256))
    assert len(s.metrics) == 2  # epoch 1, then the trial's result
    last = s.metrics[-1]
    assert last["failure"] == "oom" and last["val_acc"] == -math.inf
    detail = last["failure_detail"]
    assert "optimizer step" in detail and "Tried to allocate 2.00 GiB" in detail and "partway" in detail
    assert last["oom_backoffs"] == 0


def test_oom_in_evaluation_halves_the_evaluation_chunk_and_goes_on(tmp_path: Path) -> None:
    spec = TrialSpec(**{**SYNTH.to_dict(), "model": "tests.chaos:eval_oom_above"})
    # 120 validation samples: 120 -> 60 (2 chunks) -> 30 (4 chunks), which fits.
    backed_off = train(tmp_path / "a", spec, hp(eval_oom_above=40))
    direct = train(tmp_path / "b", spec, hp(eval_oom_above=40, eval_batch_size=30))
    assert "failure" not in backed_off.metrics[-1]
    for a, b in zip(backed_off.metrics, direct.metrics, strict=True):
        assert a["val_loss"] == b["val_loss"] and a["val_acc"] == b["val_acc"]
    log = (tmp_path / "a" / "trial.log").read_text()
    assert "OOM in evaluation at 120 samples: evaluating in chunks of 60" in log
    assert "at 60 samples: evaluating in chunks of 30" in log
    assert log.count("OOM in evaluation") == 2  # the second epoch starts at 30


def test_evaluation_that_does_not_fit_one_sample_ends_as_oom(tmp_path: Path) -> None:
    spec = TrialSpec(**{**SYNTH.to_dict(), "model": "tests.chaos:eval_oom_above"})
    s = train(tmp_path, spec, hp(eval_oom_above=0))
    assert s.metrics[-1]["failure"] == "oom"


def test_the_evaluation_chunk_is_no_larger_than_the_split(tmp_path: Path) -> None:
    p = build_parts(hp(eval_batch_size=1024), SYNTH, LocalSession(str(tmp_path)), CPU)
    assert p.eval_batch == 120
