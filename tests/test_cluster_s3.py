"""A sweep on machines that share no disk (tests/nscluster.py), its results in object storage
(the S3 server the nodes reach): nothing the user needs stays on a node."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests import nscluster
from tests.conftest import DEBUG, ROOT, run_cli
from tests.test_best import _scores

pytestmark = pytest.mark.slow
TRIALS = 12


def test_twelve_trials_on_two_nodes_land_in_the_bucket_and_read_back_anywhere(
    ns_cluster: nscluster.NsCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = ns_cluster
    bucket = c.s3.make_bucket("cluster-runs")
    uri = f"s3://{bucket}/runs/twelve"
    # The user's project, submitted from the host (their laptop) as a Ray job: the sweep file
    # and their own data module (tests/best_task.py: an accuracy tuner does not compute).
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "tests" / "best_task.py", project / "best_task.py")
    raw = yaml.safe_load(DEBUG.read_text())
    # Trials of a few seconds, 2 of them waiting for their data (no CPU): long enough that the
    # worker node's first trial actor (its runtime env installed from the job's package)
    # starts before the head has run them all. Tune gives a trial whose actor has not started
    # yet the head's actor once that one is free, so on a loaded machine trials of 1-2 s all
    # ran on the head once (tests/test_nscluster.py's joined sweep: the same, fixed alike).
    raw["task"].update(data="best_task:flipped", data_args={"sleep_s": 2})
    raw["training"]["batch_size"] = 8
    raw["schedule"].update(max_epochs=8, early_stopping=False)
    (project / "sweep.yaml").write_text(yaml.safe_dump(raw))
    sweep = ["--output", f"s3://{bucket}/runs", "--name", "twelve", "--num-samples", str(TRIALS)]
    sweep += ["--resume-if-exists"]
    out = run_cli(
        "submit", "sweep.yaml", "--address", c.dashboard, "--submission-id", "twelve", "--", *sweep,
        cwd=project, env=c.host_env(), timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + c.s3.error_texts(bucket)
    assert "are on other machines" not in out.stderr  # object storage: nothing to warn about
    keys = set(c.s3.keys(bucket, "runs/twelve/"))
    summary = json.loads(c.s3.read(bucket, "runs/twelve/summary.json"))
    assert summary["status"] == "completed" and len(summary["trials"]) == TRIALS
    assert all(t["best_value"] is not None for t in summary["trials"])
    ran_on = set()
    for t in summary["trials"]:
        rows = c.s3.read(bucket, f"runs/twelve/{t['trial_id']}/result.json").decode().splitlines()
        ran_on |= {json.loads(row)["node_ip"] for row in rows}
        journal = c.s3.read(bucket, f"runs/twelve/{t['trial_id']}/metrics.jsonl").decode()
        epochs = [json.loads(m)["epoch"] for m in journal.splitlines()]
        assert epochs == list(range(1, t["epochs"] + 1))  # every epoch, none twice
    assert ran_on == {n.ip for n in c.nodes}, ran_on
    # Nothing the user needs stays on a node: every file a node keeps of the sweep (the
    # driver's mirror on the head, Ray's staging directories of the trials) is in the bucket.
    for node in c.nodes:
        for path in c.files(node, "/tmp"):
            if "/twelve/" not in path or path.endswith((".part", ".lock")) or "/.tuner.lock" in path:
                continue
            rel = path.split("/twelve/", 1)[1]
            if rel.startswith(("working_dirs/", "driver_artifacts/")):  # Ray's staging: <trial>/<file>
                rel = rel.split("/", 1)[1]
            assert f"runs/twelve/{rel}" in keys, (node.name, path)
    # best/: the best trial's best epoch, uploaded by the node that trained it.
    assert {f"runs/twelve/best/{f}" for f in ("model.pt", "config.json", "metrics.json")} <= keys
    # The host, another machine with an empty cache, reads it from the bucket: the report, an
    # export, and load_best, whose model scores what its trial recorded.
    env = {**c.host_env(), "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    report = run_cli("report", uri, "--format", "md", env=env)
    assert report.returncode == 0, report.stderr[-3000:]
    assert summary["best"]["trial_id"] in report.stdout
    exported = run_cli("export", uri, "--output", str(tmp_path / "exported"), env=env)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (
        json.loads((tmp_path / "exported" / "metrics.json").read_text())["epoch"] == summary["best"]["epoch"]
    )
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import tuner

    _scores(tuner.load_best(uri), summary["best"]["metrics"]["val_acc"])
    everything = b"".join(c.s3.read(bucket, k) for k in keys)
    assert c.s3.secret.encode() not in everything and c.token.encode() not in everything
    assert c.s3.secret not in out.stdout + out.stderr and c.token not in out.stdout + out.stderr


def test_a_ddp_trial_over_both_nodes_into_the_bucket_trains_as_on_one_node(
    ns_cluster: nscluster.NsCluster, tmp_path: Path
) -> None:
    # One CPU per node and two workers of one CPU: the trial's ranks are on both nodes (gloo
    # over the link between them), rank 0 with the trial actor, its checkpoints handed to Tune.
    c = ns_cluster
    bucket = c.s3.make_bucket("ddp-runs")
    raw = yaml.safe_load(DEBUG.read_text())
    raw["search"]["num_samples"] = 1
    raw["schedule"].update(max_epochs=3, early_stopping=False)
    raw["resources"]["workers_per_trial"] = 2
    c.put(c.head, "/tmp/work/ddp.yaml", yaml.safe_dump(raw))
    out = c.run(
        c.head,
        ["python", "-m", "tuner", "sweep", "ddp.yaml", "--address", c.gcs, "--output", f"s3://{bucket}/runs"],
        timeout=500,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + c.s3.error_texts(bucket)
    (trial,) = json.loads(c.s3.read(bucket, "runs/debug/summary.json"))["trials"]
    keys = c.s3.keys(bucket, f"runs/debug/{trial['trial_id']}/")
    assert any("/checkpoint_" in k for k in keys), keys  # rank 0's, uploaded by Tune
    journal = c.s3.read(bucket, f"runs/debug/{trial['trial_id']}/metrics.jsonl").decode()
    over_two = [json.loads(line) for line in journal.splitlines()]
    # The independent answer: the same sweep file (same seed, same configuration) on one
    # machine, its own Ray, both ranks on one node, a local output.
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(raw))
    env = {k: v for k, v in c.host_env().items() if not k.startswith("RAY_")}
    local = run_cli(
        "sweep", "ddp.yaml", "--output", str(tmp_path / "runs"), cwd=tmp_path, env=env, timeout=500
    )
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    (one,) = json.loads((tmp_path / "runs" / "debug" / "summary.json").read_text())["trials"]
    assert one["config"] == trial["config"]
    on_one = [
        json.loads(line) for line in (tmp_path / "runs/debug" / one["trial_id"] / "metrics.jsonl").open()
    ]
    assert [m["epoch"] for m in over_two] == [m["epoch"] for m in on_one] == [1, 2, 3]
    for a, b in zip(over_two, on_one, strict=True):
        assert a["world_size"] == b["world_size"] == 2
        for name in ("train_loss", "val_loss", "val_acc"):
            assert a[name] == pytest.approx(b[name], rel=1e-5, abs=1e-7), (name, a, b)
