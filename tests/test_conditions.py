"""Conditional parameters (`when:`) and `search.constraints` (issue 14), without a cluster:
the expression rules against hand computations, the grid counted by hand, and every search
algorithm's own suggestions checked configuration by configuration."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.conftest import DEBUG, SPACES, cli
from tuner.config import ConfigError, load_sweep, parse_sweep, read_yaml, settled
from tuner.search import algorithms
from tuner.search.plan import Prior, PriorTrial
from tuner.space import conditions, constraints

# optimizer -> momentum (only for sgd) -> nesterov-like flag (only for high momentum: a chain);
# depth -> dropout (only for 2 or 3 layers); width and heads tied by the constraints.
PARAMS: dict[str, Any] = {
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "momentum": {"type": "choice", "values": [0.5, 0.9], "when": {"optimizer": "sgd"}},
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1, "when": {"momentum": 0.9}},
    "depth": {"type": "randint", "low": 1, "high": 3},
    "dropout": {"type": "uniform", "low": 0.0, "high": 0.5, "when": {"depth": [2, 3]}},
    "width": {"type": "choice", "values": [8, 12, 16, 24]},
}
CONSTRAINTS = ["width % depth == 0", "width * depth <= 36"]


def _cfg(algorithm: str, **over: Any) -> Any:
    raw = read_yaml(DEBUG)
    raw["search"].update(algorithm=algorithm, params=PARAMS, constraints=CONSTRAINTS, **over)
    raw["search"]["params"] = {**PARAMS}
    return parse_sweep(raw)


def _suggested(algorithm: str, n: int) -> list[dict[str, Any]]:
    cfg = _cfg(algorithm, num_samples=max(n, 1))
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction
    )
    if plan.points is not None:
        return plan.points
    out = []
    for i in range(n):
        config = plan.search_alg.suggest(f"t{i}")
        out.append({**plan.param_space, **config})
        for epoch in (1, 2):  # results to learn from, so the model-based ones leave random draws
            result = {cfg.metric: (i % 7) / 7 + 0.01 * epoch, "epoch": epoch}
            plan.search_alg.on_trial_result(f"t{i}", result)
        plan.search_alg.on_trial_complete(f"t{i}", result)
    return out


def _check(config: dict[str, Any]) -> None:
    """The rules, written out by hand for PARAMS and CONSTRAINTS."""
    assert ("momentum" in config) == (config["optimizer"] == "sgd"), config
    assert ("lr" in config) == (config.get("momentum") == 0.9), config
    assert ("dropout" in config) == (config["depth"] in (2, 3)), config
    assert config["width"] % config["depth"] == 0 and config["width"] * config["depth"] <= 36, config


# optuna: its first 10 proposals are random draws, the 2 after them its model's (each of those
# may be refused and asked again up to 100 times: seconds apiece).
@pytest.mark.parametrize("algorithm, n", [("grid", 0), ("random", 40), ("optuna", 12), ("bohb", 20)])
def test_every_algorithm_keeps_conditions_and_constraints(algorithm: str, n: int) -> None:
    configs = _suggested(algorithm, n)
    for c in configs:
        _check(c)
    if algorithm != "grid":
        assert len(configs) == n
        # Both sides of every condition were drawn (so the check above tested something).
        assert {"momentum" in c for c in configs} == {True, False}
        assert {"dropout" in c for c in configs} == {True, False}


def test_grid_expands_only_where_a_parameter_applies() -> None:
    configs = _suggested("grid", 0)
    # By hand: optimizer adam (1) or sgd with momentum 0.5 (1) or 0.9 with lr's 3 points (3):
    # 5 ways. depth 1: widths 8, 12, 16, 24 (all keep both constraints) = 4; depth 2 with
    # dropout's 3 points: widths 8, 12, 16 (24 * 2 > 36) = 3 x 3; depth 3: width 12 (8 and 16
    # are not divisible by 3, 24 * 3 > 36) = 1 x 3. So 5 x (4 + 9 + 3) = 80.
    assert len(configs) == 80 == _cfg("grid").expected_trials()
    assert len({algorithms.key(c) for c in configs}) == 80  # no two the same


def test_a_grid_parameter_conditional_in_random_search_takes_its_turn() -> None:
    params = parse_sweep(
        {
            **read_yaml(DEBUG),
            "search": {
                "algorithm": "random",
                "params": {
                    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
                    "momentum": {"type": "grid", "values": [0.5, 0.9], "when": {"optimizer": "sgd"}},
                },
            },
        }
    ).hyperparameters()
    configs = algorithms.random_configs(params, 30, seed=0)
    for i, c in enumerate(configs):
        assert c.get("momentum") == ([0.5, 0.9][i % 2] if c["optimizer"] == "sgd" else None)


def test_unconditional_spaces_draw_what_they_drew_before() -> None:
    """Random search of a space without conditions draws as it did (resume of older sweeps
    rebuilds the same list): the first configuration of debug.yaml, seed 0, as drawn before."""
    cfg = load_sweep(DEBUG)
    first = algorithms.random_configs(cfg.hyperparameters(), 1, seed=0)[0]
    import numpy as np
    from ray import tune

    rng = np.random.default_rng(0)
    assert first["lr"] == tune.loguniform(1e-3, 1e-1).sample(random_state=rng)
    assert first["optimizer"] == tune.choice(["sgd", "adam"]).sample(random_state=rng)
    assert first["width"] == tune.randint(8, 33).sample(random_state=rng)


def test_configspace_gets_the_conditions() -> None:
    from tuner.space.params import to_configspace

    cfg = _cfg("bohb")
    searched = {k: v for k, v in cfg.search.params.items()}
    space = to_configspace(searched, seed=1)
    assert {c.child.name for c in space.conditions} == {"momentum", "lr", "dropout"}
    for sample in space.sample_configuration(200):
        c = dict(sample)
        assert ("momentum" in c) == (c["optimizer"] == "sgd")
        assert ("lr" in c) == (c.get("momentum") == 0.9)
        assert ("dropout" in c) == (c["depth"] in (2, 3))


@pytest.mark.parametrize("algorithm", ["grid", "random", "optuna", "bohb"])
def test_a_resumed_plan_of_conditional_trials_rebuilds(algorithm: str) -> None:
    """An earlier run's trials, some without their conditional parameters, are told to the
    rebuilt searcher (bohb and optuna once looked up every searched key) and not run again."""
    cfg = _cfg(algorithm, num_samples=6)
    old = _suggested(algorithm, 3)
    history = [{"epoch": e, cfg.metric: 0.5 + 0.1 * e} for e in (1, 2)]
    total = cfg.expected_trials()
    prior = Prior(
        finished=[PriorTrial(old[0], history), PriorTrial(old[1], history)], resumed=[old[2]], new=total - 3
    )
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction, None, prior
    )
    assert plan.num_samples == total - 2
    if plan.points is not None:
        assert plan.points[0] == old[2]
        assert not {algorithms.key(c) for c in plan.points[1:]} & {
            algorithms.key(old[0]),
            algorithms.key(old[1]),
        }
        return
    assert algorithms.key({**plan.param_space, **plan.search_alg.suggest("r")}) == algorithms.key(old[2])
    for i in range(5):
        _check({**plan.param_space, **plan.search_alg.suggest(f"n{i}")})


# ----------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    "text, config, holds",
    [
        ("width % heads == 0", {"width": 384, "heads": 6}, True),
        ("width % heads == 0", {"width": 384, "heads": 5}, False),
        ("width * depth <= 4096", {"width": 1024, "depth": 4}, True),
        ("width * depth <= 4096", {"width": 1025, "depth": 4}, False),
        ("1 <= depth < 3 and not lr > 0.1 or width == 7", {"depth": 2, "lr": 0.05, "width": 1}, True),
        ("1 <= depth < 3 and not lr > 0.1 or width == 7", {"depth": 3, "lr": 0.05, "width": 7}, True),
        ("-width // 3 == -3 and 2 ** depth == 8.0", {"width": 7, "depth": 3}, True),
        ("width / heads >= 32", {"width": 192, "heads": 8}, False),
        ("width % heads == 0", {"width": 384, "heads": 0}, False),  # modulo by zero: broken
        ("width / heads > 0", {"width": 1, "heads": 0}, False),  # division by zero: broken
        ("2 ** width > 0", {"width": 65}, False),  # exponent above 64: broken, not computed
        ("width ** 64 > 0", {"width": 2**70}, False),  # past 4096 bits: broken
        ("(-8) ** lr < 0", {"lr": 0.5}, False),  # a complex number: broken
        ("width % heads == 0", {"width": 384}, True),  # heads absent: does not apply
    ],
)
def test_constraints_evaluate_as_written(text: str, config: dict[str, Any], holds: bool) -> None:
    assert constraints.parse(text).holds(config) is holds


@pytest.mark.parametrize(
    "text, words",
    [
        ("__import__('os').system('true') == 0", "a call is not allowed"),
        ("width.bit_length() > 1", "a call is not allowed"),
        ("width > 'a'", "the constant 'a' is not allowed"),
        ("width > True", "the constant True is not allowed"),
        ("width", "must be a comparison"),
        ("width + 1", "must be a comparison"),
        ("(width > 1) + 1 > 0", "cannot be used as a number"),
        ("width in [1, 2]", "only the comparisons"),
        ("width is 1", "only the comparisons"),
        ("[x for x in width] == 1", "ListComp is not allowed"),
        ("width > 1 if depth else 2", "IfExp is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("width <", "not an expression"),
        ("width = 1", "not an expression"),
        ("", "non-empty"),
        ("(" * 300 + "1" + ")" * 300 + " > 0", "longer than 500"),
        ("width ^ 2 == 0", "BitXor is not allowed"),
    ],
)
def test_constraints_refuse_other_syntax(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        constraints.parse(text)


def test_condition_values_compare_by_value_and_bools_only_with_bools() -> None:
    cfg = _cfg("random")
    dropout = cfg.search.params["dropout"]
    assert conditions.applies(dropout, {"depth": 2.0}) and not conditions.applies(dropout, {"depth": 1})
    assert not conditions.applies(dropout, {})  # its parent absent (a chain): absent too
    assert not conditions.same(True, 1) and conditions.same(2, 2.0)


def test_vit_amp_draws_only_heads_that_divide_width() -> None:
    cfg = load_sweep(SPACES / "vit_amp.yaml", {"search.algorithm": "random", "search.num_samples": 40})
    plan = algorithms.build(
        cfg.search, cfg.schedule, cfg.hyperparameters(), cfg.metric, cfg.objective_direction
    )
    pairs = {(c["width"], c["heads"]) for c in plan.points}
    assert all(w % h == 0 and w / h >= 32 for w, h in pairs) and len(pairs) > 5


def test_model_based_searchers_fall_back_to_a_random_draw_that_keeps_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tuner.search import searchers
    from tuner.search.searchers import MODEL_DRAWS, Feasible

    cfg = _cfg("optuna")
    feasible = Feasible(cfg.hyperparameters(), CONSTRAINTS, seed=0)
    drawn = []

    def broken() -> dict[str, Any]:
        drawn.append(1)
        return {"optimizer": "adam", "depth": 3, "width": 24, "dropout": 0.1}

    config = feasible.propose(broken, lambda: None)
    assert len(drawn) == MODEL_DRAWS
    _check({**feasible.fixed, **config})
    never = Feasible(cfg.hyperparameters(), ["width > 100"], seed=0)
    monkeypatch.setattr(searchers, "MAX_RANDOM_DRAWS", 500)  # (10,000 in a sweep: seconds here)
    with pytest.raises(ConfigError, match="search.constraints: 500 random draws in a row broke them"):
        never.propose(broken, lambda: None)


def test_conditions_survive_the_sweep_yaml_round_trip() -> None:
    cfg = _cfg("random")
    again, text = settled(cfg)
    assert again.search.params == cfg.search.params and again.search.constraints == CONSTRAINTS
    assert "when:" in text and "optimizer: sgd" in text


# ----------------------------------------------------------------------------- bad input


def _with(**params: Any) -> dict[str, Any]:
    return {**PARAMS, **params}


BAD = [
    (
        "unknown parent",
        _with(momentum={"type": "uniform", "low": 0.1, "high": 0.9, "when": {"optimiser": "sgd"}}),
        [],
        "search.params.momentum.when.optimiser: no parameter 'optimiser' in search.params",
    ),
    (
        "impossible value",
        _with(momentum={"type": "uniform", "low": 0.1, "high": 0.9, "when": {"optimizer": "lion"}}),
        [],
        "search.params.momentum.when.optimizer: 'optimizer' never takes the value 'lion'",
    ),
    (
        "outside an integer range",
        _with(dropout={"type": "uniform", "low": 0, "high": 0.5, "when": {"depth": [2, 4]}}),
        [],
        "search.params.dropout.when.depth: 'depth' never takes the value 4",
    ),
    (
        "continuous parent",
        _with(width={"type": "choice", "values": [8, 16], "when": {"dropout": 0.1}}),
        [],
        "search.params.width.when.dropout: 'dropout' is a continuous uniform parameter",
    ),
    (
        "cycle",
        _with(
            optimizer={"type": "choice", "values": ["sgd", "adam"], "when": {"lr": 0.01}},
            lr={"type": "choice", "values": [0.01, 0.1], "when": {"momentum": 0.9}},
        ),
        [],
        "search.params.optimizer.when: conditions form a cycle: optimizer -> lr -> momentum -> optimizer",
    ),
    (
        "contradicting chain",
        _with(
            lr={
                "type": "loguniform",
                "low": 1e-3,
                "high": 0.1,
                "when": {"momentum": 0.9, "optimizer": "adam"},
            }
        ),
        [],
        "search.params.lr.when: holds in no configuration",
    ),
    (
        "empty when",
        _with(lr={"type": "loguniform", "low": 1e-3, "high": 0.1, "when": {}}),
        [],
        "search.params.lr.when: must name at least one parameter",
    ),
    (
        "unknown name",
        PARAMS,
        ["widht % 2 == 0"],
        "search.constraints.0: 'widht % 2 == 0': 'widht' is not a parameter",
    ),
    (
        "not a number",
        PARAMS,
        ["optimizer > 1"],
        "search.constraints.0: 'optimizer > 1': 'optimizer' takes 'sgd', not a number",
    ),
    (
        "a call",
        PARAMS,
        ["width > 1", "abs(width) > 1"],
        "search.constraints.1: 'abs(width) > 1': a call is not allowed",
    ),
    (
        "nothing left",
        PARAMS,
        ["width > 24"],
        "search.constraints: the constraints leave no configuration (1,000 random draws",
    ),
]


@pytest.mark.parametrize("params, rules, line", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_conditions_and_constraints_are_refused(params: dict, rules: list[str], line: str) -> None:
    raw = read_yaml(DEBUG)
    raw["search"].update(params=params, constraints=rules)
    with pytest.raises(ConfigError) as err:
        parse_sweep(raw)
    assert str(err.value).startswith(line), str(err.value)


def test_a_training_value_a_conditional_parameter_would_hide_is_refused() -> None:
    raw = read_yaml(DEBUG)
    raw["search"]["params"] = PARAMS
    raw["training"]["momentum"] = 0.5
    with pytest.raises(
        ConfigError, match="training.momentum: is 0.5, but search.params.momentum has a when:"
    ):
        parse_sweep(raw)


def test_the_grid_refuses_constraints_no_combination_keeps(tmp_path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(DEBUG.read_text())
    flags = ["--algorithm", "grid", "--set", "search.constraints=[width * 2 > 64]"]
    out = cli("validate", str(f), *flags)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: search.constraints: the constraints leave no configuration "
        "(no combination of the grid keeps them all)"
    ], out.stderr
    out = cli(
        "sweep",
        str(f),
        "--output",
        str(tmp_path / "runs"),
        "--set",
        "search.params.width={type: choice, values: [8, 16], when: {optimizer: lion}}",
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: search.params.width.when.optimizer: "
        "'optimizer' never takes the value 'lion' (its values: sgd, adam)"
    ], out.stderr
    assert not (tmp_path / "runs").exists()


def test_constraints_that_few_draws_keep_pass_validation() -> None:
    """Validation's 1,000 draws accept a space most of which the constraints refuse, as long
    as some draws keep them (here about 1 in 12: width 24 of 4, depth 1 of 3)."""
    rule = ["width == 24 and depth == 1"]
    hyper, rng = _cfg("random").hyperparameters(), random.Random(0)
    kept = sum(constraints.allows(rule, conditions.random_config(hyper, rng)) for _ in range(3000))
    assert 150 < kept < 350
    raw = read_yaml(DEBUG)
    raw["search"].update(params=PARAMS, constraints=rule)
    assert parse_sweep(raw).search.constraints == rule
