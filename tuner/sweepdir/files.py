"""The sweep directory's files: every file name in it, and every read and write of them.

    <output>/<name>/            sweep.yaml  code.json  summary.json  best/  (Ray Tune's experiment state)
                                .tuner.lock  warm_start.json  .mlflow_run  .wandb_sweep
                                wandb/ (W&B's files: tracking.wandb)
                                autotune.json (training.autotune)  environment.json
      sweep/                    events.out.*: TensorBoard's run of the sweep as a whole
      <trial>/                  tuner_trial.json  metrics.jsonl  checkpoint_eNNNNNN.pt
                                best.json  best_eNNNNNN.pt
                                lineage.json (pbt, pb2: its configuration per epoch range)
                                stopper.jsonl (median, curve: the scheduler's judgement per epoch)
                                trial.log  traceback.txt  error.txt (Tune's)  events.out.*

Each file is written at once by the process that knows its facts: `tuner_trial.json`
(configuration and status) by the driver, `metrics.jsonl` (one line per epoch), checkpoints
and `traceback.txt` by the trial itself. Readers (results, the report, the benchmark) go
through here. Torch- and Ray-free.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import tempfile
from typing import TYPE_CHECKING, Any, Optional

from tuner.errors import FULL_WORDS, ConfigError, hushed, warn

if TYPE_CHECKING:
    from tuner.config import SweepConfig

CONFIG_FILE = "sweep.yaml"  # the resolved configuration the sweep ran with
CODE_FILE = "code.json"  # where the sweep imports its own modules from (resume does too)
SUMMARY_FILE = "summary.json"
# summary.json's key for max/min before `direction` (sweeps written by an earlier tuner).
SUMMARY_OLDER_DIRECTION = "mode"
AUTOTUNE_FILE = "autotune.json"  # training.autotune: the choice, its arms, what it cost (the driver's)
ENVIRONMENT_FILE = "environment.json"  # what each run of the sweep ran on (tuner.environment)
RECORD_FILE = "tuner_trial.json"  # a trial's configuration and status (the driver's)
# A population's member (schedule.scheduler: pbt, pb2): its configuration per epoch range and
# the trial whose weights each range started from (the driver's: tuner.search.pbt).
LINEAGE_FILE = "lineage.json"
# A trial judged by a scheduler that reads whole curves (schedule.scheduler: median, curve):
# one line per epoch it was judged at, {"epoch", "stop", and the scheduler's numbers: the
# curve stopper's pred_final, p_beat, incumbent; the median rule's median, best} (the driver's:
# tuner.driver.verdicts). A resumed trial judged again at an epoch adds a line; the last counts.
STOPPER_FILE = "stopper.jsonl"
# A record's key: Tune failed the trial before it started (its reused actor could not be reset),
# so it ended in error without running any code of yours, and `resume` runs it.
NEVER_STARTED = "never_started"
METRICS_FILE = "metrics.jsonl"  # a trial's epochs (the trial's)
TRACEBACK_FILE = "traceback.txt"  # the trial's own traceback when its code raised
TUNE_ERROR_FILE = "error.txt"  # Tune's, written by the driver
TRIAL_LOG = "trial.log"
CHECKPOINT_FILE = "state.pt"  # a checkpoint handed to Ray (Train, or Tune with URI storage)
CHECKPOINT_PATTERN = r"^checkpoint_e(\d{6})\.pt$"  # a trial's own, one per epoch
# A trial's best epoch: {epoch, metric, value, weights: best_eNNNNNN.pt}; a script's names its
# checkpoint directory instead: {epoch, metric, value, checkpoint: checkpoints/epoch_NNNNNN}.
BEST_RECORD = "best.json"
BEST_WEIGHTS_PATTERN = r"^best_e(\d{6})\.pt$"  # its weights, a plain state dict (the trial's)
BEST_DIR = "best"  # the sweep's best trial's, exported (also `tuner export`'s files):
EXPORT_FILES = {"state_dict": "model.pt", "torchscript": "model.ts.pt", "onnx": "model.onnx"}
TUNE_PARAMS_FILE = "params.json"  # the trial's configuration, written by Tune as it starts
# task.command: the script's checkpoints (one directory per epoch), the reports tuner.report
# writes for the trial (a file per run of the script: reports-<attempt>.jsonl), the trial's
# parameters as JSON ($TUNER_CONFIG_JSON), who runs the script now (the supervisor's record).
SCRIPT_CHECKPOINTS = "checkpoints"
SCRIPT_CHECKPOINT_PATTERN = r"^epoch_(\d{6})$"
SCRIPT_REPORTS = "reports.jsonl"  # (before runs had files of their own)
SCRIPT_REPORTS_PATTERN = r"^reports(-[0-9a-f]+)?\.jsonl$"
SCRIPT_CONFIG = "config.json"
SCRIPT_RUN = "script_run.json"
# A trial trained by Lightning or Hugging Face's Trainer with tuner's callback: the framework's
# own outputs (its logs and checkpoints), kept in the trial's directory (tuner.integrations).
FRAMEWORK_DIR = "framework"
WARM_FILE = "warm_start.json"  # the sweeps it started from, resolved once (search.warm_start)
MLFLOW_RUN_FILE = ".mlflow_run"  # the id of the sweep's MLflow parent run (tracking.mlflow)
WANDB_RUN_FILE = ".wandb_sweep"  # the prefix of the sweep's W&B run ids (tracking.wandb)
WANDB_OPEN_FILE = ".wandb_open"  # the trials whose W&B runs the driver opened and has not ended
WANDB_ENDED_FILE = ".wandb_ended"  # the trials whose W&B runs a driver ended
WANDB_DIR = "wandb"  # W&B's own files of the sweep's runs (tracking.wandb; W&B names it)
LOCK_FILE = ".tuner.lock"  # who holds the sweep directory now (sweepdir.claim)
HPARAMS_EXPERIMENT_MARKER = ".hparams-experiment"
HPARAMS_SESSION_MARKER = ".hparams-session"
SWEEP_RUN = "sweep"  # TensorBoard's run of the sweep as a whole (the driver's; tuner.history)
RETRIED_DIR = "retried"  # failed trials run again by `resume --retry-failed`: their first runs, kept
# A result key: what the trial worked around (a damaged checkpoint), for the driver to say.
NOTICE = "notice"
# A journal key, on the last row of a trial whose own code ended its training before
# max_epochs (its own early stopping: a script exiting 0, task.train returning), not a scheduler.
STOPPED_ITSELF = "stopped_itself"


def checkpoint_name(epoch: int) -> str:
    return f"checkpoint_e{epoch:06d}.pt"


def best_weights_name(epoch: int) -> str:
    return f"best_e{epoch:06d}.pt"


def read_best_record(trial_dir: str) -> Optional[dict[str, Any]]:
    """The trial's best epoch as its best.json says ({epoch, metric, value, weights}, weights
    the file's path), or None: no best.json, a damaged one, or its weights file gone."""
    record, _ = _read_object(os.path.join(trial_dir, BEST_RECORD))
    if record is None or not finite(record.get("value")) or not isinstance(record.get("weights"), str):
        return None
    weights = os.path.join(trial_dir, os.path.basename(record["weights"]))
    return {**record, "weights": weights} if os.path.isfile(weights) else None


