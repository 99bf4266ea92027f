"""task.train, the user's own loop: refused before Ray when it cannot work, and in a trial
without Ray (LocalSession): resume, divergence, out-of-memory, misuse of ctx."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import tests.own_loops as own_loops
import tuner.trial.frame.harness as harness
from tests.conftest import DEBUG, ROOT, cli
from tests.own_loops import lines
from tests.test_memory import end_trial
from tuner.config import ConfigError, TrainingSection, parse_sweep, read_yaml
from tuner.sweepdir import STOPPED_ITSELF, read_metrics
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.userloop.run import run_own_loop

BAD_MODULE = "user_loops_refused"  # a name no other test imports
SOURCE = """
import torch

CONSTANT = 3

def fine(config, ctx, extra=1): ...
def flexible(*args): ...
def one_arg(config): ...
def three_args(config, ctx, more): ...
def keyword_only(config, ctx, *, more): ...
async def later(config, ctx): ...
"""


def own(train: str = "tests.own_loops:regress", **top: Any) -> dict[str, Any]:
    """debug.yaml's sweep with its task replaced by `task.train`, metric val_loss."""
    raw = read_yaml(DEBUG)
    raw.update(task={"train": train}, metric="val_loss", direction="min")
    raw["search"]["params"] = {"lr": {"type": "loguniform", "low": 0.01, "high": 0.1}}
    for dotted, value in top.items():
        section, _, key = dotted.partition("__")
        if key:
            raw.setdefault(section, {})[key] = value
        else:
            raw[section] = value
    return raw


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / f"{BAD_MODULE}.py").write_text(SOURCE)
    (tmp_path / "user_loops_broken.py").write_text("def train(config, ctx)\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return BAD_MODULE


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ("no_such_module_xyz:train", "cannot import module 'no_such_module_xyz'"),
        ("user_loops_broken:train", "cannot import module 'user_loops_broken' (line 1"),
        (f"{BAD_MODULE}:missing", "has no function 'missing'"),
        (f"{BAD_MODULE}:CONSTANT", "is not callable (a constant); it must be fn(config, ctx)"),
        (f"{BAD_MODULE}:one_arg", "cannot be called as fn(config, ctx): its parameters are (config)"),
        (f"{BAD_MODULE}:three_args", "its parameters are (config, ctx, more)"),
        (f"{BAD_MODULE}:keyword_only", "its parameters are (config, ctx, *, more)"),
        (f"{BAD_MODULE}:later", "is an async function; it is called as fn(config, ctx)"),
        ("no_colon", "is not of the form package.module:function"),
    ],
)
def test_a_train_function_that_cannot_be_called_is_refused(
    user_module: str, train: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_sweep(own(train))
    assert err.value.path == "task.train" and message in str(err.value), str(err.value)


@pytest.mark.parametrize("name", ["fine", "flexible"])
def test_functions_that_take_config_and_ctx_pass(user_module: str, name: str) -> None:
    assert parse_sweep(own(f"{BAD_MODULE}:{name}")).task.train == f"{BAD_MODULE}:{name}"


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"task": {"train": "tests.own_loops:regress", "model": "mlp"}}, "task.model"),
        ({"task": {"train": "tests.own_loops:regress", "data": "digits"}}, "task.data"),
        ({"task": {"train": "tests.own_loops:regress", "data_args": {"samples": 9}}}, "task.data_args"),
        ({"training__find_batch_size": True}, "training.find_batch_size"),
        ({"training__autotune": True}, "training.autotune"),
        ({"resources__gpus_per_worker": "pack"}, "resources.gpus_per_worker"),
        ({"task": {"data": "digits"}}, "task.model"),
    ],
)
def test_settings_the_own_loop_would_ignore_are_refused(change: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_sweep(own(**change))
    assert err.value.path == path, str(err.value)


def test_the_cli_refuses_in_one_line_before_ray(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (DEBUG.read_text()).replace("  model: mlp\n", "  model: mlp\n  train: tests.own_loops:regress\n")
    )
    out = cli("sweep", str(bad), "--output", str(tmp_path), cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "task.model" in out.stderr, out.stderr
    assert not list(tmp_path.glob("debug*")), "nothing written: refused before the sweep started"


# ----------------------------------------------------------------------------- in a trial

SPEC = TrialSpec(
    model="",
    data="",
    trial_mode="train",
    train="tests.own_loops:regress",
    max_epochs=4,
    metric="val_loss",
    direction="min",
)


def hp(**kw: Any) -> dict[str, Any]:
    return {**TrainingSection().model_dump(), "amp": "off", "lr": 0.05, "batch_size": 32, **kw}


def run(tmp: Path, spec: TrialSpec = SPEC, resume: bool = False, **kw: Any) -> LocalSession:
    session = LocalSession(str(tmp), resume=resume)
    run_own_loop(hp(**kw), spec, session)
    return session


def test_a_resumed_own_loop_continues_where_it_stopped_and_ends_where_one_run_ends(tmp_path: Path) -> None:
    straight = run(tmp_path / "straight")
    half = TrialSpec(**{**SPEC.to_dict(), "max_epochs": 2})
    run(tmp_path / "resumed", half)
    resumed = run(tmp_path / "resumed", resume=True)
    assert [m["epoch"] for m in resumed.metrics] == [3, 4]  # epochs go on, not from 1
    assert lines(tmp_path / "resumed" / "starts.txt") == [0, 2]
    assert lines(tmp_path / "resumed" / "trained.txt") == [1, 2, 3, 4]  # none trained twice
    assert [r["epoch"] for r in read_metrics(str(tmp_path / "resumed"))] == [1, 2, 3, 4]
    # The shuffle order follows the epoch, weights and optimizer come back: the same numbers.
    assert [m["val_loss"] for m in resumed.metrics] == [m["val_loss"] for m in straight.metrics[2:]]
    assert straight.metrics[-1]["val_loss"] < straight.metrics[0]["val_loss"] / 10  # it learns
    assert "resumed at epoch 2" in (tmp_path / "resumed" / "trial.log").read_text()


def test_a_resumed_own_loop_with_nothing_new_to_report_ends_as_its_journal_says(tmp_path: Path) -> None:
    """Restored at its last epoch (recorded, then killed before Tune heard of it), a loop has
    nothing left to train; restored earlier, a loop may end at once (its own early stopping).
    Neither is an error: the trial ends with the epoch its journal ends at (the trial actor
    reports it again: journal.report_again), the second marked as stopped by itself."""
    run(tmp_path / "whole")
    whole = read_metrics(str(tmp_path / "whole"))
    resumed = run(tmp_path / "whole", resume=True)  # restored at epoch 4 of 4
    assert resumed.metrics == [] and read_metrics(str(tmp_path / "whole")) == whole
    half = TrialSpec(**{**SPEC.to_dict(), "max_epochs": 2})
    run(tmp_path / "half", half)
    ended = run(tmp_path / "half", resume=True, behave="end_when_restored")
    rows = read_metrics(str(tmp_path / "half"))
    assert ended.metrics == [] and [r["epoch"] for r in rows] == [1, 2] and rows[-1][STOPPED_ITSELF]


@pytest.mark.slow  # (two processes that import torch: seconds without Ray)
def test_a_resumed_trial_waits_for_an_earlier_run_still_writing_and_trains_no_epoch_twice(
    tmp_path: Path,
) -> None:
    """The trial process of a driver killed with -9 lives on a moment (Ray ends it after the
    driver) and may still record an epoch and its checkpoint after `resume` has found the trial
    unfinished. The resumed run waits for it (journal.sole_writer), then continues from what it
    left: no epoch trained twice, none recorded twice."""
    trial, gate = tmp_path / "t", tmp_path / "gate"
    run(trial, TrialSpec(**{**SPEC.to_dict(), "max_epochs": 2}))
    code = (
        "import sys; from pathlib import Path; from tests.test_own_loop import run; "
        "run(Path(sys.argv[1]), resume=True, behave='gate', gate=sys.argv[2])"
    )
    earlier = subprocess.Popen([sys.executable, "-c", code, str(trial), str(gate)], cwd=ROOT)
    try:
        while not Path(f"{gate}.waiting").exists():  # it holds the trial, before its epoch 3
            assert earlier.poll() is None, "the earlier run ended before its gate"
            time.sleep(0.02)
        resumed = threading.Thread(target=run, args=(trial,), kwargs={"resume": True})
        resumed.start()
        log = trial / "trial.log"
        while "still writing its files: waiting" not in log.read_text():
            assert resumed.is_alive(), "the resumed run did not wait for the earlier one"
            time.sleep(0.02)
        gate.touch()
        assert earlier.wait(timeout=120) == 0  # (a hang guard)
        resumed.join()
    finally:
        earlier.kill()
    assert lines(trial / "trained.txt") == [1, 2, 3, 4]
    assert [r["epoch"] for r in read_metrics(str(trial))] == [1, 2, 3, 4]


def test_a_non_finite_metric_ends_the_trial_as_diverged(tmp_path: Path) -> None:
    s = run(tmp_path, behave="nan")
    last = s.metrics[-1]
    assert [m["epoch"] for m in s.metrics] == [1, 2] and last["failure"] == "diverged"
    assert last["val_loss"] == math.inf and "non-finite val_loss at epoch 2" in last["failure_detail"]
    assert lines(tmp_path / "trained.txt") == [1, 2]  # report did not return into the loop
    assert read_metrics(str(tmp_path))[-1]["failure"] == "diverged"


def test_out_of_memory_in_the_users_loop_ends_the_trial_as_oom(tmp_path: Path) -> None:
    s = run(tmp_path, behave="oom")
    last = s.metrics[-1]
    assert last["failure"] == "oom" and last["val_loss"] == math.inf and last["epoch"] == 1
    assert "Tried to allocate 1.00 GiB (injected)" in last["failure_detail"]
    assert "outside ctx.step, which backs off" in last["failure_detail"]  # what to use instead
    assert not (tmp_path / "traceback.txt").exists()  # a result, not a crash


STEPPED = TrialSpec(**{**SPEC.to_dict(), "train": "tests.own_loops:stepped", "max_epochs": 2})


def test_ctx_step_backs_off_and_trains_as_an_uninterrupted_run(tmp_path: Path) -> None:
    # 512 samples in batches of 64: 8 steps an epoch. Out of memory in a forward (step 2), a
    # backward (step 5) and the optimizer step (step 9).
    plan = [[2, "forward", 0, 0], [5, "backward", 0, 0], [9, "step", 0, 0]]
    s = run(tmp_path / "a", STEPPED, batch_size=64, width=16, oom_at=plan)
    straight = run(tmp_path / "b", STEPPED, batch_size=64, width=16)
    assert [m["micro_batch"] for m in s.metrics] == [16, 16] and s.metrics[-1]["oom_backoffs"] == 2
    assert straight.metrics[-1]["oom_backoffs"] == 0
    a, b = (DirCheckpoints(str(tmp_path / d)).load("cpu")["user"]["model"] for d in "ab")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    log = (tmp_path / "a" / "trial.log").read_text()
    assert "OOM at micro-batch 64: retrying the step at 32 (forward, step 2;" in log
    assert "OOM in the optimizer step (CUDA out of memory (injected: optimizer step 9)): retrying it" in log
    # Resumed, the trial keeps the micro-batch it had come down to.
    more = run(
        tmp_path / "a",
        TrialSpec(**{**STEPPED.to_dict(), "max_epochs": 3}),
        resume=True,
        batch_size=64,
        width=16,
    )
    assert more.metrics[-1]["micro_batch"] == 16 and more.metrics[-1]["oom_backoffs"] == 2


def test_ctx_step_below_the_minimum_micro_batch_ends_the_trial_as_oom(tmp_path: Path) -> None:
    plan = [[1, "forward", 0, 0], [1, "forward", 0, 1]]  # 64 -> 32 -> 16, below the minimum of 32
    s = run(tmp_path, STEPPED, batch_size=64, width=16, min_micro_batch=32, oom_at=plan)
    last = s.metrics[-1]
    assert (
        last["failure"] == "oom" and "out of memory at micro-batch 32 (minimum 32)" in last["failure_detail"]
    )


def test_misuse_of_ctx_fails_the_trial_with_a_clear_error(tmp_path: Path) -> None:
    module = tmp_path / "misuse_loops.py"
    module.write_text(
        textwrap.dedent(
            """
            def restarts(config, ctx):
                ctx.report({"val_loss": 1.0, "epoch": 1}, state={"step": 1})
            """
        )
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        spec = TrialSpec(**{**SPEC.to_dict(), "train": "misuse_loops:restarts"})
        run(tmp_path / "a", spec)  # epoch 1 as tuner counts it: fine
        with pytest.raises(ValueError, match=r"metrics\['epoch'\] is 1 but this is epoch 2"):
            run(tmp_path / "a", spec, resume=True)
        assert "ValueError" in (tmp_path / "a" / "traceback.txt").read_text()
        with pytest.raises(RuntimeError, match="returned without calling ctx.report"):
            run(tmp_path / "b", TrialSpec(**{**SPEC.to_dict(), "train": "tests.own_loops:no_report"}))


@pytest.mark.parametrize("ending", ["finished", "raised", "stopped"])
def test_the_users_model_is_gone_before_the_trials_memory_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    alive_at_release: list[bool] = []

    def spy_release(device: Any) -> None:
        gc.collect()  # as release does on CUDA
        alive_at_release.append(any(ref() is not None for ref in own_loops.MODELS))

    monkeypatch.setattr(harness, "release", spy_release)
    own_loops.MODELS.clear()

    end_trial(run_own_loop, SPEC, tmp_path, ending)
    assert own_loops.MODELS and alive_at_release == [False]
