"""`tuner report A B [C...] --output DIR`: several sweeps of one metric side by side.

One self-contained compare.html (and compare.md, PNGs): each sweep's best so far against
wall-clock time, against epochs spent and as its trials finished (tuner.history), overlaid;
each sweep's leaderboard head; their settings side by side, the ones that differ first.
"""

from __future__ import annotations

import os
from typing import Any

from tuner import history
from tuner.config import ConfigError
from tuner.results import TrialRecord, finite, number, ranked, short
from tuner.sweepdir import check_writable
from tuner.view import analysis, document, plots
from tuner.view.analysis import SweepData
from tuner.view.document import Block, Heading, Image, Table, Text
from tuner.view.report import Written

COMPARE_HTML, COMPARE_MD = "compare.html", "compare.md"
HEAD_ROWS = 3


def write_comparison(sweep_dirs: list[str], out_dir: str) -> Written:
    """Read every sweep directory and write compare.html, compare.md and PNGs into `out_dir`."""
    sweeps = [analysis.load(d) for d in sweep_dirs]
    first = sweeps[0]
    for s in sweeps[1:]:
        if (s.metric, s.direction) != (first.metric, first.direction):
            raise ConfigError(
                "sweep_dir",
                f"{s.sweep_dir} optimises {s.metric} ({s.direction}), {first.sweep_dir} {first.metric} "
                f"({first.direction}): compare sweeps of one metric",
            )
    out = os.path.abspath(out_dir)
    check_writable(out, "--output")
    blocks = build(sweeps, out)
    title = "Sweeps compared: " + ", ".join(labels(sweeps))
    markdown = document.to_markdown(title, blocks)
    html_path = os.path.join(out, COMPARE_HTML)
    with open(os.path.join(out, COMPARE_MD), "w") as f:
        f.write(markdown)
    with open(html_path, "w") as f:
        f.write(document.to_html(title, blocks))
    return Written(html=html_path, markdown=markdown, images=[b.path for b in blocks if isinstance(b, Image)])


def labels(sweeps: list[SweepData]) -> list[str]:
    """One name per sweep: its directory's name, numbered where two are alike."""
    names = [os.path.basename(s.sweep_dir.rstrip("/")) for s in sweeps]
    return [n if names.count(n) == 1 else f"{n} ({i})" for i, n in enumerate(names, 1)]


def best_by_epochs(records: list[TrialRecord], metric: str, direction: str) -> list[tuple[int, float]]:
    """(epochs spent by the whole sweep, best metric so far) at each improvement: every
    reported epoch of every trial counted in the order they were reported."""
    rows = [(float(r["wall_time"]), r) for t in records for r in t.history if finite(r.get("wall_time"))]
    rows.sort(key=lambda pair: pair[0])
    better = (lambda a, b: a > b) if direction == "max" else (lambda a, b: a < b)
    out: list[tuple[int, float]] = []
    for spent, (_, r) in enumerate(rows, 1):
        v = r.get(metric)
        if "failure" not in r and finite(v) and (not out or better(float(v), out[-1][1])):
            out.append((spent, float(v)))
    return out


def build(sweeps: list[SweepData], out: str) -> list[Block]:
    names = labels(sweeps)
    metric = sweeps[0].metric
    png = lambda name: os.path.join(out, name)  # noqa: E731 - a one-word helper
    pairs = list(zip(names, sweeps, strict=True))
    by_time = {n: analysis.best_so_far(s)[1] for n, s in pairs}
    by_epochs = {
        n: [(float(e), v) for e, v in best_by_epochs(s.records, s.metric, s.direction)] for n, s in pairs
    }
    by_trials = {
        n: history.curve(history.replay(s.records, s.cfg.objectives).points, s.metric)[1] for n, s in pairs
    }
    since = "seconds since the sweep's first epoch began"
    return [
        Text(_overview(sweeps, names)),
        Heading("Best so far against wall-clock time"),
        Image(
            plots.overlaid(by_time, since, metric, png("compare_time.png")),
            "best so far against time",
        ),
        Heading("Best so far against epochs spent"),
        Image(
            plots.overlaid(by_epochs, "epochs trained by the whole sweep", metric, png("compare_epochs.png")),
            "best so far against epochs",
        ),
        Heading("Best so far as trials finished"),
        Image(
            plots.overlaid(
                by_trials, "trials finished (each with its best epoch)", metric, png("compare_trials.png")
            ),
            "best so far as trials finished",
        ),
        Heading("Leaderboards"),
        *[block for n, s in zip(names, sweeps, strict=True) for block in _head(n, s)],
        Heading("Settings"),
        _settings(sweeps, names),
    ]


def _overview(sweeps: list[SweepData], names: list[str]) -> str:
    parts = []
    for n, s in zip(names, sweeps, strict=True):
        top = ranked(s.records, s.direction)
        best = f"best {s.metric} {number(top[0].best_value)}" if top else "no result yet"
        epochs = sum(t.epochs for t in s.records)
        parts.append(
            f"{n}: {s.cfg.search.algorithm}, {len(s.records)} trials, {epochs} epochs, {best} ({s.state})"
        )
    return f"Metric {sweeps[0].metric} ({sweeps[0].direction}). " + "; ".join(parts) + "."


def _head(name: str, data: SweepData) -> list[Block]:
    keys = list(data.searched())
    rows = [
        [str(i), r.trial_id, number(r.best_value), str(r.best_epoch), *map(short, map(r.config.get, keys))]
        for i, r in enumerate(ranked(data.records, data.direction)[:HEAD_ROWS], 1)
    ]
    headers = ["#", "trial", data.metric, "best epoch", *keys]
    return [Text(f"{name} ({data.sweep_dir})"), Table(headers, rows, right={0, 2, 3})]


def _settings(sweeps: list[SweepData], names: list[str]) -> Table:
    flat = [_flat(s.cfg.model_dump(mode="json")) for s in sweeps]
    keys = sorted({k for f in flat for k in f} - {"name", "output"})
    differ = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
    same = [k for k in keys if k not in differ]
    rows = [[k, *(short(f.get(k, "")) for f in flat)] for k in differ + same]
    return Table(["setting", *names], rows)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a config dump; each search parameter stays whole (one row)."""
    whole = prefix.startswith("search.params.") and prefix != "search.params."
    if isinstance(tree, dict) and tree and not whole:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): tree}
