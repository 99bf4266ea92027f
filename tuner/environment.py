"""What a sweep ran on: Python, torch (and the CUDA it was built for), Ray, tuner, the NVIDIA
driver, the GPU kinds, and the git commit of the sweep's own code, so that a result can be
reproduced and two sweeps compared honestly (summary.json's `environment`, the report).

Computed once per run of a sweep, by the driver, without importing torch or Ray: versions come
from the installed packages' metadata, torch's CUDA from its `version.py` read as text, the
driver version from NVML (absent without an NVIDIA driver), and git is asked only about a code
directory inside a git work tree (found by looking for `.git` upwards, no process started
otherwise). Torch- and Ray-free.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from tuner.version import __version__

# Ray gives each node with GPUs a resource `accelerator_type:<kind>` (tuner.driver.resources).
_ACCELERATOR = "accelerator_type:"
# A bound on each git call: a repository on a hung network mount must not hold the sweep (its
# answer is then unknown, not wrong). Not a measure of speed: git answers in milliseconds.
_GIT_LIMIT_S = 60.0
_CUDA_LINE = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def describe(code_dirs: Sequence[str]) -> dict[str, Any]:
    """This machine's environment and the git state of `code_dirs` (each repository once)."""
    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "tuner": __version__,
        "torch": package_version("torch"),
        "cuda": torch_cuda(),
        "ray": package_version("ray"),
        "nvidia_driver": nvidia_driver(),
        "gpus": {},
        "code": code_state(code_dirs),
    }


def package_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_cuda() -> Optional[str]:
    """The CUDA version torch was built for (`torch.version.cuda`), None for a CPU build, read
    from torch/version.py without importing torch (a second of the driver's start-up)."""
    spec = importlib.util.find_spec("torch")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        try:
            with open(os.path.join(root, "version.py")) as f:
                found = _CUDA_LINE.search(f.read())
        except OSError:
            continue
        return found.group(1) if found else None
    return None


def nvidia_driver() -> Optional[str]:
    """The NVIDIA driver's version on this machine (NVML), None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: nothing to record
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def gpu_kinds(nodes: Iterable[dict[str, float]]) -> dict[str, int]:
    """GPUs of a cluster by kind, from each alive node's Ray resources: {"H200": 8}; a node
    whose GPUs Ray named no kind counts them under "GPU"."""
    kinds: dict[str, int] = {}
    for resources in nodes:
        count = int(resources.get("GPU", 0))
        if not count:
            continue
        named = [k[len(_ACCELERATOR) :] for k in resources if k.startswith(_ACCELERATOR)]
        kind = named[0] if named else "GPU"
        kinds[kind] = kinds.get(kind, 0) + count
    return dict(sorted(kinds.items()))


def code_state(code_dirs: Sequence[str]) -> list[dict[str, Any]]:
    """[{dir, commit, dirty}] of each git work tree among `code_dirs`, each once (the first code
    directory inside it names it). `dirty`: tracked files differ from the commit (untracked
    files do not count, as with `git describe --dirty`: a sweep's own output inside the work
    tree would otherwise always count); None when git could not say."""
    seen: set[str] = set()
    out = []
    for d in code_dirs:
        top = work_tree(d)
        if top is None or top in seen:
            continue
        seen.add(top)
        commit = _git(top, "rev-parse", "HEAD")
        changes = _git(top, "status", "--porcelain", "--untracked-files=no")
        out.append(
            {
                "dir": top,
                "commit": commit or None,
                "dirty": None if changes is None else bool(changes.strip()),
            }
        )
    return out


def work_tree(path: str) -> Optional[str]:
    """The top of the git work tree `path` is in (where `.git` is), None outside one."""
    here = os.path.abspath(path)
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            return here
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up


def _git(top: str, *args: str) -> Optional[str]:
    """git's answer in `top`, None when it fails (no git installed, a repository without a
    commit, one owned by another user)."""
    try:
        done = subprocess.run(
            ["git", "-C", top, *args],
            capture_output=True,
            text=True,
            timeout=_GIT_LIMIT_S,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # (status must not take index.lock)
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# What two runs of one sweep (or two sweeps) must share to be compared: the rest (the code
# directory's path, the platform's wording) may differ without changing a result.
COMPARED = ("python", "tuner", "torch", "cuda", "ray", "nvidia_driver", "gpus")


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What changed between two environments, one `name: old -> new` each (the code's commit
    and dirty state too)."""
    out = [f"{k}: {before.get(k)} -> {now.get(k)}" for k in COMPARED if before.get(k) != now.get(k)]
    old = {c.get("dir"): c for c in before.get("code", []) if isinstance(c, dict)}
    for c in now.get("code", []):
        was = old.get(c.get("dir"))
        if was is None:
            continue
        for key in ("commit", "dirty"):
            if was.get(key) != c.get(key):
                out.append(f"{c['dir']} {key}: {was.get(key)} -> {c.get(key)}")
    return out
