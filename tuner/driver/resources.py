"""What each trial asks Ray for, and whether the cluster can ever give it: the preflight.

Ray leaves a trial whose request no node can satisfy PENDING forever; we compare first and
refuse in seconds, naming the request and what the cluster has. `gpus_per_worker: pack`
turns a measured peak into a GPU fraction here (arithmetic in `tuner.packing`).
`precheck_local` runs before a local Ray starts, `resolve` once Ray is up.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Optional

from tuner import autotune, packing
from tuner.cluster import _ray_internals
from tuner.cluster.connect import Runtime
from tuner.config import ConfigError, ResourcesSection, SweepConfig
from tuner.config.modes import MODES
from tuner.space.params import values_of
from tuner.trial.frame.spec import TrialSpec

# A DDP trial's Tune actor only drives its rank actors, which hold the CPUs/GPUs (its own
# request is the placement group's empty head bundle; this is what `describe` and the
# autoscaler's view of a trial count for the actor itself: one byte of memory).
DRIVER_BUNDLE = {"memory": 1}
# Ray gives each node with GPUs one unit of `accelerator_type:<kind>`; asking for a sliver of
# it (as Ray's own accelerator_type option does) keeps a trial on nodes of that kind.
ACCELERATOR = "accelerator_type:"
KIND_SHARE = 0.001


@dataclass(frozen=True)
class TrialResources:
    """The resolved per-trial request."""

    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    bundle: dict[str, float]  # what the Tune trainable itself reserves
    max_concurrent: Optional[int]
    profile: Optional[packing.MemoryProfile] = None  # gpus_per_worker: pack: what the probe saw
    trials_per_gpu: Optional[int] = None
    one_node: bool = False  # several workers, and a node (or node type) can hold them all: packed on one
    accelerator: Optional[str] = None  # resources.accelerator_type: only nodes with this GPU kind
    slots: Optional[int] = None  # trials the cluster holds at once (None: unknown, it may grow)

    def kind(self) -> dict[str, float]:
        """What each worker's request adds for its GPU kind (nothing without one)."""
        return {ACCELERATOR + self.accelerator: KIND_SHARE} if self.accelerator else {}

    def describe(self) -> str:
        gpu = f", {self.gpus_per_worker:g} GPU" if self.gpus_per_worker else ""
        text = f"{self.workers} worker(s) x ({self.cpus_per_worker:g} CPU{gpu})"
        if self.profile is not None:
            text += (
                f" [packed: {self.trials_per_gpu} trials per {self.profile.device_name}, "
                f"largest config peaks at {packing.gib(self.profile.need)}]"
            )
        return text


Probe = Callable[[], packing.MemoryProfile]


def probe_request(section: ResourcesSection) -> TrialResources:
    """What the probe of `gpus_per_worker: pack` runs with: one worker on a whole GPU."""
    return TrialResources(
        workers=1, cpus_per_worker=section.cpus_per_worker, gpus_per_worker=1.0, bundle={}, max_concurrent=1
    )


def plan(
    section: ResourcesSection,
    cluster: dict[str, float],
    nodes: list[dict[str, float]],
    node_groups: Optional[list[tuple[dict[str, float], int]]] = None,
    probe: Optional[Probe] = None,
) -> TrialResources:
    """Resolve `gpus_per_worker` (auto, pack or a number), the Tune bundle and concurrency.

    `cluster` is `ray.cluster_resources()`; `nodes` the resources of each alive node;
    `node_groups` the (resources, max nodes) an autoscaler may add, None on a fixed cluster;
    `probe` measures the largest configuration on one GPU (called only for `pack`).
    """
    kind = section.accelerator_type
    cluster, nodes, node_groups = _of_kind(kind, cluster, nodes, node_groups)
    gpus = section.gpus_per_worker
    if gpus == "pack":
        return replace(_packed(section, cluster, nodes, probe), accelerator=kind)
    if gpus == "auto":
        gpus = 1.0 if cluster.get("GPU", 0) > 0 else 0.0
    gpus = float(gpus)
    res = TrialResources(
        workers=section.workers_per_trial,
        cpus_per_worker=section.cpus_per_worker,
        gpus_per_worker=gpus,
        bundle=_bundle(section, gpus),
        max_concurrent=section.max_concurrent_trials,
        accelerator=kind,
    )
    if not node_groups:
        check_feasible(res, cluster, nodes)
    else:
        check_scalable(res, node_groups)
    if res.workers > 1:
        res = replace(res, one_node=fits_one_node(res, [r for r, _ in node_groups or []] or nodes))
    if res.max_concurrent is None and res.workers > 1:
        # Tune would start every DDP driver at once (they are nearly free) and leave their
        # Train runs waiting on each other for workers; bound them by what fits.
        res = replace(res, max_concurrent=_fit_count(res, cluster))
    return res


