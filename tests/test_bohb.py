"""bohb at any num_samples: ASHA's rungs from grace_epochs, trials trained to max_epochs, a model
told every rung result.

The check for every N from 8 to 100 drives the real scheduler and searcher that a sweep gets
(`algorithms.build`) the way Tune's controller does, with a synthetic learning curve in place
of training: thousands of trials in seconds. Two real sweeps check the same on Ray.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import ROOT, debug_config
from tuner.search import algorithms
from tuner.search.algorithms import Prior, PriorTrial
from tuner.search.simulate import simulate as run_simulation
from tuner.sweepdir import read_metrics

Curve = Callable[[dict[str, Any], int, random.Random], float]


def _plan(n: int, max_epochs: int, grace: int, factor: float, prior: Prior | None = None):
    cfg = debug_config(
        Path("/nonexistent"),
        search__algorithm="bohb",
        search__num_samples=n,
        schedule__max_epochs=max_epochs,
        schedule__grace_epochs=grace,
        schedule__reduction_factor=factor,
    )
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction, None, prior
    )
    return cfg, plan


def learning_curve(config: dict[str, Any], epoch: int, rng: random.Random) -> float:
    """Accuracy after `epoch` epochs: best near lr 0.01, faster with a larger lr (curves cross),
    noise that shrinks as the epochs grow."""
    ceiling = 0.95 - 0.12 * abs(math.log10(config["lr"]) + 2) - (0.02 if config["optimizer"] == "sgd" else 0)
    speed = 2 + 30 * (1 - (math.log10(config["lr"]) + 3) / 2)  # epochs to ~63%: 2 (lr 0.1) .. 32 (1e-3)
    return ceiling * (1 - math.exp(-epoch / speed)) + rng.gauss(0, 0.03 / math.sqrt(epoch))


def simulate(
    plan: Any, n: int, max_epochs: int, curve: Curve = learning_curve, slots: int = 2, seed: int = 0
) -> dict[str, tuple[dict[str, Any], list[float]]]:
    """n trials through the plan as Tune's controller runs them (tuner.search.simulate):
    {trial_id: (config, [metric at epoch 1, 2, ...])}."""
    trials = run_simulation(plan, n, max_epochs, curve, slots=slots, seed=seed)
    return {t: (x.config, x.values) for t, x in trials.items()}


# ----------------------------------------------------------------------------- the rungs


def test_rungs_are_those_of_rays_scheduler() -> None:
    from ray.tune.schedulers import ASHAScheduler

    assert algorithms.rungs(5, 150, 3) == [5, 15, 45, 135]  # the sweep
    assert algorithms.rungs(1, 27, 3) == [1, 3, 9]  # 27 itself compares nothing: trials stop there
    assert algorithms.rungs(2, 20, 2.5) == [2, 5, 13]  # a trial meets 12.5 at epoch 13
    assert algorithms.rungs(4, 4, 3) == []  # grace = max: every trial trains to the end
    for grace in (1, 2, 3, 5, 7):
        for max_epochs in range(grace, 300, 7):
            for factor in (1.5, 2, 2.5, 3, 4):
                sched = ASHAScheduler(
                    time_attr="epoch", max_t=max_epochs, grace_period=grace, reduction_factor=factor
                )
                ray_rungs = sorted(math.ceil(m) for m, _ in sched._brackets[0]._rungs if m < max_epochs)
                assert algorithms.rungs(grace, max_epochs, factor) == ray_rungs, (grace, max_epochs, factor)


def test_bohb_plan_is_asha_from_grace_to_max_epochs() -> None:
    cfg, plan = _plan(40, 150, 5, 3)
    from ray.tune.schedulers import AsyncHyperBandScheduler

    assert isinstance(plan.scheduler, AsyncHyperBandScheduler)
    assert plan.scheduler._max_t == 150 and plan.scheduler._time_attr == "epoch"
    assert min(m for m, _ in plan.scheduler._brackets[0]._rungs) == 5  # grace_epochs, not 1
    assert plan.search_alg.inner.budgets == [5, 15, 45, 135, 150]
    assert plan.num_samples == 40


# ----------------------------------------------------------------------------- every N


def _check(trials: dict, max_epochs: int, grace: int, factor: float, n: int) -> None:
    epochs = {t: len(v) for t, (_, v) in trials.items()}
    assert len(trials) == n
    assert min(epochs.values()) >= grace, f"N={n}: a trial stopped before grace_epochs"
    assert max(epochs.values()) == max_epochs, f"N={n}: no trial trained to max_epochs"
    # The best at each rung goes on to the next milestone (or to max_epochs from the last).
    milestones = algorithms.rungs(grace, max_epochs, factor) + [max_epochs]
    for rung, following in zip(milestones, milestones[1:], strict=False):
        at_rung = {t: v[rung - 1] for t, (_, v) in trials.items() if len(v) >= rung}
        best = max(at_rung, key=at_rung.get)
        assert epochs[best] >= following, f"N={n}: the best at epoch {rung} stopped at {epochs[best]}"
    assert min(epochs.values()) == milestones[0], f"N={n}: nobody stopped at the first rung"
    if n >= 30:  # ASHA lets most early arrivals through; with more trials the rungs bite
        assert sum(epochs.values()) < 0.5 * n * max_epochs, f"N={n}: {sum(epochs.values())} epochs"


class _Listed:
    """Hands out a fixed list of configurations and learns nothing (a searcher's interface)."""

    def __init__(self, configs: list[dict[str, Any]]):
        self.configs = iter(configs)

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return next(self.configs)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass


@pytest.mark.slow  # 372 simulated sweeps: seconds each case
@pytest.mark.parametrize("max_epochs, grace, factor", [(150, 5, 3), (27, 1, 3), (10, 1, 2), (50, 3, 2.5)])
def test_every_num_samples_from_8_to_100_trains_the_best_to_max_epochs(
    max_epochs: int, grace: int, factor: float
) -> None:
    """The scheduler a sweep gets, for each N: nobody stops before grace_epochs, the best at
    every rung goes on, at least one trial trains to max_epochs (HyperBandForBOHB: none did
    for N=40, 150 epochs). Configurations drawn at random keep the 372 runs fast; the model
    in the loop is the next test."""
    for n in range(8, 101):
        cfg, plan = _plan(n, max_epochs, grace, factor)
        plan.search_alg = _Listed(algorithms.random_configs(cfg.hyperparameters(), n, seed=n))
        _check(simulate(plan, n, max_epochs, seed=n), max_epochs, grace, factor, n)


@pytest.mark.parametrize("n", [8, 40, 100])
def test_the_model_proposes_and_learns_at_every_rung(n: int) -> None:
    """The whole plan (model included) for the issue's sweep: the same guarantees, and the
    model is told every trial at every budget it reached, winners and stopped ones alike."""
    max_epochs, grace, factor = 150, 5, 3
    _, plan = _plan(n, max_epochs, grace, factor)
    trials = simulate(plan, n, max_epochs)
    _check(trials, max_epochs, grace, factor, n)
    bohber = plan.search_alg.inner.bohber
    for budget in (5, 15, 45, 135, 150):
        reached = sum(len(v) >= budget for _, v in trials.values())
        # hpbandster stops recording a budget once a larger one has a model of its own.
        if not any(b > budget for b in bohber.kde_models):
            assert len(bohber.losses.get(budget, [])) == reached, budget
    assert set(bohber.losses) <= {5, 15, 45, 135, 150}  # rung budgets only, never epoch 7
    if n >= 40:
        assert bohber.kde_models  # the model took over from random sampling


def test_same_seed_same_sweep_with_the_model_in_charge() -> None:
    """hpbandster draws from numpy's global generator, as Ray's schedulers do: whatever they
    drew, the same seed and results give the same proposals, model-based ones included."""
    import numpy as np

    runs = []
    for outside in (1, 2):
        np.random.seed(outside)
        _, plan = _plan(40, 27, 1, 3)
        runs.append([config for config, _ in simulate(plan, 40, 27).values()])
        assert plan.search_alg.inner.bohber.kde_models
    assert runs[0] == runs[1]


def test_a_failed_trial_counts_as_the_worst_at_its_next_budget() -> None:
    _, plan = _plan(8, 27, 3, 3)
    s = plan.search_alg
    for i, result in enumerate(
        [
            {"epoch": 2, "val_acc": -math.inf, "failure": "diverged"},  # before grace: counted at 3
            {"epoch": 9, "val_acc": 0.8},  # a rung: counted as is
        ]
    ):
        s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", result)
    s.suggest("crash")
    s.on_trial_result("crash", {"epoch": 3, "val_acc": 0.5})
    s.on_trial_complete("crash", error=True)  # an exception after epoch 3: counted at 9
    bohber = s.inner.bohber
    assert bohber.losses == {3: [math.inf, -0.5], 9: [-0.8, math.inf]}


# ----------------------------------------------------------------------------- resume


def _history(values: list[float]) -> list[dict[str, Any]]:
    return [{"epoch": e, "val_acc": v} for e, v in enumerate(values, 1)]


def test_a_resumed_plan_starts_from_the_earlier_rungs_and_results() -> None:
    """Rebuilt from an earlier run, ASHA's rungs hold its trials (a new trial worse than they
    were is stopped at once) and the model was told their rung results only."""
    _, fresh = _plan(8, 9, 1, 3)
    old = [fresh.search_alg.suggest(f"o{i}") for i in range(4)]
    prior = Prior(
        finished=[PriorTrial(c, _history([0.8 + 0.01 * i] * 3)) for i, c in enumerate(old[:3])],
        resumed=[old[3]],
        new=4,
    )
    _, resumed = _plan(8, 9, 1, 3, prior)
    weak = SimpleNamespace(trial_id="new")
    for plan, expected in ((fresh, "CONTINUE"), (resumed, "STOP")):
        plan.scheduler.on_trial_add(None, weak)
        assert plan.scheduler.on_trial_result(None, weak, {"epoch": 1, "val_acc": 0.5}) == expected
    bohber = resumed.search_alg.inner.bohber
    assert {b: len(v) for b, v in bohber.losses.items()} == {1: 3, 3: 3}  # not epoch 2


# ----------------------------------------------------------------------------- real sweeps


def _tune_results(trial_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (trial_dir / "result.json").open()]


def test_a_bohb_sweep_trains_its_best_to_max_epochs(ray_session, tmp_path: Path) -> None:
    """Real training on Ray: grace 2, rungs at 2 and 6, 9 epochs at most, 8 trials (the same
    for every N up to 100, with the same scheduler and searcher, is simulated above); and what
    test_sweep checks every algorithm's sweep for (summary, Tune's records, TensorBoard)."""
    from tests.test_sweep import check_completed
    from tuner.driver.sweep import run_sweep

    n = 8
    cfg = debug_config(
        tmp_path,
        search__algorithm="bohb",
        search__num_samples=n,
        schedule__max_epochs=9,
        schedule__grace_epochs=2,
        schedule__reduction_factor=3,
    )
    out = run_sweep(cfg)
    check_completed(out, cfg, "bohb")  # what every algorithm's sweep is checked for
    trials = out.summary["trials"]
    assert len(trials) == n
    epochs = {t["trial_id"]: t["epochs"] for t in trials}
    assert min(epochs.values()) >= 2 and max(epochs.values()) == 9, epochs
    assert out.summary["counts"].get("completed", 0) >= 1, out.summary["counts"]
    histories = {t: read_metrics(str(Path(out.sweep_dir) / t)) for t in epochs}
    at_last_rung = {t: h[5]["val_acc"] for t, h in histories.items() if len(h) >= 6}
    assert epochs[max(at_last_rung, key=at_last_rung.get)] == 9  # the best there trained on
    for t in epochs:  # asynchronous: no trial paused at a rung, so none was restored
        rows = _tune_results(Path(out.sweep_dir) / t)
        assert [r["iterations_since_restore"] for r in rows] == [r["epoch"] for r in rows]
    # the report says how each configuration was proposed (the model or random, and why) and
    # how the rungs ranked the trials that reached a later one: Spearman from their histories
    from scipy.stats import spearmanr

    from tuner.view.report import write_report

    origins = Counter(t["origin"] for t in trials)
    assert all(o.startswith("searcher: ") for o in origins), origins
    markdown = write_report(out.sweep_dir, str(tmp_path / "report")).markdown
    section = markdown.split("## Where the configurations came from\n", 1)[1].split("\n## ", 1)[0]
    tables = [_rows(block) for block in section.split("\n\n") if block.startswith("|")]
    shown, ranked = tables[0], (tables[1] if len(tables) > 1 else [])  # (none: no 3 trials at 2 rungs)
    assert {r["origin"]: int(r["trials"]) for r in shown} == dict(origins)
    expected = {}
    for low, high in ((2, 6), (2, 9), (6, 9)):
        both = [h for h in histories.values() if len(h) >= high]
        if len(both) >= 3:
            rho = spearmanr([h[low - 1]["val_acc"] for h in both], [h[high - 1]["val_acc"] for h in both])
            # (undefined where one rung's values are all equal: the report says "-")
            expected[(str(low), str(high))] = "-" if math.isnan(rho.statistic) else f"{rho.statistic:.2f}"
    assert {(r["rung"], r["later rung"]): r["Spearman"] for r in ranked} == expected


def _rows(table: str) -> list[dict[str, str]]:
    """A markdown table's rows as dicts."""
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in table.strip().splitlines()]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[2:]]


