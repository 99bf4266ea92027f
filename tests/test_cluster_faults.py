"""Faults on the namespaced cluster (tests/nscluster.py) with the sweep in object storage: the
driver killed and the same job command run again; a worker node powered off mid-sweep. Either
way the sweep finishes with every trial, every epoch once, continued from checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests import nscluster
from tests.conftest import DEBUG
from tuner.config import load_sweep
from tuner.search.algorithms import random_configs
from tuner.search.plan import key
from tuner.space.params import Fixed

pytestmark = pytest.mark.slow
TRIALS, EPOCHS = 4, 6
SWEEP = "/tmp/work/faults.yaml"  # on the head


def _sweep_file(c: nscluster.NsCluster) -> dict[str, Any]:
    """debug.yaml with epochs of a second or so, every trial to the end, retries allowed."""
    raw = yaml.safe_load(DEBUG.read_text())
    raw["task"]["data_args"]["samples"] = 4096
    raw["training"]["batch_size"] = 16
    raw["schedule"].update(max_epochs=EPOCHS, early_stopping=False)
    raw["search"]["num_samples"] = TRIALS
    raw["failure"] = {"max_failures": 2}
    c.put(c.head, SWEEP, yaml.safe_dump(raw))
    return raw


def _command(c: nscluster.NsCluster, bucket: str, name: str) -> list[str]:
    """The job's command (as deploy/ runs it), on the head."""
    return ["python", "-m", "tuner", "sweep", SWEEP, "--address", c.gcs, "--output", f"s3://{bucket}/runs",
            "--name", name, "--resume-if-exists"]  # fmt: skip


def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the sweep ended before {what}: {out[-3000:]}")
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)


