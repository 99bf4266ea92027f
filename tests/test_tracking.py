"""Tracking (issues 15 and 51): a real local MLflow store, read back with MLflow's own client, and
W&B in offline mode, its files read back in W&B's own record format."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import DEBUG, cli, debug_config, run_cli
from tests.wandbread import offline_runs
from tuner.sweepdir import Place, read_metrics

NO_MLFLOW = "the mlflow extra is not installed (pip install 'tuner[mlflow]')"
NO_WANDB = "the wandb extra is not installed (pip install 'tuner[wandb]')"
API_KEY = "tunertest" + "0" * 31 + "k3y"  # W&B's keys have 40+ characters


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_every_trial_is_a_run_of_mlflow_and_of_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both trackers in one sweep: MLflow's runs read back with MLflow's client, W&B's offline
    files with W&B's own record format, each against the trials' own journals."""
    pytest.importorskip("mlflow", reason=NO_MLFLOW)
    pytest.importorskip("wandb", reason=NO_WANDB)
    from mlflow.tracking import MlflowClient

    from tuner.driver.sweep import run_sweep

    monkeypatch.setenv("WANDB_MODE", "offline")  # (the driver logs in this process)
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"  # (MLflow 3 refuses its old file store by default)
    cfg = debug_config(
        tmp_path,
        search__num_samples=3,
        schedule__max_epochs=2,
        tracking={"mlflow": {"uri": uri}, "wandb": {"project": "digits", "tags": ["t1"]}},
    )
    out = run_sweep(cfg)
    journals = {
        t["trial_id"]: read_metrics(str(Path(out.sweep_dir) / t["trial_id"])) for t in out.summary["trials"]
    }
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("debug")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["tuner.sweep_dir"] == out.sweep_dir
    children = {r.data.tags["tuner.trial"]: r for r in runs if r.data.tags.get("mlflow.parentRunId")}
    assert set(children) == set(journals)
    for t in out.summary["trials"]:
        run = children[t["trial_id"]]
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
        for k, v in t["config"].items():
            assert run.data.params[k] == str(v)
        # Every epoch's val_acc as the trial's own journal has it, with the epoch as step.
        journal = [(r["epoch"], r["val_acc"]) for r in journals[t["trial_id"]]]
        logged = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_acc")]
        assert [s for s, _ in sorted(logged)] == [e for e, _ in journal]
        assert [v for _, v in sorted(logged)] == pytest.approx([v for _, v in journal])

    # W&B: one offline run per trial under the sweep directory, grouped by the sweep.
    prefix = (Path(out.sweep_dir) / ".wandb_sweep").read_text().strip()
    found = offline_runs(Path(out.sweep_dir) / "wandb")
    assert set(found) == {f"{prefix}-{tid}" for tid in journals}
    for t in out.summary["trials"]:
        (run,) = found[f"{prefix}-{t['trial_id']}"]
        assert (run.project, run.group, run.name, run.job_type) == ("digits", "debug", t["trial_id"], "trial")
        assert run.tags == ["t1"] and run.exit_code == 0 and run.summary["tuner_status"] == "finished"
        full = json.loads((Path(out.sweep_dir) / t["trial_id"] / "tuner_trial.json").read_text())["config"]
        assert {k: run.config[k] for k in full} == full
        journal = journals[t["trial_id"]]
        assert [h["epoch"] for h in run.history] == [r["epoch"] for r in journal]
        for h, r in zip(run.history, journal, strict=True):
            for name in ("val_acc", "train_loss"):
                assert h[name] == pytest.approx(r[name]), name
    # The API key W&B was given is nowhere in the sweep directory (W&B's logs included).
    files = [p for p in Path(out.sweep_dir).rglob("*") if p.is_file()]
    assert [p for p in files if API_KEY.encode() in p.read_bytes()] == []


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
    # Asked once, not through MLflow's own 7 retries with back-off (about 4 minutes).
    assert took < 120, f"{took:.0f} s to refuse it"


_TELEMETRY_PROBE = """
import json, os, sys
from tuner.driver import mlflow_store
from tuner.errors import ConfigError
try:
    mlflow_store.check(sys.argv[1], "e")
except ConfigError:
    pass  # (nothing listens there: what matters is how MLflow was imported)
from mlflow.telemetry import get_telemetry_client
print(json.dumps({"client": get_telemetry_client() is not None,
                  "env": os.environ.get(mlflow_store.TELEMETRY_ENV)}))
"""


