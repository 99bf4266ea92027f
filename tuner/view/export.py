"""A sweep's model out of its directory: `<sweep>/best/`, `tuner export`, `tuner.load_best`.

Each trial keeps its best epoch's weights, a plain state dict, in `<trial>/best_eNNNNNN.pt`
named by `<trial>/best.json` (tuner.trial.frame.checkpoint: BestCheckpoint), beside its newest
checkpoints. From those this writes an export directory:

    model.pt       the weights as a plain state dict (no DDP `module.` or compile `_orig_mod.`
                   prefixes): torch.load(...) and model.load_state_dict(...), no tuner needed
    checkpoint/    instead, for a script's sweep (task.command): the best epoch's checkpoint
                   directory as the script wrote it (its best.json names it), for the script
    config.json    the trial's whole resolved configuration (searched and fixed values,
                   training settings) and the sweep's task, metric and direction; for a
                   population's member (pbt, pb2) its configuration now, and `schedule`: the
                   configurations that trained the weights, epoch range by range
    metrics.json   the metrics of the epoch the weights are from
    model.ts.pt    (--format torchscript) torch.jit.load-able
    model.onnx     (--format onnx, with the `onnx` extra)

`<sweep>/best/` is the sweep's best trial's, written when a sweep ends (and by `tuner
export`); it is tuner's own directory and is replaced whole (a temporary directory renamed
into place). Writing model.pt, config.json and metrics.json is a copy (no torch: the sweep's
driver does it). A model is rebuilt (torchscript, onnx, `load_best`) from the sweep's task: a
built-in or a `task.model` function; a `task.train` sweep's model is the user's, passed in.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Optional, Union

from tuner.config import ConfigError, SweepConfig
from tuner.results import TrialRecord, ranked, records, weights_schedule
from tuner.sweepdir import (
    BEST_DIR,
    BEST_RECORD,
    EXPORT_FILES,
    SUMMARY_OLDER_DIRECTION,
    check_writable,
    full_config,
    json_default,
    read_best_checkpoint,
    read_best_record,
    read_config,
)
from tuner.sweepdir.place import Place, reading
from tuner.version import __version__

FORMATS = tuple(EXPORT_FILES)  # state_dict, torchscript, onnx
MARK = "exported_by"  # config.json's key that says a directory is one of ours
CHECKPOINT = "checkpoint"  # a script's best epoch: its checkpoint directory (best.json, best/)


@dataclass
class Chosen:
    """A trial's best epoch, ready to export: its weights and what they came from."""

    cfg: SweepConfig
    trial: TrialRecord
    best: dict[str, Any]  # best.json: epoch, metric, value, weights (the file's path)
    # A population's member (pbt, pb2): the configurations that trained these weights, range
    # by range, through the trials they came from (results.weights_schedule).
    schedule: Optional[list[dict[str, Any]]] = None

    def config(self) -> dict[str, Any]:
        return {
            MARK: f"tuner {__version__}",
            "sweep": self.cfg.name,
            "trial_id": self.trial.trial_id,
            "epoch": int(self.best["epoch"]),
            "metric": self.cfg.objective,
            "direction": self.cfg.objective_direction,
            SUMMARY_OLDER_DIRECTION: self.cfg.objective_direction,  # (its older name, as summary.json's)
            "task": self.cfg.task.model_dump(mode="json"),
            "config": full_config(self.trial.path, int(self.best["epoch"])),  # (what trained them)
            **({"schedule": self.schedule} if self.schedule is not None else {}),
            # A script's best epoch: its own checkpoint directory, copied whole beside this.
            **({CHECKPOINT: CHECKPOINT, "from": self.best[CHECKPOINT]} if CHECKPOINT in self.best else {}),
        }

    def metrics(self) -> dict[str, Any]:
        epoch = int(self.best["epoch"])
        rows = [r for r in self.trial.history if r.get("epoch") == epoch]
        row = dict(rows[-1]) if rows else {"epoch": epoch}
        row[self.cfg.objective] = float(self.best["value"])  # what the weights scored, as kept
        return row


