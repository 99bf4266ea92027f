"""`tuner board`: TensorBoard on a sweep directory, on loopback unless asked otherwise.

TensorBoard serves from this process (its own server thread), so the URL printed is the one
it really bound: port 0 lets the OS pick a free port. It has no authentication, so it binds
127.0.0.1 by default; `--bind-all` exposes it to the network, with a warning.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from tuner.cluster.join import LOOPBACK
from tuner.config import ConfigError
from tuner.errors import ExitCode
from tuner.sweepdir import check_sweep_dir


def tensorboard_flags(sweep_dir: str, bind_all: bool = False, port: int = 0) -> list[str]:
    """TensorBoard's command-line flags for a sweep directory."""
    where = ["--bind_all"] if bind_all else ["--host", LOOPBACK]
    return [
        "--logdir",
        sweep_dir,
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


def start(sweep_dir: str, bind_all: bool = False, port: int = 0) -> str:
    """Start TensorBoard on `sweep_dir` in a background thread; returns its URL."""
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, *tensorboard_flags(sweep_dir, bind_all, port)])
    return str(board.launch())


def serve(sweep_dir: str, bind_all: bool = False, port: int = 0) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM); prints the URL first. Returns the exit code."""
    if not 0 <= port <= 65535:
        raise ConfigError("--port", f"must be 0 (a free port) to 65535, got {port}")
    path = check_sweep_dir(sweep_dir)
    url = start(path, bind_all, port)
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
