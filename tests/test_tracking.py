"""MLflow tracking (issue 15): a real local MLflow store, read back with MLflow's own client."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DEBUG, cli, debug_config
from tuner.sweepdir import read_metrics

NO_MLFLOW = "the mlflow extra is not installed (pip install 'tuner[mlflow]')"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_every_trial_is_a_run_under_the_sweep_s_run(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason=NO_MLFLOW)
    from mlflow.tracking import MlflowClient

    from tuner.driver.sweep import run_sweep

    uri = f"sqlite:///{tmp_path}/mlflow.db"  # (MLflow 3 refuses its old file store by default)
    cfg = debug_config(
        tmp_path, search__num_samples=3, schedule__max_epochs=2, tracking={"mlflow": {"uri": uri}}
    )
    out = run_sweep(cfg)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("debug")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["tuner.sweep_dir"] == out.sweep_dir
    children = {r.data.tags["tuner.trial"]: r for r in runs if r.data.tags.get("mlflow.parentRunId")}
    assert set(children) == {t["trial_id"] for t in out.summary["trials"]}
    for t in out.summary["trials"]:
        run = children[t["trial_id"]]
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
        for k, v in t["config"].items():
            assert run.data.params[k] == str(v)
        # Every epoch's val_acc as the trial's own journal has it, with the epoch as step.
        journal = [(r["epoch"], r["val_acc"]) for r in read_metrics(str(Path(out.sweep_dir) / t["trial_id"]))]
        logged = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_acc")]
        assert [s for s, _ in sorted(logged)] == [e for e, _ in journal]
        assert [v for _, v in sorted(logged)] == pytest.approx([v for _, v in journal])


def test_tracking_without_a_uri_is_one_line(tmp_path: Path) -> None:
    done = cli("validate", str(DEBUG), "--set", "tracking.mlflow={experiment: x}")
    assert done.returncode == 2 and done.stderr.startswith("error: tracking.mlflow.uri:"), done.stderr