def read_best_checkpoint(trial_dir: str) -> Optional[dict[str, Any]]:
    """A script trial's best epoch as its best.json says ({epoch, metric, value, checkpoint},
    checkpoint the directory's path: the script's own checkpoint of that epoch), or None: no
    best.json, one of weights (tuner's loop), a damaged one, or its directory gone."""
    record, _ = _read_object(os.path.join(trial_dir, BEST_RECORD))
    if record is None or not finite(record.get("value")) or not isinstance(record.get("checkpoint"), str):
        return None
    name = os.path.basename(record["checkpoint"])
    if not re.match(SCRIPT_CHECKPOINT_PATTERN, name):
        return None
    path = os.path.join(trial_dir, SCRIPT_CHECKPOINTS, name)
    return {**record, "checkpoint": path} if os.path.isdir(path) else None


def script_checkpoint_name(epoch: int) -> str:
    return f"epoch_{epoch:06d}"


def script_reports_name(attempt: str) -> str:
    """The report file of one run (attempt) of a trial's script."""
    return f"reports-{attempt}.jsonl"


def finite(v: Any) -> bool:
    """A real, finite number (not a bool, NaN or inf, nor an integer past a float's range)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # 10**400: no float can hold it
        return False


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` at once: readers never see half a file, and a failed write
    (a full disk) leaves neither half a file nor its temporary behind."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def remove_temporaries(sweep_dir: str) -> None:
    """Temporary files of writes a full disk cut short (ours end in .tmp)."""
    for pattern in ("*.tmp", ".*.tmp"):  # glob leaves hidden names out of "*"
        for path in glob.glob(os.path.join(glob.escape(sweep_dir), "**", pattern), recursive=True):
            with contextlib.suppress(OSError):
                os.remove(path)


def check_writable(directory: str, flag: str) -> None:
    """Make `directory` if need be; a ConfigError naming `flag` when it cannot be written (a
    sweep directory on a read-only mount, someone else's): said before any work, not as a
    traceback from the first file written."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".tuner-", suffix=".tmp"):
            pass
    except OSError as err:
        why = err.strerror or str(err)
        raise ConfigError(flag, f"cannot write into {directory} ({why}): give {flag} DIR, writable") from None


def remove_empty_dirs(sweep_dir: str) -> None:
    """Empty directories in the sweep directory: Tune names (and makes) one for each trial it
    queues for an actor, also when the trial is then removed unstarted (a spent time budget,
    a sweep stopped by failure.fail_fast). Empty, they hold nothing of anyone's."""
    if not os.path.isdir(sweep_dir):
        return
    for name in os.listdir(sweep_dir):
        path = os.path.join(sweep_dir, name)
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            with contextlib.suppress(OSError):  # (filled meanwhile)
                os.rmdir(path)


# ----------------------------------------------------------------------------- the sweep


def check_sweep_dir(sweep_dir: str) -> str:
    """`sweep_dir` made absolute, or a ConfigError saying why it is not a sweep directory."""
    path = os.path.abspath(sweep_dir)
    if not os.path.isdir(path):
        raise ConfigError("", f"{sweep_dir}: no such directory")
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise ConfigError("", f"{sweep_dir} is not a sweep directory (it has no {CONFIG_FILE})")
    return path


def empty_config_message(path: str) -> Optional[str]:
    """What to do about a sweep directory whose sweep.yaml is empty (None if it is not)."""
    config = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config) or os.path.getsize(config) > 0:
        return None
    if not trial_dirs(path):
        return (
            f"{config} is empty and no trial ran (a run of an older tuner stopped while writing "
            "it): delete the directory and start the sweep again"
        )
    return (
        f"{config} is empty (written by an older tuner, not atomically): write it again from the "
        "sweep file and flags the sweep was started with (`python -m tuner validate` checks "
        "them), then resume"
    )


