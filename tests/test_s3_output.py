"""`output: s3://bucket/prefix` against a real S3-compatible server (moto's, tests/s3server.py):
what cannot work is refused in one line naming the output and the cause, before Ray starts."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.conftest import DEBUG, debug_config, run_cli
from tests.test_best import DATA, _scores
from tuner.config import ConfigError
from tuner.sweepdir import remote


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def _refusal(output: str) -> str:
    with pytest.raises(ConfigError) as err:
        remote.check_output(output)
    line = f"error: {err.value}"
    assert "\n" not in line and err.value.path == "output"
    return line


@pytest.fixture
def s3_env(s3, monkeypatch: pytest.MonkeyPatch):
    """The test's environment pointing at the server, the standard way (no AWS_PROFILE, no ~/.aws)."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return s3


def test_a_reachable_bucket_with_our_credentials_passes(s3_env) -> None:
    bucket = s3_env.make_bucket("good")
    remote.check_output(f"s3://{bucket}/runs")
    remote.check_output(f"s3://{bucket}")  # the bucket's top
    remote.check_output("gs://elsewhere/runs")  # other schemes: left to Ray


def test_bad_s3_outputs_are_one_line_naming_the_output_and_the_cause(
    s3_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = s3_env.secret
    bucket = s3_env.make_bucket("present")
    missing = _refusal("s3://no-such-bucket/runs")
    assert missing.startswith("error: output: s3://no-such-bucket/runs: bucket 'no-such-bucket' does not")
    assert s3_env.endpoint in missing

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + secret)
    wrong = _refusal(f"s3://{bucket}/runs")
    assert "refused the credentials (SignatureDoesNotMatch" in wrong, wrong
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTKNOWNHERE0000")
    unknown = _refusal(f"s3://{bucket}/runs")
    assert "refused the credentials (InvalidAccessKeyId" in unknown, unknown

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    none = _refusal(f"s3://{bucket}/runs")
    assert "no S3 credentials found" in none

    for k, v in s3_env.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://user:pw@127.0.0.1:{_closed_port()}")
    away = _refusal(f"s3://{bucket}/runs")
    assert "does not answer (AWS_ENDPOINT_URL)" in away and "pw@" not in away, away
    for line in (missing, wrong, unknown, none, away):
        assert secret not in line and "not-" + secret not in line


def test_the_driver_checks_an_s3_output_before_ray_starts(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.driver import sweep

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for an output that cannot work")

    monkeypatch.setattr(sweep, "connect", no_ray)
    cfg = debug_config(tmp_path, output="s3://no-such-bucket/runs")
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket' does not exist") as err:
        sweep.run_sweep(cfg)
    assert err.value.path == "output"


@pytest.mark.slow
def test_a_sweep_in_s3_reports_every_trial_and_is_read_back_from_anywhere(s3, tmp_path: Path) -> None:
    bucket = s3.make_bucket("sweeps")
    env = {**s3.env(), "TUNER_CACHE_DIR": str(tmp_path / "driver-cache")}
    work = tmp_path / "cwd"  # the driver's working directory: nothing of the sweep lands there
    work.mkdir()
    out = run_cli(
        "sweep", str(DEBUG), "--output", f"s3://{bucket}/runs", "--max-epochs", "2", cwd=work, env=env
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    uri = f"s3://{bucket}/runs/debug"
    assert f"results: {uri}" in out.stdout and list(work.iterdir()) == []
    keys = s3.keys(bucket, "runs/debug/")
    summary = json.loads(s3.client().get_object(Bucket=bucket, Key="runs/debug/summary.json")["Body"].read())
    assert summary["status"] == "completed" and len(summary["trials"]) == 4
    assert all(t["best_value"] is not None and t["epochs"] >= 1 for t in summary["trials"])
    for t in summary["trials"]:
        for name in ("metrics.jsonl", "tuner_trial.json", "trial.log"):
            assert f"runs/debug/{t['trial_id']}/{name}" in keys, (t["trial_id"], name)
    assert {"runs/debug/sweep.yaml", "runs/debug/code.json"} <= set(keys)
    # best/: the best trial's best epoch, its weights uploaded by the trial that made them.
    best = summary["best"]
    assert {"runs/debug/best/model.pt", "runs/debug/best/metrics.json", "runs/debug/best/config.json"} <= set(
        keys
    )
    record = json.loads(
        s3.client().get_object(Bucket=bucket, Key=f"runs/debug/{best['trial_id']}/best.json")["Body"].read()
    )
    assert record["epoch"] == best["epoch"] and f"runs/debug/{best['trial_id']}/{record['weights']}" in keys
    # Another machine (an empty cache) reads it from the bucket: the report, an export.
    other = {**s3.env(), "TUNER_CACHE_DIR": str(tmp_path / "elsewhere")}
    report = run_cli("report", uri, "--format", "md", env=other)
    assert report.returncode == 0, report.stderr[-3000:]
    assert best["trial_id"] in report.stdout
    exported = run_cli("export", uri, "--output", str(tmp_path / "exported"), env=other)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads((tmp_path / "exported" / "metrics.json").read_text())["epoch"] == best["epoch"]
    # No credential in any object of the bucket, nor in anything printed.
    everything = b"".join(s3.client().get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys)
    assert s3.secret.encode() not in everything
    assert s3.secret not in out.stdout + out.stderr + report.stdout + report.stderr


@pytest.mark.slow
def test_load_best_from_s3_reproduces_the_recorded_metric(
    s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tuner.load_best("s3://...") where the sweep never ran (an empty cache): the model
    predicts as many validation samples right as its trial reported (counted by
    tests/best_task.py, not by tuner)."""
    bucket = s3.make_bucket("loadbest")
    out = run_cli(
        "sweep", str(DEBUG), "--output", f"s3://{bucket}/runs", "--num-samples", "2", "--max-epochs", "3",
        "--set", f"task.data={DATA}", "--set", "task.data_args={}", "--set", "search.params.depth=1",
        env={**s3.env(), "TUNER_CACHE_DIR": str(tmp_path / "driver")},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "reader"))
    import tuner

    summary = json.loads(s3.client().get_object(Bucket=bucket, Key="runs/debug/summary.json")["Body"].read())
    _scores(tuner.load_best(f"s3://{bucket}/runs/debug"), summary["best"]["metrics"]["val_acc"])
