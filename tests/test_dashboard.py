"""What TensorBoard shows is what tuner ranks by (issue 33): each trial's best value, its epoch,
outcome and epochs as HParams columns, and the sweep's own run (best so far as trials finish),
read back with TensorBoard's own reader and from a real TensorBoard server, against answers
worked out here (tests.scripted's curves, the trials' records), not by tuner's code.

A sweep of `task.train: tests.scripted:train` at the default concurrency (2 trials at once):
a trial whose last epoch is worse than its best, one that rises to its last, one that raises
after two epochs, one that diverges and one that crashes before its first epoch.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import scripted, tbread
from tests.browser import ARTIFACTS, browser_page, png_size
from tests.conftest import ROOT, cli
from tests.test_board import board, get, post, wait_for
from tests.test_command import _raw
from tests.test_own_loop import own
from tuner import history, results
from tuner.config import parse_sweep
from tuner.sweepdir import read_config, read_metrics

# In the order they start (grid order): the best so far changes as each finishes.
CURVES = ["crashes", "diverges", "fails", "rises", "peaks"]
# Outcome codes as the docs list them: 0 completed, 3 diverged, 6 error.
OUTCOMES = {"peaks": 0, "rises": 0, "fails": 6, "diverges": 3, "crashes": 6}
BEST, BEST_EPOCH, OUTCOME, EPOCHS = "best/val_acc", "best_epoch/val_acc", "trial/outcome", "trial/epochs"


@pytest.fixture(scope="module")
def swept(ray_session, tmp_path_factory) -> Any:
    from tuner.driver.sweep import run_sweep

    raw = own(
        "tests.scripted:train",
        output=str(tmp_path_factory.mktemp("dashboard")),
        metric="val_acc",
        direction="max",
        schedule={"max_epochs": 4, "early_stopping": False},
    )
    raw["search"] = {
        "algorithm": "grid",
        "params": {"curve": {"type": "grid", "values": CURVES}, "pause_s": 0.2},
    }
    out = run_sweep(parse_sweep(raw))
    return out


def _by_curve(out: Any) -> dict[str, dict[str, Any]]:
    return {t["config"]["curve"]: t for t in out.summary["trials"]}


def _running_best(sweep_dir: str, trials: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(trials finished, best so far) at each finish, in the order the trials' records say
    they ended (a trial that finished as the sweep was stopped has no end recorded: its last
    epoch's time); steps where no finished trial has a value yet are left out."""

    def ended_at(t: dict[str, Any]) -> float:
        path = Path(sweep_dir) / t["trial_id"]
        record = json.loads((path / "tuner_trial.json").read_text())
        return record["ended"] if "ended" in record else read_metrics(str(path))[-1]["wall_time"]

    ended = sorted(trials, key=ended_at)
    out, best = [], None
    for done, t in enumerate(ended, 1):
        if t["best_value"] is not None:
            best = t["best_value"] if best is None else max(best, t["best_value"])
        if best is not None:
            out.append((done, best))
    return out


def same_points(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """The same steps, and values equal as float32 (TensorBoard's scalars) allows."""
    assert [s for s, _ in got] == [s for s, _ in want], (got, want)
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), (got, want)
    return True