def _of_kind(
    kind: Optional[str],
    cluster: dict[str, float],
    nodes: list[dict[str, float]],
    node_groups: Optional[list[tuple[dict[str, float], int]]],
) -> tuple[dict[str, float], list[dict[str, float]], Optional[list[tuple[dict[str, float], int]]]]:
    """The cluster as a trial of GPU kind `kind` sees it: the nodes (and node types an
    autoscaler may add) with that kind, their resources summed; all of it without a kind.
    A kind that none has is refused, naming the kinds there are."""
    if kind is None:
        return cluster, nodes, node_groups
    key = ACCELERATOR + kind
    mine = [n for n in nodes if n.get(key, 0) > 0]
    groups = [(r, c) for r, c in node_groups or [] if r.get(key, 0) > 0]
    if not mine and not groups:
        there = _kinds([*nodes, *(r for r, _ in node_groups or [])])
        raise ConfigError(
            "resources.accelerator_type",
            f"no node has {kind} GPUs (this cluster's: {', '.join(there) or 'none'}); "
            "Ray names the kinds as in ray.util.accelerators",
        )
    total: dict[str, float] = {}
    for n in mine:
        for k, v in n.items():
            total[k] = total.get(k, 0.0) + v
    return total, mine, groups or None


def _kinds(nodes: list[dict[str, float]]) -> list[str]:
    """The GPU kinds of `nodes`, as Ray names them."""
    return sorted({k[len(ACCELERATOR) :] for n in nodes for k in n if k.startswith(ACCELERATOR)})


def _packed(
    section: ResourcesSection,
    cluster: dict[str, float],
    nodes: list[dict[str, float]],
    probe: Optional[Probe],
) -> TrialResources:
    path = "resources.gpus_per_worker"
    if cluster.get("GPU", 0) <= 0:
        raise ConfigError(
            path,
            f"pack measures trials on a GPU, but the cluster has none ({_describe(cluster)}); use 0 or auto",
        )
    kinds = _kinds([n for n in nodes if n.get("GPU", 0) > 0])
    if len(kinds) > 1:
        # One probe on one GPU sizes the share of every GPU: right only for GPUs alike.
        raise ConfigError(
            path,
            f"pack measures one GPU and shares every GPU alike, but this cluster has {', '.join(kinds)}: "
            "set resources.accelerator_type to one of them",
        )
    assert probe is not None, "gpus_per_worker: pack needs a probe"
    try:
        profile = probe()
    except Exception as err:  # noqa: BLE001 - any failure of the probe is the user's config's
        # Ray wraps a task's error in its traceback; the last line is the error itself.
        last = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        raise ConfigError(
            path, f"pack: the memory probe of the largest configuration failed: {last}"
        ) from None
    try:
        fit = packing.pack(profile, section.gpu_memory_margin, section.max_trials_per_gpu)
    except packing.NoFit as err:
        raise ConfigError(
            path, f"pack: {err}; shrink the space, lower batch_size or micro_batch, or use fsdp"
        ) from None
    res = TrialResources(
        workers=1,
        cpus_per_worker=section.cpus_per_worker,
        gpus_per_worker=fit.fraction,
        bundle=_bundle(section, fit.fraction),
        max_concurrent=section.max_concurrent_trials
        or packing.concurrency(fit.trials_per_gpu, cluster.get("GPU", 0)),
        profile=profile,
        trials_per_gpu=fit.trials_per_gpu,
    )
    check_feasible(res, cluster, nodes)
    return res


