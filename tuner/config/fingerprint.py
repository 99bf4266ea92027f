"""A sweep's task fingerprint: what makes two sweeps the same task (code.json records it;
warm starts compare it; the autotune cache keys its measurements by it), computed once per
sweep (`SweepConfig.fingerprint`) and handed to each of them.

The task's fields (model, data and its arguments, user functions, command), the objectives,
and a SHA-256 of each user module the task names (so an edited model or data function counts
as another task). Built-in data is identified by its name and arguments; what a user's data
function reads from disk is not hashed. Ray- and torch-free.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any, Optional


def fingerprint(
    task: dict[str, Any], objectives: Sequence[tuple[str, str]], dirs: list[str]
) -> dict[str, Any]:
    """The fingerprint of a task section (as JSON), its objectives and the directories its
    modules are imported from. Read the files once: `SweepConfig.fingerprint` keeps it."""
    return {
        "task": task,
        "objectives": [list(o) for o in objectives],
        "modules": _module_hashes(task, dirs),
    }


def _module_hashes(task: dict[str, Any], dirs: list[str]) -> dict[str, str]:
    refs = [v for v in task.values() if isinstance(v, str) and ":" in v]
    files = {ref.split(":")[0]: _module_file(ref.split(":")[0], dirs) for ref in refs}
    for word in task.get("command") or []:
        if isinstance(word, str) and word.endswith(".py"):
            files[word] = next(
                (os.path.join(d, word) for d in dirs if os.path.isfile(os.path.join(d, word))), None
            )
    return {name: _sha256(path) for name, path in sorted(files.items()) if path}


def _module_file(module: str, dirs: list[str]) -> Optional[str]:
    saved = list(sys.path)
    sys.path[:0] = dirs
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved
    return spec.origin if spec is not None and spec.origin and os.path.isfile(spec.origin) else None


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def difference(ours: dict[str, Any], theirs: Optional[dict[str, Any]]) -> Optional[str]:
    """Where two fingerprints differ, in a few words; None if they are the same. A field one
    of them lacks counts as unset (None): a sweep recorded before a task field existed ran
    with what its default now says."""
    if theirs is None:
        return "it recorded no task fingerprint (started before warm starts existed)"
    for part in ("task", "objectives", "modules"):
        a, b = ours.get(part), theirs.get(part)
        if isinstance(a, dict) and isinstance(b, dict) and part == "task":
            a, b = _set(a), _set(b)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            k = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            if part == "modules":
                return (
                    f"module {k} is not the one it ran" if k in a and k in b else f"it ran other code ({k})"
                )
            return f"{part}.{k} is {a.get(k)!r} here, {b.get(k)!r} there"
        return f"{part} are {a!r} here, {b!r} there"
    return None


def _set(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}
