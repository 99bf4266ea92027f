"""`tuner report`: a sweep directory as report.html (self-contained), report.md and PNGs.

Works on a finished, running or interrupted sweep (see `tuner.view.analysis`). Sections: the best
trial and the command that trains it again, the leaderboard, best-so-far against wall-clock
time and as trials finished, learning curves of the top trials, parallel coordinates,
hyperparameter importance (fANOVA), failures by cause, compute accounting (CPU/GPU-seconds), and
the environment the sweep ran on (versions, GPUs, the code's commit); with several objectives,
the Pareto front (drawn, and its trials listed) after the leaderboard; for a population (pbt,
pb2), its lineage and the schedule that trained the best weights.
"""

from __future__ import annotations

import datetime
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from tuner import autotune, environment, history
from tuner.config.schedule import budgets
from tuner.results import (
    Outcome,
    clock,
    config_label,
    counts,
    finite,
    number,
    objective_values,
    pareto,
    ranked,
    short,
    weights_schedule,
)
from tuner.sweepdir import (
    AUTOTUNE_FILE,
    BEST_DIR,
    ENVIRONMENT_FILE,
    EXPORT_FILES,
    SWEEP_RUN,
    check_writable,
    read_autotune,
    read_best_record,
    read_environments,
)
from tuner.view import analysis, document, plots
from tuner.view.analysis import SweepData
from tuner.view.document import Block, Code, Heading, Image, Table, Text

REPORT_HTML, REPORT_MD = "report.html", "report.md"
LEADERBOARD_ROWS = 10
CURVES_TOP = 5


@dataclass
class Written:
    """What `write_report` wrote."""

    html: str
    markdown: str
    images: list[str]


def write_report(sweep_dir: str, out_dir: Optional[str] = None) -> Written:
    """Read `sweep_dir` and write report.html, report.md and the PNGs into `out_dir` (default: it)."""
    data = analysis.load(sweep_dir)
    out = os.path.abspath(out_dir or data.sweep_dir)
    check_writable(out, "--output")
    blocks = build(data, out)
    title = f"Sweep report: {data.cfg.name}"
    markdown = document.to_markdown(title, blocks)
    md_path, html_path = os.path.join(out, REPORT_MD), os.path.join(out, REPORT_HTML)
    with open(md_path, "w") as f:
        f.write(markdown)
    with open(html_path, "w") as f:
        f.write(document.to_html(title, blocks))
    images = [b.path for b in blocks if isinstance(b, Image)]
    return Written(html=html_path, markdown=markdown, images=images)


def build(data: SweepData, out: str) -> list[Block]:
    """The report's blocks; draws its figures into `out` on the way."""
    png = lambda name: os.path.join(out, name)  # noqa: E731 - a one-word helper
    points, running = analysis.best_so_far(data)
    blocks: list[Block] = [Text(_overview(data)), *_best(data), *_leaderboard(data)]
    blocks += _pareto(data, png("pareto.png"))
    blocks += _population(data, png("lineage.png"), png("schedule.png"))
    blocks += [
        Heading("Best so far"),
        Image(plots.best_so_far(points, running, data.metric, png("best_so_far.png")), "best so far"),
        *_as_trials_finished(data, png("best_by_trials.png")),
        Heading("Learning curves"),
        Image(_curves(data, png("curves.png")), "learning curves"),
        Heading("Hyperparameters vs metric"),
        Image(_parallel(data, png("parallel.png")), "parallel coordinates"),
        *_importance(data, png("importance.png")),
        *_failures(data, png("outcomes.png")),
        *_stopped(data),
        *_origins(data),
        *_compute(data),
        *_autotune(data),
        *_environment(data),
    ]
    return blocks


def _overview(data: SweepData) -> str:
    cfg, res = data.cfg, data.cfg.resources
    ended = ", ".join(f"{n} {k}" for k, n in counts(data.records).items()) or "none yet"
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (
        f"Sweep {data.state}: {len(data.records)} trials ({ended}). {cfg.search.algorithm} search, "
        f"{_objectives(data)}, up to {cfg.schedule.max_epochs} epochs per trial, "
        f"{res.workers_per_trial} worker(s) x {res.cpus_per_worker:g} CPU each. "
        f"Directory: {data.sweep_dir}. Report made {when}."
    )