def choose(sweep: Union[str, Place], trial_id: Optional[str] = None) -> Chosen:
    """The best trial's best epoch (or trial `trial_id`'s); a ConfigError saying why not. A
    sweep in object storage is read through a working copy, with the chosen trial's weights."""
    place = reading(sweep)
    sweep_dir = place.uri
    path = place.readable()
    cfg = read_config(path, standins=True)
    trials = records(
        path, cfg.objective, cfg.objective_direction, cfg.schedule.max_epochs, list(cfg.search.params)
    )
    if trial_id is None:
        top = ranked(trials, cfg.objective_direction)
        if not top:
            raise ConfigError("", f"{sweep_dir}: no trial has a result yet: nothing to export")
        trial = top[0]
    else:
        found = [t for t in trials if t.trial_id == trial_id or os.path.basename(t.path) == trial_id]
        if not found:
            known = ", ".join(t.trial_id for t in trials[:8]) or "none"
            raise ConfigError("--trial", f"{sweep_dir} has no trial {trial_id!r} (trials: {known})")
        trial = found[0]
    place.pull_best(os.path.basename(trial.path))
    best = read_best_record(trial.path)
    if best is None and cfg.trial_mode.best_checkpoint:
        best = read_best_checkpoint(trial.path)  # a script's: its own checkpoint directory
    if best is None:
        raise ConfigError("", f"trial {trial.trial_id} kept no weights: {_why_none(cfg)}")
    schedule = None if trial.schedule is None else weights_schedule(trials, trial, int(best["epoch"]))
    return Chosen(cfg, trial, best, schedule)


def _why_none(cfg: SweepConfig) -> str:
    return cfg.trial_mode.no_weights or (
        f"it has no {BEST_RECORD} (it ran with an older tuner, failed before its first epoch, "
        "or was stored at a URI)"
    )


