"""A sweep on machines that share no disk (tests/nscluster.py), its results in object storage
(the S3 server the nodes reach): nothing the user needs stays on a node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import nscluster
from tests.conftest import DEBUG, run_cli

pytestmark = pytest.mark.slow
TRIALS = 12


def _bucket_object(c: nscluster.NsCluster, bucket: str, key: str) -> bytes:
    return c.s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def test_twelve_trials_on_two_nodes_land_in_the_bucket_and_read_back_anywhere(
    ns_cluster: nscluster.NsCluster, tmp_path: Path
) -> None:
    c = ns_cluster
    bucket = c.s3.make_bucket("cluster-runs")
    uri = f"s3://{bucket}/runs/twelve"
    c.put(c.head, "/tmp/work/debug.yaml", DEBUG.read_text())
    # The job's command, run on the head as `ray job submit` would run it.
    out = c.run(
        c.head,
        ["python", "-m", "tuner", "sweep", "debug.yaml", "--address", c.gcs, "--output", f"s3://{bucket}/runs",
         "--name", "twelve", "--num-samples", str(TRIALS), "--max-epochs", "3", "--resume-if-exists"],
        timeout=500,
    )  # fmt: skip
    errors = [
        _bucket_object(c, bucket, k).decode()[-3000:] for k in c.s3.keys(bucket) if k.endswith("error.txt")
    ]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + "\n".join(errors)
    assert "are on other machines" not in out.stderr  # object storage: nothing to warn about
    keys = set(c.s3.keys(bucket, "runs/twelve/"))
    summary = json.loads(_bucket_object(c, bucket, "runs/twelve/summary.json"))
    assert summary["status"] == "completed" and len(summary["trials"]) == TRIALS
    assert all(t["best_value"] is not None for t in summary["trials"])
    ran_on = set()
    for t in summary["trials"]:
        rows = _bucket_object(c, bucket, f"runs/twelve/{t['trial_id']}/result.json").decode().splitlines()
        ran_on |= {json.loads(row)["node_ip"] for row in rows}
        journal = _bucket_object(c, bucket, f"runs/twelve/{t['trial_id']}/metrics.jsonl").decode()
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
    # The host, another machine with an empty cache, reads it from the bucket.
    env = {**c.host_env(), "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    report = run_cli("report", uri, "--format", "md", env=env)
    assert report.returncode == 0, report.stderr[-3000:]
    assert summary["best"]["trial_id"] in report.stdout
    everything = b"".join(_bucket_object(c, bucket, k) for k in keys)
    assert c.s3.secret.encode() not in everything and c.token.encode() not in everything
    assert c.s3.secret not in out.stdout + out.stderr and c.token not in out.stdout + out.stderr