def _as_trials_finished(data: SweepData, path: str) -> list[Block]:
    """The sweep as its trials finished (tuner.history, as TensorBoard's `sweep` run has it)."""
    points = history.replay(data.records, data.cfg.objectives).points
    dots, steps = history.curve(points, data.metric)
    blocks: list[Block] = [Heading("As trials finished")]
    if points:
        last = points[-1]
        best = last.best.get(data.metric)
        blocks.append(
            Text(
                f"After {last.done} trials finished: best {data.metric} {number(best)}; "
                f"{last.stopped_early} stopped early, {last.failed} failed, {last.running} running; "
                f"{last.epochs} epochs spent. Each trial counts with its best epoch once it has "
                f"finished (TensorBoard's run `{SWEEP_RUN}` has the same points)."
            )
        )
    else:
        blocks.append(Text("No trial has finished yet."))
    xlabel, each = "trials finished", "each trial's best"
    image = plots.best_so_far(dots, steps, data.metric, path, xlabel=xlabel, dots=each)
    return [*blocks, Image(image, "best so far as trials finished")]


def _objectives(data: SweepData) -> str:
    named = ", ".join(f"{n} ({m})" for n, m in data.cfg.objectives)
    return f"objectives {named}" if len(data.cfg.objectives) > 1 else f"metric {named}"


def _pareto(data: SweepData, path: str) -> list[Block]:
    """With several objectives: the front drawn (the first two) and its trials listed."""
    objectives = data.cfg.objectives
    if len(objectives) < 2:
        return []
    ids = set(pareto(data.records, objectives))
    names = [n for n, _ in objectives]
    values = {r.trial_id: v for r in data.records if (v := objective_values(r, names)) is not None}
    front = [r for r in ranked(data.records, data.direction) if r.trial_id in ids]
    image = plots.pareto(
        [(v[0], v[1]) for v in values.values()],
        [(values[r.trial_id][0], values[r.trial_id][1], r.trial_id) for r in front],
        (objectives[0], objectives[1]),
        path,
    )
    rows = [
        [r.trial_id, *(number(r.best_metrics[n]) for n in names), str(r.best_epoch), config_label(r.config)]
        for r in front
    ]
    note = (
        f"{len(front)} of the {len(values)} trials with a value of every objective are on the Pareto "
        "front: no other trial is as good in every objective and better in one. Each trial counts "
        f"with its values at its best epoch of {names[0]}; best {names[0]} first."
    )
    return [
        Heading("Pareto front"),
        Text(note),
        Image(image, "Pareto front"),
        Table(["trial", *names, "epoch", "config"], rows, right=set(range(1, len(names) + 2))),
    ]


def _best(data: SweepData) -> list[Block]:
    top = ranked(data.records, data.direction)
    if not top:
        return [Heading("Best trial"), Text("No trial has produced a usable result yet.")]
    b = top[0]
    config = ", ".join(f"{k}={short(v)}" for k, v in b.config.items())
    others = ", ".join(
        f"{k} {number(v)}"
        for k, v in b.best_metrics.items()
        if k != data.metric and (k.startswith("val_") or k == "train_loss") and finite(v)
    )
    return [
        Heading("Best trial"),
        Text(
            f"Trial {b.trial_id}: {data.metric} {number(b.best_value)} at epoch {b.best_epoch} "
            f"({b.epochs} trained, {b.outcome.value}); {config}."
            + (f" At that epoch: {others}." if others else "")
        ),
        Text(
            "Train this configuration again, alone (run it from the directory the sweep was "
            "started in: relative paths and your own modules resolve from there):"
        ),
        Code(str(analysis.reproduce_command(data))),
        *_best_weights(data, b.trial_id),
    ]


def _best_weights(data: SweepData, trial_id: str) -> list[Block]:
    """Where the best trial's best weights are, when best/ holds them."""
    model = os.path.join(data.sweep_dir, BEST_DIR, EXPORT_FILES["state_dict"])
    if read_best_record(os.path.join(data.sweep_dir, trial_id)) is None or not os.path.isfile(model):
        return []
    return [
        Text(
            "Or use the weights of that epoch, kept: a plain state dict (torch.load, then "
            "load_state_dict), or the model itself from Python (tuner.load_best), or as "
            "TorchScript or ONNX (python -m tuner export --format torchscript|onnx):"
        ),
        Code(model),
    ]


