"""Several objectives in real sweeps (issue 14, part 3): a 20-trial Optuna multi-objective
sweep (16 trials, then `extend` by 4: the searcher rebuilt from the journals) and a random one,
their summary.json's pareto against a front recomputed here from the trials' own journals,
num_params against a hand count, the CLI's marks and the report's Pareto front."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import debug_config
from tuner.cli import _print_outcome
from tuner.driver.sweep import extend_sweep, run_sweep
from tuner.view.report import write_report

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def _mlp_params(width: int) -> int:
    """debug.yaml's MLP, counted by hand: 8 features -> width -> 3 classes, with biases."""
    return 8 * width + width + width * 3 + 3


def _front_from_journals(sweep_dir: str, objectives: list[tuple[str, str]]) -> tuple[set[str], dict]:
    """The Pareto front by its definition (every pair compared), from each trial's
    metrics.jsonl: a trial at its first epoch of the best value of the first objective."""
    (first, first_mode), values = objectives[0], {}
    for journal in Path(sweep_dir).glob("*/metrics.jsonl"):
        rows = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
        ok = [r for r in rows if "failure" not in r and math.isfinite(r.get(first, math.nan))]
        if ok and not any("failure" in r for r in rows):
            pick = max if first_mode == "max" else min
            best = pick(ok, key=lambda r: r[first])
            values[journal.parent.name] = tuple(
                best[n] if mode == "max" else -best[n] for n, mode in objectives
            )
    front = {
        t
        for t, v in values.items()
        if not any(all(a >= b for a, b in zip(w, v, strict=True)) and w != v for w in values.values())
    }
    return front, values


def _check(outcome: Any, objectives: list[tuple[str, str]], trials: int) -> set[str]:
    summary = outcome.summary
    assert outcome.exit_code == 0 and len(summary["trials"]) == trials, summary["counts"]
    # No early stopping with several objectives: every trial trained to max_epochs.
    assert summary["counts"] == {"completed": trials}, summary["counts"]
    front, values = _front_from_journals(outcome.sweep_dir, objectives)
    assert len(values) == trials
    assert set(summary["pareto"]) == front and len(summary["pareto"]) == len(front)
    assert summary["objectives"] == [list(o) for o in objectives]
    for i in range(len(objectives)):  # both objectives vary, so the front means something
        assert len({v[i] for v in values.values()}) > 1, values
    for t in summary["trials"]:
        rows = (Path(outcome.sweep_dir) / t["trial_id"] / "metrics.jsonl").read_text().splitlines()
        assert {json.loads(r)["num_params"] for r in rows} == {_mlp_params(t["config"]["width"])}
    # best stays the best of the first objective, on the front or not.
    (first, mode), best = objectives[0], summary["best"]
    pick = max if mode == "max" else min
    assert best["metrics"][first] == pick(t["best_value"] for t in summary["trials"])
    # The CLI table marks exactly the front's trials it shows, and shows them all here.
    rows = [line.split() for line in outcome.table.splitlines()[1:]]
    assert len(front) > 10 or front <= {r[0] for r in rows}
    assert {r[0] for r in rows if r[5] == "*"} == front & {r[0] for r in rows}
    return front


def test_optuna_multi_objective_sweep_then_extended(tmp_path: Path) -> None:
    objectives = [("val_acc", "max"), ("num_params", "min")]
    cfg = debug_config(
        tmp_path,
        name="pareto-optuna",
        metric=["val_acc", "num_params"],
        direction=["max", "min"],
        search__algorithm="optuna",
        search__num_samples=16,
        schedule__max_epochs=2,
    )
    first = run_sweep(cfg)
    _check(first, objectives, 16)
    grown = extend_sweep(first.sweep_dir, 4)
    front = _check(grown, objectives, 20)

    report = write_report(grown.sweep_dir, str(tmp_path / "report"))
    section = report.markdown.split("## Pareto front\n", 1)[1].split("\n## ", 1)[0]
    listed = [ln.strip("|").split(" | ")[0].strip() for ln in section.splitlines() if ln.startswith("|")][2:]
    assert set(listed) == front and len(listed) == len(front)
    assert (tmp_path / "report" / "pareto.png").stat().st_size > 0


def test_random_search_with_two_minimised_objectives(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    objectives = [("val_loss", "min"), ("num_params", "min")]
    cfg = debug_config(
        tmp_path,
        name="pareto-random",
        metric=["val_loss", "num_params"],
        direction=None,
        search__num_samples=6,
        schedule__max_epochs=2,
    )
    assert cfg.direction == ["min", "min"]
    outcome = run_sweep(cfg)
    front = _check(outcome, objectives, 6)
    _print_outcome(outcome)
    out = capsys.readouterr().out
    assert f"pareto front (val_loss vs num_params): {len(front)} trials, marked * above" in out