def test_event_files_hold_the_best_values_summary_json_ranks_by(swept) -> None:
    trials = _by_curve(swept)
    assert set(trials) == set(CURVES)
    for curve, t in trials.items():
        mine = scripted.best(curve)  # worked out from the curve itself
        assert (t["best_value"], t["best_epoch"]) == (mine or (None, None)), curve
        run = tbread.steps(Path(swept.sweep_dir) / t["trial_id"])
        last = {tag: pairs[-1][1] for tag, pairs in run.items()}
        assert last[OUTCOME] == OUTCOMES[curve], curve
        assert last[EPOCHS] == t["epochs"], curve
        if mine is None:  # crashed before its first epoch: no best, still an outcome
            assert BEST not in run and BEST_EPOCH not in run
            continue
        assert last[BEST] == pytest.approx(mine[0]) and last[BEST_EPOCH] == mine[1], curve
        # Written as the trial ran: at each epoch, the best of the epochs so far.
        values = [
            v for v in scripted.CURVES[curve][: t["epochs"]] if isinstance(v, float) and not math.isnan(v)
        ]
        want = {e: max(values[:e]) for e in range(1, len(values) + 1)}
        got = {step: v for step, v in run[BEST]}
        assert {e: got[e] for e in want} == pytest.approx(want), curve
    # The trial that peaked: TensorBoard's last val_acc is worse than the best it ranks by.
    peaks = tbread.scalars(Path(swept.sweep_dir) / trials["peaks"]["trial_id"])
    assert peaks["val_acc"][-1] == pytest.approx(0.65) and peaks[BEST][-1] == pytest.approx(0.9)


def test_the_sweep_run_has_the_running_best_in_completion_order(swept) -> None:
    trials = swept.summary["trials"]
    run = tbread.steps(Path(swept.sweep_dir) / "sweep")
    assert run["sweep/done"] == [(n, float(n)) for n in range(1, len(trials) + 1)]
    want = _running_best(swept.sweep_dir, trials)
    assert same_points(run["sweep/best/val_acc"], want)
    assert len({v for _, v in want}) >= 3  # (the order matters: the best changed as trials finished)
    assert run["sweep/failed"][-1][1] == 3 and run["sweep/stopped_early"][-1][1] == 0
    assert run["sweep/running"][-1][1] == 0
    assert run["sweep/epochs_spent"][-1][1] == sum(t["epochs"] for t in trials)
    assert max(v for _, v in run["sweep/running"]) <= 2  # the default concurrency
    # What the report and `tuner compare` draw: the same points, replayed from the directory.
    cfg = read_config(swept.sweep_dir)
    records = results.records(swept.sweep_dir, "val_acc", "max", 4, [])
    replayed = history.replay(records, cfg.objectives).points
    assert same_points([(p.done, p.best["val_acc"]) for p in replayed if p.best], want)
    assert replayed[-1].scalars() == pytest.approx({tag: pairs[-1][1] for tag, pairs in run.items()})


def _session_groups(url: str, tags: list[str], order_by: str) -> list[dict[str, Any]]:
    """TensorBoard's HParams session groups, sorted by `order_by` descending, as its
    dashboard asks for them."""
    cols: list[dict[str, Any]] = [{"hparam": "curve", "includeInResult": True}]
    for tag in tags:
        col: dict[str, Any] = {"metric": {"tag": tag}, "includeInResult": True}
        if tag == order_by:
            col["order"] = "ORDER_DESC"
            col["missingValuesFirst"] = False
        cols.append(col)
    body = {
        "experimentName": "",
        "allowedStatuses": ["STATUS_FAILURE", "STATUS_RUNNING", "STATUS_SUCCESS", "STATUS_UNKNOWN"],
        "colParams": cols,
        "startIndex": 0,
        "sliceSize": 100,
        "includeMetrics": True,
    }
    return post(url + "data/plugin/hparams/session_groups", body)["sessionGroups"]


