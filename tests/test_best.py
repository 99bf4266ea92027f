"""The best epoch's weights: kept per trial (best.json naming best_eNNNNNN.pt), exported
(<sweep>/best/, `tuner export`), loaded back (`tuner.load_best`), for tuner's loop, under DDP
and for task.train (tests/test_own_loop_ray.py), and the resume gap closed.

The data (tests/best_task.py) trains on flipped labels, so validation accuracy falls epoch
after epoch: a trial's best epoch is its first, never among its newest checkpoints. The
reloaded models are scored here, on the validation split, with plain torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.best_task import accuracy
from tests.conftest import cli, debug_config
from tuner.config import TrainingSection
from tuner.sweepdir import read_best_record, read_metrics
from tuner.trial.frame.checkpoint import plain_state_dict
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.run import run_trial

DATA = "tests.best_task:flipped"


def _mlp(width: int) -> nn.Module:
    """The built-in mlp at depth 1, written out here: model.pt must load into plain torch."""
    return nn.Sequential(nn.Flatten(), nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))


def _scores(model: nn.Module, reported: float) -> None:
    """`model` predicts exactly as many validation samples right as the trial reported."""
    correct, n = accuracy(model)
    assert round(reported * n) == correct and reported == pytest.approx(correct / n, abs=1e-6)


def test_the_best_epoch_is_kept_beside_the_newest_checkpoint(tmp_path: Path) -> None:
    spec = TrialSpec(model="mlp", data=DATA, max_epochs=4, search_path=os.getcwd())
    hp = {
        **TrainingSection().model_dump(),
        "amp": "off",
        "lr": 3e-3,
        "width": 16,
        "depth": 1,
        "optimizer": "adam",
    }
    session = LocalSession(str(tmp_path), keep=1, metric="val_acc", direction="max")
    run_trial(hp, spec, session)
    accs = [m["val_acc"] for m in session.metrics]
    assert accs[0] > accs[-1], accs  # the data makes it fall
    top = accs.index(max(accs)) + 1
    assert sorted(p.name for p in tmp_path.glob("checkpoint_e*.pt")) == ["checkpoint_e000004.pt"]
    best = read_best_record(str(tmp_path))
    assert best is not None and best["epoch"] == top < 4 and best["value"] == max(accs)
    assert [p.name for p in tmp_path.glob("best_e*.pt")] == [f"best_e{top:06d}.pt"]  # the older ones gone
    net = _mlp(16)
    net.load_state_dict(torch.load(best["weights"], weights_only=True))  # plain torch
    _scores(net, best["value"])
    # A resumed trial knows its best so far: a worse epoch does not replace it.
    again = LocalSession(str(tmp_path), resume=True, keep=1, metric="val_acc", direction="max")
    assert again.best is not None and again.best.best_value() == max(accs)
    assert not again.best.offer({"epoch": 5, "val_acc": 0.0}, {"model": {"w": torch.zeros(1)}})


def test_wrapper_prefixes_are_taken_off() -> None:
    t = torch.ones(1)
    assert list(plain_state_dict({"module._orig_mod.0.weight": t, "module._orig_mod.0.bias": t})) == [
        "0.weight",
        "0.bias",
    ]
    assert list(plain_state_dict({"module.a": t, "b": t})) == ["module.a", "b"]  # not everyone's


def test_export_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    out = cli("export", str(tmp_path / "nope"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no such directory" in out.stderr
    out = cli("export", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a sweep directory" in out.stderr
    assert cli("export", str(tmp_path), "--format", "pickle").returncode == 2


def test_onnx_without_its_extra_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed: import fails
    assert main(["export", str(tmp_path), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "onnx extra" in err and "tuner[onnx]" in err, err


def _sweep(tmp_path: Path, **kw: Any) -> Any:
    from tuner.driver.sweep import run_sweep

    params = {
        "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2},
        "width": {"type": "randint", "low": 8, "high": 24},
    }
    cfg = debug_config(
        tmp_path,
        task__data=DATA,
        task__data_args={},
        search__params={**params, "optimizer": "adam", "depth": 1},
        failure__keep_checkpoints=1,
        **kw,
    )
    out = run_sweep(cfg)
    assert out.exit_code == 0, out.summary
    return out


def _best_dir(out: Any) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    best = Path(out.sweep_dir) / "best"
    config = json.loads((best / "config.json").read_text())
    metrics = json.loads((best / "metrics.json").read_text())
    top = out.summary["best"]
    assert config["trial_id"] == top["trial_id"] and config["epoch"] == top["epoch"]
    assert config["task"]["data"] == DATA and config["config"]["width"] == top["config"]["width"]
    assert metrics["val_acc"] == top["metrics"]["val_acc"] and metrics["epoch"] == top["epoch"]
    return best, config, metrics


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_asha_sweep_exports_its_best_epoch_and_resume_writes_a_missing_summary(tmp_path: Path) -> None:
    import tuner
    from tuner.driver.sweep import AlreadyFinished, resume_sweep

    out = _sweep(
        tmp_path,
        name="best-asha",
        search__num_samples=4,
        schedule__max_epochs=4,
        schedule__early_stopping=True,
    )
    best, config, metrics = _best_dir(out)
    trial = Path(out.sweep_dir) / config["trial_id"]
    epochs = [r["epoch"] for r in read_metrics(str(trial))]
    assert config["epoch"] < max(epochs), "the best trial's best epoch is its newest"
    assert not (trial / f"checkpoint_e{config['epoch']:06d}.pt").exists()  # pruned: best_e*.pt kept it
    plain = _mlp(config["config"]["width"])
    plain.load_state_dict(torch.load(best / "model.pt", weights_only=True))
    _scores(plain, metrics["val_acc"])
    _scores(tuner.load_best(out.sweep_dir), metrics["val_acc"])

    # TorchScript round trip: the same outputs as the state dict in plain torch.
    done = cli("export", out.sweep_dir, "--format", "torchscript")
    assert done.returncode == 0, done.stderr
    scripted = torch.jit.load(str(best / "model.ts.pt"))
    x = torch.randn(5, 8)
    assert torch.equal(scripted(x), plain.eval()(x))
    if importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxscript"):  # the extra
        import onnx
        from onnx.reference import ReferenceEvaluator

        from tuner.view.export import export

        export(out.sweep_dir, fmt="onnx")  # (in-process: the exporter's start-up is slow)
        graph = onnx.load(str(best / "model.onnx"))
        onnx.checker.check_model(graph)
        (got,) = ReferenceEvaluator(graph).run(None, {"input": x.numpy()})  # any batch size
        assert torch.allclose(torch.from_numpy(got), plain(x).detach(), atol=1e-5)
    # Another trial, by id, to a directory of its own; an unknown one is one line, exit 2.
    other = next(t["trial_id"] for t in out.summary["trials"] if t["trial_id"] != config["trial_id"])
    done = cli("export", out.sweep_dir, "--trial", other, "--output", str(tmp_path / "other"))
    assert (
        done.returncode == 0
        and json.loads((tmp_path / "other" / "config.json").read_text())["trial_id"] == other
    )
    bad = cli("export", out.sweep_dir, "--trial", "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no trial 'nope'" in bad.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    bad = cli("export", out.sweep_dir, "--output", str(mine))
    assert bad.returncode == 2 and (mine / "notes.txt").read_text() == "mine"

    # The driver killed after the last trial ended, before summary.json and best/.
    (Path(out.sweep_dir) / "summary.json").unlink()
    for f in best.iterdir():
        f.unlink()
    best.rmdir()
    with pytest.raises(AlreadyFinished, match="completed; its summary.json"):
        resume_sweep(out.sweep_dir)
    summary = json.loads((Path(out.sweep_dir) / "summary.json").read_text())
    assert summary["best"] == json.loads(json.dumps(out.summary["best"]))
    assert _best_dir(out)[1]["trial_id"] == config["trial_id"]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_ddp_trained_model_exports_without_its_wrapper(tmp_path: Path) -> None:
    import tuner

    out = _sweep(
        tmp_path,
        name="best-ddp",
        search__num_samples=1,
        schedule__max_epochs=2,
        resources__workers_per_trial=2,
        resources__cpus_per_worker=0.5,
    )
    best, config, metrics = _best_dir(out)
    weights = torch.load(best / "model.pt", weights_only=True)
    assert all(not k.startswith("module.") for k in weights), list(weights)
    plain = _mlp(config["config"]["width"])
    plain.load_state_dict(weights)
    _scores(plain, metrics["val_acc"])
    _scores(tuner.load_best(out.sweep_dir), metrics["val_acc"])
