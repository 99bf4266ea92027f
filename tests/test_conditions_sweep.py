"""Conditional parameters and constraints in real sweeps (issue 14): what trials ran, what
TensorBoard's HParams table, summary.json and the report show, and a resumed sweep running
exactly the configurations an uninterrupted one runs (issue 17's guarantee)."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import tbread
from tests.conftest import SPACES, cli, debug_config
from tests.interrupt import heard
from tuner.config import load_sweep
from tuner.driver.sweep import resume_sweep, run_sweep
from tuner.search.algorithms import random_configs
from tuner.search.plan import key

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def _keeps_the_rules(config: dict[str, Any]) -> None:
    """digits_conditional.yaml's conditions and constraint, written out by hand."""
    assert ("momentum" in config) == (config["optimizer"] == "sgd"), config
    assert ("dropout" in config) == (config["depth"] in (2, 3)), config
    assert config["width"] * config["depth"] <= 768, config


def test_digits_conditional_runs_absent_parameters_blank_everywhere(tmp_path: Path) -> None:
    over = {"output": str(tmp_path), "search.num_samples": 8, "schedule.max_epochs": 1}
    outcome = run_sweep(load_sweep(SPACES / "digits_conditional.yaml", over))
    assert outcome.exit_code == 0, outcome.summary["counts"]
    trials = outcome.summary["trials"]
    assert len(trials) == 8
    for t in trials:
        _keeps_the_rules(t["config"])
        # The trial's own record of what it ran with, and its row of the HParams table.
        ran = json.loads((Path(outcome.sweep_dir) / t["trial_id"] / "params.json").read_text())
        _keeps_the_rules(ran)
        start = tbread.hparams(Path(outcome.sweep_dir) / t["trial_id"])["session_start"]
        assert set(start.hparams) == set(t["config"]), (start.hparams, t["config"])
    assert {"momentum" in t["config"] for t in trials} == {True, False}  # both sides ran

    report = tmp_path / "report"
    done = cli("report", outcome.sweep_dir, "--out", str(report), "--format", "md")
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("## Leaderboard\n", 1)[1].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in ln.strip("|").split(" | ")] for ln in section.splitlines() if ln.startswith("|")
    ]
    head, body = rows[0], rows[2:]
    by_id = {t["trial_id"]: t["config"] for t in trials}
    for row in body:
        cells = dict(zip(head, row, strict=True))
        config = by_id[cells["trial"]]
        assert (cells["momentum"] == "") == ("momentum" not in config), cells
        assert (cells["dropout"] == "") == ("dropout" not in config), cells

    # The best trial trained again alone: its absent parameters stay absent (not searched).
    command = re.search(r"```bash\n(python -m tuner sweep .*)\n```", done.stdout).group(1)
    cfg = load_sweep(shlex.split(command)[4], _overrides(shlex.split(command)[5:]))
    assert cfg.expected_trials() == 1
    again = {k: p.value for k, p in cfg.search.params.items()}  # type: ignore[union-attr]
    assert key(again) == key(outcome.summary["best"]["config"])


def _overrides(flags: list[str]) -> dict[str, Any]:
    """The reproduce command's flags as load_sweep overrides (the CLI's own reading of them)."""
    from tuner.config import yamlfile

    out: dict[str, Any] = {}
    it = iter(flags)
    for flag in it:
        value = next(it)
        if flag == "--set":
            k, v = value.split("=", 1)
            out[k] = yamlfile.load(v)
        elif flag == "--algorithm":
            out["search.algorithm"] = value
        elif flag == "--name":
            out["name"] = value
    return out


# ----------------------------------------------------------------------------- resume

PARAMS: dict[str, Any] = {
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "momentum": {"type": "uniform", "low": 0.5, "high": 0.95, "when": {"optimizer": "sgd"}},
    "depth": {"type": "randint", "low": 1, "high": 2},
    "dropout": {"type": "uniform", "low": 0.0, "high": 0.3, "when": {"depth": 2}},
    "width": {"type": "choice", "values": [8, 12, 16, 24]},
}
CONSTRAINTS = ["width * depth <= 24"]
TRIALS = 4


@pytest.fixture(autouse=True)
def _interrupts_heard(tmp_path: Path) -> Iterator[None]:
    """The in-process driver acknowledges each SIGINT a build fires (tests/interrupt.py)."""
    with heard(str(tmp_path)):
        yield


def _config(root: Path, algorithm: str, interrupt_at: int) -> Any:
    params = {
        **PARAMS,
        "chaos_dir": str(root / "chaos"),
        "interrupt_at": interrupt_at,
        "driver_pid": os.getpid(),
        "await_stop": True,  # (the build that interrupts waits until the driver heard: `heard`)
    }
    cfg = debug_config(
        root,
        task__model="tests.interrupt:after_builds",
        search__algorithm=algorithm,
        search__params=params,
        search__constraints=CONSTRAINTS,
        search__num_samples=TRIALS,
        schedule__max_epochs=2,
        resources__max_concurrent_trials=1,
    )
    return cfg


def _sweep(root: Path, algorithm: str, interrupt_at: int) -> Any:
    root.mkdir()
    (root / "chaos").mkdir()
    return run_sweep(_config(root, algorithm, interrupt_at))


def _configs(outcome: Any) -> list[str]:
    return _keys(t["config"] for t in outcome.summary["trials"])


def _keys(configs: Any) -> list[str]:
    out = []
    for c in configs:
        assert ("momentum" in c) == (c["optimizer"] == "sgd") and ("dropout" in c) == (c["depth"] == 2), c
        assert c["width"] * c["depth"] <= 24, c
        out.append(key({k: c[k] for k in PARAMS if k in c}))
    return sorted(out)


def test_a_resumed_conditional_sweep_runs_what_an_uninterrupted_one_runs(tmp_path: Path) -> None:
    """Random search: a list fixed by the seed (random_configs, with the conditions and the
    constraint: what an uninterrupted sweep runs, test_life checks), so the very same trials.
    (The model-based searchers' rebuilt plans over conditional trials: test_conditions,
    without a cluster.)"""
    cfg = _config(tmp_path / "planned", "random", interrupt_at=0)
    planned = random_configs(cfg.hyperparameters(), TRIALS, cfg.search.seed, cfg.search.constraints)
    stopped = _sweep(tmp_path / "at2", "random", interrupt_at=2)
    assert stopped.exit_code == 130, stopped.summary["counts"]
    resumed = resume_sweep(stopped.sweep_dir)
    assert resumed.summary["status"] == "completed", resumed.summary["counts"]
    assert _configs(resumed) == _keys(planned)