def test_a_real_tensorboard_serves_best_columns_and_the_sweep_curve(swept) -> None:
    trials = {t["trial_id"]: t for t in swept.summary["trials"]}
    tags = [BEST, BEST_EPOCH, OUTCOME, EPOCHS]
    with board(swept.sweep_dir) as (url, _, _):
        exp = wait_for(
            lambda: post(
                url + "data/plugin/hparams/experiment", {"experimentName": "", "includeMetrics": True}
            )
        )
        infos = {m["name"]["tag"]: m for m in exp["metricInfos"]}
        assert list(infos)[:4] == tags  # what tuner ranks by comes first
        assert (
            "0 completed" in infos[OUTCOME]["description"]
            and infos["val_acc"]["displayName"] == "val_acc (last)"
        )
        groups = wait_for(lambda: (g := _session_groups(url, tags, BEST)) and len(g) == len(trials) and g)
        for g in groups:
            t = trials[g["name"]]
            got = {m["name"]["tag"]: m["value"] for m in g["metricValues"]}
            assert got[OUTCOME] == OUTCOMES[t["config"]["curve"]] and got[EPOCHS] == t["epochs"]
            if t["best_value"] is None:
                assert BEST not in got
            else:
                assert got[BEST] == pytest.approx(t["best_value"]) and got[BEST_EPOCH] == t["best_epoch"]
        # Sorted by best/val_acc, the table's order is summary.json's ranking.
        ranked = sorted(
            (t for t in trials.values() if t["best_value"] is not None), key=lambda t: -t["best_value"]
        )
        assert [g["name"] for g in groups][: len(ranked)] == [t["trial_id"] for t in ranked]
        assert ranked[0]["trial_id"] == swept.summary["best"]["trial_id"]
        # The sweep's own run: best so far against trials finished.
        assert "sweep" in get(url + "data/runs")
        curve = get(url + "data/plugin/scalars/scalars?run=sweep&tag=sweep/best/val_acc")
        assert same_points(
            [(s, v) for _, s, v in curve], _running_best(swept.sweep_dir, list(trials.values()))
        )


def test_report_shows_the_sweep_as_trials_finished(swept, tmp_path: Path) -> None:
    trials = swept.summary["trials"]
    done = cli("report", swept.sweep_dir, "--format", "md", "--output", str(tmp_path))
    assert done.returncode == 0, done.stderr
    md = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").is_file() else done.stdout
    epochs = sum(t["epochs"] for t in trials)
    best = max(t["best_value"] for t in trials if t["best_value"] is not None)
    assert "## As trials finished" in md
    assert re.search(
        rf"After {len(trials)} trials finished: best val_acc {best:g}\S*; 0 stopped early, 3 failed, "
        rf"0 running; {epochs} epochs spent",
        md,
    ), md
    assert (tmp_path / "best_by_trials.png").is_file()


def test_hparams_table_sorted_by_best_and_the_sweep_curve_in_a_browser(swept, tmp_path: Path) -> None:
    trials = {t["trial_id"]: t for t in swept.summary["trials"]}
    ranked = sorted(
        (t for t in trials.values() if t["best_value"] is not None), key=lambda t: -t["best_value"]
    )
    ids = re.compile("|".join(re.escape(t) for t in trials))
    ARTIFACTS.mkdir(exist_ok=True)
    with board(swept.sweep_dir) as (url, _, _), browser_page(tmp_path / "profile") as page:
        wait_for(lambda: len(_session_groups(url, [BEST], BEST)) == len(trials))
        page.goto(url + "#hparams")
        page.get_by_text(BEST, exact=True).first.wait_for(timeout=60_000)
        # Sorted as a user sorts it: the query pane's "Sort by" and "Direction".
        sort = page.locator('paper-dropdown-menu[label="Sort by"]')
        sort.click()
        sort.locator("paper-item", has_text=re.compile(rf"^\s*{re.escape(BEST)}\s*$")).click()
        direction = page.locator('paper-dropdown-menu[label="Direction"]')
        direction.click()
        direction.locator("paper-item", has_text="Descending").click()
        cells = page.locator("vaadin-grid-cell-content")

        def rows() -> list[str]:
            return [c.strip() for c in cells.all_inner_texts() if ids.fullmatch(c.strip())]

        wait_for(lambda: rows()[: len(ranked)] == [t["trial_id"] for t in ranked], timeout=60)
        page.screenshot(path=str(ARTIFACTS / "hparams-best.png"))
        # The sweep's run alone, unsmoothed: its best so far as trials finished.
        page.goto(url + "#scalars&tagFilter=sweep%2F&_smoothingWeight=0&regexInput=%5Esweep%24")
        page.get_by_text("sweep/best/val_acc").first.wait_for(timeout=60_000)
        page.get_by_role("checkbox", name="Ignore outliers in chart scaling").click()
        wait_for(lambda: page.locator("path.line").count() >= 6, timeout=60)  # a line per sweep/ tag
        page.wait_for_timeout(1000)  # (the charts' last redraw)
        page.screenshot(path=str(ARTIFACTS / "sweep-run.png"))
    for name in ("hparams-best.png", "sweep-run.png"):
        assert png_size((ARTIFACTS / name).read_bytes()) == (1400, 900)


