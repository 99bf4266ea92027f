"""One warning, once a sweep, when trials write into the directory they all run in.

A script (`task.command`) and your loop (`task.train`) run in the directory the sweep was
started from, so that their relative inputs (`data/`, a config file) resolve as in a run of
their own: in a directory of each trial's own (Ray's per-trial directory, where task.train
once ran) `open("data.txt")` found nothing. Their relative outputs land there too, one
directory for every trial: Lightning's `lightning_logs/version_N` raced between trials running
at once (16 trials made 13 versions, three holding two trials' checkpoints), and nanoGPT's
`out-dir/ckpt.pt` was one file for all. tuner cannot tell an output from an input, so it
leaves the directory as it is and says so, loudly, the first time a trial that ended left a
new or changed file there (`SharedWrites`), naming what and where to write instead:
`{trial_dir}` in the command, or $TUNER_TRIAL_DIR (docs/how-to/own-script.md#outputs).

What is compared: every entry of the directory and of its subdirectories (two levels; a
directory of more than MAX_ENTRIES is taken as one entry), before the first trial and after
each trial ends; names starting with "." and `__pycache__` are left out, and so is the
directory the sweep's own output lives in.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ray.tune import Callback

MAX_ENTRIES = 2000  # of one directory: a dataset's thousands of files are not listed
SHOWN = 4  # paths named in the warning

Seen = dict[str, tuple[int, int, bool]]  # path -> (mtime_ns, size, is a directory)


def snapshot(root: str, skip: Optional[str]) -> Seen:
    """The entries of `root` and of its directories (not `skip`'s, a top-level entry)."""
    seen: Seen = {}
    for entry in _entries(root):
        if entry.name == skip:
            continue
        seen[entry.name] = _stat(entry)
        if seen[entry.name][2]:
            for child in _entries(entry.path):
                seen[f"{entry.name}/{child.name}"] = _stat(child)
    return seen


def written(before: Seen, after: Seen) -> list[str]:
    """Paths new since `before`, or files changed (a directory's own time changes with any
    entry made in it: its new entries are named instead, and a new directory's too)."""
    found = sorted(k for k, v in after.items() if k not in before or (not v[2] and v != before[k]))
    return [k for k in found if not any(o.startswith(k + "/") for o in found)]


def _entries(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            found = []
            for entry in it:
                if len(found) >= MAX_ENTRIES:
                    return []  # (a data directory: too many to watch, read not written)
                if not entry.name.startswith(".") and entry.name != "__pycache__":
                    found.append(entry)
            return found
    except OSError:
        return []


def _stat(entry: os.DirEntry) -> tuple[int, int, bool]:
    try:
        st = entry.stat(follow_symlinks=False)
        return st.st_mtime_ns, st.st_size, entry.is_dir(follow_symlinks=False)
    except OSError:
        return 0, 0, False


def output_entry(root: str, sweep_dir: Optional[str]) -> Optional[str]:
    """The entry of `root` that holds the sweep's own directory (`runs` of `runs/name`), if any."""
    if not sweep_dir:
        return None
    rel = os.path.relpath(os.path.realpath(sweep_dir), os.path.realpath(root))
    return None if rel.startswith("..") or rel == "." else rel.split(os.sep)[0]


class SharedWrites(Callback):
    """Tune callback: compares the start directory after each trial ends with how the sweep
    found it, and prints the warning once (see the module)."""

    def __init__(self, root: str, sweep_dir: Optional[str]):
        self.root, self.skip = root, output_entry(root, sweep_dir)
        self.before: Optional[Seen] = None
        self.said = False

    def setup(self, **info: Any) -> None:
        self.before = snapshot(self.root, self.skip)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._look()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._look()

    def _look(self) -> None:
        if self.said or self.before is None:
            return
        paths = written(self.before, snapshot(self.root, self.skip))
        if not paths:
            return
        self.said = True
        more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
        print(
            f"[tuner] warning: trials wrote into {self.root}, the directory every trial runs in: "
            f"{', '.join(paths[:SHOWN])}{more}. Trials running at once write the same relative "
            "paths there and overwrite each other's files: send each trial's outputs to its own "
            "directory, {trial_dir} in task.command or $TUNER_TRIAL_DIR "
            "(docs/how-to/own-script.md#outputs)",
            flush=True,
        )
