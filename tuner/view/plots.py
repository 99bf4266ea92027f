"""The report's figures, drawn with matplotlib's Agg backend into PNG files.

Every function takes plain data and a path, draws one figure and returns the path. Figures
are made with `Figure` + `FigureCanvasAgg` directly, not pyplot: no global state, no display
needed, safe to call from any thread. An empty input draws a figure that says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tuner.results import Outcome
from tuner.space.params import Choice, Grid, LogRandInt, LogUniform, ParamT

DPI = 100
OUTCOME_COLORS = {
    Outcome.COMPLETED.value: "#2da44e",
    Outcome.STOPPED_EARLY.value: "#8c959f",
    Outcome.STOPPED_ITSELF.value: "#57ab5a",
    Outcome.DIVERGED.value: "#e16f24",
    Outcome.OOM.value: "#8250df",
    Outcome.ERROR.value: "#cf222e",
}
FAILED_Y = -0.12  # where failed trials end on the metric axis of the parallel coordinates


def _figure(width: float = 8.0, height: float = 4.2) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str) -> str:
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#57606a")
    ax.set_xticks([])
    ax.set_yticks([])


def best_so_far(
    points: Sequence[tuple[float, float]],
    running: Sequence[tuple[float, float]],
    metric: str,
    path: str,
    xlabel: str = "wall-clock seconds since the first trial started",
    dots: str = "each epoch",
) -> str:
    """Every value (dots: `dots`) and the best so far (steps) against `xlabel`."""
    fig = _figure()
    ax = fig.add_subplot()
    if not points:
        _empty(ax, "no results yet")
        return _save(fig, path)
    ax.scatter([t for t, _ in points], [v for _, v in points], s=9, color="#8c959f", label=dots)
    xs = [t for t, _ in running] + [points[-1][0]]
    ys = [v for _, v in running] + [running[-1][1]]
    ax.step(xs, ys, where="post", color="#0969da", linewidth=2, label="best so far")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.set_title(f"Best {metric} so far")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(fig, path)


def lineage(
    lines: dict[str, list[tuple[int, int, Optional[str]]]], ancestry: set[tuple[str, int, int]], path: str
) -> str:
    """A population's lineage: each trial a row, each of its epoch ranges (start, end, donor)
    a line, an arrow from the donor's row where a range began from another's checkpoint; the
    ranges in `ancestry` ((trial, first epoch, last epoch): the best weights') drawn thick."""
    names = list(lines)
    fig = _figure(8.0, max(2.5, 0.35 * len(names) + 1.2))
    ax = fig.add_subplot()
    if not names:
        _empty(ax, "no trials yet")
        return _save(fig, path)
    row = {name: i for i, name in enumerate(names)}
    for name, ranges in lines.items():
        for start, end, donor in ranges:
            ax.plot([start, end], [row[name]] * 2, color="#8c959f", linewidth=2)
            if donor is not None and donor in row:
                ax.annotate(
                    "",
                    xy=(start, row[name]),
                    xytext=(start, row[donor]),
                    arrowprops={"arrowstyle": "->", "color": "#e16f24", "linewidth": 1.2},
                )
    for name, first, last in ancestry:
        if name in row:
            ax.plot([first - 1, last], [row[name]] * 2, color="#0969da", linewidth=4)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_title("Lineage: which trial continued from which, when")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def schedule(
    trained: Sequence[dict[str, Any]], names: Sequence[str], params: dict[str, ParamT], path: str
) -> str:
    """The best weights' schedule: each parameter's value over the epochs that trained them
    (`trained`: [{"epochs": [first, last], "config": ...}]), a panel each."""
    shown = [n for n in names if any(n in s["config"] for s in trained)]
    fig = _figure(8.0, max(2.5, 2.0 * len(shown)))
    if not shown or not trained:
        _empty(fig.add_subplot(), "no schedule")
        return _save(fig, path)
    axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, shown, strict=True):
        xs, ys = [], []
        for s in trained:
            if name in s["config"]:
                xs += [s["epochs"][0] - 1, s["epochs"][1]]
                ys += [s["config"][name]] * 2
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in ys):
            ax.plot(xs, ys, color="#0969da", linewidth=2)
            if isinstance(params.get(name), (LogUniform, LogRandInt)):
                ax.set_yscale("log")
        else:  # a choice: its values on the axis, in order
            values = list(dict.fromkeys(str(v) for v in ys))
            ax.plot(xs, [values.index(str(v)) for v in ys], color="#0969da", linewidth=2)
            ax.set_yticks(range(len(values)), values)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("epoch")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_title("The best weights' schedule")
    return _save(fig, path)


