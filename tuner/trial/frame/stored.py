"""A trial of a sweep in object storage, on whichever node it runs: what it wrote before (on
another node, or in an earlier run of the sweep) comes back into its working directory, and
its newest whole checkpoint is found in the bucket.

Ray hands a trial its own checkpoint only when Ray itself retries it; a trial that `tuner
resume` continues is a new Tune trial in the same directory, and a trial's working directory
on a new node starts empty. Without this its metrics journal would start again, and Ray's
upload of the new one would replace the whole history in the bucket.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Optional

from tuner.config.storage import is_uri
from tuner.sweepdir import (
    BEST_RECORD,
    CHECKPOINT_FILE,
    METRICS_FILE,
    TRIAL_LOG,
    read_best_record,
    read_metrics,
)
from tuner.sweepdir.patience import patient
from tuner.sweepdir.place import place_of

_CHECKPOINT_DIR = re.compile(r"^(checkpoint_\d{6})/")  # Ray's, in the trial's directory
_BROUGHT_BACK = (METRICS_FILE, BEST_RECORD, TRIAL_LOG)  # the trial's own history


def _trial_place(storage: str) -> tuple[Any, str]:
    """(the sweep's place, the trial's key prefix in it), inside a trial of a Tune run whose
    storage is the remote place whose parent is `storage`."""
    from ray import tune

    ctx = tune.get_context()
    place = place_of(f"{storage}/{ctx.get_experiment_name()}")
    return place, f"{place.key}/{os.path.basename(ctx.get_trial_dir().rstrip('/'))}"


def continue_from_storage(storage: str, trial_dir: str) -> Optional[Any]:
    """For s3:// storage: bring the trial's earlier files into `trial_dir` (its working
    directory; those already there are kept) and return its newest checkpoint in the bucket
    (a ray.tune.Checkpoint), or None. Other storage: None, nothing done."""
    if not is_uri(storage):
        return None
    import json

    from ray import tune

    place, remote = _trial_place(storage)
    fs = place.fs
    found = patient(place.uri, lambda: fs.find(remote, detail=True), announce=False)
    for key in found:
        rel = key[len(remote) :].lstrip("/")
        if rel in _BROUGHT_BACK and not os.path.exists(os.path.join(trial_dir, rel)):
            fs.get_file(key, os.path.join(trial_dir, rel))
    best = os.path.join(trial_dir, BEST_RECORD)
    if os.path.exists(best) and read_best_record(trial_dir) is None:  # its weights, named there
        with open(best) as f:
            name = os.path.basename(str(json.load(f).get("weights", "")))
        if name and f"{remote}/{name}" in found:
            fs.get_file(f"{remote}/{name}", os.path.join(trial_dir, name))
    newest = newest_checkpoint(remote, found)
    if newest is None:
        return None
    return tune.Checkpoint(path=f"{remote}/{newest}", filesystem=place.ray_storage()[1])


def upload_now(storage: str, trial_dir: str) -> None:
    """For s3:// storage: the trial's journal and log into the bucket at once. Its watchdog
    ends the process when it times out, before Ray's next upload: without this the bucket
    never learnt that the trial timed out (it was recorded as an error)."""
    if not is_uri(storage):
        return
    place, remote = _trial_place(storage)
    for name in (METRICS_FILE, TRIAL_LOG):
        path = os.path.join(trial_dir, name)
        if os.path.isfile(path):
            patient(place.uri, lambda p=path, n=name: place.fs.put_file(p, f"{remote}/{n}"), announce=False)


def newest_checkpoint(remote: str, found: dict[str, dict[str, Any]]) -> Optional[str]:
    """The name of the newest whole checkpoint among `found` (s3fs `find(remote, detail=True)`:
    key -> its details), or None. The newest upload wins (a resumed trial numbers its
    checkpoints from 0 again). Whole: the state file and the journal are both there. Ray uploads
    a checkpoint's files one by one, so a trial killed during the upload (its driver or node
    killed) can leave a directory with some of them: continued from it, the trial fails, and
    every retry alike. A checkpoint without a journal counts only where none has one (made
    before checkpoints carried it)."""
    files: dict[str, set[str]] = {}
    when: dict[str, float] = {}
    for key, info in found.items():
        rel = key[len(remote) :].lstrip("/")
        m = _CHECKPOINT_DIR.match(rel)
        if m:
            name = m.group(1)
            files.setdefault(name, set()).add(rel[len(name) + 1 :])
            stamp = info.get("LastModified")
            when[name] = max(when.get(name, float("-inf")), stamp.timestamp() if stamp is not None else 0.0)
    needed = {CHECKPOINT_FILE, METRICS_FILE}
    if not any(needed <= f for f in files.values()):
        needed = {CHECKPOINT_FILE}
    whole = [name for name, f in files.items() if needed <= f]
    return max(whole, key=lambda name: (when[name], name), default=None)


def journal_into(checkpoint_dir: str, trial_dir: str) -> None:
    """Put the trial's journal (this epoch's line already in it) into the checkpoint Ray is
    about to upload. Ray uploads the checkpoint as part of the report, but the trial's other
    files in the background: a trial killed between the two (its driver killed, say) left a
    checkpoint of epoch 3 beside a journal ending at epoch 2, and continued at epoch 4 with
    epoch 3 missing from its history."""
    journal = os.path.join(trial_dir, METRICS_FILE)
    if os.path.isfile(journal):
        shutil.copyfile(journal, os.path.join(checkpoint_dir, METRICS_FILE))


def journal_from(checkpoint_dir: str, trial_dir: str) -> None:
    """A trial continuing from a checkpoint in storage: the journal it carries replaces the
    trial's when it goes further (the trial's is trimmed back to the checkpoint's epoch
    afterwards, as a local trial's is)."""
    if _last_epoch(checkpoint_dir) > _last_epoch(trial_dir):
        shutil.copyfile(os.path.join(checkpoint_dir, METRICS_FILE), os.path.join(trial_dir, METRICS_FILE))


def _last_epoch(directory: str) -> int:
    return max((int(r.get("epoch", 0)) for r in read_metrics(directory)), default=0)
