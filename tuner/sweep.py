"""The Ray driver: connect (or start) Ray, build the Tuner, run or resume, write the summary.

Ray is imported only inside these functions: the CLI validates a file and refuses bad input
before paying for Ray's start-up.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Any, Optional

from tuner import algorithms, cluster, packing, resources, sweepdir
from tuner.algorithms import Prior, PriorTrial
from tuner.config import ConfigError, SweepConfig, load_sweep, settled
from tuner.results import (
    CONFIG_FILE,
    DiskFull,
    TrialRecord,
    check_sweep_dir,
    disk_full,
    full_config,
    leaderboard,
    read_summary,
    records,
    remove_temporaries,
    summarize,
    write_summary,
)
from tuner.space import Choice, Fixed, Grid, ParamT, grid_size, values_of
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
    """(storage path or URI for Ray, local sweep directory or None for URIs).

    Under `ray job submit` a relative path means the directory the job was submitted from.
    """
    if "://" in output:
        return output, None
    storage = os.path.abspath(os.path.expanduser(cluster.output_base(output)))
    return storage, sweepdir.resolve(storage, name)


def connect(
    address: Optional[str],
    num_cpus: Optional[int] = None,
    verbose: bool = False,
    allow_insecure_cluster: bool = False,
    dashboard: bool = True,
) -> str:
    """Join the cluster at `address` (or the job's cluster), else start a private local Ray.

    A cluster is checked first (cluster.check): reachable, our token accepted, and not open
    to other machines without authentication unless `allow_insecure_cluster`.
    Without an address we always start our own (`address="local"`): never a leftover cluster
    whose address a killed `ray start` left behind in Ray's temp directory, or RAY_ADDRESS.
    """
    import ray

    if ray.is_initialized():
        return "existing"
    common: dict[str, Any] = dict(
        logging_level=logging.INFO if verbose else logging.ERROR,
        log_to_driver=verbose,
    )
    joining = cluster.target(address)
    if joining is not None:
        cluster.check(joining, allow_insecure_cluster)
        if num_cpus:
            cluster.warn("--num-cpus sizes only a local Ray that tuner starts: ignored")
        if address:
            ray.init(address=str(joining), **common)
            return str(joining)
        ray.init(**common)  # the job's cluster, from RAY_ADDRESS
        return "job"
    # The dashboard (on loopback only) serves the State API that Ray Train V2 relies on:
    # without it a finished DDP trial's resources were never handed back and the next
    # trial's workers waited forever (seen with Ray 2.60 on this machine). Sweeps of 1-worker
    # trials use no Ray Train and skip it: it and its module processes cost seconds of CPU.
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        **cluster.prepare_local(),  # token 0600, every socket on loopback
        **common,
    )
    return "local"


def _needs_train(cfg: SweepConfig) -> bool:
    """Trials run Ray Train (and so need the dashboard's State API) with several workers."""
    return cfg.resources.workers_per_trial > 1


def _quiet_ray(verbose: bool) -> None:
    if not verbose:
        # Tune's new console output prints a configuration box at any verbosity; the legacy
        # reporter at verbose=0 prints nothing, and our Progress callback reports instead.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    # Our callbacks write the CSV/JSON results and TensorBoard files; Ray's TensorBoardX
    # logger would add a second set of event files to every trial.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.WARNING if verbose else logging.ERROR)
    stops = logging.getLogger("ray.tune.tune")
    stops.setLevel(logging.WARNING)
    if not any(isinstance(f, _StopMessages) for f in stops.filters):
        stops.addFilter(_StopMessages())


class _StopMessages(logging.Filter):
    """Of Tune's driver warnings, keep the one a first Ctrl-C gives, in our words, and drop
    the rest: they point at `Tuner.restore`, where tuner's way back is `tuner resume`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Stop signal received"):
            return False
        record.msg = (
            "[tuner] stopping: trials end at their next report, state is saved; Ctrl-C again to stop at once"
        )
        record.args = ()
        return True


class TrialNames:
    """Trial (and directory) names: the trial id, or for a trial continued by `resume`, the
    directory it ran in, so it finds its checkpoints, journal and TensorBoard run there."""

    def __init__(self, resumed: Optional[list[tuple[dict[str, Any], str]]] = None):
        self.pending = [(algorithms.key(c), name) for c, name in (resumed or [])]
        self.given: dict[str, str] = {}

    def __call__(self, trial: Any) -> str:
        if trial.trial_id not in self.given:
            name = trial.trial_id
            k = algorithms.key(trial.config)
            for i, (config_key, old) in enumerate(self.pending):
                if config_key == k:
                    name = old
                    del self.pending[i]
                    break
            self.given[trial.trial_id] = name
        return self.given[trial.trial_id]


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
        trial_timeout=cfg.schedule.trial_timeout,
        search_path=os.getcwd(),
        storage=storage,
        sweep_dir=sweep_dir,
    )


def expected_trials(cfg: SweepConfig) -> int:
    """Trials the sweep runs in all: num_samples, or the grid's size for grid search."""
    if cfg.search.algorithm == "grid":
        return grid_size(cfg.hyperparameters(), cfg.search.grid_points)
    return cfg.search.num_samples


def _precheck_local(cfg: SweepConfig, address: Optional[str], num_cpus: Optional[int]) -> None:
    """When we are about to start our own local Ray, refuse an impossible request first."""
    if cluster.target(address) is not None:
        return
    have = resources.local_resources(num_cpus)
    if cfg.resources.gpus_per_worker == "pack" and have["GPU"]:
        return  # measuring the largest configuration needs Ray: it is checked after start-up
    resources.plan(cfg.resources, have, [have])


def _preflight(cfg: SweepConfig) -> resources.TrialResources:
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    res = resources.plan(
        cfg.resources, ray.cluster_resources(), nodes, _node_groups(), probe=lambda: _probe_memory(cfg)
    )
    amp = cfg.hyperparameters()["amp"]
    path = "search.params.amp" if "amp" in cfg.search.params else "training.amp"
    resources.check_amp(values_of(amp) or [], res.gpus_per_worker, path)
    return res


def _node_groups() -> Optional[list[tuple[dict[str, float], int]]]:
    """The node types an autoscaler may add, or None on a fixed-size cluster.

    Read from the autoscaler's cluster config in the GCS (a private Ray API; any failure means
    "fixed", which at worst refuses a request the autoscaler could have served).
    """
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - an absent or changed private API: treat as fixed
        return None
    if config is None or not config.node_group_configs:
        return None
    return [(dict(g.resources), int(g.max_count)) for g in config.node_group_configs if g.max_count != 0]


def _warn_unshared(storage: str) -> None:
    import ray

    warning = cluster.storage_warning(storage, ray.nodes())
    if warning:
        cluster.warn(warning)


def _probe_memory(cfg: SweepConfig, timeout_s: float = 900) -> packing.MemoryProfile:
    """gpus_per_worker: pack: the peak memory of the space's largest configuration, measured
    in a Ray task that holds one whole GPU (nothing else runs on it meanwhile). A failure
    propagates; resources.plan reports it against the field."""
    import dataclasses

    import ray

    spec = build_spec(cfg, resources.probe_request(cfg.resources), "", None)
    hp = packing.probe_config(cfg.hyperparameters())
    task = ray.remote(num_gpus=1, num_cpus=spec.cpus_per_worker, max_retries=0)(_measure)
    profile = ray.get(task.remote(hp, spec), timeout=timeout_s)
    return dataclasses.replace(profile, label=packing.label(hp, cfg.search.params))


def _measure(hp: dict[str, Any], spec: TrialSpec) -> packing.MemoryProfile:
    from tuner.trial.probe import measure  # torch: imported in the task, not in the driver

    return measure(hp, spec)


def _launch(
    cfg: SweepConfig,
    res: resources.TrialResources,
    storage: str,
    sweep_dir: Optional[str],
    verbose: bool,
    prior: Optional[Prior] = None,
    resumed_dirs: Optional[list[tuple[dict[str, Any], str]]] = None,
    done: int = 0,
) -> None:
    """Build the Tuner and run it to the end (or to Ctrl-C / SIGTERM)."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from tuner.callbacks import HParamsCallback, Progress, TrialRecordCallback
    from tuner.trial.runner import trainable_for

    spec = build_spec(cfg, res, storage, sweep_dir)
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, str(cfg.mode), res.max_concurrent, prior
    )
    per_trial = {
        "workers": res.workers,
        "cpus_per_worker": res.cpus_per_worker,
        "gpus_per_worker": res.gpus_per_worker,
    }
    callbacks: list[Any] = [JsonLoggerCallback(), CSVLoggerCallback(), TrialRecordCallback(per_trial)]
    if sweep_dir:
        callbacks.append(HParamsCallback(sweep_dir, hparam_domains(cfg.search.params), METRIC_TAGS))
    if not verbose:
        callbacks.append(Progress(cfg.metric, str(cfg.mode), expected_trials(cfg), done=done))
    names = TrialNames(resumed_dirs)
    reuse = res.workers == 1
    trainable = tune.with_resources(
        tune.with_parameters(trainable_for(spec), spec=spec), resources=res.bundle
    )
    tuner = tune.Tuner(
        trainable,
        param_space=plan.param_space,
        tune_config=tune.TuneConfig(
            search_alg=plan.search_alg,
            scheduler=plan.scheduler,
            num_samples=plan.num_samples,
            # Reused actors keep data and imports warm between 1-worker trials. A DDP trial's
            # actor only drives a TorchTrainer, and its reset waits on the Train run's
            # teardown (Tune gives up after 2 s, then stalled here): no reuse for those.
            reuse_actors=reuse,
            trial_name_creator=names,
            trial_dirname_creator=names,
        ),
        run_config=tune.RunConfig(
            # The directory's own name: a resumed copy of a sweep writes into itself, never
            # into the sweep its sweep.yaml was first written for.
            name=os.path.basename(sweep_dir) if sweep_dir else cfg.name,
            storage_path=storage,
            callbacks=callbacks,
            # Trials keep their own checkpoints (tuner.trial.checkpoint); these settings
            # matter only for checkpoints handed to Tune with URI storage.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=cfg.failure.keep_checkpoints),
            failure_config=tune.FailureConfig(
                max_failures=cfg.failure.max_failures if res.workers == 1 else 0
            ),
            verbose=2 if verbose else 0,
        ),
    )
    where = sweep_dir or storage
    print(
        f"[tuner] {cfg.name}: {plan.description}, {expected_trials(cfg)} trials of up to "
        f"{cfg.schedule.max_epochs} epochs, {res.describe()} each -> {where}",
        flush=True,
    )
    with _sigterm_as_sigint():
        tuner.fit()


class _disk_full_stops:
    """A full disk stops the sweep like an interrupt (DiskFull: one line, exit 130, resumable)
    instead of a crash: half-written temporaries are removed, the rest is kept."""

    def __init__(self, sweep_dir: Optional[str]):
        self.sweep_dir = sweep_dir

    def __enter__(self) -> None: ...

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        cause = disk_full(err) if err is not None and self.sweep_dir else None
        if cause is None or self.sweep_dir is None:
            return
        remove_temporaries(self.sweep_dir)
        if isinstance(err, DiskFull):
            raise err
        raise DiskFull(self.sweep_dir, cause) from None


class _sigterm_as_sigint:
    """SIGTERM (e.g. `ray job stop`) stops the sweep like Ctrl-C: Tune catches SIGINT only,
    finishing gracefully on the first and at once on the second."""

    def __enter__(self) -> None:
        self.previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGTERM, self.previous)


def run_sweep(
    cfg: SweepConfig,
    *,
    address: Optional[str] = None,
    num_cpus: Optional[int] = None,
    verbose: bool = False,
    allow_insecure_cluster: bool = False,
) -> SweepOutcome:
    """Run a sweep to the end (or until interrupted); returns where it is and how it went."""
    cfg, text = settled(cfg)  # what `resume` will read back from sweep.yaml, exactly
    storage, sweep_dir = locate(cfg.output, cfg.name)
    with sweepdir.claim(sweep_dir, new=True, command="sweep") as held:
        _precheck_local(cfg, address, num_cpus)
        _quiet_ray(verbose)
        connect(address, num_cpus, verbose, allow_insecure_cluster, dashboard=_needs_train(cfg))
        _warn_unshared(storage)
        res = _preflight(cfg)  # a refused sweep leaves no directory: claim removes it
        held.write_config(text)
        with _disk_full_stops(sweep_dir):
            _launch(cfg, res, storage, sweep_dir, verbose)
            return finish(cfg, sweep_dir or storage)


def _records(cfg: SweepConfig, sweep_dir: str) -> list[TrialRecord]:
    return records(sweep_dir, cfg.metric, str(cfg.mode), cfg.schedule.max_epochs, list(cfg.search.params))


def finish(cfg: SweepConfig, sweep_dir: str) -> SweepOutcome:
    """Read the sweep directory back, write summary.json, decide the exit code."""
    trials = _records(cfg, sweep_dir) if "://" not in sweep_dir else []
    summary = summarize(
        trials,
        name=cfg.name,
        metric=cfg.metric,
        mode=str(cfg.mode),
        algorithm=cfg.search.algorithm,
        expected_trials=expected_trials(cfg),
    )
    if "://" not in sweep_dir:
        write_summary(sweep_dir, summary)
    code = EXIT_OK
    if summary["status"] == "interrupted":
        code = EXIT_INTERRUPTED
    elif any(r.status == "ERROR" for r in trials) or summary["best"] is None:
        code = EXIT_ERRORS
    return SweepOutcome(sweep_dir, summary, leaderboard(trials, cfg.metric, str(cfg.mode)), code)


class AlreadyFinished(Exception):
    """`resume` on a sweep that has nothing left to run."""


def load_resumable(sweep_dir: str) -> SweepConfig:
    """The resolved config of a sweep directory; a ConfigError if it is not one."""
    path = check_sweep_dir(sweep_dir)
    empty = sweepdir.empty_config_message(path)
    if empty:
        raise ConfigError("", empty)
    return load_sweep(os.path.join(path, CONFIG_FILE))


def _plan_left(cfg: SweepConfig, sweep_dir: str) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """(finished, unfinished) trials; AlreadyFinished when nothing is left to run."""
    trials = _records(cfg, sweep_dir)
    finished = [t for t in trials if t.finished]
    unfinished = [t for t in trials if not t.finished]
    if not unfinished and len(finished) >= expected_trials(cfg):
        status = _status(sweep_dir)
        if status is None:  # cut short by a crash: rewritten from the trials' own records
            with sweepdir.claim(sweep_dir, new=False, command="resume"):
                status = finish(cfg, sweep_dir).summary["status"] + "; its damaged summary.json is rewritten"
        raise AlreadyFinished(
            f"{sweep_dir}: all {len(finished)} trials finished (status {status}); nothing to resume"
        )
    return finished, unfinished


def _status(sweep_dir: str) -> Optional[str]:
    """The status summary.json records; None if the file is damaged."""
    try:
        summary = read_summary(sweep_dir)
    except (OSError, ValueError):
        return None
    return str(summary.get("status", "completed")) if isinstance(summary, dict) else None


def resume_sweep(
    sweep_dir: str,
    *,
    address: Optional[str] = None,
    num_cpus: Optional[int] = None,
    verbose: bool = False,
    allow_insecure_cluster: bool = False,
) -> SweepOutcome:
    """Continue an interrupted sweep: finished trials are kept, unfinished ones continue from
    their checkpoints in their own directories, and the searcher (rebuilt from every earlier
    result) proposes the rest, so the sweep ends with exactly its planned number of trials.

    Raises AlreadyFinished (changing nothing, unless summary.json was damaged) when every
    planned trial has finished.
    """
    sweep_dir = os.path.abspath(sweep_dir)
    sweepdir.refuse_if_held(sweep_dir)
    cfg = load_resumable(sweep_dir)
    _plan_left(cfg, sweep_dir)  # a finished sweep is left as it is, its lock file included
    with sweepdir.claim(sweep_dir, new=False, command="resume"):
        finished, unfinished = _plan_left(cfg, sweep_dir)  # again: the holder before us may have ended it
        return _resume(
            cfg, sweep_dir, finished, unfinished, address, num_cpus, verbose, allow_insecure_cluster
        )


def _resume(
    cfg: SweepConfig,
    sweep_dir: str,
    finished: list[TrialRecord],
    unfinished: list[TrialRecord],
    address: Optional[str],
    num_cpus: Optional[int],
    verbose: bool,
    allow_insecure_cluster: bool,
) -> SweepOutcome:
    _precheck_local(cfg, address, num_cpus)
    prior = Prior(
        finished=[PriorTrial(full_config(t.path), t.history, t.status == "ERROR") for t in finished],
        resumed=[full_config(t.path) for t in unfinished],
        new=expected_trials(cfg) - len(finished) - len(unfinished),
    )
    _quiet_ray(verbose)
    connect(address, num_cpus, verbose, allow_insecure_cluster, dashboard=_needs_train(cfg))
    _warn_unshared(os.path.dirname(sweep_dir))
    print(
        f"[tuner] resuming {cfg.name}: {len(finished)} trials finished, {len(unfinished)} to continue "
        f"from checkpoints, {max(prior.new or 0, 0)} to start",
        flush=True,
    )
    resumed_dirs = [(full_config(t.path), os.path.basename(t.path)) for t in unfinished]
    res = _preflight(cfg)
    with _disk_full_stops(sweep_dir):
        _launch(
            cfg, res, os.path.dirname(sweep_dir), sweep_dir, verbose, prior, resumed_dirs, done=len(finished)
        )
        return finish(cfg, sweep_dir)
