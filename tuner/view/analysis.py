"""A sweep directory read back for the report: trials, histories, and what they add up to.

The numbers come from tuner.results (each trial's record and metrics journal), not from
summary.json, so a running or interrupted sweep reads as well as a finished one.
`tuner.view.report` turns them into a document.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from tuner.config import ConfigError, SweepConfig
from tuner.config.placeholders import as_text, env_name, fill
from tuner.results import FINISHED, TrialRecord, best, finite, ranked, records
from tuner.space.conditions import conditions
from tuner.space.params import Fixed, ParamT, to_optuna
from tuner.sweepdir import (
    CONFIG_FILE,
    full_config,
    has_summary,
    read_config,
    resources_of,
)
from tuner.sweepdir.place import reading
from tuner.trial.script import command

MIN_IMPORTANCE_TRIALS = 5  # fANOVA on fewer trials says more about noise than about parameters


@dataclass
class SweepData:
    """A sweep read back: its config, a record and the reported history of every trial."""

    sweep_dir: str
    cfg: SweepConfig
    records: list[TrialRecord]
    state: str  # completed | interrupted | running or interrupted
    gpus_per_worker: Optional[float]  # None: 'auto' resolved on a cluster we cannot see

    @property
    def metric(self) -> str:
        return self.cfg.objective

    @property
    def direction(self) -> str:
        return self.cfg.objective_direction

    def searched(self) -> dict[str, ParamT]:
        """The parameters that vary between trials (fixed ones left out)."""
        return {k: p for k, p in self.cfg.search.params.items() if not isinstance(p, Fixed)}


def load(sweep_dir: str) -> SweepData:
    """Read a sweep directory (finished, running or interrupted); a sweep in object storage
    through a reader's working copy (where a report of it is then written)."""
    sweep_dir = reading(sweep_dir).readable()
    cfg = read_config(sweep_dir, standins=True)
    # In the order the trials started, the order summary.json keeps: ties break alike.
    trials = records(
        sweep_dir, cfg.objective, cfg.objective_direction, cfg.schedule.max_epochs, list(cfg.search.params)
    )
    if not trials:
        raise ConfigError("", f"{sweep_dir}: no trial recorded yet; try again in a moment")
    return SweepData(
        sweep_dir=sweep_dir,
        cfg=cfg,
        records=trials,
        state=_state(sweep_dir, trials, cfg.expected_trials()),
        gpus_per_worker=_gpus_per_worker(cfg, trials),
    )


def _state(sweep_dir: str, trials: list[TrialRecord], expected: int) -> str:
    # Judged from the trials themselves, which summary.json may not have seen yet.
    if len(trials) >= expected and all(r.status in FINISHED for r in trials):
        return "completed"
    if has_summary(sweep_dir):
        return "interrupted"  # the driver wrote its summary and left trials unfinished
    return "running or interrupted"


def _gpus_per_worker(cfg: SweepConfig, trials: list[TrialRecord]) -> Optional[float]:
    gpus = cfg.resources.gpus_per_worker
    if gpus != "auto":
        return float(gpus)
    for t in trials:  # what 'auto' resolved to on the cluster, as each trial's record keeps it
        resolved = resources_of(t.path).get("gpus_per_worker")
        if resolved is not None:
            return float(resolved)
    return None


# ----------------------------------------------------------------------------- analysis


def failure_detail(r: TrialRecord) -> str:
    """Why a failed trial failed, in one line."""
    if r.failure and r.failure.startswith("error:"):
        return r.failure[len("error:") :].strip()
    last = r.history[-1] if r.history else r.last_metrics
    return str(last.get("failure_detail") or "")


@dataclass
class Compute:
    """CPU/GPU-seconds of every trial: its training time x workers x CPUs (GPUs) per worker."""

    per_trial: list[tuple[TrialRecord, float, Optional[float]]]
    cpu_s: float
    gpu_s: Optional[float]
    lost_cpu_s: float  # on trials stopped early or failed


def compute(data: SweepData) -> Compute:
    res = data.cfg.resources
    rows = []
    for r in data.records:
        worker_s = r.time_s * res.workers_per_trial
        gpus = None if data.gpus_per_worker is None else worker_s * data.gpus_per_worker
        rows.append((r, worker_s * res.cpus_per_worker, gpus))
    lost = sum(c for r, c, _ in rows if r.failure or r.stopped_early)
    gpu_total = None if data.gpus_per_worker is None else sum(g or 0.0 for _, _, g in rows)
    return Compute(rows, sum(c for _, c, _ in rows), gpu_total, lost)


