"""What the raylet of a Ray that tuner starts runs to start a Python worker: a copy of a warm
process (tuner.cluster.worker_fork) when one serves this Ray, else Ray's own set-up script.

Standard library only, run as a script: it replaces Ray's `setup_worker.py` in the worker
command (`_ray_internals.forked_workers`) and must cost nothing next to what it saves. It reads
the runtime environment context Ray hands that script (its environment variables), and asks the
warm process at $TUNER_WORKER_FORK for a child running Ray's `default_worker.py` with this
process's arguments, environment, working directory and standard streams. It then stands for
that child where the raylet started a process: it passes on SIGTERM, SIGINT and SIGHUP (through
a pidfd of the child the warm process hands it), and exits as the child did (the child, for its
part, ends if this process is killed).

Anything it cannot serve exactly as Ray would (a context with a command prefix other than a job's
working_dir's `cd DIR &&`, another Python, another entry point; a worker that is not Python; no
warm process) goes to Ray's own script, unchanged: `exec` of `setup_worker.py`.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import struct
import sys

ENV = "TUNER_WORKER_FORK"  # the warm process's socket, in the raylet's environment
_HEADER = struct.Struct("!I")


def _split(args: list[str]) -> tuple[dict, str, list[str]]:
    """(the runtime env context, the language, the rest: default_worker.py and its arguments),
    as Ray's setup_worker.py reads them (argparse's parse_known_args of two options)."""
    values = {"--serialized-runtime-env-context": "{}", "--language": ""}
    rest: list[str] = []
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in values:
            if not eq:
                i += 1
                value = args[i] if i < len(args) else ""
            values[name] = value
        else:
            rest.append(args[i])
        i += 1
    return json.loads(values["--serialized-runtime-env-context"] or "{}"), values["--language"], rest


def _environment(env_vars: dict[str, str]) -> dict[str, str]:
    """This process's environment with the context's variables set as Ray's update_envs sets
    them (each expanded against the environment so far, ${X} of an unset X empty)."""
    for key, value in (env_vars or {}).items():
        os.environ[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
    return dict(os.environ)


def _directory(prefix: list[str]) -> str | None:
    """The directory a command prefix of `cd DIR &&` steps alone leaves the worker in (a job's
    working_dir: Ray's WorkingDirPlugin adds one, DIR shell-quoted), this process's own for
    none; None for any other prefix (a container, a conda run: Ray's way)."""
    where = os.getcwd()
    if len(prefix) % 3:
        return None
    for i in range(0, len(prefix), 3):
        cd, quoted, then = prefix[i : i + 3]
        try:
            words = shlex.split(quoted)
        except ValueError:
            return None
        if cd != "cd" or then != "&&" or len(words) != 1 or not os.path.isdir(os.path.join(where, words[0])):
            return None
        where = os.path.normpath(os.path.join(where, words[0]))
    return where


def _servable(context: dict, language: str, rest: list[str]) -> bool:
    return (
        language == "PYTHON"
        and _directory(context.get("command_prefix") or []) is not None
        and not context.get("override_worker_entrypoint")
        and context.get("py_executable", sys.executable) in (None, sys.executable)
        and bool(rest)
        and rest[0].endswith("default_worker.py")
    )


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the warm process closed the connection")
        data += chunk
    return data


def _child(conn: socket.socket) -> tuple[int, int]:
    """The warm process's answer: the child's pid (0: none started) and a pidfd of it."""
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(_HEADER.size, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    data += _recv_exact(conn, _HEADER.size - len(data)) if len(data) < _HEADER.size else b""
    child = _HEADER.unpack(data)[0]
    if child and len(fds) != 1:
        raise OSError("the warm process sent no pidfd of the worker")
    return child, (fds[0] if fds else -1)


def _forked(path: str, rest: list[str], env: dict[str, str], cwd: str) -> int:
    """Ask the warm process for the worker; the child's exit status (as os.waitstatus_to_exitcode
    gives it). Raises OSError when no warm process answers (nothing was started then)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = json.dumps({"argv": rest, "env": env, "cwd": cwd, "launcher": os.getpid()}).encode()
    fds = array.array("i", [0, 1, 2])
    conn.sendmsg([_HEADER.pack(len(request)), request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    child, pidfd = _child(conn)
    if child == 0:
        raise OSError("the warm process could not start the worker")

    def forward(signum: int, frame: object) -> None:
        # Through the child's pidfd, never its pid: once the child has ended and the warm
        # process has reaped it, its pid may be another process's, or a thread's of any
        # process (kill() takes thread ids too), and the raylet's SIGTERM for this process
        # would reach that one.
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except ProcessLookupError:  # (it has ended)
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    while True:
        try:
            return struct.unpack("!i", _recv_exact(conn, 4))[0]
        except InterruptedError:
            continue


def main(argv: list[str]) -> None:
    context, language, rest = _split(argv)
    path = os.environ.get(ENV)
    if path and _servable(context, language, rest):
        own = dict(os.environ)
        env = _environment(context.get("env_vars") or {})
        cwd = _directory(context.get("command_prefix") or []) or os.getcwd()
        if context.get("command_prefix"):
            env["PWD"] = cwd  # (as bash's `cd` leaves it)
        try:
            code = _forked(path, rest, env, cwd)
        except OSError:  # no warm process (or it failed before starting one): Ray's own way
            os.environ.clear()
            os.environ.update(own)
        else:
            if code < 0:  # the copy ended by a signal: so does this process, as Ray expects
                with contextlib.suppress(OSError, ValueError):  # (SIGKILL's cannot be set)
                    signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
                code = 128 - code  # (a signal this process ignores anyway: the shell's status)
            sys.exit(code)
    os.execv(sys.executable, [sys.executable, _ray_setup_worker(rest), *argv])


def _ray_setup_worker(rest: list[str]) -> str:
    """Ray's own set-up script: beside default_worker.py, or (for what Ray starts through it that
    is no worker: `-m ray.util.client.server` on a head node) in the installed Ray's workers
    directory, found without importing Ray."""
    if rest and rest[0].endswith("default_worker.py"):
        return os.path.join(os.path.dirname(rest[0]), "setup_worker.py")
    import importlib.util

    spec = importlib.util.find_spec("ray")
    ray_dir = os.path.dirname(spec.origin) if spec and spec.origin else ""
    return os.path.join(ray_dir, "_private", "workers", "setup_worker.py")


if __name__ == "__main__":
    main(sys.argv[1:])
