"""Population-based training without Ray: the decisions (tuner.search.population), what
validate refuses (tuner.config.population), the copy of one trial's checkpoint into another
(tuner.trial.frame.clone), the loop's hyperparameters after a restore, and the schedule of
the best weights (tuner.results). The sweeps themselves: tests/test_population_sweep.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import DEBUG, cli
from tuner.config import ConfigError, load_sweep
from tuner.search.population import Member, Rule, decide, explore
from tuner.space.params import Choice, Fixed, LogRandInt, LogUniform, RandInt, Uniform

LR = LogUniform(type="loguniform", low=1e-4, high=1.0)
PARAMS: dict[str, Any] = {
    "lr": LR,
    "drop": Uniform(type="uniform", low=0.0, high=0.5),
    "width": RandInt(type="randint", low=1, high=101),
    "heads": LogRandInt(type="lograndint", low=1, high=64),
    "opt": Choice(type="choice", values=["sgd", "adam"]),
    "momentum": Uniform(type="uniform", low=0.5, high=0.99, when={"opt": "sgd"}),
    "depth": Fixed(value=2),
}
CONFIG = {"lr": 0.01, "drop": 0.25, "width": 50, "heads": 8, "opt": "sgd", "momentum": 0.9, "depth": 2}


def _rule(**over: Any) -> Rule:
    base: dict[str, Any] = dict(kind="pbt", params=PARAMS, perturb=tuple(k for k in PARAMS if k != "depth"))
    return Rule(**{**base, "resample": 0.0, **over})


def _population(values: list[float], config: dict[str, Any] = CONFIG) -> list[Member]:
    return [Member(i, f"t{i}", [{"epoch": 0, "config": dict(config)}], {2: v}) for i, v in enumerate(values)]


# ----------------------------------------------------------------------------- the decisions


def test_the_worst_quantile_continues_from_the_best_the_same_way_each_time() -> None:
    members = _population([0.1, 0.9, 0.5, 0.8, 0.2, 0.7, 0.3, 0.6])
    rule = _rule(quantile=0.25, seed=7)
    first = decide(rule, 1, 2, members)
    assert [d.member for d in first] == [0, 4]  # the two worst, in member order
    assert {d.donor for d in first} <= {1, 3}  # from the two best
    assert decide(rule, 1, 2, members) == first  # a function of the data and the seed alone
    assert (
        decide(_rule(quantile=0.25, seed=8), 1, 2, members) != first or decide(rule, 2, 2, members) != first
    )
    low = decide(_rule(direction="min", seed=7), 1, 2, members)
    assert [d.member for d in low] == [1, 3]  # with min, the largest are the worst


def test_members_that_ended_or_have_no_value_take_no_part_and_a_quantile_rounds_up_to_half() -> None:
    members = _population([0.1, 0.9, 0.5])
    members[0].ended = True
    assert decide(_rule(quantile=0.5), 1, 2, members)[0].member == 2  # 1 of the 2 live ones
    assert decide(_rule(quantile=0.5), 1, 3, members) == []  # no values at epoch 3
    two = _population([0.1, 0.9])
    assert [(d.member, d.donor) for d in decide(_rule(quantile=0.01), 1, 2, two)] == [(0, 1)]


def test_pbt_moves_each_kind_as_its_range_says() -> None:
    rng = np.random.default_rng(0)
    rule = _rule(factor=1.25, shift=0.1)
    seen: dict[str, set[Any]] = {k: set() for k in PARAMS}
    for _ in range(200):
        new = explore(rule, CONFIG, rng)
        for k, v in new.items():
            seen[k].add(round(v, 9) if isinstance(v, float) else v)
    assert seen["lr"] == {round(0.01 * 1.25, 9), round(0.01 / 1.25, 9)}  # a log range multiplies
    assert seen["drop"] == {0.2, 0.3}  # a linear one shifts by 0.1 of its width (0.05)
    assert seen["width"] == {40, 60}  # integers by 0.1 of theirs, rounded
    assert seen["heads"] == {6, 10}  # round(8 / 1.25), round(8 * 1.25)
    assert seen["opt"] == {"sgd"} and seen["depth"] == {2}  # choices resample only; fixed stays
    at_top = explore(rule, {**CONFIG, "lr": 1.0, "width": 101}, np.random.default_rng(1))
    assert at_top["lr"] <= 1.0 and at_top["width"] <= 101  # clipped to the range


def test_resampling_draws_afresh_and_conditions_follow_their_parents() -> None:
    rng = np.random.default_rng(0)
    rule = _rule(resample=1.0)
    for _ in range(100):
        new = explore(rule, CONFIG, rng)
        assert ("momentum" in new) == (new["opt"] == "sgd"), new  # dropped or drawn with its parent
        assert LR.low <= new["lr"] <= LR.high and 1 <= new["heads"] <= 64
        assert isinstance(new["width"], int) and isinstance(new["heads"], int)
    opts = {explore(rule, CONFIG, rng)["opt"] for _ in range(50)}
    assert opts == {"sgd", "adam"}


def test_constraints_hold_after_every_perturbation() -> None:
    rule = _rule(constraints=("width % 2 == 0", "width <= 60"))
    rng = np.random.default_rng(3)
    for _ in range(100):
        new = explore(rule, CONFIG, rng)
        assert new["width"] % 2 == 0 and new["width"] <= 60
    stuck = _rule(perturb=("width",), constraints=("width == 50",))
    assert explore(stuck, CONFIG, rng) == CONFIG  # no move keeps it: the donor's own


def test_pb2_picks_numbers_from_the_populations_history_within_bounds() -> None:
    params = {"lr": LR, "opt": PARAMS["opt"], "momentum": PARAMS["momentum"]}
    rule = Rule(
        kind="pb2", params=params, perturb=("lr", "momentum", "opt"), interval=1, direction="max", seed=1
    )
    # Each member improves by a hump over log lr (best near 1e-2), epoch after epoch.
    lrs = [1e-4, 3e-4, 1e-3, 3e-3, 2e-2, 5e-2, 0.3, 1.0]
    members = []
    for i, lr in enumerate(lrs):
        gain = math.exp(-((math.log10(lr) + 2) ** 2))
        config = {"lr": lr, "opt": "sgd", "momentum": 0.9}
        members.append(Member(i, f"t{i}", [{"epoch": 0, "config": config}], {e: gain * e for e in (1, 2, 3)}))
    decisions = decide(rule, 3, 3, members)
    assert [d.member for d in decisions] == [0, 7] and all(d.donor in (3, 4) for d in decisions)
    chosen = [d.config["lr"] for d in decisions]
    assert all(3e-3 <= lr <= 3e-2 for lr in chosen), chosen  # the model found the hump near 1e-2
    assert chosen[0] != chosen[1]  # the second recipient is sent elsewhere
    assert decide(rule, 3, 3, members) == decisions  # deterministic
    assert all(("momentum" in d.config) == (d.config["opt"] == "sgd") for d in decisions)


# ----------------------------------------------------------------------------- validate


def _cfg(**over: Any) -> Any:
    return load_sweep(DEBUG, {"schedule.scheduler": "pbt", **over})


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"search.algorithm": "grid"}, "schedule.scheduler", "grid does not run with pbt"),
        ({"search.algorithm": "optuna"}, "schedule.scheduler", "optuna does not run with pbt"),
        ({"search.num_samples": 1}, "search.num_samples", "at least 2 trials"),
        ({"schedule.pbt.interval": 3}, "schedule.pbt.interval", "leaves no perturbation"),
        ({"schedule.max_epochs": 1}, "schedule.max_epochs", "1: pbt perturbs trials between epochs"),
        ({"schedule.pbt.perturb": ["width"]}, "search.params.width", "sizes the model"),
        ({"schedule.pbt.perturb": ["optimizer"]}, "search.params.optimizer", "another optimizer's"),
        ({"schedule.pbt.perturb": ["depth"]}, "search.params.depth", "is fixed"),
        ({"schedule.pbt.perturb": ["nope"]}, "schedule.pbt.perturb", "'nope' is not in search.params"),
        ({"search.params.lr": 0.01}, "schedule.pbt.perturb", "nothing to perturb"),
        (
            {"schedule.scheduler": "pb2", "schedule.pbt.perturb": []},
            "schedule.pbt.perturb",
            "nothing to perturb",
        ),
        (
            {"metric": ["val_acc", "num_params"], "direction": ["max", "min"]},
            "schedule.scheduler",
            "one metric",
        ),
    ],
)
def test_what_cannot_work_is_refused_naming_the_field(over: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(**over)
    assert err.value.path == field and words in str(err.value), str(err.value)


def test_a_refusal_is_one_line_exit_2_and_the_default_perturbs_what_the_loop_can_change() -> None:
    out = cli(
        "validate", str(DEBUG), "--set", "schedule.scheduler=pbt", "--set", "schedule.pbt.perturb=[width]"
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    cfg = _cfg()
    assert cfg.schedule.pbt.perturb == ["lr"]  # (width sizes the mlp, optimizer's state)
    assert cfg.scheduler.clones and cfg.scheduler.pauses


def test_pb2_with_choices_only_and_a_script_in_object_storage_are_refused() -> None:
    from tuner.config.load import parse_sweep

    raw = {
        "name": "own",
        "task": {"train": "tests.population_tasks:train"},
        "metric": "val_loss",
        "search": {"params": {"opt": {"type": "choice", "values": ["a", "b"]}, "tag": 0.5}},
        "schedule": {"scheduler": "pb2", "max_epochs": 4},
    }
    with pytest.raises(ConfigError, match="pb2 models numeric ranges"):
        parse_sweep(raw)
    raw["schedule"]["scheduler"] = "pbt"
    assert parse_sweep(raw).schedule.pbt.perturb == ["opt"]  # your loop: any searched parameter
    script = Path(__file__).parent.parent / "search_spaces" / "script.yaml"
    with pytest.raises(ConfigError) as err:
        load_sweep(
            script, {"schedule.scheduler": "pbt", "search.algorithm": "random", "output": "s3://bucket/runs"}
        )
    assert err.value.path == "output" and "stay on the node" in str(err.value)


def test_extend_refuses_a_population(tmp_path: Path) -> None:
    from tuner.config import to_yaml

    sweep = tmp_path / "pop"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text(to_yaml(_cfg()))
    out = cli("extend", str(sweep), "--num-samples", "2")
    assert out.returncode == 2 and "trained side by side from the start" in out.stderr, out.stderr


# ----------------------------------------------------------------------------- copy_checkpoint


def test_copy_checkpoint_replaces_the_epochs_checkpoint_in_either_layout(tmp_path: Path) -> None:
    from tuner.sweepdir import checkpoint_name, read_best_checkpoint
    from tuner.trial.frame.clone import NoCheckpoint, checkpoint_epoch, copy_checkpoint

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    for e in (1, 2):
        (src / checkpoint_name(e)).write_bytes(b"donor %d" % e)
        (dst / checkpoint_name(e)).write_bytes(b"own %d" % e)
    (dst / checkpoint_name(3)).write_bytes(b"own 3")
    copy_checkpoint(str(src), str(dst), 2)
    assert (dst / checkpoint_name(2)).read_bytes() == b"donor 2"
    assert not (dst / checkpoint_name(3)).exists() and checkpoint_epoch(str(dst)) == 2
    assert (dst / checkpoint_name(1)).read_bytes() == b"own 1"
    copy_checkpoint(str(src), str(dst), 2)  # again: the same
    assert (dst / checkpoint_name(2)).read_bytes() == b"donor 2"
    with pytest.raises(NoCheckpoint):
        copy_checkpoint(str(src), str(dst), 5)
    # A script's: a directory per epoch, swapped whole; its half-made ones are the script's to clean.
    sa, da = tmp_path / "sa" / "checkpoints", tmp_path / "da" / "checkpoints"
    (sa / "epoch_000004").mkdir(parents=True)
    (sa / "epoch_000004" / "state.json").write_text("donor")
    (da / "epoch_000004").mkdir(parents=True)
    (da / "epoch_000004" / "state.json").write_text("own")
    (da / "epoch_000004" / "extra").write_text("own only")
    (da.parent / "best.json").write_text(
        '{"epoch": 4, "metric": "m", "value": 1.0, "checkpoint": "checkpoints/epoch_000004"}'
    )
    copy_checkpoint(str(sa.parent), str(da.parent), 4)
    # Its best epoch's directory is the donor's now: best.json no longer names it as its own.
    assert read_best_checkpoint(str(da.parent)) is None
    assert sorted(p.name for p in (da / "epoch_000004").iterdir()) == ["state.json"]
    assert (da / "epoch_000004" / "state.json").read_text() == "donor"
    assert sorted(p.name for p in da.iterdir()) == ["epoch_000004"]
    assert checkpoint_epoch(str(da.parent)) == 4
    (da / "epoch_000002").mkdir()  # a best epoch before the copied one stays its best
    (da.parent / "best.json").write_text(
        '{"epoch": 2, "metric": "m", "value": 1.0, "checkpoint": "checkpoints/epoch_000002"}'
    )
    copy_checkpoint(str(sa.parent), str(da.parent), 4)
    assert read_best_checkpoint(str(da.parent))["epoch"] == 2  # type: ignore[index]


def test_a_restored_optimizer_takes_the_configurations_hyperparameters(tmp_path: Path) -> None:
    import torch

    from tuner.trial.frame.settings import Settings
    from tuner.trial.loop.optim import build_optimizer, build_schedule, set_hyperparameters

    def parts(lr: float, decay: float) -> tuple[Any, Any, Settings]:
        s = Settings.of({"lr": lr, "optimizer": "sgd", "weight_decay": decay, "lr_schedule": "cosine"})
        net = torch.nn.Linear(2, 1)
        opt = build_optimizer(net, s)
        return opt, build_schedule(opt, s, steps_per_epoch=5, max_epochs=4), s

    opt, sched, _ = parts(0.1, 0.0)
    for _ in range(7):
        opt.step()
        sched.step()
    state = (opt.state_dict(), sched.state_dict())
    same_lr = opt.param_groups[0]["lr"]
    again, again_sched, s = parts(0.1, 0.0)
    again.load_state_dict(state[0])
    again_sched.load_state_dict(state[1])
    set_hyperparameters(again, again_sched, s)
    assert again.param_groups[0]["lr"] == same_lr  # a plain resume: exactly as it was
    other, other_sched, s2 = parts(0.05, 0.01)
    other.load_state_dict(state[0])
    other_sched.load_state_dict(state[1])
    set_hyperparameters(other, other_sched, s2)
    assert other.param_groups[0]["lr"] == pytest.approx(same_lr / 2)  # the new lr, at the same step
    assert other.param_groups[0]["weight_decay"] == 0.01
    other_sched.step()
    again_sched.step()
    assert other.param_groups[0]["lr"] == pytest.approx(again.param_groups[0]["lr"] / 2)


def test_the_best_weights_schedule_follows_the_lineage_back() -> None:
    from tuner.results import Outcome, TrialRecord, weights_schedule

    def trial(name: str, schedule: list[dict[str, Any]]) -> TrialRecord:
        return TrialRecord(
            name,
            "TERMINATED",
            {},
            {},
            6,
            0.0,
            None,
            False,
            1.0,
            6,
            schedule=schedule,
            outcome=Outcome.COMPLETED,
        )

    a = trial("a", [{"epochs": [1, 6], "config": {"lr": 1}, "donor": None}])
    b = trial(
        "b",
        [
            {"epochs": [1, 2], "config": {"lr": 2}, "donor": None},
            {"epochs": [3, 6], "config": {"lr": 3}, "donor": "a"},
        ],
    )
    c = trial(
        "c",
        [
            {"epochs": [1, 4], "config": {"lr": 4}, "donor": None},
            {"epochs": [5, 6], "config": {"lr": 5}, "donor": "b"},
        ],
    )
    assert weights_schedule([a, b, c], c, 6) == [
        {"trial": "a", "epochs": [1, 2], "config": {"lr": 1}},
        {"trial": "b", "epochs": [3, 4], "config": {"lr": 3}},
        {"trial": "c", "epochs": [5, 6], "config": {"lr": 5}},
    ]
    assert weights_schedule([a, b, c], c, 3) == [{"trial": "c", "epochs": [1, 3], "config": {"lr": 4}}]


# ----------------------------------------------------------------------------- resume


def _left_by_a_kill(tmp_path: Path, reached: int) -> tuple[Any, Path]:
    """A 4-member population's directory as a kill left it: `reached` members trained epoch 1
    (journal and checkpoint) and wait there, the others never started; its request."""
    import json

    from tuner.search.algorithms import random_todo
    from tuner.search.plan import Prior, SearchRequest
    from tuner.sweepdir import Place, checkpoint_name, write_record

    cfg = _cfg(**{"search.num_samples": 4, "schedule.pbt.interval": 1})
    sweep = tmp_path / "pop"
    r = SearchRequest(cfg.search, cfg.schedule, cfg.hyperparameters(), "val_acc", "max", None, Prior())
    r.place = Place(str(sweep))
    for i, (config, _) in enumerate(random_todo(r)[:reached]):
        d = sweep / f"t{i}"
        write_record(str(d), {"trial_id": d.name, "config": config, "status": "RUNNING", "started": float(i)})
        (d / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_acc": 0.1 * (i + 1)}) + "\n")
        (d / checkpoint_name(1)).write_bytes(b"weights of t%d" % i)
    return r, sweep


def test_a_resumed_population_makes_the_perturbation_every_member_had_reached(tmp_path: Path) -> None:
    from tuner.search.pbt import pbt
    from tuner.sweepdir import checkpoint_name, read_lineage

    r, sweep = _left_by_a_kill(tmp_path, reached=4)
    population = pbt(r).population
    assert population.decided == {1} and not population.waiting
    (member,) = [m for m in population.members if len(m.segments) > 1]  # the worst: t0
    assert member.name == "t0" and member.segments[1]["donor"] == "t3"  # from the best
    assert (sweep / "t0" / checkpoint_name(1)).read_bytes() == b"weights of t3"
    assert [read_lineage(str(sweep / f"t{i}"))["member"] for i in range(4)] == [0, 1, 2, 3]  # type: ignore[index]
    again = pbt(r).population  # resumed once more: the same decision, recorded, not made again
    assert again.members[0].segments == member.segments
    handed = [again.hand_out(f"x{i}") for i in range(5)]
    assert handed[0] == member.config and handed[4] == "FINISHED"
    assert again.names == {f"x{i}": f"t{i}" for i in range(4)}  # each in its own directory
    assert again.origin_of == {}  # (continued: their records have their origins)


def test_members_waiting_for_others_are_held_back_until_they_arrive(tmp_path: Path) -> None:
    from tuner.search.pbt import pbt

    r, _ = _left_by_a_kill(tmp_path, reached=3)
    population = pbt(r).population
    assert not population.decided and population.waiting == {0: 1, 1: 1, 2: 1}
    assert population.hand_out("new") == population.members[3].config  # the one not there yet
    assert population.hand_out("held") is None  # the others wait for it


def test_a_new_members_origin_is_recorded_as_it_is_handed_out() -> None:
    from tuner.search import algorithms

    cfg = _cfg(**{"search.num_samples": 3, "search.start_with": [{"lr": 0.01}]})
    plan = algorithms.build(cfg.search, cfg.schedule, cfg.hyperparameters(), "val_acc", "max")
    handed = [plan.search_alg.suggest(f"trial{i}") for i in range(3)]
    assert handed[0]["lr"] == 0.01
    # What TrialRecordCallback writes into each trial's record (summary.json's "origin").
    assert plan.handed == {"trial0": "start_with", "trial1": "searcher", "trial2": "searcher"}


def test_the_best_weights_are_rebuilt_with_the_configuration_that_trained_them(tmp_path: Path) -> None:
    """A member whose best epoch came before it continued from a donor of another width: its
    best weights are its own, of its own width, and export and load_best build that model
    (the lineage's last configuration is the donor's: weights of the wrong shape)."""
    import json

    import torch

    from tuner import load_best
    from tuner.config import to_yaml
    from tuner.results import records, summarize
    from tuner.sweepdir import best_weights_name, write_lineage, write_record
    from tuner.trial.loop.data import load_data
    from tuner.trial.loop.models import build_model
    from tuner.view.export import export

    cfg = _cfg(**{"schedule.pbt.perturb": ["lr"]})
    sweep = tmp_path / "debug"
    (sweep / "t0").mkdir(parents=True)
    (sweep / "sweep.yaml").write_text(to_yaml(cfg))
    fixed = {k: p.value for k, p in cfg.hyperparameters().items() if isinstance(p, Fixed)}
    own = {**fixed, "lr": 0.01, "optimizer": "adam", "width": 8, "depth": 1}
    donor = {**own, "lr": 0.02, "width": 24}
    trial = str(sweep / "t0")
    write_record(trial, {"trial_id": "t0", "config": own, "status": "TERMINATED", "started": 1.0})
    rows = [{"epoch": e, "val_acc": v, "epoch_time_s": 0.1} for e, v in ((1, 0.9), (2, 0.5), (3, 0.6))]
    (sweep / "t0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    segments = [{"epoch": 0, "config": own}, {"epoch": 2, "config": donor, "donor": "t1"}]
    write_lineage(trial, {"member": 0, "segments": segments})
    bundle = load_data("synthetic", dict(cfg.task.data_args), own, str(tmp_path))
    net = build_model("mlp", own, bundle.input_shape, bundle.num_classes, str(tmp_path))
    torch.save(net.state_dict(), sweep / "t0" / best_weights_name(1))
    best = {"epoch": 1, "metric": "val_acc", "value": 0.9, "weights": best_weights_name(1)}
    (sweep / "t0" / "best.json").write_text(json.dumps(best))

    trials = records(str(sweep), "val_acc", "max", 3, list(cfg.search.params))
    summary = summarize(
        trials, name="debug", metric="val_acc", direction="max", algorithm="random", expected_trials=1
    )
    assert summary["best"]["config"]["width"] == 8 and summary["trials"][0]["config"]["width"] == 24
    model = load_best(str(sweep))
    assert [p.shape for p in model.parameters()] == [p.shape for p in net.parameters()]
    written = Path(export(str(sweep)))
    exported = json.loads((written / "config.json").read_text())
    assert exported["config"]["width"] == 8 and exported["epoch"] == 1
    searched = {"lr": 0.01, "optimizer": "adam", "width": 8, "depth": 1}
    assert exported["schedule"] == [{"trial": "t0", "epochs": [1, 1], "config": searched}]
