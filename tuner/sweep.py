"""The Ray driver: connect (or start) Ray, build the Tuner, run or resume, write the summary.

Ray is imported only inside these functions: the CLI validates a file and refuses bad input
before paying for Ray's start-up.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from tuner import algorithms, packing, resources
from tuner.config import ConfigError, SweepConfig, to_yaml
from tuner.results import CONFIG_FILE, leaderboard, load_trials, record, summarize, write_summary
from tuner.space import Choice, Fixed, Grid, ParamT, values_of
from tuner.trial.spec import TrialSpec

# Metrics a trial reports whose last value the HParams table shows.
METRIC_TAGS = ["val_acc", "val_loss", "train_loss", "samples_per_s", "epoch"]
EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass
class SweepOutcome:
    """What a finished (or stopped) sweep left behind."""

    sweep_dir: str
    summary: dict[str, Any]
    table: str
    exit_code: int


def locate(output: str, name: str) -> tuple[str, Optional[str]]:
    """(storage path or URI for Ray, local sweep directory or None for URIs)."""
    if "://" in output:
        return output, None
    storage = os.path.abspath(os.path.expanduser(output))
    return storage, os.path.join(storage, name)


def refuse_existing(sweep_dir: Optional[str]) -> None:
    """Never write into a sweep that is already there: results are the user's."""
    if sweep_dir and os.path.isdir(sweep_dir) and os.listdir(sweep_dir):
        raise ConfigError(
            "name",
            f"{sweep_dir} already holds a sweep; continue it with `python -m tuner resume "
            f"{sweep_dir}`, or choose another --name or --output",
        )


def in_ray_job() -> bool:
    """True when run as the entrypoint of `ray job submit` (the job sets this variable)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def connect(address: Optional[str], num_cpus: Optional[int] = None, verbose: bool = False) -> str:
    """Join the cluster at `address` (or the job's cluster), else start a private local Ray.

    Without an address we always start our own (`address="local"`): never a leftover cluster
    whose address a killed `ray start` left behind in Ray's temp directory.
    """
    import ray

    if ray.is_initialized():
        return "existing"
    common: dict[str, Any] = dict(
        logging_level=logging.INFO if verbose else logging.ERROR,
        log_to_driver=verbose,
    )
    if address:
        ray.init(address=address, **common)
        return address
    if in_ray_job():
        ray.init(**common)
        return "job"
    # The dashboard (on loopback only) serves the State API that Ray Train V2 relies on:
    # without it a finished DDP trial's resources were never handed back and the next
    # trial's workers waited forever (seen with Ray 2.60 on this machine).
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        **common,
    )
    return "local"


def _quiet_ray(verbose: bool) -> None:
    if not verbose:
        # Tune's new console output prints a configuration box at any verbosity; the legacy
        # reporter at verbose=0 prints nothing, and our Progress callback reports instead.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    # Our callbacks write the CSV/JSON results and TensorBoard files; Ray's TensorBoardX
    # logger would add a second set of event files to every trial.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Checkpointing every epoch with num_to_keep makes Tune snapshot the experiment often
    # (so a restore never points at a deleted checkpoint); it warns each time. Measured cost:
    # see BENCHMARKS.md.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.WARNING)


def trial_name(trial: Any) -> str:
    """Short, stable trial (and directory) names: the trial id."""
    return trial.trial_id


def hparam_domains(params: dict[str, ParamT]) -> dict[str, Any]:
    """Domains for TensorBoard's HParams: a list of values, or a (low, high) interval."""
    domains: dict[str, Any] = {}
    for name, p in params.items():
        if isinstance(p, (Fixed, Choice, Grid)):
            domains[name] = values_of(p)
        else:
            domains[name] = (p.low, p.high)  # type: ignore[union-attr]
    return domains


def build_spec(
    cfg: SweepConfig, res: resources.TrialResources, storage: str, sweep_dir: Optional[str]
) -> TrialSpec:
    return TrialSpec(
        model=cfg.task.model,
        data=cfg.task.data,
        data_args=dict(cfg.task.data_args),
        max_epochs=cfg.schedule.max_epochs,
        metric=cfg.metric,
        mode=str(cfg.mode),
        workers=res.workers,
        cpus_per_worker=res.cpus_per_worker,
        gpus_per_worker=res.gpus_per_worker,
        strategy=cfg.resources.strategy,
        gpu_memory_margin=cfg.resources.gpu_memory_margin,
        gpu_context_bytes=res.profile.context if res.profile else None,
        max_failures=cfg.failure.max_failures,
        keep_checkpoints=cfg.failure.keep_checkpoints,
        search_path=os.getcwd(),
        storage=storage,
        sweep_dir=sweep_dir,
    )


def _preflight(cfg: SweepConfig) -> resources.TrialResources:
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    res = resources.plan(cfg.resources, ray.cluster_resources(), nodes, probe=lambda: _probe_memory(cfg))
    amp = cfg.hyperparameters()["amp"]
    path = "search.params.amp" if "amp" in cfg.search.params else "training.amp"
    resources.check_amp(values_of(amp) or [], res.gpus_per_worker, path)
    return res


def _probe_memory(cfg: SweepConfig) -> packing.MemoryProfile:
    """gpus_per_worker: pack: the peak memory of the space's largest configuration on one GPU."""
    from tuner.trial.probe import measure_on_ray

    spec = build_spec(cfg, resources.probe_request(cfg.resources), "", None)
    hp = packing.probe_config(cfg.hyperparameters())
    return measure_on_ray(hp, spec, packing.label(hp, cfg.search.params))


def _tuner(
    cfg: SweepConfig, res: resources.TrialResources, storage: str, sweep_dir: Optional[str], verbose: bool
) -> tuple[Any, algorithms.SearchPlan]:
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from tuner.callbacks import HParamsCallback, Progress, TrialEndCallback
    from tuner.trial.runner import trainable_for

    spec = build_spec(cfg, res, storage, sweep_dir)
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, str(cfg.mode), res.max_concurrent
    )
    callbacks: list[Any] = [JsonLoggerCallback(), CSVLoggerCallback(), TrialEndCallback()]
    if sweep_dir:
        domains = hparam_domains(cfg.search.params)
        callbacks.append(HParamsCallback(sweep_dir, domains, METRIC_TAGS))
    total = plan.num_samples if cfg.search.algorithm != "grid" else _grid_total(cfg)
    if not verbose:
        callbacks.append(Progress(cfg.metric, str(cfg.mode), total))
    trainable = tune.with_resources(
        tune.with_parameters(trainable_for(spec), spec=spec), resources=res.bundle
    )
    return tune.Tuner(
        trainable,
        param_space=plan.param_space,
        tune_config=tune.TuneConfig(
            search_alg=plan.search_alg,
            scheduler=plan.scheduler,
            num_samples=plan.num_samples,
            # Reused actors keep data and imports warm between 1-worker trials. A DDP trial's
            # actor only drives a TorchTrainer, and its reset waits on the Train run's
            # teardown (Tune gives up after 2 s, then stalled here): no reuse for those.
            reuse_actors=res.workers == 1,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_name,
        ),
        run_config=tune.RunConfig(
            name=cfg.name,
            storage_path=storage,
            callbacks=callbacks,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=cfg.failure.keep_checkpoints),
            failure_config=tune.FailureConfig(
                max_failures=cfg.failure.max_failures if res.workers == 1 else 0
            ),
            verbose=2 if verbose else 0,
        ),
    ), plan


