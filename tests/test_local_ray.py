"""The private local Ray a plain `tuner sweep` starts: a private token, loopback sockets only."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, CliSweep, files_holding
from tuner.cluster._ray_internals import FALLBACKS_ENV

# Starts the local Ray the way `tuner sweep` does, then lists what its processes listen on.
# (Ray is imported after tuner starts it, as in `tuner sweep`: the fallback's loopback setting
# is read when Ray is imported.)
PROBE = """
import json, os, time, psutil
from tuner.cluster.connect import Runtime, connect, quiet_ray
verbose = os.environ.get("PROBE_VERBOSE") == "1"
quiet_ray(verbose)
connect(Runtime(num_cpus=1, verbose=verbose))
def cmdline(p):
    try:
        return p.cmdline()
    except psutil.Error:  # (ended meanwhile)
        return []
def listening():
    kids = {p.pid: p for p in psutil.Process().children(recursive=True)}
    kids[os.getpid()] = psutil.Process()
    conns = psutil.net_connections("inet")
    return [(c.laddr.ip, kids[c.pid]) for c in conns if c.status == "LISTEN" and c.pid in kids]
# The API server starts last (after ray.init returns): once it listens, every server is up.
while not any("dashboard/dashboard.py" in " ".join(cmdline(p)) for _, p in listening()):
    time.sleep(0.1)
