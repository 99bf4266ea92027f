"""task.command on real Ray (CPU): a script run as a process per trial.

One sweep (random + ASHA) holds every ending: scripts reporting through tuner.report and
through the stdout line, one that crashes, one that never reports, one that crashes once and
is retried from its checkpoint; stopped trials' processes are gone. Apart: synchronous
HyperBand pauses and resumes a checkpointing script, kill -9 of the driver leaves no script
behind and `tuner resume` repeats no epoch, torchrun runs 2 gloo processes.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ROOT, SPACES, cli, kill_9_when, resumed_to_the_end
from tests.own_loops import hyperband_resumes, lines
from tuner.config import parse_sweep
from tuner.sweepdir import read_metrics

SCRIPT = "tests/command_script.py"
COMMAND = [
    "python", SCRIPT, "--kind", "{kind}", "--lr", "{lr}", "--epochs", "{max_epochs}", "--sleep", "{sleep}",
]  # fmt: skip


def _raw(tmp_path: Path, **over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "cmd",
        "metric": "val_loss",
        "direction": "min",
        "task": {"command": COMMAND, "checkpoints": True},
        "search": {
            "algorithm": "random",
            "num_samples": 4,
            "params": {"kind": "api", "lr": {"type": "loguniform", "low": 0.01, "high": 0.1}, "sleep": 0.3},
        },
        "schedule": {"max_epochs": 4, "grace_epochs": 1, "reduction_factor": 2},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
        "output": str(tmp_path),
    }
    raw.update(over)
    return raw


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _scripts_of(sweep: Path) -> list[psutil.Process]:
    """Processes whose environment names a trial of `sweep` (the scripts and their children)."""
    found = []
    for p in psutil.process_iter():
        try:
            if str(sweep) in p.environ().get("TUNER_TRIAL_DIR", ""):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _none_left(sweep: Path, timeout: float = 30) -> bool:
    """Whether every process of the sweep's scripts ends within `timeout` seconds (a script
    whose actor Ray killed gets SIGTERM from its supervisor, and has a grace to exit)."""
    deadline = time.time() + timeout
    while _scripts_of(sweep):
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_every_ending_of_a_script_under_asha(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.driver.sweep import run_sweep

    monkeypatch.chdir(ROOT)  # the scripts run where the sweep starts
    raw = _raw(tmp_path, failure={"max_failures": 1})
    kinds = ["crash_once", "api", "stdout", "crash", "silent"]
    raw["search"]["num_samples"] = 8  # kinds in turn: two of the first three
    raw["search"]["params"]["kind"] = {"type": "grid", "values": kinds}
    raw["search"]["params"]["sleep"] = 0.6  # a stop reaches a script mid-way (Tune takes its time)
    out = run_sweep(parse_sweep(raw))
    sweep = Path(out.sweep_dir)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for t in out.summary["trials"]:
        by_kind.setdefault(t["config"]["kind"], []).append(t)
    assert sorted(len(v) for v in by_kind.values()) == [1, 1, 2, 2, 2], by_kind

    crash = by_kind["crash"][0]
    assert crash["status"] == "ERROR", crash
    # The script's own exception is the failure (its traceback in traceback.txt), not its exit code.
    assert crash["failure"] == "error: ValueError: boom: the script fails", crash["failure"]
    told = (sweep / crash["trial_id"] / "traceback.txt").read_text()
    assert told.startswith("task.command ended with exit code 3; the script's traceback:\nTraceback"), told
    silent = by_kind["silent"][0]
    assert silent["status"] == "ERROR" and "metric 'val_loss' is not among" in silent["failure"], silent

    for t in by_kind["crash_once"]:  # the best: never stopped; retried from epoch 2's checkpoint
        d = sweep / t["trial_id"]
        assert t["status"] == "TERMINATED" and t["epochs"] == 4, t
        assert lines(d / "starts.txt") == [0, 2] and lines(d / "trained.txt") == [1, 2, 3, 4]
        assert [r["epoch"] for r in read_metrics(str(d))] == [1, 2, 3, 4]
    stopped = 0
    for t in by_kind["api"] + by_kind["stdout"]:
        d = sweep / t["trial_id"]
        rows = read_metrics(str(d))
        lr = t["config"]["lr"]
        assert [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))
        for r in rows:  # what the script computed, through either channel
            assert math.isclose(r["val_loss"], 10 * lr + 1 / r["epoch"], rel_tol=1e-9), (t, r)
        if len(rows) < 4:
            stopped += 1
            assert t["status"] == "TERMINATED" and t["failure"] is None, t
    assert stopped >= 1, "ASHA stopped a trial"
    # A script still training when its trial was stopped got SIGTERM (one that had trained
    # every epoch before Tune stopped its trial had ended on its own).
    assert any((sweep / t["trial_id"] / "signals.txt").exists() for t in out.summary["trials"])
    pids = [pid for d in sweep.glob("*/pids.txt") for pid in lines(d)]
    assert len(pids) >= 10 and _none_left(sweep)  # every run of every script has ended
    assert not _alive(pids)
    env = json.loads((sweep / by_kind["api"][0]["trial_id"] / "env.json").read_text().splitlines()[0])
    # The script trains; its trial actor never imports torch (about 1 CPU-second and 180 MB per
    # actor): it has torch only as a copy of the warm process (tuner.cluster.worker_fork), which
    # imported it once for every trial, and then at no cost of its own.
    assert env == {"cwd": str(ROOT), "cuda": "", "actor_torch": env["actor_copied"], "actor_copied": True}
    log = (sweep / by_kind["stdout"][0]["trial_id"] / "trial.log").read_text()
    assert "out| TUNER_REPORT {" in log
    threads = "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CUDA_VISIBLE_DEVICES="
    assert f"command: env {threads} python tests/command_script.py --kind stdout" in log


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_hyperband_pauses_and_resumes_a_checkpointing_script(tmp_path: Path) -> None:
    from ray import tune

    space = {"kind": "api", "sleep": 0.2, "lr": tune.grid_search([0.005, 0.01, 0.02, 0.05, 0.1, 0.2])}
    resumed = hyperband_resumes(
        tmp_path, space, 1, trial_mode="command", command=COMMAND, command_params=("kind", "lr", "sleep")
    )
    assert resumed >= 1, "HyperBand paused and resumed a script"
    assert _none_left(tmp_path / "hb")


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")  # the resume runs on it
def test_kill_9_of_the_driver_leaves_no_script_and_resume_repeats_nothing(tmp_path: Path) -> None:
    raw = _raw(tmp_path, name="k9")
    raw["search"]["num_samples"] = 3
    raw["search"]["params"]["sleep"] = 1.0
    raw["schedule"] = {"max_epochs": 6, "early_stopping": False}
    raw["resources"]["max_concurrent_trials"] = 2

    def caught(sweep: Path) -> bool:  # a trial mid-way with a checkpoint of epoch >= 2
        midway = any(2 <= len(lines(t / "trained.txt")) < 6 for t in sweep.glob("*/"))
        return midway and bool(_scripts_of(sweep))

    sweep = kill_9_when(raw, tmp_path, caught)
    assert _none_left(sweep, 60), "a script outlived the driver"
    # The killed `tuner sweep` started its own Ray: its trial actors were copies of a warm
    # process that, for a script's sweep, imported no torch (its actors never need it).
    seen = [json.loads(t.read_text().splitlines()[0]) for t in sweep.glob("*/env.json")]
    assert seen and all(e["actor_copied"] and e["actor_torch"] is False for e in seen), seen
    before = {t.name: lines(t / "trained.txt") for t in sweep.glob("*/") if (t / "trained.txt").exists()}
    # (a trial whose first report had reached the journal has a checkpoint to go on from; one
    # started just before the kill may have none, and starts again from nothing)
    reported = {t.name: len(read_metrics(str(t))) for t in sweep.glob("*/")}
    summary = resumed_to_the_end(sweep, 3)
    for t in summary["trials"]:
        d = sweep / t["trial_id"]
        assert t["epochs"] == 6 and [r["epoch"] for r in read_metrics(str(d))] == list(range(1, 7))
        starts = lines(d / "starts.txt")
        if reported.get(t["trial_id"]):  # never from epoch 0 again
            assert all(s > 0 for s in starts[1:]), (t["trial_id"], starts)
        trained = lines(d / "trained.txt")
        # Epochs up to the checkpoint it went on from are trained once. (Those a script
        # trained after it, until Ray ended its actor a few seconds after the driver, are
        # trained again: no report of theirs reached the journal.)
        assert all(trained.count(e) == 1 for e in range(1, starts[-1] + 1)), (t["trial_id"], trained)
    for name, done in before.items():
        if 2 <= len(done) < 6:  # caught mid-way: went on from its checkpoint
            assert lines(sweep / name / "starts.txt")[-1] >= 1


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_torchrun_runs_two_gloo_processes_and_only_rank_0_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also: each rank gets its worker's share of threads (not the trial's total), and the
    report's command, run alone on a machine whose default is another thread count, computes
    the recorded values bit for bit (issue 44, item 2)."""
    from tuner.driver.sweep import run_sweep

    monkeypatch.chdir(ROOT)
    raw = _raw(tmp_path, name="ddp")
    raw["task"] = {"command": f"python {SCRIPT} --kind ddp --epochs {{max_epochs}}", "launcher": "torchrun"}
    raw["search"] = {"algorithm": "random", "num_samples": 1, "params": {}}
    raw["schedule"] = {"max_epochs": 2}
    raw["resources"]["workers_per_trial"] = 2
    out = run_sweep(parse_sweep(raw))
    (t,) = out.summary["trials"]
    assert t["status"] == "TERMINATED" and t["epochs"] == 2, t
    trial = Path(out.sweep_dir) / t["trial_id"]
    rows = read_metrics(str(trial))
    seen = [(r["epoch"], round(r["val_loss"], 1), r["rank"], r["world"]) for r in rows]
    assert seen == [(1, 3.0, 0, 2), (2, 1.5, 0, 2)]  # all_reduce of 1 + 2, from rank 0 alone
    assert [r["threads"] for r in rows] == [2, 2]  # 1 thread per rank: cpus_per_worker, not the trial's 2
    assert _none_left(Path(out.sweep_dir))
    logged = [ln for ln in (trial / "trial.log").read_text().splitlines() if " command: " in ln]
    assert logged and "command: env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= " in logged[0]
    report = cli("report", out.sweep_dir, "--format", "md")
    block = report.stdout.split("Train this configuration again", 1)[1].split("```", 2)[1]
    argv = shlex.split(block.strip().splitlines()[-1])
    assert argv[:4] == ["env", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "CUDA_VISIBLE_DEVICES="], argv
    assert argv[4:7] == ["torchrun", "--standalone", "--nproc-per-node=2"], argv
    # Alone, where the machine's default is 3 threads a process: the line's environment wins.
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    env["TUNER_TRIAL_DIR"] = str(tmp_path)  # (where the script notes its pid; not the repository)
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    line = r"tuner.report: epoch=(\d+), val_loss=([^,]+), rank=0, world=2, threads=(\d+)"
    printed = re.findall(line, again.stdout)
    assert [(int(e), float(v), int(n)) for e, v, n in printed] == [
        (r["epoch"], r["val_loss"], r["threads"]) for r in rows
    ], again.stdout
    # Alone too, rank 0 prints the reports, each line in one write: another rank's output
    # (its prints) lands around it, never inside it.
    assert "rank=1" not in again.stdout and again.stdout.count("tuner.report:") == 2, again.stdout