def _grid_total(cfg: SweepConfig) -> int:
    from tuner.space import grid_size

    return grid_size(cfg.hyperparameters(), cfg.search.grid_points)


def expected_trials(cfg: SweepConfig) -> int:
    """Trials the sweep runs in all: num_samples, or the grid's size for grid search."""
    return _grid_total(cfg) if cfg.search.algorithm == "grid" else cfg.search.num_samples


def run_sweep(
    cfg: SweepConfig,
    *,
    address: Optional[str] = None,
    num_cpus: Optional[int] = None,
    verbose: bool = False,
) -> SweepOutcome:
    """Run a sweep to the end; returns where it is and how it went."""
    storage, sweep_dir = locate(cfg.output, cfg.name)
    refuse_existing(sweep_dir)
    _quiet_ray(verbose)
    connect(address, num_cpus, verbose)
    res = _preflight(cfg)
    if sweep_dir:
        os.makedirs(sweep_dir, exist_ok=True)
        with open(os.path.join(sweep_dir, CONFIG_FILE), "w") as f:
            f.write(to_yaml(cfg))
    tuner, plan = _tuner(cfg, res, storage, sweep_dir, verbose)
    print(
        f"[tuner] {cfg.name}: {plan.description}, {expected_trials(cfg)} trials of up to "
        f"{cfg.schedule.max_epochs} epochs, {res.describe()} each -> {sweep_dir or storage}",
        flush=True,
    )
    grid = tuner.fit()
    return finish(cfg, sweep_dir or storage, trials=_trials_of(grid))


def _trials_of(grid: Any) -> Optional[list[Any]]:
    # Tune's in-memory trials after fit() are exact; its on-disk snapshot can lag (see
    # TrialEndCallback). ResultGrid exposes them only privately, so fall back to the disk.
    analysis = getattr(grid, "_experiment_analysis", None)
    return list(analysis.trials) if analysis is not None else None


def finish(
    cfg: SweepConfig, sweep_dir: str, status: Optional[str] = None, trials: Optional[list[Any]] = None
) -> SweepOutcome:
    """Summarise the sweep (given trials, or those on disk), write summary.json, pick the exit code."""
    if trials is None:
        trials = load_trials(sweep_dir)
    names = list(cfg.search.params)
    records = [record(t, cfg.metric, str(cfg.mode), cfg.schedule.max_epochs, names) for t in trials]
    summary = summarize(
        records,
        name=cfg.name,
        metric=cfg.metric,
        mode=str(cfg.mode),
        algorithm=cfg.search.algorithm,
        expected_trials=expected_trials(cfg),
        status=status,
    )
    if "://" not in sweep_dir:
        write_summary(sweep_dir, summary)
    errors = sum(1 for r in records if r.status == "ERROR")
    code = EXIT_OK
    if summary["status"] == "interrupted":
        code = EXIT_INTERRUPTED
    elif errors or summary["best"] is None:
        code = EXIT_ERRORS
    return SweepOutcome(sweep_dir, summary, leaderboard(records, cfg.metric, str(cfg.mode)), code)
