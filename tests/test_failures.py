"""Trials that fail, inside real sweeps on Ray: retries from checkpoints, user errors,
divergence and out-of-memory end one trial and never the sweep."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import DEBUG, assert_resources_returned, cli, debug_config, run_cli
from tuner.config import ConfigError
from tuner.driver.resources import TrialResources, check_scalable
from tuner.driver.sweep import run_sweep
from tuner.sweepdir import read_metrics

pytestmark = pytest.mark.usefixtures("ray_session")

# debug.yaml: 512 samples, 20% validation -> 410 training samples; batch 32 -> 13 steps/epoch.
STEPS_PER_EPOCH = 13


def _one_trial(tmp_path: Path, params: dict | None = None, **over):
    """A grid sweep over `params` (bare values fixed, lists searched) of the debug task."""
    base = {"lr": 0.05, "optimizer": "adam", "width": 16, "depth": 1}
    raw = {
        k: ({"type": "grid", "values": v} if isinstance(v, list) else v)
        for k, v in {**base, **(params or {})}.items()
    }
    return debug_config(
        tmp_path, search__algorithm="grid", search__params=raw, **{"schedule__max_epochs": 4, **over}
    )


def test_crashed_trial_is_retried_from_its_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    params = {"fail_at_step": 2 * STEPS_PER_EPOCH + 1, "marker": str(marker)}
    cfg = _one_trial(tmp_path, params, task__model="tests.chaos:flaky", failure__max_failures=1)
    out = run_sweep(cfg)
    assert marker.exists(), "the trial did fail once"
    (t,) = out.summary["trials"]
    assert out.exit_code == 0 and t["status"] == "TERMINATED" and t["epochs"] == 4
    trial_dir = Path(out.sweep_dir) / t["trial_id"]
    assert [r["epoch"] for r in read_metrics(str(trial_dir))] == [1, 2, 3, 4]
    assert "resumed at epoch 2" in (trial_dir / "trial.log").read_text()  # not from epoch 0


def test_ddp_trial_whose_rank1_dies_is_retried_from_its_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "rank1-died"
    # Each of the 2 ranks runs 16 of the 32 samples a step: still 13 steps an epoch.
    params = {
        "fail_at_step": 2 * STEPS_PER_EPOCH + 1,
        "marker": str(marker),
        "fail_rank": 1,
        "die_after_s": 5,
    }
    cfg = _one_trial(
        tmp_path,
        params,
        task__model="tests.chaos:flaky",
        resources__workers_per_trial=2,
        failure__max_failures=1,
    )
    out = run_sweep(cfg)
    assert marker.exists(), "rank 1 did die once"
    (t,) = out.summary["trials"]
    assert out.exit_code == 0 and t["status"] == "TERMINATED", t
    assert t["epochs"] == 4 and t["last_metrics"]["world_size"] == 2
    trial_dir = Path(out.sweep_dir) / t["trial_id"]
    assert [r["epoch"] for r in read_metrics(str(trial_dir))] == [1, 2, 3, 4]
    assert "resumed at epoch 2" in (trial_dir / "trial.log").read_text()  # not from epoch 0
    assert_resources_returned()


def test_a_user_error_oom_and_divergence_each_end_their_trial_only(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    """One sweep, a trial for each way to fail (tests.chaos:fault) beside a healthy one, ASHA on:
    the user's error ends its trial (status ERROR, exit 1); out of memory below the minimum
    micro-batch and a diverged loss end theirs as results (never ERROR: alone they exit 0);
    the healthy trial is the best and trains to its last epoch."""
    params = {"fault": ["none", "error", "oom", "diverge"], "min_micro_batch": 8, "oom_above": 2}
    over = {"task__model": "tests.chaos:fault", "schedule__max_epochs": 2, "schedule__early_stopping": True}
    cfg = _one_trial(tmp_path, params, **over)
    out = run_sweep(cfg)
    by_fault = {t["config"]["fault"]: t for t in out.summary["trials"]}
    error, oom, bad, healthy = (by_fault[f] for f in ("error", "oom", "diverge", "none"))
    # The user's error: one line naming it and its traceback's file; no traceback printed.
    printed = capfd.readouterr()
    trace = Path(out.sweep_dir) / error["trial_id"] / "traceback.txt"
    said = f"failed: ValueError: cannot build a layer of width 16 (full traceback: {trace})"
    assert said in printed.out
    assert "Traceback" not in printed.out + printed.err, printed.err
    assert error["status"] == "ERROR"
    assert error["failure"] == "error: ValueError: cannot build a layer of width 16"
    assert "ValueError" in trace.read_text()
    assert out.exit_code == 1  # an error left fewer finished trials than planned
    # Out of memory below min_micro_batch: a result, not an error.
    assert oom["failure"] == "oom" and oom["status"] != "ERROR", oom
    assert out.summary["counts"]["oom"] == 1
    # Diverged: ended after its first epoch, never best; the scheduler saw -inf, never NaN
    # (ASHA's rung cut-offs do not guard against NaN).
    assert bad["failure"] == "diverged" and bad["epochs"] == 1 and bad["best_value"] is None, bad
    assert bad["status"] != "ERROR" and out.summary["counts"].get("diverged") == 1
    reported = [json.loads(line) for line in (Path(out.sweep_dir) / bad["trial_id"] / "result.json").open()]
    assert reported[-1]["val_acc"] == -math.inf and not any(math.isnan(r["val_acc"]) for r in reported)
    # The healthy one goes on to the end and is the best.
    assert healthy["status"] == "TERMINATED" and healthy["failure"] is None and healthy["epochs"] == 2
    assert out.summary["best"]["trial_id"] == healthy["trial_id"]


def test_autoscaling_cluster_waits_for_what_a_node_type_can_hold(capsys: pytest.CaptureFixture) -> None:
    res = TrialResources(workers=2, cpus_per_worker=4, gpus_per_worker=1, bundle={}, max_concurrent=None)
    check_scalable(res, [({"CPU": 8, "GPU": 1}, 10)])
    assert "wait until it scales up" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="no node type"):
        check_scalable(res, [({"CPU": 8}, 10), ({"CPU": 2, "GPU": 1}, 4)])


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 150 KiB file system (tmpfs; needs root), unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=150k", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_stops_the_sweep_like_an_interrupt(small_disk: Path) -> None:
    run = run_cli(
        "sweep", str(DEBUG), "--output", str(small_disk), "--max-epochs", "30",
        "--set", "schedule.early_stopping=false",
    )  # fmt: skip
    sweep = small_disk / "debug"
    assert run.returncode == 130, run.stdout + run.stderr  # as an interrupt: resumable
    said = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
    assert said == [
        f"error: the disk under {sweep} is full (No space left on device); the sweep stopped. Kept: "
        "every finished trial and each unfinished trial's newest checkpoint. Free some space, then "
        f"continue with: python -m tuner resume {sweep}"
    ], run.stderr
    assert "Traceback" not in run.stdout + run.stderr and len(run.stderr.splitlines()) < 10, run.stderr
    assert not [p for p in small_disk.rglob("*") if p.name.endswith(".tmp")]


# schedule.trial_timeout of the hang tests: no machine's healthy epoch reaches it, and a hung
# trial's watchdog sees it pass at once (tests.chaos.timeout_passes), so no test waits for it.
TRIAL_TIMEOUT_S = 300


def test_a_trial_that_hangs_ends_as_timeout_and_the_sweep_goes_on(tmp_path: Path) -> None:
    params = {"hang_at_step": 2 * STEPS_PER_EPOCH + 1, "hang_width": 8, "width": [8, 16]}
    cfg = _one_trial(
        tmp_path,
        params,
        task__model="tests.chaos:hang",
        schedule__max_epochs=3,
        schedule__trial_timeout=TRIAL_TIMEOUT_S,
    )
    out = run_sweep(cfg)
    by_width = {t["config"]["width"]: t for t in out.summary["trials"]}
    hung = by_width[8]
    assert hung["failure"] == "timeout" and hung["epochs"] == 2, hung
    # Its two epochs are results (the epoch it hung in is not).
    rows = read_metrics(str(Path(out.sweep_dir) / hung["trial_id"]))
    assert hung["best_value"] == max(r["val_acc"] for r in rows[:2]) and rows[2]["failure"] == "timeout"
    assert by_width[16]["failure"] is None and by_width[16]["epochs"] == 3
    best = max((hung, by_width[16]), key=lambda t: t["best_value"])
    assert out.summary["best"]["trial_id"] == best["trial_id"]
    log = (Path(out.sweep_dir) / hung["trial_id"] / "trial.log").read_text()
    assert f"no epoch finished within {TRIAL_TIMEOUT_S} s" in log and "in trip" in log  # where it hung


def test_ddp_trials_whose_ranks_raise_or_hang_fail_alone_and_hand_their_workers_back(tmp_path: Path) -> None:
    """Two workers a trial, so one trial at a time on 2 CPUs, in the grid's order. Width 12:
    both ranks raise building the model (a user's bug), the trial ends in ERROR. Width 8: rank 1
    hangs (it does not die) and rank 0 waits for it in the gradients' all-reduce; the trial
    ends as timed out by its watchdog (whose clock then jumps past schedule.trial_timeout: see
    tests.chaos), not by the collective's own timeout. Width 16, after both, gets both ranks'
    CPUs back and trains over 2 ranks to its end."""
    params = {
        "broken_width": 12,
        "hang_at_step": 2 * STEPS_PER_EPOCH + 1,
        "hang_width": 8,
        "hang_rank": 1,
        "width": [12, 8, 16],
    }
    cfg = _one_trial(
        tmp_path,
        params,
        task__model="tests.chaos:broken_or_hang",
        resources__workers_per_trial=2,
        schedule__max_epochs=3,
        schedule__trial_timeout=TRIAL_TIMEOUT_S,
    )
    out = run_sweep(cfg)
    by_width = {t["config"]["width"]: t for t in out.summary["trials"]}
    raised, hung, other = by_width[12], by_width[8], by_width[16]
    assert raised["status"] == "ERROR"
    assert raised["failure"] == "error: ValueError: cannot build a layer of width 12"
    assert out.exit_code == 1
    assert hung["failure"] == "timeout" and hung["epochs"] == 2, hung
    rows = read_metrics(str(Path(out.sweep_dir) / hung["trial_id"]))
    assert rows[2]["failure"] == "timeout"
    # Ended by the watchdog, before the collectives' own timeout (trial_timeout too) could end it.
    assert rows[2]["wall_time"] - rows[1]["wall_time"] < TRIAL_TIMEOUT_S, rows
    assert other["status"] == "TERMINATED" and other["failure"] is None and other["epochs"] == 3, other
    assert other["last_metrics"]["world_size"] == 2
    log = (Path(out.sweep_dir) / hung["trial_id"] / "trial.log").read_text()
    assert f"no epoch finished within {TRIAL_TIMEOUT_S} s" in log
    assert_resources_returned()


BROKEN = "def model(config, input_shape, num_classes):\n    return config['hidden']  # the user's bug\n"
FIXED = (
    "from tuner.trial.loop.models import mlp\n\n\n"
    "def model(config, input_shape, num_classes):\n    return mlp(config, input_shape, num_classes)\n"
)


def test_a_sweep_whose_every_trial_failed_runs_them_again_once_fixed(tmp_path: Path) -> None:
    """Every trial of a sweep raises (the user's bug; two trials, the defaults otherwise): it
    completes with nothing left to run, and each way back a user would try (the end of the
    sweep, `resume`, `sweep` again) names `resume --retry-failed`. Once the code is fixed, that
    runs the failed trials again from scratch, the same configurations under the same names,
    their first runs kept under retried/."""
    module = f"user_model_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(BROKEN)
    raw = yaml.safe_load(DEBUG.read_text())
    raw.update(name="allfail", output=str(tmp_path / "runs"))
    raw["task"]["model"] = f"{module}:model"
    raw["search"]["num_samples"] = 2
    raw["schedule"]["max_epochs"] = 1
    sweep_file, sweep = tmp_path / "allfail.yaml", tmp_path / "runs" / "allfail"
    sweep_file.write_text(yaml.safe_dump(raw))
    again = f"python -m tuner resume {sweep} --retry-failed"

    first = cli("sweep", str(sweep_file), on_session=True)
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["counts"] == {"error": 2}, summary["counts"]
    assert first.returncode == 1 and again in first.stdout, first.stdout[-2000:]
    nothing = cli("resume", str(sweep))
    assert nothing.returncode == 0 and "nothing to resume" in nothing.stdout and again in nothing.stdout
    taken = cli("sweep", str(sweep_file))
    assert taken.returncode == 2 and "--retry-failed" in taken.stderr, taken.stderr

    (tmp_path / f"{module}.py").write_text(FIXED)
    fixed = cli("resume", str(sweep), "--retry-failed", on_session=True)
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    said = "0 trials finished, 0 to continue from checkpoints, 0 to start, 2 failed to run again"
    assert said in fixed.stdout, fixed.stdout[-2000:]
    after = json.loads((sweep / "summary.json").read_text())
    assert after["status"] == "completed" and after["counts"] == {"completed": 2}, after["counts"]
    before = {t["trial_id"]: t["config"] for t in summary["trials"]}
    assert {t["trial_id"]: t["config"] for t in after["trials"]} == before  # the same trials, run again
    for trial in before:
        assert [r["epoch"] for r in read_metrics(str(sweep / trial))] == [1]  # from scratch, once
        assert "KeyError" in (sweep / "retried" / trial / "traceback.txt").read_text()  # the first run, kept
    assert cli("resume", str(sweep), "--retry-failed").stdout.count("nothing to resume") == 1


def test_ddp_trials_back_off_together_or_end_at_once_with_the_failing_ranks_own_error(
    tmp_path: Path,
) -> None:
    """Two workers a trial, no trial_timeout. Width 14: rank 1 runs out of memory twice; every
    rank backs off with it (micro-batch 16 -> 8 -> 4) and the trial trains to its end. Width 10:
    rank 1 raises mid-epoch; the trial ends within seconds (not at a collective's timeout), and
    its failure is rank 1's own error, not rank 0's lost connection."""
    marker = tmp_path / "raised"
    params = {
        "fault_rank": 1,
        "raise_width": 10,
        "at_step": STEPS_PER_EPOCH + 3,
        "marker": str(marker),
        "oom_width": 14,
        "oom_steps": f"3,{STEPS_PER_EPOCH + 5}",
        "width": [14, 10],
    }
    cfg = _one_trial(
        tmp_path, params, task__model="tests.chaos:rank_faults", resources__workers_per_trial=2,
        schedule__max_epochs=2,
    )  # fmt: skip
    began = time.time()
    out = run_sweep(cfg)
    by_width = {t["config"]["width"]: t for t in out.summary["trials"]}
    backed_off, raised = by_width[14], by_width[10]
    assert backed_off["status"] == "TERMINATED" and backed_off["failure"] is None, backed_off
    assert backed_off["last_metrics"]["oom_backoffs"] == 2 and backed_off["last_metrics"]["micro_batch"] == 4
    log = (Path(out.sweep_dir) / backed_off["trial_id"] / "trial.log").read_text()
    assert "OOM at micro-batch 16: retrying the step at 8 (forward on rank 1, step 2;" in log, log
    # No trial_timeout: no collective timeout either (it was 600 s, which nothing asked for).
    assert "collectives wait for a rank without limit (no schedule.trial_timeout)" in log
    assert raised["status"] == "ERROR"
    assert raised["failure"] == "error: RuntimeError: rank 1 fails on purpose at step 16", raised
    trial_dir = Path(out.sweep_dir) / raised["trial_id"]
    took = (trial_dir / "error.txt").stat().st_mtime - float(marker.read_text())
    # At once: sooner than the sweep took to get there (its plan, the first trial's ranks and
    # their training with two OOM back-offs, the second's start, an epoch and three steps), on
    # the same machine in the same run. (A trial's start alone is no measure: its ranks are
    # copies of a warm process or the first trial's taken over, ~0.5 s.)
    before = float(marker.read_text()) - began
    print(f"\nrank 1 raised: the trial ended {took:.2f} s later ({before:.2f} s after the sweep began)")
    assert took < before, (took, before)
    assert "fails on purpose" in (trial_dir / "traceback.txt").read_text()
    assert_resources_returned()
