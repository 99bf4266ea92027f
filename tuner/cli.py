"""`python -m tuner`: sweep, resume, extend, validate, report, board, export, schema, cluster, submit.

The one command-line program. User mistakes (a bad file, an impossible request, an existing
sweep directory) print one line naming the field and exit 2, before Ray or torch start.
Exit codes: tuner.errors.ExitCode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional

from tuner import timeline
from tuner.cluster import local, submit
from tuner.cluster.connect import add_runtime_flags, runtime_from
from tuner.config import ConfigError, SweepConfig, json_schema, load_sweep, reference_markdown
from tuner.config.flags import add_overrides, add_resume_flag, overrides_from
from tuner.config.schedule import webhook_url
from tuner.errors import EXIT_HELP, DiskFull, ExitCode, StorageUnavailable
from tuner.results import Outcome, number
from tuner.sweepdir import EXPORT_FILES, NEVER_STARTED

__all__ = ["build_parser", "main", "overrides_from"]


def _load(args: argparse.Namespace) -> SweepConfig:
    return load_sweep(args.file, overrides_from(args))


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    params = ", ".join(f"{k} ({getattr(p, 'type', 'fixed')})" for k, p in cfg.search.params.items())
    print(
        f"ok: {cfg.name}: {cfg.search.algorithm} + {cfg.scheduler.name}, {cfg.expected_trials()} trials, "
        f"{cfg.schedule.max_epochs} epochs max, {_objectives(cfg)}; params: {params or '-'}"
    )
    return ExitCode.OK


def _objectives(cfg: SweepConfig) -> str:
    """`metric val_acc (max)`, or `metrics val_acc (max), num_params (min)` with several."""
    both = ", ".join(f"{name} ({direction})" for name, direction in cfg.objectives)
    return ("metrics " if len(cfg.objectives) > 1 else "metric ") + both


def cmd_sweep(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from tuner.driver.notify import Notifying
    from tuner.driver.sweep import AlreadyFinished, locate, run_sweep, sweep_or_resume

    where = locate(cfg.output, cfg.name).uri
    go = sweep_or_resume if args.resume_if_exists else run_sweep
    try:
        with Notifying(cfg.notify.webhook, cfg.name, where) as note, _resume_hint_on_interrupt(where):
            outcome = go(cfg, runtime_from(args))
            note.done(outcome.summary)
    except AlreadyFinished as done:  # (--resume-if-exists: a job run again after it succeeded)
        print(done)
        return ExitCode.OK
    return _print_outcome(outcome)


def cmd_resume(args: argparse.Namespace) -> int:
    from tuner.driver.sweep import resume_sweep

    again = args.retry_failed
    return _continue(args, lambda place, runtime: resume_sweep(place, runtime, retry_failed=again))


def cmd_extend(args: argparse.Namespace) -> int:
    from tuner.driver.sweep import extend_sweep

    return _continue(args, lambda place, runtime: extend_sweep(place, args.num_samples, runtime))


def _continue(args: argparse.Namespace, go: Callable[[Any, Any], Any]) -> int:
    """resume and extend: a sweep directory run on, notifying its webhook (or --notify's)."""
    from tuner.driver.notify import Notifying
    from tuner.driver.sweep import AlreadyFinished
    from tuner.sweepdir import place_of

    place = place_of(args.sweep_dir, "sweep_dir")
    place.check()  # (object storage: reachable, in one line)
    place.refuse_if_held()  # another run's: say so before anything else
    cfg = place.config()  # a ConfigError (exit 2) if it holds no sweep
    notifying = Notifying(_webhook(args, cfg), cfg.name, place.uri)
    try:
        with notifying as note, _resume_hint_on_interrupt(place.uri):
            outcome = go(place, runtime_from(args))
            note.done(outcome.summary)
    except AlreadyFinished as done:
        print(done)
        return ExitCode.OK
    return _print_outcome(outcome)


def _webhook(args: argparse.Namespace, cfg: SweepConfig) -> Optional[str]:
    """notify.webhook for this run: resume's and extend's --notify, else the sweep's."""
    again = args.command in ("resume", "extend") and args.notify
    return webhook_url(args.notify, "--notify") if again else cfg.notify.webhook


class _resume_hint_on_interrupt:
    """A second Ctrl-C stops at once (KeyboardInterrupt): say how to continue, exit 130."""

    def __init__(self, sweep_dir: str):
        self.sweep_dir = sweep_dir

    def __enter__(self) -> None: ...

    def __exit__(self, kind: Any, err: Any, tb: Any) -> bool:
        if kind is KeyboardInterrupt:
            print(f"\ninterrupted; continue with: python -m tuner resume {self.sweep_dir}", file=sys.stderr)
            raise SystemExit(ExitCode.INTERRUPTED)
        return False


def _print_outcome(outcome: Any) -> int:
    s = outcome.summary
    print()
    print(outcome.table)
    if s["best"]:
        b = s["best"]
        print(
            f"\nbest: trial {b['trial_id']} {s['metric']}={number(b['metrics'].get(s['metric']))} "
            f"(epoch {b['epoch']}) config {json.dumps(b['config'])}"
        )
    if "pareto" in s:
        names = " vs ".join(name for name, _ in s["objectives"])
        print(f"pareto front ({names}): {len(s['pareto'])} trials, marked * above (summary.json's pareto)")
    counts = ", ".join(f"{v} {k}" for k, v in sorted(s["counts"].items()))
    print(f"{len(s['trials'])} trials ({counts}); status {s['status']}")
    print(f"results: {outcome.sweep_dir}")
    model = os.path.join(outcome.sweep_dir, "best", "model.pt")
    if s["best"] and os.path.isfile(model):
        print(f"best model: {model} (+ config.json, metrics.json; tuner.load_best, tuner export)")
    print(
        f"see it: python -m tuner board {outcome.sweep_dir}   |   python -m tuner report {outcome.sweep_dir}"
    )
    if s["status"] == "interrupted":
        print(f"interrupted; continue with: python -m tuner resume {outcome.sweep_dir}")
    never = sum(1 for t in s["trials"] if t.get(NEVER_STARTED))
    if never:
        print(
            f"{never} trial(s) Ray Tune could not start (none of your code ran); "
            f"run them with: python -m tuner resume {outcome.sweep_dir}"
        )
    if s["status"] == "failed":  # failure.fail_fast
        print(
            f"stopped: its first trials all failed with {s['error']}; "
            f"fix it, then: python -m tuner resume {outcome.sweep_dir} --retry-failed"
        )
    elif failed := sum(n for word, n in s["counts"].items() if Outcome.parse(word).failed) - never:
        print(
            f"{failed} trial(s) failed; to run them again (after fixing the cause): "
            f"python -m tuner resume {outcome.sweep_dir} --retry-failed"
        )
    return outcome.exit_code


def cmd_report(args: argparse.Namespace) -> int:
    if len(args.sweep_dir) > 1:
        from tuner.view.compare import write_comparison

        if not args.out:
            raise ConfigError("--output", "comparing sweeps needs --output DIR (where the comparison goes)")
        written = write_comparison(args.sweep_dir, args.out)
    else:
        from tuner.view.report import write_report

        written = write_report(args.sweep_dir[0], args.out)
    if args.format == "md":
        sys.stdout.write(written.markdown)
    where = f"{written.html} (+ {len(written.images)} PNGs, {os.path.basename(written.html)[:-5]}.md)"
    print(f"report: {where}", file=sys.stderr if args.format == "md" else sys.stdout)
    return ExitCode.OK


def cmd_refine(args: argparse.Namespace) -> int:
    from tuner.view.refine import refine

    path, params = refine(args.sweep_dir, args.output)
    print(f"refined: {path} ({', '.join(params)}); run it with: python -m tuner sweep {path}")
    return ExitCode.OK


def cmd_board(args: argparse.Namespace) -> int:
    from tuner.view.board import serve

    return serve(args.sweep_dir, bind_all=args.bind_all, port=args.port)


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.view.export import export

    where = export(args.sweep_dir, args.trial, args.format, args.output)
    print(f"exported: {os.path.join(where, EXPORT_FILES[args.format])} (+ config.json, metrics.json)")
    return ExitCode.OK


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
    return ExitCode.OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner",
        description="Hyperparameter sweeps of PyTorch models on Ray, from one YAML file.",
        epilog=EXIT_HELP,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "sweep",
        help="run a sweep (starts a private local Ray unless --address)",
        description="Run the sweep a YAML file describes. Its task is tuner's loop over a model and "
        "data, your loop (task.train), or your own training script run as a process per trial "
        "(task.command: 'python train.py --lr {lr}', reporting with tuner.report(epoch=..., "
        "val_loss=...); docs/how-to/own-script.md).",
    )
    add_overrides(p)
    add_runtime_flags(p)
    add_resume_flag(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("resume", help="continue an interrupted sweep from its directory")
    p.add_argument("sweep_dir", help="the sweep's directory, e.g. runs/digits-mlp")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="also run the trials that failed (error, oom, timeout, diverged) again, from scratch with "
        "their configurations (after fixing the cause); their first runs are kept in <sweep>/retried/",
    )
    p.add_argument("--notify", metavar="URL", help="notify.webhook for this run (default: the sweep's)")
    add_runtime_flags(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("extend", help="add trials to a sweep (not grid), its searcher told every result")
    p.add_argument("sweep_dir", help="the sweep's directory, e.g. runs/digits-mlp")
    p.add_argument("--num-samples", type=int, required=True, metavar="N", help="trials to add (>= 1)")
    p.add_argument("--notify", metavar="URL", help="notify.webhook for this run (default: the sweep's)")
    add_runtime_flags(p)
    p.set_defaults(func=cmd_extend)

    p = sub.add_parser("validate", help="check a sweep file and flags; start nothing")
    add_overrides(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "report", help="write report.html, report.md and PNGs for a sweep directory (several: compare them)"
    )
    p.add_argument(
        "sweep_dir",
        nargs="+",
        help="a sweep directory (<output>/<name>), finished, running or interrupted; several: one "
        "comparison report (compare.html) of sweeps of one metric, into --output",
    )
    p.add_argument(
        "--output",
        "--out",
        dest="out",
        metavar="DIR",
        help="write the report here instead of into the sweep directory (needed to compare sweeps)",
    )
    p.add_argument("--format", choices=["html", "md"], default="html", help="md: also print the Markdown")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "refine", help="write a narrower sweep file around a sweep's best trials, warm-started from it"
    )
    p.add_argument("sweep_dir", help="a finished (or interrupted) sweep directory")
    p.add_argument(
        "--output", "-o", metavar="FILE", help="the sweep file to write (default: <name>_refined.yaml here)"
    )
    p.set_defaults(func=cmd_refine)

    p = sub.add_parser("board", help="TensorBoard on sweep directories (127.0.0.1, a free port)")
    p.add_argument(
        "sweep_dir",
        nargs="+",
        help="a sweep directory (<output>/<name>), or several side by side; works while sweeps run",
    )
    p.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    p.add_argument(
        "--bind-all", action="store_true", help="serve on every interface (no authentication: beware)"
    )
    p.set_defaults(func=cmd_board)

    p = sub.add_parser(
        "export",
        help="write a trial's best weights (default: the sweep's best): model.pt, config.json, metrics.json",
    )
    p.add_argument("sweep_dir", help="the sweep's directory, e.g. runs/digits-mlp")
    p.add_argument("--trial", metavar="ID", help="this trial's best epoch (default: the sweep's best trial)")
    p.add_argument(
        "--format",
        choices=list(EXPORT_FILES),
        default="state_dict",
        help="besides model.pt (a plain state dict): model.ts.pt (TorchScript) or model.onnx "
        "(needs the onnx extra); not for task.train sweeps",
    )
    p.add_argument(
        "--output",
        metavar="DIR",
        help="where (default: <sweep>/best/, or <sweep>/exports/<ID>/ with --trial); an existing "
        "directory is replaced only if it is empty or an earlier export",
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("schema", help="print the JSON Schema of sweep files (for editors)")
    p.add_argument("-o", "--output", help="write it to this file")
    p.add_argument(
        "--format",
        choices=["json", "markdown"],
        default="json",
        help="markdown: the table of docs/reference/sweep-file.md",
    )
    p.set_defaults(func=cmd_schema)

    local.add_parser(sub)
    submit.add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None, watch: bool = False) -> int:
    """The command line. `watch` (`python -m tuner`): a command that starts a private local Ray
    runs in a child process this one watches (driver/stopping.py: `watched`)."""
    timeline.mark("cli")  # (the imports done)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # `submit` passes its words on as given
    func: Callable[[argparse.Namespace], int] = args.func

    def run() -> int:
        try:
            return int(func(args))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return ExitCode.USAGE
        except (DiskFull, StorageUnavailable) as err:  # stopped like an interrupt: resumable
            print(f"error: {err}", file=sys.stderr)
            return ExitCode.INTERRUPTED

    if watch and _starts_local_ray(args):
        from tuner.driver.stopping import watched

        return watched(run, lambda code, notified: _settle(args, code, notified))
    return run()


