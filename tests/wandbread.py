"""Reading W&B's offline run files back (`<dir>/wandb/offline-run-*/run-<id>.wandb`): what
`wandb sync` would upload, parsed with W&B's own protobuf messages.

The file is W&B's record log: a 7-byte header (`:W&B`, a magic number, a version), then
records in 32 KiB blocks, each chunk behind a 7-byte header (CRC, length, type: full, first,
middle or last piece of a record), LevelDB's log format.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    run_id: str = ""
    project: str = ""
    group: str = ""
    name: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is no W&B run file"
    out, pos, buf = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        buf = chunk if kind in (FULL, FIRST) else buf + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(path: Path) -> OfflineRun:
    run = OfflineRun()
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.project, run.group = r.run.run_id, r.run.project, r.run.run_group
            run.name, run.job_type, run.tags = r.run.display_name, r.run.job_type, list(r.run.tags)
            run.config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            run.config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            run.summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "exit":
            run.exit_code = r.exit.exit_code
    run.config.pop("_wandb", None)
    return run


def offline_runs(wandb_dir: Path) -> dict[str, list[OfflineRun]]:
    """Every offline run under `wandb_dir` (W&B's `wandb/` directory) by run id, oldest first
    (a run continued later has a directory of each part)."""
    found: dict[str, list[OfflineRun]] = {}
    for path in sorted(wandb_dir.glob("offline-run-*/run-*.wandb")):
        run = read_run(path)
        found.setdefault(run.run_id, []).append(run)
    return found
