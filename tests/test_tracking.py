"""MLflow tracking (issue 15): a real local MLflow store, read back with MLflow's own client."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import DEBUG, cli, debug_config, run_cli
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


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the test uses it


@pytest.mark.parametrize("store", ["http", "sqlite"])
def test_an_unreachable_store_is_one_line_before_ray_starts(tmp_path: Path, store: str) -> None:
    pytest.importorskip("mlflow", reason=NO_MLFLOW)
    uri = {
        "http": f"http://127.0.0.1:{_closed_port()}",  # nothing listens there
        "sqlite": f"sqlite:///{tmp_path}/mlflow.db",  # a file that is no database
    }[store]
    (tmp_path / "mlflow.db").write_text("runs: see my notes\n")
    began = time.monotonic()
    done = run_cli(
        "sweep", str(DEBUG), "--output", str(tmp_path), "--set", f"tracking.mlflow.uri={uri}", timeout=150
    )
    took = time.monotonic() - began
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: tracking.mlflow.uri: the MLflow store does not answer: ")
    assert done.stderr.count("\n") == 1, done.stderr
    assert ("Connection refused" if store == "http" else "file is not a database") in done.stderr
    assert "[tuner] debug:" not in done.stdout  # Ray never started, nothing ran
    assert not (tmp_path / "debug").exists()
    assert took < 60, f"{took:.0f} s to refuse it"


@pytest.mark.slow
def test_a_store_that_fails_mid_sweep_is_one_warning_and_the_sweep_goes_on(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason=NO_MLFLOW)
    db = tmp_path / "mlflow.db"
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(DEBUG.read_text() + f"tracking:\n  mlflow:\n    uri: sqlite:///{db}\n")
    broken = threading.Event()

    def break_the_store_once_an_epoch_is_logged() -> None:
        # (Not by reading the database: a reader's lock can fail MLflow's own writes.)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if any(len(read_metrics(str(d))) >= 2 for d in (tmp_path / "debug").glob("*/")):
                break
            time.sleep(0.2)
        with open(db, "r+b") as f:  # the database's header and first pages overwritten
            f.write(b"this is not a database any more" * 2000)
        broken.set()

    watcher = threading.Thread(target=break_the_store_once_an_epoch_is_logged, daemon=True)
    watcher.start()
    done = run_cli(
        "sweep",
        str(cfg),
        "--output",
        str(tmp_path),
        "--max-epochs",
        "6",
        "--set",
        "schedule.early_stopping=false",
    )
    watcher.join(5)
    assert broken.is_set(), "the store was never broken (no epoch logged)\n" + done.stderr[-3000:]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    warnings = [ln for ln in done.stderr.splitlines() if "tracking.mlflow" in ln]
    assert len(warnings) == 1 and "the sweep goes on" in warnings[0], done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads((tmp_path / "debug" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["counts"] == {"completed": 4}
