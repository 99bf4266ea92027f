"""task.loss and task.metrics on a real Ray: under DDP (2 gloo workers) against hand-computed
values, trials whose metric is missing or whose hook raises, and the shipped regression example.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, SPACES, cli, debug_config
from tests.tbread import hparams, scalars

pytestmark = [pytest.mark.slow]

# Module names no other test uses: reused trial actors keep what they imported.
DDP_TASK = "hooks_ddp_task"
DDP_SOURCE = """
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

N_TRAIN, N_VAL = 50, 23


def data(config):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_TRAIN + N_VAL, 3, generator=g)
    y = torch.randn(N_TRAIN + N_VAL, 1, generator=g) * 2 + 5
    return TensorDataset(x[:N_TRAIN], y[:N_TRAIN]), TensorDataset(x[N_TRAIN:], y[N_TRAIN:])


def model(config, input_shape, num_classes):
    assert num_classes is None  # float targets
    return torch.nn.Linear(input_shape[0], 1)


def loss(output, target):
    return F.mse_loss(output, target)


def metrics(output, target):
    return {"ymean": target.mean(), "abserr": (output - target).abs().mean()}
"""


def _module(where: Path, name: str, source: str) -> None:
    (where / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.mark.usefixtures("ray_session")
def test_ddp_metrics_are_exact_weighted_means_over_uneven_batches_and_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.driver.sweep import run_sweep

    _module(tmp_path, DDP_TASK, DDP_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = debug_config(
        tmp_path,
        name="ddp-hooks",
        task={k: f"{DDP_TASK}:{k}" for k in ("model", "data", "loss", "metrics")},
        metric="val_ymean",  # a name tuner does not know: direction is needed
        direction="max",
        search__num_samples=1,
        # lr so small that no weight changes (in fp32): every value below is the initial
        # model's, computed independently here.
        search__params={"lr": 1e-30, "optimizer": "sgd", "momentum": 0.0},
        schedule__max_epochs=1,
        resources__workers_per_trial=2,
        # 25 training samples per rank in steps of 8 (the last of 1); the 23 validation
        # samples are 12 + 11 per rank, in chunks of 4, 4, 4 and 4, 4, 3.
        training__batch_size=16,
        training__eval_batch_size=5,
    )
    out = run_sweep(cfg)
    assert out.exit_code == 0, out.summary
    (trial,) = out.summary["trials"]
    got = trial["last_metrics"]
    assert got["world_size"] == 2

    import hooks_ddp_task as task

    train, val = task.data({})
    torch.manual_seed(0)  # training.seed: the trial's model starts from these weights
    net = task.model({}, (3,), None).double()
    with torch.no_grad():
        (xt, yt), (xv, yv) = train.tensors, val.tensors
        err_v = net(xv.double()) - yv.double()
        train_mse = (net(xt.double()) - yt.double()).pow(2).mean().item()
    assert got["val_ymean"] == pytest.approx(yv.double().mean().item(), rel=1e-6)
    assert got["val_abserr"] == pytest.approx(err_v.abs().mean().item(), rel=1e-5)
    assert got["val_loss"] == pytest.approx(err_v.pow(2).mean().item(), rel=1e-5)
    assert got["train_loss"] == pytest.approx(train_mse, rel=1e-5)
    assert "val_acc" not in got
    assert out.summary["metric"] == "val_ymean" and out.summary["direction"] == "max"
    assert out.summary["best"]["metrics"]["val_ymean"] == got["val_ymean"]
    # TensorBoard: the hooks' values as scalars and as columns of the HParams table.
    run = Path(out.sweep_dir) / trial["trial_id"]
    assert scalars(run)["val_abserr"] == [pytest.approx(got["val_abserr"], rel=1e-6)]
    tags = [m.name.tag for m in hparams(Path(out.sweep_dir))["experiment"].metric_infos]
    # (The columns of what the sweep ranks by come first: the objective's best, issue 33.)
    assert tags[0] == "best/val_ymean" and {"val_ymean", "val_loss", "val_abserr", "train_loss"} <= set(tags)
    assert "val_acc" not in tags


FAIL_TASK = "hooks_fail_task"
FAIL_SOURCE = """
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset


def data(config):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 4, generator=g)
    y = x.sum(1, keepdim=True)
    return TensorDataset(x[:96], y[:96]), TensorDataset(x[96:], y[96:])


def model(config, input_shape, num_classes):
    return torch.nn.Linear(input_shape[0], int(config["outputs"]))


def loss(output, target):
    return F.mse_loss(output[:, :1], target)


def metrics(output, target):
    if output.shape[1] == 3:
        raise ValueError("metrics refused this output on purpose")
    if output.shape[1] == 2:
        return {"other": output.mean()}  # not the sweep's metric
    return {"special": (output - target).abs().mean()}
