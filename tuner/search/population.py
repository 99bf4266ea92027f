"""Population-based training's decisions, as data: which trials continue from which, with
what configuration (Ray-free; tuner.search.pbt runs them in a sweep).

At each perturbation epoch every member of the population has reported that epoch; the
members are ranked by it, and each of the worst `quantile` continues from one of the best
`quantile` (drawn), with the donor's configuration explored:

- pbt (Jaderberg et al. 2017): each perturbed parameter is drawn afresh from its range with
  probability `resample`, else moved: a log range multiplied or divided by `factor`, a
  linear range shifted up or down by `shift` of its width (integers rounded, by at least 1),
  a choice kept;
- pb2 (Parker-Holder et al. 2020, "Provably efficient online hyperparameter optimization
  with population-based bandits"): the numeric ones chosen by GP-UCB on a time-varying
  Gaussian process (Bogunovic et al. 2016) fitted to how much each configuration improved
  the metric epoch by epoch, every member's history included; several recipients of one
  perturbation get different configurations (each chosen one is added to the model as if it
  had scored what the model predicts). Choices are perturbed as pbt does.

Either way conditional parameters follow their parents (one whose condition no longer holds
is dropped, one whose condition now holds is drawn) and search.constraints hold after every
perturbation (the draw is repeated; a donor's own configuration, which keeps them, is the
last resort).

Every decision is a function of the data alone: the members' values at the epoch (their
journals), their configurations so far (their lineages), the sweep's seed and the
perturbation's number, which seed a generator of its own. A sweep resumed after a kill makes
exactly the decisions the uninterrupted one made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from tuner.space import conditions
from tuner.space.constraints import allows
from tuner.space.params import Choice, Fixed, Grid, LogRandInt, LogUniform, ParamT, RandInt, Uniform
from tuner.sweepdir import finite, segment_config

SALT = 0x50425421  # "PBT!": this generator's stream apart from the sweep's other uses of its seed
MAX_DRAWS = 1000  # explorations of one recipient that break a constraint before the donor's is kept
PB2_CANDIDATES = 512  # configurations the bandit's acquisition is evaluated at
PB2_ROWS = 256  # most recent epochs the bandit's model is fitted to (its cost grows as rows cubed)


@dataclass
class Member:
    """One trial of the population as the decisions see it."""

    index: int  # its place in the population (the order its first configuration was planned in)
    name: str = ""  # its directory's name ("" until it started)
    # Its configuration per epoch range, oldest first: {"epoch": the epoch the range starts
    # after, "config": ..., "donor": the directory it continued from, "donor_value": ...}.
    segments: list[dict[str, Any]] = field(default_factory=list)
    values: dict[int, float] = field(default_factory=dict)  # epoch -> metric (finite ones)
    ended: bool = False  # finished, failed or stopped: neither donor nor recipient any more

    @property
    def config(self) -> dict[str, Any]:
        """The configuration it runs with now."""
        return self.segments[-1]["config"]

    def config_for(self, epoch: int) -> dict[str, Any]:
        """The configuration that trained epoch `epoch`."""
        return segment_config(self.segments, epoch)

    def start_value(self, epoch: int) -> Optional[float]:
        """The value its weights had before epoch `epoch`: the donor's where it continued from
        one after epoch-1, else its own."""
        for seg in self.segments:
            if int(seg["epoch"]) == epoch - 1 and seg.get("donor") is not None:
                v = seg.get("donor_value")
                return float(v) if finite(v) else None
        return self.values.get(epoch - 1)


@dataclass(frozen=True)
class Decision:
    """Member `member` continues from `donor`'s checkpoint of the epoch, with `config`."""

    member: int
    donor: int
    config: dict[str, Any]
    value: float  # the member's value at the epoch
    donor_value: float


@dataclass(frozen=True)
class Rule:
    """How a population is perturbed (schedule.pbt, with the sweep's space and seed)."""

    kind: str  # "pbt" or "pb2"
    params: Mapping[str, ParamT]  # every trial-facing parameter (fixed ones too)
    perturb: tuple[str, ...]
    constraints: tuple[str, ...] = ()
    quantile: float = 0.25
    resample: float = 0.25
    factor: float = 1.25
    shift: float = 0.1
    interval: int = 1
    max_epochs: int = 10
    direction: str = "max"
    seed: int = 0