def _bundle(section: ResourcesSection, gpus: float) -> dict[str, float]:
    if section.workers_per_trial > 1:
        return dict(DRIVER_BUNDLE)
    bundle = {"cpu": section.cpus_per_worker}
    if gpus:
        bundle["gpu"] = gpus
    if section.accelerator_type:  # (Tune takes the other keys of this dict as custom resources)
        bundle[ACCELERATOR + section.accelerator_type] = KIND_SHARE
    return bundle


def _fit_count(res: TrialResources, cluster: dict[str, float]) -> int:
    per_trial = {"CPU": res.workers * res.cpus_per_worker, "GPU": res.workers * res.gpus_per_worker}
    counts = [math.floor(cluster.get(k, 0) / v + 1e-9) for k, v in per_trial.items() if v > 0]
    return max(1, min(counts)) if counts else 1


def check_feasible(res: TrialResources, cluster: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """Raise ConfigError when no trial could ever be scheduled on this cluster.

    Every worker must fit on one node, and all workers of a trial in the cluster at once.
    """
    have = _describe(cluster)
    if res.gpus_per_worker > 0 and cluster.get("GPU", 0) <= 0:
        raise ConfigError(
            "resources.gpus_per_worker",
            f"asks for {res.gpus_per_worker:g} GPU per worker but the cluster has no GPU ({have}); "
            "use gpus_per_worker: 0 or auto",
        )
    need = {"CPU": res.cpus_per_worker, "GPU": res.gpus_per_worker}
    if nodes and not any(all(n.get(k, 0) >= v for k, v in need.items() if v) for n in nodes):
        biggest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)))
        raise ConfigError(
            "resources",
            f"one worker needs {_describe(need)} but the largest node has {_describe(biggest)}",
        )
    total = {k: v * res.workers for k, v in need.items()}
    short = [k for k, v in total.items() if v and cluster.get(k, 0) < v]
    if short:
        raise ConfigError(
            "resources.workers_per_trial",
            f"a trial needs {res.describe()} = {_describe(total)} but the cluster has {have}",
        )


def check_scalable(res: TrialResources, node_groups: list[tuple[dict[str, float], int]]) -> None:
    """On an autoscaling cluster, refuse only what no node the autoscaler may add can hold;
    say that the rest will wait for the cluster to grow."""
    need = {"CPU": res.cpus_per_worker, "GPU": res.gpus_per_worker}
    fits = [(r, n) for r, n in node_groups if all(r.get(k, 0) >= v for k, v in need.items() if v)]
    if not fits:
        largest = max((r for r, _ in node_groups), key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)))
        raise ConfigError(
            "resources",
            f"one worker needs {_describe(need)}; no node type of this autoscaling cluster has that "
            f"(largest: {_describe(largest)})",
        )
    print(
        f"[tuner] autoscaling cluster: trials needing {res.describe()} wait until it scales up",
        flush=True,
    )


def _describe(resources: dict[str, Any]) -> str:
    parts = [f"{resources.get(k, 0):g} {k}" for k in ("CPU", "GPU") if k == "CPU" or resources.get(k)]
    return ", ".join(parts)


def check_amp(amp_values: list[Any], gpus_per_worker: float, path: str) -> None:
    """fp16 needs a CUDA GPU; refuse it before any trial fails on it."""
    if gpus_per_worker == 0 and "fp16" in amp_values:
        raise ConfigError(path, "fp16 needs a GPU, and trials get none here; use bf16, off or auto")


def local_resources(num_cpus: Optional[int] = None) -> dict[str, float]:
    """What a local Ray started here will have, known before starting it (so an impossible
    request is refused in a second, not after Ray's start-up): CPUs, and GPUs counted as Ray
    counts them (NVML, limited by CUDA_VISIBLE_DEVICES)."""
    return {"CPU": float(num_cpus or os.cpu_count() or 1), "GPU": float(_visible_gpus())}


def _visible_gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU
        return 0
    if visible:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


# ----------------------------------------------------------------------------- preflight


def precheck_local(cfg: SweepConfig, runtime: Runtime) -> None:
    """When we are about to start our own local Ray, refuse an impossible request first."""
    if runtime.joins_cluster():
        return
    have = local_resources(runtime.num_cpus)
    if have["GPU"] and (cfg.resources.gpus_per_worker == "pack" or cfg.resources.accelerator_type):
        # Measuring the largest configuration, or the GPU's kind as Ray names it, needs Ray:
        # checked after start-up.
        return
    plan(cfg.resources, have, [have])


