"""Running on a Ray cluster: address and safety decisions (no Ray), then a real two-node
cluster on loopback started by scripts/cluster.sh, with sweeps submitted by scripts/submit.sh.

The live tests share one module-scoped cluster (token in a temporary file, never the
user's ~/.ray) and stop only the processes it started.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import DEBUG, ROOT, cli, cluster_env
from tuner.cluster import _ray_internals, submit
from tuner.cluster import join as cluster
from tuner.cluster._ray_internals import LOOPBACK
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

    def probe(t: cluster.Target, token: str | None, tls_with: Any = None) -> list[str] | None:
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


def test_status_names_a_secret_file_others_can_read_even_when_the_cluster_is_down(tmp_path: Path) -> None:
    """A token or TLS key made readable by others after `cluster start`: `status` says which,
    with the chmod, first (a cluster that does not answer included)."""
    import socket

    from tuner.cluster import tls
    from tuner.cluster.local import STATE_FILE, TLS_DIR

    with socket.socket() as s:  # a port nothing listens on: the cluster is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state_dir, token = tmp_path / "state", tmp_path / "token"
    files = tls.new_authority().issue(state_dir / TLS_DIR, "node", ["127.0.0.1"], ["localhost"])
    token.write_text("t" * 64)
    token.chmod(0o600)
    state = {"temp_dir": str(tmp_path / "ray"), "token": str(token), "nodes": [],
             "tls": str(state_dir / TLS_DIR), "gcs": f"127.0.0.1:{port}",
             "dashboard": "http://127.0.0.1:1", "client": "ray://127.0.0.1:1"}  # fmt: skip
    (state_dir / STATE_FILE).write_text(json.dumps(state))
    env = {"RAY_AUTH_TOKEN_PATH": str(token), "RAY_AUTH_TOKEN": ""}
    quiet = cli("cluster", "status", "--state-dir", str(state_dir), env=env)
    assert quiet.returncode == 1 and "not answering" in quiet.stdout and "chmod" not in quiet.stderr, quiet
    files.key.chmod(0o640)
    token.chmod(0o644)
    loud = cli("cluster", "status", "--state-dir", str(state_dir), env=env)
    assert f"chmod 600 {files.key}" in loud.stderr and f"chmod 600 {token}" in loud.stderr, loud
    assert "t" * 64 not in loud.stdout + loud.stderr


def test_embedded_ray_refuses_a_grpc_call_without_the_token(ray_session: Any) -> None:
    # The private local Ray of `tuner sweep` (Ray 2.60): token authentication refuses a caller
    # without our token, whatever interface its gRPC servers listen on (README: the private
    # local Ray).
    host, port = ray_session.get_runtime_context().gcs_address.rsplit(":", 1)
    target = cluster.Target(host, int(port), client=False)
    assert cluster.probe(target, token=None) is None  # UNAUTHENTICATED
    assert cluster.probe(target, token="0" * 64) is None  # a wrong token: refused as well
    assert cluster.probe(target, token=cluster.local_token())  # ours: its nodes


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


def test_submit_refuses_a_working_directory_past_one_upload_and_names_its_largest_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Counted as Ray packs it, a working directory past what a cluster takes in one upload
    (its dashboard answers HTTP 413, a traceback from `ray job submit`) is one line naming
    --working-dir and the largest files, before any cluster is asked anything (none runs
    here). Left out by .rayignore or .gitignore, the file no longer counts: the submit goes
    on to its next check, which cluster."""
    limit = _ray_internals.upload_limit()
    assert limit == 100 * 2**20  # Ray 2.60's dashboard
    monkeypatch.setenv("TUNER_CLUSTER_DIR", str(tmp_path / "no-cluster"))
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"):
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "project"
    (work / "data").mkdir(parents=True)
    shutil.copy(DEBUG, work / "sweep.yaml")
    monkeypatch.chdir(work)
    (work / "data" / "weights.bin").write_bytes(bytes(limit))
    (work / "notes.txt").write_bytes(bytes(2**20))
    (work / ".venv").mkdir()  # never packed by Ray: not counted
    (work / ".venv" / "big.so").write_bytes(bytes(limit))
    with pytest.raises(ConfigError) as refused:
        submit.command(["sweep.yaml"])
    message = str(refused.value)
    assert refused.value.path == "--working-dir" and "\n" not in message, message
    assert f"directory {work} packs to 101 MiB, past the 100 MiB a Ray cluster takes" in message
    assert "(largest: data/weights.bin (100 MiB), notes.txt (1 MiB));" in message, message
    for ignore in (".rayignore", ".gitignore"):
        (work / ignore).write_text("data/\n")
        with pytest.raises(ConfigError, match="no cluster to submit to"):
            submit.command(["sweep.yaml"])
        (work / ignore).unlink()
    # Data linked in from elsewhere is packed whole (Ray follows the link): counted too.
    elsewhere = tmp_path / "disk"
    (work / "data").rename(elsewhere)
    (work / "data").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"\(largest: data/weights.bin \(100 MiB\)"):
        submit.command(["sweep.yaml"])