@pytest.mark.parametrize("m, bw", [(0.5, 0.2), (0.05, 0.3), (0.97, 0.01)])
def test_the_fast_truncated_normal_is_scipys_distribution(m: float, bw: float) -> None:
    """hpbandster's draw around a point m of [0, 1] with bandwidth bw, by the inverse CDF:
    inside [0, 1], and the distribution scipy's truncnorm defines (Kolmogorov-Smirnov)."""
    import numpy as np
    from scipy import stats

    from tuner.search.hpbandster_fixes import _TruncNorm

    np.random.seed(0)
    a, b = -m / bw, (1 - m) / bw
    xs = [_TruncNorm.rvs(a, b, loc=m, scale=bw) for _ in range(5000)]
    assert 0.0 <= min(xs) and max(xs) <= 1.0
    assert stats.kstest(xs, stats.truncnorm(a, b, loc=m, scale=bw).cdf).pvalue > 0.01


@pytest.mark.slow  # thousands of the model's proposals: 3-15 s on 2 loaded cores
def test_the_models_proposals_are_its_good_density_widened_as_hpbandster_defines() -> None:
    """With a fitted model, one candidate per proposal (num_samples 1) and no random share,
    a proposal is a draw from the "good" density as hpbandster samples it: a data point at
    random, then around each continuous value a normal of bandwidth × bandwidth_factor
    truncated to [0, 1] (the fast inverse-CDF sampler), each choice kept with probability
    1 - bandwidth, else drawn uniformly. 2,000 proposals against that mixture, computed here
    from the model's data: the float (Kolmogorov-Smirnov), the choice, and two integer ranges
    whose integers each own an equal stretch of the model's [0, 1] (chi-square): before issue 32
    hpbandster rounded them, and a range's two ends got half the share."""
    import numpy as np
    from scipy import stats

    from tuner.config import ScheduleSection, SearchSection

    space = {
        "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
        "optimizer": {"type": "choice", "values": ["sgd", "adam", "adamw"]},
        "depth": {"type": "randint", "low": 1, "high": 4},
        "heads": {"type": "lograndint", "low": 1, "high": 8},
    }
    search = SearchSection(algorithm="bohb", params=space, num_samples=100, seed=3)
    plan = algorithms.build(
        search, ScheduleSection(max_epochs=3, grace_epochs=3), search.params, "loss", "min"
    )
    s = plan.search_alg.inner
    rng = random.Random(0)
    for i in range(40):  # told at max_epochs: a loss that prefers lr near 1e-3, the rest noise
        c = s.suggest(f"t{i}")
        loss = abs(math.log10(c["lr"]) + 3) + 2 * rng.random()
        s.on_trial_complete(f"t{i}", {"epoch": 3, "loss": loss})
    bohber = s.bohber
    kde = bohber.kde_models[3]["good"]
    bohber.num_samples, bohber.random_fraction = 1, 0.0
    proposals = [s.suggest(f"p{i}") for i in range(2000)]

    names = list(bohber.configspace.keys())
    data, bw = np.asarray(kde.data), np.maximum(np.asarray(kde.bw), bohber.min_bandwidth)
    col = {n: names.index(n) for n in space}

    def mixture_cdf(j: int) -> Any:
        scale = bw[j] * bohber.bw_factor
        parts = [stats.truncnorm(-m / scale, (1 - m) / scale, loc=m, scale=scale) for m in data[:, j]]
        return lambda x: np.mean([d.cdf(x) for d in parts], axis=0)

    def stretch_pmf(j: int, edges: list[float]) -> dict[int, float]:
        cdf = mixture_cdf(j)
        return {
            k: float(cdf(hi) - cdf(lo))
            for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True), 1)
        }

    lr_vector = [(math.log(c["lr"]) - math.log(1e-4)) / math.log(1e-1 / 1e-4) for c in proposals]
    p = {"lr": stats.kstest(lr_vector, mixture_cdf(col["lr"])).pvalue}
    p["depth"] = _chi_square(
        [c["depth"] for c in proposals], stretch_pmf(col["depth"], [0, 0.25, 0.5, 0.75, 1])
    )
    log_edges = [math.log(k) / math.log(9) for k in range(1, 10)]  # k owns [k, k + 1) of [1, 9)
    p["heads"] = _chi_square([c["heads"] for c in proposals], stretch_pmf(col["heads"], log_edges))
    j, values = col["optimizer"], ["sgd", "adam", "adamw"]
    kept = 1 - bw[j]
    choice_pmf = {v: float(np.mean(kept * (data[:, j] == i) + bw[j] / 3)) for i, v in enumerate(values)}
    p["optimizer"] = _chi_square([c["optimizer"] for c in proposals], choice_pmf, bins=3)
    assert min(p.values()) > 1e-3, p


