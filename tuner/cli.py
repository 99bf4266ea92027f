"""`python -m tuner`: sweep, validate, resume, report, board, schema.

User mistakes (a bad file, an impossible request, an existing sweep directory) print one line
naming the field and exit 2, before Ray or torch start. Exit codes: 0 success, 1 the sweep
had failed trials or no usable result, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional

import yaml

from tuner import yamlfile
from tuner.config import ConfigError, SweepConfig, json_schema, load_sweep, reference_markdown
from tuner.results import DiskFull

EXIT_USAGE, EXIT_INTERRUPTED = 2, 130

# CLI flag -> the field it overrides (flags beat the file).
OVERRIDES = {
    "algorithm": "search.algorithm",
    "num_samples": "search.num_samples",
    "seed": "search.seed",
    "max_epochs": "schedule.max_epochs",
    "output": "output",
    "name": "name",
}


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="sweep file (YAML), e.g. search_spaces/digits_mlp.yaml")
    p.add_argument("--algorithm", choices=["grid", "random", "bohb", "optuna"], help="search.algorithm")
    p.add_argument("--num-samples", type=int, metavar="N", help="search.num_samples")
    p.add_argument("--seed", type=int, help="search.seed")
    p.add_argument("--max-epochs", type=int, metavar="N", help="schedule.max_epochs")
    p.add_argument("--output", metavar="DIR", help="output: results go to DIR/<name>")
    p.add_argument("--name", help="name of the sweep (its directory under output)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any field, e.g. --set training.batch_size=128 (VALUE is YAML)",
    )


def _add_runtime(p: argparse.ArgumentParser) -> None:
    """Where and how a sweep runs (not part of the sweep file)."""
    p.add_argument("--address", help="join this Ray cluster (auto, ray://host:10001, host:6379)")
    p.add_argument("--num-cpus", type=int, metavar="N", help="CPUs of the local Ray it starts")
    p.add_argument(
        "--allow-insecure-cluster",
        action="store_true",
        help="join a cluster without authentication that other machines can reach (unsafe)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="Ray's own logs and worker output")


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted field -> value, from the flags given (later --set wins)."""
    out = {field: getattr(args, flag) for flag, field in OVERRIDES.items() if getattr(args, flag) is not None}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", f"expected KEY=VALUE, got '{item}'")
        try:
            out[key.strip()] = yamlfile.load(raw)
        except yamlfile.YAMLRefused as err:
            raise ConfigError(key, f"value '{raw}': {err}") from None
        except yaml.YAMLError:
            raise ConfigError(key, f"value '{raw}' is not valid YAML") from None
    return out


def _load(args: argparse.Namespace) -> SweepConfig:
    return load_sweep(args.file, overrides_from(args))


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from tuner.sweep import expected_trials

    params = ", ".join(f"{k} ({getattr(p, 'type', 'fixed')})" for k, p in cfg.search.params.items())
    print(
        f"ok: {cfg.name}: {cfg.search.algorithm}, {expected_trials(cfg)} trials, "
        f"{cfg.schedule.max_epochs} epochs max, metric {cfg.metric} ({cfg.mode}); params: {params or '-'}"
    )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from tuner.sweep import locate, run_sweep

    where = locate(cfg.output, cfg.name)[1] or cfg.output
    with _resume_hint_on_interrupt(where):
        outcome = run_sweep(
            cfg,
            address=args.address,
            num_cpus=args.num_cpus,
            verbose=args.verbose,
            allow_insecure_cluster=args.allow_insecure_cluster,
        )
    return _print_outcome(outcome)


def cmd_resume(args: argparse.Namespace) -> int:
    from tuner.sweep import AlreadyFinished, resume_sweep

    try:
        with _resume_hint_on_interrupt(args.sweep_dir):
            outcome = resume_sweep(
                args.sweep_dir,
                address=args.address,
                num_cpus=args.num_cpus,
                verbose=args.verbose,
                allow_insecure_cluster=args.allow_insecure_cluster,
            )
    except AlreadyFinished as done:
        print(done)
        return 0
    return _print_outcome(outcome)


