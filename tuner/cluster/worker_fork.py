"""A warm process the Python workers of a Ray that tuner starts are copied from (fork).

Every trial actor is a new Ray worker process, and before its first epoch it imports what
every trial imports: Ray, Ray Tune (with pandas and pyarrow), torch, Dynamo (torch.optim's
first optimizer imports it) and tuner's trial frame, about 2.4 of the 2.7 CPU-seconds a trial
actor costs to start (BENCHMARKS.md, "Where the suite's CPU goes"). This process imports them
once, beside `ray.init`, and then forks a copy of itself for each worker the raylet starts
(tuner.cluster.worker_launch asks it, over a Unix socket only this user can reach): the copy
runs Ray's `default_worker.py` with the launcher's arguments, environment, working directory
and standard streams, as a worker Ray started itself would, and costs milliseconds.

It never runs anything but that script, never touches a GPU or starts a thread before a
fork (a forked copy has only the thread that forked), and ends with the process that started
it (the driver), or when asked. A copy ends when its launcher does.

    python -m tuner.cluster.worker_fork SOCKET
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any, Optional

from tuner.cluster.worker_launch import ENV  # the socket, in the environment launchers inherit
from tuner.timeline import COPIED_ENV  # set in each worker copied from the warm process

# Imported once here, and so by no worker copied from this process. Never Ray itself: importing
# it builds Ray's C++ settings from this process's environment (RayConfig: RAY_JOB_ID,
# RAY_AUTH_MODE, RAY_RAYLET_PID...), which the raylet sets for each worker, so a copy must import
# Ray after it has the worker's environment. Nor anything that imports Ray at import time.
WARM = (
    "torch",
    "torch._dynamo",  # (what torch.optim imports at the first optimizer: sympy with it)
    "torch.optim",
    "pandas",  # (what Ray Tune imports, Ray aside)
    "pyarrow",
    "fsspec",
    "requests",
    # What Ray and Ray Tune import from other packages (Ray aside): 0.09 CPU-s of each copy's
    # start, once here instead (BENCHMARKS.md, "Ray's packages warm").
    "google.protobuf.json_format",
    "google.protobuf.struct_pb2",
    "google.protobuf.timestamp_pb2",
    "pydantic.main",
    "pydantic.dataclasses",
    "pydantic.fields",
    "rich.console",
    "rich.table",
    "rich.progress",
    "rich.layout",
    "rich.panel",
    "rich.pretty",
    "jsonschema",
    "filelock",
    "yaml",
    "attr",
    "psutil",
    "msgpack",
    "tqdm.auto",
    "pyarrow.fs",
    "pyarrow.parquet",
    "pyarrow.dataset",
    "pdb",
    "logging.config",
    "logging.handlers",
    "packaging.version",
    "tuner.trial.launch.trainables",
    "tuner.trial.frame.session",
    "tuner.trial.frame.harness",
    "tuner.trial.loop.run",
    "tuner.trial.userloop.run",
    "tuner.trial.script.run",
)
# Those of WARM that import torch: left out for trial actors that never do (a script's).
TORCH = ("torch", "torch._dynamo", "torch.optim", "tuner.trial.loop.run", "tuner.trial.userloop.run")
_HEADER = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1
NO_TORCH = "--no-torch"  # (the warm process's argument: skip TORCH)
OFF_ENV = "TUNER_WORKER_FORK_OFF"  # set (not 0): every worker starts cold, as Ray starts it
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_launch.py")
_started: list[tuple[subprocess.Popen, str]] = []  # (the warm process, its socket) of this driver


def usable() -> bool:
    """Whether workers can be copied here: Linux (fork, pidfd_open) and not turned off."""
    if os.environ.get(OFF_ENV, "").strip() not in ("", "0"):
        return False
    return sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(os, "pidfd_open")


def start(where: str, torch: bool = True) -> bool:
    """Start the warm process for the Ray this driver is about to start, its socket in the
    private directory `where` (join.private_temp_dir); False where it cannot be (then every
    worker starts cold). Its imports run beside ray.init's start; it ends with this process
    (or at `stop`). `torch`: whether it imports torch (False for trial actors that never
    do, a script's: a second of CPU less beside Ray's start)."""
    stop()  # (one warm process a driver: that of an earlier Ray of this process is of no use)
    if not usable():
        return False
    path = os.path.join(where, f"fork-{os.getpid()}.sock")
    if len(path.encode()) > 100:  # (a Unix socket's path is at most 107 bytes)
        return False
    _clear_stale(where)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    # Its own errors (a copy's streams are its launcher's: Ray's worker logs) go to a log
    # beside its socket, in the private directory.
    log = os.open(_log(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cluster.worker_fork", path, *(() if torch else (NO_TORCH,))],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # (a Ctrl-C in the terminal is the driver's to handle)
            close_fds=True,
        )
    finally:
        os.close(log)
    _started.append((proc, path))
    os.environ[ENV] = path
    return True


def stop() -> None:
    """End this driver's warm process (its copies, Ray's workers, end with their raylet)."""
    os.environ.pop(ENV, None)
    while _started:
        proc, path = _started.pop()
        with contextlib.suppress(OSError):
            proc.kill()
            proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(path)
        _drop_empty_log(path)


def _log(path: str) -> str:
    """The warm process's log, beside its socket `path`."""
    return path[: -len(".sock")] + ".log"


