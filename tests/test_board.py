"""`tuner board`: a real TensorBoard on real sweeps, read through its HTTP API and a browser.

Also follows a sweep while it runs (under a pseudo-terminal, so the live progress line is
drawn): the board and the report see the running trial, and the report sees it cut off after
Ctrl-C.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

import psutil
import pytest

from tests import sweeps
from tests.browser import ARTIFACTS, browser_page, png_size
from tests.conftest import DEBUG, ROOT, cli
from tuner.results import number

STATUSES = ["STATUS_FAILURE", "STATUS_RUNNING", "STATUS_SUCCESS", "STATUS_UNKNOWN"]
METRICS = ["val_acc", "val_loss", "train_loss"]


@pytest.fixture(scope="module")
def sweep(ray_session, tmp_path_factory):
    return sweeps.failing_sweep(tmp_path_factory)


class Lines:
    """A child's output stream, read line by line in a thread (so the child never blocks)."""

    def __init__(self, stream: Any):
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(stream), daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 90) -> re.Match:
        return wait_for(
            lambda: next((m for ln in list(self.lines) if (m := re.search(pattern, ln))), None), timeout
        )


def wait_for(probe: Callable[[], Any], timeout: float = 90, every: float = 0.5) -> Any:
    """Poll `probe` until it returns something truthy; its last error or None fails the test."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            found = probe()
            if found:
                return found
        except (OSError, ValueError, KeyError, AssertionError) as err:
            last = err
        time.sleep(every)
    raise AssertionError(f"gave up after {timeout}s; last error: {last!r}")


@contextmanager
def board(sweep_dir: str, *flags: str) -> Iterator[tuple[str, subprocess.Popen, Lines]]:
    """`python -m tuner board` in a subprocess: (the URL it printed, the process, its stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "board", sweep_dir, *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        yield out.wait_for(r"(http://\S+)").group(1), proc, err
    finally:
        proc.terminate()
        proc.wait(30)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def session_groups(url: str, hparams: list[str]) -> dict[str, Any]:
    """TensorBoard 2.21's HParams API, with the request body its own dashboard sends."""
    cols = [{"hparam": h, "includeInResult": True} for h in hparams]
    cols += [{"metric": {"tag": m}, "includeInResult": True} for m in METRICS]
    body = {
        "experimentName": "",
        "allowedStatuses": STATUSES,
        "colParams": cols,
        "startIndex": 0,
        "sliceSize": 1000,
        "includeMetrics": True,
    }
    groups = post(url + "data/plugin/hparams/session_groups", body)["sessionGroups"]
    return {g["name"]: g for g in groups}


def other_ipv4() -> Optional[str]:
    """An address of this machine that is not loopback (None where there is none)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return a.address
    return None


def test_board_serves_every_trial_on_loopback_only(sweep) -> None:
    trials = {t["trial_id"]: t for t in sweep.summary["trials"]}
    with board(sweep.sweep_dir) as (url, proc, _):
        assert urlparse(url).hostname == "127.0.0.1"
        runs = wait_for(lambda: (r := set(get(url + "data/runs"))) >= set(trials) and r)
        # "." is the sweep root (the HParams experiment); "sweep" the sweep's own run
        assert runs == set(trials) | {".", "sweep"}
        tags = get(url + "data/plugin/scalars/tags")
        for tid, t in trials.items():
            if t["epochs"]:
                assert set(tags[tid]) >= {*METRICS, "lr", "samples_per_s", "epoch"}, tid
            else:  # crashed before its first epoch: no scalars of its own, the driver's outcome
                assert set(tags[tid]) == {"trial/outcome", "trial/epochs"} and t["failure"].startswith(
                    "error"
                )
        exp = post(url + "data/plugin/hparams/experiment", {"experimentName": "", "includeMetrics": True})
        assert {h["name"] for h in exp["hparamInfos"]} == {"lr", "width", "optimizer"}
        assert {m["name"]["tag"] for m in exp["metricInfos"]} >= set(METRICS)
        groups = wait_for(
            lambda: (g := session_groups(url, ["lr", "width", "optimizer"])).keys() == trials.keys() and g
        )
        for tid, t in trials.items():
            g = groups[tid]
            assert g["hparams"] == {
                "lr": t["config"]["lr"],
                "width": t["config"]["width"],
                "optimizer": "sgd",
            }
            (session,) = g["sessions"]
            assert session["status"] == ("STATUS_FAILURE" if t["failure"] else "STATUS_SUCCESS"), tid
            final = {m["name"]["tag"]: m["value"] for m in g["metricValues"]}
            if t["failure"] == "diverged":
                assert final["val_acc"] == "-Infinity" and final["train_loss"] == "NaN"
            elif t["failure"]:  # only what the driver wrote: how it ended, after 0 epochs
                assert final == {"trial/outcome": 6.0, "trial/epochs": 0.0}
            else:
                assert final["val_acc"] == pytest.approx(t["last_metrics"]["val_acc"], rel=1e-6)
                assert final["train_loss"] == pytest.approx(t["last_metrics"]["train_loss"], rel=1e-6)
                # tuner's own loop: the best it is ranked by, beside the last (tests/test_dashboard.py)
                assert final["best/val_acc"] == pytest.approx(t["best_value"], rel=1e-6)
                assert final["best_epoch/val_acc"] == t["best_epoch"]
        port, elsewhere = urlparse(url).port, other_ipv4()
        if elsewhere:
            with pytest.raises(urllib.error.URLError):
                get(f"http://{elsewhere}:{port}/data/runs")
        proc.terminate()
        assert proc.wait(30) == 0  # SIGTERM stops it cleanly


def test_bind_all_warns_and_listens_on_every_interface(sweep) -> None:
    with board(sweep.sweep_dir, "--bind-all") as (url, _, err):
        assert err.wait_for(r"^warning: .*no authentication")
        port = urlparse(url).port
        for host in ["127.0.0.1", other_ipv4()]:
            if host:
                assert "." in wait_for(lambda h=host: get(f"http://{h}:{port}/data/runs"))


def test_hparams_view_in_a_browser_lists_every_trial(sweep, tmp_path: Path) -> None:
    trials = {t["trial_id"]: t for t in sweep.summary["trials"]}
    failed = {tid for tid, t in trials.items() if t["failure"]}
    names = "|".join(re.escape(tid) for tid in trials)  # (ids as Tune made them: hex, or name_00001)
    ARTIFACTS.mkdir(exist_ok=True)
    with board(sweep.sweep_dir) as (url, _, _), browser_page(tmp_path / "profile") as page:
        wait_for(lambda: session_groups(url, []).keys() == trials.keys())
        page.goto(url + "#hparams")
        rows = page.get_by_text(re.compile(rf"^({names})$")).filter(visible=True)

        def shown() -> set[str]:
            return {t.strip() for t in rows.all_inner_texts()}

        wait_for(lambda: shown() == set(trials), timeout=60)
        page.screenshot(path=str(ARTIFACTS / "hparams.png"))
        # Only the failed trials are left when successful sessions are filtered out.
        page.get_by_role("checkbox", name="Success").click()
        wait_for(lambda: shown() == failed, timeout=30)
        page.screenshot(path=str(ARTIFACTS / "hparams-failures.png"))
    assert png_size((ARTIFACTS / "hparams.png").read_bytes()) == (1400, 900)


@pytest.mark.slow  # a sweep of its own, on a Ray of its own, stopped with Ctrl-C
def test_board_report_and_progress_follow_a_running_sweep(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "debug"
    # One trial (nothing for ASHA to stop it against), epochs of a few tenths of a second: the
    # sweep runs until we stop it.
    args = ["--output", str(tmp_path), "--num-samples", "1", "--max-epochs", "1000"]
    args += ["--set", "task.data_args.samples=20000"]
    master, child = pty.openpty()  # a terminal: the live progress line is drawn
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "sweep", str(DEBUG), *args],
        cwd=ROOT,
        stdin=child,
        stdout=child,
        stderr=child,
        start_new_session=True,
    )
    os.close(child)
    screen = bytearray()
    reader = threading.Thread(target=_drain, args=(master, screen), daemon=True)
    reader.start()
    try:
        running = wait_for(lambda: _running_trial(sweep_dir), timeout=180)
        with board(str(sweep_dir)) as (url, _, _):
            wait_for(lambda: "val_acc" in get(url + "data/plugin/scalars/tags")[running])
            groups = session_groups(url, ["lr"])
            assert groups[running]["sessions"][0]["status"] == "STATUS_UNKNOWN"  # no end yet
        live = cli("report", str(sweep_dir), "--format", "md")
        assert live.returncode == 0, live.stderr
        assert "Sweep running or interrupted" in live.stdout
        assert f"| {running} |" in live.stdout and "unfinished" in live.stdout
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        proc.wait(120)
        reader.join(10)
    text = screen.decode(errors="replace")
    assert re.search(r"\r\x1b\[K\[tuner\] 0/1 done · 1 running · 0 pending · best val_acc [\d.]+ ", text), (
        text[-2000:]
    )
    # Its last state, once stopped, says what the table under it says: the trial unfinished,
    # the best as the trial's own records have it.
    best = json.loads((sweep_dir / "summary.json").read_text())["best"]
    last = text.rsplit("\r\x1b[K", 1)[-1].splitlines()[0]
    shown = f"best val_acc {number(best['metrics']['val_acc'])} ({best['trial_id']})"
    assert last.startswith(f"[tuner] 0/1 done · 0 running · 0 pending · 1 unfinished · {shown} · "), last
    row = rf"\n{best['trial_id']}\s+{re.escape(number(best['metrics']['val_acc']))}\s"  # the table's
    assert re.search(row, text.replace("\r", "")), text[-2000:]
    after = cli("report", str(sweep_dir), "--format", "md")
    assert after.returncode == 0, after.stderr
    assert "Sweep interrupted" in after.stdout
    assert (sweep_dir / "report.html").is_file()


def _drain(fd: int, into: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            return
        if not chunk:
            return
        into += chunk


def _running_trial(sweep_dir: Path) -> Optional[str]:
    """A trial with a few epochs in its journal and no end recorded (status RUNNING)."""
    if not sweep_dir.is_dir():
        return None
    for trial in sweep_dir.iterdir():
        record, journal = trial / "tuner_trial.json", trial / "metrics.jsonl"
        if record.is_file() and journal.is_file() and json.loads(record.read_text())["status"] == "RUNNING":
            if len(journal.read_text().splitlines()) >= 3:
                return trial.name
    return None


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_one_line_and_exit_2(port: str, tmp_path: Path) -> None:
    done = cli("board", str(tmp_path), "--port", port)
    assert done.returncode == 2
    assert done.stderr == f"error: --port: must be 0 (a free port) to 65535, got {port}\n"
