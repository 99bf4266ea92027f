"""Learning-curve extrapolation: where a trial's metric is heading, from its epochs so far
(numpy only, no Ray: the curve stopper's arithmetic, tuner.search.stoppers).

The model follows Domhan, Springenberg and Hutter (2015, "Speeding up automatic
hyperparameter optimization of deep neural networks by extrapolation of learning curves"): a
weighted ensemble of parametric curve families, each rising to an asymptote. Their
families share one form, an asymptote minus a vanishing term,

    z(x) = c - a * g(x; theta),   a >= 0,   g falling towards 0,

(z is the metric in its better-is-higher direction: -loss for a loss), with g one of

- pow4 (and pow3 as its shift goes to 0): (1 + x/tau)**-alpha,
- Hill / MMF / log-power: 1 / (1 + (x/kappa)**eta),
- Weibull / Janoschek / exp4 (exp3 at eta 1): exp(-(x/tau)**eta),
- ilog2: 1 / log(x + 1).

Instead of their MCMC over every parameter (seconds a fit), each family's shape parameters
theta run over a fixed grid, and for each shape (c, a) is linear least squares in closed form,
all shapes at once in one array operation: a fit of every candidate costs well under a
millisecond (scripts/bench_search.py measures it). The candidates are weighed by their
likelihood under Gaussian noise (Bayesian model averaging over the grid, a flat prior), and
the prediction at max_epochs is their mixture: each candidate's extrapolation with its own
least-squares uncertainty and the noise. With two points every candidate fits exactly and
the prior's spread of shapes is the forecast's spread: wide, so a trial is stopped that early
only when even its most hopeful shapes stay short of the best.

A trial's noise is taken from its own residuals once it has enough epochs; before that from
the other trials' (the pooled estimate `noise`), as the ensemble cannot tell noise from shape
on a few points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

MIN_POINTS = 2  # epochs a trial needs before it can be extrapolated at all
OWN_NOISE_POINTS = 6  # epochs from which a trial's own residuals say how noisy it is
# The noise, as a fraction of a curve's range so far, when nothing better is known yet.
FALLBACK_NOISE = 0.02
NOISE_FLOOR = 0.005  # the least noise a fit assumes, as a fraction of the curve's range so far


def _grid(max_epochs: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The candidates' names, their g at epochs 1..max_epochs (a row a candidate) and their
    prior weights (each family the same in all)."""
    x = np.arange(1, max_epochs + 1, dtype=float)
    names: list[str] = []
    rows: list[np.ndarray] = []
    family: list[str] = []

    def add(kind: str, name: str, g: np.ndarray) -> None:
        names.append(name)
        rows.append(g)
        family.append(kind)

    for tau in np.geomspace(0.25, 2.0 * max_epochs, 20):  # epochs to fall (tau, kappa)
        for alpha in (0.25, 0.5, 1.0, 1.5, 2.0, 3.0):
            add("pow4", f"pow4(tau={tau:.3g},alpha={alpha:g})", (1.0 + x / tau) ** -alpha)
        for eta in (0.5, 1.0, 1.5, 2.0):
            add("hill", f"hill(kappa={tau:.3g},eta={eta:g})", 1.0 / (1.0 + (x / tau) ** eta))
            add("weibull", f"weibull(tau={tau:.3g},eta={eta:g})", np.exp(-((x / tau) ** eta)))
    add("ilog2", "ilog2", 1.0 / np.log(x + 1.0))
    sizes = {k: family.count(k) for k in family}
    prior = np.array([1.0 / sizes[k] for k in family])
    return names, np.array(rows), prior / prior.sum()


@lru_cache(maxsize=8)
def grid(max_epochs: int) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """The candidate shapes for curves of max_epochs epochs and their prior weights (computed
    once per length)."""
    names, g, prior = _grid(max_epochs)
    g.setflags(write=False)
    prior.setflags(write=False)
    return tuple(names), g, prior


# Gauss-Hermite nodes (probabilists') for the expectation over a candidate's uncertain level
_NODES, _NODE_WEIGHTS = np.polynomial.hermite_e.hermegauss(5)
_NODE_WEIGHTS = _NODE_WEIGHTS / _NODE_WEIGHTS.sum()
KEPT_WEIGHT = 0.999  # the probability mass of candidates a forecast evaluates (the rest: none)
# Epochs to come evaluated at most: beyond, every epoch counts with the nearest evaluated one's
# mean (a candidate's curve changes little from one epoch to the next), which keeps a forecast
# far from its end to a fraction of a millisecond.
EVALUATED = 16