def _points(sweep: Path) -> list[tuple[int, float]]:
    """The sweep run's (step, trials finished) so far; none before its first."""
    run = sweep / "sweep"
    return tbread.steps(run).get("sweep/done", []) if run.is_dir() else []


def _unfinished_midway(sweep: Path) -> bool:
    """A trial started, with an epoch in its journal, and not ended."""
    for rec in sweep.glob("*/tuner_trial.json"):
        try:
            running = json.loads(rec.read_text())["status"] == "RUNNING"
        except ValueError:  # being replaced right now
            continue
        if (
            running
            and (rec.parent / "metrics.jsonl").is_file()
            and (rec.parent / "metrics.jsonl").read_text()
        ):
            return True
    return False


@pytest.mark.slow  # a sweep of its own (a Ray of its own), stopped with Ctrl-C, resumed, extended
def test_resume_and_extend_continue_the_sweep_runs_steps(ray_session, tmp_path: Path) -> None:
    raw = own(
        "tests.scripted:train",
        output=str(tmp_path),
        metric="val_acc",
        direction="max",
        schedule={"max_epochs": 4, "early_stopping": False},
    )
    raw["search"] = {
        "algorithm": "random",
        "num_samples": 3,
        "seed": 0,
        # (`tag`, unused, keeps configurations apart: resume tells trials by their configuration)
        "params": {
            "curve": {"type": "choice", "values": ["rises", "peaks"]},
            "tag": {"type": "uniform", "low": 0, "high": 1},
            "pause_s": 1.5,
        },
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(raw))
    sweep = tmp_path / "debug"
    log = open(tmp_path / "driver.log", "w")
    cmd = [sys.executable, "-m", "tuner", "sweep", str(tmp_path / "sweep.yaml")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _points(sweep) and _unfinished_midway(sweep), timeout=240, every=0.1)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.wait(120)
    assert proc.returncode == 130, (tmp_path / "driver.log").read_text()[-2000:]
    before = _points(sweep)
    assert before and before == [(n, float(n)) for n in range(1, len(before) + 1)] and len(before) < 3
    resumed = cli("resume", str(sweep), on_session=True)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert _points(sweep) == [(n, float(n)) for n in range(1, 4)]  # on from where it stopped
    # The moment a driver killed outright can leave: a trial's end recorded, its TensorBoard
    # session end not yet written. The sweep's next run writes it, as its twin's was written.
    ended = [sweep / t["trial_id"] for t in json.loads((sweep / "summary.json").read_text())["trials"]]
    status = {p.name: tbread.hparams(p)["session_end"].status for p in ended}
    for lost in ended[0].glob("*.tuner-status"):
        lost.unlink()
    assert "session_end" not in tbread.hparams(ended[0])
    grown = cli("extend", str(sweep), "--num-samples", "1", on_session=True)
    assert grown.returncode == 0, grown.stdout[-2000:] + grown.stderr[-2000:]
    assert _points(sweep) == [(n, float(n)) for n in range(1, 5)]
    assert {p.name: tbread.hparams(p)["session_end"].status for p in ended} == status
    trials = json.loads((sweep / "summary.json").read_text())["trials"]
    run = tbread.steps(sweep / "sweep")
    assert same_points(run["sweep/best/val_acc"], _running_best(str(sweep), trials))
    assert run["sweep/epochs_spent"][-1][1] == sum(t["epochs"] for t in trials) == 16
    # The resumed trial's best is its whole journal's, not only the epochs after the resume.
    for t in trials:
        last = {tag: pairs[-1][1] for tag, pairs in tbread.steps(sweep / t["trial_id"]).items()}
        assert last[BEST] == pytest.approx(t["best_value"]) and last[BEST_EPOCH] == t["best_epoch"]
        assert t["best_value"] == pytest.approx(scripted.best(t["config"]["curve"])[0])


