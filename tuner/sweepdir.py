"""The sweep directory: every file name in it, and every read and write of its files.

    <output>/<name>/            sweep.yaml  summary.json  (Ray Tune's experiment state)
      <trial>/                  tuner_trial.json  metrics.jsonl  checkpoint_eNNNNNN.pt
                                trial.log  traceback.txt  error.txt (Tune's)  events.out.*

Each file is written at once by the process that knows its facts: `tuner_trial.json`
(configuration and status) by the driver, `metrics.jsonl` (one line per epoch), checkpoints
and `traceback.txt` by the trial itself. Readers (results, the report, the benchmark) go
through here. Torch- and Ray-free.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Optional

from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.config import SweepConfig

CONFIG_FILE = "sweep.yaml"  # the resolved configuration the sweep ran with
SUMMARY_FILE = "summary.json"
RECORD_FILE = "tuner_trial.json"  # a trial's configuration and status (the driver's)
METRICS_FILE = "metrics.jsonl"  # a trial's epochs (the trial's)
TRACEBACK_FILE = "traceback.txt"  # the trial's own traceback when its code raised
TUNE_ERROR_FILE = "error.txt"  # Tune's, written by the driver
TRIAL_LOG = "trial.log"
CHECKPOINT_FILE = "state.pt"  # a checkpoint handed to Ray (Train, or Tune with URI storage)
CHECKPOINT_PATTERN = r"^checkpoint_e(\d{6})\.pt$"  # a trial's own, one per epoch
HPARAMS_EXPERIMENT_MARKER = ".hparams-experiment"
HPARAMS_SESSION_MARKER = ".hparams-session"


def checkpoint_name(epoch: int) -> str:
    return f"checkpoint_e{epoch:06d}.pt"


# ----------------------------------------------------------------------------- the sweep


def refuse_existing(sweep_dir: Optional[str]) -> None:
    """Never write into a sweep that is already there: results are the user's."""
    if sweep_dir and os.path.isdir(sweep_dir) and os.listdir(sweep_dir):
        raise ConfigError(
            "name",
            f"{sweep_dir} already holds a sweep; continue it with `python -m tuner resume "
            f"{sweep_dir}`, or choose another --name or --output",
        )


def check_sweep_dir(sweep_dir: str) -> str:
    """`sweep_dir` made absolute, or a ConfigError saying why it is not a sweep directory."""
    path = os.path.abspath(sweep_dir)
    if not os.path.isdir(path):
        raise ConfigError("", f"{sweep_dir}: no such directory")
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise ConfigError("", f"{sweep_dir} is not a sweep directory (it has no {CONFIG_FILE})")
    return path


def write_config(sweep_dir: str, cfg: SweepConfig) -> None:
    """Create the sweep directory with its sweep.yaml (the resolved configuration)."""
    from tuner.config import to_yaml

    os.makedirs(sweep_dir, exist_ok=True)
    with open(os.path.join(sweep_dir, CONFIG_FILE), "w") as f:
        f.write(to_yaml(cfg))


def config_path(sweep_dir: str) -> str:
    """The sweep's sweep.yaml; a ConfigError when `sweep_dir` is not a sweep directory."""
    return os.path.join(check_sweep_dir(sweep_dir), CONFIG_FILE)


# Stand-ins that pass validation when a sweep's own model/data module cannot be imported
# from here (user modules import from where the sweep started); readers never run them.
_STANDIN = {"model": "tuner.trial.models:build_model", "data": "tuner.trial.data:load_data"}


def read_config(sweep_dir: str, standins: bool = False) -> SweepConfig:
    """The sweep's resolved configuration; a ConfigError if it is not a sweep directory.

    `standins`: for readers that never train (the report), accept a task whose user module
    cannot be imported from here; the config keeps the real names.
    """
    from tuner.config import load_sweep, parse_sweep, read_yaml

    path = config_path(sweep_dir)
    try:
        return load_sweep(path)
    except ConfigError as err:
        if not standins or not err.path.startswith("task."):
            raise
    raw = read_yaml(path)
    task = dict(raw.get("task") or {})
    cfg = parse_sweep({**raw, "task": {**task, **_STANDIN}})
    real = {k: task[k] for k in _STANDIN if k in task}
    return cfg.model_copy(update={"task": cfg.task.model_copy(update=real)})


def write_summary(sweep_dir: str, summary: dict[str, Any]) -> str:
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=2, default=str)
    os.replace(path + ".tmp", path)
    return path


def read_summary(sweep_dir: str) -> Optional[dict[str, Any]]:
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def has_summary(sweep_dir: str) -> bool:
    return os.path.isfile(os.path.join(sweep_dir, SUMMARY_FILE))


# ----------------------------------------------------------------------------- trials


def json_default(o: Any) -> Any:
    """`json.dumps(default=...)`: numpy scalars (from searchers) as Python ones, else str."""
    return o.item() if hasattr(o, "item") else str(o)


def json_safe(value: Any) -> Any:
    """Plain JSON types (numpy scalars from searchers become Python ones)."""
    return json.loads(json.dumps(value, default=json_default))


def read_record(trial_dir: str) -> Optional[dict[str, Any]]:
    path = os.path.join(trial_dir, RECORD_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_record(trial_dir: str, record: dict[str, Any]) -> None:
    os.makedirs(trial_dir, exist_ok=True)
    path = os.path.join(trial_dir, RECORD_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)  # readers never see half a record


def trial_dirs(sweep_dir: str) -> list[str]:
    """Directories of the sweep's trials (those with a record), oldest first."""
    if not os.path.isdir(sweep_dir):
        return []
    found = []
    for name in os.listdir(sweep_dir):
        path = os.path.join(sweep_dir, name)
        record = read_record(path) if os.path.isdir(path) else None
        if record is not None:
            found.append((record.get("started", 0.0), name, path))
    return [path for _, _, path in sorted(found)]


def full_config(trial_dir: str) -> dict[str, Any]:
    """Everything the trial ran with (searched and fixed values, training defaults)."""
    return dict((read_record(trial_dir) or {}).get("config", {}))


def resources_of(trial_dir: str) -> dict[str, Any]:
    """What one worker of the trial had (workers, cpus_per_worker, gpus_per_worker), as the
    driver resolved it (gpus_per_worker: auto depends on the cluster)."""
    return dict((read_record(trial_dir) or {}).get("resources", {}))


def read_metrics(trial_dir: Optional[str]) -> list[dict[str, Any]]:
    """The epochs a trial recorded, oldest first (a line cut short by a kill is skipped)."""
    if not trial_dir:
        return []
    path = os.path.join(trial_dir, METRICS_FILE)
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def error_text(trial_dir: str) -> str:
    """The traceback of a trial that ended in an error: its own, else Tune's ("" if none)."""
    for name in (TRACEBACK_FILE, TUNE_ERROR_FILE):
        try:
            with open(os.path.join(trial_dir, name)) as f:
                return f.read()
        except OSError:
            continue
    return ""