def _starts_local_ray(args: argparse.Namespace) -> bool:
    """Whether the command runs a sweep on a private local Ray of its own."""
    if args.command not in ("sweep", "resume", "extend"):
        return False
    try:
        return not runtime_from(args).joins_cluster()
    except ConfigError:  # (said by the command itself)
        return False


def _settle(args: argparse.Namespace, code: int, notified: bool) -> int:
    """The end of a sweep whose driver was ended with its Ray by a stop signal: summary.json
    from what the trials recorded, notify.webhook told (unless the driver did: `notified`), the
    table, how to continue; the exit code."""
    from tuner.driver.notify import Notifying
    from tuner.driver.sweep import locate, settle
    from tuner.sweepdir import place_of

    note = Notifying(None, "", "")
    try:
        if args.command == "sweep":
            cfg = _load(args)
            where = locate(cfg.output, cfg.name).uri
        else:
            where = args.sweep_dir
            cfg = place_of(where, "sweep_dir").config()
        note = Notifying(None if notified else _webhook(args, cfg), cfg.name, where)
        outcome = settle(where)
        if outcome is None:
            note.ended("interrupted")
            print(f"\nstopped (exit {code}) before the sweep began: nothing to continue", file=sys.stderr)
            return ExitCode.INTERRUPTED
        note.done(outcome.summary)
        print(f"\n[tuner] the sweep's driver ended (exit {code}) after a stop signal; its trials' records:")
        return _print_outcome(outcome)
    except ConfigError as err:  # (its sweep.yaml unreadable, say: resume will say so again)
        note.ended("interrupted", str(err))
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except OSError:  # (a terminal gone with its hangup: summary.json is written and told first)
        note.ended("interrupted")
        return ExitCode.INTERRUPTED