def _chi_square(values: list[Any], pmf: dict[Any, float], bins: int = 10) -> float:
    from tests.test_algorithms import _chi_square as pooled

    return pooled(values, pmf, bins)


def _fitted_on_one_choice() -> Any:
    """A bohb searcher whose model was fitted on results where every good one is adam."""
    from tuner.config import ScheduleSection, SearchSection

    space = {
        "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
        "optimizer": {"type": "choice", "values": ["sgd", "adam", "adamw"]},
    }
    search = SearchSection(algorithm="bohb", params=space, num_samples=100, seed=0)
    plan = algorithms.build(
        search, ScheduleSection(max_epochs=1, grace_epochs=1), search.params, "loss", "min"
    )
    s = plan.search_alg.inner
    for i in range(30):
        c = s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", {"epoch": 1, "loss": (c["optimizer"] != "adam") + i / 100})
    return s


@pytest.mark.slow  # thousands of the model's proposals: 3-15 s on 2 loaded cores
def test_a_choice_absent_from_the_good_results_is_unlikely_not_infinitely_likely() -> None:
    """Every good result is adam: statsmodels counted the choice's values in those results
    (one), divided by zero, and gave sgd and adamw an infinite density, so any candidate with
    them won. Counted over the space's three values, by the Aitchison-Aitken kernel's
    definition: 1 - bandwidth for the value seen, bandwidth / 2 for each other."""
    import numpy as np

    s = _fitted_on_one_choice()
    bohber = s.bohber
    good = bohber.kde_models[1]["good"]
    j = list(bohber.configspace.keys()).index("optimizer")
    assert set(np.asarray(good.data)[:, j]) == {1.0}  # adam, every one
    lam = min(float(good.bw[j]), 2 / 3)
    point = np.asarray(good.data)[0].copy()
    at_adam = good.pdf(point)
    point[j] = 0.0  # sgd
    at_sgd = good.pdf(point)
    assert math.isfinite(at_sgd) and math.isfinite(at_adam)
    assert at_sgd / at_adam == pytest.approx((lam / 2) / (1 - lam))
    model_picks = [s.suggest(f"p{i}")["optimizer"] for i in range(300)]
    assert model_picks.count("adam") > 0.6 * len(model_picks)  # a third are random: adam a third of those


