"""`tuner report` on a real finished sweep with every kind of ending (see tests/sweeps.py)."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from tests import sweeps
from tests.browser import browser_page, png_size
from tests.conftest import DEBUG, ROOT, cli
from tuner.config import load_sweep
from tuner.view import plots
from tuner.view.analysis import load, yaml_value
from tuner.view.report import write_report

PNGS = (
    "best_so_far.png",
    "best_by_trials.png",
    "curves.png",
    "parallel.png",
    "importance.png",
    "outcomes.png",
)


@pytest.fixture(scope="module")
def sweep(ray_session, tmp_path_factory):
    return sweeps.failing_sweep(tmp_path_factory)


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory) -> tuple[Path, str]:
    """The CLI's report, made from the repository root (not where the sweep started)."""
    out = tmp_path_factory.mktemp("report")
    done = cli("report", sweep.sweep_dir, "--out", str(out), "--format", "md", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert (out / "report.md").read_text() == done.stdout
    return out, done.stdout


def table(markdown: str, heading: str) -> list[dict[str, str]]:
    """The first table under `## heading`, as one dict per row."""
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[2:]]


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def test_the_sweep_has_every_ending(sweep) -> None:
    counts = sweep.summary["counts"]
    assert counts["diverged"] == 2 and counts["error"] == 1 and counts["completed"] >= 3, counts
    assert sweep.exit_code == 1  # a trial crashed


def _not_json(token: str) -> None:
    raise ValueError(f"{token} is not JSON")


def test_summary_json_is_strict_json_with_diverged_trials(sweep) -> None:
    # Issue 26: Python wrote a diverged trial's NaN/-inf as bare NaN/-Infinity, which strict
    # parsers (JavaScript's JSON.parse, jq, Go) refuse. They are strings now.
    text = (Path(sweep.sweep_dir) / "summary.json").read_text()
    summary = json.loads(text, parse_constant=_not_json)
    diverged = [t for t in summary["trials"] if t["failure"] == "diverged"]
    assert diverged and all(t["last_metrics"]["val_acc"] == "-Infinity" for t in diverged), diverged


def test_leaderboard_and_best_match_summary_json(sweep, report) -> None:
    out, md = report
    summary = json.loads((Path(sweep.sweep_dir) / "summary.json").read_text())
    ok = [t for t in summary["trials"] if t["failure"] is None and t["best_value"] is not None]
    expected = sorted(ok, key=lambda t: t["best_value"], reverse=True)
    rows = table(md, "Leaderboard")
    assert [r["trial"] for r in rows] == [t["trial_id"] for t in expected]
    for row, t in zip(rows, expected, strict=True):
        assert row["val_acc"] == f"{t['best_value']:.5g}"  # 5 significant digits (issue 26)
        assert (row["best epoch"], row["epochs"]) == (str(t["best_epoch"]), str(t["epochs"]))
        assert row["status"] == ("stopped early" if t["stopped_early"] else "completed")
        assert {k: row[k] for k in ("lr", "width")} == {k: _short(t["config"][k]) for k in ("lr", "width")}
    best = summary["best"]
    assert rows[0]["trial"] == best["trial_id"]
    assert (
        f"Trial {best['trial_id']}: val_acc {best['metrics']['val_acc']:.5g} at epoch {best['epoch']}" in md
    )
    assert "fANOVA" in md and set(r["parameter"] for r in table(md, "Hyperparameter importance")) == {
        "lr",
        "width",
    }


def test_failures_and_compute_accounting(sweep, report) -> None:
    _, md = report
    trials = {t["trial_id"]: t for t in sweep.summary["trials"]}
    failed = {tid: t["failure"].split(":")[0] for tid, t in trials.items() if t["failure"]}
    rows = table(md, "Failures by cause")
    assert {r["trial"]: r["cause"] for r in rows} == failed
    assert sorted(failed.values()) == ["diverged", "diverged", "error"]
    (crash,) = [r for r in rows if r["cause"] == "error"]
    assert "ValueError: boom" in crash["detail"]
    assert {r["detail"] for r in rows if r["cause"] == "diverged"} == {"non-finite train_loss at epoch 1"}
    # CPU-seconds: training time x 1 worker x 1 CPU (debug.yaml); GPUs: 0.
    compute = {r["trial"]: r for r in table(md, "Compute")}
    assert set(compute) == set(trials)
    for tid, t in trials.items():
        assert float(compute[tid]["CPU-s"].replace(",", "")) == pytest.approx(t["time_s"], abs=0.006)
        assert float(compute[tid]["GPU-s"]) == 0.0
    total = sum(t["time_s"] for t in trials.values())
    lost = sum(t["time_s"] for t in trials.values() if t["failure"] or t["stopped_early"])
    assert f"{lost / total:.0%} of the CPU-seconds went to trials that were stopped early or failed" in md


