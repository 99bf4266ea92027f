"""The Ray driver: one run function behind `run_sweep` and `resume_sweep`.

A run: refuse what cannot run (before a local Ray starts), connect, resolve each trial's
resources, build the Tuner, run it to the end (or to Ctrl-C / SIGTERM), read the sweep
directory back and write summary.json. Ray is imported only inside these functions: the CLI
validates a file and refuses bad input before paying for Ray's start-up.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from tuner import environment, sweepdir, timeline
from tuner.cluster import _ray_internals, join
from tuner.cluster.connect import Runtime, connect, keep_credentials_home, quiet_ray, warn_unshared
from tuner.config import MAX_TRIALS, ConfigError, SweepConfig, settled, to_yaml, yamlfile
from tuner.config.schedule import TrackingSection
from tuner.driver import autotune, resources, stopping
from tuner.errors import DiskFull, ExitCode, disk_full, storage_unavailable, warn
from tuner.results import FAILED, TARGET, TrialRecord, leaderboard, record, records, summarize
from tuner.search import algorithms, warm
from tuner.search.algorithms import Prior, PriorTrial
from tuner.space.params import allows
from tuner.sweepdir import Claim, Place, full_config, remove_temporaries


@dataclass
class SweepOutcome:
    """What a finished (or stopped) sweep left behind."""

    sweep_dir: str
    summary: dict[str, Any]
    table: str
    exit_code: int


class AlreadyFinished(Exception):
    """`resume` on a sweep that has nothing left to run."""


def locate(output: str, name: str) -> Place:
    """The place of the sweep `<output>/<name>`. Under `ray job submit` a relative path means
    the directory the job was submitted from."""
    return sweepdir.place_for(join.output_base(output), name)


@dataclass
class Start:
    """Where a run starts from: a new sweep, or the earlier trials of a resumed one."""

    place: Place  # where the sweep lives (held by this run)
    prior: Optional[Prior] = None  # None: a new sweep
    resumed_dirs: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    done: int = 0  # trials finished before
    announce: Optional[str] = None  # a line printed once Ray is up
    config_text: Optional[str] = None  # a new sweep: its sweep.yaml, written once Ray is up
    retried: list[str] = field(default_factory=list)  # failed trials to set aside and run afresh


def run_sweep(cfg: SweepConfig, runtime: Optional[Runtime] = None) -> SweepOutcome:
    """Run a sweep to the end (or until interrupted); returns where it is and how it went."""
    cfg, text = settled(cfg)  # what `resume` will read back from sweep.yaml, exactly
    place = locate(cfg.output, cfg.name)
    place.check()  # (object storage: reachable with our credentials, before Ray starts)
    with place.claim(new=True, command="sweep") as held:
        return run(cfg, runtime or Runtime(), Start(place, config_text=text), held)


def sweep_or_resume(cfg: SweepConfig, runtime: Optional[Runtime] = None) -> SweepOutcome:
    """`sweep --resume-if-exists`, the command a retried job (a RayJob, a requeued batch job)
    runs again: the sweep, new; or, when its place already holds the same sweep (sweep.yaml
    equal to the file and flags given, wherever the output was named from), continued as
    `resume` continues it. A place holding a different sweep is refused (ConfigError, that
    names the first field that differs); a finished one raises AlreadyFinished."""
    place = locate(cfg.output, cfg.name)
    place.check()
    if not place.exists():
        return run_sweep(cfg, runtime)
    place.refuse_if_held("name")
    ours = yamlfile.load(to_yaml(settled(cfg)[0]))  # both read back from YAML, the same way
    theirs = yamlfile.load(to_yaml(place.config()))
    changed = sweepdir.difference(theirs, ours)
    if changed:
        raise ConfigError(
            "name",
            f"{place.uri} holds a different sweep ({changed}); choose another --name or --output",
        )
    return resume_sweep(place, runtime, tracking=cfg.tracking)


def resume_sweep(
    sweep: Union[str, Place],
    runtime: Optional[Runtime] = None,
    tracking: Optional[TrackingSection] = None,
    retry_failed: bool = False,
) -> SweepOutcome:
    """Continue an interrupted sweep: finished trials are kept, unfinished ones continue from
    their checkpoints in their own directories, and the searcher (rebuilt from every earlier
    result) proposes the rest, so the sweep ends with exactly its planned number of trials.
    With `retry_failed`, the trials that failed (error, oom, timeout, diverged) run again from
    scratch, with their configurations and under their own names; their first runs are kept
    in `retried/` (sweepdir.set_aside) and the searcher is not told their results. A sweep in
    object storage is planned from the store; its unfinished trials continue from their
    newest checkpoints there, on whichever node they land (trial/frame/stored.py).

    Raises AlreadyFinished (changing nothing, unless summary.json was damaged) when every
    planned trial has finished (and, with `retry_failed`, none failed). `tracking`: the
    sweep's own, as its file gives it (with the credentials sweep.yaml does not keep).
    """
    place = sweep if isinstance(sweep, Place) else sweepdir.place_of(sweep)
    place.check()
    place.refuse_if_held()
    seen = place.reader()  # (a finished sweep is left as it is, its lock file included)
    cfg = _with_tracking(sweepdir.read_config(seen.readable()), tracking)
    _plan_left(cfg, seen, retry_failed, rewrite=False)
    with place.claim(new=False, command="resume") as held:
        cfg = _with_tracking(sweepdir.read_config(place.local), tracking)
        # (again: the holder before us may have ended it)
        finished, unfinished = _plan_left(cfg, place, retry_failed)
        start = _resumed(cfg, place, finished, unfinished, retry_failed=retry_failed)
        return run(cfg, runtime or Runtime(), start, held)


def _with_tracking(cfg: SweepConfig, tracking: Optional[TrackingSection]) -> SweepConfig:
    if tracking is not None:
        cfg.tracking = tracking
    return cfg


def extend_sweep(sweep: Union[str, Place], more: int, runtime: Optional[Runtime] = None) -> SweepOutcome:
    """Add `more` trials to a sweep (finished, interrupted or ended by its budget or target):
    sweep.yaml's num_samples grows by `more`, then it runs on as `resume` does, its searcher
    rebuilt from every earlier result, unfinished trials continued from their checkpoints.
    An algorithm that cannot be extended (grid search) has nothing to add: a ConfigError."""
    place = sweep if isinstance(sweep, Place) else sweepdir.place_of(sweep)
    place.check()
    place.refuse_if_held()
    cfg = place.config()
    if cfg.algorithm.no_extend:
        why = cfg.algorithm.no_extend
        raise ConfigError("--num-samples", f"a {cfg.search.algorithm} sweep {why}: nothing to add")
    if cfg.scheduler.clones:
        raise ConfigError(
            "--num-samples",
            f"a {cfg.scheduler.name} sweep's population trained side by side from the start: a member "
            "added now could not catch up (start a new sweep, warm-started from this one)",
        )
    if more < 1:
        raise ConfigError("--num-samples", f"must be >= 1, got {more}")
    total = cfg.search.num_samples + more
    if total > MAX_TRIALS:
        raise ConfigError("--num-samples", f"the sweep would plan {total} trials; at most {MAX_TRIALS}")
    with place.claim(new=False, command="extend") as held:
        cfg = sweepdir.read_config(place.local)  # again, under the lock
        cfg.search.num_samples += more
        cfg, text = settled(cfg)
        held.write_config(text, cfg.code_dirs)
        finished, unfinished = _split(_records(cfg, place.local))
        start = _resumed(cfg, place, finished, unfinished, doing=f"extending to {total} trials")
        return run(cfg, runtime or Runtime(), start, held)


def settle(where: str) -> Optional[SweepOutcome]:
    """summary.json of a sweep whose driver died under it (its Ray killed by the same signal:
    driver/stopping.py's `watched`), from the trials' own records as `resume` reads them;
    None where there is no sweep (the driver died before writing sweep.yaml)."""
    place = sweepdir.place_of(where)
    if not place.exists():
        return None
    with place.claim(new=False, command="resume"):
        return finish(sweepdir.read_config(place.local), place)


def _plan_left(
    cfg: SweepConfig, place: Place, retry_failed: bool = False, rewrite: bool = True
) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """(finished, unfinished) trials of the place's working copy; AlreadyFinished when nothing
    is left to run (with `retry_failed`: nor any failed trial to run again). A refusal with
    failed trials names `--retry-failed`, the way on. A summary.json a crash cut short is
    rewritten from the trials' own records (`rewrite`: the caller holds the sweep), else left
    for the caller that will."""
    finished, unfinished = _split(_records(cfg, place.local))
    failed = _failed(finished)
    status = _status(place.local) if not unfinished else None
    if retry_failed and failed:
        return finished, unfinished
    if not unfinished and (len(finished) >= cfg.expected_trials() or status == TARGET):
        if status is None:  # cut short by a crash: rewritten from the trials' own records
            if not rewrite:
                return finished, unfinished
            what = (
                "damaged summary.json is rewritten"
                if sweepdir.has_summary(place.local)
                else ("summary.json (the driver stopped before it) is written")
            )
            status = f"{finish(cfg, place).summary['status']}; its {what}"
        again = (
            f"; {len(failed)} of them failed: fix the cause, then run them again with "
            f"`python -m tuner resume {place.uri} --retry-failed`"
            if failed
            else ""
        )
        raise AlreadyFinished(
            f"{place.uri}: all {len(finished)} trials finished (status {status}); nothing to resume{again}"
        )
    return finished, unfinished


def _failed(finished: list[TrialRecord]) -> list[TrialRecord]:
    """The trials `--retry-failed` runs again: those that failed (Outcome.failed) once the
    user's code had run (one Tune failed before it started runs again anyway)."""
    return [t for t in finished if t.outcome.failed and not t.never_started]


def _stopped_at_resume(
    cfg: SweepConfig, place: Place, finished: list[TrialRecord], unfinished: list[TrialRecord]
) -> dict[str, TrialRecord]:
    """The unfinished trials the scheduler (asha, median, curve) stops at the last epoch they
    recorded, ended now as the uninterrupted sweep ended them (by trial path;
    their records read again). A driver killed between a trial's report and the scheduler's
    judgement of it lost the judgement (or, between a judgement to stop and the trial's end,
    the stop): continued, the trial would train an epoch the sweep never gave it."""
    if not cfg.scheduler.stops_early or not unfinished:
        return {}
    prior = Prior(
        finished=[
            PriorTrial(full_config(t.path), t.history, t.status == "ERROR") for t in _in_space(cfg, finished)
        ],
        interrupted=[PriorTrial(full_config(t.path), t.history) for t in unfinished],
        # (what the run will attach: the earlier sweeps' trials ASHA's rungs hold too)
        earlier=[t for s in warm.load(cfg, warm.sources(cfg, place)) for t in s.used]
        if cfg.search.warm_start
        else [],
    )
    scheduler = algorithms.scheduler_for(cfg, prior)
    if not hasattr(scheduler, "at_resume"):  # (moasha's fronts: not judged again)
        return {}
    from tuner.driver.verdicts import judged

    keeps = bool(judged(scheduler))  # (its judgements in stopper.jsonl: median, curve)
    ended = {}
    for i, t in enumerate(unfinished):
        kept = t.verdict if t.verdict is not None and t.verdict.get("epoch") == t.epochs else None
        verdict = kept or scheduler.at_resume(i, t.epochs)
        if verdict is None or not verdict["stop"]:
            continue
        if kept is None and keeps:
            place.push(sweepdir.append_verdict(t.path, verdict))
        info = sweepdir.read_record(t.path) or {}
        place.push(sweepdir.write_record(t.path, {**info, "status": "TERMINATED", "ended": time.time()}))
        ended[t.path] = record(
            t.path, cfg.objective, cfg.objective_direction, cfg.schedule.max_epochs, list(cfg.search.params)
        )
        name, why = os.path.basename(t.path), scheduler.brief(verdict)
        print(f"[tuner] trial {name} ends at epoch {t.epochs}, judged as it resumes (stopped early: {why})")
    return ended


def _split(trials: list[TrialRecord]) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """(kept as they are, to run): unfinished trials, and those Tune failed before they
    started (no code of the user's ran: their error says nothing of the configuration), run."""
    return [t for t in trials if not t.to_run], [t for t in trials if t.to_run]


def _status(sweep_dir: str) -> Optional[str]:
    """The status summary.json records; None if the file is damaged."""
    try:
        summary = sweepdir.read_summary(sweep_dir)
    except (OSError, ValueError):
        return None
    return str(summary.get("status", "completed")) if isinstance(summary, dict) else None


def _resumed(
    cfg: SweepConfig,
    place: Place,
    finished: list[TrialRecord],
    unfinished: list[TrialRecord],
    doing: str = "resuming",
    retry_failed: bool = False,
) -> Start:
    """Where a resumed sweep starts from: its finished trials, those to continue, the rest.
    With `retry_failed`, the failed trials run again from scratch like unfinished ones, under
    their own names (their first runs set aside as the run starts: `Start.retried`)."""
    retried = _failed(finished) if retry_failed else []
    if retried:
        finished = [t for t in finished if t not in retried]
        unfinished = [*unfinished, *retried]
    ended = _stopped_at_resume(cfg, place, finished, [t for t in unfinished if t not in retried])
    if ended:
        finished = [*finished, *ended.values()]
        unfinished = [t for t in unfinished if t.path not in ended]
    prior = Prior(
        finished=[
            PriorTrial(full_config(t.path), t.history, t.status == "ERROR") for t in _in_space(cfg, finished)
        ],
        resumed=[full_config(t.path) for t in unfinished],
        interrupted=[PriorTrial(full_config(t.path), t.history) for t in unfinished],
        new=cfg.expected_trials() - len(finished) - len(unfinished),
    )
    again = f", {len(retried)} failed to run again from scratch" if retried else ""
    return Start(
        place=place,
        prior=prior,
        resumed_dirs=[(full_config(t.path), os.path.basename(t.path)) for t in unfinished],
        retried=[os.path.basename(t.path) for t in retried],
        done=len(finished),
        announce=f"[tuner] {doing} {cfg.name}: {len(finished)} trials finished, "
        f"{len(unfinished) - len(retried)} to continue from checkpoints, "
        f"{max(prior.new or 0, 0)} to start{again}",
    )


def _set_aside(place: Place, trial: str) -> None:
    """A failed trial's first run moved to `retried/`, in the place too (a trial of a sweep in
    object storage continues from what the bucket holds under its name)."""
    place.moved(trial, sweepdir.set_aside(place.local, trial))


def _in_space(cfg: SweepConfig, finished: list[TrialRecord]) -> list[TrialRecord]:
    """The finished trials whose values search.params still allows. A range narrowed by hand
    in sweep.yaml leaves earlier trials outside it, which a model-based searcher cannot be
    told (BOHB's ConfigSpace raised IllegalValueError): they stay in the results, said once."""
    inside, outside = [], []
    for t in finished:
        config = full_config(t.path)
        bad = [
            (k, config[k]) for k, p in cfg.search.params.items() if k in config and not allows(p, config[k])
        ]
        (outside if bad else inside).append((t, bad))
    if outside:
        name, value = outside[0][1][0]
        warn(
            f"{len(outside)} earlier trial(s) have values search.params no longer allows (e.g. "
            f"search.params.{name}: {value!r}): the search is not told them; they stay in the results"
        )
    return [t for t, _ in inside]


def run(cfg: SweepConfig, runtime: Runtime, start: Start, held: Claim) -> SweepOutcome:
    """The one way a sweep runs, new or resumed, in a place this run holds."""
    place = start.place
    resources.precheck_local(cfg, runtime)
    mlflow = cfg.tracking.mlflow
    if mlflow is not None:  # its store answers, before Ray starts
        from tuner.driver import mlflow_store

        mlflow_store.check(mlflow.uri, mlflow.experiment or cfg.name)
    start.prior = warm.attach(cfg, start.prior, place)  # (search.warm_start: before Ray)
    env = {**environment.describe(cfg.code_dirs), "started": time.time()}
    quiet_ray(runtime.verbose)
    timeline.mark("ray_init")
    preload = _preload(cfg.algorithm.preload)
    connect(runtime, trials_import_torch=cfg.trial_mode.actor_imports_torch)
    timeline.mark("ray_up")
    preload.join()  # (before anything here imports from Ray Tune itself)
    timeline.mark("preloaded")
    env["gpus"] = _cluster_gpus()
    warn_unshared(place.storage)
    if start.announce:
        print(start.announce, flush=True)
    tuned: list[Optional[dict[str, Any]]] = []  # (training.autotune's table, made once)

    def tune(trial: resources.TrialResources) -> Optional[dict[str, Any]]:
        if not tuned:
            tuned.append(autotune.for_sweep(cfg, trial, place))
        return tuned[0]

    # A refused sweep leaves no directory: claim removes it. `pack` tunes first, then probes
    # the configuration with the choice (resources.pack_probe).
    res = resources.resolve(cfg, tune)
    # (so is one whose constraints the search cannot keep: search.constraints)
    plan = algorithms.build_for(cfg, _search_limit(cfg, res), start.prior, place)
    if start.config_text is not None:
        held.write_config(start.config_text, cfg.code_dirs, warm.fingerprint(cfg))
    _record_environment(env, place)
    for trial in start.retried:  # (nothing refused the run: their first runs make way)
        _set_aside(place, trial)
    with _stops_resumably(place):
        progress = None if runtime.verbose else _progress(cfg, start)
        ended = _launch(cfg, res, start, plan, runtime.verbose, tune(res), progress)  # (training.autotune)
        timeline.mark("fit_done")
        outcome = finish(cfg, place, ended)
        timeline.mark("finished")
        if progress is not None:  # (its last line: what the table under it says)
            progress.close(outcome.summary)
        return outcome


def _progress(cfg: SweepConfig, start: Start) -> Any:
    from tuner.driver.callbacks import Progress

    return Progress(cfg.objective, cfg.objective_direction, cfg.expected_trials(), done=start.done)


def _cluster_gpus() -> dict[str, int]:
    """The GPUs of the cluster this driver is connected to, by kind."""
    import ray

    return environment.gpu_kinds(n["Resources"] for n in ray.nodes() if n.get("Alive"))


def _record_environment(env: dict[str, Any], place: Place) -> None:
    """environment.json gains this run's environment; a resumed sweep that now runs on another
    one (an upgrade, another commit of its code) says what changed, once."""
    earlier = sweepdir.read_environments(place.local)
    changed = environment.differences(earlier[-1], env) if earlier else []
    if changed:
        warn(f"this run's environment differs from the sweep's last run: {'; '.join(changed)}")
    place.push(sweepdir.add_environment(place.local, env))


# What the launch imports (seconds of Python on 2 cores), besides the search's own library
# (its record's `preload`).
_LAUNCH_MODULES = (
    "ray.tune",
    "ray.tune.logger",
    "tuner.driver.callbacks",
    "tuner.driver.dashboard",
    "tuner.driver.limits",
    "tuner.trial.launch.trainables",
)


def _preload(search_modules: tuple[str, ...]) -> Any:
    """Import what the launch needs in a thread, while `ray.init` (on this thread) mostly waits
    for Ray's processes to come up; join it before using them. What `ray.init` imports is
    imported first, here: two threads importing the same package's circular imports at once
    could see each other's half-made modules. An import that fails in the thread fails
    again where it is used, with its own error. On a Ray whose imports were not checked
    (_ray_internals.imports_beside_init) nothing is preloaded: the launch imports what it
    needs itself, in order, after `ray.init`."""
    if not _ray_internals.imports_beside_init():
        return _NothingPreloaded()
    _ray_internals.import_for_init()

    def imports() -> None:
        for name in (*_LAUNCH_MODULES, *search_modules):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - reported by the import that needs it
                return

    thread = threading.Thread(target=imports, name="tuner-preload", daemon=True)
    thread.start()
    return thread


class _NothingPreloaded:
    def join(self) -> None: ...


class _stops_resumably:
    """A full disk, or object storage that stopped answering, stops the sweep like an interrupt
    (DiskFull, StorageUnavailable: one line, exit 130, resumable) instead of a crash:
    half-written temporaries are removed, the rest is kept."""

    def __init__(self, place: Place):
        self.place = place

    def __enter__(self) -> None: ...

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        if err is None:
            return
        lost = storage_unavailable(err)
        if lost is not None:
            raise lost.at(self.place.uri) from None
        cause = disk_full(err)
        if cause is None:
            return
        remove_temporaries(self.place.local)
        if isinstance(err, DiskFull):
            raise err
        raise DiskFull(self.place.uri, cause) from None


class TrialNames:
    """Trial (and directory) names: the trial id, or for a trial continued by `resume`, the
    directory it ran in, so it finds its checkpoints, journal and TensorBoard run there."""

    def __init__(
        self,
        resumed: Optional[list[tuple[dict[str, Any], str]]] = None,
        chosen: Optional[dict[str, str]] = None,
    ):
        # `chosen`: the plan's searcher names its trials itself (a population's members).
        listed = [] if chosen is not None else resumed or []
        self.pending = [(algorithms.key(c), name) for c, name in listed]
        self.chosen = chosen if chosen is not None else {}
        self.given: dict[str, str] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> TrialNames:
        # Tune deep-copies the experiment's spec, and this object with it, for every trial it
        # creates: a copy would forget the names already given, and two trials of the same
        # configuration (random search over a few choices) would both continue the first one's
        # directory while the other's stayed unfinished.
        return self

    def __call__(self, trial: Any) -> str:
        if trial.trial_id not in self.given:
            name = self.chosen.get(trial.trial_id, trial.trial_id)
            k = algorithms.key(trial.config)
            for i, (config_key, old) in enumerate(self.pending):
                if config_key == k:
                    name = old
                    del self.pending[i]
                    from tuner.driver import staging  # (Ray Tune's: not before Ray is up)

                    staging.unstage(trial, name)
                    break
            self.given[trial.trial_id] = name
        return self.given[trial.trial_id]


MAX_PENDING_ENV = "TUNE_MAX_PENDING_TRIALS_PG"  # Ray Tune's: trials queued for an actor at once


def _ahead(cfg: SweepConfig, res: resources.TrialResources) -> Optional[int]:
    """How many trials Tune may queue for an actor at once, where Tune's own choice is not kept:
    as many as run at once, on a cluster of known size, with a scheduler that never pauses
    trials. Tune keeps one queued for a searcher it did not build (every tuner search), so a
    sweep's first trials asked for their actors one after another: on a running cluster each
    waits for a worker started for it, and a trial that ended while the next one's worker was
    starting had its actor handed to that one and the start cancelled, again and again while
    ASHA stopped trials at their first rung (BENCHMARKS.md: the issue's sweep joined to a
    cluster, 8.8-9.2 s against 6.9-7.2). An algorithm that learns is held to as many
    configurations without an outcome as trials run at once (`_search_limit`): it never
    proposes knowing less than with Tune's queue of one (all running, one more queued)."""
    if res.slots is None or cfg.scheduler.pauses:
        return None
    return res.slots


def _search_limit(cfg: SweepConfig, res: resources.TrialResources) -> Optional[int]:
    """How many of its trials the search may have running or queued at once (a
    ConcurrencyLimiter around its searcher): resources.max_concurrent_trials, or what fits for
    multi-worker trials; and for an algorithm that learns, where Tune queues ahead, the trials
    that run at once: its next configuration is asked for only when one of those ends."""
    if cfg.search.record.learns and _ahead(cfg, res) is not None:
        return res.slots
    return res.max_concurrent


@contextlib.contextmanager
def _queued_ahead(trials: Optional[int]) -> Iterator[None]:
    """Tune's setting of how many trials it queues for an actor at once (read when Tuner.fit
    builds its controller), for this run only; the user's own setting stands."""
    if trials is None or MAX_PENDING_ENV in os.environ:
        yield
        return
    os.environ[MAX_PENDING_ENV] = str(trials)
    try:
        yield
    finally:
        os.environ.pop(MAX_PENDING_ENV, None)


def _launch(
    cfg: SweepConfig,
    res: resources.TrialResources,
    start: Start,
    plan: algorithms.SearchPlan,
    verbose: bool,
    tuned: Optional[dict[str, Any]] = None,
    progress: Any = None,
) -> Optional[str]:
    """Build the Tuner and run it to the end (or to Ctrl-C / SIGTERM); why it ended early
    (`results.BUDGET`, `results.TARGET`, `results.FAILED`), or None. `tuned`: training.autotune's
    table, which every trial applies to its configuration; `progress`: the progress callback
    (none with --verbose, where Ray reports)."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.stopper import CombinedStopper

    from tuner.driver import dashboard, staging, verdicts
    from tuner.driver.callbacks import CatchUp, HParamsCallback, TrialRecordCallback, hparam_domains
    from tuner.driver.failfast import FailFast
    from tuner.driver.limits import Budgeted, SweepLimits, UserStopped
    from tuner.trial.launch.trainables import trainable_for

    _ray_internals.skip_callback_usage_tag()
    keep_credentials_home()  # (the AWS_* names Tune would hand every trial actor, and Ray log)
    _ray_internals.plain_trial_actors()  # (a trial actor takes a worker Ray started ahead)

    place = start.place
    spec = replace(resources.trial_spec(cfg, res, place.storage, place.trials_write_here), autotune=tuned)
    per_trial = {
        "workers": res.workers,
        "cpus_per_worker": res.cpus_per_worker,
        "gpus_per_worker": res.gpus_per_worker,
    }
    objectives = [n for n, _ in cfg.objectives]
    records = TrialRecordCallback(per_trial, place, plan.handed)
    # (first: the callbacks after it see the scheduler's judgement of each result in it)
    judged = verdicts.Verdicts.wanted(plan.scheduler, place)
    callbacks: list[Any] = [c for c in (judged,) if c is not None]
    callbacks += [JsonLoggerCallback(), CSVLoggerCallback(), records]
    first = {**dashboard.columns(objectives), **verdicts.columns(plan.scheduler)}
    callbacks.append(HParamsCallback(place, hparam_domains(cfg.search.params), objectives, first))
    if progress is not None:
        progress.explain = judged.why if judged is not None else None
        callbacks.append(progress)
    from tuner.driver import tracking

    callbacks += tracking.callbacks(cfg, place)  # tracking.mlflow, tracking.wandb
    limits = SweepLimits.wanted(
        cfg.objective, cfg.objective_direction, cfg.schedule.time_budget, cfg.schedule.stop_at
    )
    if limits is not None:
        callbacks.append(limits)
    fail_fast = FailFast.wanted(cfg.failure.fail_fast, place)
    if fail_fast is not None:
        callbacks.append(fail_fast)
    if cfg.trial_mode.shares_start_dir:  # trials writing relative outputs into one directory
        from tuner.driver.workdir import SharedWrites

        callbacks.append(SharedWrites(spec.start_dir or os.getcwd(), place.trials_write_here))
    # (After TrialRecordCallback and SweepLimits: it reads the records they write.)
    callbacks.append(dashboard.Dashboard(place, cfg.objectives, cfg.schedule.max_epochs))
    # (After those it hands the trials earlier runs ended to.)
    callbacks.append(
        CatchUp(place, callbacks, (cfg.objective, cfg.objective_direction), cfg.schedule.max_epochs)
    )
    callbacks.append(staging.StagingCleanup())  # (last at the run's end: what Tune staged goes)
    # Ctrl-C and SIGTERM (driver/stopping.py) reach Tune through UserStopped.
    stoppers = [s for s in (limits, fail_fast, UserStopped()) if s is not None]
    storage_path, storage_fs, name = place.ray_storage()
    own_second = staging.OwnSecond(name)  # (Tune stages by the name and second it begins)
    callbacks.append(own_second)
    names = TrialNames(start.resumed_dirs, plan.names)
    trainable = tune.with_resources(
        tune.with_parameters(trainable_for(spec), spec=spec), resources=resources.tune_request(res, spec)
    )
    tuner = tune.Tuner(
        trainable,
        param_space=plan.param_space,
        tune_config=tune.TuneConfig(
            search_alg=plan.search_alg,
            scheduler=plan.scheduler if limits is None else Budgeted(plan.scheduler, limits),
            num_samples=plan.num_samples,
            # Reused actors keep data and imports warm between trials; a DDP trial's actor
            # also keeps its ranks when its trial ended cleanly (trial/launch/ranks.py). Not
            # where trials pause (a population, at every perturbation): Tune would hand a
            # paused member's actor to the next and remove the placement group it had just
            # asked for that one, and Ray keeps the CPUs of a placement group removed while it
            # is being made, for good (ray-project/ray#64693; seen under load).
            reuse_actors=not cfg.scheduler.pauses,
            trial_name_creator=names,
            trial_dirname_creator=names,
        ),
        run_config=tune.RunConfig(
            # The place's own name: a resumed copy of a sweep writes into itself, never into
            # the sweep its sweep.yaml was first written for.
            name=name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            # In object storage, what a trial writes in its (node-local) directory is uploaded
            # with each checkpoint and at its end.
            sync_config=tune.SyncConfig(sync_artifacts=place.remote),
            callbacks=callbacks,
            # Trials keep their own checkpoints (tuner.trial.frame.checkpoint); these settings
            # matter only for checkpoints handed to Tune with URI storage.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=cfg.failure.keep_checkpoints),
            # Tune retries every trial, a DDP trial with all of its ranks.
            failure_config=tune.FailureConfig(max_failures=cfg.failure.max_failures),
            stop=CombinedStopper(*stoppers) if len(stoppers) > 1 else stoppers[0],
            verbose=2 if verbose else 0,
        ),
    )
    print(
        f"[tuner] {cfg.name}: {plan.description}, {cfg.expected_trials()} trials of up to "
        f"{cfg.schedule.max_epochs} epochs, {res.describe()} each -> {place.uri}",
        flush=True,
    )
    timeline.mark("fit")
    with stopping.user_stops(), own_second, _queued_ahead(_ahead(cfg, res)):
        tuner.fit()
    if fail_fast is not None and fail_fast.error is not None:
        return FAILED
    return None if limits is None else limits.reason


def _records(cfg: SweepConfig, sweep_dir: str) -> list[TrialRecord]:
    return records(
        sweep_dir, cfg.objective, cfg.objective_direction, cfg.schedule.max_epochs, list(cfg.search.params)
    )


def _keeps_best(cfg: SweepConfig, trials: list[TrialRecord], best: Any, place: Place) -> bool:
    """Whether the sweep's best trial left something for best/: its best weights (tuner's
    loop, your loop), or its best epoch's checkpoint directory (your script's, when it wrote
    one, into a sweep it writes itself: one in object storage keeps its checkpoints there)."""
    mode = cfg.trial_mode
    if mode.keeps_weights:
        return True
    if not mode.best_checkpoint or place.remote:
        return False
    paths = [t.path for t in trials if t.trial_id == str(best)]
    return bool(paths) and sweepdir.read_best_checkpoint(paths[0]) is not None


def finish(cfg: SweepConfig, place: Place, ended: Optional[str] = None) -> SweepOutcome:
    """Read the sweep back, write summary.json and best/, decide the exit code. `ended`: why
    the sweep ended before its planned trials (`results.BUDGET`, `results.TARGET`,
    `results.FAILED`), if it did. A remote place is read from the store into its working
    copy, and what is written here goes back to it."""
    local = place.pull()
    sweepdir.remove_empty_dirs(local)
    trials = _records(cfg, local)
    summary = summarize(
        trials,
        name=cfg.name,
        metric=cfg.objective,
        direction=cfg.objective_direction,
        objectives=cfg.objectives,
        algorithm=cfg.search.algorithm,
        expected_trials=cfg.expected_trials(),
        ended=ended,
        environment=(sweepdir.read_environments(local) or [None])[-1],
    )
    warm.mark_origins(cfg, local, summary)
    place.push(sweepdir.write_summary(local, summary))
    if summary["best"] is not None and _keeps_best(cfg, trials, summary["best"]["trial_id"], place):
        from tuner.view.export import write_best

        write_best(place)  # <sweep>/best/: the best trial's best weights
    code = ExitCode.OK
    if summary["status"] == "interrupted":
        code = ExitCode.INTERRUPTED
    elif any(r.status == "ERROR" for r in trials) or summary["best"] is None:
        code = ExitCode.ERRORS
    return SweepOutcome(place.uri, summary, leaderboard(trials, cfg.objectives), int(code))
