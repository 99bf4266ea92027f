"""`ray job submit` a sweep, checked and set up to stop cleanly: `python -m tuner submit`.

    python -m tuner submit SWEEP.yaml [ray job submit options] [-- tuner sweep options]

Before anything is sent, the sweep file and flags are validated, a working directory bigger
than a cluster takes in one upload (counted as Ray packs it: .gitignore, .rayignore and
excludes honoured) is refused naming its largest files, and the cluster's dashboard is asked
its authentication mode (it answers anyone): a cluster without authentication that other
machines can reach is refused unless --allow-insecure-cluster is given. The job gets
- the working directory (default: this one), with the sweep file's path inside it;
- RAY_JOB_STOP_SIGNAL=SIGINT and a grace period (TUNER_STOP_GRACE_S, default 60 s): the job
  supervisor then interrupts the sweep on `ray job stop`, and Tune saves a resumable state
  (the driver also turns a SIGTERM into SIGINT, for jobs submitted without this script);
- TUNER_SUBMIT_DIR/TUNER_SUBMIT_HOST, so that a relative `output` means that directory, not
  the job's temporary copy of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import sys
import urllib.error
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import yaml

from tuner.cluster import _ray_internals
from tuner.cluster import join as cluster
from tuner.cluster.connect import add_runtime_flags
from tuner.config import ConfigError, load_sweep
from tuner.config.flags import add_overrides, add_resume_flag, overrides_from
from tuner.errors import ExitCode
from tuner.sweepdir import refuse_existing

INSECURE = "--allow-insecure-cluster"
USAGE = "usage: python -m tuner submit SWEEP.yaml [ray job submit options] [-- tuner sweep options]"


def take(args: list[str], flag: str) -> Optional[str]:
    """Remove `flag VALUE` or `flag=VALUE` from args and return the value (None if absent)."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
            del args[i : i + 2]
            return value
        if arg.startswith(flag + "="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def default_address() -> str:
    """RAY_API_SERVER_ADDRESS or RAY_ADDRESS when they are http(s), else that of the cluster
    `python -m tuner cluster start` started."""
    for name in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        value = os.environ.get(name, "")
        if value.startswith(("http://", "https://")):
            return value
    from tuner.cluster.local import default_state_dir, load_state

    state = load_state(default_state_dir())
    if state:
        return str(state["dashboard"])
    raise ConfigError(
        "--address",
        "no cluster to submit to: start one with `python -m tuner cluster start`, or give "
        "--address http://HEAD:8265",
    )


def check_cluster(address: str, allow_insecure: bool) -> dict[str, str]:
    """Refuse an unsafe cluster; returns what `ray job submit` needs in its environment."""
    try:
        if cluster.dashboard_auth(address) == "disabled":
            host = urlsplit(address).hostname or ""
            nodes = cluster.dashboard_nodes(address, None) if cluster.is_loopback(host) else []
            loopback = cluster.is_loopback(host) and bool(nodes) and all(map(cluster.is_loopback, nodes))
            cluster.require_safe(address, loopback, allow_insecure)
            return {}
        token = cluster.local_token()
        if token is None:
            raise ConfigError(
                "--address",
                f"the Ray cluster at {address} needs a token and none is set: {cluster.TOKEN_HELP}",
            )
        if cluster.dashboard_status(address, token) != 200:
            raise ConfigError(
                "--address", f"the Ray cluster at {address} rejected our token: {cluster.TOKEN_HELP}"
            )
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ConfigError(
            "--address", f"no Ray dashboard answers at {address} ({err}); is it running?"
        ) from None
    parts = urlsplit(address)
    if parts.scheme == "http" and not cluster.is_loopback(parts.hostname or ""):
        cluster.warn(
            f"the token goes to {address} in clear: Ray's TLS covers its gRPC traffic, not the "
            "dashboard's HTTP; reach the dashboard through an SSH tunnel, `kubectl port-forward` "
            "or an https:// proxy"
        )
    # `ray job submit` sends the token only in token mode (http_token_authentication.py).
    return {"RAY_AUTH_MODE": "token"}


def runtime_env(ray_args: list[str], working_dir: Path) -> dict[str, Any]:
    """The job's runtime env: the user's (--runtime-env FILE, --runtime-env-json) plus ours."""
    env: dict[str, Any] = {}
    path = take(ray_args, "--runtime-env")
    if path:
        env = yaml.safe_load(Path(path).read_text()) or {}
    raw = take(ray_args, "--runtime-env-json")
    if raw:
        env.update(json.loads(raw))
    env["working_dir"] = str(working_dir)
    env_vars = env.setdefault("env_vars", {})
    env_vars.setdefault("RAY_JOB_STOP_SIGNAL", "SIGINT")
    env_vars.setdefault("RAY_JOB_STOP_WAIT_TIME_S", os.environ.get("TUNER_STOP_GRACE_S", "60"))
    env_vars[cluster.SUBMIT_DIR] = str(working_dir)
    env_vars[cluster.SUBMIT_HOST] = socket.gethostname()
    return env


def validate(sweep: str, tuner_args: list[str], working_dir: Path) -> None:
    """The checks `tuner sweep` makes before Ray starts, here, before anything is submitted."""
    if "--address" in tuner_args or any(a.startswith("--address=") for a in tuner_args):
        raise ConfigError("--address", "give the cluster's address before `--` (ray job submit --address)")
    parser = argparse.ArgumentParser(prog="python -m tuner submit SWEEP.yaml ... --")
    add_overrides(parser)
    add_runtime_flags(parser)
    add_resume_flag(parser)
    args = parser.parse_args([sweep, *tuner_args])
    cfg = load_sweep(args.file, overrides_from(args))
    if "://" not in cfg.output and not args.resume_if_exists:  # relative: to the working directory
        refuse_existing(str(working_dir / os.path.expanduser(cfg.output) / cfg.name))


def check_size(working_dir: Path, excludes: Sequence[str]) -> None:
    """Refuse a working directory bigger than a Ray cluster takes in one upload, in one line
    naming its largest files, before anything is sent: the cluster would answer `ray job
    submit` with HTTP 413, a traceback. Counted as Ray packs it (.gitignore, .rayignore and
    excludes honoured, links followed, files stored uncompressed); a directory Ray could not
    walk either (a link loop) is left for Ray to report."""
    limit = _ray_internals.upload_limit()
    if limit is None:
        return
    try:
        files = _ray_internals.working_dir_files(str(working_dir), list(excludes))
    except OSError:
        return
    if files is None or (size := packed_size(files)) <= limit:
        return
    by_size = sorted(files, key=lambda f: f[1], reverse=True)
    largest = [f for f in by_size[:3] if f[1] >= 2**20] or by_size[:1]
    named = ", ".join(f"{name} ({_mib(n)})" for name, n in largest)
    raise ConfigError(
        "--working-dir",
        f"the job's working directory {working_dir} packs to {_mib(size)}, past the {_mib(limit)} a "
        f"Ray cluster takes in one upload (largest: {named}); list what the job does not need in "
        f"{working_dir / '.rayignore'} (or .gitignore, or the runtime env's excludes), or give "
        "--working-dir a smaller directory",
    )


def packed_size(files: Sequence[tuple[str, int]]) -> int:
    """Bytes of a zip storing `files` (name, bytes) uncompressed: each file's bytes, its name
    twice and ~80 bytes of headers, and the archive's 22-byte end record."""
    return sum(n + 2 * len(name.encode()) + 80 for name, n in files) + 22


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}".removesuffix(".0") + " MiB"