@pytest.mark.parametrize("user", ["", "DO_NOT_TRACK=false", "MLFLOW_DISABLE_TELEMETRY=1"])
def test_mlflow_imported_for_tracking_sends_its_makers_nothing(tmp_path: Path, user: str) -> None:
    """MLflow 3 starts a telemetry client (a thread that fetches its configuration from
    mlflow-telemetry.io, then posts usage events) in every process that imports it, unless
    told not to or run under CI or pytest (PYTEST_CURRENT_TEST, left out here as a user's
    shell has none). The driver imports it for the store the user named: none is started.
    A user's own setting of either variable is left as it is. (Any request that got out
    would go to a proxy on loopback where nothing listens.)"""
    pytest.importorskip("mlflow", reason=NO_MLFLOW)
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    ci = {"PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"}
    env = {k: v for k, v in os.environ.items() if k not in ci}
    proxy = f"http://127.0.0.1:{_closed_port()}"
    env.update(HTTPS_PROXY=proxy, HTTP_PROXY=proxy, NO_PROXY="")
    if user:
        name, _, value = user.partition("=")
        env[name] = value
    done = subprocess.run(
        [sys.executable, "-c", _TELEMETRY_PROBE, f"http://127.0.0.1:{_closed_port()}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if not user:
        assert seen == {"client": False, "env": "true"}, seen
    else:  # the user's word: ours is not added (MLflow reads theirs)
        assert seen["env"] == (user.partition("=")[2] if user.startswith("MLFLOW") else None), seen


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


def _trial(sweep_dir: Path, trial_id: str, **config: object) -> SimpleNamespace:
    """A trial as Tune hands it to callbacks: its id, configuration, directory, last result."""
    (sweep_dir / trial_id).mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(trial_id=trial_id, config=config, path=str(sweep_dir / trial_id), last_result={})


def test_tunes_hooks_never_wait_for_the_store_and_every_call_is_made_in_order(tmp_path: Path) -> None:
    """Tune's hooks queue the tracker's calls for a thread of its own: while that thread is
    held (its first call waits on a gate the test opens), trials start, report and end in Tune
    without the store hearing of them; once it goes on, the store has every run, its numbers in
    order and its end, and the sweep's end waits for all of it."""
    pytest.importorskip("mlflow", reason=NO_MLFLOW)
    from mlflow.tracking import MlflowClient

    from tuner.driver.tracking import MLflowTracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (tmp_path / "s").mkdir()
    tracker = MLflowTracking(uri, "exp", "s", Place(str(tmp_path / "s")))
    tracker.setup()
    tracker.flush()
    assert not tracker.failed
    client = MlflowClient(tracking_uri=uri)
    gate, held = threading.Event(), threading.Event()
    tracker._later(lambda: (held.set(), gate.wait(120)))  # (a store that takes its time)
    held.wait(120)
    a, b = _trial(tmp_path / "s", "a_1", lr=0.1), _trial(tmp_path / "s", "b_2", lr=0.2)
    for epoch in (1, 2, 3):
        for t in (a, b):
            if epoch == 1:
                tracker.on_trial_start(0, [], t)
            tracker.on_trial_result(0, [], t, {"epoch": epoch, "val_acc": epoch / 10})
    b.last_result = {"failure": "diverged"}
    for t in (a, b):
        tracker.on_trial_complete(0, [], t)
    trials = "tags.`tuner.trial` != ''"
    assert client.search_runs([tracker.experiment_id], filter_string=trials) == []  # (Tune went on)
    gate.set()
    tracker.on_experiment_end([])
    runs = {r.data.tags["tuner.trial"]: r for r in client.search_runs([tracker.experiment_id], trials)}
    assert {name: r.info.status for name, r in runs.items()} == {"a_1": "FINISHED", "b_2": "FAILED"}
    history = client.get_metric_history(runs["a_1"].info.run_id, "val_acc")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert runs["b_2"].data.params == {"lr": "0.2"}
    assert client.get_run(tracker.parent).info.status == "FINISHED" and not tracker.failed


def test_a_killed_runs_ended_trials_are_closed_as_they_ended_when_the_sweep_goes_on(tmp_path: Path) -> None:
    """The driver killed (-9) after a trial's record said it ended but before MLflow heard:
    the next run of the sweep (`resume`, `extend`) closes that trial's run as the trial ended
    (its record, its journal's failure), logs the epochs its journal has and the store lacks,
    logs a trial the store never heard of from its record and journal, and leaves the run of a
    trial to be continued to it. Seen under load in test_places: one child run RUNNING for good
    in a finished sweep; then, with the tracker's calls queued, trials missing altogether."""
    pytest.importorskip("mlflow", reason=NO_MLFLOW)
    from mlflow.tracking import MlflowClient

    from tuner.driver.callbacks import CatchUp
    from tuner.driver.tracking import MLflowTracking
    from tuner.sweepdir.files import METRICS_FILE, write_record

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = tmp_path / "s"
    sweep.mkdir()
    first = MLflowTracking(uri, "exp", "s", Place(str(sweep)))
    first.setup()
    # (last_5: ended by its journal, trained to max_epochs, before its record said so)
    ended = {"done_1": "TERMINATED", "failed_2": "TERMINATED", "error_3": "ERROR", "cut_4": "RUNNING"}
    ended["last_5"] = "RUNNING"
    trials = {name: _trial(sweep, name, lr=0.1) for name in ended}
    for name, status in ended.items():
        first.on_trial_start(0, [], trials[name])
        write_record(str(sweep / name), {"trial_id": name, "status": status})
    rows = [{"epoch": e, "val_acc": e / 10, "val_loss": 1 - e / 10} for e in (1, 2, 3)]
    first.on_trial_result(0, [], trials["last_5"], rows[0])  # (its later epochs: queued, lost)
    first.flush()  # (the tracker's calls made: they run in a thread of its own)
    (sweep / "failed_2" / METRICS_FILE).write_text(json.dumps({"epoch": 1, "failure": "diverged"}) + "\n")
    for name in ("last_5", "unheard_6"):
        (sweep / name).mkdir(exist_ok=True)
        (sweep / name / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    # (never heard of: its start, results and end all queued when the driver was killed)
    write_record(
        str(sweep / "unheard_6"), {"trial_id": "unheard_6", "status": "TERMINATED", "config": {"lr": 0.3}}
    )
    # (one Tune failed before it started: no run, here as in a sweep never killed)
    (sweep / "never_7").mkdir()
    write_record(str(sweep / "never_7"), {"trial_id": "never_7", "status": "ERROR", "never_started": True})
    # (killed here: no completion, no end reached MLflow)
    client = MlflowClient(tracking_uri=uri)

    def statuses() -> dict[str, str]:
        runs = client.search_runs([first.experiment_id], filter_string="tags.`tuner.trial` != ''")
        return {r.data.tags["tuner.trial"]: r.info.status for r in runs}

    assert set(statuses().values()) == {"RUNNING"}
    again = MLflowTracking(uri, "exp", "s", Place(str(sweep)))
    again.setup()  # (then the sweep's callbacks' catch-up, as Tune's setup of them runs it)
    CatchUp(Place(str(sweep)), [again], ("val_acc", "max"), max_epochs=3).setup()
    again.flush()
    assert not again.failed and again.parent == first.parent
    assert statuses() == {
        **{"done_1": "FINISHED", "failed_2": "FAILED", "error_3": "FAILED", "cut_4": "RUNNING"},
        **{"last_5": "FINISHED", "unheard_6": "FINISHED"},
    }
    runs = {
        r.data.tags["tuner.trial"]: r
        for r in client.search_runs([first.experiment_id], "tags.`tuner.trial` != ''")
    }
    for name in ("last_5", "unheard_6"):  # every epoch of its journal, once, against the journal
        for key in ("val_acc", "val_loss"):
            history = client.get_metric_history(runs[name].info.run_id, key)
            assert sorted((m.step, m.value) for m in history) == [(r["epoch"], r[key]) for r in rows], name
    assert runs["unheard_6"].data.params == {"lr": "0.3"}
    assert runs["unheard_6"].data.tags["mlflow.parentRunId"] == first.parent
    again.on_trial_start(0, [], trials["cut_4"])  # continued, in its run
    again.on_trial_complete(0, [], trials["cut_4"])
    again.on_experiment_end([])
    assert statuses()["cut_4"] == "FINISHED" and len(statuses()) == 6
    assert client.get_run(first.parent).info.status == "FINISHED"


@pytest.mark.slow  # (W&B's client and its service process start: seconds)
def test_wandb_runs_continue_a_trial_and_end_as_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracker driven as Tune drives it: a trial paused and started again logs on in its
    run (the same id), a failed trial's run ends failed, one cut off by the sweep's end is
    marked to be continued, and a second run of the sweep (`resume`) keeps the prefix."""
    pytest.importorskip("wandb", reason=NO_WANDB)
    from tuner.config.schedule import WandbSection
    from tuner.driver.tracking import WandbTracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    tracker = WandbTracking(WandbSection(), "s", Place(str(tmp_path)))
    tracker.setup()
    a, b, c = (_trial(tmp_path, t, lr=0.1) for t in ("a_1", "b_2", "c_3"))
    for t in (a, b, c):
        tracker.on_trial_start(0, [], t)
    tracker.on_trial_result(0, [], a, {"epoch": 1, "val_acc": 0.5, "training_iteration": 1})
    tracker.on_trial_result(0, [], b, {"epoch": 1, "val_acc": float("nan"), "failure": "diverged"})
    b.last_result = {"failure": "diverged"}
    tracker.on_trial_complete(0, [], b)
    tracker.flush()
    tracker.runs[a.trial_id].finish()  # (paused: Tune starts it again later)
    del tracker.runs[a.trial_id]
    tracker.on_trial_start(0, [], a)
    tracker.on_trial_result(0, [], a, {"epoch": 2, "val_acc": 0.7})
    tracker.on_trial_complete(0, [], a)
    tracker.on_experiment_end([])  # c never completed: cut off
    assert not tracker.failed
    prefix = (tmp_path / ".wandb_sweep").read_text().strip()
    runs = offline_runs(tmp_path / "wandb")
    first, second = runs[f"{prefix}-a_1"]
    assert [h["epoch"] for h in first.history + second.history] == [1, 2]
    assert second.summary["tuner_status"] == "finished" and second.exit_code == 0
    (failed,) = runs[f"{prefix}-b_2"]
    assert failed.summary["tuner_failure"] == "diverged" and failed.exit_code == 1
    assert "val_acc" not in failed.history[0]  # (NaN is not logged; the journal has it)
    (cut,) = runs[f"{prefix}-c_3"]
    assert cut.summary["tuner_status"] == "killed"
    again = WandbTracking(WandbSection(), "s", Place(str(tmp_path)))
    again.setup()
    again.flush()
    assert again.prefix == prefix
    again.on_experiment_end([])


KILLED_DRIVER = """
import json, os, signal, sys
from types import SimpleNamespace
from tuner.config.schedule import WandbSection
from tuner.driver.tracking import WandbTracking
from tuner.sweepdir import Place, write_record

sweep = sys.argv[1]
tracker = WandbTracking(WandbSection(), "s", Place(sweep))
tracker.setup()
ended = {"done_1": "TERMINATED", "failed_2": "ERROR", "cut_3": "RUNNING", "whole_4": "TERMINATED"}
for name, status in ended.items():
    trial = SimpleNamespace(trial_id=name, config={"lr": 0.1}, path=os.path.join(sweep, name), last_result={})
    os.makedirs(trial.path, exist_ok=True)
    tracker.on_trial_start(0, [], trial)
    tracker.on_trial_result(0, [], trial, {"epoch": 1, "val_acc": 0.5})
    write_record(trial.path, {"trial_id": name, "status": status, "started": 0.0})
    if name == "whole_4":  # (its run ended as Tune told the tracker)
        tracker.on_trial_complete(0, [], trial)
tracker.flush()  # (what the tracker heard before the kill)
# (never heard of: its start, results and end all queued when the driver was killed)
unheard = os.path.join(sweep, "unheard_5")
os.makedirs(unheard)
write_record(unheard, {"trial_id": "unheard_5", "status": "TERMINATED", "config": {"lr": 0.3}})
with open(os.path.join(unheard, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"epoch": e, "val_acc": e / 10}) + chr(10) for e in (1, 2, 3))
assert not tracker.failed
os.kill(os.getpid(), signal.SIGKILL)  # before the tracker heard of the others' ends
"""


@pytest.mark.slow  # (two drivers' W&B clients and service processes start: seconds)
def test_a_killed_drivers_wandb_runs_of_ended_trials_end_as_the_trials_did_when_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver killed (-9) after trials' records said they ended but before W&B heard: the
    sweep's next run (`resume`, `extend`) resumes each such trial's run and ends it as the trial
    ended; a trial to be continued keeps its run open for its own continuation, and a run the
    killed driver had ended is not touched again."""
    pytest.importorskip("wandb", reason=NO_WANDB)
    import os
    import subprocess
    import sys

    from tuner.config.schedule import WandbSection
    from tuner.driver.callbacks import CatchUp
    from tuner.driver.tracking import WandbTracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_DRIVER, str(tmp_path)], capture_output=True, text=True, env=os.environ
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    prefix = (tmp_path / ".wandb_sweep").read_text().strip()
    before = offline_runs(tmp_path / "wandb")
    assert [r.exit_code for r in before[f"{prefix}-whole_4"]] == [0]
    # Only that run ended. (W&B's offline files of the runs the kill cut hold nothing: its
    # service, killed with the driver, had not written them out; a W&B server would show them
    # running, then crashed.)
    assert [k for k, parts in before.items() if any(r.exit_code is not None for r in parts)] == [
        f"{prefix}-whole_4"
    ]

    again = WandbTracking(WandbSection(), "s", Place(str(tmp_path)))
    again.setup()  # (then the sweep's callbacks' catch-up, as Tune's setup of them runs it)
    CatchUp(Place(str(tmp_path)), [again], ("val_acc", "max"), max_epochs=3).setup()
    again.on_experiment_end([])
    assert not again.failed
    runs = offline_runs(tmp_path / "wandb")
    for name, code, status in (("done_1", 0, "finished"), ("failed_2", 1, "failed")):
        [closed] = runs[f"{prefix}-{name}"]  # (its run, resumed to be ended)
        assert closed.exit_code == code and closed.summary["tuner_status"] == status, (name, closed)
        assert closed.name == name and closed.group == "s" and closed.job_type == "trial"
    assert f"{prefix}-cut_3" not in runs  # not resumed: left to the trial's continuation
    assert [r.exit_code for r in runs[f"{prefix}-whole_4"]] == [0]
    [logged] = runs[f"{prefix}-unheard_5"]  # from its record and journal
    assert [(h["epoch"], h["val_acc"]) for h in logged.history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert (
        logged.config == {"lr": 0.3}
        and logged.exit_code == 0
        and logged.summary["tuner_status"] == "finished"
    )
    assert (tmp_path / ".wandb_open").read_text().split() == ["cut_3"]  # (its own to continue)
    ended = ["done_1", "failed_2", "unheard_5", "whole_4"]
    assert (tmp_path / ".wandb_ended").read_text().split() == ended
    # A sweep a tuner without the list of ended runs began: its runs are left as they are.
    (tmp_path / ".wandb_ended").unlink()
    older = WandbTracking(WandbSection(), "s", Place(str(tmp_path)))
    older.setup()
    older.flush()
    older.close_earlier({"unheard_7": SimpleNamespace(outcome=None, history=[], path="")})
    older.on_experiment_end([])
    assert f"{prefix}-unheard_7" not in offline_runs(tmp_path / "wandb") and not older.failed


def test_a_tracker_that_fails_is_one_warning_and_tracking_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("wandb", reason=NO_WANDB)
    from tuner.config.schedule import WandbSection
    from tuner.driver.tracking import WandbTracking

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # (no ~/.netrc: no credentials)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    tracker = WandbTracking(WandbSection(mode="online"), "s", Place(str(tmp_path)))
    tracker.setup()
    a, b = _trial(tmp_path, "a_1"), _trial(tmp_path, "b_2")
    tracker.on_trial_start(0, [], a)
    tracker.on_trial_start(0, [], b)
    tracker.on_trial_result(0, [], a, {"epoch": 1, "val_acc": 0.5})
    tracker.on_experiment_end([])
    err = capsys.readouterr().err
    warnings = [ln for ln in err.splitlines() if "tracking.wandb" in ln]
    assert len(warnings) == 1 and tracker.failed, err
    assert "W&B failed: UsageError: No API key configured" in warnings[0]
    assert "the sweep goes on" in warnings[0]