"""


@pytest.mark.usefixtures("ray_session")
def test_a_missing_metric_and_a_raising_hook_end_their_trials_in_one_line(tmp_path: Path) -> None:
    _module(tmp_path, FAIL_TASK, FAIL_SOURCE)
    sweep = tmp_path / "fail.yaml"
    sweep.write_text(
        json.dumps(
            {
                "name": "fail-hooks",
                "task": {k: f"{FAIL_TASK}:{k}" for k in ("model", "data", "loss", "metrics")},
                "metric": "val_special",
                "direction": "min",
                "search": {"algorithm": "grid", "params": {"outputs": {"type": "grid", "values": [1, 2, 3]}}},
                "schedule": {"max_epochs": 2},
                "resources": {"gpus_per_worker": 0},
                "training": {"batch_size": 32, "amp": "off"},
                "output": str(tmp_path / "runs"),
            }
        )
    )
    out = cli("sweep", str(sweep), cwd=tmp_path, on_session=True)  # the module is found from here
    assert out.returncode == 1, out.stdout + out.stderr
    summary = json.loads((tmp_path / "runs" / "fail-hooks" / "summary.json").read_text())
    by_outputs = {t["config"]["outputs"]: t for t in summary["trials"]}
    ok, missing, raised = by_outputs[1], by_outputs[2], by_outputs[3]
    assert ok["status"] == "TERMINATED" and ok["failure"] is None and ok["epochs"] == 2
    assert summary["best"]["trial_id"] == ok["trial_id"]
    assert missing["status"] == raised["status"] == "ERROR"
    assert missing["failure"].startswith("error: tuner.errors.MissingMetricError: metric 'val_special' is")
    assert raised["failure"] == "error: ValueError: metrics refused this output on purpose"
    assert "NaN" not in json.dumps(summary)
    reported = "(epoch, train_loss, val_loss, val_other, samples_per_s, "
    lines = out.stdout.splitlines()
    line = next(ln for ln in lines if f"trial {missing['trial_id']} failed:" in ln)
    assert (
        f"MissingMetricError: metric 'val_special' is not among the values the trial reported {reported}"
        in line
    )
    line = next(ln for ln in lines if f"trial {raised['trial_id']} failed:" in ln)
    assert "ValueError: metrics refused this output on purpose (full traceback: " in line
    for t in (missing, raised):
        text = (tmp_path / "runs" / "fail-hooks" / t["trial_id"] / "traceback.txt").read_text()
        assert "Traceback" in text


@pytest.mark.usefixtures("ray_session")
def test_the_regression_example_runs_and_beats_the_mean(tmp_path: Path) -> None:
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    out = cli(
        "sweep",
        str(SPACES / "regression.yaml"),
        "--output",
        str(tmp_path),
        "--num-samples",
        "2",
        "--max-epochs",
        "8",
        cwd=ROOT,
        on_session=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = tmp_path / "regression"
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["metric"] == "val_mse" and summary["direction"] == "min"
    # The independent answer: predicting the training targets' mean for every patient.
    x, y = load_diabetes(return_X_y=True)
    _, _, y_train, y_val = train_test_split(x, y, test_size=0.25, random_state=0)
    mean_mse = float(((y_val - y_train.mean()) ** 2).mean())
    best = summary["best"]
    assert best["metrics"]["val_mse"] < 0.8 * mean_mse, (best, mean_mse)
    assert best["metrics"]["val_mse"] == pytest.approx(best["metrics"]["val_loss"], rel=1e-5)
    assert 0 < best["metrics"]["val_mae"] < best["metrics"]["val_mse"] ** 0.5  # MAE <= RMSE
    for t in summary["trials"]:
        assert {"val_mse", "val_mae", "val_loss"} <= t["last_metrics"].keys()
    assert f"best: trial {best['trial_id']} val_mse=" in out.stdout
    tags = {m.name.tag for m in hparams(sweep_dir)["experiment"].metric_infos}
    assert {"val_mse", "val_mae", "val_loss"} <= tags


BESIDE_TASK = "beside_the_sweep_file"
BESIDE_SWEEP = f"""
name: beside
task:
  model: {BESIDE_TASK}:model
  data: {BESIDE_TASK}:data
  loss: {BESIDE_TASK}:loss
  metrics: {BESIDE_TASK}:metrics
metric: val_abserr
direction: min
search:
  algorithm: random
  num_samples: 2
  seed: 0
  params:
    lr: {{type: loguniform, low: 1.0e-3, high: 1.0e-2}}
    optimizer: adam
schedule: {{max_epochs: 2, grace_epochs: 2}}
resources: {{cpus_per_worker: 1}}
training: {{batch_size: 16, amp: off}}
"""


@pytest.mark.usefixtures("ray_session")
def test_a_module_beside_the_sweep_file_is_found_from_anywhere(tmp_path: Path) -> None:
    """`python -m tuner sweep proj/sweep.yaml` from another directory, then `extend` from a
    third: both validate and train with the module beside the sweep file. (In this process,
    on the session's Ray: the directories are tuner's to find, whichever process runs it.)"""
    proj, elsewhere, third = tmp_path / "proj", tmp_path / "elsewhere", tmp_path / "third"
    for d in (proj, elsewhere, third):
        d.mkdir()
    _module(proj, BESIDE_TASK, DDP_SOURCE)
    (proj / "sweep.yaml").write_text(BESIDE_SWEEP)
    assert cli("validate", "../proj/sweep.yaml", cwd=elsewhere).returncode == 0
    out = cli(
        "sweep", "../proj/sweep.yaml", "--output", str(tmp_path / "out"), cwd=elsewhere, on_session=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = tmp_path / "out" / "beside"
    # The sweep directory's sweep.yaml is not beside the module: its recorded directories are.
    assert json.loads((sweep_dir / "code.json").read_text())["import_from"][1] == str(proj)
    more = cli("extend", str(sweep_dir), "--num-samples", "1", cwd=third, on_session=True)
    assert more.returncode == 0, more.stdout + more.stderr
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert [t["status"] for t in summary["trials"]] == ["TERMINATED"] * 3
    assert all(t["last_metrics"]["val_abserr"] > 0 for t in summary["trials"])