class _resume_hint_on_interrupt:
    """A second Ctrl-C stops at once (KeyboardInterrupt): say how to continue, exit 130."""

    def __init__(self, sweep_dir: str):
        self.sweep_dir = sweep_dir

    def __enter__(self) -> None: ...

    def __exit__(self, kind: Any, err: Any, tb: Any) -> bool:
        if kind is KeyboardInterrupt:
            print(f"\ninterrupted; continue with: python -m tuner resume {self.sweep_dir}", file=sys.stderr)
            raise SystemExit(130)
        return False


def _print_outcome(outcome: Any) -> int:
    s = outcome.summary
    print()
    print(outcome.table)
    if s["best"]:
        b = s["best"]
        print(
            f"\nbest: trial {b['trial_id']} {s['metric']}={b['metrics'].get(s['metric']):.4f} "
            f"(epoch {b['epoch']}) config {json.dumps(b['config'])}"
        )
    counts = ", ".join(f"{v} {k}" for k, v in sorted(s["counts"].items()))
    print(f"{len(s['trials'])} trials ({counts}); status {s['status']}")
    print(f"results: {outcome.sweep_dir}")
    print(
        f"see it: python -m tuner board {outcome.sweep_dir}   |   python -m tuner report {outcome.sweep_dir}"
    )
    if s["status"] == "interrupted":
        print(f"interrupted; continue with: python -m tuner resume {outcome.sweep_dir}")
    return outcome.exit_code


def cmd_report(args: argparse.Namespace) -> int:
    from tuner.report import write_report

    written = write_report(args.sweep_dir, args.out)
    if args.format == "md":
        sys.stdout.write(written.markdown)
    where = f"{written.html} (+ {len(written.images)} PNGs, report.md)"
    print(f"report: {where}", file=sys.stderr if args.format == "md" else sys.stdout)
    return 0


def cmd_board(args: argparse.Namespace) -> int:
    from tuner.board import serve

    return serve(args.sweep_dir, bind_all=args.bind_all, port=args.port)


def cmd_schema(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        text = reference_markdown()
    else:
        text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner",
        description="Hyperparameter sweeps of PyTorch models on Ray, from one YAML file.",
        epilog="Exit codes: 0 ok, 1 failed trials or no result, 2 bad input, 130 interrupted.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("sweep", help="run a sweep (starts a private local Ray unless --address)")
    _add_overrides(p)
    _add_runtime(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("resume", help="continue an interrupted sweep from its directory")
    p.add_argument("sweep_dir", help="the sweep's directory, e.g. runs/digits-mlp")
    _add_runtime(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("validate", help="check a sweep file and flags; start nothing")
    _add_overrides(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("report", help="write report.html, report.md and PNGs for a sweep directory")
    p.add_argument("sweep_dir", help="a sweep directory (<output>/<name>), finished, running or interrupted")
    p.add_argument("--out", metavar="DIR", help="write the report here instead of into the sweep directory")
    p.add_argument("--format", choices=["html", "md"], default="html", help="md: also print the Markdown")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("board", help="TensorBoard on a sweep directory (127.0.0.1, a free port)")
    p.add_argument("sweep_dir", help="a sweep directory (<output>/<name>); works while the sweep runs")
    p.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    p.add_argument(
        "--bind-all", action="store_true", help="serve on every interface (no authentication: beware)"
    )
    p.set_defaults(func=cmd_board)

    p = sub.add_parser("schema", help="print the JSON Schema of sweep files (for editors)")
    p.add_argument("-o", "--output", help="write it to this file")
    p.add_argument(
        "--format", choices=["json", "markdown"], default="json", help="markdown: the README reference"
    )
    p.set_defaults(func=cmd_schema)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except DiskFull as err:  # stopped like an interrupt: resumable
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INTERRUPTED