def _drop_empty_log(path: str) -> None:
    """Its log when nothing was written to it (kept otherwise: what went wrong)."""
    with contextlib.suppress(OSError):
        if os.path.getsize(_log(path)) == 0:
            os.unlink(_log(path))


def _clear_stale(where: str) -> None:
    """The sockets (and empty logs) of warm processes whose drivers are gone (killed: nothing
    unlinked them)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(where):
            if name.startswith("fork-") and name.endswith(".sock"):
                pid = name[len("fork-") : -len(".sock")]
                if pid.isdigit() and not _alive(int(pid)):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(where, name))
                    _drop_empty_log(os.path.join(where, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent() -> None:
    """SIGKILL when the process that started this one ends (Linux prctl; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _default_worker() -> str:
    import importlib.util

    spec = importlib.util.find_spec("ray")  # (without importing Ray: see WARM)
    here = os.path.dirname(os.path.abspath(spec.origin)) if spec and spec.origin else ""
    return os.path.join(here, "_private", "workers", "default_worker.py")


def _warm(torch: bool = True) -> None:
    for name in WARM if torch else [n for n in WARM if n not in TORCH]:
        with contextlib.suppress(Exception):  # what is missing is imported by the worker, as ever
            importlib.import_module(name)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: its JSON and the three standard streams' file descriptors."""
    fds = array.array("i")
    data = b""
    size = None
    while size is None or len(data) < size:
        msg, ancdata, _, _ = conn.recvmsg(1 << 16, socket.CMSG_LEN(3 * fds.itemsize))
        if not msg:
            raise ConnectionError("the launcher left")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
        data += msg
        if size is None and len(data) >= _HEADER.size:
            size = _HEADER.unpack(data[: _HEADER.size])[0] + _HEADER.size
    return json.loads(data[_HEADER.size :]), list(fds)


def _watch(launcher: int) -> None:
    """In a copy: end when its launcher (the process the raylet started) ends."""
    try:
        pidfd = os.pidfd_open(launcher)
    except OSError:  # already gone
        os._exit(1)

    def wait() -> None:
        sel = selectors.DefaultSelector()
        sel.register(pidfd, selectors.EVENT_READ)
        sel.select()
        os._exit(1)

    threading.Thread(target=wait, name="tuner-launcher-watch", daemon=True).start()


def _become_worker(request: dict[str, Any], fds: list[int], keep_out: list[int]) -> None:
    """In the forked copy: the launcher's streams, environment, directory and arguments, then
    Ray's default_worker.py as `python default_worker.py ARGS` runs it. Never returns."""
    code = 1
    try:
        # A process group of its own, as the raylet gives each worker it starts: the raylet ends
        # a worker's group with it (its "per-worker process group cleanup"), and a copy left in
        # this process's group took this process and every other copy with it.
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in keep_out:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        env = request["env"]
        added = _added_paths(env)
        os.environ.clear()
        os.environ.update(env)
        os.environ[COPIED_ENV] = "1"  # (what the trial's timeline records: tuner.timeline)
        os.chdir(request["cwd"])
        argv = request["argv"]
        sys.path[0:1] = [os.path.dirname(argv[0]), *added]
        sys.argv = list(argv)
        threads = env.get("OMP_NUM_THREADS")
        if threads and threads.isdigit() and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))  # (libgomp read this process's at import)
        _watch(int(request["launcher"]))
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - a worker's end, as Python would print it
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(path: str, worker: Optional[str] = None, torch: bool = True) -> None:
    """Serve copies of this process at the Unix socket `path` until the process that started
    it ends; each runs `worker` (Ray's default_worker.py; tests give a script of their own).
    `torch`: whether to import TORCH with the rest of WARM."""
    _die_with_parent()
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # (an import asking for CUDA starts none)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)  # (a launcher that comes early waits in the backlog)
    finally:
        os.umask(old)
    listener.listen(128)
    _warm(torch)
    imported = _sources()
    top_level = {name for name in sys.modules if "." not in name}  # (what a working_dir may shadow)
    changed = ""  # (the first of them found changed: no copies from then on)
    worker = worker or _default_worker()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    keep_out_always = [listener.fileno(), wake_r, wake_w, sel.fileno()]
    with contextlib.suppress(OSError):
        parent_fd = os.pidfd_open(parent)
        sel.register(parent_fd, selectors.EVENT_READ, "parent")
        keep_out_always.append(parent_fd)
    waiting: dict[int, socket.socket] = {}  # a copy's pid -> its launcher's connection
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                return
            if key.data == "child":
                with contextlib.suppress(OSError):
                    os.read(wake_r, 4096)
                _reap(waiting)
                continue
            conn, _ = listener.accept()
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            if not changed and (changed := _changed(imported)):
                print(
                    f"{changed} changed since it was imported here: workers start cold from now on",
                    file=sys.stderr,
                    flush=True,
                )
            if changed or not _servable(request, worker, top_level) or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                conn.close()  # (the launcher then starts the worker Ray's own way)
                continue
            keep_out = [*keep_out_always, conn.fileno(), *(c.fileno() for c in waiting.values())]
            pid = os.fork()
            if pid == 0:
                _become_worker(request, fds, keep_out)
            for fd in fds:
                os.close(fd)
            # With a pidfd of the copy, taken before it can be reaped (its pid is the copy's
            # until this process waits for it): the launcher signals the copy through it,
            # never through a pid that may be another process's by then. Without one, the
            # copy goes and the launcher, told 0, starts the worker Ray's own way.
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                os.kill(pid, signal.SIGKILL)  # (its own child, not yet reaped: still this copy)
                pid, pidfd = 0, -1
            try:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))] if pid else []
                conn.sendmsg([_HEADER.pack(pid)], rights)
            except OSError:
                conn.close()
                continue
            finally:
                if pidfd >= 0:
                    os.close(pidfd)
            if not pid:
                conn.close()
                continue
            waiting[pid] = conn
        _reap(waiting)


