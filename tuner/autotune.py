"""`training.autotune`: a sweep's speed settings chosen by measuring them (torch- and Ray-free).

Before the first trial, short *arms* of one configuration run on the trials' kind of device:
each builds the trial afresh (same seed, so the same weights and the same batches) with one
setting changed, and trains a few steps. The reference arm comes first: fp32, eager, the
file's other settings. Then each setting's other values are tried on top of the best arm so
far, one setting after another (`DIMENSIONS` order), so the arms are the sum of the settings'
values, not their product.

An arm is read at its steady rate, the rate a trial then trains at: after `WARMUP_STEPS` that
pay for compiling, cuDNN's benchmark and the allocator's growth, the steps the loader's prefetch
buffer holds are taken untimed (while a slow first step ran, its workers filled it: timed, they
read as speed the loader does not have), then a window of whole rounds of the loader's workers,
at least `MIN_STEPS` and long enough that one round's phase moves the rate by less than
`MIN_GAIN`, timed in `SEGMENTS` segments between device synchronisations (a window shorter than
`MIN_WINDOW_S` at the arm's pace is timed again, as many steps longer as it needs; one the
machine slows far past its plan is cut and the window before it kept). The arm's rate is the
median of the segments' (one the machine's other work slowed is left out); their spread, shown
with it, is its noise. A setting moves off its current value only for a gain above `MIN_GAIN`
that the segments bear out: the arm's segments are faster than the best arm's in at least `SURE`
of their pairs (a rank test, as the machine's other work only ever slows a segment, by any
amount). An arm chosen over the reference is then measured once more beside it (the reference,
then the choice): the choice stands, and its printed gain is taken, only on both windows of each
(`pooled`), so that the load of the moment one arm ran does not pass for a setting's gain. A DDP
or FSDP trial's arm runs one rank's share of the batch with the trial's strategy (on a process
group of one), so its samples/s are one rank's. Its loss after the first `LOSS_AT` steps (the
same batches in every arm) is compared with the reference's: one off by more than
`LOSS_TOLERANCE` (relative) is refused however fast it is (AMP can hurt what a trial learns), as
is one that fails (out of memory, a compile error). The choice is the fastest arm that passes.

Cost: measuring stops at the sweep's budget (`training.autotune: true` is `DEFAULT_BUDGET_S`
seconds, a number is its own budget): no arm starts after it is spent and a running arm stops
its timed steps there (one step in progress, a compile, can overrun it). What it cost is
printed and written with the table.

Model sizes: the space's configurations differ in speed where they differ in size. Where the
sizes it can produce (the searched model parameters with a finite set of values, and
batch_size, micro_batch) number at most `MAX_SIZES`, each is tuned; otherwise the largest
(`packing.probe_config`, the memory probe's configuration) is, and its choice applies to
every trial. Each size is measured at the largest values of the rest of the space, so the
loss guard sees the highest learning rate it can draw.

Cache: a choice is kept in `<cache>/autotune.json` under (model fingerprint, device name,
torch version, GPU driver) with the time it was measured, and reused by a later sweep of the
same model on the same device, torch and driver, at no cost; any of them changed, it is
measured again. The fingerprint covers the task (model, data, the user modules' contents), the
measured configuration, the trial's workers and strategy, the settings measured and the rules
they were measured by (`METHOD` among them: a choice measured by an older rule is not reused).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import product
from typing import Any, Optional

from tuner import catalogue, packing
from tuner.space.constraints import allows
from tuner.space.params import Fixed, ParamT, values_of

# `training.autotune: true`: seconds of measuring per sweep, all sizes together.
DEFAULT_BUDGET_S = 300
# Most model sizes tuned one by one; beyond it only the largest is.
MAX_SIZES = 3
# Steps before anything is timed (compiling, cuDNN's benchmark, the allocator's growth).
WARMUP_STEPS = 3
# The timed window: at least this many steps, in this many segments (the rate is their
# median, the spread their scatter).
MIN_STEPS = 32
SEGMENTS = 8
# And at least this many seconds: a window of a few milliseconds (a small model on a CPU)
# reads the machine's scheduling hiccups, not the arm. A shorter one is timed again, longer.
MIN_WINDOW_S = 1.0
# Most timed steps an arm runs in one window.
MAX_STEPS = 65536
# The loss compared: the mean of steps LOSS_AT - LOSS_STEPS .. LOSS_AT of every arm (the same
# batches in every arm, whatever its window).
LOSS_STEPS = 5
LOSS_AT = WARMUP_STEPS + MIN_STEPS
# Relative difference from the reference arm's loss that an arm may show.
LOSS_TOLERANCE = 0.05
# A setting moves off its current value only for more than this gain in samples/s, and only
# where the arm's segments beat the best arm's in at least this share of their pairs (for 8
# segments each, one-sided Mann-Whitney at about 5%).
MIN_GAIN = 0.03
SURE = 0.75
# How arms are measured: a choice cached under another method is measured again. "steady":
# the loader's buffer left out, windows of whole loader rounds (issue 49; before it, 20 steps
# read the prefetch buffer as speed).
METHOD = "steady-1"
# The settings measured, in the order tried. The input pipeline first: while it cannot keep
# up, every compute setting measures the loader's rate (H200, ViT-S/16 at 224 px, 3 loader
# workers: the reference 2386 samples/s, bf16 2685, fp16 3209, so fp16 was kept, though bf16
# is 27% faster than fp16 when fed from memory; 8 workers then gave 5311; BENCHMARKS.md).
DIMENSIONS = ("loader_workers", "amp", "compile", "channels_last", "threads")
# Model parameters that do not change speed (dropout) are no size.
NOT_SIZES = {"dropout"}
# Training settings that change speed per step and are not measured here.
SIZE_SETTINGS = ("batch_size", "micro_batch")


@dataclass(frozen=True)
class Dimension:
    """One setting measured: its values, the reference's first."""

    name: str
    values: tuple[Any, ...]