# training.autotune's choice for trials of the given resources (its table as JSON; None: off).
Tune = Callable[[TrialResources], Optional[dict[str, Any]]]


def resolve(cfg: SweepConfig, tune: Optional[Tune] = None) -> TrialResources:
    """The per-trial request on the cluster Ray is connected to; a ConfigError if no trial
    could ever run there (called before anything is written, bar autotune's table, which
    `gpus_per_worker: pack` makes first: see `pack_probe`)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    groups = _ray_internals.autoscaler_node_groups()
    res = plan(cfg.resources, ray.cluster_resources(), nodes, groups, probe=pack_probe(cfg, tune))
    if cfg.trial_mode.reads_training:
        amp = cfg.hyperparameters()["amp"]
        path = "search.params.amp" if "amp" in cfg.search.params else "training.amp"
        check_amp(values_of(amp) or [], res.gpus_per_worker, path)
    if cfg.trial_mode.actor_holds_workers:
        res = _one_actor(res, [] if groups else _of_kind(res.accelerator, {}, nodes, None)[1])
    return res if groups else replace(res, slots=slots(res, ray.cluster_resources()))


def slots(res: TrialResources, cluster: dict[str, float]) -> int:
    """How many trials `cluster` (its totals) holds at once, at most res.max_concurrent; at
    least 1. (An upper bound where nodes are uneven: what is asked for beyond it waits.)"""
    fit = _fit_count(res, cluster)
    return min(fit, res.max_concurrent or fit)


def import_path(dirs: list[str]) -> str:
    """Trials' search path (os.pathsep-joined): each directory, and, for one inside the
    driver's working directory, its relative form too, which a trial on another node
    resolves in its own copy of the job's working directory (`ray job submit --working-dir`)."""
    here = os.getcwd()
    paths = list(dirs)
    for d in dirs:
        if d == here or d.startswith(here + os.sep):
            paths.append(os.path.relpath(d, here))
    return os.pathsep.join(paths)


def _all_workers(res: TrialResources) -> dict[str, float]:
    return {"CPU": res.workers * res.cpus_per_worker, "GPU": res.workers * res.gpus_per_worker}


def fits_one_node(res: TrialResources, nodes: list[dict[str, float]]) -> bool:
    """Whether one of `nodes` (resources) can hold all of a trial's workers at once."""
    return any(all(n.get(k, 0) >= v for k, v in _all_workers(res).items() if v) for n in nodes)


def tune_request(res: TrialResources, spec: TrialSpec) -> Any:
    """What Tune reserves for each trial: the trial actor's bundle; for a DDP trial, whose
    actor starts its own workers (trial/launch/ranks.py), a placement group of one bundle per
    worker, the actor itself in an empty head bundle (Tune puts it in the first, with rank 0):
    all on one node when a node holds them all (`one_node`), else on as few nodes as can."""
    if MODES[spec.trial_mode].in_actor(spec.workers):
        return res.bundle
    from ray import tune

    worker = {"CPU": res.cpus_per_worker} | ({"GPU": res.gpus_per_worker} if res.gpus_per_worker else {})
    worker |= res.kind()
    strategy = "STRICT_PACK" if res.one_node else "PACK"
    return tune.PlacementGroupFactory([{}] + [worker] * res.workers, strategy=strategy)


def _one_actor(res: TrialResources, nodes: list[dict[str, float]]) -> TrialResources:
    """A mode whose trial actor itself holds every worker's CPUs and GPUs (a script: torchrun
    runs all of its processes there): they must fit on one node."""
    bundle = _all_workers(res)
    if res.workers > 1 and nodes and not fits_one_node(res, nodes):
        raise ConfigError(
            "resources.workers_per_trial",
            f"torchrun runs a trial's {res.workers} workers on one node, and no node has "
            f"{bundle['CPU']:g} CPUs and {bundle['GPU']:g} GPUs",
        )
    one = {"cpu": bundle["CPU"]} | ({"gpu": bundle["GPU"]} if bundle["GPU"] else {}) | res.kind()
    return replace(res, bundle=one)


