"""Results you can trust (issue 17): a resumed sweep runs exactly what it would have run
uninterrupted; a sweep directory is resumed where it is, by one run at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEBUG, ROOT, cli, debug_config
from tests.interrupt import heard
from tuner.config import ConfigError
from tuner.driver.sweep import AlreadyFinished, SweepOutcome, resume_sweep, run_sweep
from tuner.search.algorithms import random_configs
from tuner.search.plan import key
from tuner.sweepdir import LOCK_FILE, Place, resolve

pytestmark = pytest.mark.slow
TRIALS = 3
RANGES = {
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "width": {"type": "randint", "low": 8, "high": 32},
}
SEARCHED = {
    "grid": {"lr": {"type": "grid", "values": [0.01, 0.03, 0.1]}, "width": 8},
    "random": RANGES,
    "bohb": RANGES,
    "optuna": RANGES,
}
# The n-th trial model built interrupts the sweep (Ctrl-C): the first (during the first trial,
# none finished); then, in the sweep resumed from there, the third (the first trial's model
# built again is the second): during the second trial, the one before last (one finished, one
# still to start). That run resumed runs to the end.
INTERRUPT_AT = "1,3"


@pytest.fixture(autouse=True)
def _interrupts_heard(tmp_path: Path) -> Iterator[None]:
    """The in-process driver acknowledges each SIGINT a build fires (tests/interrupt.py)."""
    with heard(str(tmp_path)):
        yield


def _config(root: Path, algorithm: str, interrupt_at: str) -> Any:
    params: dict[str, Any] = {
        **SEARCHED[algorithm],
        "depth": 1,
        "chaos_dir": str(root / "chaos"),
        "interrupt_at": interrupt_at,
        "driver_pid": os.getpid(),  # in-process: this test's process drives the sweep
        "await_stop": True,  # (the build that interrupts waits until the driver heard: `heard`)
    }
    cfg = debug_config(
        root,
        task__model="tests.interrupt:after_builds",
        search__algorithm=algorithm,
        search__params=params,
        search__num_samples=TRIALS,
        schedule__max_epochs=2,
        resources__max_concurrent_trials=1,  # one at a time: the n-th build comes after n-1 ends
    )
    return cfg


def _sweep(root: Path, algorithm: str, interrupt_at: str) -> SweepOutcome:
    root.mkdir()
    (root / "chaos").mkdir()
    return run_sweep(_config(root, algorithm, interrupt_at))


def _configs(outcome: SweepOutcome, algorithm: str) -> list[str]:
    """The searched part of every trial's configuration, as sorted keys."""
    trials = outcome.summary["trials"]
    assert len({t["trial_id"] for t in trials}) == len(trials)
    return sorted(key({k: t["config"][k] for k in SEARCHED[algorithm]}) for t in trials)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algorithm", list(SEARCHED))
