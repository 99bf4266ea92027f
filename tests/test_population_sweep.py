"""Population-based training sweeps on Ray (schedule.scheduler: pbt), end to end.

- An 8-member population killed with -9 three times (moments read from its own files: while
  members wait at the first perturbation, once it is carried out and members train on, while
  the last epoch runs) and resumed each time ends exactly as the one that ran through: the
  same lineage, configuration schedules, values epoch by epoch and best (tuner's loop on a
  deterministic task).
- Every trial mode hands its state on: tuner's loop with hooks (the new lr is the one the
  restored optimizer runs with), `task.train` with 2 workers a trial in an s3:// bucket
  (`ctx.restore()` on every rank gives the donor's state), `task.command` (the script is
  restarted on the donor's checkpoint directory, with its new configuration), and a member
  that fails leaves the population to go on without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, cli, kill_9_resuming_when, kill_9_when, resumed_to_the_end, run_cli
from tuner.sweepdir import read_lineage, read_metrics

POPULATION = 8


def _debug_population(output: Path, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "task": {
            "model": "mlp",
            "data": "synthetic",
            "data_args": {"samples": 256, "features": 8, "classes": 3},
        },
        "metric": "val_acc",
        "search": {
            "algorithm": "random",
            "num_samples": POPULATION,
            "seed": 3,
            "params": {
                "lr": {"type": "loguniform", "low": 1e-3, "high": 0.3},
                "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
                "width": {"type": "randint", "low": 8, "high": 32},
                "depth": 1,
            },
        },
        "schedule": {"scheduler": "pbt", "max_epochs": 3, "pbt": {"interval": 1}},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
        "training": {"batch_size": 32, "amp": "off"},
        "output": str(output),
    }


def _population(sweep: Path) -> dict[int, dict[str, Any]]:
    """member -> its lineage (donors as members), values epoch by epoch, and its name."""
    names = {}
    found = {}
    for d in sorted(p for p in sweep.iterdir() if (p / "lineage.json").exists()):
        lineage = read_lineage(str(d))
        assert lineage is not None
        names[d.name] = lineage["member"]
        found[lineage["member"]] = (d, lineage)
    out = {}
    for member, (d, lineage) in found.items():
        segments = [
            (
                s["epoch"],
                names.get(s.get("donor")),
                s["config"]["lr"],
                s["config"]["width"],
                s["config"]["optimizer"],
            )
            for s in lineage["segments"]
        ]
        values = [(r["epoch"], r["val_acc"], r["lr"]) for r in read_metrics(str(d))]
        out[member] = {"segments": segments, "values": values, "name": d.name}
    return out


def _rows_at(sweep: Path, epoch: int) -> int:
    return sum(
        1 for d in sweep.iterdir() if d.is_dir() and any(r["epoch"] == epoch for r in read_metrics(str(d)))
    )


def _lineages(sweep: Path) -> list[dict[str, Any]]:
    return [lin for d in sweep.iterdir() if d.is_dir() and (lin := read_lineage(str(d))) is not None]


def test_a_population_killed_three_times_ends_as_the_one_that_ran_through(
    ray_session: Any, tmp_path: Path
) -> None:
    through = tmp_path / "through"
    (tmp_path / "a.yaml").write_text(json.dumps(_debug_population(through, "pop")))
    ran = cli("sweep", str(tmp_path / "a.yaml"), on_session=True)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    expected = _population(through / "pop")
    assert len(expected) == POPULATION and any(len(m["segments"]) > 1 for m in expected.values())

    # 1: members wait at the first perturbation (epoch 1), before it is carried out.
    raw = _debug_population(tmp_path / "killed", "pop")
    sweep = kill_9_when(raw, tmp_path, lambda s: s.exists() and _rows_at(s, 1) >= 3 and not _lineages(s))
    # 2: it is carried out (every member has a lineage), and members train on to epoch 2.
    kill_9_resuming_when(sweep, tmp_path, lambda s: len(_lineages(s)) == POPULATION and _rows_at(s, 2) >= 1)
    # 3: the second is carried out too, and the last epoch runs.
    kill_9_resuming_when(sweep, tmp_path, lambda s: 1 <= _rows_at(s, 3) < POPULATION)
    summary = resumed_to_the_end(sweep, POPULATION)

    got = _population(sweep)
    for member, want in expected.items():
        assert got[member]["segments"] == want["segments"], member
        assert got[member]["values"] == want["values"], member  # each epoch once, the same value
    first = json.loads((through / "pop" / "summary.json").read_text())
    assert summary["best"]["metrics"]["val_acc"] == first["best"]["metrics"]["val_acc"]

    def by_member(schedule: list[dict[str, Any]], population: dict[int, dict[str, Any]]) -> list[Any]:
        member = {m["name"]: i for i, m in population.items()}
        return [(member[s["trial"]], s["epochs"], s["config"]) for s in schedule]

    assert by_member(summary["best"]["schedule"], got) == by_member(first["best"]["schedule"], expected)
    trials = {t["trial_id"]: t for t in summary["trials"]}
    for m in got.values():  # summary.json's schedule: the lineage as epoch ranges
        schedule = trials[m["name"]]["schedule"]
        assert [s["epochs"][0] - 1 for s in schedule] == [seg[0] for seg in m["segments"]]
        assert trials[m["name"]]["config"]["lr"] == m["segments"][-1][2]  # its config: the last range's


def _own_task(output: str, **over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "own",
        "task": {"train": "tests.population_tasks:train"},
        "metric": "val_loss",
        "search": {
            "num_samples": 2,
            "seed": 1,
            "params": {
                "lr": {"type": "loguniform", "low": 0.01, "high": 1.0},
                "tag": {"type": "uniform", "low": 0.1, "high": 1.0},
            },
        },
        "schedule": {"scheduler": "pbt", "max_epochs": 2, "pbt": {"interval": 1, "perturb": ["lr"]}},
        "resources": {"cpus_per_worker": 1, "gpus_per_worker": 0},
        "training": {"amp": "off"},
        "output": output,
    }
    for dotted, value in over.items():
        *head, last = dotted.split(".")
        node = raw
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return raw


def _check_handed_on(rows: dict[str, list[dict[str, Any]]], lineages: dict[str, dict[str, Any]]) -> None:
    """Each recipient's first epoch after the perturbation ran from its donor's state (its
    "born" tag is the donor's) with its new configuration's lr; the others kept their own."""
    recipients = 0
    for name, lineage in lineages.items():
        for seg in lineage["segments"][1:]:
            recipients += 1
            epoch, donor = int(seg["epoch"]), seg["donor"]
            after = next(r for r in rows[name] if r["epoch"] == epoch + 1)
            before = next(r for r in rows[donor] if r["epoch"] == epoch)
            assert after["born"] == pytest.approx(before["born"]), (name, after, before)
            assert after["lr_used"] == pytest.approx(seg["config"]["lr"])
            assert seg["config"]["lr"] != lineage["segments"][0]["config"]["lr"]
    assert recipients >= 1, lineages


def test_your_loop_on_2_workers_in_a_bucket_hands_every_rank_the_donors_state(
    tmp_path: Path, s3: Any
) -> None:
    bucket = s3.make_bucket("population")
    raw = _own_task(f"s3://{bucket}/runs", **{"resources.workers_per_trial": 2})
    (tmp_path / "own.yaml").write_text(json.dumps(raw))
    env = {**s3.env(), "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    out = run_cli("sweep", str(tmp_path / "own.yaml"), env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    local = run_cli("report", f"s3://{bucket}/runs/own", "--output", str(tmp_path / "report"), env=env)
    assert local.returncode == 0, local.stderr[-2000:]
    mirror = next((tmp_path / "cache").rglob("own/summary.json")).parent
    lineages = {d.name: lin for d in mirror.iterdir() if d.is_dir() and (lin := read_lineage(str(d)))}
    rows = {d.name: read_metrics(str(d)) for d in mirror.iterdir() if d.is_dir()}
    _check_handed_on(rows, lineages)
    assert all(
        r["born"] in [row["born"] for rr in rows.values() for row in rr[:1]]
        for rr in rows.values()
        for r in rr
    )
    summary = json.loads((mirror / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["best"]["schedule"]
    assert (tmp_path / "report" / "report.md").exists()


def test_a_script_restarts_on_its_donors_checkpoint_and_a_failed_member_leaves_the_rest_to_go_on(
    ray_session: Any, tmp_path: Path
) -> None:
    raw = _own_task(str(tmp_path), **{"search.num_samples": 3, "search.start_with": [{"tag": 0.05}]})
    raw["task"] = {
        "command": "python tests/population_script.py",
        "checkpoints": True,
        "env_params": ["lr", "tag"],
    }
    raw["metric"], raw["direction"] = "score", "max"
    del raw["training"]  # (the script's own)
    raw["search"]["params"]["tag"]["low"] = 0.0
    (tmp_path / "script.yaml").write_text(json.dumps(raw))
    before = set(ray_session.util.placement_group_table())
    out = cli("sweep", str(tmp_path / "script.yaml"), cwd=ROOT, on_session=True)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]  # (a trial failed)
    # Every placement group the sweep asked for was made before it was given back: Ray keeps
    # the CPUs of one removed while it is being made, for good (ray-project/ray#64693), and
    # Tune removes one it asked for whenever a paused member's actor is handed to the next.
    made = {k: pg for k, pg in ray_session.util.placement_group_table().items() if k not in before}
    unmade = [k for k, pg in made.items() if not pg["stats"]["end_to_end_creation_latency_ms"]]
    assert made and not unmade, f"{len(unmade)} of the sweep's {len(made)} removed before they were made"
    summary = json.loads((tmp_path / "own" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["counts"] == {"completed": 2, "error": 1}
    # Each member's origin, recorded as it was handed out (the failed one was start_with's).
    origins = {t["failure"] is not None: t.get("origin") for t in summary["trials"]}
    assert origins == {True: "start_with", False: "searcher"}, summary["trials"]
    sweep = tmp_path / "own"
    lineages = {d.name: lin for d in sweep.iterdir() if d.is_dir() and (lin := read_lineage(str(d)))}
    rows = {d.name: read_metrics(str(d)) for d in sweep.iterdir() if d.is_dir()}
    _check_handed_on(rows, lineages)


def test_tuners_loop_with_hooks_under_pb2_runs_the_new_lr_and_exports_the_schedule(
    ray_session: Any, tmp_path: Path
) -> None:
    raw = _debug_population(tmp_path, "hooks")
    raw["task"]["metrics"] = "tests.mode_tasks:error"
    raw["search"]["num_samples"] = 3
    raw["schedule"]["scheduler"] = "pb2"  # (its second perturbation has a history to model)
    raw["metric"], raw["direction"] = "val_err", "min"
    (tmp_path / "hooks.yaml").write_text(json.dumps(raw))
    out = cli("sweep", str(tmp_path / "hooks.yaml"), on_session=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sweep = tmp_path / "hooks"
    from tests import tbread

    recipients = 0
    for d in (d for d in sweep.iterdir() if d.is_dir() and read_lineage(str(d))):
        segments = read_lineage(str(d))["segments"]  # type: ignore[index]
        rows = {r["epoch"]: r for r in read_metrics(str(d))}
        shown = dict(tbread.steps(d)["config/lr"])  # TensorBoard: the perturbed lr over the epochs
        for i, seg in enumerate(segments):
            end = segments[i + 1]["epoch"] if i + 1 < len(segments) else 3
            for epoch in range(seg["epoch"] + 1, end + 1):
                assert rows[epoch]["lr"] == pytest.approx(seg["config"]["lr"])  # the optimizer runs it
                assert shown[epoch] == pytest.approx(seg["config"]["lr"])
        recipients += len(segments) - 1
    assert recipients == 2  # one at each of its two perturbations
    exported = json.loads((sweep / "best" / "config.json").read_text())
    assert exported["schedule"] and exported["schedule"][-1]["epochs"][1] == exported["epoch"]


def test_a_time_budget_spent_while_members_wait_ends_them_as_stopped_for_it(
    ray_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget's clock counts the results the sweep has seen (not seconds: the test holds
    on any machine): spent at the second, while the first member to report waits, paused, for
    the others at the first perturbation. The sweep ends: the waiting member and those running
    are stopped for the budget (not "stopped early": a population stops none early), the last
    member never starts, and summary.json says why it ended (it said "completed")."""
    from tuner.driver import limits
    from tuner.driver.sweep import run_sweep

    class Counted(limits.SweepLimits):
        seen = 0

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            Counted.seen += 1
            return super().__call__(trial_id, result)

    def wanted(cls: Any, metric: str, direction: str, budget: Any, stop_at: Any) -> Any:
        return Counted(metric, direction, budget, stop_at, clock=lambda: Counted.seen)

    monkeypatch.setattr(limits.SweepLimits, "wanted", classmethod(wanted))
    raw = _debug_population(tmp_path, "budget")
    raw["search"]["num_samples"] = 4
    raw["schedule"].update(time_budget=1.5, max_epochs=2)  # (in results: spent at the second)
    raw["resources"]["max_concurrent_trials"] = 2
    from tuner.config import parse_sweep

    out = run_sweep(parse_sweep(raw))
    summary = out.summary
    trials = summary["trials"]
    # The first to report waited; the second's report spent the budget; a third may have
    # started in the waiting member's place before it; the fourth never starts.
    assert 2 <= len(trials) <= 3 and all(t["epochs"] == 1 for t in trials), trials
    assert summary["status"] == "budget" and out.exit_code == 0, summary
    assert summary["counts"] == {"stopped": len(trials)} and not any(t["stopped_early"] for t in trials)
    kept = sorted(p.name for p in Path(out.sweep_dir).iterdir() if p.is_dir())
    assert kept == sorted(["best", "sweep", *(t["trial_id"] for t in trials)])