def test_no_statsmodels_warning_reaches_the_console_of_a_bohb_sweep() -> None:
    """statsmodels' FutureWarning (reported from pandas) and its RuntimeWarning (the division
    by zero) were printed by every bohb sweep; fitting and proposing now raise neither, and
    the filters are gone again afterwards."""
    import warnings

    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fitted_on_one_choice()
        _, plan = _plan(60, 27, 1, 3)
        simulate(plan, 60, 27)
    loud = [w for w in caught if issubclass(w.category, (FutureWarning, RuntimeWarning))]
    assert not loud, [str(w.message) for w in loud]
    assert warnings.filters == before
    with pytest.warns(FutureWarning, match="After 0.17"):  # still raised by statsmodels itself
        import numpy as np
        from statsmodels.nonparametric.kernel_density import KDEMultivariate

        KDEMultivariate(np.random.default_rng(0).random((8, 1)), var_type="c", bw="normal_reference")


def test_same_seed_same_sweep_on_a_conditional_space() -> None:
    """hpbandster also draws when it fits (a conditional parameter's absent values are filled
    with random ones): that draw too comes from the searcher's own generator, whatever the
    global one holds."""
    import numpy as np

    from tuner.config import ScheduleSection, SearchSection

    space = {
        "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
        "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
        "momentum": {"type": "uniform", "low": 0.5, "high": 0.99, "when": {"optimizer": "sgd"}},
    }
    runs = []
    for outside in (1, 2):
        np.random.seed(outside)
        search = SearchSection(algorithm="bohb", params=space, num_samples=40, seed=0)
        schedule = ScheduleSection(max_epochs=27, grace_epochs=1, reduction_factor=3)
        plan = algorithms.build(search, schedule, search.params, "val_acc", "max")
        runs.append([config for config, _ in simulate(plan, 40, 27).values()])
        assert plan.search_alg.inner.bohber.kde_models
    assert runs[0] == runs[1]