# ----------------------------------------------------------------------------- no Ray


def _refusal(tmp_path: Path, **over: Any) -> str:
    from tuner.errors import ConfigError

    raw = _raw(tmp_path)
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            raw[section] = {**raw.get(section, {}), field: value}
        else:
            raw[section] = value
    with pytest.raises(ConfigError) as err:
        parse_sweep(raw)
    return str(err.value)


def test_placeholders_and_parameters_meet_one_to_one(tmp_path: Path) -> None:
    params = _raw(tmp_path)["search"]["params"]
    assert _refusal(tmp_path, task__command=[*COMMAND, "--x", "{foo}"]).startswith(
        "task.command: placeholder {foo} names no parameter (known: kind, lr, sleep, max_epochs"
    )
    assert _refusal(tmp_path, search={"params": {**params, "bs": 32}}).startswith(
        "search.params.bs: does not reach the command: use {bs} in task.command, or list it in "
        "task.env_params (the script then reads TUNER_PARAM_BS or $TUNER_CONFIG_JSON)"
    )
    ok = _raw(tmp_path)
    ok["search"]["params"]["batch-size"] = 32
    ok["task"]["env_params"] = ["batch-size"]
    assert parse_sweep(ok).task.env_params == ["batch-size"]
    assert _refusal(tmp_path, task__env_params=["nope"]).startswith("task.env_params: 'nope' is not")
    assert "without a format" in _refusal(tmp_path, task__command="python t.py {lr:.3f}")
    assert "{0} is not {name} of a parameter" in _refusal(tmp_path, task__command="python t.py {0}")
    assert _refusal(tmp_path, task__model="mlp").startswith("task.model: task.command runs your script")
    assert _refusal(tmp_path, training={"lr": 0.1}).startswith("training.lr: task.command runs your script")
    assert _refusal(tmp_path, resources__workers_per_trial=2).startswith(
        "resources.workers_per_trial: task.command runs one process per trial; set task.launcher: torchrun"
    )
    alone = _raw(tmp_path)
    alone["task"] = {"model": "mlp", "data": "digits", "checkpoints": True}
    with pytest.raises(Exception, match="task.checkpoints: goes with task.command"):
        parse_sweep(alone)


