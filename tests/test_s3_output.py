"""`output: s3://bucket/prefix` against a real S3-compatible server (moto's, tests/s3server.py):
what cannot work is refused in one line naming the output and the cause, before Ray starts.
(Whole sweeps into the server, read back from elsewhere: tests/test_cluster_s3.py.)"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.conftest import debug_config
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