def _population(data: SweepData, lineage_png: str, schedule_png: str) -> list[Block]:
    """A population's lineage (which trial continued from which, when) and the schedule of
    each perturbed parameter that trained the best weights."""
    members = [r for r in data.records if r.schedule is not None]
    top, schedule = ranked(data.records, data.direction), data.cfg.schedule
    if not members or not top:
        return []
    best = top[0]
    trained = weights_schedule(data.records, best, best.best_epoch or best.epochs)
    perturbed = list(data.cfg.schedule.pbt.perturb or [])
    clones = [(r.trial_id, s) for r in members for s in (r.schedule or [])[1:]]
    rows = [
        [
            f"{s['epochs'][0]}-{s['epochs'][1]}",
            s["trial"],
            *(short(s["config"].get(n, "")) for n in perturbed),
        ]
        for s in trained
    ]
    ancestry = {(s["trial"], s["epochs"][0], s["epochs"][1]) for s in trained}
    lines = {
        r.trial_id: [(s["epochs"][0] - 1, s["epochs"][1], s.get("donor")) for s in (r.schedule or [])]
        for r in data.records
    }
    return [
        Heading("Population"),
        Text(
            f"{len(members)} trials, perturbed every {schedule.pbt.every(schedule.max_epochs)} "
            f"epochs: {len(clones)} times a trial continued from another's checkpoint with a perturbed "
            f"configuration ({', '.join(perturbed)}). Each line is a trial's epochs; an arrow, a trial "
            "continuing from another; the best weights' line is drawn thick."
        ),
        Image(plots.lineage(lines, ancestry, lineage_png), "lineage"),
        Text(
            f"The best weights ({best.trial_id}, epoch {best.best_epoch}) were trained by these "
            "configurations, epoch range by range (summary.json's best.schedule):"
        ),
        Table(["epochs", "trial", *perturbed], rows),
        Image(plots.schedule(trained, perturbed, data.cfg.search.params, schedule_png), "schedule"),
    ]


def _leaderboard(data: SweepData) -> list[Block]:
    names = list(data.cfg.search.params)
    others = [n for n, _ in data.cfg.objectives[1:]]
    top = ranked(data.records, data.direction)
    rows = [
        [
            str(i),
            r.trial_id,
            number(r.best_value),
            *(number(r.best_metrics.get(n)) for n in others),  # other objectives, at that epoch
            str(r.best_epoch),
            str(r.epochs),
            _duration(r.time_s),
            r.outcome.value,
            *(short(r.config[n]) if n in r.config else "" for n in names),  # absent: blank
        ]
        for i, r in enumerate(top[:LEADERBOARD_ROWS], 1)
    ]
    headers = ["#", "trial", data.metric, *others, "best epoch", "epochs", "time", "status", *names]
    more = len(top) - len(rows)
    note = f"Top {len(rows)} of {len(top)} trials with a result" + (
        f"; the other {more} are in summary.json." if more else "."
    )
    right = set(range(2, 6 + len(others))) | {0}
    return [Heading("Leaderboard"), Text(note), Table(headers, rows, right=right)]


def _curves(data: SweepData, path: str) -> str:
    top_ids = [r.trial_id for r in ranked(data.records, data.direction)[:CURVES_TOP]]
    series = {t.trial_id: _series(t.history, data.metric) for t in data.records}
    configs = {r.trial_id: {k: r.config.get(k) for k in data.searched()} for r in data.records}
    top = [(f"{tid} " + config_label(configs[tid]), series[tid]) for tid in top_ids if series[tid]]
    others = [s for tid, s in series.items() if tid not in top_ids and s]
    return plots.curves(top, others, data.metric, path)