def overlaid(series: dict[str, Sequence[tuple[float, float]]], xlabel: str, metric: str, path: str) -> str:
    """One best-so-far step line per sweep, on shared axes (the comparison report)."""
    fig = _figure()
    ax = fig.add_subplot()
    if not any(series.values()):
        _empty(ax, "no results yet")
        return _save(fig, path)
    for label, steps in series.items():
        if steps:
            ax.step([x for x, _ in steps], [y for _, y in steps], where="post", linewidth=2, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.set_title(f"Best {metric} so far")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(fig, path)


def curves(
    top: Sequence[tuple[str, list[tuple[int, float]]]],
    others: Sequence[list[tuple[int, float]]],
    metric: str,
    path: str,
) -> str:
    """Learning curves: the top trials labelled, every other trial faint behind them."""
    fig = _figure()
    ax = fig.add_subplot()
    if not top and not others:
        _empty(ax, "no results yet")
        return _save(fig, path)
    for series in others:
        ax.plot([e for e, _ in series], [v for _, v in series], color="#d0d7de", linewidth=1)
    for label, series in top:
        ax.plot(
            [e for e, _ in series],
            [v for _, v in series],
            marker="o",
            markersize=3,
            linewidth=1.6,
            label=label,
        )
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(metric)
    ax.set_title(f"Learning curves: {metric} of the top {len(top)} trials (others in grey)")
    ax.grid(alpha=0.3)
    if top:
        ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def parallel(
    params: dict[str, ParamT],
    rows: Sequence[tuple[dict[str, Any], Optional[float]]],
    metric: str,
    direction: str,
    path: str,
) -> str:
    """Parallel coordinates: one line per trial through its hyperparameters to its best metric.

    Ranges are scaled to their declared domain (log ones in log space), choices spread evenly;
    lines are coloured by the metric (brighter is better); failed trials are red, dashed, and
    end below the metric axis.
    """
    fig = _figure(9.0, 4.6)
    ax = fig.add_subplot()
    values = [v for _, v in rows if v is not None]
    if not params or not rows:
        _empty(ax, "nothing searched" if not params else "no trials yet")
        return _save(fig, path)
    names = list(params)
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    cmap = matplotlib.colormaps["viridis"]

    def score(v: float) -> float:
        s = 0.5 if hi == lo else (v - lo) / (hi - lo)
        return s if direction == "max" else 1 - s

    # Worst first, so the best trials are drawn on top.
    order = sorted(rows, key=lambda r: -1.0 if r[1] is None else score(r[1]))
    for config, value in order:
        ys = [_scaled(params[n], config.get(n)) for n in names]
        if value is None:
            ax.plot(range(len(names) + 1), ys + [FAILED_Y], color="#cf222e", linestyle="--", alpha=0.6)
        else:
            metric_y = 0.5 if hi == lo else (value - lo) / (hi - lo)
            ax.plot(range(len(names) + 1), ys + [metric_y], color=cmap(score(value)), alpha=0.85)
    for i, name in enumerate(names):
        ax.axvline(i, color="#57606a", linewidth=0.8)
        for y, label in _ticks(params[name]):
            ax.text(i + 0.03, y, label, fontsize=7, va="center", color="#24292f")
    ax.axvline(len(names), color="#57606a", linewidth=0.8)
    for y, v in ((0.0, lo), (1.0, hi)):
        ax.text(len(names) + 0.03, y, f"{v:.4g}", fontsize=7, va="center")
    if len(values) < len(rows):
        ax.text(len(names) + 0.03, FAILED_Y, "failed", fontsize=7, va="center", color="#cf222e")
    ax.set_xticks(range(len(names) + 1), names + [metric])
    ax.set_yticks([])
    ax.set_xlim(-0.1, len(names) + 0.45)
    ax.set_ylim(FAILED_Y - 0.08, 1.08)
    ax.set_title(f"Hyperparameters vs best {metric} (one line per trial)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return _save(fig, path)


def _scaled(p: ParamT, v: Any) -> float:
    """`v` placed on the axis of `p`, 0 (low / first value) to 1 (high / last value); NaN for
    a conditional parameter absent from the trial (its line has a gap at that axis)."""
    if v is None:
        return math.nan
    if isinstance(p, (Choice, Grid)):
        n = len(p.values)
        return p.values.index(v) / (n - 1) if v in p.values and n > 1 else 0.5
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0.5  # a value the axis cannot place (not expected from a sweep's own trials)
    low, high = float(p.low), float(p.high)  # type: ignore[union-attr]
    if isinstance(p, (LogUniform, LogRandInt)):
        return (math.log(v) - math.log(low)) / (math.log(high) - math.log(low))
    return (v - low) / (high - low)


def _ticks(p: ParamT) -> list[tuple[float, str]]:
    if isinstance(p, (Choice, Grid)):
        return [(_scaled(p, v), f"{v:.4g}" if isinstance(v, float) else str(v)) for v in p.values]
    return [(0.0, f"{p.low:.4g}"), (1.0, f"{p.high:.4g}")]  # type: ignore[union-attr]


def importance(scores: dict[str, float], path: str) -> str:
    """Horizontal bars, most important parameter on top."""
    fig = _figure(7.0, 0.6 + 0.45 * max(len(scores), 2))
    ax = fig.add_subplot()
    items = sorted(scores.items(), key=lambda kv: kv[1])
    ax.barh([k for k, _ in items], [v for _, v in items], color="#0969da")
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, max(1.0, max(scores.values(), default=0) * 1.15))
    ax.set_xlabel("importance (share of explained variance)")
    ax.set_title("Hyperparameter importance (fANOVA)")
    return _save(fig, path)


def outcomes(counts: dict[str, int], path: str) -> str:
    """How many trials ended which way: completed, stopped early, diverged, oom, error, ..."""
    fig = _figure(7.0, 0.6 + 0.45 * max(len(counts), 2))
    ax = fig.add_subplot()
    if not counts:
        _empty(ax, "no trials yet")
        return _save(fig, path)
    items = list(counts.items())[::-1]
    colors = [OUTCOME_COLORS.get(k, "#bf8700") for k, _ in items]
    ax.barh([k for k, _ in items], [v for _, v in items], color=colors)
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v}", va="center", fontsize=8)
    ax.set_xlim(0, max(v for _, v in items) * 1.15 + 0.5)
    ax.set_xlabel("trials")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("How trials ended")
    return _save(fig, path)


