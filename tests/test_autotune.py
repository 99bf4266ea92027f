"""training.autotune's choice, guard, budget, sizes and cache (tuner/autotune.py), from given
measurements: which arm is chosen follows from the figures, not from this machine's speed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tuner import autotune
from tuner.autotune import Dimension, Measurement
from tuner.config import TrainingSection
from tuner.space.params import Choice, Fixed, LogUniform, RandInt, Uniform

DIMS = [
    Dimension("compile", (False, True)),
    Dimension("channels_last", (False, True)),
    Dimension("threads", (2, 1)),
]


class Figures:
    """A measure function answering from a table keyed by the arm's settings; notes each call."""

    def __init__(self, table: dict[tuple[Any, ...], tuple[float, float]], clock: list[float] | None = None):
        self.table, self.calls, self.clock = table, [], clock

    def __call__(self, settings: dict[str, Any], left: float) -> Measurement:
        self.calls.append((dict(settings), left))
        if self.clock is not None:
            self.clock[0] += 10.0  # every arm costs 10 s of the fake clock
        figures = self.table[_key(settings)]
        if isinstance(figures, str):
            return Measurement(seconds=10.0, error=figures)
        rate, loss = figures
        return Measurement(rate, loss, 10.0)


def _key(settings: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(settings.get(d.name, d.values[0]) for d in DIMS)


def _fastest_passing(figures: Figures) -> dict[str, Any]:
    """The independent answer: of the arms measured, the fastest within the loss guard."""
    reference = figures.table[(False, False, 2)][1]
    measured = [(figures.table[_key(s)], s) for s, _ in figures.calls]
    ok = [(f, s) for f, s in measured if not isinstance(f, str)]
    ok = [(f, s) for f, s in ok if abs(f[1] - reference) / reference <= autotune.LOSS_TOLERANCE]
    return max(ok, key=lambda pair: pair[0][0])[1]


def test_the_choice_is_the_fastest_arm_within_the_loss_guard() -> None:
    figures = Figures(
        {
            (False, False, 2): (100.0, 2.000),  # the reference
            (True, False, 2): (150.0, 2.010),  # compile: faster, loss 0.5% off: taken
            (True, True, 2): (140.0, 2.000),  # channels_last on top: slower
            (True, False, 1): (400.0, 2.300),  # one thread: fastest of all, loss 15% off: refused
        }
    )
    result = autotune.search(DIMS, figures, budget_s=1000)
    assert result.choice == {"compile": True, "channels_last": False, "threads": 2}
    assert result.choice == _fastest_passing(figures)
    assert [a.change for a in result.arms] == [
        *("reference", "compile=true", "channels_last=true", "threads=1"),
        *("reference, again", "compile=true, again"),  # the gain measured once more, alternately
    ]
    verdicts = [a.verdict for a in result.arms]
    assert verdicts[0] == "reference" and verdicts[1] == "chosen" and verdicts[2] == "slower"
    assert verdicts[3].startswith("refused: loss 2.3 15.0% off")
    assert verdicts[4:] == ["measured again", "measured again"]
    assert result.speedup == pytest.approx(1.5)
    # Each setting is tried on top of the best so far: the sum of values, not the product
    # (and the reference and the choice once more).
    assert len(figures.calls) == 1 + sum(len(d.values) - 1 for d in DIMS) + 2


def test_a_gain_that_does_not_hold_when_measured_again_is_no_choice() -> None:
    # compile read 20% faster once; measured again beside the reference, it is not: the
    # machine was busier while the reference ran. The trials keep the reference's settings.
    rates = {False: iter([80.0, 100.0]), True: iter([100.0, 84.0])}

    def measure(settings: dict[str, Any], left: float) -> Measurement:
        return Measurement(next(rates[settings["compile"]]), 1.0, 10.0)

    result = autotune.search(DIMS[:1], measure, budget_s=1000)
    assert result.choice == {"compile": False} and result.speedup == 1.0
    assert result.arms[1].verdict.startswith("not borne out measured again (within 3%")
    assert result.arms[0].verdict == "chosen"


def test_a_later_faster_arm_overtakes_and_failures_and_nan_are_refused() -> None:
    figures = Figures(
        {
            (False, False, 2): (100.0, 1.0),
            (True, False, 2): "OutOfMemoryError: out of memory: CUDA out of memory",
            (False, True, 2): (120.0, 1.0),
            (False, True, 1): (130.0, math.nan),
        }
    )
    result = autotune.search(DIMS, figures, budget_s=1000)
    assert result.choice == {"compile": False, "channels_last": True, "threads": 2}
    assert result.arms[1].verdict.startswith("failed: OutOfMemoryError")
    assert result.arms[3].verdict.startswith("refused: loss nan not finite")


def test_a_gain_within_the_noise_keeps_the_setting_as_it_was() -> None:
    small = 100.0 * (1 + autotune.MIN_GAIN / 2)
    figures = Figures(
        {(False, False, 2): (100.0, 1.0), (True, False, 2): (small, 1.0), (False, True, 2): (99.0, 1.0)}
    )
    result = autotune.search(DIMS[:2], figures, budget_s=1000)
    assert result.choice == {"compile": False, "channels_last": False}
    assert result.arms[0].verdict == "chosen" and "not worth a change" in result.arms[1].verdict


def test_a_gain_the_segments_do_not_bear_out_is_no_gain_and_the_table_shows_each_spread() -> None:
    # A median 10% faster, but the machine's other work slowed the segments of both arms at
    # random: compile's beat the reference's in too few pairs to tell.
    ref = [100.0, 60.0, 101.0, 99.0, 40.0, 100.0, 102.0, 70.0]
    noisy = [110.0, 55.0, 112.0, 108.0, 109.0, 50.0, 111.0, 65.0]

    def arm(rates: list[float]) -> Measurement:
        ordered = sorted(rates)
        median = (ordered[3] + ordered[4]) / 2
        spread = (ordered[-2] - ordered[1]) / 2 / median
        return Measurement(median, 1.0, 10.0, spread=spread, steps=32, segments=rates)

    figures = {(False, False, 2): arm(ref), (True, False, 2): arm(noisy)}
    result = autotune.search(DIMS[:1], lambda settings, left: figures[_key(settings)], budget_s=1000)
    assert result.arms[1].measured.samples_per_s > 1.03 * 99.5  # type: ignore[union-attr]
    assert result.choice == {"compile": False}
    share = autotune.beats(noisy, ref)
    assert share < autotune.SURE
    assert result.arms[1].verdict == (
        f"within the noise: its segments beat the best's in {share:.0%} of pairs (needs {autotune.SURE:.0%})"
    )
    table = autotune.table_markdown(result)
    assert "| reference | 99.5 | ±20.6% | 32 | 1 | 10.0 | chosen |" in table, table
    # The same 10% where every segment shows it: a gain.
    steady = {(False, False, 2): arm([100.0] * 8), (True, False, 2): arm([110.0, 109.0] * 4)}
    result = autotune.search(DIMS[:1], lambda settings, left: steady[_key(settings)], budget_s=1000)
    assert result.choice == {"compile": True} and result.speedup == pytest.approx(1.095)
    again = autotune.Result.from_json(json.loads(json.dumps(result.to_json())))
    assert again.arms[1].measured == result.arms[1].measured  # segments kept in autotune.json


def test_the_reference_arm_failing_stops_autotune_with_the_reason() -> None:
    figures = Figures({(False, False, 2): "RuntimeError: boom"})
    with pytest.raises(autotune.AutotuneError, match="reference arm .*compile=false.*RuntimeError: boom"):
        autotune.search(DIMS, figures, budget_s=1000)


def test_the_cost_is_bounded_by_the_budget_and_printed() -> None:
    clock = [0.0]
    table = {(False, False, 2): (100.0, 1.0), (True, False, 2): (150.0, 1.0), (True, True, 2): (200.0, 1.0)}
    table[(True, True, 1)] = (400.0, 1.0)
    figures = Figures(table, clock)
    # 25 s: the reference (to 10 s), compile (to 20 s), channels_last (starts at 20, ends at
    # 30); threads=1 would start past the budget: not run.
    result = autotune.search(DIMS, figures, budget_s=25, clock=lambda: clock[0])
    assert len(figures.calls) == 3
    assert [left for _, left in figures.calls] == [25, 15, 5]  # each arm is told what is left
    assert result.arms[3].measured is None and result.arms[3].verdict == "not run: budget spent"
    # threads had no other value measured: the trials keep the file's (not the reference's).
    assert result.choice == {"compile": True, "channels_last": True}
    assert result.seconds == 30
    result.device = "CPU"
    line = autotune.summary_line(result, "autotune")
    assert "3 arms in 30.0 s of a 25 s budget on CPU, 1 not run (budget spent)" in line
    assert line.startswith("autotune: compile=true, channels_last=true, 2.00x the reference's samples/s")
    assert "| threads=1 |  |  |  |  |  | not run: budget spent |" in autotune.table_markdown(result)


def test_dimensions_are_what_differs_on_the_device_and_never_a_searched_setting() -> None:
    cpu = autotune.dimensions([], {}, cuda=False, images=True, in_memory=True, cpus=4)
    assert {d.name: d.values for d in cpu} == {
        "compile": (False, True),
        "channels_last": (False, True),
        "threads": (4, 2, 1),
    }
    gpu = autotune.dimensions(
        ["compile"], {"loader_workers": 3}, cuda=True, images=False, in_memory=False, cpus=4
    )
    # The loader first: a compute setting measured behind a loader that cannot keep up reads
    # the loader's rate.
    assert [(d.name, d.values) for d in gpu] == [
        ("loader_workers", (3, 2, 8)),
        ("amp", ("off", "bf16", "fp16")),
    ]
    old_gpu = autotune.dimensions(
        ["loader_workers"], {}, cuda=True, images=False, in_memory=True, cpus=1, bf16=False
    )
    assert [(d.name, d.values) for d in old_gpu] == [("amp", ("off", "fp16")), ("compile", (False, True))]


def test_sizes_are_the_searched_model_parameters_and_the_batch() -> None:
    training = TrainingSection.model_fields
    params = {
        "width": Choice(type="choice", values=[64, 128]),
        "dropout": Uniform(type="uniform", low=0.0, high=0.5),
        "lr": LogUniform(type="loguniform", low=1e-4, high=1e-2),
        "batch_size": Choice(type="choice", values=[32, 64]),
        "heads": Fixed(value=4),
    }
    assert autotune.size_names(params, "vit", training) == ["width", "batch_size"]
    user = {
        "layers": RandInt(type="randint", low=1, high=3),
        "scale": Choice(type="choice", values=[0.5, 1.0]),
    }
    assert autotune.size_names(user, "mypkg.models:net", training) == ["layers"]


def test_constraints_decide_which_sizes_count() -> None:
    heads = Choice(type="choice", values=[2, 3])
    lr = LogUniform(type="loguniform", low=1e-4, high=1e-2)
    # width % heads == 0 leaves (64, 2), (96, 2) and (96, 3): three sizes, each tuned.
    three = {"width": Choice(type="choice", values=[64, 96]), "heads": heads, "lr": lr}
    plan = autotune.plan_sizes(three, ["width % heads == 0"], ["width", "heads"])
    assert sorted((c["width"], c["heads"]) for c in plan.configs) == [(64, 2), (96, 2), (96, 3)]
    # With 128 too it leaves four: the largest that keeps the constraint, for all.
    four = {**three, "width": Choice(type="choice", values=[64, 96, 128])}
    plan = autotune.plan_sizes(four, ["width % heads == 0"], ["width", "heads"])
    assert [(c["width"], c["heads"]) for c in plan.configs] == [(128, 2)]
    assert plan.note.startswith("4 model sizes")


def test_sizes_within_the_cap_are_each_tuned_and_trials_take_their_own() -> None:
    params: dict[str, Any] = {
        "width": Choice(type="choice", values=[64, 128, 96]),
        "lr": LogUniform(type="loguniform", low=1e-4, high=1e-2),
    }
    plan = autotune.plan_sizes(params, [], ["width"])
    assert sorted(c["width"] for c in plan.configs) == [64, 96, 128]
    assert all(c["lr"] == 1e-2 for c in plan.configs)  # the loss guard at the highest rate
    results = [autotune.Result({"compile": c["width"] > 64}, [], 0.0, 1, 1.0) for c in plan.configs]
    table = autotune.table_of(plan, results)
    assert table.settings_for({"width": 64, "lr": 3e-3}) == {"compile": False}
    assert table.settings_for({"width": 128, "lr": 3e-3}) == {"compile": True}
    assert table.default == {"compile": True}  # the largest's
    # More sizes than MAX_SIZES, or a range: the largest only, its choice for every trial.
    wide = {
        "width": Choice(type="choice", values=[32, 64, 96, 128]),
        "depth": RandInt(type="randint", low=1, high=2),
    }
    plan = autotune.plan_sizes(wide, [], ["width", "depth"])
    assert [(c["width"], c["depth"]) for c in plan.configs] == [(128, 2)]
    assert "8 model sizes: more than 3, so the largest, for all" == plan.note
    ranged = autotune.plan_sizes({"depth": RandInt(type="randint", low=1, high=40)}, [], ["depth"])
    assert [c["depth"] for c in ranged.configs] == [40] and ranged.note.startswith("model sizes from a range")
    table = autotune.table_of(ranged, [autotune.Result({"compile": True}, [], 0.0, 1, 1.0)])
    assert table.settings_for({"depth": 7}) == {"compile": True}


def test_a_cached_choice_is_reused_for_the_same_model_device_and_torch_only(tmp_path: Path) -> None:
    cache = autotune.Cache(str(tmp_path / "cache" / "autotune.json"))
    task = {"task": {"model": "mlp"}, "modules": {}}
    config = {"width": 64, "lr": 0.01, "compile": False}
    key = autotune.fingerprint(task, config, DIMS)
    assert key == autotune.fingerprint(task, {**config, "compile": True}, DIMS)  # a measured setting
    assert key != autotune.fingerprint(task, {**config, "width": 128}, DIMS)
    assert key != autotune.fingerprint({**task, "modules": {"m": "other"}}, config, DIMS)
    # A trial of 2 DDP workers is measured as one rank of them (its share of the batch, DDP's
    # wrapper): not the choice of a 1-worker trial (issue 49, E3); nor of 2 FSDP workers.
    ddp = autotune.fingerprint(task, config, DIMS, workers=2, strategy="ddp")
    assert len({key, ddp, autotune.fingerprint(task, config, DIMS, workers=2, strategy="fsdp")}) == 3
    assert key == autotune.fingerprint(task, config, DIMS, workers=1, strategy="fsdp")  # no strategy alone
    measured = autotune.Result(
        {"compile": True}, [], 42.0, 300, 1.7, "NVIDIA H100", "2.13.0", "2026-11-25 10:00 UTC", "580.1"
    )
    cache.put(key, measured)
    entries = autotune.Cache(cache.path).entries(key)
    hit = autotune.reuse(entries, "NVIDIA H100", "2.13.0", "580.1")
    assert hit is not None and hit.choice == {"compile": True} and hit.cached and hit.seconds == 0.0
    assert autotune.reuse(entries, "NVIDIA H200", "2.13.0", "580.1") is None
    assert autotune.reuse(entries, "NVIDIA H100", "2.14.0", "580.1") is None
    assert autotune.reuse(entries, "NVIDIA H100", "2.13.0", "590.2") is None  # a new driver: again (E13)
    assert autotune.summary_line(hit, "x").endswith(
        "reused from the cache (measured 2026-11-25 10:00 UTC on NVIDIA H100), no cost"
    )
    cache.put(key, hit)  # a reused result is not written back as a new measurement
    stored = json.loads(Path(cache.path).read_text())[key]["NVIDIA H100 | torch 2.13.0 | driver 580.1"]
    assert stored["seconds"] == 42.0 and stored["measured_on"] == "2026-11-25 10:00 UTC"
    Path(cache.path).write_text("{not json")
    assert cache.entries(key) == {}  # damaged: measured again, then rewritten


def test_autotune_json_gives_resumed_trials_the_same_table_and_the_report_its_arms(tmp_path: Path) -> None:
    from tuner import sweepdir
    from tuner.driver import autotune as driver
    from tuner.view.analysis import SweepData
    from tuner.view.document import Table, Text
    from tuner.view.report import _autotune

    figures = Figures({(False, False, 2): (100.0, 1.0), (True, False, 2): (150.0, math.nan)})
    refused = autotune.search(DIMS[:1], figures, budget_s=60)  # compile: a NaN loss
    chosen = autotune.search(
        DIMS[:1], Figures({(False, False, 2): (100.0, 1.0), (True, False, 2): (150.0, 1.0)}), 60
    )
    plan = autotune.SizePlan(
        ["width"], [{"width": 64, "lr": 0.1}, {"width": 128, "lr": 0.1}], "2 model sizes, each"
    )
    raw = [{**r.to_json(), "key": k} for r, k in ((refused, "a"), (chosen, "b"))]
    table = autotune.table_of(plan, [refused, chosen])
    sweepdir.write_autotune(str(tmp_path), driver.record(plan, raw, table, 60))
    again = driver.table_from(sweepdir.read_autotune(str(tmp_path)) or {})
    assert again == table and again.settings_for({"width": 64}) == {"compile": False}
    assert again.settings_for({"width": 128}) == again.default == {"compile": True}

    data = SweepData(str(tmp_path), None, [], "completed", 0.0)  # type: ignore[arg-type]
    blocks = _autotune(data)
    texts = [b.text for b in blocks if isinstance(b, Text)]
    assert texts[0].startswith("Before the first trial, training.autotune measured 2 model sizes, each")
    assert texts[1].startswith("Size width=64: the reference settings, 1.00x")
    assert texts[2].startswith("Size width=128: compile=true, 1.50x")
    tables = [b for b in blocks if isinstance(b, Table)]
    assert tables[0].rows[1][4] == "nan" and tables[0].rows[1][6].startswith("refused: loss nan")
    without = tmp_path / "no-autotune"
    without.mkdir()
    assert _autotune(SweepData(str(without), None, [], "completed", 0.0)) == []  # type: ignore[arg-type]