def trial_spec(cfg: SweepConfig, res: TrialResources, storage: str, sweep_dir: Optional[str]) -> TrialSpec:
    """What every trial of the sweep is told besides its configuration."""
    return TrialSpec(
        trial_mode=cfg.trial_mode.name,
        model=cfg.task.model or "",
        data=cfg.task.data or "",
        data_args=dict(cfg.task.data_args),
        train=cfg.task.train,
        command=cfg.task.command,
        launcher=cfg.task.launcher,
        command_params=tuple(cfg.search.params),
        exit_grace=cfg.task.exit_grace,
        loss=cfg.task.loss,
        metrics=cfg.task.metrics,
        max_epochs=cfg.schedule.max_epochs,
        metric=cfg.objective,
        direction=cfg.objective_direction,
        also=tuple(name for name, _ in cfg.objectives[1:]),
        workers=res.workers,
        cpus_per_worker=res.cpus_per_worker,
        gpus_per_worker=res.gpus_per_worker,
        strategy=cfg.resources.strategy,
        gpu_memory_margin=cfg.resources.gpu_memory_margin,
        gpu_context_bytes=res.profile.context if res.profile else None,
        max_failures=cfg.failure.max_failures,
        oom_retries=cfg.failure.oom_retries,
        keep_checkpoints=cfg.failure.keep_checkpoints,
        trial_timeout=cfg.schedule.trial_timeout,
        search_path=import_path(cfg.code_dirs),
        start_dir=os.getcwd(),
        storage=storage,
        sweep_dir=sweep_dir,
        perturbed=tuple(cfg.schedule.pbt.perturb or ()) if cfg.scheduler.clones else (),
    )


def pack_probe(cfg: SweepConfig, tune: Optional[Tune] = None) -> Probe:
    """The memory probe of `gpus_per_worker: pack`, with the settings the trials will run:
    training.autotune's choice (`tune`) is made first, on the probe's whole GPU, and applied
    to the largest configuration. Probed with the file's settings instead, a heavier choice
    (amp off where the file says bf16, channels_last's cuDNN workspaces) would outgrow the
    memory share the probe sized."""

    def probe() -> packing.MemoryProfile:
        table = tune(probe_request(cfg.resources)) if tune is not None else None
        return _probe_memory(cfg, table)

    return probe


def _probe_memory(
    cfg: SweepConfig, table: Optional[dict[str, Any]] = None, timeout_s: float = 900
) -> packing.MemoryProfile:
    """gpus_per_worker: pack: the peak memory of the space's largest configuration (with
    autotune's `table` applied), measured in a Ray task that holds one whole GPU (nothing else
    runs on it meanwhile). A failure propagates; `plan` reports it against the field."""
    spec = trial_spec(cfg, probe_request(cfg.resources), "", None)
    hp = autotune.applied(packing.probe_config(cfg.hyperparameters(), cfg.search.constraints), table)
    kind = {"accelerator_type": cfg.resources.accelerator_type} if cfg.resources.accelerator_type else {}
    profile = run_task(
        _measure, (hp, spec), timeout_s, "the memory probe", num_gpus=1, num_cpus=spec.cpus_per_worker, **kind
    )
    return replace(profile, label=packing.label(hp, cfg.search.params))


# How long a cancelled task may take to end (its worker process killed) before the driver
# goes on without knowing.
CANCEL_WAIT_S = 60.0


def run_task(
    fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float, what: str, **options: Any
) -> Any:
    """`fn(*args)` in a Ray task of `options` (no retries), its result within `timeout_s`; past
    it the task is cancelled, its worker process ended with what it holds (a whole GPU, on a
    cluster: left running, a hung probe or autotune kept it from the trials), and TimeoutError
    names `what`."""
    import ray

    ref = ray.remote(max_retries=0, **options)(fn).remote(*args)
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        pass
    ray.cancel(ref, force=True)
    ray.wait([ref], timeout=CANCEL_WAIT_S)  # (resolved as cancelled once its process is gone)
    raise TimeoutError(f"{what} did not finish within {timeout_s:g} s: cancelled")


def _measure(hp: dict[str, Any], spec: TrialSpec) -> packing.MemoryProfile:
    from tuner.trial.loop.probe import measure  # torch: imported in the task, not in the driver

    return measure(hp, spec)