@dataclass
class Measurement:
    """What one arm measured (the trial side fills it in)."""

    samples_per_s: float = 0.0
    loss: float = math.nan
    seconds: float = 0.0  # the arm's own cost: build, warm-up, timed steps
    error: Optional[str] = None  # failed (out of memory, compile error), or stopped at the budget
    spread: float = 0.0  # the segments' scatter around the rate, relative to it: its noise
    steps: int = 0  # timed steps
    segments: list[float] = field(default_factory=list)  # each segment's samples/s


# (settings of the arm, seconds of budget left) -> what it measured
Measure = Callable[[dict[str, Any], float], Measurement]


@dataclass
class Arm:
    """One arm: the settings it ran, what changed from the best before it, what it measured."""

    settings: dict[str, Any]
    change: str  # "reference" or "compile=True"
    measured: Optional[Measurement] = None  # None: not run (budget spent)
    verdict: str = ""


@dataclass
class Result:
    """One configuration's arms and the choice."""

    choice: dict[str, Any]
    arms: list[Arm]
    seconds: float  # measuring cost (0 when reused from the cache)
    budget_s: float
    speedup: float  # the choice's samples/s over the reference's
    device: str = ""
    torch: str = ""
    measured_on: str = ""  # date and time (UTC), for the cached choice's line
    driver: str = ""  # the GPU driver's version ("" on CPU)
    cached: bool = False
    note: str = ""  # why nothing was chosen (the reference arm failed), if so

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Result:
        arms = []
        for a in raw.get("arms", []):
            m = a.get("measured")
            arms.append(Arm(dict(a["settings"]), a["change"], _measurement(m) if m else None, a["verdict"]))
        fields = {k: v for k, v in raw.items() if k != "arms" and k in cls.__dataclass_fields__}
        return cls(**{**fields, "arms": arms})


def _measurement(raw: Mapping[str, Any]) -> Measurement:
    # Strict JSON keeps a NaN loss as the string "NaN": float() reads it back.
    numbers = {k: float(raw[k]) for k in ("samples_per_s", "loss", "seconds", "spread") if k in raw}
    segments = [float(r) for r in raw.get("segments") or []]
    return Measurement(**numbers, steps=int(raw.get("steps", 0)), segments=segments, error=raw.get("error"))


class AutotuneError(RuntimeError):
    """The reference arm itself failed: there is nothing to compare the others with."""


