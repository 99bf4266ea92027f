"""Third-party-style scripts as task.command trials (issue 44): what tuning nanoGPT and
Lightning code found. A nanoGPT-shaped script under torchrun (tests/nanogpt_like/) that dies
on the same AttributeError for every configuration; the failure a script's stderr shows, read
back as the user's own exception; fail-fast comparing what an error is.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli
from tuner.sweepdir import read_metrics

NANOGPT = ROOT / "tests" / "nanogpt_like" / "train.py"
LIGHTNING = ROOT / "tests" / "lightning_like.py"
FLASH = "AttributeError: 'GPTConfig' object has no attribute 'flash'"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_an_unpatched_nanogpt_under_torchrun_stops_after_fail_fast_trials_with_its_own_error(
    tmp_path: Path,
) -> None:
    """Every trial dies on the same AttributeError on both ranks; torchrun's banner of pids
    and timestamps used to be the failure everywhere, so fail-fast never fired. At the
    defaults (random search, fail_fast 3) the sweep stops after 3 trials, with the script's
    exception in the CLI's lines, summary.json, the report and traceback.txt."""
    (tmp_path / "sweep.yaml").write_text(
        textwrap.dedent(
            f"""
            name: nano
            task:
              command: python {NANOGPT} --learning_rate={{lr}} --out_dir={{trial_dir}}
              launcher: torchrun
            metric: val_loss
            direction: min
            search:
              num_samples: 6
              params:
                lr: {{type: loguniform, low: 1.0e-3, high: 1.0e-1}}
            schedule:
              max_epochs: 2
            resources:
              workers_per_trial: 2
              cpus_per_worker: 1
            output: runs
            """
        )
    )
    done = cli("sweep", "sweep.yaml", cwd=tmp_path, on_session=True)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    failed = [ln for ln in done.stdout.splitlines() if " failed: " in ln and ln.startswith("[tuner] trial ")]
    assert len(failed) >= 3 and all(f"failed: {FLASH} (full traceback: " in ln for ln in failed), done.stdout
    assert f"[tuner] failure.fail_fast: the first 3 trials all failed with {FLASH};" in done.stdout
    assert "warning: trials wrote into" not in done.stdout  # (its outputs go to {trial_dir})
    sweep = tmp_path / "runs" / "nano"
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == FLASH, summary
    assert 3 <= len(summary["trials"]) < 6, summary["counts"]
    assert {t["failure"] for t in summary["trials"]} == {f"error: {FLASH}"}
    for t in summary["trials"]:
        text = (sweep / t["trial_id"] / "traceback.txt").read_text()
        # The script's own traceback: its file and line, not tuner's stack or torchrun's.
        assert f'File "{NANOGPT}", line ' in text and text.rstrip().endswith(FLASH), text
        assert "tuner/trial" not in text and "ChildFailedError" not in text, text
    report = cli("report", str(sweep), "--format", "md")
    assert report.returncode == 0, report.stderr
    assert f"| error | 0 | {FLASH} |" in report.stdout, report.stdout