def decide(rule: Rule, generation: int, epoch: int, members: Sequence[Member]) -> list[Decision]:
    """The decisions of perturbation number `generation` (1, 2, ...) at `epoch`, in member
    order. Members that ended, or have no finite value at `epoch`, take no part."""
    live = [m for m in members if not m.ended and finite(m.values.get(epoch))]
    sign = 1.0 if rule.direction == "max" else -1.0
    ranked = sorted(live, key=lambda m: (-sign * m.values[epoch], m.index))
    # As Ray Tune's PBT counts its quantiles: rounded up, at most half the population.
    count = min(math.ceil(len(ranked) * rule.quantile), len(ranked) // 2)
    if count < 1:
        return []
    top, bottom = ranked[:count], ranked[-count:]
    rng = np.random.default_rng(np.random.SeedSequence([rule.seed, SALT, generation]))
    bandit = Bandit(rule, members, epoch) if rule.kind == "pb2" else None
    out = []
    for m in sorted(bottom, key=lambda m: m.index):
        donor = top[int(rng.integers(len(top)))]
        if bandit is not None:
            config = bandit.choose(donor.config, rng)
        else:
            config = explore(rule, donor.config, rng)
        out.append(Decision(m.index, donor.index, config, m.values[epoch], donor.values[epoch]))
    return out


# ----------------------------------------------------------------------------- pbt


def explore(rule: Rule, config: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The donor's `config` with each perturbed parameter drawn afresh or moved (pbt)."""
    moved = _kept(rule, config, lambda name, p, value: _move(rule, p, value, rng), rng, MAX_DRAWS)
    return moved if moved is not None else dict(config)


def _kept(
    rule: Rule, config: Mapping[str, Any], change: Any, rng: np.random.Generator, tries: int
) -> Optional[dict[str, Any]]:
    """`config` changed by `change(name, param, value)` for each perturbed parameter present,
    conditions then followed, that keeps search.constraints (`tries` draws; else None)."""
    wanted = set(rule.perturb)
    for _ in range(tries):
        new = dict(config)
        for name in conditions.order(rule.params):
            p = rule.params[name]
            if not conditions.applies(p, new):
                new.pop(name, None)
            elif name not in new:  # its condition holds now: drawn, as a fresh trial's would be
                new[name] = draw(p, rng)
            elif name in wanted:
                new[name] = change(name, p, new[name])
        if allows(list(rule.constraints), new):
            return new
    return None


def draw(p: ParamT, rng: np.random.Generator) -> Any:
    """A value of `p` drawn from its range (integer bounds inclusive)."""
    if isinstance(p, Fixed):
        return p.value
    if isinstance(p, (Choice, Grid)):
        return p.values[int(rng.integers(len(p.values)))]
    if isinstance(p, Uniform):
        return float(rng.uniform(p.low, p.high))
    if isinstance(p, LogUniform):
        return float(math.exp(rng.uniform(math.log(p.low), math.log(p.high))))
    if isinstance(p, RandInt):
        return int(rng.integers(p.low, p.high + 1))
    assert isinstance(p, LogRandInt), p
    return min(p.high, int(math.exp(rng.uniform(math.log(p.low), math.log(p.high + 1)))))


def _move(rule: Rule, p: ParamT, value: Any, rng: np.random.Generator) -> Any:
    if isinstance(p, Fixed):
        return value
    fresh = rng.random() < rule.resample
    if fresh or isinstance(p, (Choice, Grid)):
        return draw(p, rng) if fresh else value
    up = bool(rng.integers(2))
    if isinstance(p, LogUniform):
        return _clip(p, value * (rule.factor if up else 1 / rule.factor))
    if isinstance(p, Uniform):
        return _clip(p, value + (1 if up else -1) * rule.shift * (p.high - p.low))
    if isinstance(p, RandInt):
        step = max(1, round(rule.shift * (p.high - p.low)))
        return int(_clip(p, value + (step if up else -step)))
    assert isinstance(p, LogRandInt), p
    moved = round(value * (rule.factor if up else 1 / rule.factor))
    if moved == value:
        moved = value + (1 if up else -1)
    return int(_clip(p, moved))


def _clip(p: Any, value: float) -> Any:
    return min(p.high, max(p.low, value))


# ----------------------------------------------------------------------------- pb2

NUMERIC = (Uniform, LogUniform, RandInt, LogRandInt)


class Bandit:
    """PB2's choice of the numeric perturbed parameters: GP-UCB over (epoch, configuration)
    -> the metric's improvement over one epoch, fitted to the whole population's history."""

    def __init__(self, rule: Rule, members: Sequence[Member], epoch: int):
        self.rule, self.epoch = rule, epoch
        self.names = [k for k in rule.perturb if isinstance(rule.params.get(k), NUMERIC)]
        sign = 1.0 if rule.direction == "max" else -1.0
        rows: list[tuple[int, dict[str, Any], float]] = []
        for m in members:
            for e in sorted(m.values):
                before = m.start_value(e)
                if e <= epoch and before is not None and finite(before):
                    rows.append((e, m.config_for(e), sign * (m.values[e] - before)))
        rows.sort(key=lambda r: r[0])
        self.rows = rows[-PB2_ROWS:]

    def choose(self, donor: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        names = [k for k in self.names if k in donor]
        data = [(t, c, y) for t, c, y in self.rows if all(k in c for k in names)]
        if not names or len(data) < 2:  # nothing to learn from yet: pbt's exploration
            return explore(self.rule, donor, rng)
        x = np.array([[self._unit(k, c[k]) for k in names] for _, c, _ in data])
        t = np.array([float(r[0]) for r in data])
        y = np.array([r[2] for r in data])
        gp = _GP(t, x, (y - y.mean()) / (y.std() or 1.0))
        later = float(self.epoch + self.rule.interval)
        donor_x = [self._unit(k, donor[k]) for k in names]
        candidates = np.vstack([donor_x, rng.random((PB2_CANDIDATES, len(names)))])
        mean, sd = gp.predict(later, candidates)
        kappa = max(0.5, math.sqrt(0.2 * len(names) * math.log(2.0 * len(data))))
        scale, shift = float(y.std() or 1.0), float(y.mean())

        def choices(name: str, p: ParamT, value: Any) -> Any:  # the model's numbers stay as chosen
            return value if name in names else _move(self.rule, p, value, rng)

        for i in np.argsort(-(mean + kappa * sd), kind="stable")[:MAX_DRAWS]:
            picked = {k: self._value(k, float(u)) for k, u in zip(names, candidates[i], strict=True)}
            new = _kept(self.rule, {**donor, **picked}, choices, rng, 10)
            if new is not None:
                # Told to the model as if it scored what it predicts: the next recipient of this
                # perturbation is sent elsewhere (Kriging believer).
                self.rows.append((int(later), new, float(mean[i]) * scale + shift))
                return new
        return dict(donor)

    def _unit(self, name: str, value: Any) -> float:
        p = self.rule.params[name]
        low, high = float(p.low), float(p.high)  # type: ignore[union-attr]
        if isinstance(p, (LogUniform, LogRandInt)):
            return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
        return (float(value) - low) / (high - low)

    def _value(self, name: str, unit: float) -> Any:
        p = self.rule.params[name]
        low, high = float(p.low), float(p.high)  # type: ignore[union-attr]
        if isinstance(p, (LogUniform, LogRandInt)):
            v = math.exp(math.log(low) + unit * (math.log(high) - math.log(low)))
        else:
            v = low + unit * (high - low)
        v = min(high, max(low, v))
        return int(round(v)) if isinstance(p, (RandInt, LogRandInt)) else float(v)


class _GP:
    """A Gaussian process with the time-varying kernel k = exp(-|x-x'|^2 / 2l^2) (1-eps)^(|t-t'|/2)
    (Bogunovic et al. 2016), its length scale, forgetting rate and noise chosen from a small
    grid by marginal likelihood (deterministic: no random restarts)."""

    GRID = [
        (length, eps, noise)
        for length in (0.1, 0.2, 0.4, 0.8)
        for eps in (0.01, 0.1, 0.3)
        for noise in (0.01, 0.1)
    ]

    def __init__(self, t: np.ndarray, x: np.ndarray, y: np.ndarray):
        self.t, self.x, self.y = t, x, y
        best = None
        for length, eps, noise in self.GRID:
            k = self._k(t, x, t, x, length, eps) + noise * np.eye(len(y))
            try:
                chol = np.linalg.cholesky(k)
            except np.linalg.LinAlgError:
                continue
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
            fit = -0.5 * y @ alpha - np.log(np.diag(chol)).sum()
            if best is None or fit > best[0]:
                best = (fit, length, eps, chol, alpha)
        assert best is not None, "a noise term keeps the kernel positive definite"
        _, self.length, self.eps, self.chol, self.alpha = best

    @staticmethod
    def _k(
        t1: np.ndarray, x1: np.ndarray, t2: np.ndarray, x2: np.ndarray, length: float, eps: float
    ) -> np.ndarray:
        d2 = ((x1[:, None, :] - x2[None, :, :]) ** 2).sum(-1)
        return np.exp(-d2 / (2 * length**2)) * (1 - eps) ** (np.abs(t1[:, None] - t2[None, :]) / 2)

    def predict(self, t: float, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ks = self._k(np.full(len(x), t), x, self.t, self.x, self.length, self.eps)
        mean = ks @ self.alpha
        v = np.linalg.solve(self.chol, ks.T)
        return mean, np.sqrt(np.clip(1.0 - (v * v).sum(0), 1e-12, None))