def command(argv: Sequence[str]) -> tuple[list[str], dict[str, str], str]:
    """(the `ray job submit` command, its extra environment, a line describing it)."""
    if not argv or argv[0].startswith("-"):
        raise ConfigError("", USAGE)
    sweep, rest = argv[0], list(argv[1:])
    split = rest.index("--") if "--" in rest else len(rest)
    ray_args, tuner_args = rest[:split], rest[split + 1 :]
    allow_insecure = INSECURE in ray_args or INSECURE in tuner_args
    ray_args = [a for a in ray_args if a != INSECURE]
    if allow_insecure and INSECURE not in tuner_args:
        tuner_args.append(INSECURE)  # the driver checks the cluster again, from inside
    working_dir = Path(take(ray_args, "--working-dir") or ".").resolve()
    inside = Path(sweep).resolve()
    if not inside.is_relative_to(working_dir):
        raise ConfigError("", f"{sweep} is not inside the working directory {working_dir} that the job gets")
    validate(sweep, tuner_args, working_dir)
    job_env = runtime_env(ray_args, working_dir)
    check_size(working_dir, job_env.get("excludes") or [])
    address = take(ray_args, "--address") or default_address()
    if "://" not in address:
        address = "http://" + address
    env = check_cluster(address, allow_insecure)
    entrypoint = ["python", "-m", "tuner", "sweep", str(inside.relative_to(working_dir)), *tuner_args]
    ray = Path(sys.executable).with_name("ray")
    cmd = [str(ray) if ray.exists() else "ray", "job", "submit", "--address", address]
    cmd += ["--runtime-env-json", json.dumps(job_env), *ray_args, "--"]
    cmd += [_shell_safe(a) for a in entrypoint]
    grace = job_env["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]
    auth = "token authentication" if env else "NO authentication"
    line = (
        f"[tuner] submitting {sweep} to {address} ({auth}), working directory {working_dir}; "
        f"`ray job stop` interrupts it with SIGINT and {grace} s to save its state"
    )
    return cmd, env, line


def _shell_safe(arg: str) -> str:
    # `ray job submit` joins the entrypoint with subprocess.list2cmdline (Windows quoting)
    # and runs it with a shell: only words that need no quoting survive unchanged.
    if shlex.quote(arg) != arg:
        raise ConfigError(
            "--", f"'{arg}' needs shell quoting, which `ray job submit` mangles; put it in the file"
        )
    return arg


def add_parser(sub: Any) -> None:
    """`submit SWEEP.yaml [ray job submit options] [-- tuner sweep options]` under the CLI."""
    p = sub.add_parser(
        "submit",
        help="ray job submit a sweep to a cluster, checked first, set up to stop cleanly",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file, inside the working directory")
    p.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="ray job submit options (--address, --working-dir, --no-wait, ...), "
        "then -- and tuner sweep options",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check, then replace this process with `ray job submit` (a ConfigError: exit 2)."""
    # The words as given: argparse drops a `--` that directly follows SWEEP.yaml, and that
    # `--` is what separates ray's options from tuner's.
    words = args.argv[args.argv.index("submit") + 1 :] if "argv" in args else [args.sweep, *args.rest]
    cmd, env, line = command(words)
    print(line, flush=True)
    os.execvpe(cmd[0], cmd, {**os.environ, **env})
    return ExitCode.OK  # not reached: exec replaced this process