def _sources() -> dict[str, int]:
    """The files this process imported tuner from, and every top-level module's (a package's
    `__init__.py`: pip replaces it when it upgrades the package), with their modification
    times. A copy runs what was imported here, not what is on disk now: a node of a cluster
    lives for days, and tuner or torch may be reinstalled under it (or tuner's source edited)."""
    found = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and ("." not in name or name.startswith("tuner.")):
            with contextlib.suppress(OSError):
                found[path] = os.stat(path).st_mtime_ns
    return found


def _changed(imported: dict[str, int]) -> str:
    """The first of `imported` whose file changed or went, or ""."""
    for path, mtime in imported.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return ""


def _servable(request: dict[str, Any], worker: str, top_level: set[str]) -> bool:
    """Ray's default worker, and not one given a GPU: CUDA must start in the process that uses
    it, never before a fork, and no copy is made of a process that might have (a GPU worker
    starts cold, as Ray starts it)."""
    argv, env = request.get("argv") or [""], request.get("env") or {}
    return (
        argv[0] == worker
        and not env.get("CUDA_VISIBLE_DEVICES", "").strip()
        and not _shadowed(env, top_level)
    )


def _added_paths(env: dict[str, str]) -> list[str]:
    """The directories the worker's PYTHONPATH has that this process's had not (a job's
    working_dir, its py_modules): first on the worker's sys.path, as Python puts them."""
    before = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in before]


def _shadowed(env: dict[str, str], top_level: set[str]) -> bool:
    """Whether a directory the worker's PYTHONPATH adds holds a module of a name this process
    has imported (`top_level`; a job's working_dir with its own copy of tuner, say): a worker
    started as Ray starts it imports that one, so this one must start cold."""
    for path in _added_paths(env):
        with contextlib.suppress(OSError):
            if any(entry.split(".", 1)[0] in top_level for entry in os.listdir(path)):
                return True
    return False


def _reap(waiting: dict[int, socket.socket]) -> None:
    """Each copy that ended: its exit code to its launcher."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], torch=NO_TORCH not in sys.argv[2:])