def test_resumed_sweep_runs_what_an_uninterrupted_one_runs(tmp_path: Path, algorithm: str) -> None:
    """Interrupted twice (INTERRUPT_AT), each time resumed. Grid and random: the very trials
    an uninterrupted sweep runs, their list fixed by the seed (random_configs: what
    test_life's sweeps are checked to run). Model-based: as many trials, none run twice (what
    they would have proposed uninterrupted depends on the results). Random's second
    interruption is resumed from a copy of its directory: the copy resumes into itself, and
    the original is left as it was."""
    expected: list[str] = []
    if algorithm == "grid":
        expected = sorted(key({"lr": lr, "width": 8}) for lr in SEARCHED["grid"]["lr"]["values"])
    elif algorithm == "random":
        cfg = _config(tmp_path / "planned", algorithm, INTERRUPT_AT)
        planned = random_configs(cfg.hyperparameters(), TRIALS, cfg.search.seed)
        expected = sorted(key({k: c[k] for k in SEARCHED[algorithm]}) for c in planned)
    stopped = _sweep(tmp_path / "at", algorithm, interrupt_at=INTERRUPT_AT)
    assert stopped.exit_code == 130, stopped.summary["counts"]
    again = resume_sweep(stopped.sweep_dir)
    assert again.exit_code == 130, again.summary["counts"]
    if algorithm == "random":
        resumed = _resume_a_copy(Path(again.sweep_dir))
    else:
        resumed = resume_sweep(again.sweep_dir)
    assert resumed.summary["status"] == "completed", resumed.summary["counts"]
    got = _configs(resumed, algorithm)
    if expected:  # the very same trials
        assert got == expected
    if algorithm == "grid":  # no early stopping: every trial trains to the end, the ones a
        # Ctrl-C stopped at their next report too (continued by resume, not counted finished)
        assert [t["epochs"] for t in resumed.summary["trials"]] == [2] * TRIALS
    else:  # model-based: as many trials, none run twice
        assert len(got) == len(set(got)) == TRIALS, got


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root -> (size, mtime in ns); directories as (-1, 0)."""
    return {
        str(p.relative_to(root)): (-1, 0) if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
    }


def _resume_a_copy(original: Path) -> SweepOutcome:
    """Resume a copy of an interrupted sweep's directory: it resumes into itself and leaves the
    original alone; a damaged summary.json of the finished copy is rewritten, not a traceback."""
    copy = original.with_name("debug-moved")
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    before = _tree(original)
    resumed = resume_sweep(str(copy))
    assert _tree(original) == before, "the original sweep was written to"
    assert resumed.sweep_dir == str(copy) and resumed.summary["status"] == "completed"
    ids = {t["trial_id"] for t in resumed.summary["trials"]}
    assert len(ids) == TRIALS and all((copy / t / "tuner_trial.json").is_file() for t in ids)
    assert json.loads((original / "summary.json").read_text())["status"] == "interrupted"
    # A summary.json cut short (a crash while writing it) is no reason for a traceback.
    (copy / "summary.json").write_text('{"status": "compl')
    with pytest.raises(AlreadyFinished, match="completed; its damaged summary.json is rewritten"):
        resume_sweep(str(copy))
    assert json.loads((copy / "summary.json").read_text())["status"] == "completed"
    return resumed


@pytest.mark.parametrize("name", ["..", "."])
def test_name_dot_or_dotdot_is_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    output = tmp_path / "runs"
    output.mkdir()
    (tmp_path / "sweep.yaml").write_text("mine\n")  # what `--name ..` used to overwrite
    before = _tree(tmp_path)
    out = cli("sweep", str(DEBUG), "--output", str(output), "--name", name)
    assert out.returncode == 2 and out.stderr.startswith("error: name: "), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert _tree(tmp_path) == before


def test_name_must_stay_inside_output() -> None:
    assert resolve("/runs", "debug") == "/runs/debug"
    for name in ("..", ".", "a/..", "../x", ""):
        with pytest.raises(ConfigError, match="not one directory name"):
            resolve("/runs", name)


def _holder_pid(sweep: Path) -> int | None:
    try:
        return int(json.loads((sweep / LOCK_FILE).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def test_two_runs_on_one_sweep_directory_one_is_refused(tmp_path: Path) -> None:
    args = [
        sys.executable, "-m", "tuner", "sweep", str(DEBUG), "--output", str(tmp_path),
        "--num-samples", "2", "--max-epochs", "6", "--set", "training.batch_size=16",
    ]  # fmt: skip
    runs = [
        subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in "ab"
    ]
    deadline = time.time() + 60
    while all(p.poll() is None for p in runs) and time.time() < deadline:
        time.sleep(0.05)
    refused = [p for p in runs if p.poll() is not None]
    assert len(refused) == 1, "one of two runs started together must be refused at once"
    (loser,) = refused
    (winner,) = [p for p in runs if p is not loser]
    sweep = tmp_path / "debug"
    err = loser.stderr.read()
    assert loser.returncode == 2 and err.startswith("error: name: "), err
    assert len(err.strip().splitlines()) == 1 and f"pid {winner.pid}" in err
    assert _holder_pid(sweep) == winner.pid
    # resume while it runs: refused too, naming the same holder.
    again = cli("resume", str(sweep))
    assert winner.poll() is None, "the winner ended before resume was tried"
    assert again.returncode == 2 and f"in use by another tuner run (`sweep`, pid {winner.pid}" in again.stderr
    out, err = winner.communicate(timeout=300)
    assert winner.returncode == 0, out + err
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["trials"]) == 2
    # Progress lines count the trial that just ended (they said "0/2 done" for the first).
    finished = [ln for ln in out.splitlines() if ln.startswith("[tuner] trial ")]
    assert [ln.split(" · ")[1] for ln in finished] == ["1/2 done", "2/2 done"], out


def test_an_empty_sweep_yaml_from_an_older_run_is_explained(tmp_path: Path) -> None:
    sweep = tmp_path / "debug"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("")  # what a non-atomic write left when it was cut short
    again = cli("sweep", str(DEBUG), "--output", str(tmp_path))
    assert again.returncode == 2 and "sweep.yaml is empty and no trial ran" in again.stderr, again.stderr
    assert "delete the directory and start the sweep again" in again.stderr
    resumed = cli("resume", str(sweep))
    assert resumed.returncode == 2 and "sweep.yaml is empty and no trial ran" in resumed.stderr
    assert len(resumed.stderr.strip().splitlines()) == 1, resumed.stderr


def test_sweep_yaml_is_replaced_whole(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    with Place(str(sweep)).claim(new=True, command="sweep") as held:
        held.write_config("name: first\n")
        held.write_config("name: second\n")
        assert sorted(p.name for p in sweep.iterdir()) == [LOCK_FILE, "sweep.yaml"]
        # A write that fails (here: its temporary file cannot be made) leaves the file whole.
        (sweep / ".sweep.yaml.tmp").mkdir()
        with pytest.raises(IsADirectoryError):
            held.write_config("name: third\n")
    assert (sweep / "sweep.yaml").read_text() == "name: second\n"


def test_configuration_keys_count_numbers_by_value() -> None:
    # A trial recorded with warmup_epochs 0 is the configuration sweep.yaml reads back as 0.0.
    assert key({"lr": 0.1, "warmup_epochs": 0}) == key({"warmup_epochs": 0.0, "lr": 0.1})
    assert key({"x": 1}) != key({"x": True}) and key({"x": 0.5}) != key({"x": 0})


@pytest.mark.usefixtures("ray_session")
def test_two_trials_of_one_configuration_each_resume_in_their_own_directory(tmp_path: Path) -> None:
    # Random search over few choices draws a configuration twice. Interrupted while both ran
    # (default concurrency; the first trial's model waits for the second's to be built: both
    # are mid-way), each must continue from its own checkpoints: Tune copies the
    # directory-naming object for every trial, and the copies gave both the first one's directory.
    root = tmp_path / "runs"
    root.mkdir()
    (root / "chaos").mkdir()
    cfg = debug_config(
        root,
        task__model="tests.interrupt:after_builds",
        search__algorithm="random",
        search__params={
            "lr": {"type": "choice", "values": [0.05]},
            "depth": 1,
            "chaos_dir": str(root / "chaos"),
            "interrupt_at": 2,  # the second trial's build: both have started
            "hold_builds": 2,  # the first trial trains once the second's model is built
            "driver_pid": os.getpid(),
        },
        search__num_samples=2,
        schedule__max_epochs=3,
        schedule__early_stopping=False,
    )
    stopped = run_sweep(cfg)
    assert stopped.exit_code == 130 and stopped.summary["counts"].get("unfinished", 0) == 2, stopped.summary
    sweep = Path(stopped.sweep_dir)
    before = sorted(t["trial_id"] for t in stopped.summary["trials"])
    resumed = resume_sweep(str(sweep))
    assert resumed.exit_code == 0 and resumed.summary["status"] == "completed", resumed.summary["counts"]
    assert sorted(t["trial_id"] for t in resumed.summary["trials"]) == before  # no new directory
    for trial in before:
        epochs = [json.loads(line)["epoch"] for line in (sweep / trial / "metrics.jsonl").open()]
        assert epochs == list(range(1, 4)), (trial, epochs)  # each continued once, none restarted


@pytest.mark.usefixtures("ray_session")
def test_a_sweep_resumed_in_the_same_second_continues_its_trials_in_their_own_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray Tune stages a run's driver-side files under the Ray session, in a directory named by
    # the second the run began; a trial whose directory is already there gets a new name. A
    # resume begun in the same second as the run it resumes (in one process, on one Ray: a
    # notebook, these tests) found the interrupted trial staged there by that run, continued
    # it in a second directory and left the original unfinished, so the next resume ran its
    # configuration again. The clock Tune reads for that name is held still here.
    from ray.tune import utils as tune_utils

    monkeypatch.setattr(tune_utils, "date_str", lambda: "2026-11-29_00-00-00")
    stopped = _sweep(tmp_path / "at", "grid", interrupt_at="1")
    assert stopped.exit_code == 130, stopped.summary["counts"]
    began = sorted(t["trial_id"] for t in stopped.summary["trials"])
    assert began, stopped.summary
    resumed = resume_sweep(stopped.sweep_dir)
    assert resumed.summary["status"] == "completed", resumed.summary["counts"]
    trials = {t["trial_id"]: t["epochs"] for t in resumed.summary["trials"]}
    assert set(began) <= set(trials) and len(trials) == TRIALS, (began, trials)
    assert list(trials.values()) == [2] * TRIALS, trials  # the interrupted one continued, in place


@pytest.mark.usefixtures("ray_session")
def test_two_sweeps_of_one_name_begun_in_the_same_second_keep_their_own_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray Tune stages a run's files in a directory named by the sweep's name and the second it
    # began, and copies that directory into the sweep: a second sweep named alike begun in the
    # same second on the same Ray copied the first one's trials into itself. Tune's clock is
    # held still here.
    from ray.tune import utils as tune_utils

    monkeypatch.setattr(tune_utils, "date_str", lambda: "2026-11-29_00-00-00")
    ran = {}
    for lr in (0.01, 0.03):
        root = tmp_path / str(lr)
        root.mkdir()
        cfg = debug_config(root, search__params={"lr": lr, "width": 8, "depth": 1}, search__num_samples=1)
        ran[lr] = run_sweep(cfg)
    for lr, out in ran.items():
        assert out.exit_code == 0 and out.summary["status"] == "completed", out.summary["counts"]
        trials = out.summary["trials"]
        assert [t["config"]["lr"] for t in trials] == [lr], trials  # its own, and no other
        assert {p.name for p in Path(out.sweep_dir).iterdir() if (p / "params.json").exists()} == {
            trials[0]["trial_id"]
        }