def config_path(sweep_dir: str) -> str:
    """The sweep's sweep.yaml; a ConfigError when `sweep_dir` is not a sweep directory."""
    return os.path.join(check_sweep_dir(sweep_dir), CONFIG_FILE)


# Stand-ins that pass validation when a sweep's own task functions cannot be imported from
# here (user modules import from where the sweep started); readers never run them.
_STANDIN = {k: f"tuner.sweepdir.standins:{k}" for k in ("model", "data", "loss", "metrics", "train")}


def read_config(sweep_dir: str, standins: bool = False) -> SweepConfig:
    """The sweep's resolved configuration; a ConfigError if it is not a sweep directory.

    `standins`: for readers that never train (the report), accept a task whose user module
    cannot be imported from here; the config keeps the real names. Readers do not repeat the
    warnings its validation gives (the sweep gave them when it ran).
    """
    if not standins:
        return _read_config(sweep_dir, False)
    with hushed():
        return _read_config(sweep_dir, True)


def _read_config(sweep_dir: str, standins: bool) -> SweepConfig:
    from tuner.config import load_sweep, parse_sweep, read_yaml
    from tuner.config.functions import code_dirs

    path = config_path(sweep_dir)
    empty = empty_config_message(os.path.dirname(path))
    if empty:
        raise ConfigError("", empty)
    try:
        return load_sweep(path, imports=recorded_code_dirs(sweep_dir))
    except ConfigError as err:
        if not standins or not err.path.startswith("task."):
            raise
    raw = read_yaml(path)
    task = dict(raw.get("task") or {})
    real = {k: task[k] for k in _STANDIN if task.get(k) is not None}
    cfg = parse_sweep({**raw, "task": {**task, **{k: _STANDIN[k] for k in real}}})
    cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update=real)})
    cfg.code_dirs = code_dirs(path, *recorded_code_dirs(sweep_dir))
    return cfg