hosts = sorted({ip for ip, _ in listening()})
procs = psutil.Process().children(recursive=True)
idle = [p.pid for p in procs if cmdline(p)[:1] == ["ray::IDLE"]]
log_monitor = [p.pid for p in procs if "log_monitor.py" in " ".join(cmdline(p))]
monitor = [p.pid for p in procs if "autoscaler/_private/monitor.py" in " ".join(cmdline(p))]
print(json.dumps({"hosts": hosts, "idle": idle, "log_monitor": log_monitor, "monitor": monitor}))
import ray
ray.shutdown()
"""


def _start_local_ray(home: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**clean, **env, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    "fallbacks,verbose", [("", ""), ("1", ""), ("", "1")], ids=["shortcuts", "fallbacks", "verbose"]
)
def test_local_ray_keeps_its_token_private_and_listens_on_loopback_only(
    tmp_path: Path, fallbacks: str, verbose: str
) -> None:
    """With Ray's private API (`_node_ip_address`) and with the public fallbacks forced (the
    loopback setting Ray reads at import). Without a token, one is made 0600 (Ray itself would
    write it 0644); a token the user has is kept and used, and if others can read it a warning
    names it. Idle workers are started ahead for the driver only where trials can run on them.
    A log monitor (it copies the workers' output to the driver) only with --verbose, which
    shows that output, or where the fallbacks start Ray as it starts itself."""
    token = tmp_path / ".ray" / "auth_token"
    if fallbacks:
        token.parent.mkdir()
        token.write_text("x" * 64)
        token.chmod(0o644)
    run = _start_local_ray(tmp_path, {FALLBACKS_ENV: fallbacks, "PROBE_VERBOSE": verbose})
    assert run.returncode == 0, run.stderr
    if fallbacks:
        assert f"{token} can be read by other users of this machine: chmod 600 {token}" in run.stderr
        assert token.read_text() == "x" * 64  # the user's token is used, not replaced
    else:
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
    probed = json.loads(run.stdout.strip().splitlines()[-1])
    hosts = probed["hosts"]
    assert hosts, "the local Ray listens somewhere"
    assert all(h in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for h in hosts), hosts
    # Idle workers started ahead for the driver only where trial actors can take them (they have
    # no runtime_env of their own with the shortcuts): none with the fallbacks. (With the
    # shortcuts they may still be importing Ray here: test_trial_actors_... below.)
    if fallbacks:
        assert probed["idle"] == [], probed
    assert bool(probed["log_monitor"]) == bool(fallbacks or verbose), probed
    # Nor an autoscaler monitor: one node that never grows has nothing to scale.
    assert bool(probed["monitor"]) == bool(fallbacks), probed


def _first_time(log: Path) -> str:
    """The time stamp of a Ray log's first line ("2026-11-25 01:05:19,365"), either format."""
    line = log.read_text().splitlines()[0]
    return line.lstrip("[")[:23]


def test_a_sweep_exits_without_leaving_ray_behind_and_starts_the_api_server_last(cli_sweep: CliSweep) -> None:
    """`tuner sweep` ends its private Ray itself (no slow graceful shutdown after the results):
    nothing it started outlives it. Ray's API server starts after the raylet, not first."""
    run = cli_sweep.run
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((cli_sweep.sweep_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == 3, summary
    assert not cli_sweep.left, cli_sweep.left
    logs = cli_sweep.ray_logs
    names = {p.name for p in logs.iterdir()}
    assert "raylet.out" in names and "dashboard.log" in names, names
    assert _first_time(logs / "raylet.out") < _first_time(logs / "dashboard.log")


def test_a_sweep_removes_the_session_directories_of_ended_rays_but_the_newest(cli_sweep: CliSweep) -> None:
    """Ray never removes a session directory (logs, sockets: ~0.5 MB a sweep); at its end a
    sweep removes those of local Rays whose drivers have ended from tuner's private directory,
    but the newest 5 (its own among them). Of the 9 sessions before it (7 ended, one of a
    running driver, the oldest) and its own: the 3 oldest ended go; the running driver's
    session, what is not a session, and the newest 4 ended stay."""
    assert cli_sweep.run.returncode == 0, cli_sweep.run.stdout + cli_sweep.run.stderr
    left = [name for name, kept in sorted(cli_sweep.sessions.items()) if kept]
    names = sorted(cli_sweep.sessions)
    assert left == ["kept_by_the_user", names[1], *names[-4:]], left  # (names[1]: the running one's)
    assert cli_sweep.ray_logs.parents[1].is_dir()  # its own


def test_trial_actors_take_the_workers_ray_started_ahead(cli_sweep: CliSweep) -> None:
    """A trial actor has no runtime_env of its own (_ray_internals.plain_trial_actors: Tune's
    default gave each one `PL_DISABLE_FORK`), so the Ray worker started ahead for the driver runs
    it and no worker is set up for it through the runtime env agent; the sweep's 3 trials ran
    on as many workers as the Ray has CPUs (2), the ones started ahead."""
    run = cli_sweep.run
    assert run.returncode == 0, run.stdout + run.stderr
    agent = (cli_sweep.ray_logs / "runtime_env_agent.log").read_text()
    assert "Creating runtime env" not in agent, agent[-2000:]
    workers = list(cli_sweep.ray_logs.glob("python-core-worker-*.log"))
    assert len(workers) == 2, [w.name for w in workers]


def test_every_stage_of_a_sweep_is_marked_in_its_timeline(cli_sweep: CliSweep) -> None:
    """With TUNER_TIMELINE naming a file, the driver and each trial process append the stages
    they pass (tuner/timeline.py), in order, each trial's from its start to its end: what
    scripts/timeline.py and bench.py's fixed section read."""
    assert cli_sweep.run.returncode == 0, cli_sweep.run.stdout + cli_sweep.run.stderr
    stages = cli_sweep.marks
    done = [m["what"] for m in stages if m["what"] not in ("trial", "loaded", "first_report", "trial_end")]
    assert done == ["cli", "ray_init", "ray_up", "preloaded", "fit", "fit_done", "finished", "leave"], done
    for what in ("trial", "loaded", "first_report"):  # every trial, each stage
        assert len({m["trial"] for m in stages if m["what"] == what}) == 3, (what, stages)
    fit, fit_done = (next(m["t"] for m in stages if m["what"] == w) for w in ("fit", "fit_done"))
    assert all(fit < m["t"] < fit_done for m in stages if m["what"] == "trial"), stages
    # A trial's end in its actor, after its first report: always for one its actor handed over
    # to the next trial (Tune waits for the trial's thread before it reuses the actor); an
    # actor's last trial may leave none under load (Tune ends the actor without waiting for
    # that thread, the sweep's end kills Ray: scripts/timeline.py ends it at its last report).
    first_report = {m["trial"]: m["t"] for m in stages if m["what"] == "first_report"}
    ended = {m["trial"]: m["t"] for m in stages if m["what"] == "trial_end"}
    assert all(t > first_report[trial] for trial, t in ended.items()), stages
    actors: dict[int, list[str]] = {}
    for m in sorted(stages, key=lambda m: m["t"]):
        if m["what"] == "trial":
            actors.setdefault(m["pid"], []).append(m["trial"])
    handed = [trial for trials in actors.values() for trial in trials[:-1]]
    assert handed and all(trial in ended for trial in handed), (actors, ended)
    # Each process's first line says whether it is a copy of the warm process (worker_fork):
    # every trial actor is, and the driver is not.
    first = {m["pid"]: m for m in reversed(stages)}
    trials = {m["pid"] for m in stages if m["what"] == "trial"}
    assert trials and all(first[p]["copied"] for p in trials), stages
    assert not first[next(m["pid"] for m in stages if m["what"] == "cli")]["copied"]


def test_no_credential_of_the_environment_is_left_anywhere_and_rays_files_are_private(
    cli_sweep: CliSweep,
) -> None:
    """AWS credentials in the environment of a sweep (a local output: it needs none) are in no
    file it leaves: its sweep directory, its Ray's session directory (Tune handed them to every
    trial actor's runtime env, which Ray's runtime env agent logged). Ray's files are in a
    directory only this user may enter, as `tuner cluster start`'s are."""
    assert cli_sweep.run.returncode == 0, cli_sweep.run.stdout + cli_sweep.run.stderr
    assert not files_holding(cli_sweep.secrets, cli_sweep.sweep_dir, cli_sweep.ray_tmp)
    assert cli_sweep.ray_logs.name == "logs" and (cli_sweep.ray_logs / "raylet.out").is_file()
    private = cli_sweep.ray_logs.parents[2]  # <it>/ray/session_*/logs
    assert private.parent == cli_sweep.ray_tmp and stat.S_IMODE(private.stat().st_mode) == 0o700
    assert private.stat().st_uid == os.getuid()