def test_a_bad_command_is_one_line_and_exit_2_before_ray(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    raw["task"]["command"] = "python train.py --lr {lr} --width {width}"
    (tmp_path / "bad.yaml").write_text(json.dumps(raw))
    out = cli("validate", str(tmp_path / "bad.yaml"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "task.command: placeholder {width} names no parameter (known: kind, lr, sleep, max_epochs, "
            "trial_dir, trial_id)"
        )
    )


@pytest.mark.parametrize("name", ["trial_dir", "trial_id", "max_epochs"])
def test_a_parameter_may_not_take_a_placeholder_s_name(name: str) -> None:
    # Issue 26: search.params.trial_dir replaced {trial_dir} (the trial's own directory) in
    # every trial's command line: all trials wrote into one directory of the user's choosing.
    out = cli("validate", str(SPACES / "script.yaml"), "--set", f"search.params.{name}=/tmp/somewhere")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: search.params.{name}: is the name of a placeholder tuner fills")


def test_bohb_says_at_validation_that_a_script_without_checkpoints_is_only_stopped(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    raw["search"]["algorithm"] = "bohb"
    raw["task"]["checkpoints"] = False
    (tmp_path / "bohb.yaml").write_text(json.dumps(raw))
    out = cli("validate", str(tmp_path / "bohb.yaml"))
    assert out.returncode == 0 and "task.checkpoints is false: bohb only stops trials" in out.stderr
    raw["task"]["checkpoints"] = True
    (tmp_path / "bohb.yaml").write_text(json.dumps(raw))
    out = cli("validate", str(tmp_path / "bohb.yaml"))
    assert out.returncode == 0 and "warning" not in out.stderr


def test_values_fill_the_words_of_the_command() -> None:
    from tuner.config.placeholders import env_name, fill

    argv = fill(
        "python t.py --lr {lr} --name '{name}' --flag={on} -x{{y}}", {"lr": 1e-05, "name": "a b", "on": True}
    )
    assert argv == ["python", "t.py", "--lr", "1e-05", "--name", "a b", "--flag=true", "-x{y}"]
    assert env_name("batch-size") == "TUNER_PARAM_BATCH_SIZE"


def test_report_is_light_prints_alone_and_writes_its_file_in_a_sweep(tmp_path: Path) -> None:
    code = (
        "import sys, tuner; tuner.report(epoch=1, val_loss=0.5); "
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules), "
        "tuner.checkpoint_dir(), tuner.restore_dir())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.splitlines() == ["tuner.report: epoch=1, val_loss=0.5", "[] None None"], out.stderr
    env = {
        **os.environ,
        "TUNER_REPORT_FILE": str(tmp_path / "reports.jsonl"),
        "TUNER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
    }
    code = (
        "import tuner, os; d = tuner.checkpoint_dir(); assert d == tuner.checkpoint_dir(); "
        "open(os.path.join(d, 's'), 'w').close(); "
        "tuner.report(epoch=1, val_loss=0.5); tuner.report(epoch=2, x='a')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env
    )
    assert out.returncode == 0 and out.stdout == "", out.stderr
    first, second = [json.loads(line) for line in (tmp_path / "reports.jsonl").read_text().splitlines()]
    assert Path(first.pop("checkpoint")).parent == tmp_path / "ckpt" and first == {
        "epoch": 1,
        "val_loss": 0.5,
    }
    assert second == {"epoch": 2, "x": "a"}
    rank1 = subprocess.run(
        [sys.executable, "-c", "import tuner; tuner.report(epoch=3, val_loss=1.0)"],
        cwd=ROOT, env={**env, "RANK": "1"}, timeout=60,
    )  # fmt: skip
    assert rank1.returncode == 0 and len((tmp_path / "reports.jsonl").read_text().splitlines()) == 2


def test_the_supervisor_ends_the_whole_tree_when_its_parent_dies(tmp_path: Path) -> None:
    """A parent (the trial actor) killed with -9: the script and what it started in a session
    of its own (as torchrun starts its workers) end, within the supervisor's grace."""
    from tuner.trial.script.process import SUPERVISOR

    pids = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time; "
        "w = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{w.pid}}'); time.sleep(300)"
    )
    actor = (
        "import os, subprocess, sys; "
        f"subprocess.Popen([sys.executable, {SUPERVISOR!r}, str(os.getpid()), '2', '--', "
        f"sys.executable, '-c', {script!r}]); "
        "import time; time.sleep(300)"
    )
    parent = subprocess.Popen([sys.executable, "-c", actor])
    deadline = time.time() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.time() < deadline:
        time.sleep(0.05)
    started = [int(p) for p in pids.read_text().split()]
    assert len(_alive(started)) == 2
    parent.kill()
    parent.wait()
    deadline = time.time() + 15
    while _alive(started) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(started)


def test_a_report_line_is_read_whole_whatever_another_rank_writes_into_it(tmp_path: Path) -> None:
    """torchrun's ranks share one stdout: rank 1's output before rank 0's report line and
    between its JSON and its newline (command_script.py's `shared` kind) neither loses a report
    nor fails the trial; a line that names the prefix without an object after it is no report."""
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.script.process import _report_text
    from tuner.trial.script.run import run_command

    cmd = ["python", SCRIPT, "--kind", "shared", "--epochs", "{max_epochs}"]
    spec = TrialSpec(
        model="", data="", trial_mode="command", command=cmd, max_epochs=4, metric="val_loss",
        direction="min", start_dir=str(ROOT),
    )  # fmt: skip
    session = LocalSession(str(tmp_path))
    run_command({}, spec, session)
    assert [(m["epoch"], m["val_loss"]) for m in session.metrics] == [(e, 1 / e) for e in range(1, 5)]
    log = (tmp_path / "trial.log").read_text()
    assert "out| [rank1] step 1: {'loss': 2.5}TUNER_REPORT " in log  # (the lines did interleave)
    assert _report_text("parsing TUNER_REPORT lines") is None
    assert _report_text("TUNER_REPORT nope") == "nope"  # a line of its own: the trial says it is no JSON


def _oom_trial(tmp_path: Path, retries: int, placeholder: bool = True) -> Any:
    """A trial of command_script.py's `oom` kind (out of memory at epoch 2 above batch 16),
    run without Ray: batch 64, 3 epochs."""
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.script.run import run_command

    batch = ["--batch_size", "{batch_size}" if placeholder else "64"]
    cmd = ["python", SCRIPT, "--kind", "oom", *batch, "--epochs", "{max_epochs}", "--sleep", "0"]
    spec = TrialSpec(
        model="", data="", trial_mode="command", command=cmd, command_params=("batch_size",),
        max_epochs=3, metric="val_loss", direction="min", oom_retries=retries, start_dir=str(ROOT),
    )  # fmt: skip
    session = LocalSession(str(tmp_path))
    run_command({"batch_size": 64}, spec, session)
    return session


@pytest.mark.slow
def test_a_script_out_of_memory_runs_again_with_its_batch_halved_or_ends_as_oom(tmp_path: Path) -> None:
    # Retries left: 64 and 32 run out at epoch 2; 16 goes on from epoch 1's checkpoint and finishes.
    s = _oom_trial(tmp_path / "retried", retries=3)
    last = s.metrics[-1]
    assert "failure" not in last and last["epoch"] == 3 and last["oom_retries"] == 2, s.metrics
    d = tmp_path / "retried"
    assert lines(d / "batch_sizes.txt") == [64, 32, 16] and lines(d / "starts.txt") == [0, 1, 1]
    assert [r["epoch"] for r in read_metrics(str(d))] == [1, 2, 3]
    log = (d / "trial.log").read_text()
    said = "out of memory (torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert said in log and "running the script again from its last checkpoint with batch_size 32 " in log
    assert "(was batch_size 64; failure.oom_retries: 1 of 3)" in log
    # No retry left: the trial ends as oom, a result (no traceback.txt), saying where it stood.
    s = _oom_trial(tmp_path / "spent", retries=1)
    last = s.metrics[-1]
    assert last["failure"] == "oom" and last["val_loss"] == math.inf and last["epoch"] == 1, last
    assert last["failure_detail"].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert last["failure_detail"].endswith("; at batch_size 32, after 1 retries (failure.oom_retries)")
    assert not (tmp_path / "spent" / "traceback.txt").exists()
    # Nothing to halve: oom at once, and why it was not run again.
    s = _oom_trial(tmp_path / "fixed", retries=3, placeholder=False)
    last = s.metrics[-1]
    assert last["failure"] == "oom" and "no batch-size placeholder" in last["failure_detail"]
