"""Sweep files: validation errors name the field, flags beat the file, shipped files are valid."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, SPACES, CliSweep, cli
from tuner.config import ConfigError, json_schema, load_sweep, parse_sweep, settled, to_yaml, yamlfile
from tuner.search.algorithms import build_for
from tuner.search.simulate import simulate
from tuner.space.params import Fixed

GOOD: dict[str, Any] = yaml.safe_load((SPACES / "debug.yaml").read_text())


def _edit(fn: Callable[[dict], Any]) -> dict:
    raw = copy.deepcopy(GOOD)
    fn(raw)
    return raw


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def apply(raw: dict) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return apply


def _drop(path: str) -> Callable[[dict], None]:
    def apply(raw: dict) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[key]
        del node[last]

    return apply


# (case id, edit of debug.yaml, field path the error must name, words the message must hold)
BAD_FILES = [
    ("missing-name", _drop("name"), "name", "required"),
    ("missing-task", _drop("task"), "task", "required"),
    ("missing-model", _drop("task.model"), "task.model", "required"),
    ("unknown-top-key", _set("metrc", "val_acc"), "metrc", "unknown key"),
    ("unknown-section-key", _set("schedule.max_epoch", 3), "schedule.max_epoch", "unknown key"),
    ("unknown-algorithm", _set("search.algorithm", "hyperopt"), "search.algorithm", "valid: grid"),
    ("unknown-model", _set("task.model", "resnet"), "task.model", "unknown model"),
    ("unknown-data", _set("task.data", "imagenet"), "task.data", "unknown data"),
    ("unimportable-module", _set("task.model", "no_such_pkg.models:build"), "task.model", "cannot import"),
    ("missing-function", _set("task.data", "json:no_such_function"), "task.data", "no function"),
    ("bad-spec-form", _set("task.model", "pkg.mod:"), "task.model", "package.module:function"),
    ("negative-epochs", _set("schedule.max_epochs", -3), "schedule.max_epochs", "greater than or equal to 1"),
    ("epochs-not-int", _set("schedule.max_epochs", "ten"), "schedule.max_epochs", "integer"),
    ("grace-over-max", _set("schedule.grace_epochs", 9), "schedule.grace_epochs", "max_epochs"),
    ("zero-samples", _set("search.num_samples", 0), "search.num_samples", "greater than or equal to 1"),
    # A URI output trained every trial, then found no record (issue 26): refused until it works.
    ("uri-output", _set("output", "gs://bucket/runs"), "output", "other than s3:// are not supported yet"),
    (
        "loguniform-low-zero",
        _set("search.params.lr", {"type": "loguniform", "low": 0, "high": 1}),
        "search.params.lr.low",
        "must be > 0",
    ),
    (
        "low-above-high",
        _set("search.params.lr", {"type": "uniform", "low": 1, "high": 0.5}),
        "search.params.lr.high",
        "must be > low",
    ),
    (
        "unknown-param-type",
        _set("search.params.lr", {"type": "logunifrom", "low": 1e-3, "high": 1}),
        "search.params.lr",
        "unknown parameter type",
    ),
    (
        "param-missing-values",
        _set("search.params.optimizer", {"type": "choice"}),
        "search.params.optimizer.values",
        "required",
    ),
    ("param-bare-list", _set("search.params.width", [8, 16]), "search.params.width", "choice"),
    ("autotune-negative", _set("training.autotune", -5), "training.autotune", "budget in whole seconds"),
    ("autotune-text", _set("training.autotune", "fast"), "training.autotune", "true, false or a budget"),
    (
        "autotune-searched",
        _set("search.params.autotune", {"type": "choice", "values": [0, 60]}),
        "search.params.autotune",
        "set it under training",
    ),
    ("threads-zero", _set("training.threads", 0), "training.threads", "greater than or equal to 1"),
    (
        "duplicate-choice",
        _set("search.params.width", {"type": "choice", "values": [8, 8]}),
        "search.params.width.values",
        "distinct",
    ),
    (
        "randint-float-bound",
        _set("search.params.width", {"type": "randint", "low": 1.5, "high": 4}),
        "search.params.width.low",
        "integer",
    ),
    (
        "grid-with-bohb",
        lambda r: (
            _set("search.algorithm", "bohb")(r),
            _set("search.params.width", {"type": "grid", "values": [8, 16]})(r),
        ),
        "search.params.width",
        "bohb cannot search a grid",
    ),
    (
        "grid-with-optuna",
        lambda r: (
            _set("search.algorithm", "optuna")(r),
            _set("search.params.depth", {"type": "grid", "values": [1, 2]})(r),
        ),
        "search.params.depth",
        "optuna cannot search a grid",
    ),
    (
        "unknown-optimizer",
        _set("search.params.optimizer", {"type": "choice", "values": ["sgd", "lion"]}),
        "search.params.optimizer",
        "unknown optimizer",
    ),
    ("bad-amp", _set("training.amp", "fp8"), "training.amp", "'off'"),
    (
        "bad-amp-choice",
        _set("search.params.amp", {"type": "choice", "values": ["bf16", "int4"]}),
        "search.params.amp",
        "int4",
    ),
    (
        "batch-size-zero",
        _set("search.params.batch_size", {"type": "choice", "values": [0, 32]}),
        "search.params.batch_size",
        "greater than or equal to 1",
    ),
    ("typo-param", _set("search.params.widht", 16), "search.params.widht", "not a parameter of model 'mlp'"),
    ("width-not-int", _set("search.params.width", 12.5), "search.params.width", "integer"),
    ("dropout-out-of-range", _set("search.params.dropout", 1.5), "search.params.dropout", "outside"),
    (
        "metric-unknown-without-mode",
        lambda raw: (_set("metric", "accuracy")(raw), raw.pop("direction")),
        "direction",
        "required for metric 'accuracy'",
    ),
    ("direction-contradicts-metric", _set("direction", "min"), "direction", "maximised"),
    (
        "fractional-gpus-above-one",
        _set("resources.gpus_per_worker", 1.5),
        "resources.gpus_per_worker",
        "whole number",
    ),
    ("negative-gpus", _set("resources.gpus_per_worker", -1), "resources.gpus_per_worker", ">= 0"),
    (
        "zero-workers",
        _set("resources.workers_per_trial", 0),
        "resources.workers_per_trial",
        "greater than or equal to 1",
    ),
    ("bad-name", _set("name", "my sweep/1"), "name", "pattern"),
    ("section-not-mapping", _set("schedule", 5), "schedule", "valid dictionary"),
    (
        "bohb-without-early-stopping",
        lambda r: (_set("search.algorithm", "bohb")(r), _set("schedule.early_stopping", False)(r)),
        "schedule.early_stopping",
        "bohb",
    ),
    # Issue 17: values no sweep can run, refused instead of run (or of exhausting memory).
    ("lr-inf", _set("training.lr", math.inf), "training.lr", "finite"),
    ("fixed-lr-inf", _set("search.params.lr", math.inf), "search.params.lr", "finite"),
    (
        "high-inf",
        _set("search.params.lr", {"type": "uniform", "low": 0.1, "high": math.inf}),
        "search.params.lr.high",
        "finite",
    ),
    (
        "choice-nan",
        _set("search.params.width", {"type": "choice", "values": [8, math.nan]}),
        "search.params.width.values",
        "finite",
    ),
    (
        "num-samples-true",
        _set("search.num_samples", True),
        "search.num_samples",
        "must be a number, not true",
    ),
    (
        "randint-low-true",
        _set("search.params.width", {"type": "randint", "low": True, "high": 8}),
        "search.params.width.low",
        "not true",
    ),
    (
        "num-samples-huge",
        _set("search.num_samples", 1_000_000_000),
        "search.num_samples",
        "less than or equal to 10000",
    ),
    (
        "grid-too-large",
        lambda r: (
            _set("search.algorithm", "grid")(r),
            _set("search.grid_points", 100)(r),
            _set("search.params.dropout", {"type": "uniform", "low": 0.0, "high": 0.5})(r),
        ),
        "search.params",
        "a grid of 500,000 combinations is more than the 10,000",
    ),
    ("seed-negative", _set("search.seed", -1), "search.seed", "greater than or equal to 0"),
    ("training-seed-huge", _set("training.seed", 2**40), "training.seed", "less than or equal to"),
    (
        "reduction-factor-near-1",
        _set("schedule.reduction_factor", 1.0000001),
        "schedule.reduction_factor",
        "1.1",
    ),
    ("name-dotdot", _set("name", ".."), "name", "not a directory of its own"),
    ("name-dot", _set("name", "."), "name", "not a directory of its own"),
    ("name-too-long", _set("name", "n" * 256), "name", "at most 255"),
    # Issue 26: a metric tuner's loop never reports ended every trial, one after the other.
    (
        "metric-the-loop-never-reports",
        lambda raw: (_set("metric", "val_accuracy")(raw), _set("direction", "max")(raw)),
        "metric",
        "tuner's loop never reports 'val_accuracy'",
    ),
]


@pytest.mark.parametrize("case, edit, path, words", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_file_names_the_field(case: str, edit: Callable, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_sweep(_edit(edit))
    assert err.value.path == path, str(err.value)
    assert words.lower() in err.value.message.lower(), str(err.value)


def test_a_metric_the_loop_never_reports_is_one_line_at_validate() -> None:
    out = cli("validate", str(SPACES / "debug.yaml"), "--set", "metric=accuracy", "--set", "direction=max")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: metric: tuner's loop never reports 'accuracy'"), out.stderr
    # What a metrics hook reports (val_<name>) is its own to name: regression.yaml's val_mse.
    hooked = cli(
        "validate", str(SPACES / "regression.yaml"), "--set", "metric=val_r2", "--set", "direction=max"
    )
    assert hooked.returncode == 0, hooked.stderr
    assert (
        parse_sweep(_edit(lambda r: (_set("metric", "num_params")(r), r.pop("direction")))).objective
        == "num_params"
    )


def test_at_least_twenty_malformed_cases() -> None:
    assert len(BAD_FILES) >= 20


@pytest.mark.parametrize("case, edit, path, words", BAD_FILES[::3], ids=[c[0] for c in BAD_FILES[::3]])
def test_cli_refuses_bad_file_in_one_line(
    tmp_path: Path, case: str, edit: Callable, path: str, words: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_edit(edit)))
    out = cli("validate", str(f))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(f"error: {path}: "), out.stderr
    assert "Traceback" not in out.stderr + out.stdout


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("name: [unclosed\n", "YAML syntax error at line"),
        ("- just\n- a list\n", "mapping"),
        ("name: x\ntask: {model: mlp, data: digits\n", "YAML syntax error"),
    ],
    ids=["empty", "unclosed-list", "top-level-list", "unclosed-mapping"],
)
def test_cli_refuses_unreadable_yaml(tmp_path: Path, text: str, words: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    out = cli("validate", str(f))
    assert out.returncode == 2
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_cli_missing_file() -> None:
    out = cli("validate", "no/such/file.yaml")
    assert out.returncode == 2 and "no such file" in out.stderr


def test_the_driver_never_imports_torch(cli_sweep: CliSweep) -> None:
    # Torch lives in the trials only: a whole sweep leaves it out of the driver's process.
    assert cli_sweep.run.returncode == 0, cli_sweep.run.stdout[-2000:] + cli_sweep.run.stderr[-2000:]
    assert cli_sweep.driver_modules == ["True", "False"]  # Ray imported, torch not


def test_flags_beat_the_file(tmp_path: Path) -> None:
    out = cli(
        "validate",
        str(SPACES / "debug.yaml"),
        "--algorithm",
        "optuna",
        "--num-samples",
        "7",
        "--seed",
        "3",
        "--max-epochs",
        "5",
        "--set",
        "training.batch_size=16",
        "--set",
        "search.params.depth=2",
    )
    assert out.returncode == 0, out.stderr
    assert "optuna + asha, 7 trials, 5 epochs max" in out.stdout
    from tuner.cli import build_parser, overrides_from

    args = build_parser().parse_args(
        [
            "validate",
            str(SPACES / "debug.yaml"),
            "--seed",
            "3",
            "--set",
            "training.batch_size=16",
            "--set",
            "search.params.depth=2",
            "--output",
            str(tmp_path),
        ]
    )
    cfg = load_sweep(args.file, overrides_from(args))
    assert cfg.search.seed == 3 and cfg.training.batch_size == 16 and cfg.output == str(tmp_path)
    assert cfg.search.params["depth"].value == 2


def test_bad_flag_value_is_a_field_error() -> None:
    out = cli("validate", str(SPACES / "debug.yaml"), "--num-samples", "0")
    assert out.returncode == 2 and out.stderr.startswith("error: search.num_samples:")


def test_yaml_off_means_amp_off() -> None:
    raw = _edit(_set("training.amp", False))  # what `amp: off` parses to
    raw["search"]["params"]["amp"] = {"type": "choice", "values": [False, "bf16"]}
    cfg = parse_sweep(raw)
    assert cfg.training.amp == "off"
    assert cfg.search.params["amp"].values == ["off", "bf16"]


@pytest.mark.parametrize("path", sorted(SPACES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_file_validates(path: Path) -> None:
    cfg = load_sweep(path)
    assert cfg.name and (cfg.task.model or cfg.task.train or cfg.task.command) and cfg.search.params
    # Every key is commented: a comment line precedes each mapping key line.
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and ":" in stripped and not stripped.startswith("-"):
            above = lines[i - 1].strip() if i else ""
            assert above.startswith("#") or "#" in line, f"{path.name}:{i + 1} has no comment: {line}"


def _rising(config: dict, epoch: int, rng: Any) -> float:
    return 0.5 + 0.1 * epoch


def _ranked_by(cfg: Any) -> dict[str, str]:
    return {"metric": cfg.objective, "direction": cfg.objective_direction}


@pytest.mark.parametrize("shipped", ["debug.yaml", "digits_pareto.yaml"])  # one direction; a list
def test_mode_is_the_older_spelling_of_direction(tmp_path: Path, shipped: str) -> None:
    """Sweep files written before `direction:` say `mode:`: they validate as they did (the
    shipped schema too, which marks it deprecated), become the same sweep, and what tuner
    writes back says `direction`. Both keys at once: one line naming the field, exit 2."""
    text = (SPACES / shipped).read_text()
    assert text.count("\ndirection: ") == 1
    old = tmp_path / "old.yaml"
    old.write_text(text.replace("\ndirection: ", "\nmode: "))
    done = cli("validate", str(old))
    assert done.returncode == 0, done.stderr
    then, now = load_sweep(old), load_sweep(SPACES / shipped)
    assert then.model_dump() == now.model_dump() and then.objectives == now.objectives
    ran = [  # its search runs as the same sweep's (the real searcher and scheduler, no training)
        {t: r.config for t, r in simulate(build_for(c), 3, 2, _rising, **_ranked_by(c)).items()}
        for c in (then, now)
    ]
    assert ran[0] == ran[1] and len(ran[0]) == 3
    written = to_yaml(then)  # what sweep.yaml and `tuner refine` write
    assert "\ndirection:" in written and "\nmode:" not in written
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SPACES / "sweep.schema.json").read_text())
    assert schema["properties"]["mode"]["deprecated"] is True
    top = {k: v for k, v in yamlfile.load(old.read_text()).items() if k in ("name", "task", "metric", "mode")}
    jsonschema.validate(top, schema)  # (the whole file: YAML 1.1's `amp: off` is no schema string)
    wanted = "error: direction: given twice, as direction and as mode (its older spelling): keep direction\n"
    both = tmp_path / "both.yaml"
    both.write_text(old.read_text() + text[text.index("\ndirection: ") :].split("\n", 2)[1] + "\n")
    done = cli("validate", str(both))
    assert (done.returncode, done.stderr) == (2, wanted)
    # `--set` in either spelling replaces what the file says in either (the user's last word).
    for spelling in ("direction", "mode"):
        for file in (old, SPACES / shipped):
            assert load_sweep(file, {spelling: now.direction}).objectives == now.objectives
    # An empty one is no second answer: the default of the other spelling.
    assert load_sweep(old, {"direction": None}).objectives == now.objectives


def test_shipped_schema_is_current() -> None:
    shipped = json.loads((SPACES / "sweep.schema.json").read_text())
    assert shipped == json.loads(json.dumps(json_schema()))


def test_digits_mlp_is_the_peer_space() -> None:
    cfg = load_sweep(SPACES / "digits_mlp.yaml")
    p = cfg.search.params
    assert (p["lr"].type, p["lr"].low, p["lr"].high) == ("loguniform", 1e-4, 1e-1)
    assert p["optimizer"].values == ["sgd", "adam", "adamw"]
    assert (p["width"].type, p["width"].low, p["width"].high) == ("lograndint", 32, 512)
    assert (p["depth"].type, p["depth"].low, p["depth"].high) == ("randint", 1, 3)
    assert cfg.schedule.max_epochs == 27 and cfg.training.batch_size == 64


DEBUG_TEXT = (SPACES / "debug.yaml").read_text()
# 367 bytes that expand to 9**9 strings (3.2 GB before issue 17), under task.data_args.
ALIAS_BOMB = DEBUG_TEXT.replace(
    "  data_args:\n",
    "  data_args:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(
        f"    {b}: &{b} [*{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}]\n"
        for a, b in zip("abcdefgh", "bcdefghi", strict=True)
    ),
)


# What `sweep` refuses at once: (case, file text, flags, words of its one line).
REFUSALS = [
    ("max-epochs-zero", yaml.safe_dump(_edit(_set("schedule.max_epochs", 0))), [], "schedule.max_epochs: "),
    ("seed-negative", DEBUG_TEXT, ["--seed", "-1"], "error: search.seed: "),
    ("num-samples-huge", DEBUG_TEXT, ["--num-samples", "1000000000"], "error: search.num_samples: "),
    (
        "grid-huge",
        DEBUG_TEXT,
        [
            "--algorithm",
            "grid",
            "--set",
            "search.grid_points=100",
            "--set",
            "search.params.dropout={type: uniform, low: 0, high: 0.5}",
        ],
        "error: search.params: a grid of",
    ),
    ("alias-bomb", ALIAS_BOMB, [], "expands to more than 100,000 values"),
    ("duplicate-key", DEBUG_TEXT + "name: again\n", [], "duplicate key 'name' at line"),
    (
        "deep-nesting",
        DEBUG_TEXT.replace("  data_args:\n", "  data_args:\n    deep: " + "[" * 5000 + "]" * 5000 + "\n"),
        [],
        "nested deeper than 50 levels",
    ),
    ("output-unwritable", DEBUG_TEXT, ["--output", "/proc/self/no-such/runs"], "output: cannot create"),
    ("output-a-file", DEBUG_TEXT, ["--output", "{tmp}/a-file"], "is a file, not a directory"),
    ("name-too-long", DEBUG_TEXT, ["--name", "x" * 256], "error: name: "),
]
# Each refusal in turn, in one fresh interpreter: its exit code, seconds, whether Ray or torch
# is imported by then, and what it printed to stderr; first, the seconds `import tuner.cli` took.
REFUSAL_PROBE = """
import contextlib, io, json, sys, time
t0 = time.monotonic()
import tuner.cli as c
print(json.dumps(time.monotonic() - t0))
for case, f, flags in json.loads(sys.argv[1]):
    err, t0 = io.StringIO(), time.monotonic()
    with contextlib.redirect_stderr(err):
        code = c.main(['sweep', f, *flags])
    took = time.monotonic() - t0
    print(json.dumps([case, code, took, 'ray' in sys.modules, 'torch' in sys.modules, err.getvalue()]))
