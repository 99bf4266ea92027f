"""`tuner board`: TensorBoard on a sweep directory (or several, side by side), on loopback
unless asked otherwise.

TensorBoard serves from this process (its own server thread), so the URL printed is the one
it really bound: port 0 lets the OS pick a free port. It has no authentication, so it binds
127.0.0.1 by default; `--bind-all` exposes it to the network, with a warning.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from typing import Any, Union

from tuner.cluster.join import LOOPBACK
from tuner.config import ConfigError
from tuner.errors import ExitCode
from tuner.sweepdir.place import reading


def tensorboard_flags(sweep_dirs: Union[str, list[str]], bind_all: bool = False, port: int = 0) -> list[str]:
    """TensorBoard's command-line flags for a sweep directory, or several: each one's runs then
    appear under the directory's name (`<name>/<trial>`)."""
    where = ["--bind_all"] if bind_all else ["--host", LOOPBACK]
    dirs = [sweep_dirs] if isinstance(sweep_dirs, str) else sweep_dirs
    if len(dirs) == 1:
        logdir = ["--logdir", dirs[0]]
    else:
        logdir = ["--logdir_spec", ",".join(f"{n}:{d}" for n, d in zip(run_names(dirs), dirs, strict=True))]
    return [
        *logdir,
        *where,
        "--port",
        str(port),
        # The Python loader: it reads the HParams records our driver writes (the Rust data
        # server is optional and would be one more process to start and stop).
        "--load_fast",
        "false",
        # Several writers append to each trial's directory (the trial's scalars, the
        # driver's HParams start and end records): poll every file, not only the newest.
        "--reload_multifile",
        "true",
        "--reload_interval",
        "5",
    ]


def run_names(sweep_dirs: list[str]) -> list[str]:
    """A name per sweep directory for TensorBoard's run list: the directory's own name,
    numbered where two are alike (':' and ',' would break TensorBoard's --logdir_spec)."""
    names = [re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(d.rstrip("/"))) or "sweep" for d in sweep_dirs]
    return [n if names.count(n) == 1 else f"{n}-{i}" for i, n in enumerate(names, 1)]


def start(sweep_dirs: Union[str, list[str]], bind_all: bool = False, port: int = 0) -> str:
    """Start TensorBoard on the sweep directories in a background thread; returns its URL."""
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, *tensorboard_flags(sweep_dirs, bind_all, port)])
    return str(board.launch())


def serve(sweep_dirs: Union[str, list[str]], bind_all: bool = False, port: int = 0) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM); prints the URL first. Returns the exit code."""
    if not 0 <= port <= 65535:
        raise ConfigError("--port", f"must be 0 (a free port) to 65535, got {port}")
    # A sweep in object storage is served from a reader's copy, as it is now (run the command
    # again for more).
    given = [sweep_dirs] if isinstance(sweep_dirs, str) else sweep_dirs
    paths = [reading(d).readable() for d in given]
    path = ", ".join(paths)
    url = start(paths, bind_all, port)
    if bind_all:
        print(
            "warning: TensorBoard is reachable from other machines and has no authentication; "
            "anyone who can reach this port can read the sweep",
            file=sys.stderr,
        )
    print(f"TensorBoard for {path}: {url}")
    print("Ctrl-C to stop (it picks up new trials while the sweep runs)", flush=True)
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    return ExitCode.OK