def test_a_command_trials_best_and_outcome_reach_its_run(ray_session, tmp_path: Path) -> None:
    """task.command (a script of its own, reporting through tuner.report): the same columns."""
    from tuner.driver.sweep import run_sweep

    kinds = {"kind": {"type": "grid", "values": ["api", "crash"]}, "lr": 0.05, "sleep": 0.1}
    raw = _raw(
        tmp_path,
        search={"algorithm": "grid", "params": kinds},
        schedule={"max_epochs": 3, "early_stopping": False},
    )
    out = run_sweep(parse_sweep(raw))
    trials = {t["config"]["kind"]: t for t in out.summary["trials"]}
    last = {
        k: {tag: p[-1][1] for tag, p in tbread.steps(Path(out.sweep_dir) / t["trial_id"]).items()}
        for k, t in trials.items()
    }
    # The script's val_loss is 10 * lr + 1 / epoch: best (least) at its last epoch, 3.
    assert (
        last["api"]["best/val_loss"] == pytest.approx(0.5 + 1 / 3) and last["api"]["best_epoch/val_loss"] == 3
    )
    assert last["api"]["best/val_loss"] == pytest.approx(trials["api"]["best_value"])
    assert last["api"][OUTCOME] == 0 and last["api"][EPOCHS] == 3
    assert last["crash"] == {OUTCOME: 6, EPOCHS: 0}  # exits 3 before any report


def test_a_trial_finished_as_its_driver_was_killed_gets_its_end_on_resume(tmp_path: Path) -> None:
    """A driver killed after a trial's record said it finished and before the trial's last
    values reached TensorBoard left its outcome column at unfinished (7) for good: the trial
    never runs again. The next driver of the sweep (resume, extend) writes its end; a trial
    whose end is there already gets no file more."""
    from tuner.driver.callbacks import CatchUp
    from tuner.driver.dashboard import Dashboard, EventFile
    from tuner.sweepdir import Place, write_record

    sweep = tmp_path / "s"
    for name in ("cut", "whole"):
        trial = sweep / name
        write_record(str(trial), {"trial_id": name, "config": {"lr": 0.1}, "status": "TERMINATED"})
        rows = [{"epoch": e, "val_acc": 0.1 * e} for e in (1, 2, 3)]
        (trial / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        outcome = results.Outcome.UNFINISHED if name == "cut" else results.Outcome.COMPLETED
        EventFile(str(trial), ".tuner-best").scalars({EPOCHS: 3, OUTCOME: outcome.code}, 3)
    before = {p.name for p in sweep.rglob("*tuner-best")}
    again = Dashboard(Place(str(sweep)), [("val_acc", "max")], max_epochs=3)
    again.setup()  # (then the sweep's callbacks' catch-up, as Tune's setup of them runs it)
    CatchUp(Place(str(sweep)), [again], ("val_acc", "max"), max_epochs=3).setup()
    assert tbread.scalars(sweep / "cut")[OUTCOME][-1] == results.Outcome.COMPLETED.code == 0
    assert tbread.scalars(sweep / "cut")[BEST][-1] == pytest.approx(0.3)
    assert {p.name for p in (sweep / "whole").glob("*tuner-best")} <= before