def search(
    dimensions: Sequence[Dimension],
    measure: Measure,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Result:
    """Measure the reference arm, then each dimension's other values on top of the best so far;
    the fastest arm within the loss guard is the choice (see the module's docstring)."""
    t0 = clock()
    reference = {d.name: d.values[0] for d in dimensions}
    first = measure(dict(reference), budget_s)
    if first.error is not None or not math.isfinite(first.loss) or first.samples_per_s <= 0:
        why = first.error or f"loss {first.loss}, {first.samples_per_s} samples/s"
        raise AutotuneError(f"the reference arm ({_describe(reference)}) failed: {why}")
    arms = [Arm(dict(reference), "reference", first, "reference")]
    best = arms[0]
    tried: set[str] = set()  # settings with another value measured: only they are chosen
    for d in dimensions:
        for value in d.values[1:]:
            settings = {**best.settings, d.name: value}
            arm = Arm(settings, f"{d.name}={_show(value)}")
            arms.append(arm)
            left = budget_s - (clock() - t0)
            if left <= 0:
                arm.verdict = "not run: budget spent"
                continue
            arm.measured = measure(dict(settings), left)
            tried.add(d.name)
            arm.verdict = judge(arm.measured, first, best.measured)
            if arm.verdict == "faster":
                best = arm
    for arm in arms[1:]:
        if arm.verdict == "faster" and arm is not best:
            arm.verdict = "faster, then overtaken"
    speedup = best.measured.samples_per_s / first.samples_per_s  # type: ignore[union-attr]
    if best is not arms[0] and budget_s - (clock() - t0) > 0:
        best, speedup = _again(arms, best, measure, lambda: budget_s - (clock() - t0))
    best.verdict = "chosen"
    # A setting none of whose other values ran (the budget) keeps the file's value, not the
    # reference's: fp32 is the reference, not a choice nobody measured against.
    choice = {k: v for k, v in best.settings.items() if k in tried}
    return Result(choice=choice, arms=arms, seconds=clock() - t0, budget_s=budget_s, speedup=speedup)


def _again(arms: list[Arm], best: Arm, measure: Measure, left: Callable[[], float]) -> tuple[Arm, float]:
    """The reference and the best arm measured once more, one after the other, and each
    judged on both its windows (`pooled`): arms measured a minute apart compare the machine's
    moments as much as their settings, and the printed gain is the trials' promise. The best
    arm stays the choice only if its gain holds; the best arm and the gain (pooled figures)."""
    reference = arms[0]
    again = []
    for arm in (reference, best):
        row = Arm(dict(arm.settings), f"{arm.change}, again")
        arms.append(row)
        if left() <= 0:
            row.verdict = "not run: budget spent"
            return best, best.measured.samples_per_s / reference.measured.samples_per_s  # type: ignore[union-attr]
        row.measured = measure(dict(arm.settings), left())
        row.verdict = "measured again"
        if row.measured.error is not None:
            row.verdict = f"failed: {row.measured.error}"
            return best, best.measured.samples_per_s / reference.measured.samples_per_s  # type: ignore[union-attr]
        again.append(row.measured)
    ref_all = pooled(reference.measured, again[0])  # type: ignore[arg-type]
    best_all = pooled(best.measured, again[1])  # type: ignore[arg-type]
    verdict = judge(best_all, ref_all, ref_all)
    if verdict != "faster":
        best.verdict = f"not borne out measured again ({verdict})"
        return reference, 1.0
    return best, best_all.samples_per_s / ref_all.samples_per_s


def pooled(a: Measurement, b: Measurement) -> Measurement:
    """One arm's two windows as one: the median of all their segments (the mean of the two
    rates where there are none), their spread, steps and seconds together; the first's loss."""
    segments = [*a.segments, *b.segments]
    if not segments:
        rate = (a.samples_per_s + b.samples_per_s) / 2
        return Measurement(rate, a.loss, a.seconds + b.seconds, spread=max(a.spread, b.spread))
    ordered = sorted(segments)
    rate = statistics.median(ordered)
    spread = (ordered[-2] - ordered[1]) / 2 / rate if len(ordered) > 3 else 0.0
    return Measurement(
        rate, a.loss, a.seconds + b.seconds, spread=spread, steps=a.steps + b.steps, segments=segments
    )


def judge(m: Measurement, reference: Measurement, best: Optional[Measurement]) -> str:
    """'faster' when `m` passes the loss guard and beats `best` by more than MIN_GAIN, borne out
    by its segments (`beats`); else why not."""
    if m.error is not None:
        return f"failed: {m.error}"
    off = loss_off(m.loss, reference.loss)
    if off is None or off > LOSS_TOLERANCE:
        shown = "not finite" if off is None else f"{off:.1%} off the reference's"
        return f"refused: loss {m.loss:.4g} {shown} (tolerance {LOSS_TOLERANCE:.0%})"
    assert best is not None
    if m.samples_per_s > best.samples_per_s * (1 + MIN_GAIN):
        share = beats(m.segments, best.segments)
        if share >= SURE:
            return "faster"
        return f"within the noise: its segments beat the best's in {share:.0%} of pairs (needs {SURE:.0%})"
    if m.samples_per_s < best.samples_per_s * (1 - MIN_GAIN):
        return "slower"
    return f"within {MIN_GAIN:.0%}: not worth a change"


def beats(these: Sequence[float], those: Sequence[float]) -> float:
    """The share of pairs (one of `these`, one of `those`) in which the first is the larger (ties
    count half): Mann-Whitney's U over the pairs. 1.0 where either has no segments (figures
    measured whole, or given)."""
    if not these or not those:
        return 1.0
    wins = sum((a > b) + 0.5 * (a == b) for a in these for b in those)
    return wins / (len(these) * len(those))


def loss_off(loss: float, reference: float) -> Optional[float]:
    """Relative difference of `loss` from the reference's; None when it is not finite."""
    if not math.isfinite(loss):
        return None
    return abs(loss - reference) / max(abs(reference), 1e-12)


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _describe(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_show(v)}" for k, v in settings.items())


# ----------------------------------------------------------------------------- what is measured


def dimensions(
    searched: Iterable[str],
    fixed: Mapping[str, Any],
    *,
    cuda: bool,
    images: bool,
    in_memory: bool,
    cpus: int,
    bf16: bool = True,
) -> list[Dimension]:
    """The settings worth measuring on this device, each with more than one value.

    `searched`: names search.params searches (never overridden); `fixed`: the trial's other
    training values (loader_workers' reference is the file's). Only what can differ here:
    amp on CUDA (bf16 where the GPU has it), channels_last for image inputs, torch threads on
    CPU (a GPU trial's host threads matter little; the reference is training.threads, else the
    trial's CPUs), DataLoader workers for data not in memory.
    """
    out = []
    threads = int(fixed.get("threads") or cpus)  # the file's training.threads, else the trial's CPUs
    amp = ("off", "bf16", "fp16") if bf16 else ("off", "fp16")
    candidates = {
        "amp": amp if cuda else ("off",),
        "compile": (False, True),
        "channels_last": (False, True) if images else (False,),
        "threads": (threads, cpus, *sorted({max(1, cpus // 2), 1}, reverse=True)) if not cuda else (threads,),
        "loader_workers": _workers(int(fixed.get("loader_workers") or 0), cpus) if not in_memory else (0,),
    }
    skip = set(searched)
    for name in DIMENSIONS:
        values = tuple(dict.fromkeys(candidates[name]))
        if name not in skip and len(values) > 1:
            out.append(Dimension(name, values))
    return out


def _workers(current: int, cpus: int) -> tuple[int, ...]:
    """DataLoader workers to try: the file's, and around the trial's CPUs (one stays for the loop)."""
    return (current, max(1, cpus - 1), max(1, cpus // 2), 2 * cpus)


# ----------------------------------------------------------------------------- model sizes


def size_names(
    params: Mapping[str, ParamT], model: Optional[str], training_fields: Iterable[str]
) -> list[str]:
    """The searched parameters that make one trial's model (or its step) larger than another's:
    a built-in model's sizes (not its dropout), any other searched value of a user model that
    is not a training setting and not a float, and batch_size / micro_batch."""
    training = set(training_fields)
    known = catalogue.MODELS.get(model or "")
    out = []
    for name, param in params.items():
        if isinstance(param, Fixed) or name in NOT_SIZES:
            continue
        if name in SIZE_SETTINGS:
            out.append(name)
        elif name in training:
            continue
        elif known is not None:
            if name in known:
                out.append(name)
        elif _whole_numbers(param):
            out.append(name)
    return out


def _whole_numbers(param: ParamT) -> bool:
    listed = values_of(param)
    if listed is None:
        return getattr(param, "type", "") in ("randint", "lograndint")
    return all(isinstance(v, int) and not isinstance(v, bool) for v in listed)


@dataclass
class SizePlan:
    """The configurations measured, one per size (each a whole configuration of the space)."""

    by: list[str]  # the size parameters
    configs: list[dict[str, Any]]
    note: str  # how the sizes were chosen, for the printed line


def plan_sizes(params: dict[str, ParamT], constraints: Sequence[str], by: list[str]) -> SizePlan:
    """Each size the space can produce, where they are at most MAX_SIZES; else the largest."""
    largest = packing.probe_config(params, constraints)
    largest.pop("find_batch_size", None)
    if not by:
        return SizePlan([], [largest], "one model size")
    listed = [values_of(params[n]) for n in by]
    if all(v is not None for v in listed):
        combos = [dict(zip(by, c, strict=True)) for c in product(*listed)]  # type: ignore[arg-type]
        sizes = [c for c in combos if allows(constraints, {**largest, **c})]
        if 0 < len(sizes) <= MAX_SIZES:
            return SizePlan(by, [{**largest, **s} for s in sizes], f"{len(sizes)} model sizes, each")
        count = f"{len(sizes)} model sizes"
    else:
        count = "model sizes from a range"
    return SizePlan(by, [largest], f"{count}: more than {MAX_SIZES}, so the largest, for all")


def size_key(config: Mapping[str, Any], by: Sequence[str]) -> str:
    return json.dumps([config.get(n) for n in by])


@dataclass
class Table:
    """What a sweep's trials run with: the choice per measured size; others take the default."""

    by: list[str]
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)  # size_key -> choice
    default: dict[str, Any] = field(default_factory=dict)  # the largest size's

    def settings_for(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The settings a trial of `config` runs with (its size's choice, else the default)."""
        return dict(self.choices.get(size_key(config, self.by), self.default))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Table:
        return cls(list(raw.get("by") or []), dict(raw.get("choices") or {}), dict(raw.get("default") or {}))


def applied(config: Mapping[str, Any], table: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """A trial's configuration as it runs: `config` with the choice for its size from `table`
    (a Table as JSON, the trial spec's; None: autotune off). The table holds no setting
    search.params searches (those are never measured), so a searched value stays the trial's."""
    if not table:
        return dict(config)
    return {**config, **Table.from_json(table).settings_for(config)}


def table_of(plan: SizePlan, results: Sequence[Result]) -> Table:
    """The table of measured sizes; the default is the largest's (the first, or the only)."""
    choices = {size_key(c, plan.by): r.choice for c, r in zip(plan.configs, results, strict=True)}
    return Table(plan.by, choices, dict(results[_largest_index(plan)].choice))


def _largest_index(plan: SizePlan) -> int:
    """The configuration with the most of each size (by sum of ranks; patch_size the other way)."""
    if len(plan.configs) == 1:
        return 0

    def rank(config: dict[str, Any]) -> tuple[float, ...]:
        values = []
        for n in plan.by:
            v = config.get(n)
            number = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0
            values.append(-number if n in packing.SMALLER_IS_LARGER else number)
        return tuple(values)

    return max(range(len(plan.configs)), key=lambda i: rank(plan.configs[i]))


# ----------------------------------------------------------------------------- the cache


def fingerprint(
    task: Mapping[str, Any],
    config: Mapping[str, Any],
    dims: Sequence[Dimension],
    workers: int = 1,
    strategy: str = "ddp",
) -> str:
    """The model fingerprint of one measured configuration: the task (its fields and user
    modules' hashes), the configuration without the measured settings, the trial's workers
    (and their strategy, with several: each rank's batch and wrapper are what is measured),
    the settings measured and the rules they were measured by."""
    measured = {d.name for d in dims}
    payload = {
        "task": task,
        "config": {k: v for k, v in sorted(config.items()) if k not in measured},
        "workers": [workers, strategy if workers > 1 else None],
        "dimensions": [[d.name, list(d.values)] for d in dims],
        "rules": [
            *(METHOD, WARMUP_STEPS, MIN_STEPS, SEGMENTS, MIN_WINDOW_S),
            *(LOSS_AT, LOSS_STEPS, LOSS_TOLERANCE, MIN_GAIN, SURE),
        ],
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def where_measured(device: str, torch_version: str, driver: str = "") -> str:
    """The cache's second key: a choice holds for one device, torch and GPU driver."""
    return f"{device} | torch {torch_version}" + (f" | driver {driver}" if driver else "")


class Cache:
    """Choices by model fingerprint, then by device, torch version and driver, in one JSON file."""

    def __init__(self, path: str):
        self.path = path

    def entries(self, key: str) -> dict[str, dict[str, Any]]:
        """Every (device, torch) -> result recorded for the model fingerprint `key`."""
        found = self.all().get(key)
        return dict(found) if isinstance(found, dict) else {}

    def put(self, key: str, result: Result) -> None:
        if result.cached:
            return
        data = self.all()
        data.setdefault(key, {})[where_measured(result.device, result.torch, result.driver)] = (
            result.to_json()
        )
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)  # a reader never sees half a file

    def all(self) -> dict[str, Any]:
        """Every entry: model fingerprint -> (device, torch) -> result."""
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}  # none yet, or damaged: measured again and rewritten
        return data if isinstance(data, dict) else {}


def reuse(
    entries: Mapping[str, Mapping[str, Any]], device: str, torch_version: str, driver: str = ""
) -> Optional[Result]:
    """The cached result for this device, torch and driver, marked as reused (no cost this time)."""
    raw = entries.get(where_measured(device, torch_version, driver))
    if raw is None:
        return None
    try:
        result = Result.from_json(raw)
    except (KeyError, TypeError, ValueError):
        return None  # an entry of another version of this file: measured again
    result.cached, result.seconds = True, 0.0
    return result


# ----------------------------------------------------------------------------- what is shown


def summary_line(result: Result, label: str) -> str:
    """One printed line per measured size: the choice, its gain, what it cost."""
    if result.note:
        return f"{label}: nothing chosen, the trials run the file's settings ({result.note})"
    changed = {k: v for k, v in result.choice.items() if result.arms and result.arms[0].settings.get(k) != v}
    choice = _describe(changed) if changed else "the reference settings"
    where = f" on {result.device}" if result.device else ""
    if result.cached:
        cost = f"reused from the cache (measured {result.measured_on}{where}), no cost"
    else:
        ran = sum(1 for a in result.arms if a.measured is not None)
        cost = f"{ran} arms in {result.seconds:.1f} s of a {result.budget_s:g} s budget{where}"
        skipped = sum(1 for a in result.arms if a.measured is None)
        if skipped:
            cost += f", {skipped} not run (budget spent)"
    return f"{label}: {choice}, {result.speedup:.2f}x the reference's samples/s; {cost}"


ARM_COLUMNS = ["arm", "samples/s", "spread", "steps", "loss", "seconds", "verdict"]
ARM_NUMBERS = {1, 2, 3, 4, 5}  # the columns of figures (right-aligned)


def arm_rows(result: Result) -> list[list[str]]:
    """One row per arm (ARM_COLUMNS): what it changed, measured (its rate, the spread of its
    segments' rates, its timed steps), and the verdict."""
    rows = []
    for arm in result.arms:
        m = arm.measured
        figures = (
            ["", "", "", "", ""]
            if m is None
            else [
                f"{m.samples_per_s:.1f}",
                f"±{m.spread:.1%}" if m.steps else "",
                str(m.steps) if m.steps else "",
                f"{m.loss:.4g}",
                f"{m.seconds:.1f}",
            ]
        )
        rows.append([arm.change, *figures, arm.verdict])
    return rows


def table_markdown(result: Result) -> str:
    """The arms of one size as a Markdown table."""
    lines = [f"| {' | '.join(ARM_COLUMNS)} |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    return "\n".join([*lines, *(f"| {' | '.join(row)} |" for row in arm_rows(result))])