def recorded_code_dirs(sweep_dir: str) -> list[str]:
    """The directories the sweep's first run imported its modules from (none if unrecorded)."""
    try:
        with open(os.path.join(sweep_dir, CODE_FILE)) as f:
            dirs = json.load(f).get("import_from", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [d for d in dirs if isinstance(d, str)]


def write_summary(sweep_dir: str, summary: dict[str, Any]) -> str:
    """summary.json as strict JSON, which every parser reads (a failed trial's -inf and NaN
    metrics are written as the strings "-Infinity" and "NaN": Python's bare tokens are no JSON)."""
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    write_atomic(path, json.dumps(strict(summary), indent=2, default=str, allow_nan=False))
    return path


def strict(value: Any) -> Any:
    """`value` with every NaN or infinite float as a string ("NaN", "Infinity", "-Infinity"),
    which readers take as they took the numbers: not finite."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def read_summary(sweep_dir: str) -> Optional[dict[str, Any]]:
    """summary.json as written; one written before `direction` (its `mode`) reads as now."""
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    if isinstance(summary, dict) and "direction" not in summary and SUMMARY_OLDER_DIRECTION in summary:
        summary["direction"] = summary.pop(SUMMARY_OLDER_DIRECTION)
    return summary


def write_autotune(sweep_dir: str, table: dict[str, Any]) -> str:
    """autotune.json: what `training.autotune` measured and chose (strict JSON, as summary.json)."""
    path = os.path.join(sweep_dir, AUTOTUNE_FILE)
    write_atomic(path, json.dumps(strict(table), indent=1, default=str, allow_nan=False))
    return path


def read_autotune(sweep_dir: str) -> Optional[dict[str, Any]]:
    """The sweep's autotune.json, or None (autotune off, or not written yet)."""
    try:
        with open(os.path.join(sweep_dir, AUTOTUNE_FILE)) as f:
            value = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ConfigError(AUTOTUNE_FILE, f"unreadable in {sweep_dir}: {type(err).__name__}") from None
    return value if isinstance(value, dict) else None


def add_environment(sweep_dir: str, environment: dict[str, Any]) -> str:
    """environment.json: `environment` added as this run's to those of the earlier runs of the
    sweep (`resume` and `extend` may run on another machine, or after an upgrade)."""
    path = os.path.join(sweep_dir, ENVIRONMENT_FILE)
    runs = read_environments(sweep_dir)
    write_atomic(path, json.dumps({"runs": [*runs, environment]}, indent=1, default=str))
    return path


def read_environments(sweep_dir: str) -> list[dict[str, Any]]:
    """Each run's environment, oldest first ([] before the first, or from a damaged file)."""
    value, _ = _read_object(os.path.join(sweep_dir, ENVIRONMENT_FILE))
    runs = value.get("runs") if isinstance(value, dict) else None
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


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
    """The trial's record, or None when it is missing, unreadable or not a record."""
    return _read_object(os.path.join(trial_dir, RECORD_FILE))[0]


def _read_object(path: str) -> tuple[Optional[dict[str, Any]], str]:
    """(the JSON object in `path`, "") or (None, why not)."""
    try:
        with open(path) as f:
            value = json.load(f)
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as err:
        return None, f"unreadable: {type(err).__name__}"
    if not isinstance(value, dict) or not isinstance(value.get("config", {}), dict):
        return None, f"not a record (a JSON {type(value).__name__})"
    return value, ""


def write_record(trial_dir: str, record: dict[str, Any]) -> str:
    """Write the trial's record; its path."""
    os.makedirs(trial_dir, exist_ok=True)
    path = os.path.join(trial_dir, RECORD_FILE)
    write_atomic(path, json.dumps(record))
    return path


def recovered_record(trial_dir: str) -> Optional[dict[str, Any]]:
    """The trial's record; when that is damaged or missing, one rebuilt from the params.json
    Tune wrote when the trial started (said in one line: its status is then unknown, so it
    counts as unfinished and `resume` continues it from its newest checkpoint). None for a
    directory that is no trial's."""
    record, why = _read_object(os.path.join(trial_dir, RECORD_FILE))
    if record is not None:
        return record
    params_path = os.path.join(trial_dir, TUNE_PARAMS_FILE)
    params, params_why = _read_object(params_path)
    if params is None:
        if why != "missing" or params_why != "missing":
            warn(
                f"{trial_dir}: {RECORD_FILE} is {why} and {TUNE_PARAMS_FILE} is {params_why}: "
                "this trial is left out"
            )
        return None
    warn(
        f"{os.path.join(trial_dir, RECORD_FILE)} is {why}: trial read from its {TUNE_PARAMS_FILE} "
        "(status unknown: counted unfinished, `resume` continues it from its newest checkpoint)"
    )
    return {
        "trial_id": os.path.basename(trial_dir),
        "config": json_safe(params),
        "status": "RUNNING",
        "started": os.path.getmtime(params_path),
    }


def trial_dirs(sweep_dir: str) -> list[str]:
    """Directories of the sweep's trials, oldest first."""
    if not os.path.isdir(sweep_dir):
        return []
    found = []
    for name in os.listdir(sweep_dir):
        path = os.path.join(sweep_dir, name)
        record = recovered_record(path) if os.path.isdir(path) else None
        if record is not None:
            started = record.get("started")
            found.append((started if finite(started) else 0.0, name, path))
    return [path for _, _, path in sorted(found)]


def set_aside(sweep_dir: str, trial_id: str) -> str:
    """Move a trial's directory to `retried/<trial_id>` (`-2`, `-3`, ... if taken), out of the
    sweep's trials but kept: its trial is run again from scratch under its own name. The
    path it now has, relative to the sweep."""
    n, rel = 1, os.path.join(RETRIED_DIR, trial_id)
    while os.path.exists(os.path.join(sweep_dir, rel)):
        n += 1
        rel = os.path.join(RETRIED_DIR, f"{trial_id}-{n}")
    os.makedirs(os.path.join(sweep_dir, RETRIED_DIR), exist_ok=True)
    os.replace(os.path.join(sweep_dir, trial_id), os.path.join(sweep_dir, rel))
    return rel


def full_config(trial_dir: str, epoch: Optional[int] = None) -> dict[str, Any]:
    """Everything the trial ran with (searched and fixed values, training defaults); for a
    member of a population (pbt, pb2) the configuration that trained its epoch `epoch`
    (default: the one it runs with now, which its newest weights were trained with)."""
    lineage = read_lineage(trial_dir)
    if lineage is not None:
        return dict(segment_config(lineage["segments"], epoch))
    return dict((recovered_record(trial_dir) or {}).get("config") or {})


def segment_config(segments: list[dict[str, Any]], epoch: Optional[int] = None) -> dict[str, Any]:
    """The configuration of a lineage's `segments` (oldest first, each starting after its
    "epoch") that trained epoch `epoch`; None: the newest. A member's best weights may come
    from before it continued from a donor, whose configuration (a model of another size)
    it has since."""
    chosen = segments[0]["config"]
    for seg in segments:
        if epoch is None or int(seg["epoch"]) < epoch:
            chosen = seg["config"]
    return chosen


def read_lineage(trial_dir: str) -> Optional[dict[str, Any]]:
    """A population member's lineage.json: {"member": its index in the population, "segments":
    [{"epoch": the epoch the range starts after, "config": the whole configuration, "donor":
    the trial whose checkpoint of that epoch it continued from (None: its own), ...}, ...]},
    oldest first; None for a trial that has none (or a damaged one)."""
    value, _ = _read_object(os.path.join(trial_dir, LINEAGE_FILE))
    segments = value.get("segments") if value is not None else None
    if not isinstance(segments, list) or not segments:
        return None
    if not all(isinstance(s, dict) and isinstance(s.get("config"), dict) for s in segments):
        return None
    return value


def write_lineage(trial_dir: str, lineage: dict[str, Any]) -> str:
    """Write a member's lineage.json (atomically); its path."""
    os.makedirs(trial_dir, exist_ok=True)
    path = os.path.join(trial_dir, LINEAGE_FILE)
    write_atomic(path, json.dumps(json_safe(lineage), indent=1))
    return path


def append_verdict(trial_dir: str, verdict: dict[str, Any]) -> str:
    """Add one judgement to the trial's stopper.jsonl; its path."""
    os.makedirs(trial_dir, exist_ok=True)
    path = os.path.join(trial_dir, STOPPER_FILE)
    with open(path, "a") as f:
        f.write(json.dumps(json_safe(verdict)) + "\n")
    return path


def read_verdicts(trial_dir: Optional[str]) -> list[dict[str, Any]]:
    """The scheduler's judgements of a trial, by epoch, the last line of each epoch (a line cut
    short by a kill is skipped); [] for a trial no such scheduler judged."""
    if not trial_dir:
        return []
    by_epoch: dict[int, dict[str, Any]] = {}
    for row in _json_lines(os.path.join(trial_dir, STOPPER_FILE)):
        if isinstance(row, dict) and finite(row.get("epoch")):
            by_epoch[int(row["epoch"])] = row
    return [by_epoch[e] for e in sorted(by_epoch)]


def _json_lines(path: str) -> list[Any]:
    """The JSON value of each line of a file, a line cut short by a kill skipped; [] when there
    is no such file."""
    if not os.path.isfile(path):
        return []
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def resources_of(trial_dir: str) -> dict[str, Any]:
    """What one worker of the trial had (workers, cpus_per_worker, gpus_per_worker), as the
    driver resolved it (gpus_per_worker: auto depends on the cluster)."""
    found = (read_record(trial_dir) or {}).get("resources")
    return dict(found) if isinstance(found, dict) else {}


def read_metrics(trial_dir: Optional[str]) -> list[dict[str, Any]]:
    """The epochs a trial recorded, oldest first (a line cut short by a kill is skipped)."""
    if not trial_dir:
        return []
    return [row for row in _json_lines(os.path.join(trial_dir, METRICS_FILE)) if _is_row(row)]


def recorded_failure(trial_dir: Optional[str]) -> Optional[dict[str, Any]]:
    """The journal's last row where it records how the trial ended itself (a timeout: its
    watchdog ended the process, so Ray sees an error); None otherwise."""
    rows = read_metrics(trial_dir)
    return rows[-1] if rows and rows[-1].get("failure") else None


def _is_row(row: Any) -> bool:
    """An epoch's record as the loop writes it: an object with an integer epoch (valid JSON of
    another shape, written by hand or by another tool, is skipped like a cut-short line)."""
    epoch = row.get("epoch") if isinstance(row, dict) else None
    return isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0


def error_file(trial_dir: str) -> str:
    """The file with the trial's full traceback: ours (the trial's), else Tune's."""
    ours = os.path.join(trial_dir, TRACEBACK_FILE)
    return ours if os.path.isfile(ours) else os.path.join(trial_dir, TUNE_ERROR_FILE)


def error_line(trial_dir: str) -> str:
    """The last line of the trial's error (its exception), at most 200 characters."""
    lines = [ln.strip() for ln in error_text(trial_dir).splitlines() if ln.strip()]
    exc = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit|OOM)\b", ln)]
    return (exc or lines or ["unknown error (see the trial's error.txt)"])[-1][:200]


def trial_disk_full(trial_dir: str) -> bool:
    """Whether the trial's saved error says the disk was full."""
    return any(w in error_line(trial_dir) for w in FULL_WORDS)


def error_text(trial_dir: str) -> str:
    """The traceback of a trial that ended in an error: its own, else Tune's ("" if none)."""
    for name in (TRACEBACK_FILE, TUNE_ERROR_FILE):
        try:
            with open(os.path.join(trial_dir, name)) as f:
                return f.read()
        except OSError:
            continue
    return ""
