"""What tuner changes in hpbandster's BOHB config generator (hpbandster 0.7.4, unmaintained
since 2018), each checked in tests/test_bohb.py and tests/test_algorithms.py:

- its truncated-normal draws, by the inverse CDF instead of scipy's generic sampler: the same
  distribution, ~100x faster;
- its density model of a `choice`: statsmodels' Aitchison-Aitken kernel counts a choice's
  values in the data it is fitted on, not in the space, so when every "good" configuration
  had the same value (all adam, say) the kernel divides by zero, and a candidate with another
  value got an infinite density and was proposed whenever one was drawn: the model turned to
  values it had no good result for. Here every choice's values are counted;
- the warnings statsmodels raises while fitting and evaluating it (a FutureWarning about its
  random generator, reported from pandas' decorator; the division by zero above), which
  reached the console of every bohb sweep: silenced around hpbandster's calls only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class _TruncNorm:
    """scipy.stats.truncnorm.rvs for the one call hpbandster's BOHB makes (scalar bounds, loc
    and scale; the bounds on either side of 0), by the inverse CDF from numpy's global
    generator as scipy draws: the same distribution, ~100x faster (scipy's generic sampler
    took 0.4 s of each proposal, 64 samples × each parameter; scripts/bench_search.py)."""

    @staticmethod
    def rvs(a: float, b: float, loc: float = 0.0, scale: float = 1.0) -> float:
        import numpy as np
        from scipy.special import ndtr, ndtri

        x = ndtri(np.random.uniform(ndtr(a), ndtr(b)))
        return float(loc + scale * min(max(x, a), b))


def fast_truncnorm() -> None:
    """Swap the sampler into hpbandster's BOHB module (idempotent)."""
    from types import SimpleNamespace

    from hpbandster.optimizers.config_generators import bohb

    bohb.sps = SimpleNamespace(truncnorm=_TruncNorm)  # its only use of scipy.stats


def density(kde: Any, levels: Sequence[int], x: Sequence[float]) -> float:
    """The product-kernel density statsmodels' KDEMultivariate gives at one point `x`
    (Gaussian kernels for the continuous columns, Aitchison-Aitken for the choices), with the
    number of values of each choice taken from `levels` (0: a continuous column), and a
    choice's bandwidth at most (c-1)/c, where its kernel is uniform over the c values."""
    import numpy as np

    data, bw = np.asarray(kde.data, dtype=float), np.asarray(kde.bw, dtype=float)
    point = np.asarray(x, dtype=float)
    k = np.ones(len(data))
    for i, c in enumerate(levels):
        if c == 0:
            z = (data[:, i] - point[i]) / bw[i]
            k *= np.exp(-0.5 * z * z) / (math.sqrt(2 * math.pi) * bw[i])
        elif c > 1:
            lam = min(bw[i], (c - 1) / c)
            k *= np.where(data[:, i] == point[i], 1 - lam, lam / (c - 1))
    return float(k.mean())


class _Density:
    """A KDE's `pdf`, as hpbandster calls it (one vector), by `density` (picklable)."""

    def __init__(self, kde: Any, levels: Sequence[int]):
        self.kde, self.levels = kde, list(levels)

    def __call__(self, x: Sequence[float]) -> float:
        return density(self.kde, self.levels, x)


def count_every_choice(bohber: Any) -> None:
    """Give each of the generator's fitted models `density` as its pdf (idempotent)."""
    levels = [int(t) for t in bohber.vartypes]  # hpbandster: len(choices), or 0 if continuous
    for models in bohber.kde_models.values():
        for kde in models.values():
            if not isinstance(kde.__dict__.get("pdf"), _Density):
                kde.pdf = _Density(kde, levels)


@contextmanager
def quiet_statsmodels() -> Iterator[None]:
    """Silence, for the duration, the two warnings statsmodels raises under hpbandster."""
    with warnings.catch_warnings():
        # Raised by statsmodels but reported from pandas' decorator: matched by its text.
        warnings.filterwarnings("ignore", message="After 0.17 or January 2028", category=FutureWarning)
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="statsmodels.nonparametric")
        yield