def importance(data: SweepData) -> tuple[Optional[dict[str, float]], str]:
    """fANOVA importance of each searched parameter for the trials' best metric, or why not."""
    params = data.searched()
    always = [k for k, p in params.items() if not conditions(p)]  # in every trial's configuration
    ok = [r for r in ranked(data.records, data.direction) if all(k in r.config for k in always)]
    if not params:
        return None, "nothing was searched"
    if len(ok) < MIN_IMPORTANCE_TRIALS:
        return None, f"needs at least {MIN_IMPORTANCE_TRIALS} trials with a result (has {len(ok)})"
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if data.direction == "max" else "minimize")
    try:
        for r in ok:
            # A conditional parameter is absent where its condition fails; optuna then rates
            # only the parameters every trial has.
            values = {k: r.config[k] for k in params if k in r.config}
            dists = {k: to_optuna(params[k]) for k in values}
            study.add_trial(optuna.trial.create_trial(params=values, distributions=dists, value=r.best_value))
        scores = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0))
    except (ValueError, RuntimeError) as err:  # e.g. a value outside its declared domain
        return None, f"fANOVA failed: {err}"
    method = (
        f"fANOVA (optuna.importance.FanovaImportanceEvaluator, 64 trees, seed 0) over the best "
        f"{data.metric} of {len(ok)} trials; trials that failed or stopped early count with what "
        "they reached. Shares of the explained variance, summing to 1; with few "
        "trials, a rough guide."
    )
    if len(always) < len(params):
        method += " Conditional parameters (when:) are rated only if every trial has them."
    return {k: float(v) for k, v in scores.items()}, method


def best_so_far(data: SweepData) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(every result, the running best) as (seconds since the sweep's first epoch began, metric)."""
    rows = [r for t in data.records for r in t.history if finite(r.get("wall_time"))]
    if not rows:
        return [], []
    t0 = min(float(r["wall_time"]) - float(r.get("epoch_time_s") or 0.0) for r in rows)
    points = sorted(
        (float(r["wall_time"]) - t0, float(r[data.metric]))
        for r in rows
        if "failure" not in r and finite(r.get(data.metric))
    )
    running: list[tuple[float, float]] = []
    for t, v in points:
        if not running or (v > running[-1][1] if data.direction == "max" else v < running[-1][1]):
            running.append((t, v))
    return points, running


def reproduce_command(data: SweepData) -> Optional[str]:
    """The command that trains the best trial's configuration again, alone: for a sweep of
    a script (task.command), the script's own command line."""
    top = best(data.records, data.direction)
    if top is None:
        return None
    if data.cfg.trial_mode.command_line:  # the user's own command line, as the trial ran it
        return _script_command(data, top)
    args = ["python", "-m", "tuner", "sweep", os.path.join(data.sweep_dir, CONFIG_FILE)]
    args += ["--name", f"{data.cfg.name}-{top.trial_id}", "--algorithm", "grid"]
    args += ["--set", "schedule.early_stopping=false"]
    absent = any(k not in top.config for k in data.cfg.search.params)
    if absent or any("." in k or "=" in k for k in top.config):
        # `--set search.params.a.b=1` would mean params a -> b, and `x=y=1` the name x; a
        # conditional parameter the trial did not have must go, not stay searched: the
        # whole mapping at once instead (it holds every parameter the trial had).
        args += ["--set", f"search.params={yaml_value(top.config)}"]
    else:
        for k, v in top.config.items():
            args += ["--set", f"search.params.{k}={yaml_value(v)}"]
    if data.cfg.search.constraints:  # the configuration keeps them; one may name an absent parameter
        args += ["--set", "search.constraints=[]"]
    return shlex.join(args)


def _script_command(data: SweepData, top: TrialRecord) -> str:
    """The script's command line as the trial ran it, its placeholders filled (its own
    directory: a new one beside the sweep's), after the environment that changes its results:
    its threads and devices (tuner.trial.script.command) and the env_params."""
    task, res = data.cfg.task, data.cfg.resources
    assert task.command, "a script's command line without a command"
    params = {k: v for k, v in full_config(top.path).items() if k in data.cfg.search.params}
    again = os.path.join(os.path.dirname(data.sweep_dir), f"{data.cfg.name}-{top.trial_id}")
    values = {"max_epochs": data.cfg.schedule.max_epochs, "trial_dir": again, "trial_id": top.trial_id}
    argv = fill(task.command, {**values, **params})
    argv = command.under_launcher(argv, task.launcher, res.workers_per_trial, ["torchrun"])
    devices = command.devices_for(res.workers_per_trial, data.gpus_per_worker or 0.0)
    env = command.result_env(res.cpus_per_worker, devices)
    from_env = list(params) if task.env_params is True else [k for k in task.env_params or [] if k in params]
    env.update({env_name(k): as_text(params[k]) for k in from_env})
    return command.rerun_line(env, argv)


def yaml_value(v: Any) -> str:
    """`v` as YAML that reads back as the same value (1e-05 would read back as a string)."""
    return yaml.safe_dump(v, default_flow_style=True).removesuffix("\n").removesuffix("\n...")