LIT_SWEEP = f"""
name: lit
task:
  command: python {LIGHTNING} --curve {{curve}} --lr {{lr}} --epochs {{max_epochs}}
  checkpoints: true
metric: val_loss
direction: min
search:
  num_samples: 3
  params:
    curve: {{type: grid, values: [peaks, stops, early]}}
    lr: {{type: loguniform, low: 1.0e-3, high: 1.0e-1}}
schedule:
  max_epochs: 6
output: runs
"""


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_lightning_style_script_at_the_defaults(tmp_path: Path) -> None:
    """A Lightning-style script, 2 trials at once, random search with ASHA: its sanity check
    reported as epoch 0 is recorded (it failed the trial); its own EarlyStopping, an exit 0
    before max_epochs, is its own ending, not the scheduler's."""
    (tmp_path / "sweep.yaml").write_text(LIT_SWEEP)
    done = cli("sweep", "sweep.yaml", cwd=tmp_path, on_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sweep = tmp_path / "runs" / "lit"
    # Its lightning_logs/version_N, relative to the directory all trials run in: said once.
    warned = [ln for ln in done.stdout.splitlines() if ln.startswith("[tuner] warning: trials wrote into")]
    assert len(warned) == 1, done.stdout
    assert f"into {tmp_path}, the directory every trial runs in: lightning_logs/version_0" in warned[0]
    assert "{trial_dir} in task.command or $TUNER_TRIAL_DIR (docs/how-to/own-script.md#outputs)" in warned[0]
    summary = json.loads((sweep / "summary.json").read_text())
    by = {t["config"]["curve"]: t for t in summary["trials"]}
    assert sorted(by) == ["early", "peaks", "stops"], summary["trials"]
    for curve, epochs in (("early", 2), ("stops", 3), ("peaks", 6)):
        t = by[curve]
        itself = (sweep / t["trial_id"] / "stopped_itself.txt").exists()
        assert t["status"] == "TERMINATED" and t["epochs"] == epochs and itself == (epochs < 6), t
        assert t["stopped_itself"] is itself and t["stopped_early"] is False, t
        rows = read_metrics(str(sweep / t["trial_id"]))
        first = 1 if curve == "early" else 0  # (the others report their sanity check, as epoch 0)
        assert [r["epoch"] for r in rows] == list(range(first, epochs + 1)), rows
        assert rows[0]["val_loss"] == [2.0, 1.0][first], rows
    assert summary["counts"] == {"completed": 1, "stopped itself": 2}, summary["counts"]
    # Its configuration is what the script was given: no defaults of tuner's loop (issue 44, 7).
    for t in summary["trials"]:
        assert set(json.loads((sweep / t["trial_id"] / "tuner_trial.json").read_text())["config"]) == {
            "curve",
            "lr",
        }
    assert by["peaks"]["best_epoch"] == 2 and summary["best"]["trial_id"] == by["peaks"]["trial_id"]
    # keep_checkpoints 2 keeps the newest two and the best epoch's, which best.json names and
    # best/ holds a copy of (issue 44, item 6).
    peaks = sweep / by["peaks"]["trial_id"]
    assert sorted(p.name for p in (peaks / "checkpoints").iterdir()) == [
        "epoch_000002", "epoch_000005", "epoch_000006",
    ]  # fmt: skip
    named = json.loads((peaks / "best.json").read_text())
    assert named == {"epoch": 2, "metric": "val_loss", "value": 0.3, "checkpoint": "checkpoints/epoch_000002"}
    copied = json.loads((sweep / "best" / "checkpoint" / "state.json").read_text())
    assert copied == {"epoch": 2, "val_loss": 0.3}, copied
    exported = json.loads((sweep / "best" / "config.json").read_text())
    assert exported["epoch"] == 2 and exported["config"] == by["peaks"]["config"], exported
    assert exported["from"] == str(peaks / "checkpoints" / "epoch_000002")
    report = cli("report", str(sweep), "--format", "md")
    assert "0 stopped early by the scheduler; 2 stopped by their own code before max_epochs" in report.stdout


# ----------------------------------------------------------------------------- no Ray


def _cause(lines: list[str]) -> tuple[str, str, int | None] | None:
    from tuner.trial.script.cause import Tracebacks

    seen = Tracebacks()
    for line in lines:
        seen.feed(line)
    found = seen.cause()
    return None if found is None else (found.line, found.text, found.rank)


TORCHRUN_STDERR = f"""\
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "/src/train.py", line 45, in <module>
[rank0]:   File "/src/train.py", line 45, in <module>
[rank1]:     use_flash = gptconf.flash
[rank0]:     use_flash = gptconf.flash
[rank1]: AttributeError: 'GPTConfig' object has no attribute 'flash'
[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:34984
E1129 01:41:29.157000 14192 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) \
local_rank: 1 (pid: 14207)
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:{" "}
============================================================
/src/train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_01:41:29
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 14207)
  error_file: <N/A>
============================================================"""


def test_the_cause_of_a_torchrun_failure_is_the_first_failing_rank_s_exception() -> None:
    """Two ranks' tracebacks interleaved, the second rank's a consequence of the first's, then
    torchrun's own: the rank torchrun names as the root cause, with its whole traceback."""
    line, text, rank = _cause(TORCHRUN_STDERR.splitlines())  # type: ignore[misc]
    assert (line, rank) == ("AttributeError: 'GPTConfig' object has no attribute 'flash'", 1)
    assert text.splitlines() == [
        "Traceback (most recent call last):",
        '  File "/src/train.py", line 45, in <module>',
        "    use_flash = gptconf.flash",
        "AttributeError: 'GPTConfig' object has no attribute 'flash'",
    ]
    # Without torchrun's banner (it was cut off): the last traceback of a worker's.
    assert _cause(TORCHRUN_STDERR.splitlines()[:8])[0].startswith("RuntimeError: [../gloo")  # type: ignore[index]


def test_the_cause_of_a_plain_script_s_failure() -> None:
    chained = [
        "loading data",
        "Traceback (most recent call last):",
        '  File "t.py", line 3, in <module>',
        "KeyError: 'lr'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "t.py", line 5, in <module>',
        "ValueError: no learning rate",
        "  and a second line of its message",
    ]
    line, text, rank = _cause(chained)  # type: ignore[misc]
    assert (line, rank) == ("ValueError: no learning rate", None)
    assert text.startswith("Traceback (most recent call last):") and "KeyError: 'lr'" in text
    assert text.endswith("  and a second line of its message")
    # A SyntaxError in the script itself has no "Traceback" header; an exit without one, no cause.
    syntax = ['  File "t.py", line 3', "    x = (", "        ^", "SyntaxError: '(' was never closed"]
    assert _cause(syntax)[0] == "SyntaxError: '(' was never closed"  # type: ignore[index]
    assert _cause(["usage: t.py [-h]", "t.py: error: unrecognized arguments: --x"]) is None


def test_a_loop_s_configuration_holds_what_ctx_applies_and_what_the_file_sets() -> None:
    """task.train's config: the settings ctx applies (amp, seed, ...), batch_size and lr, and
    any the sweep file sets; never the defaults only tuner's loop reads (optimizer, momentum),
    which tuner_trial.json and best/config.json listed. Read back from sweep.yaml alike."""
    from tests.test_own_loop import own
    from tuner.config import parse_sweep, to_yaml
    from tuner.config.yamlfile import load as load_yaml

    raw = own()
    raw["training"] = {"weight_decay": 0.01}
    cfg = parse_sweep(raw)
    keys = set(cfg.hyperparameters())
    assert {"lr", "batch_size", "amp", "seed", "weight_decay"} <= keys, keys
    assert not keys & {"optimizer", "momentum", "lr_schedule", "eval_batch_size"}, keys
    assert "min_micro_batch" in keys  # ctx.step backs off down to it
    again = parse_sweep(load_yaml(to_yaml(cfg)))
    assert set(again.hyperparameters()) == keys
    script = parse_sweep({**raw, "training": {}, "task": {"command": "python t.py --lr {lr}"}})
    assert set(script.hyperparameters()) == {"lr"}


def test_what_trials_wrote_into_the_shared_directory(tmp_path: Path) -> None:
    from tuner.driver.workdir import output_entry, snapshot, written

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("1,2\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_text("a")
    (tmp_path / "runs" / "sweep").mkdir(parents=True)
    skip = output_entry(str(tmp_path), str(tmp_path / "runs" / "sweep"))
    assert skip == "runs" and output_entry(str(tmp_path), "/elsewhere/sweep") is None
    before = snapshot(str(tmp_path), skip)
    (tmp_path / "data" / "train.csv").read_text()  # read: not written
    (tmp_path / "out" / "ckpt.pt").write_text("bb")  # the same relative path, written again
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    (tmp_path / "runs" / "sweep" / "t1").mkdir()  # the sweep's own
    (tmp_path / ".cache").mkdir()
    (tmp_path / "__pycache__").mkdir()
    after = snapshot(str(tmp_path), skip)
    assert written(before, after) == ["lightning_logs/version_0", "out/ckpt.pt"]


def test_fail_fast_compares_what_an_error_is_not_its_pids_ports_and_times(tmp_path: Path) -> None:
    from tests.test_fail_fast import _trial
    from tuner.driver.failfast import FailFast, same_error

    one = same_error("RuntimeError: closed by peer [127.0.0.1]:34984 (pid: 4976) at 2026-11-29_01:41:29")
    two = same_error("RuntimeError: closed by peer [127.0.0.1]:41002 (pid: 5120) at 2026-11-29_01:42:03")
    assert one == two and "34984" not in one and "4976" not in one
    assert same_error("OSError: /tmp/tmpab12cd/data.bin is damaged") == "OSError: <tmp>/data.bin is damaged"
    assert same_error("ValueError: lr 0.5 too large") != same_error("ValueError: lr 0.25 too large")
    watch = FailFast(3)
    for i in range(3):
        trial = _trial(tmp_path, f"t{i}", f"RuntimeError: object at 0x7f3a5c{i}12e90 on port {30000 + i}")
        watch.on_trial_error(0, [], trial)
    assert watch.stop_all() and watch.error == "RuntimeError: object at 0x7f3a5c012e90 on port 30000"