def test_the_environment_is_recorded_and_reported(sweep, report) -> None:
    import subprocess

    import ray
    import torch

    _, md = report
    env = sweep.summary["environment"]
    assert (env["torch"], env["cuda"], env["ray"]) == (torch.__version__, torch.version.cuda, ray.__version__)
    rows = {r["what"]: r["version"] for r in table(md, "Environment")}
    assert rows["torch"] == f"{torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'})"
    assert rows["Ray"] == ray.__version__ and rows["GPUs"] == (
        ", ".join(f"{n} x {k}" for k, n in env["gpus"].items()) or "none"
    )
    # The sweep imports its code from where it started (a temporary directory, no git) and
    # from debug.yaml's directory, in this repository: its commit, as git says it.
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    (code,) = env["code"]
    assert code["dir"] == str(ROOT) and code["commit"] == head.stdout.strip()
    assert rows[f"code {ROOT}"].startswith(code["commit"])


def test_pngs_are_real_images_of_sensible_size(report) -> None:
    out, md = report
    for name in PNGS:
        data = (out / name).read_bytes()
        width, height = png_size(data)
        assert 400 <= width <= 2000 and 150 <= height <= 1500, (name, width, height)
        assert len(data) > 8000, f"{name} looks empty ({len(data)} bytes)"
        assert f"]({name})" in md


def test_html_is_self_contained(report) -> None:
    out, _ = report
    html = (out / "report.html").read_text()
    assert not re.search(r"https?://", html), "the report must not point anywhere"
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", html) + re.findall(r"url\(([^)]*)\)", html)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), refs
    assert "<script" not in html and "<link" not in html
    inlined = [base64.b64decode(r.split(",", 1)[1]) for r in refs]
    assert sorted(inlined) == sorted((out / name).read_bytes() for name in PNGS)


def test_html_opens_offline_in_a_browser(report, tmp_path: Path) -> None:
    out, _ = report
    requests: list[str] = []
    with browser_page(tmp_path / "profile") as page:
        page.on("request", lambda r: requests.append(r.url))
        page.goto((out / "report.html").as_uri())
        page.wait_for_load_state("load")
        sizes = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.complete, i.naturalWidth])")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert len(sizes) == len(PNGS) and all(done and w > 0 for done, w in sizes), sizes
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []


def test_reproduce_command_trains_the_best_trial_again(sweep, report) -> None:
    from tuner.cli import main

    _, md = report
    command = re.search(r"```bash\n(python -m tuner sweep .*)\n```", md).group(1)
    args = shlex.split(command)
    assert args[:4] == ["python", "-m", "tuner", "sweep"]
    best = sweep.summary["best"]
    with pytest.MonkeyPatch.context() as mp:  # where the sweep was started: its model module
        mp.chdir(sweeps.sweep_root())
        mp.syspath_prepend(str(sweeps.sweep_root()))
        assert main(args[3:]) == 0  # the session's Ray: connect() joins the running one
    again = json.loads(
        (Path(sweep.sweep_dir).parent / f"failing-{best['trial_id']}" / "summary.json").read_text()
    )
    (trial,) = again["trials"]
    assert trial["config"] == best["config"]
    assert trial["best_epoch"] == best["epoch"]
    assert trial["best_value"] == pytest.approx(best["metrics"]["val_acc"], abs=1e-9)
    # Or no training at all: the best epoch's weights, kept.
    assert os.path.join(sweep.sweep_dir, "best", "model.pt") in md


def test_report_of_a_moved_copy_without_summary(sweep, report, tmp_path: Path) -> None:
    _, md = report
    copy = tmp_path / "moved"
    shutil.copytree(sweep.sweep_dir, copy)
    (copy / "summary.json").unlink()
    written = write_report(str(copy))
    assert all(r.path.startswith(str(copy)) for r in load(str(copy)).records)  # read from the copy
    assert written.html == str(copy / "report.html")
    assert table(written.markdown, "Leaderboard") == table(md, "Leaderboard")
    assert written.markdown.split("\n")[2].startswith("Sweep completed: 10 trials")


