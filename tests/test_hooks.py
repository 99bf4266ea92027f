"""Your own loss and metrics in tuner's loop (task.loss, task.metrics), targets of any kind,
and every bad hook refused: in the sweep file before anything starts, in the trial otherwise.

No Ray here (LocalSession, the CLI's validation); tests/test_hooks_sweep.py runs them on Ray.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import Dataset, TensorDataset

from tests.conftest import ROOT, SPACES, cli
from tuner.config import TrainingSection
from tuner.trial.frame.checkpoint import DirCheckpoints
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.data import _num_classes
from tuner.trial.loop.run import run_trial

REG = "search_spaces.regression:"
REGRESSION = TrialSpec(
    model=REG + "model",
    data=REG + "data",
    loss=REG + "loss",
    metrics=REG + "metrics",
    max_epochs=1,
    metric="val_mse",
    direction="min",
    search_path=str(ROOT),
)


def hp(**kw: Any) -> dict[str, Any]:
    return {**TrainingSection().model_dump(), "amp": "off", "lr": 3e-3, "width": 16, **kw}


def train(tmp: Path, spec: TrialSpec, params: dict[str, Any]) -> LocalSession:
    session = LocalSession(str(tmp), metric=spec.metric)
    run_trial(params, spec, session)
    return session


def test_a_mean_loss_in_uneven_micro_batches_takes_the_whole_batch_step(tmp_path: Path) -> None:
    # 331 training samples in steps of 32 (the last of 11), micro-batches of 12: chunks of
    # 12, 12, 8 and 11. Each chunk's mean is weighted by its size, so the step is the whole
    # batch's; a plain sum of chunk means would weigh the chunks of 8 like those of 12.
    whole = train(tmp_path / "a", REGRESSION, hp(batch_size=32))
    parts = train(tmp_path / "b", REGRESSION, hp(batch_size=32, micro_batch=12))
    assert parts.metrics[-1]["micro_batch"] == 12
    wa = DirCheckpoints(str(tmp_path / "a")).load("cpu")["model"]
    wb = DirCheckpoints(str(tmp_path / "b")).load("cpu")["model"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-4)
    a, b = whole.metrics[-1], parts.metrics[-1]
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
    # The hooks' metrics, and val_loss (the same MSE here), are what the weights give.
    assert a["val_mse"] == pytest.approx(a["val_loss"], rel=1e-6)
    assert {"val_mse", "val_mae", "val_loss"} <= a.keys() and "val_acc" not in a


def test_per_token_classes_use_the_default_loss_and_accuracy(tmp_path: Path) -> None:
    # Integer targets of shape (N, T): a class per position; the model's output (N, C, T).
    (tmp_path / "tokens_task.py").write_text(
        textwrap.dedent("""
        import torch
        from torch.utils.data import TensorDataset

        def data(config):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(400, 4, 6, generator=g)
            y = x.argmax(1)  # per position: which of the 4 channels is largest
            return TensorDataset(x[:320], y[:320]), TensorDataset(x[320:], y[320:])

        def model(config, input_shape, num_classes):
            assert num_classes == 4, num_classes
            return torch.nn.Conv1d(input_shape[0], num_classes, 1)
    """)
    )
    spec = TrialSpec(
        model="tokens_task:model", data="tokens_task:data", max_epochs=3, search_path=str(tmp_path)
    )
    s = train(tmp_path / "out", spec, hp(lr=0.05))
    assert s.metrics[-1]["val_acc"] > 0.8  # chance: 0.25


class _Pairs(Dataset):
    def __init__(self, ys: list[Any]):
        self.ys = ys

    def __len__(self) -> int:
        return len(self.ys)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, Any]:
        return torch.zeros(2), self.ys[i]


def test_num_classes_follows_the_targets() -> None:
    x = torch.zeros(4, 2)
    assert _num_classes(TensorDataset(x, torch.tensor([0, 2, 1, 0])), {}) == 3
    assert _num_classes(TensorDataset(x, torch.rand(4, 1)), {}) is None
    assert _num_classes(TensorDataset(x, torch.tensor([[0, 7], [1, 1], [2, 0], [0, 0]])), {}) == 8
    assert _num_classes(_Pairs([0.5, 1.5]), {}) is None
    assert _num_classes(_Pairs([torch.tensor([1, 4]), torch.tensor([0, 2])]), {}) == 5
    assert _num_classes(_Pairs([1, 2]), {"num_classes": None}) is None  # said outright
    assert _num_classes(TensorDataset(x, torch.rand(4)), {"num_classes": 3}) == 3


def _hooks_module(where: Path, name: str) -> None:
    (where / f"{name}.py").write_text(
        textwrap.dedent("""
        import functools

        def three(output, target, extra):
            return 0

        NOT_A_FUNCTION = [1, 2]

        def wrapped(fn):
            @functools.wraps(fn)
            def inner(*args):
                return fn(*args)
            return inner

        @wrapped
        def needs_three(a, b, c):  # decorated: the source cannot tell; the trial can
            return 0

        def vector(output, target):
            return (output - target) ** 2  # not reduced to the batch's mean

        def named_loss(output, target):
            return {"loss": (output - target).abs().mean()}
    """)
    )


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("loss", "no_such_module:loss", "cannot import module 'no_such_module'"),
        ("loss", "hooks_bad:missing", "module 'hooks_bad' has no function 'missing'"),
        ("loss", "hooks_bad:NOT_A_FUNCTION", "is not callable (a list)"),
        ("loss", "hooks_bad:three", "cannot be called as fn(output, target)"),
        ("metrics", "hooks_bad:three", "cannot be called as fn(output, target)"),
        ("metrics", "hooks_bad", "is not of the form package.module:function"),
    ],
    ids=[
        "loss-no-module",
        "loss-no-function",
        "loss-not-callable",
        "loss-signature",
        "metrics-signature",
        "metrics-form",
    ],
)
def test_the_cli_refuses_a_bad_hook_in_one_line_before_ray(
    tmp_path: Path, field: str, value: str, words: str
) -> None:
    _hooks_module(tmp_path, "hooks_bad")
    raw = yaml.safe_load((SPACES / "debug.yaml").read_text())
    raw["task"][field] = value
    raw["output"] = str(tmp_path / "runs")
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    out = cli("sweep", str(f), cwd=tmp_path)  # modules are found from where it starts
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: task.{field}: "), out.stderr
    assert words in lines[0], lines[0]
    assert not (tmp_path / "runs").exists() and "Ray" not in out.stdout + out.stderr


def test_the_cli_asks_for_mode_of_a_metric_it_does_not_know(tmp_path: Path) -> None:
    raw = yaml.safe_load((SPACES / "debug.yaml").read_text())
    raw.pop("direction")
    raw["metric"] = "val_dice"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    out = cli("validate", str(f))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: direction: required for metric 'val_dice' (max or min): tuner knows the direction of "
        "val_acc, val_loss, train_loss, num_params, val_mse, val_rmse, val_mae only"
    ]
    raw["direction"] = "max"
    f.write_text(yaml.safe_dump(raw))
    out = cli("validate", str(f))  # with mode, the name must be one the trials report
    assert out.returncode == 2 and out.stderr.startswith(
        "error: metric: tuner's loop never reports 'val_dice'"
    )


@pytest.mark.parametrize(
    "loss, metrics, error",
    [
        ("needs_three", None, "task.loss: 'hooks_trial:needs_three' cannot be called as fn(output, target)"),
        ("vector", None, "task.loss: returned (32, 1), not a scalar tensor"),
        (None, "named_loss", "task.metrics: a metric named 'loss'"),
    ],
    ids=["decorated-signature", "loss-not-reduced", "metric-named-loss"],
)
def test_what_only_the_trial_can_see_ends_it_with_one_line(
    tmp_path: Path, loss: Any, metrics: Any, error: str
) -> None:
    _hooks_module(tmp_path, "hooks_trial")
    # The regression example's model and data are found from the repository (on sys.path
    # in tests), the hooks from search_path.
    spec = TrialSpec(
        **{
            **REGRESSION.to_dict(),
            "loss": f"hooks_trial:{loss}" if loss else REGRESSION.loss,
            "metrics": f"hooks_trial:{metrics}" if metrics else REGRESSION.metrics,
            "search_path": str(tmp_path),
        }
    )
    with pytest.raises((TypeError, ValueError)) as err:
        train(tmp_path / "out", spec, hp(batch_size=32))
    assert str(err.value).startswith(error), str(err.value)
    assert error.split(":")[0] in (tmp_path / "out" / "traceback.txt").read_text()


def test_float_targets_without_a_loss_are_refused_in_words(tmp_path: Path) -> None:
    spec = TrialSpec(**{**REGRESSION.to_dict(), "loss": None, "metrics": None})
    with pytest.raises(ValueError, match="task.loss: the targets are not class indices"):
        train(tmp_path, spec, hp())
    spec = TrialSpec(**{**REGRESSION.to_dict(), "model": "mlp"})
    with pytest.raises(ValueError, match="task.model: the built-in mlp classifies"):
        train(tmp_path, spec, hp())


def test_a_missing_metric_fails_the_first_report(tmp_path: Path) -> None:
    spec = TrialSpec(**{**REGRESSION.to_dict(), "metric": "val_rmse"})
    session = LocalSession(str(tmp_path), metric="val_rmse")
    with pytest.raises(Exception) as err:
        run_trial(hp(), spec, session)
    assert type(err.value).__name__ == "MissingMetricError"
    assert str(err.value).startswith(
        "metric 'val_rmse' is not among the values the trial reported (epoch, train_loss, val_loss, "
        "val_mse, val_mae, samples_per_s"
    )
    assert session.metrics == []  # nothing was sent, and no checkpoint written
    assert not list(tmp_path.glob("checkpoint_e*.pt"))