@dataclass(frozen=True)
class Fit:
    """The ensemble fitted to one curve, extrapolated over the epochs still to come."""

    weights: np.ndarray  # each candidate's posterior weight (sums to 1)
    future: np.ndarray  # each candidate's mean curve at (some of) the epochs to come, the last last (z)
    counts: np.ndarray  # how many of the epochs to come each column of `future` stands for
    level_sd: np.ndarray  # each candidate's least-squares uncertainty there (its level's sd)
    noise_sd: float  # the noise of one epoch's value
    residual_var: Optional[float]  # the best candidates' residual variance (None: too few points)

    @property
    def median(self) -> float:
        """The candidates' weighted median prediction at max_epochs (z): what the ensemble
        expects, unmoved by the few wild extrapolations a short curve allows."""
        final = self.future[:, -1]
        order = np.argsort(final)
        cumulative = np.cumsum(self.weights[order])
        return float(final[order][min(int(np.searchsorted(cumulative, 0.5)), len(order) - 1)])

    def p_above(self, z: float) -> float:
        """Probability that the trial reports a value above z (better-is-higher) at one of the
        epochs still to come: what tuner ranks a trial by is its best epoch, so the chance of
        beating the incumbent is that of any epoch's value, noise included, exceeding it.

        Given a candidate and its level, the epochs' noise is independent; the level's own
        uncertainty is shared by every epoch and integrated over (Gauss-Hermite)."""
        from scipy.special import log_ndtr

        if self.future.shape[1] == 0:
            return 0.0
        order = np.argsort(-self.weights)
        kept = order[: int(np.searchsorted(np.cumsum(self.weights[order]), KEPT_WEIGHT)) + 1]
        w = self.weights[kept] / self.weights[kept].sum()
        # candidates x nodes x epochs: the log-probability that an epoch stays at or below z
        levels = self.future[kept][:, None, :] + (self.level_sd[kept][:, None] * _NODES[None, :])[:, :, None]
        stays = np.exp((log_ndtr((z - levels) / self.noise_sd) * self.counts).sum(axis=2))
        return float(np.clip(np.dot(w, 1.0 - (stays * _NODE_WEIGHTS).sum(axis=1)), 0.0, 1.0))


def fit(
    epochs: np.ndarray,
    z: np.ndarray,
    max_epochs: int,
    noise: Optional[float] = None,
    prior: Optional[np.ndarray] = None,
) -> Optional[Fit]:
    """The ensemble fitted to a curve z (better-is-higher) at `epochs` (1-based, distinct,
    rising), extrapolated to max_epochs; None with fewer than MIN_POINTS epochs. `noise`: the
    standard deviation of one epoch's value, if known from elsewhere (the other trials);
    `prior`: the candidates' prior weights (default: each family alike, its shapes alike)."""
    n = len(epochs)
    if n < MIN_POINTS:
        return None
    _, table, flat = grid(max_epochs)
    prior = flat if prior is None else prior
    g = table[:, np.asarray(epochs, dtype=int) - 1]  # candidates x points
    ahead, counts = _ahead(table, int(epochs[-1]))
    gm = g.mean(axis=1)
    zm = float(z.mean())
    dg = g - gm[:, None]
    sgg = np.maximum((dg * dg).sum(axis=1), 1e-12)
    # z = c + b g with b = -a <= 0 (the curve rises as g falls): a rising fit, or a flat one.
    b = np.minimum((dg * (z - zm)).sum(axis=1) / sgg, 0.0)
    c = zm - b * gm
    resid = z[None, :] - (c[:, None] + b[:, None] * g)
    sse = (resid * resid).sum(axis=1)
    span = float(z.max() - z.min())
    own = _own_noise(z, sse) if n >= OWN_NOISE_POINTS else None
    var = _noise_var(n, own, noise, span)
    loglik = -0.5 * sse / var
    w = prior * np.exp(loglik - loglik.max())
    w /= w.sum()
    # least squares' uncertainty of the line on g, taken where it is largest: at max_epochs
    gl = table[:, max_epochs - 1]
    lever = 1.0 / n + (gl - gm) ** 2 / sgg
    return Fit(w, c[:, None] + b[:, None] * ahead, counts, np.sqrt(var * lever), math.sqrt(var), own)


def _ahead(table: np.ndarray, last: int) -> tuple[np.ndarray, np.ndarray]:
    """The candidates' g at the epochs after `last` (at most EVALUATED of them, the last
    included) and how many epochs each stands for."""
    left = table.shape[1] - last
    if left <= EVALUATED:
        return table[:, last:], np.ones(left)
    at = np.unique(np.linspace(0, left - 1, EVALUATED).round().astype(int))
    nearest = np.abs(np.arange(left)[:, None] - at[None, :]).argmin(axis=1)
    return table[:, last + at], np.bincount(nearest, minlength=len(at)).astype(float)


def _own_noise(z: np.ndarray, sse: np.ndarray) -> float:
    """A curve's noise variance from its own epochs: the lesser of two estimates that each err
    high in their own way, the best-fitting candidates' residuals (high where no family quite
    has the curve's shape: a curve getting worse, which every family fits as flat) and the
    curve's second differences (high where it still bends sharply, its first epochs)."""
    n = len(z)
    residual = float(np.sort(sse)[: max(1, len(sse) // 10)].mean() / (n - 2))
    second = np.diff(z, 2)
    return min(residual, float((second * second).mean() / 6.0))  # (var of a 2nd difference: 6 sigma^2)


def _noise_var(n: int, own: Optional[float], pooled: Optional[float], span: float) -> float:
    """The noise variance a fit assumes: the curve's own residuals once it has enough epochs,
    else the other trials' (pooled), else FALLBACK_NOISE of its range; never below NOISE_FLOOR
    of its range (the families are a grid: a smooth curve between two of its shapes fits
    neither exactly, and the misfit is no reason for certainty)."""
    if own is not None:
        var = own
    elif pooled is not None and math.isfinite(pooled) and pooled > 0:
        var = pooled * pooled
    else:
        var = (FALLBACK_NOISE * span) ** 2
    return max(var, (NOISE_FLOOR * span) ** 2, 1e-12)