def test_a_sweep_written_before_direction_reads_as_it_did(
    sweep, report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep an earlier tuner wrote says `mode` for max/min (sweep.yaml's `mode:`,
    summary.json's "mode"): it reports, resumes, exports, refines and warm-starts another as
    the same sweep written today does (`--resume-if-exists` with today's spelling of its file
    finds the same sweep there); what is written from it says `direction`."""
    from tuner.driver.sweep import AlreadyFinished, resume_sweep, sweep_or_resume
    from tuner.search import warm
    from tuner.sweepdir import place_of, read_summary
    from tuner.view.export import export
    from tuner.view.refine import refine

    _, md = report
    old = tmp_path / Path(sweep.sweep_dir).name  # (<output>/<name>, output: tmp_path)
    shutil.copytree(sweep.sweep_dir, old)
    text = (old / "sweep.yaml").read_text()
    assert text.count("\ndirection: max\n") == 1
    (old / "sweep.yaml").write_text(text.replace("\ndirection: max\n", "\nmode: max\n"))
    summary = json.loads((old / "summary.json").read_text())
    summary = {("mode" if k == "direction" else k): v for k, v in summary.items()}
    (old / "summary.json").write_text(json.dumps(summary))

    assert read_summary(str(old))["direction"] == "max" and "mode" not in read_summary(str(old))
    assert table(write_report(str(old)).markdown, "Leaderboard") == table(md, "Leaderboard")
    with pytest.raises(AlreadyFinished):  # every planned trial ended: nothing changed
        resume_sweep(str(old))
    monkeypatch.chdir(sweeps.sweep_root())  # (where its model's module is found)
    with pytest.raises(AlreadyFinished):  # the same sweep, not "holds a different sweep"
        sweep_or_resume(load_sweep(_written(tmp_path, text), {"output": str(tmp_path)}))
    assert json.loads((old / "summary.json").read_text()) == summary
    best = json.loads((Path(export(str(old), output=str(tmp_path / "best"))) / "config.json").read_text())
    ours = json.loads((Path(sweep.sweep_dir) / "best" / "config.json").read_text())
    assert (best["direction"], best["mode"], best["trial_id"]) == ("max", "max", ours["trial_id"])
    refined, _ = refine(str(old), str(tmp_path / "refined.yaml"))
    assert "\ndirection: max\n" in Path(refined).read_text()
    cfg = load_sweep(refined)  # (a space the old sweep's best trials fill)
    then, now = warm.load(cfg, [place_of(str(old))]), warm.load(cfg, [place_of(sweep.sweep_dir)])
    assert [len(s.used) for s in then] == [len(s.used) for s in now] and then[0].used
    assert [t.config for t in then[0].used] == [t.config for t in now[0].used]


def _written(where: Path, text: str) -> Path:
    path = where / "today.yaml"
    path.write_text(text)
    return path


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    no_trials = tmp_path / "fresh"
    no_trials.mkdir()
    shutil.copy(DEBUG, no_trials / "sweep.yaml")  # a sweep that has not recorded a trial
    cases = [
        (["report", str(tmp_path / "missing")], "no such directory"),
        (["report", str(tmp_path)], "not a sweep directory"),
        (["report", str(no_trials)], "no trial recorded yet"),
        (["board", str(tmp_path / "missing")], "no such directory"),
        (["board", str(tmp_path)], "not a sweep directory"),
    ]
    for args, message in cases:
        done = cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("error: ") and message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (no_trials / "report.html").exists()
    assert all(cmd in cli("--help").stdout for cmd in ("report", "board"))
    for cmd, flags in (("report", ("--out", "--format")), ("board", ("--bind-all", "--port"))):
        assert all(f in cli(cmd, "--help").stdout for f in flags)


@pytest.mark.parametrize("value", [1e-05, 0.01, 1.0e8, 0.1 + 0.2, 3, True, "adam", "true", "1e-05", "off"])
def test_yaml_value_reads_back_as_the_same_value(value) -> None:
    back = yaml.safe_load(yaml_value(value))
    assert back == value and type(back) is type(value)


def test_plots_of_a_sweep_with_no_results_yet(tmp_path: Path) -> None:
    paths = [
        plots.best_so_far([], [], "val_acc", str(tmp_path / "a.png")),
        plots.curves([], [], "val_acc", str(tmp_path / "b.png")),
        plots.parallel({}, [], "val_acc", "max", str(tmp_path / "c.png")),
        plots.outcomes({}, str(tmp_path / "d.png")),
    ]
    for p in paths:
        width, height = png_size(Path(p).read_bytes())
        assert width >= 400 and height >= 150


def test_markdown_shows_html_from_names_and_values_as_text() -> None:
    from tuner.view.document import Code, Table, Text, to_markdown

    evil = "<script>alert(1)</script>"
    md = to_markdown(f"Sweep report: {evil}", [Text(evil), Table([evil], [[evil]]), Code("a ``` b")])
    assert "<script" not in md and md.count("&lt;script&gt;") == 4
    assert "````bash\na ``` b\n````" in md  # a fence the code cannot close


def test_reproduce_command_for_parameter_names_with_dots_and_equals(tmp_path: Path) -> None:
    """`--set search.params.a.b=1` would set a nested key; the command must rebuild the trial."""
    from tuner.cli import _load, build_parser
    from tuner.config import load_sweep, to_yaml
    from tuner.results import TrialRecord
    from tuner.view.analysis import SweepData, reproduce_command

    params = {"a.b": {"type": "grid", "values": [1, 2]}, "x=y": 1.0e-5, "lr": 0.05, "width": 8}
    cfg = load_sweep(DEBUG, {"task.model": "tests.chaos:slow", "search.params": params})
    sweep_dir = tmp_path / "odd"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.yaml").write_text(to_yaml(cfg))
    config = {"a.b": 2, "x=y": 1.0e-5, "lr": 0.05, "width": 8}
    top = TrialRecord("t1", "TERMINATED", config, {}, 3, 1.0, None, False, 0.9, 2)
    data = SweepData(str(sweep_dir), cfg, [top], "completed", 0.0)
    args = shlex.split(reproduce_command(data))
    again = _load(build_parser().parse_args(args[3:]))
    assert again.search.algorithm == "grid"
    assert {k: p.value for k, p in again.search.params.items()} == config
