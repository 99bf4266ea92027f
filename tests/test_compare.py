"""Comparing sweeps (issue 15): `tuner report A B --output DIR` and `tuner board A B`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli, debug_config
from tests.test_board import get, wait_for
from tuner.config import ConfigError
from tuner.results import TrialRecord
from tuner.view import board
from tuner.view.compare import best_by_epochs, write_comparison


@pytest.fixture(scope="module")
def two(ray_session, tmp_path_factory) -> list[Any]:
    from tuner.driver.sweep import run_sweep

    root = tmp_path_factory.mktemp("compare")
    return [
        run_sweep(debug_config(root, name=n, search__seed=s, search__num_samples=3, schedule__max_epochs=2))
        for n, s in (("first", 0), ("second", 1))
    ]


def _record(trial_id: str, rows: list[tuple[float, float]]) -> TrialRecord:
    history = [{"epoch": i, "val_acc": v, "wall_time": t} for i, (t, v) in enumerate(rows, 1)]
    return TrialRecord(
        trial_id, "TERMINATED", {}, {}, len(rows), 0.0, None, False, None, None, history=history
    )


@pytest.mark.parametrize(
    "direction, expected",
    [("max", [(1, 0.5), (2, 0.6), (3, 0.7), (5, 0.9)]), ("min", [(1, 0.5), (4, 0.4)])],
)
def test_best_by_epochs_counts_every_epoch_of_every_trial_in_report_order(
    direction: str, expected: list
) -> None:
    records = [_record("a", [(1.0, 0.5), (3.0, 0.7)]), _record("b", [(2.0, 0.6), (4.0, 0.4), (5.0, 0.9)])]
    assert best_by_epochs(records, "val_acc", direction) == expected


@pytest.mark.slow
def test_a_comparison_report_shows_each_sweep_as_its_summary_says(two, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    written = write_comparison([s.sweep_dir for s in two], str(out))
    html = Path(written.html).read_text()
    assert "<script" not in html and html.count("data:image/png;base64,") == 3
    assert "## Best so far as trials finished" in written.markdown
    for s in two:
        best = s.summary["best"]
        # Each sweep's best as its own summary.json has it, in the overview and its leaderboard.
        assert f"best val_acc {best['metrics']['val_acc']:.5g}" in written.markdown
        assert best["trial_id"] in written.markdown
    assert "| search.seed | 0 | 1 |" in written.markdown  # the setting that differs, side by side
    lines = written.markdown.splitlines()
    settings = lines.index("## Settings")
    assert lines[settings + 4].startswith("| search.seed ")  # differing settings come first
    for png in written.images:
        assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_report_of_several_sweeps_needs_output_and_one_metric(two, tmp_path: Path) -> None:
    a, b = (s.sweep_dir for s in two)
    done = cli("report", a, b)
    assert done.returncode == 2 and done.stderr.startswith("error: --output:")
    assert done.stderr.count("\n") == 1
    other = tmp_path / "other"
    shutil.copytree(b, other)
    cfg = (
        (other / "sweep.yaml")
        .read_text()
        .replace("metric: val_acc", "metric: val_loss")
        .replace("direction: max", "direction: min")
    )
    (other / "sweep.yaml").write_text(cfg)
    with pytest.raises(ConfigError, match="compare sweeps of one metric"):
        write_comparison([a, str(other)], str(tmp_path / "x"))
    done = cli("report", a, b, "--output", str(tmp_path / "ok"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ok" / "compare.html").is_file()


@pytest.mark.slow
def test_a_board_of_two_sweeps_serves_both_under_their_names(two) -> None:
    a, b = (s.sweep_dir for s in two)
    url = board.start([a, b])
    expected = {f"first/{t['trial_id']}" for t in two[0].summary["trials"]}
    expected |= {f"second/{t['trial_id']}" for t in two[1].summary["trials"]}
    runs = wait_for(lambda: (r := set(get(url + "data/runs"))) >= expected and r)
    # each sweep's root (its HParams experiment) and its own run
    assert runs == expected | {"first/.", "second/.", "first/sweep", "second/sweep"}


def test_board_names_sweeps_apart_and_safely() -> None:
    assert board.run_names(["/r/a", "/s/a", "/t/b:c,d"]) == ["a-1", "a-2", "b_c_d"]