"""


def test_what_cannot_run_is_refused_at_once_before_ray_or_torch(tmp_path: Path) -> None:
    """`sweep` refuses bad input in one line (exit 2), before it imports Ray or torch, and
    at once: in a few times what the CLI's own import took (both measured in one process, so
    on any machine), where building what it refuses (an alias bomb's 9**9 strings, 3.2 GB;
    a grid's 500,000 trials) would take far longer. The bound is 10x: a refusal took about
    the import's time (0.2 s against 0.18 s in CI), so noise of 3x on either side stays inside.
    The one test of bad input that needs a process of its own (a fresh interpreter, where
    nothing has imported either yet); the others call the CLI in-process."""
    (tmp_path / "a-file").write_text("not a directory")
    cases = []
    for case, text, flags, _ in REFUSALS:
        f = tmp_path / f"{case}.yaml"
        f.write_text(text)
        flags = [w.replace("{tmp}", str(tmp_path)) for w in flags]
        cases.append([case, str(f), ["--output", str(tmp_path / "runs"), *flags]])
    out = subprocess.run(
        [sys.executable, "-c", REFUSAL_PROBE, json.dumps(cases)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    imported, *rows = map(json.loads, out.stdout.splitlines())
    got = {row[0]: row[1:] for row in rows}
    for case, _, _, words in REFUSALS:
        code, took, ray, torch, err = got[case]
        assert (code, ray, torch) == (2, False, False), (case, err)
        assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1, (case, err)
        assert took < 10 * imported, (case, took, imported)
    assert not (tmp_path / "runs").exists()


def test_a_refused_sweep_leaves_no_directory(tmp_path: Path) -> None:
    # Refused after the directory was claimed (the lock is taken before Ray starts).
    out = cli(
        "sweep",
        str(SPACES / "debug.yaml"),
        "--output",
        str(tmp_path),
        "--set",
        "resources.cpus_per_worker=512",
    )
    assert out.returncode == 2, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_bare_exponent_numbers_are_floats(tmp_path: Path) -> None:
    # YAML 1.1 reads 1e-3 as a string; the user meant a number.
    f = tmp_path / "s.yaml"
    text = DEBUG_TEXT.replace("lr: {type: loguniform, low: 1.0e-3, high: 1.0e-1}", "lr: 1e-3")
    f.write_text(text.replace("  amp: off\n", "  amp: off\n  weight_decay: 5E-4\n"))
    cfg = load_sweep(f, {"search.params.dropout": yamlfile.load("{type: choice, values: [0, 1e-1]}")})
    assert cfg.search.params["lr"].value == 0.001 and isinstance(cfg.search.params["lr"].value, float)
    assert cfg.training.weight_decay == 0.0005
    assert cfg.search.params["dropout"].values == [0, 0.1]
    out = cli("validate", str(f), "--set", "search.params.lr=2e-3")
    assert out.returncode == 0, out.stderr
    # ... and a string that looks like one stays a string through sweep.yaml.
    assert yamlfile.load(yamlfile.dump({"s": "1e-3"})) == {"s": "1e-3"}


@pytest.mark.parametrize("path", sorted(SPACES.glob("*.yaml")), ids=lambda p: p.name)
def test_sweep_yaml_reads_back_as_written(path: Path) -> None:
    # Every value a trial gets keeps its type through sweep.yaml (issue 17: the first run
    # gave trials warmup_epochs 0, resume read 0.0 and matched none of them).
    cfg = load_sweep(path)
    back, text = settled(cfg)
    assert to_yaml(back) == text
    ran = {k: p.value for k, p in cfg.hyperparameters().items() if isinstance(p, Fixed)}
    resumed = {k: p.value for k, p in back.hyperparameters().items() if isinstance(p, Fixed)}
    assert {k: (type(v), v) for k, v in ran.items()} == {k: (type(v), v) for k, v in resumed.items()}
