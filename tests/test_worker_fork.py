"""Ray workers copied from a warm process (tuner.cluster.worker_fork, worker_launch): the
launcher stands for its copy where the raylet started a process, and anything it cannot serve
as Ray would goes Ray's own way.

The mechanism is tested here with a script of the test's own in the place of Ray's
default_worker.py (no Ray); the sweeps of the whole suite run on copied workers, and
tests/test_local_ray.py checks that a user's sweep's trial actors are copies.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, gone
from tuner.cluster import worker_fork, worker_launch

# What the copy runs: it says who it is and what it was given, then waits for the test.
WORKER = """
import json, os, sys, time
env = os.environ.get
seen = {"pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(), "env": env("FROM_CONTEXT")}
seen.update(copied=env("TUNER_WORKER_COPIED"), torch="torch" in sys.modules, group=os.getpgid(0))
print(json.dumps(seen), flush=True)
if "--wait" in sys.argv:
    time.sleep(600)
sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]) if "--exit" in sys.argv else 0)
"""


@pytest.fixture
def warm(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A warm process serving copies that run tmp_path/default_worker.py: (its socket, the script).
    It has imported tmp_path/warm_extra.py besides what it imports itself; its standard error is
    tmp_path/warm.log."""
    script = tmp_path / "default_worker.py"
    script.write_text(WORKER)
    (tmp_path / "warm_extra.py").write_text("")
    sock = tmp_path / "s.sock"
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import warm_extra; "
    code += f"from tuner.cluster.worker_fork import serve; serve({str(sock)!r}, {str(script)!r})"
    with open(tmp_path / "warm.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=log)
    try:
        while not sock.exists():  # (bound before its imports: a launcher waits in the backlog)
            assert proc.poll() is None, "the warm process ended"
            time.sleep(0.01)
        yield sock, script
    finally:
        proc.kill()
        proc.wait()


def _launch(sock: Path, script: Path, *args: str, context: dict | None = None, **kw) -> subprocess.Popen:
    ctx = json.dumps(context if context is not None else {"env_vars": {"FROM_CONTEXT": "x-${HOME}"}})
    argv = [str(script), *args, "--language=PYTHON", f"--serialized-runtime-env-context={ctx}"]
    env = {**os.environ, worker_launch.ENV: str(sock)}
    return subprocess.Popen(
        [sys.executable, worker_fork.LAUNCHER, *argv], env=env, stdout=subprocess.PIPE, text=True, **kw
    )


def test_a_copy_runs_the_script_with_the_launchers_arguments_environment_and_streams(
    warm: tuple[Path, Path], tmp_path: Path
) -> None:
    sock, script = warm
    launcher = _launch(sock, script, "--exit", "7", cwd=tmp_path)
    out, _ = launcher.communicate(timeout=120)
    seen = json.loads(out)
    assert launcher.returncode == 7  # its exit status is the copy's
    assert seen["pid"] != launcher.pid and seen["argv"] == [str(script), "--exit", "7"]
    assert seen["cwd"] == str(tmp_path) and seen["copied"] == "1"
    assert seen["env"] == "x-" + os.environ["HOME"]  # the context's variables, expanded as Ray does
    assert seen["torch"]  # imported once, in the warm process
    # A group of its own, as Ray gives each worker (the raylet ends a worker's group with it)
    assert seen["group"] == seen["pid"]


def test_a_launcher_killed_ends_its_copy_and_a_signal_reaches_it(warm: tuple[Path, Path]) -> None:
    sock, script = warm
    launcher = _launch(sock, script, "--wait")
    copy = json.loads(launcher.stdout.readline())["pid"]
    assert psutil.pid_exists(copy)
    launcher.kill()  # SIGKILL: nothing of the launcher's runs
    launcher.wait()
    gone(copy)  # (fails when the copy outlives its launcher)
    launcher = _launch(sock, script, "--wait")
    copy = json.loads(launcher.stdout.readline())["pid"]
    launcher.send_signal(signal.SIGTERM)  # passed on: the copy ends of it, and so does the launcher
    assert launcher.wait(timeout=60) == -signal.SIGTERM
    gone(copy)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_copy_ended_by_a_signal_ends_its_launcher_by_the_same_signal(
    warm: tuple[Path, Path], signum: int
) -> None:
    """What the raylet sees of a worker that a signal ended (the raylet's group cleanup sends
    SIGKILL): its launcher ended by that signal, silently (SIGKILL's handler cannot be set:
    a traceback in raylet.err and exit status 1 before)."""
    sock, script = warm
    launcher = _launch(sock, script, "--wait", stderr=subprocess.PIPE)
    copy = json.loads(launcher.stdout.readline())["pid"]
    os.kill(copy, signum)
    assert launcher.wait(timeout=60) == -signum
    assert launcher.stderr.read() == ""


def test_what_a_copy_cannot_be_goes_rays_own_way(warm: tuple[Path, Path], tmp_path: Path) -> None:
    """A context with a command prefix (a container), no warm process, a GPU worker: Ray's
    own set-up script beside the worker script, with the arguments as given."""
    sock, script = warm
    (tmp_path / "setup_worker.py").write_text(
        "import json, sys\nprint(json.dumps({'ray_setup': sys.argv[1:]}))\n"
    )
    prefixed = _launch(sock, script, context={"command_prefix": ["conda", "run"]})
    assert "ray_setup" in json.loads(prefixed.communicate(timeout=120)[0])
    lost = _launch(tmp_path / "nothing.sock", script)
    assert "ray_setup" in json.loads(lost.communicate(timeout=120)[0])
    gpu = _launch(sock, script, context={"env_vars": {"CUDA_VISIBLE_DEVICES": "0"}})
    assert "ray_setup" in json.loads(gpu.communicate(timeout=120)[0])


def test_a_jobs_working_dir_is_served_as_ray_would_unless_it_holds_a_module_the_copy_has(
    warm: tuple[Path, Path], tmp_path: Path
) -> None:
    """A submitted job's working_dir reaches the worker as Ray's WorkingDirPlugin makes it: a
    command prefix `cd DIR &&` (DIR shell-quoted) and DIR first on PYTHONPATH. The copy starts
    in DIR, with DIR on its path. A working_dir with its own copy of a module the warm process
    has imported (tuner, torch) goes Ray's way: a worker Ray starts imports that copy."""
    sock, script = warm
    (tmp_path / "setup_worker.py").write_text("import json\nprint(json.dumps({'ray_setup': 1}))\n")
    job = tmp_path / "job dir"  # (a space: the prefix quotes it, as Ray does)
    job.mkdir()
    (job / "project_code.py").write_text("")
    context = {
        "command_prefix": ["cd", f"'{job}'", "&&"],
        "env_vars": {"PYTHONPATH": f"{job}:${{PYTHONPATH}}"},
    }
    seen = json.loads(_launch(sock, script, context=context).communicate(timeout=120)[0])
    assert seen["copied"] == "1" and seen["cwd"] == str(job), seen
    (job / "tuner").mkdir()  # (a project that ships its own tuner)
    assert json.loads(_launch(sock, script, context=context).communicate(timeout=120)[0]) == {"ray_setup": 1}
    other = {"command_prefix": ["cd", f"'{job}'", "&&", "source", "env.sh", "&&"]}
    assert json.loads(_launch(sock, script, context=other).communicate(timeout=120)[0]) == {"ray_setup": 1}


def test_once_a_module_it_imported_changes_on_disk_every_worker_starts_cold(
    warm: tuple[Path, Path], tmp_path: Path
) -> None:
    """A cluster's node lives for days, and tuner may be reinstalled or edited under it (or torch
    upgraded): a copy would run what its warm process imported then, not what is on disk. Once a
    file it imported has changed, every worker goes Ray's own way, and its log says which."""
    sock, script = warm
    (tmp_path / "setup_worker.py").write_text("import json\nprint(json.dumps({'ray_setup': 1}))\n")
    assert json.loads(_launch(sock, script).communicate(timeout=120)[0])["copied"] == "1"
    extra = tmp_path / "warm_extra.py"
    os.utime(extra, ns=(extra.stat().st_atime_ns, extra.stat().st_mtime_ns + 10**9))
    for _ in range(2):
        assert json.loads(_launch(sock, script).communicate(timeout=120)[0]) == {"ray_setup": 1}
    said = (tmp_path / "warm.log").read_text()
    assert said.count(f"{extra} changed since it was imported here: workers start cold") == 1, said


def test_what_ray_starts_through_its_set_up_script_that_is_no_worker_gets_rays_script() -> None:
    """A head node's client server is `python SETUP -m ray.util.client.server ...`: with the
    launcher in SETUP's place, Ray's own script, found in the installed Ray (its head node died
    at once when the launcher looked for it beside `-m`)."""
    import ray

    ray_setup = Path(ray.__file__).parent / "_private" / "workers" / "setup_worker.py"
    assert ray_setup.is_file()
    assert worker_launch._ray_setup_worker(["-m", "ray.util.client.server", "--port=1"]) == str(ray_setup)
    assert worker_launch._ray_setup_worker(["/r/default_worker.py"]) == "/r/setup_worker.py"


def test_the_launcher_reads_rays_arguments_as_rays_set_up_script_does() -> None:
    ctx = {"env_vars": {"A": "1"}, "py_executable": sys.executable}
    args = [
        "/r/default_worker.py",
        "--x=1",
        "--language",
        "PYTHON",
        f"--serialized-runtime-env-context={json.dumps(ctx)}",
    ]
    context, language, rest = worker_launch._split(args)
    assert (context, language, rest) == (ctx, "PYTHON", ["/r/default_worker.py", "--x=1"])
    assert worker_launch._servable(context, language, rest)
    assert not worker_launch._servable({**ctx, "py_executable": "/other/python"}, language, rest)
    assert not worker_launch._servable({**ctx, "override_worker_entrypoint": "/w.py"}, language, rest)
    assert not worker_launch._servable(ctx, "JAVA", rest)


@pytest.mark.parametrize("torch", [True, False])
def test_the_warm_process_imports_torch_only_for_trials_that_do(torch: bool) -> None:
    """A script's sweep starts its warm process with NO_TORCH: what it imports then (every
    module of WARM not in TORCH) imports no torch; else torch and tuner's loops are warm."""
    args = [] if torch else [worker_fork.NO_TORCH]
    code = (
        "import sys\nfrom tuner.cluster import worker_fork\n"
        f"worker_fork._warm(worker_fork.NO_TORCH not in {args!r})\n"
        "print(sorted(m for m in ('torch', 'tuner.trial.loop.run', 'tuner.trial.script.run', 'pandas') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    warm = ["pandas", "torch", "tuner.trial.loop.run", "tuner.trial.script.run"]
    assert out.stdout.split("\n")[0] == str(warm if torch else ["pandas", "tuner.trial.script.run"])


def test_a_warm_process_leaves_no_socket_and_keeps_its_log_only_when_something_is_in_it(
    tmp_path: Path,
) -> None:
    sock, log = tmp_path / f"fork-{os.getpid()}.sock", tmp_path / f"fork-{os.getpid()}.log"
    for said in ("", "Traceback (most recent call last): ...\n"):
        assert worker_fork.start(str(tmp_path), torch=False)
        try:
            assert os.environ[worker_launch.ENV] == str(sock)
            assert log.stat().st_mode & 0o777 == 0o600  # (its own errors, in the private directory)
            with log.open("a") as f:
                f.write(said)
        finally:
            worker_fork.stop()
        assert worker_launch.ENV not in os.environ and not sock.exists()
        assert log.exists() == bool(said) and (not said or log.read_text() == said)


_WAITS = """import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print("up", flush=True)
time.sleep(600)
"""


def _catches_sigterm(pid: int) -> bool:
    caught = next(
        ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigCgt:")
    )
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_a_launcher_signals_its_copy_through_the_pidfd_it_was_handed_never_by_its_pid(tmp_path: Path) -> None:
    """Once a copy has ended and the warm process has reaped it, its pid may be any process's
    (or thread's) by the time the raylet's SIGTERM reaches the launcher. A stand-in warm
    process hands the launcher another process's pid (the bystander's) with the copy's pidfd:
    the SIGTERM reaches the copy, and the bystander is left alone."""
    copy, bystander = (
        subprocess.Popen([sys.executable, "-c", _WAITS], stdout=subprocess.PIPE, text=True) for _ in range(2)
    )
    sock = tmp_path / "w.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(1)
    try:
        assert copy.stdout.readline() == "up\n" and bystander.stdout.readline() == "up\n"
        launcher = _launch(sock, tmp_path / "default_worker.py")
        conn, _ = listener.accept()
        _, fds, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(3 * 4))
        for _, _, data in fds:  # (the launcher's standard streams: not needed here)
            for fd in array.array("i", data[: len(data) - len(data) % 4]):
                os.close(fd)
        pidfd = os.pidfd_open(copy.pid)
        conn.sendmsg(
            [struct.pack("!I", bystander.pid)],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))],
        )
        os.close(pidfd)
        while not _catches_sigterm(launcher.pid):  # (it passes signals on once it has the copy)
            assert launcher.poll() is None
            time.sleep(0.01)
        launcher.send_signal(signal.SIGTERM)
        assert copy.wait(timeout=60) == 143
        assert bystander.poll() is None  # (with its pid, it would have been signalled instead)
        conn.sendall(struct.pack("!i", 143))  # (the copy's exit, as the warm process reports it)
        assert launcher.wait(timeout=60) == 143
    finally:
        listener.close()
        for p in (copy, bystander):
            p.kill()
            p.wait()