def test_rungs_agree_when_their_ranks_clearly_do() -> None:
    """`agrees`: Spearman one standard error below its estimate >= AGREEMENT: the same ranks
    over 6 trials agree, reversed ones (rho -1) do not, nor does rho 0.66 over 6 trials, which
    over 60 does."""
    _, plan = _plan(8, 27, 3, 3)
    bohb = plan.search_alg.inner
    assert bohb.agrees(3, 9) is None  # nothing told yet
    bohb.at_budget[3] = {i: float(i) for i in range(6)}
    bohb.at_budget[9] = {i: float(i) for i in range(6)}
    assert bohb.agrees(3, 9) == (True, "Spearman 1.00 over 6 trials")
    bohb.at_budget[9] = {i: -float(i) for i in range(6)}
    assert bohb.agrees(3, 9) == (False, "Spearman -1.00 over 6 trials")
    weak = [2, 0, 1, 5, 3, 4]  # against 0..5: rho 0.66
    bohb.at_budget[9] = {i: float(v) for i, v in enumerate(weak)}
    assert bohb.agrees(3, 9) == (False, "Spearman 0.66 over 6 trials")
    bohb.at_budget[3] = {i: float(i % 6) for i in range(60)}  # the same, ten times over
    bohb.at_budget[9] = {i: float(weak[i % 6]) for i in range(60)}
    assert bohb.agrees(3, 9) == (True, "Spearman 0.66 over 60 trials")


