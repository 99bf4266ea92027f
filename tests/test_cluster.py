"""Running on a Ray cluster: which cluster a sweep joins, whether that is safe, and how
scripts/submit.sh submits it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tuner import cluster, submit
from tuner.config import ConfigError

# ---------------------------------------------------------------------------------------
# Decisions, without Ray


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("::ffff:127.0.0.1", True), ("10.0.0.5", False), ("0.0.0.0", False), ("::", False),
     ("head.example", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert cluster.is_loopback(host) is loopback


def test_target_reads_addresses_and_never_joins_by_accident(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # left in a shell: not a reason to join
    assert cluster.target(None) is None
    assert cluster.target("10.0.0.7:6379") == cluster.Target("10.0.0.7", 6379, client=False)
    assert cluster.target("ray://[::1]:10001") == cluster.Target("::1", 10001, client=True)
    assert str(cluster.target("ray://[::1]:10001")) == "ray://[::1]:10001"
    assert cluster.target("auto") == cluster.Target("10.0.0.5", 6379, client=False)
    for bad in ("http://127.0.0.1:8265", "head", "head:port"):
        with pytest.raises(ConfigError, match="--address"):
            cluster.target(bad)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # under `ray job submit`
    assert cluster.target(None) == cluster.Target("10.0.0.5", 6379, client=False)


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """cluster.check against a pretend GCS: `token` (None: auth off) and its nodes."""
    fake: dict[str, Any] = {"token": None, "nodes": ["127.0.0.1"], "ours": None, "enabled": []}

    def probe(t: cluster.Target, token: str | None) -> list[str] | None:
        return fake["nodes"] if fake["token"] in (None, token) else None

    monkeypatch.setattr(cluster, "probe", probe)
    monkeypatch.setattr(cluster, "local_token", lambda: fake["ours"])
    monkeypatch.setattr(cluster, "_speak_token_auth", lambda: fake["enabled"].append("token"))
    monkeypatch.setattr(cluster, "_keep_loopback", lambda: fake["enabled"].append("loopback"))
    return fake


def test_open_cluster_is_refused_unless_loopback_only_or_allowed(
    fake_cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.check(cluster.Target("127.0.0.1", 6379, False))  # open, but only this machine reaches it
    assert fake_cluster["enabled"] == ["loopback"]
    fake_cluster["nodes"] = ["127.0.0.1", "10.0.0.9"]  # a node elsewhere: the GCS listens outward
    with pytest.raises(ConfigError, match="no authentication.*--allow-insecure-cluster"):
        cluster.check(cluster.Target("127.0.0.1", 6379, False))
    fake_cluster["nodes"] = ["10.0.0.5"]
    with pytest.raises(ConfigError, match="CVE-2023-48022"):
        cluster.check(cluster.Target("10.0.0.5", 6379, False))
    fake_cluster["nodes"] = []  # unknown (a Ray Client server may not say): not proof of loopback
    with pytest.raises(ConfigError, match="no authentication"):
        cluster.check(cluster.Target("127.0.0.1", 10001, True))
    cluster.check(cluster.Target("10.0.0.5", 6379, False), allow_insecure=True)
    assert "no authentication (--allow-insecure-cluster)" in capsys.readouterr().err


def test_token_cluster_needs_our_token_and_turns_token_auth_on(fake_cluster: dict[str, Any]) -> None:
    fake_cluster.update(token="secret", nodes=["10.0.0.5"])
    head = cluster.Target("10.0.0.5", 6379, False)
    with pytest.raises(ConfigError, match="needs a token and none is set"):
        cluster.check(head)
    fake_cluster["ours"] = "wrong"
    with pytest.raises(ConfigError, match="rejected our token"):
        cluster.check(head)
    fake_cluster["ours"] = "secret"
    cluster.check(head)
    assert fake_cluster["enabled"] == ["token"]  # not loopback: Ray may use the node's address


def test_relative_output_of_a_submitted_job_means_the_submitting_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert cluster.output_base("runs") == "runs"  # started by hand: the current directory
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.setenv(cluster.SUBMIT_DIR, str(tmp_path))
    monkeypatch.setenv(cluster.SUBMIT_HOST, socket.gethostname())
    assert cluster.output_base("runs") == str(tmp_path / "runs")
    assert cluster.output_base("/abs/runs") == "/abs/runs"
    assert cluster.output_base("s3://bucket/runs") == "s3://bucket/runs"
    monkeypatch.setenv(cluster.SUBMIT_HOST, "another-machine")
    assert cluster.output_base("runs") == "runs"
    assert "temporary copy" in capsys.readouterr().err


def test_local_output_on_a_multi_machine_cluster_is_warned_about() -> None:
    import socket

    here = {"Alive": True, "NodeManagerHostname": socket.gethostname(), "NodeManagerAddress": "127.0.0.1"}
    away = {"Alive": True, "NodeManagerHostname": "gpu-7", "NodeManagerAddress": "10.0.0.7"}
    dead = {**away, "Alive": False}
    assert cluster.storage_warning("/data/runs", [here, here, dead]) is None  # one machine: shared
    assert "1 of 2 nodes are on other machines" in (cluster.storage_warning("/data/runs", [here, away]) or "")
    assert cluster.storage_warning("s3://bucket/runs", [here, away]) is None


def test_submit_command_checks_first_and_sets_up_a_clean_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "dashboard_auth", lambda url: "token")
    monkeypatch.setattr(cluster, "local_token", lambda: "secret")
    monkeypatch.setattr(cluster, "dashboard_status", lambda url, token: 200)
    monkeypatch.chdir(ROOT)
    cmd, env, line = submit.command(
        ["search_spaces/debug.yaml", "--address", "127.0.0.1:8265", "--no-wait",
         "--runtime-env-json", '{"env_vars": {"A": "1"}}', "--", "--num-samples", "2"]
    )  # fmt: skip
    assert env == {"RAY_AUTH_MODE": "token"}
    assert cmd[1:5] == ["job", "submit", "--address", "http://127.0.0.1:8265"]
    renv = json.loads(cmd[cmd.index("--runtime-env-json") + 1])
    assert renv["working_dir"] == str(ROOT)
    assert renv["env_vars"]["A"] == "1" and renv["env_vars"]["RAY_JOB_STOP_SIGNAL"] == "SIGINT"
    assert renv["env_vars"][cluster.SUBMIT_DIR] == str(ROOT)
    assert "--no-wait" in cmd
    assert cmd[cmd.index("--") + 1 :] == [
        "python", "-m", "tuner", "sweep", "search_spaces/debug.yaml", "--num-samples", "2"
    ]  # fmt: skip
    assert "token authentication" in line
    with pytest.raises(ConfigError, match="search.num_samples"):  # validated before submitting
        submit.command(["search_spaces/debug.yaml", "--address", "h:1", "--", "--num-samples", "0"])
    with pytest.raises(ConfigError, match="shell quoting"):
        submit.command(["search_spaces/debug.yaml", "--address", "h:1", "--", "--set", "training.lr= 0.01"])
    with pytest.raises(ConfigError, match="already holds a sweep"):
        submit.command(
            ["search_spaces/debug.yaml", "--address", "h:1", "--", "--output", str(ROOT), "--name", "tests"]
        )
    monkeypatch.setattr(cluster, "dashboard_auth", lambda url: "disabled")
    with pytest.raises(ConfigError, match="no authentication"):
        submit.command(["search_spaces/debug.yaml", "--address", "http://10.0.0.5:8265"])
    cmd, env, _ = submit.command(
        ["search_spaces/debug.yaml", "--address", "http://10.0.0.5:8265", submit.INSECURE]
    )
    assert env == {} and cmd[-1] == submit.INSECURE  # the driver is told too


# ---------------------------------------------------------------------------------------