def _series(history: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    return [
        (int(row["epoch"]), float(row[metric]))
        for row in history
        if "failure" not in row and finite(row.get(metric)) and "epoch" in row
    ]


def _parallel(data: SweepData, path: str) -> str:
    # Trials with a result, and failed ones (drawn apart); running ones with none yet are left out.
    rows = [
        (r.config, None if r.failure else r.best_value)
        for r in data.records
        if r.failure or r.best_value is not None
    ]
    return plots.parallel(data.searched(), rows, data.metric, data.direction, path)


def _importance(data: SweepData, path: str) -> list[Block]:
    scores, method = analysis.importance(data)
    if scores is None:
        return [Heading("Hyperparameter importance"), Text(f"Not computed: {method}.")]
    rows = [[k, f"{v:.3f}"] for k, v in sorted(scores.items(), key=lambda kv: -kv[1])]
    return [
        Heading("Hyperparameter importance"),
        Text(f"Method: {method}"),
        Table(["parameter", "importance"], rows, right={1}),
        Image(plots.importance(scores, path), "hyperparameter importance"),
    ]


def _failures(data: SweepData, path: str) -> list[Block]:
    blocks: list[Block] = [
        Heading("Failures by cause"),
        Image(plots.outcomes(counts(data.records), path), "outcomes"),
    ]
    failed = [r for r in data.records if r.failure]
    early = sum(1 for r in data.records if r.stopped_early)
    unfinished = sum(1 for r in data.records if r.outcome is Outcome.UNFINISHED)
    parts = [
        f"{len(failed)} trial(s) failed (diverged: loss became NaN/inf; oom: out of memory at the "
        "smallest micro-batch; error: an exception, see the trial's error.txt)"
        if failed
        else "No trial failed",
        f"{early} stopped early by the scheduler",
    ]
    itself = sum(1 for r in data.records if r.stopped_itself)
    if itself:
        parts.append(f"{itself} stopped by their own code before max_epochs (its early stopping)")
    if unfinished:
        parts.append(f"{unfinished} unfinished (running now, or cut off when the sweep stopped)")
    blocks.append(Text("; ".join(parts) + "."))
    if failed:
        rows = [
            [
                r.trial_id,
                r.outcome.value,
                str(r.epochs),
                analysis.failure_detail(r),
                config_label(r.config),
            ]
            for r in failed
        ]
        blocks.append(Table(["trial", "cause", "epoch", "detail", "config"], rows, right={2}))
    return blocks


STOPPED_ROWS = 10


def _stopped(data: SweepData) -> list[Block]:
    """Why the scheduler stopped trials, where it says (schedule.scheduler: median, curve): its
    judgement at the epoch it stopped each, the best trials it stopped first."""
    judged = [r for r in data.records if r.verdict is not None]
    stopped = [r for r in ranked(judged, data.direction) if r.stopped_early and (r.verdict or {}).get("stop")]
    if not judged:
        return []
    numbers = [k for k in judged[0].verdict or {} if k not in ("epoch", "stop")]
    rows = [
        [r.trial_id, str(r.verdict["epoch"]), number(r.best_value), *(_judged(r.verdict, k) for k in numbers)]
        for r in stopped[:STOPPED_ROWS]
    ]
    more = f" (the {STOPPED_ROWS} with the best values)" if len(stopped) > STOPPED_ROWS else ""
    blocks: list[Block] = [
        Heading("Why trials stopped"),
        Text(
            f"{data.cfg.scheduler.title.capitalize()} judged {len(judged)} trial(s) and stopped "
            f"{len(stopped)}{more}. Each trial's judgement at every epoch is in its stopper.jsonl; "
            "TensorBoard's HParams table has the latest as stopper/... columns."
        ),
    ]
    if rows:
        headers = ["trial", "stopped at epoch", f"best {data.metric}", *numbers]
        blocks.append(Table(headers, rows, right=set(range(1, 3 + len(numbers)))))
    return blocks


def _origins(data: SweepData) -> list[Block]:
    """How the trials' configurations were chosen (their origins), where the searcher says more
    than that it proposed them: bohb's model or random, and why; and how the rungs ranked the
    trials that reached the later ones (what bohb checks its model by)."""
    found = Counter(r.origin for r in data.records if r.origin)
    if not found or set(found) <= {"searcher"}:
        return []
    rows = [[origin, str(n)] for origin, n in found.most_common()]
    blocks: list[Block] = [
        Heading("Where the configurations came from"),
        Text("Each trial's origin, as summary.json records it when the searcher handed it out."),
        Table(["origin", "trials"], rows, right={1}),
    ]
    pairs = _rung_agreement(data)
    if pairs:
        blocks += [
            Text(
                "How the trials' values at each rung ranked them against a later one (Spearman, over "
                "the trials that reached both; bohb uses a model only where the rungs clearly agree)."
            ),
            Table(["rung", "later rung", "trials", "Spearman"], pairs, right={0, 1, 2, 3}),
        ]
    return blocks


def _rung_agreement(data: SweepData) -> list[list[str]]:
    from scipy.stats import spearmanr

    rungs = budgets(data.cfg.schedule)
    at = [
        {int(row["epoch"]): float(row[data.metric]) for row in r.history if finite(row.get(data.metric))}
        for r in data.records
    ]
    rows = []
    for i, low in enumerate(rungs):
        for high in rungs[i + 1 :]:
            both = [v for v in at if low in v and high in v]
            if len(both) >= 3:
                rho = spearmanr([v[low] for v in both], [v[high] for v in both]).statistic
                rows.append([str(low), str(high), str(len(both)), f"{rho:.2f}" if finite(rho) else "-"])
    return rows


def _judged(verdict: dict[str, Any], name: str) -> str:
    value = verdict.get(name)
    return f"{value:.1%}" if name == "p_beat" and finite(value) else number(value)


def _compute(data: SweepData) -> list[Block]:
    c = analysis.compute(data)
    res = data.cfg.resources
    gpu_note = (
        f"{_num(c.gpu_s)} GPU-seconds"
        if c.gpu_s is not None
        else "GPU-seconds unknown (gpus_per_worker: auto with several workers per trial)"
    )
    share = c.lost_cpu_s / c.cpu_s if c.cpu_s else 0.0
    text = (
        f"{_num(c.cpu_s)} CPU-seconds and {gpu_note} in all: each trial's training time x "
        f"{res.workers_per_trial} worker(s) x {res.cpus_per_worker:g} CPU "
        f"(x {_gpu_text(data)} GPU) per worker, from sweep.yaml. {share:.0%} of the CPU-seconds "
        "went to trials that were stopped early or failed."
    )
    rows = [
        [r.trial_id, r.outcome.value, _duration(r.time_s), _num(cpu), "-" if gpu is None else _num(gpu)]
        for r, cpu, gpu in sorted(c.per_trial, key=lambda t: -t[1])
    ]
    return [
        Heading("Compute"),
        Text(text),
        Table(["trial", "status", "time", "CPU-s", "GPU-s"], rows, right={2, 3, 4}),
    ]


def _autotune(data: SweepData) -> list[Block]:
    """training.autotune: each size's choice and its arms (autotune.json), when it ran."""
    found = read_autotune(data.sweep_dir)
    if found is None:
        return []
    blocks: list[Block] = [
        Heading("Autotune"),
        Text(
            f"Before the first trial, training.autotune measured {found.get('note', '')} "
            f"({_num(float(found.get('seconds', 0)))} s of a {found.get('budget_s')} s budget; "
            f"{AUTOTUNE_FILE} in the sweep directory has every figure)."
        ),
    ]
    for size in found.get("sizes", []):
        result = autotune.Result.from_json(size["result"])
        shown = ", ".join(f"{k}={v}" for k, v in size.get("size", {}).items())
        blocks.append(Text(autotune.summary_line(result, f"Size {shown}" if shown else "The model")))
        rows = autotune.arm_rows(result)
        if rows:
            blocks.append(Table(autotune.ARM_COLUMNS, rows, right=autotune.ARM_NUMBERS))
    return blocks


def _environment(data: SweepData) -> list[Block]:
    """What the sweep ran on (environment.json: each run's, the last shown), and what changed
    between its runs."""
    runs = read_environments(data.sweep_dir)
    if not runs:
        return []
    env = runs[-1]
    gpus = ", ".join(f"{n} x {kind}" for kind, n in (env.get("gpus") or {}).items()) or "none"
    rows = [
        ["Python", str(env.get("python"))],
        ["tuner", str(env.get("tuner"))],
        ["torch", f"{env.get('torch')} (CUDA {env.get('cuda') or 'none: a CPU build'})"],
        ["Ray", str(env.get("ray"))],
        ["NVIDIA driver", str(env.get("nvidia_driver") or "none")],
        ["GPUs", gpus],
    ]
    for code in env.get("code") or []:
        dirty = {True: ", with uncommitted changes", False: "", None: ", state unknown"}[code.get("dirty")]
        rows.append([f"code {code.get('dir')}", f"{code.get('commit') or 'no commit'}{dirty}"])
    blocks: list[Block] = [Heading("Environment"), Table(["what", "version"], rows)]
    changed = [
        f"run {i + 2}: " + "; ".join(found)
        for i, (a, b) in enumerate(zip(runs, runs[1:], strict=False))
        if (found := environment.differences(a, b))
    ]
    note = f"The sweep ran {len(runs)} time(s) (sweep, resume, extend); the last run's shown"
    blocks.append(
        Text(
            f"{note}; {ENVIRONMENT_FILE} has each. Changed between runs: {' | '.join(changed)}."
            if changed
            else f"{note}, the same in every run. {ENVIRONMENT_FILE} has each."
            if len(runs) > 1
            else f"From {ENVIRONMENT_FILE} in the sweep directory."
        )
    )
    return blocks


def _gpu_text(data: SweepData) -> str:
    return "?" if data.gpus_per_worker is None else f"{data.gpus_per_worker:g}"


def _num(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:,.0f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    return clock(round(seconds))