def export(
    sweep: Union[str, Place],
    trial_id: Optional[str] = None,
    fmt: str = "state_dict",
    output: Optional[str] = None,
) -> str:
    """Write an export directory (see the module's doc); returns its path. Default: the sweep's
    best trial into `<sweep>/best/`; `trial_id`: that trial into `<sweep>/exports/<id>/`
    (pushed to the sweep's place when that is remote)."""
    if fmt not in FORMATS:
        raise ConfigError("--format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "onnx":
        _need_onnx()
    place = reading(sweep)
    chosen = choose(place, trial_id)
    where = output or os.path.join(
        place.local, BEST_DIR if trial_id is None else os.path.join("exports", trial_id)
    )
    _refuse_foreign(where, output is not None)
    check_writable(os.path.dirname(os.path.abspath(where)), "--output")
    built = None if fmt == "state_dict" else rebuild(chosen)
    written = _write_dir(where, chosen, fmt, built)
    if output is None:  # the sweep's own: into its place
        place.push(written)
    return written


def write_best(sweep: Union[str, Place]) -> Optional[str]:
    """`<sweep>/best/` from the sweep's best trial (when a sweep ends); None, with a warning
    saying why, when there is nothing to write."""
    from tuner.errors import warn

    try:
        return export(sweep)
    except ConfigError as err:
        warn(f"no {BEST_DIR}/ written: {err.message}")
    except OSError as err:  # the summary is written: the sweep's result stands without best/
        warn(f"no {BEST_DIR}/ written: {err} (python -m tuner export {sweep} writes it)")
    return None


def load_best(sweep_dir: str, model: Any = None, trial: Optional[str] = None) -> Any:
    """The sweep's best trial's best weights in a model (torch.nn.Module, in eval mode, on the CPU).

    Built-in and `task.model` models are rebuilt from the trial's configuration (user
    functions imported from where the sweep imported them: code.json). A `task.train`
    sweep's model is yours: pass it (`model=MyNet(...)`), built as your loop built it; its
    weights are what your loop reported under `state["model"]`. `trial`: that trial's best
    epoch instead of the sweep's best.
    """
    chosen = choose(sweep_dir, trial)
    if CHECKPOINT in chosen.best:  # a script's: in its own format, for its own code to read
        raise ConfigError(
            "", f"{chosen.cfg.trial_mode.cannot_rebuild}: load {chosen.best[CHECKPOINT]} as your script does"
        )
    if model is None:
        return rebuild(chosen)[0]
    from tuner.trial.loop.weights import load_into

    return load_into(model, chosen.best["weights"])


def rebuild(chosen: Chosen) -> tuple[Any, Any]:
    """(the trial's model built afresh from its configuration with its best weights, in eval
    mode; one input for it, for tracing)."""
    task, mode = chosen.cfg.task, chosen.cfg.trial_mode
    if mode.cannot_rebuild is not None:
        raise ConfigError(f"task.{mode.chosen_by[0]}", mode.cannot_rebuild)
    from tuner.trial.loop.weights import rebuild as build

    hp = full_config(chosen.trial.path, int(chosen.best["epoch"]))
    weights, dirs = chosen.best["weights"], chosen.cfg.code_dirs
    try:
        return build(task.model or "", task.data or "", dict(task.data_args), hp, weights, dirs)
    except Exception as err:  # noqa: BLE001 - a damaged file, weights of another shape, the user's code
        raise ConfigError(
            "--format",
            f"trial {chosen.trial.trial_id}'s model cannot be rebuilt with its best weights "
            f"{weights} ({_why_not(err)}); --format state_dict copies the file as it is",
        ) from None


def _why_not(err: Exception) -> str:
    """Why weights did not load, in a few words: torch's messages run over many lines."""
    if isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in str(err):
        return "the file is damaged, or not a state dict"
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    said = " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines or [""])[0]
    return f"{type(err).__name__}: {said[:240]}"


def _need_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--format", "onnx needs the onnx extra: pip install 'tuner[onnx]' (onnx and onnxscript)"
        ) from None


def _refuse_foreign(where: str, given: bool) -> None:
    """Never replace what the user had: a directory given as --output is replaced only when
    it is empty or an earlier export (its config.json says so)."""
    if not os.path.exists(where) or not given:
        return
    mine = os.path.join(where, "config.json")
    try:
        with open(mine) as f:
            ours = MARK in json.load(f)
    except (OSError, ValueError):
        ours = False
    if os.path.isdir(where) and (ours or not os.listdir(where)):
        return
    raise ConfigError("--output", f"{where} exists and is not an export of tuner: name another path")


def _write_dir(where: str, chosen: Chosen, fmt: str, built: Optional[tuple[Any, Any]]) -> str:
    """The export directory, written beside its place and renamed into it."""
    parent = os.path.dirname(os.path.abspath(where))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(where)}-", suffix=".tmp")
    try:
        if CHECKPOINT in chosen.best:  # (hard links where the filesystem allows: no second copy)
            shutil.copytree(chosen.best[CHECKPOINT], os.path.join(tmp, CHECKPOINT), copy_function=_link)
        else:
            shutil.copyfile(chosen.best["weights"], os.path.join(tmp, EXPORT_FILES["state_dict"]))
        if built is not None:
            from tuner.trial.loop.weights import save_format

            save_format(tmp, fmt, built)
        for name, doc in (("config.json", chosen.config()), ("metrics.json", chosen.metrics())):
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(doc, f, indent=2, default=json_default)
        _replace(tmp, where)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return where


def _link(src: str, dst: str) -> None:
    """A hard link of `src` (the checkpoint's files are never written again), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _replace(tmp: str, where: str) -> None:
    old = None
    if os.path.exists(where):
        old = f"{where}.old.tmp"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(where, old)
    os.replace(tmp, where)
    if old is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(old)