def pareto(
    points: Sequence[tuple[float, float]],
    front: Sequence[tuple[float, float, str]],
    axes: tuple[tuple[str, str], tuple[str, str]],
    path: str,
) -> str:
    """The first two objectives of every trial (at its best epoch of the first): each trial a
    grey dot, the Pareto front's trials labelled and joined.

    `axes`: (metric, direction) of x and of y. A positive axis spanning over two decades (a model's
    parameter count) is drawn in log scale.
    """
    fig = _figure(8.0, 5.0)
    ax = fig.add_subplot()
    if not points:
        _empty(ax, "no trial has a value of both objectives yet")
        return _save(fig, path)
    ax.scatter([x for x, _ in points], [y for _, y in points], s=14, color="#8c959f", label="trials")
    # The front, in order along the x axis (its points never cross: each is better in one).
    line = sorted(front)
    ax.plot(
        [x for x, _, _ in line],
        [y for _, y, _ in line],
        "-o",
        color="#0969da",
        markersize=6,
        linewidth=1.6,
        label=f"Pareto front ({len(front)} trials)",
    )
    labels: dict[tuple[float, float], list[str]] = {}
    for x, y, label in line:  # trials of equal values share a point, and its label
        labels.setdefault((x, y), []).append(label)
    for (x, y), names in labels.items():
        text = ", ".join(names)
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color="#0969da")
    (xname, xmode), (yname, ymode) = axes
    for values, setter in (([x for x, _ in points], ax.set_xscale), ([y for _, y in points], ax.set_yscale)):
        if min(values) > 0 and max(values) / min(values) > 100:
            setter("log")
    ax.set_xlabel(f"{xname} ({'higher' if xmode == 'max' else 'lower'} is better)")
    ax.set_ylabel(f"{yname} ({'higher' if ymode == 'max' else 'lower'} is better)")
    ax.set_title(f"{yname} against {xname}: the Pareto front")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(fig, path)