def _assert_complete(c: nscluster.NsCluster, bucket: str, name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Every planned trial, trained to the end, each epoch in its journal exactly once; the
    configurations those an uninterrupted random sweep of this seed runs."""
    summary = json.loads(c.s3.read(bucket, f"runs/{name}/summary.json"))
    assert summary["status"] == "completed" and len(summary["trials"]) == TRIALS, summary["counts"]
    for t in summary["trials"]:
        journal = c.s3.read(bucket, f"runs/{name}/{t['trial_id']}/metrics.jsonl").decode().splitlines()
        assert [json.loads(row)["epoch"] for row in journal] == list(range(1, EPOCHS + 1)), t["trial_id"]
    cfg = load_sweep(DEBUG, {"search.num_samples": TRIALS})
    searched = [k for k, p in cfg.search.params.items() if not isinstance(p, Fixed)]
    planned = random_configs(cfg.hyperparameters(), TRIALS, raw["search"]["seed"])
    got = sorted(key({k: t["config"][k] for k in searched}) for t in summary["trials"])
    assert got == sorted(key({k: p[k] for k in searched}) for p in planned)
    return summary


def _assert_one_continued(logs: list[str], driver_out: str) -> None:
    """Some trial continued from a checkpoint (its trial.log says where it resumed); if none
    did, what the driver said (its "resuming" line) and each trial's last lines."""
    detail = "\n".join([driver_out[-1500:], *(log[-600:] for log in logs)])
    assert any("resumed at epoch" in log for log in logs), f"no trial continued from a checkpoint:\n{detail}"


def _trial_states(c: nscluster.NsCluster, bucket: str, name: str) -> dict[str, dict[str, Any]]:
    """trial -> {status, checkpoints, epochs}: what the bucket holds of each trial now."""
    states: dict[str, dict[str, Any]] = {}
    for k in c.s3.keys(bucket, f"runs/{name}/"):
        parts = k.split("/")
        if len(parts) < 4:
            continue
        s = states.setdefault(parts[2], {"status": None, "checkpoints": 0, "epochs": 0})
        if parts[3] == "tuner_trial.json":
            s["status"] = json.loads(c.s3.read(bucket, k)).get("status")
        elif parts[3] == "metrics.jsonl":
            s["epochs"] = len(c.s3.read(bucket, k).splitlines())
        elif parts[3].startswith("checkpoint_"):
            s["checkpoints"] += 1
    return states


def test_driver_killed_then_the_same_command_finishes_the_sweep(ns_cluster: nscluster.NsCluster) -> None:
    c = ns_cluster
    bucket = c.s3.make_bucket("driver-kill")
    raw = _sweep_file(c)
    proc = c.popen(
        c.head, _command(c, bucket, "dk"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:

        def caught() -> bool:  # a trial finished, another mid-way with a checkpoint
            states = _trial_states(c, bucket, "dk").values()
            done = [s for s in states if s["status"] == "TERMINATED"]
            # Three epochs (seconds) to go as the bucket has it: the bucket lags the trial, and
            # a trial that finished before the kill continues from nothing.
            midway = [
                s
                for s in states
                if s["status"] == "RUNNING" and s["checkpoints"] and s["epochs"] <= EPOCHS - 3
            ]
            return bool(done and midway)

        _wait("a finished trial and one mid-way", caught, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, kill -9 (and nsenter before it)
        proc.wait(timeout=60)
    # The driver follows its command a moment later (tuner/driver/stopping.py: it dies with its
    # watcher); until then its lease holds the sweep and the same command is refused in a line.
    deadline = time.monotonic() + 120  # (a hang guard)
    while True:
        again = c.run(c.head, _command(c, bucket, "dk"), timeout=600)
        if "is in use by another tuner run" not in again.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:] + c.s3.error_texts(bucket)
    assert "resuming dk:" in again.stdout
    summary = _assert_complete(c, bucket, "dk", raw)
    logs = [c.s3.read(bucket, f"runs/dk/{t['trial_id']}/trial.log").decode() for t in summary["trials"]]
    _assert_one_continued(logs, again.stdout)
    # Extended from the bucket by one trial: the others are kept as they are.
    journals = {
        t["trial_id"]: c.s3.read(bucket, f"runs/dk/{t['trial_id']}/metrics.jsonl") for t in summary["trials"]
    }
    more = c.run(c.head, ["python", "-m", "tuner", "extend", f"s3://{bucket}/runs/dk", "--num-samples", "1",
                          "--address", c.gcs], timeout=600)  # fmt: skip
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    extended = json.loads(c.s3.read(bucket, "runs/dk/summary.json"))
    assert extended["status"] == "completed" and len(extended["trials"]) == TRIALS + 1
    assert all(c.s3.read(bucket, f"runs/dk/{t}/metrics.jsonl") == j for t, j in journals.items())
    assert "num_samples: 5" in c.s3.read(bucket, "runs/dk/sweep.yaml").decode()


def test_worker_node_killed_its_trials_continue_on_another(ns_cluster: nscluster.NsCluster) -> None:
    c = ns_cluster
    w1 = c.nodes[1]
    bucket = c.s3.make_bucket("node-kill")
    raw = _sweep_file(c)
    proc = c.popen(
        c.head, _command(c, bucket, "nk"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:

        def on_w1_with_a_checkpoint() -> bool:  # as the node itself sees it
            journals = [p for p in c.files(w1, "/tmp/ray") if p.endswith("/metrics.jsonl") and "/nk/" in p]
            return any(len(w1.path(p).read_text().splitlines()) >= 2 for p in journals)

        _wait("a trial on the worker node past its second epoch", on_w1_with_a_checkpoint, proc)
        c.kill(w1)  # power off: raylet, trial actor, everything of the node at once
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if not w1.alive():
            c.revive(w1)  # the next tests get their two nodes back
    assert proc.returncode == 0, out[-3000:]
    summary = _assert_complete(c, bucket, "nk", raw)
    logs = [c.s3.read(bucket, f"runs/nk/{t['trial_id']}/trial.log").decode() for t in summary["trials"]]
    _assert_one_continued(logs, out)
