"""`tuner refine`: a narrower sweep file around a finished sweep's best trials (issue 51)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli
from tuner.config import load_sweep
from tuner.space.params import Choice, LogRandInt, LogUniform, RandInt, Uniform, allows
from tuner.view.refine import narrowed


def test_a_range_narrows_around_the_values_inside_its_old_bounds() -> None:
    lr = LogUniform(type="loguniform", low=1e-4, high=1e-1)
    got = narrowed(lr, [1e-3, 4e-3])
    assert lr.low <= got.low < 1e-3 and 4e-3 < got.high <= lr.high
    span = math.log(4e-3) - math.log(1e-3)  # 25% of the top values' span each side, in log space
    assert math.log(got.low) == pytest.approx(math.log(1e-3) - 0.25 * span)
    assert narrowed(lr, [1e-4, 1e-1]) == lr  # (never beyond the old bounds)
    x = Uniform(type="uniform", low=0.0, high=1.0)
    one = narrowed(x, [0.5, 0.5])  # all alike: a tenth of the old span around it
    assert (one.low, one.high) == pytest.approx((0.45, 0.55))
    width = LogRandInt(type="lograndint", low=32, high=512)
    got = narrowed(width, [100, 120])
    assert isinstance(got.low, int) and got.low <= 100 and got.high >= 120 and got.high - got.low < 480
    depth = RandInt(type="randint", low=1, high=3)
    assert narrowed(depth, [3, 3]).high == 3 and narrowed(depth, [3, 3]).low == 2
    opt = Choice(type="choice", values=["sgd", "adam", "adamw"])
    assert narrowed(opt, ["adamw", "adam", "adam"]).values == ["adam", "adamw"]
    assert narrowed(opt, []) == opt


@pytest.mark.usefixtures("ray_session")
def test_refine_a_digits_sweep_into_a_file_that_holds_its_best(tmp_path: Path) -> None:
    digits = str(ROOT / "search_spaces" / "digits_mlp.yaml")
    small = ("--output", str(tmp_path), "--num-samples", "6", "--max-epochs", "1")
    done = cli("sweep", digits, *small, on_session=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sweep = tmp_path / "digits-mlp"
    out = tmp_path / "fine.yaml"
    refined = cli("refine", str(sweep), "--output", str(out))
    assert refined.returncode == 0, refined.stderr
    assert f"refined: {out}" in refined.stdout
    cfg, old = load_sweep(out), load_sweep(ROOT / "search_spaces" / "digits_mlp.yaml")
    assert cfg.name == "digits-mlp_refined" and cfg.search.warm_start == [str(sweep)]
    best = json.loads((sweep / "summary.json").read_text())["best"]["config"]
    for name, p in cfg.search.params.items():
        assert allows(p, best[name]), (name, p, best[name])
        was = old.search.params[name]
        if hasattr(p, "low"):
            assert was.low <= p.low and p.high <= was.high, (name, p, was)
        elif hasattr(p, "values"):
            assert set(p.values) <= set(was.values)
    assert cfg.search.params["lr"] != old.search.params["lr"]  # (narrowed, not copied)
    again = cli("refine", str(sweep), "--output", str(out))
    assert again.returncode == 2 and "exists" in again.stderr  # nothing overwritten