# ---------------------------------------------------------------------------------------
# A real cluster on loopback


@dataclass
class Live:
    env: dict[str, str]  # for our scripts and Ray's CLI: the temporary token, not ~/.ray
    state: dict[str, Any]
    token: str
    printed: list[str] = field(default_factory=list)

    def run(
        self, *args: str, cwd: Path = ROOT, timeout: float = 300, **extra: str
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            args, cwd=cwd, env={**self.env, **extra}, capture_output=True, text=True, timeout=timeout
        )
        self.printed += [out.stdout, out.stderr]
        return out

    def api(self, path: str) -> Any:
        request = urllib.request.Request(
            self.state["dashboard"] + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    def job(self, job_id: str) -> dict[str, Any]:
        return self.api(f"/api/jobs/{job_id}")

    def wait_job(self, job_id: str, statuses: set[str], timeout: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["status"] in statuses:
                return info
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {info['status']} after {timeout} s")

    def ray_cli(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": "token", "RAY_API_SERVER_ADDRESS": self.state["dashboard"]}


SCRIPTS = ROOT / "scripts"
RAY = str(Path(sys.executable).with_name("ray"))


def test_a_node_without_a_token_is_refused_in_one_line_before_ray_starts(tmp_path: Path) -> None:
    # `tuner cluster node` turns token authentication on; with no token anywhere Ray looks (a
    # new HOME, no RAY_AUTH_TOKEN*), the node refuses before any of Ray's processes start.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "cluster", "node", "--", "--head", "--num-cpus=1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines() == [
        "error: RAY_AUTH_MODE=token and no Ray token here: set RAY_AUTH_TOKEN_PATH (a 0600 file every "
        "node can read) or RAY_AUTH_TOKEN, or RAY_AUTH_MODE=disabled"
    ]
    assert out.stdout == ""  # (a node that starts says so first, then Ray prints its start)
    usage = cli("cluster", "node", "--help").stdout
    assert usage.startswith("usage: python -m tuner cluster node -- RAY_START_ARGS"), usage


class _Collector(http.server.BaseHTTPRequestHandler):
    """Records every POST it is sent (Ray's usage reports, pointed here: see `live`)."""

    got: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.got.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("cluster")
    # Ray's usage reports go to a collector on loopback rather than to Ray's server, so that a
    # report the cluster sends is seen here (and never leaves the machine).
    collector = http.server.ThreadingHTTPServer((LOOPBACK, 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    url = f"http://{LOOPBACK}:{collector.server_address[1]}/"
    live = Live({**cluster_env(base), "RAY_USAGE_STATS_REPORT_URL": url}, {}, "")
    start = live.run(
        str(SCRIPTS / "cluster.sh"), "start", "--workers", "1", "--num-cpus", "1", "--object-store-mb", "256"
    )
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        live.state = json.loads((base / "state" / "cluster.json").read_text())
        live.token = (base / "token").read_text().strip()
        yield live
    finally:
        live.run(str(SCRIPTS / "cluster.sh"), "stop")
        collector.shutdown()


def _cluster_processes(live: Live) -> list[psutil.Process]:
    from tuner.cluster.local import processes

    return processes(live.state)


@pytest.mark.slow
def test_token_is_private_and_never_printed(live: Live) -> None:
    token_file = Path(live.env["RAY_AUTH_TOKEN_PATH"])
    assert token_file.stat().st_mode & 0o777 == 0o600
    status = live.run(str(SCRIPTS / "cluster.sh"), "status")
    assert status.returncode == 0 and "2 node(s) alive" in status.stdout, status.stdout
    assert str(token_file) in status.stdout and "chmod" not in status.stderr
    token_file.chmod(0o644)  # made readable by others after the start: status says so
    try:
        exposed = live.run(str(SCRIPTS / "cluster.sh"), "status")
    finally:
        token_file.chmod(0o600)
    assert exposed.returncode == 0 and f"chmod 600 {token_file}" in exposed.stderr, exposed.stderr
    assert all(live.token not in text for text in live.printed)


@pytest.mark.slow
def test_start_suggests_no_file_only_this_repository_has(live: Live) -> None:
    started = live.printed[0]  # (issue 26: it suggested search_spaces/debug.yaml to everyone)
    assert "submit a sweep:  python -m tuner submit YOUR_SWEEP.yaml" in started, started
    assert "search_spaces/" not in started


@pytest.mark.slow
def test_cluster_listens_on_loopback_only(live: Live) -> None:
    listening = set()
    procs = _cluster_processes(live)
    assert len(procs) >= 8  # two raylets, GCS, dashboard, agents, ...
    for p in procs:
        try:
            listening |= {
                (c.laddr.ip, c.laddr.port, p.name())
                for c in p.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
        except psutil.NoSuchProcess:
            continue
    ports = {port for _, port, _ in listening}
    assert int(live.state["gcs"].rsplit(":", 1)[1]) in ports
    assert int(live.state["client"].rsplit(":", 1)[1]) in ports  # Ray Client server too
    outside = {entry for entry in listening if not cluster.is_loopback(entry[0])}
    assert not outside, f"listening beyond loopback: {sorted(outside)}"


@pytest.mark.slow
def test_submitted_sweep_succeeds_and_lands_where_the_cli_says(live: Live, tmp_path: Path) -> None:
    project = tmp_path / "project"  # what the user submits from; output is relative to it
    project.mkdir()
    shutil.copy(DEBUG, project / "debug.yaml")
    # The user's own model, beside the sweep file: `--working-dir .` ships it to every node.
    (project / "submitted_model.py").write_text(
        "from torch import nn\n\n\ndef build(config, input_shape, num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_classes))\n"
    )
    out = live.run(
        str(SCRIPTS / "submit.sh"), "debug.yaml", "--submission-id", "debug-ok", "--", "--name", "submitted",
        "--set", "task.model=submitted_model:build", cwd=project,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert live.job("debug-ok")["status"] == "SUCCEEDED"
    sweep_dir = project / "runs" / "submitted"
    assert f"results: {sweep_dir}" in out.stdout
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == 4
    assert all(t["status"] == "TERMINATED" for t in summary["trials"])  # the model was imported
    assert "submitted_model:build" in (sweep_dir / "sweep.yaml").read_text()
    assert "token authentication" in out.stdout
    assert live.token not in out.stdout + out.stderr


@pytest.mark.slow
def test_submit_without_the_token_is_refused_and_runs_nothing(live: Live, tmp_path: Path) -> None:
    before = {j["submission_id"] for j in live.api("/api/jobs/")}
    nobody = {"HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}
    entry = ["--", "python", "-c", "print('ran')"]
    # Ray's client sends no token unless RAY_AUTH_MODE=token (and then refuses to start without one).
    cli = {**live.ray_cli(), "RAY_AUTH_MODE": "disabled"}
    missing = live.run(RAY, "job", "submit", "--submission-id", "no-token", *entry, **cli, **nobody)
    assert missing.returncode != 0 and "Unauthorized" in missing.stdout + missing.stderr
    (tmp_path / "wrong").write_text("0" * 64)
    wrong = live.run(
        RAY, "job", "submit", "--submission-id", "wrong-token", *entry,
        **live.ray_cli(), RAY_AUTH_TOKEN_PATH=str(tmp_path / "wrong"), HOME=str(tmp_path),
    )  # fmt: skip
    assert wrong.returncode != 0 and "Forbidden" in wrong.stdout + wrong.stderr
    ours = live.run(str(SCRIPTS / "submit.sh"), str(DEBUG), **nobody)
    assert ours.returncode == 2 and ours.stderr.count("\n") == 1, ours.stderr
    assert ours.stderr.startswith("error: RAY_AUTH_TOKEN_PATH: ") and "missing or empty" in ours.stderr
    ours = live.run(str(SCRIPTS / "submit.sh"), str(DEBUG), HOME=str(tmp_path), RAY_AUTH_TOKEN_PATH="")
    assert ours.returncode == 2 and ours.stderr.count("\n") == 1, ours.stderr
    assert ours.stderr.startswith("error: --address: the Ray cluster at") and "needs a token" in ours.stderr
    assert {j["submission_id"] for j in live.api("/api/jobs/")} == before
    for url in ("/api/jobs/", "/api/version"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(live.state["dashboard"] + url, timeout=30)
        assert err.value.code == 401


HELD_LR = 0.01  # the job-stop test's lr: its trials wait at their second epoch (tests/best_task.py)


def _held(sweep_dir: Path) -> int:
    """How many trials have checkpointed their first epoch: they wait while the gate is there."""
    return sum(_newest_checkpoint(d) >= 1 for d in sweep_dir.glob("*/") if d.is_dir())


@pytest.mark.slow
def test_job_stop_interrupts_the_sweep_and_resume_finishes_it(live: Live, tmp_path: Path) -> None:
    # Two trials, one a node, each waiting at its second epoch, its first checkpointed, while
    # the gate is there: `ray job stop` comes then, whatever the machine's speed, and the gate
    # opens once the driver says it stops, so that both reach their next report and end there,
    # mid-way. (Trials made long enough instead, 25 epochs of 8192 samples, once ran out
    # before the stop came.)
    gate = tmp_path / "gate"
    gate.touch()
    sweep = ["--output", str(tmp_path), "--max-epochs", "25", "--set", "schedule.early_stopping=false"]
    sweep += ["--num-samples", "2", "--set", f"search.params.lr={HELD_LR}"]
    sweep += ["--set", "task.data=tests.best_task:held"]
    for k, v in {"gate": gate, "hold_lr": HELD_LR, "num_classes": 2}.items():
        sweep += ["--set", f"task.data_args.{k}={v}"]
    ray_args = ["--submission-id", "long", "--no-wait"]
    out = live.run(str(SCRIPTS / "submit.sh"), str(DEBUG.relative_to(ROOT)), *ray_args, "--", *sweep)
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = tmp_path / "debug"
    try:
        deadline = time.monotonic() + 180  # (a hang guard)
        job_logs = lambda: live.run(RAY, "job", "logs", "long", **live.ray_cli()).stdout  # noqa: E731
        while _held(sweep_dir) < 2:
            assert time.monotonic() < deadline, job_logs()
            job = live.job("long")  # (why it ended: its logs, and Ray's word when it has no logs)
            assert job["status"] in ("PENDING", "RUNNING"), (job_logs(), job.get("message"))
            time.sleep(0.5)
    finally:
        stop = live.run(RAY, "job", "stop", "long", "--no-wait", **live.ray_cli())
        try:
            deadline = time.monotonic() + 120  # (a hang guard)
            while "[tuner] stopping" not in live.api("/api/jobs/long/logs")["logs"]:
                assert time.monotonic() < deadline and live.job("long")["status"] == "RUNNING"
                time.sleep(0.2)
        finally:
            gate.unlink()
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert live.wait_job("long", {"STOPPED", "SUCCEEDED", "FAILED"})["status"] == "STOPPED"
    logs = live.run(RAY, "job", "logs", "long", **live.ray_cli()).stdout
    assert "[tuner] stopping: trials end at their next report" in logs  # SIGINT, not SIGKILL
    assert f"continue with: python -m tuner resume {sweep_dir}" in logs, logs[-2000:]
    assert json.loads((sweep_dir / "summary.json").read_text())["status"] == "interrupted"
    records = {r.parent.name: json.loads(r.read_text()) for r in sweep_dir.glob("*/tuner_trial.json")}
    caught = [
        t
        for t, r in records.items()
        if r["status"] == "RUNNING" and 0 < _newest_checkpoint(sweep_dir / t) < 25
    ]
    assert len(caught) == 2, records  # both stopped mid-way, with a checkpoint to continue from

    resumed = live.run(
        sys.executable, "-m", "tuner", "resume", str(sweep_dir), "--address", live.state["gcs"]
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == 2
    assert all(t["epochs"] == 25 for t in summary["trials"])
    for t in caught:
        assert "resumed at epoch" in (sweep_dir / t / "trial.log").read_text()  # not from epoch 0


def _newest_checkpoint(trial_dir: Path) -> int:
    """The epoch of a trial's newest checkpoint (0: none)."""
    return max(
        (int(p.stem.removeprefix("checkpoint_e")) for p in trial_dir.glob("checkpoint_e*.pt")), default=0
    )


@pytest.mark.slow
def test_trials_are_placed_on_both_nodes(live: Live, tmp_path: Path) -> None:
    # Driver started by hand with --address: it joins (token from RAY_AUTH_TOKEN_PATH) and
    # runs two trials at once, more than one node's single CPU. Trials last long enough to
    # overlap, once trials of earlier tests have given their CPUs back.
    deadline = time.monotonic() + 60
    while any(a["state"] == "ALIVE" for a in _trial_actors(live)) and time.monotonic() < deadline:
        time.sleep(1)
    out = live.run(
        sys.executable, "-m", "tuner", "sweep", str(DEBUG), "--address", live.state["gcs"],
        "--output", str(tmp_path), "--set", "resources.max_concurrent_trials=2", "--max-epochs", "60",
        "--set", "schedule.early_stopping=false",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    pids = {
        json.loads(line)["pid"]
        for result in (tmp_path / "debug").glob("*/result.json")
        for line in result.read_text().splitlines()
    }
    nodes = {a["node_id"] for a in _trial_actors(live) if a["pid"] in pids}
    alive = {n["node_id"] for n in live.api("/api/v0/nodes?limit=100")["data"]["result"]["result"]}
    assert len(nodes) == 2 and nodes == alive, (pids, nodes, alive)


# What the workers of each node of the cluster are: a task pinned to each node says whether it
# runs in a copy of a warm process, and what its parent process is.
WHO = ROOT / "tests" / "who_runs_workers.py"  # (a task on each node: how its worker started)


@pytest.mark.slow
def test_every_node_starts_its_workers_as_copies_of_a_warm_process(live: Live, tmp_path: Path) -> None:
    """As a private local Ray does (tuner.cluster.worker_fork): a sweep joined to the cluster
    starts each trial actor without importing torch, Ray Tune and tuner in it (~3 CPU-s, about
    half of a debug sweep's wall; BENCHMARKS.md)."""
    # (as `tuner cluster env` exports them: token auth, and 127.0.0.1 kept as the GCS's address)
    keep = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    out = live.run(sys.executable, str(WHO), live.state["gcs"], **keep)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(seen) == 2, seen
    for worker in seen:
        assert worker["copied"] == "1" and "tuner.cluster.worker_fork" in worker["parent"], seen
    # A submitted job's workers too (`tuner submit` uploads a working_dir: each worker starts in
    # the node's copy of it).
    shutil.copy(WHO, tmp_path / "who.py")
    job = live.run(
        RAY,
        "job",
        "submit",
        "--working-dir",
        str(tmp_path),
        "--",
        "python",
        "who.py",
        "auto",
        **live.ray_cli(),
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    seen = json.loads(next(ln for ln in reversed(job.stdout.splitlines()) if ln.startswith("[{")))
    assert len(seen) == 2, seen
    for worker in seen:
        assert worker["copied"] == "1" and "tuner.cluster.worker_fork" in worker["parent"], seen
        assert (Path(worker["cwd"]) / "who.py").read_text() == WHO.read_text(), seen


@pytest.mark.slow
def test_sweep_without_address_starts_its_own_ray_even_with_a_cluster_around(
    live: Live, tmp_path: Path
) -> None:
    # RAY_ADDRESS names the live cluster (as `eval "$(scripts/cluster.sh env)"` leaves it);
    # joining it would fail on --num-cpus ("must not be provided") and add a driver job.
    jobs_before = len(live.api("/api/jobs/"))
    drivers_before = _driver_jobs(live)
    out = live.run(
        sys.executable, "-m", "tuner", "sweep", str(DEBUG), "--output", str(tmp_path), "--num-samples", "2",
        "--max-epochs", "2", "--num-cpus", "1", RAY_ADDRESS=live.state["gcs"],
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "debug" / "summary.json").is_file()
    assert _driver_jobs(live) == drivers_before and len(live.api("/api/jobs/")) == jobs_before


def _trial_actors(live: Live) -> list[dict[str, Any]]:
    actors = live.api("/api/v0/actors?limit=10000&detail=1")["data"]["result"]["result"]
    # function trainables: "ImplicitFunc" or, as Ray names it at times, "wrap_function.<locals>.ImplicitFunc"
    return [a for a in actors if a["class_name"].endswith("ImplicitFunc")]


def _driver_jobs(live: Live) -> int:
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(live.state["gcs"]) as channel:
        reply = gcs_service_pb2_grpc.JobInfoGcsServiceStub(channel).GetAllJobInfo(
            gcs_service_pb2.GetAllJobInfoRequest(),
            timeout=30,
            metadata=[("authorization", f"Bearer {live.token}")],
        )
    return len(reply.job_info_list)


@pytest.mark.slow
def test_a_cluster_started_here_sends_ray_no_usage_report(live: Live) -> None:
    """Usage statistics are off on the nodes `tuner cluster start` runs, and nothing is sent to
    say so: with them off, Ray's dashboard still posts a report saying they are off when it
    starts (to Ray's server; in this module, to a collector on loopback). Checked once the
    dashboard has decided (its log says so, just before it would post), with the tests of the
    module before this one in between."""
    log = Path(live.state["temp_dir"]) / "head" / "session_latest" / "logs" / "dashboard.log"
    deadline = time.monotonic() + 120  # (a hang guard: the dashboard is up before the start returns)
    while "Usage reporting is disabled." not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text()[-2000:] if log.exists() else f"no {log}"
        time.sleep(0.5)
    assert _Collector.got == [], _Collector.got


@pytest.mark.slow
def test_stop_ends_the_cluster_and_nothing_else(live: Live) -> None:
    # A bystander named like a Ray worker: a stop by process name would take it too.
    bystander = subprocess.Popen(["bash", "-c", "exec -a ray::IDLE sleep 300"], start_new_session=True)
    try:
        procs = _cluster_processes(live)
        stop = live.run(str(SCRIPTS / "cluster.sh"), "stop")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        _, alive = psutil.wait_procs(procs, timeout=30)
        assert not alive, [(p.pid, p.name()) for p in alive]
        assert bystander.poll() is None
        assert not Path(live.state["temp_dir"]).exists()
        assert "no cluster" in live.run(str(SCRIPTS / "cluster.sh"), "status").stderr
        assert all(live.token not in text for text in live.printed)
    finally:
        bystander.kill()
        bystander.wait()
