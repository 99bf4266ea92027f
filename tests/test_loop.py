"""The training loop without Ray (LocalSession): what every mode runs."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from tuner.config import TrainingSection
from tuner.config.modes import LOOP_METRICS
from tuner.sweepdir import read_metrics
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.run import run_trial


def hp(**kw: Any) -> dict[str, Any]:
    base = {**TrainingSection().model_dump(), "amp": "off", "lr": 3e-3, "width": 64, "depth": 2}
    return {**base, **kw}


def train(tmp: Path, spec: TrialSpec, params: dict[str, Any], resume: bool = False) -> LocalSession:
    session = LocalSession(str(tmp), resume=resume)
    run_trial(params, spec, session)
    return session


DIGITS = TrialSpec(model="mlp", data="digits", max_epochs=3)
SYNTH = TrialSpec(
    model="mlp", data="synthetic", data_args={"samples": 600, "features": 8, "classes": 3}, max_epochs=2
)


def test_digits_mlp_learns_and_reports_every_metric(tmp_path: Path) -> None:
    s = train(tmp_path, DIGITS, hp())
    assert [m["epoch"] for m in s.metrics] == [1, 2, 3]
    last = s.metrics[-1]
    for key in ("train_loss", "val_loss", "val_acc", "epoch", "samples_per_s", "world_size", "lr"):
        assert key in last
    assert last["world_size"] == 1 and last["samples_per_s"] > 0
    assert last["val_acc"] > 0.85
    assert s.metrics[-1]["train_loss"] < s.metrics[0]["train_loss"]
    assert DirCheckpoints(str(tmp_path)).latest_epoch() == 3
    assert [r["epoch"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]  # the trial's journal
    assert list(tmp_path.glob("events.out.tfevents.*")), "rank 0 writes TensorBoard scalars"
    # What validate lets `metric` name (LOOP_METRICS, val_acc) is what the loop reports.
    reported = {k for k in last if k != "epoch"}
    assert reported - {"val_acc"} <= set(LOOP_METRICS), reported - set(LOOP_METRICS)
    assert {k for k in LOOP_METRICS if not k.startswith("gpu_")} <= reported


def _weights(tmp: Path) -> dict[str, torch.Tensor]:
    return DirCheckpoints(str(tmp)).load("cpu")["model"]


def test_micro_batches_accumulate_to_the_same_step(tmp_path: Path) -> None:
    whole = train(tmp_path / "a", SYNTH, hp(batch_size=64))
    parts = train(tmp_path / "b", SYNTH, hp(batch_size=64, micro_batch=16))
    assert parts.metrics[-1]["micro_batch"] == 16 and whole.metrics[-1]["micro_batch"] == 64
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)
    assert parts.metrics[-1]["val_loss"] == pytest.approx(whole.metrics[-1]["val_loss"], rel=1e-4)


def test_resume_continues_exactly(tmp_path: Path) -> None:
    params = hp(dropout=0.2, optimizer="sgd", lr=0.05)  # dropout: RNG state must resume too
    straight = train(tmp_path / "straight", TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 4}), params)
    part = tmp_path / "parts"
    train(part, TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 2}), params)
    resumed = train(part, TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 4}), params, resume=True)
    assert [m["epoch"] for m in resumed.metrics] == [3, 4]  # continued, not restarted
    assert resumed.metrics[-1]["val_loss"] == pytest.approx(straight.metrics[-1]["val_loss"], rel=1e-5)
    assert "resumed at epoch 2" in (part / "trial.log").read_text()
    assert [r["epoch"] for r in read_metrics(str(part))] == [1, 2, 3, 4]


def test_bf16_autocast_on_cpu(tmp_path: Path) -> None:
    s = train(tmp_path, DIGITS, hp(amp="bf16"))
    assert s.metrics[-1]["val_acc"] > 0.8


def test_fp16_on_cpu_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fp16 needs a CUDA GPU"):
        train(tmp_path, DIGITS, hp(amp="fp16"))


def test_divergence_ends_the_trial_with_the_worst_metric(tmp_path: Path) -> None:
    s = train(tmp_path, TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 5}), hp(optimizer="sgd", lr=1e8))
    last = s.metrics[-1]
    assert last["failure"] == "diverged"
    assert last["val_acc"] == -math.inf  # never promoted by a scheduler, never best
    assert len(s.metrics) < 5


def test_cnn_on_digits_with_cosine_schedule(tmp_path: Path) -> None:
    spec = TrialSpec(model="cnn", data="digits", max_epochs=2)
    s = train(tmp_path, spec, hp(channels=8, blocks=2, lr_schedule="cosine", warmup_epochs=0.5))
    lrs = [m["lr"] for m in s.metrics]
    assert lrs[-1] < lrs[0] or lrs[-1] == pytest.approx(0, abs=1e-9)
    assert s.metrics[-1]["val_acc"] > 0.3


def test_user_model_and_data_from_module_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "mytask.py").write_text(
        textwrap.dedent("""
        import torch
        from torch.utils.data import TensorDataset

        def data(config):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(300, 5, generator=g)
            y = (x[:, 0] > 0).long()
            return TensorDataset(x[:240], y[:240]), TensorDataset(x[240:], y[240:])

        def model(config, input_shape, num_classes):
            return torch.nn.Sequential(torch.nn.Linear(input_shape[0], config["hidden"]), torch.nn.ReLU(),
                                       torch.nn.Linear(config["hidden"], num_classes))
    """)
    )
    monkeypatch.chdir(tmp_path)  # the trial runs elsewhere; search_path finds the module
    spec = TrialSpec(model="mytask:model", data="mytask:data", max_epochs=3, search_path=str(pkg))
    s = train(tmp_path / "out", spec, hp(hidden=16, lr=0.03))
    assert s.metrics[-1]["val_acc"] > 0.8


def test_user_model_must_return_a_module(tmp_path: Path) -> None:
    (tmp_path / "badmodel.py").write_text("def build(config, shape, n):\n    return 42\n")
    spec = TrialSpec(model="badmodel:build", data="digits", max_epochs=1, search_path=str(tmp_path))
    with pytest.raises(TypeError, match="not nn.Module"):
        train(tmp_path / "out", spec, hp())


def test_resume_trims_the_journal_to_the_checkpoint(tmp_path: Path) -> None:
    # A driver killed after the journal line but before the checkpoint: the resumed trial
    # runs that epoch again, and the journal keeps one line per epoch.
    spec = TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 3})
    train(tmp_path, TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 2}), hp())
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 3, "val_acc": 0.0}\n{"epoch": 4, "val_a')  # a line cut short too
    train(tmp_path, spec, hp(), resume=True)
    rows = read_metrics(str(tmp_path))
    assert [r["epoch"] for r in rows] == [1, 2, 3] and rows[-1]["val_acc"] > 0.5


def test_checkpoints_keep_the_newest(tmp_path: Path) -> None:
    session = LocalSession(str(tmp_path), keep=2)
    run_trial(hp(), TrialSpec(**{**DIGITS.to_dict(), "max_epochs": 4}), session)
    names = sorted(p.name for p in tmp_path.glob("checkpoint_e*.pt"))
    assert names == ["checkpoint_e000003.pt", "checkpoint_e000004.pt"]
    assert not list(tmp_path.glob(".checkpoint-*"))


def test_a_failing_trial_leaves_its_traceback(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text(
        "def build(config, shape, n):\n    raise ValueError('no such layer: 42')\n"
    )
    spec = TrialSpec(model="boom:build", data="digits", max_epochs=1, search_path=str(tmp_path))
    with pytest.raises(ValueError):
        train(tmp_path / "out", spec, hp())
    text = (tmp_path / "out" / "traceback.txt").read_text()
    assert "ValueError: no such layer: 42" in text and "Traceback" in text


def test_digits_without_sklearn_are_sklearns_digits_and_split() -> None:
    """The recorded split and the file read directly give exactly what scikit-learn gives, and
    the default split imports no scikit-learn (it costs a trial process about a second)."""
    import subprocess
    import sys

    import numpy as np

    from tuner.trial.loop import digits

    ours = digits.load(digits.RECORDED_VAL_FRACTION)
    theirs = digits._through_sklearn(digits.RECORDED_VAL_FRACTION)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert [len(a) for a in ours] == [1347, 450, 1347, 450]
    assert digits._record() == digits.SPLIT  # the constant is scikit-learn's split today
    other = digits.load(0.3)  # any other fraction: through scikit-learn
    assert len(other[1]) == 540
    probe = (
        "from tuner.trial.loop import digits; import sys; digits.load(0.25); print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_eval_precision_fp32_evaluates_without_autocast(tmp_path: Path) -> None:
    """training.eval_precision (issue 51): under bf16 AMP, `fp32` reports the validation loss of
    the trained weights evaluated in fp32 (computed here by hand), `amp` the bf16 one."""
    from tuner.trial.loop.data import load_data
    from tuner.trial.loop.models import build_model

    spec = TrialSpec(model="mlp", data="synthetic", data_args=SYNTH.data_args, max_epochs=1)
    losses = {}
    for precision in ("amp", "fp32"):
        s = train(tmp_path / precision, spec, hp(amp="bf16", eval_precision=precision))
        losses[precision] = s.metrics[-1]["val_loss"]
    params = hp(amp="bf16", eval_precision="fp32")
    bundle = load_data("synthetic", SYNTH.data_args, params, str(tmp_path))
    net = build_model("mlp", params, bundle.input_shape, bundle.num_classes, str(tmp_path))
    net.load_state_dict(_weights(tmp_path / "fp32"))
    x, y = (torch.stack(t) for t in zip(*[bundle.val[i] for i in range(len(bundle.val))], strict=True))
    with torch.no_grad():
        fp32 = torch.nn.functional.cross_entropy(net.eval()(bundle.prepare(x)).float(), y).item()
    assert losses["fp32"] == pytest.approx(fp32, rel=1e-5)
    assert _weights(tmp_path / "amp").keys() == _weights(tmp_path / "fp32").keys()
    assert losses["amp"] != pytest.approx(fp32, rel=1e-5)  # (bf16's rounding shows)


def test_a_trials_settings_are_the_sweep_files_model_with_its_checks() -> None:
    """A trial reads its training settings through TrainingSection itself (issue 45 part 4):
    its defaults, types and checks, none restated; a value the sweep file would refuse is
    refused in the trial too, naming the field, rather than trained with."""
    from pydantic import ValidationError

    from tuner.trial.frame.settings import Settings

    s = Settings.of({"lr": 1, "batch_size": 32.0, "amp": False, "grad_clip": 0, "width": 7})
    assert (s.lr, type(s.lr), s.batch_size, type(s.batch_size)) == (1.0, float, 32, int)
    assert (s.amp, s.grad_clip, s.micro_batch) == ("off", None, None)  # YAML's off; 0 is no clipping
    rest = [k for k in TrainingSection.model_fields if k not in ("lr", "batch_size", "amp")]
    defaults = TrainingSection()
    assert {k: getattr(s, k) for k in rest} == {k: getattr(defaults, k) for k in rest}
    for bad, field in (({"lr": -0.1}, "lr"), ({"optimizer": "adamm"}, "optimizer"), ({"amp": "fp8"}, "amp")):
        with pytest.raises(ValidationError, match=field):
            Settings.of(bad)
    with pytest.raises(ValidationError):  # frozen: what the trial runs with is what it read
        s.lr = 0.5