@pytest.mark.slow  # (60 bohb trials: seconds of model fits)
def test_a_model_whose_rung_ranks_trials_unlike_the_later_ones_is_not_used() -> None:
    """The benchmark's conditional task: sgd leads at the first rung, adam at the end. bohb
    measures how the losses it was told at each rung rank the trials against each later rung
    (Spearman, over the trials told at both: the same as computed here from their curves),
    proposes at random while the rung its model was fitted on, or a lower rung that chose the
    trials there, disagrees, and records in each trial's origin how it was proposed. On a task
    whose rungs rank the trials as the end does, its model proposes."""
    from scipy.stats import spearmanr

    from benchmarks.tasks.conditional import loss
    from tuner.config import load_sweep
    from tuner.search.bohb import AGREEMENT
    from tuner.search.simulate import simulate as run

    cfg = load_sweep(ROOT / "benchmarks" / "tasks" / "conditional.yaml", {"search.algorithm": "bohb"})
    cfg.search.num_samples = 60
    plan = algorithms.build(cfg.search, cfg.schedule, cfg.hyperparameters(), "val_loss", "min")
    trials = run(plan, 60, 27, lambda c, e, _: loss(c, e), metric="val_loss", direction="min")
    bohb = plan.search_alg.inner
    for low, high in ((1, 3), (1, 9), (3, 9)):
        both = [t for t in trials.values() if len(t.values) >= high]  # (a diverged one: inf at 3)
        expected = spearmanr([t.values[low - 1] for t in both], [t.values[high - 1] for t in both]).statistic
        assert bohb.agreement(low, high) == pytest.approx(expected)
    assert bohb.agreement(1, 9) < AGREEMENT  # the first rung misleads
    assert "disagree with" in str(bohb.trust(1))
    # the trials that reached 27 epochs passed the first rung, which chose them by the wrong
    # order (mostly sgd): a model of them is not used either
    assert bohb.agreement(1, 27) < AGREEMENT
    assert "passed the rung at 1 epoch" in str(bohb.trust(27))
    origins = list(bohb.handed.values())
    assert all(o.startswith("searcher: ") for o in origins)
    assert any("disagree with" in o for o in origins)
    assert not any(o.startswith("searcher: model at") for o in origins[len(origins) // 2 :])

    # where every rung ranks the trials as the end does (one speed for all), the model is used
    def agreeing(config: dict[str, Any], epoch: int, rng: random.Random) -> float:
        return loss(config, 27) + 2.0 * math.exp(-epoch / 3) + rng.gauss(0, 0.002)

    plan = algorithms.build(cfg.search, cfg.schedule, cfg.hyperparameters(), "val_loss", "min")
    run(plan, 60, 27, agreeing, metric="val_loss", direction="min")
    bohb = plan.search_alg.inner
    assert bohb.trust(1) is None and bohb.trust(27) is None
    assert any(o.startswith("searcher: model at") for o in bohb.handed.values())
