"""OOM recovery inside a trial, without a GPU: a model that raises torch.OutOfMemoryError
above a batch size stands in for a GPU that is too small."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.test_loop import hp, train
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.spec import TrialSpec

SPEC = TrialSpec(
    model="tests.chaos:oom_above",
    data="synthetic",
    data_args={"samples": 600, "features": 8, "classes": 3},
    max_epochs=3,
)
TRAIN_SAMPLES = 600 - int(600 * 0.2)


def test_oom_halves_the_micro_batch_and_keeps_the_effective_batch(tmp_path: Path) -> None:
    backed_off = train(tmp_path / "a", SPEC, hp(batch_size=64, oom_above=16, width=16))
    from_start = train(tmp_path / "b", SPEC, hp(batch_size=64, oom_above=16, width=16, micro_batch=16))
    last = backed_off.metrics[-1]
    assert last["oom_backoffs"] == 2 and last["micro_batch"] == 16  # 64 -> 32 -> 16
    assert from_start.metrics[-1]["oom_backoffs"] == 0
    # Every training sample is seen every epoch, in both runs.
    assert [m["train_samples"] for m in backed_off.metrics] == [TRAIN_SAMPLES] * 3
    # Same effective batch: the same weights as the run that used micro-batches of 16 throughout.
    wa = DirCheckpoints(str(tmp_path / "a")).load("cpu")["model"]
    wb = DirCheckpoints(str(tmp_path / "b")).load("cpu")["model"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)
    log = (tmp_path / "a" / "trial.log").read_text()
    assert "OOM at micro-batch 64: retrying the step at 32" in log
    assert "OOM at micro-batch 32: retrying the step at 16" in log


def test_the_cpu_allocator_running_out_is_out_of_memory_too(tmp_path: Path) -> None:
    """torch's CPU allocator says it in words of its own ("DefaultCPUAllocator: can't allocate
    memory"), in a RuntimeError: tuner's loop backs off from it as from a CUDA OOM, and a
    script that dies of it ends as oom (its traceback's last line, as Python prints it)."""
    from tests.chaos import IMPOSSIBLE_BYTES
    from tuner.trial.frame.memory import is_oom
    from tuner.trial.script.oom import ran_out

    try:
        torch.empty(IMPOSSIBLE_BYTES, dtype=torch.uint8)
    except RuntimeError as err:
        real = err
    assert is_oom(real), real
    printed = f"{type(real).__name__}: {real}"  # the traceback's last line on the script's stderr
    assert ran_out(None, ["Traceback (most recent call last):", printed]) == printed
    assert ran_out(printed, []) == printed
    s = train(tmp_path, SPEC, hp(batch_size=64, oom_above=16, oom_cpu=True, width=16, max_epochs=1))
    last = s.metrics[-1]
    assert "failure" not in last and last["oom_backoffs"] == 2 and last["micro_batch"] == 16, last


def test_oom_below_the_minimum_ends_the_trial_as_oom(tmp_path: Path) -> None:
    s = train(tmp_path, SPEC, hp(batch_size=64, oom_above=4, min_micro_batch=8, width=16))
    last = s.metrics[-1]
    assert last["failure"] == "oom"
    assert last["val_acc"] == -math.inf  # never promoted, never best
    assert "micro-batch 8" in last["failure_detail"]
    assert len(s.metrics) == 1  # reported once, as the result of the trial


def test_oom_retries_is_refused_where_a_loop_backs_off_inside_the_trial() -> None:
    from tests.conftest import DEBUG
    from tuner.config import ConfigError, parse_sweep, read_yaml

    raw = read_yaml(DEBUG)
    raw["failure"] = {"oom_retries": 1}
    with pytest.raises(ConfigError, match=r"^failure\.oom_retries: task\.command only"):
        parse_sweep(raw)


def test_a_rank_s_unhandled_oom_ends_its_trial_as_oom_not_as_an_error(tmp_path: Path) -> None:
    """A rank of a user's loop that ran out of memory outside ctx.step: the trial actor gets
    Ray's error carrying it, and rank 0's journal records the trial's end as oom, which is the
    trial's outcome over Tune's ERROR (as a 1-worker trial's)."""
    from ray.exceptions import RayTaskError

    from tuner.results import record
    from tuner.trial.frame.journal import MetricsLog
    from tuner.trial.frame.memory import is_oom
    from tuner.trial.launch.ranks import _oom_result

    try:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (outside ctx.step)")
    except torch.OutOfMemoryError as err:
        carried = RayTaskError("run", "Traceback ...", err).as_instanceof_cause()
    assert is_oom(carried) and not is_oom(RuntimeError("connection closed"))
    MetricsLog(str(tmp_path)).append({"epoch": 1, "val_loss": 0.5})
    spec = TrialSpec(model="", data="", trial_mode="train", train="m:f", metric="val_loss", direction="min")
    _oom_result(str(tmp_path), spec, carried)
    (tmp_path / "error.txt").write_text("torch.OutOfMemoryError: ...")
    r = record(str(tmp_path), "val_loss", "min", 3, [])
    assert r.failure == "oom" and r.outcome.value == "oom" and r.epochs == 1, r
