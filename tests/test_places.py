"""The place contract (issue 45), as tests/test_modes.py is for trial modes: every feature that
writes or reads a sweep does it through the sweep's place (tuner/sweepdir/place.py) and gives
the same files and results on a local directory and in object storage (a real S3 server:
tests/s3server.py), named with a slash at its end or without.

One sweep per place exercises them all, each place's given in the other's spelling where the
spelling could matter:

- `sweep --resume-if-exists` with `search.warm_start: auto` (an earlier sweep of the same task
  beside it, reached by two names on a directory: counted once), `tracking.mlflow` and
  `tracking.wandb` (offline), the TensorBoard best columns and the sweep's run; a second
  driver started beside it (another cache: another machine, as far as the place can tell) is
  refused in one line;
- killed with -9 mid-way, then `resume` of its place named with a slash at the end, from
  another cache: the unfinished trials continue from their checkpoints, in the sweep;
- `sweep --resume-if-exists` again (the first cache): nothing to resume; `extend` by one
  trial; one MLflow run for the sweep through all of it, and one W&B prefix (each run's id
  the sweep's, read back from the place by the resume elsewhere);
- read back by `report`, `export`, `load_best` (the model scores what its trial recorded),
  and a warm start that names it by path.

The two places' sweeps are then compared: summary.json, every trial's journal, the file tree
(names made comparable: trial ids, timestamps), the HParams columns tuner writes, the sweep's
run, warm_start.json, the MLflow and W&B runs, the export; and no file either leaves (the
place, every cache, Ray's session directories) holds a credential from the environment (the
store's key, W&B's API key: Ray Tune hands them to every trial actor's runtime env, which
Ray logs). What differs by design (Ray's own files, a local trial's checkpoints beside a
remote trial's that Ray keeps, W&B's local files) is named where it is left out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tests.conftest import DEBUG, ROOT, cli, files_holding, log_tail
from tuner.search.plan import key
from tuner.sweepdir.files import WANDB_OPEN_FILE

TRIALS, EPOCHS = 3, 3
HELD_LR = 0.002  # the trial held at its second epoch (see _sweep_file)
LOCAL, S3 = "local", "s3"
WANDB_KEY = "places" + "9" * 31 + "key"  # W&B's API key in the environment (offline: never used)


def _sweep_file(project: Path, mlflow: Path) -> Path:
    """debug.yaml on best_task's data (an accuracy computed outside tuner), every trial to
    its last epoch (no early stopping: the same trials run wherever the sweep lives), the
    earlier sweeps of its task told to its searcher."""
    raw = yaml.safe_load(DEBUG.read_text())
    raw["name"] = "c"
    # One trial (lr 0.002: the earlier sweep's, run first) waits at its second epoch while
    # the gate is there: the driver is killed then, whatever the machine's speed.
    gate = {"gate": str(project / "gate"), "hold_lr": HELD_LR, "num_classes": 2}
    raw["task"].update(data="best_task:held", data_args=gate)
    raw["training"]["batch_size"] = 16
    raw["search"].update(num_samples=TRIALS, warm_start="auto")
    raw["schedule"].update(max_epochs=EPOCHS, early_stopping=False)
    raw["tracking"] = {"mlflow": {"uri": f"sqlite:///{mlflow}"}, "wandb": {}}
    path = project / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _earlier(project: Path, sweep_file: Path) -> dict[str, bytes]:
    """An earlier sweep of the same task (what warm start reads of it: sweep.yaml, code.json
    with its fingerprint, finished trials' records and journals), as files by name."""
    from tuner.config import load_sweep, settled, to_yaml
    from tuner.search import warm

    old = os.getcwd()
    os.chdir(project)
    try:
        cfg = load_sweep(sweep_file, {"name": "earlier"})
        text = to_yaml(settled(cfg)[0])
        code = {"import_from": cfg.code_dirs, "fingerprint": warm.fingerprint(cfg)}
    finally:
        os.chdir(old)
    files = {"sweep.yaml": text.encode(), "code.json": json.dumps(code).encode()}
    for i, (lr, acc) in enumerate([(0.05, 0.9), (HELD_LR, 0.6)]):
        config = {"lr": lr, "optimizer": "adam", "width": 16, "depth": 1}
        files[f"e{i}/tuner_trial.json"] = json.dumps(
            {"trial_id": f"e{i}", "status": "TERMINATED", "config": config}
        ).encode()
        rows = [
            {"epoch": e, "val_acc": acc - 0.1 * (EPOCHS - e), "val_loss": 1.0} for e in range(1, EPOCHS + 1)
        ]
        files[f"e{i}/metrics.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return files


class Place:
    """One place under test: where its output is, how to read what is there as files."""

    def __init__(self, kind: str, tmp: Path, s3: Any):
        self.kind, self.tmp, self.s3 = kind, tmp, s3
        if kind == S3:
            self.bucket = s3.make_bucket("places")
            self.output = f"s3://{self.bucket}/out"
        else:
            self.output = str(tmp / "out")
        self.uri = f"{self.output}/c"
        self.ray_tmp = Path("/tmp") / f"tp{uuid.uuid4().hex[:8]}"  # short: Ray's socket paths fit 107 bytes
        clean = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
        self.env = {
            **clean, "TUNER_CACHE_DIR": str(tmp / "cache"), "RAY_TMPDIR": str(self.ray_tmp),
            "WANDB_MODE": "offline", "WANDB_API_KEY": WANDB_KEY,
        }  # fmt: skip
        if kind == S3:
            for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
                self.env.pop(name, None)
            self.env.update(
                s3.env(), AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent"
            )

    def put(self, name: str, files: dict[str, bytes]) -> None:
        for rel, body in files.items():
            if self.kind == S3:
                self.s3.client().put_object(Bucket=self.bucket, Key=f"out/{name}/{rel}", Body=body)
            else:
                path = Path(self.output) / name / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
        if self.kind == LOCAL:  # a second name for it: a sweep counted once however reached
            (Path(self.output) / f"{name}-link").symlink_to(Path(self.output) / name)

    def files(self) -> Path:
        """The sweep as a directory read independently of tuner (the bucket's keys downloaded
        with boto3 for S3)."""
        if self.kind == LOCAL:
            return Path(self.uri)
        root = self.tmp / "downloaded"
        shutil.rmtree(root, ignore_errors=True)
        for k in self.s3.keys(self.bucket, "out/c/"):
            path = root / k[len("out/c/") :]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.s3.read(self.bucket, k))
        return root

    def states(self) -> dict[str, tuple[str, int, bool]]:
        """trial -> (status, epochs in its journal, has a checkpoint), as the place holds it now."""
        out: dict[str, list[Any]] = {}
        if self.kind == S3:
            names = [k[len("out/c/") :] for k in self.s3.keys(self.bucket, "out/c/")]
        else:
            base = Path(self.uri)
            names = (
                [str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()] if base.exists() else []
            )
        for rel in names:
            parts = rel.split("/")
            if len(parts) < 2:
                continue
            s = out.setdefault(parts[0], [None, 0, False])
            if parts[1] == "tuner_trial.json":
                s[0] = json.loads(self._read(rel)).get("status")
            elif parts[1] == "metrics.jsonl":
                s[1] = len(self._read(rel).splitlines())
            elif parts[1].startswith("checkpoint_"):
                s[2] = True
        return {k: tuple(v) for k, v in out.items()}  # type: ignore[misc]

    def wandb_open(self) -> list[str]:
        """The trials the place's list of open W&B runs names (WANDB_OPEN_FILE), sorted."""
        if self.kind == S3:
            present = f"out/c/{WANDB_OPEN_FILE}" in self.s3.keys(self.bucket, "out/c/")
        else:
            present = (Path(self.uri) / WANDB_OPEN_FILE).is_file()
        return sorted(self._read(WANDB_OPEN_FILE).decode().split()) if present else []

    def _read(self, rel: str) -> bytes:
        if self.kind == S3:
            return self.s3.read(self.bucket, f"out/c/{rel}")
        return (Path(self.uri) / rel).read_bytes()


def _tuner(
    place: Place, project: Path, *args: str, env: Optional[dict[str, str]] = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=project, env=env or place.env, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def _exercise(place: Place, project: Path, sweep_file: Path) -> dict[str, Any]:
    """Every feature on `place`; what they left, made comparable (see the module)."""
    place.put("earlier", _earlier(project, sweep_file))
    slash = "/" if place.kind == S3 else ""  # the two spellings, each place one of each
    unslash = "" if slash else "/"
    first = [str(sweep_file), "--output", place.output + slash, "--resume-if-exists"]
    gate = project / "gate"
    gate.touch()
    log = open(place.tmp / "driver.log", "w")
    driver = subprocess.Popen(
        [sys.executable, "-m", "tuner", "sweep", *first],
        cwd=project, env=place.env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    refused: list[str] = []
    try:
        deadline = time.monotonic() + 600  # (a hang guard)
        while True:
            states = place.states()
            done = [s for s in states.values() if s[0] == "TERMINATED"]
            midway = [t for t, s in states.items() if s[0] == "RUNNING" and s[2] and 1 <= s[1] < EPOCHS]
            if not refused and states:  # it runs: a second driver elsewhere (its own cache)
                other = {**place.env, "TUNER_CACHE_DIR": str(place.tmp / "other-cache")}
                for extra in ([], ["--resume-if-exists"]):
                    again = cli(
                        "sweep", str(sweep_file), "--output", place.output, *extra, env=other, cwd=project
                    )
                    refused.append(f"{again.returncode} {again.stderr.strip()}")
            # (the held one, its first epoch kept; and the place's list of open W&B runs down
            # to it: killed after a trial's end reached the place but before the list did, the
            # resume ends that trial's run once more, a part more than where the list had landed)
            if len(done) == TRIALS - 1 and midway and place.wandb_open() == midway:
                break
            if driver.poll() is not None or time.monotonic() > deadline:
                why = "the sweep ended (or never got) before two trials finished and the third waited"
                pytest.fail(f"{why}: {states}\n{log_tail(place.tmp / 'driver.log')}")
            time.sleep(0.2)
    finally:
        driver.kill()  # kill -9
        driver.wait(timeout=60)
        gate.unlink()
    _unheld(place)
    for line in refused:
        assert line.startswith("2 error: ") and "is in use by another tuner run" in line, refused
        assert len(line.splitlines()) == 1, line
    # Resumed from another cache (another machine, as far as the place can tell): what it needs
    # of the sweep (the MLflow run's id included) comes from the place, not a working copy.
    elsewhere = {**place.env, "TUNER_CACHE_DIR": str(place.tmp / "resume-cache")}
    resumed = _tuner(place, project, "resume", place.uri + slash, env=elsewhere)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"-> {place.uri}\n" in resumed.stdout, resumed.stdout
    again = cli("sweep", *first, env=place.env, cwd=project)
    assert again.returncode == 0 and "nothing to resume" in again.stdout, again.stdout + again.stderr
    grown = _tuner(place, project, "extend", place.uri + unslash, "--num-samples", "1")
    assert grown.returncode == 0, grown.stdout[-3000:] + grown.stderr[-3000:]
    seen = _read_back(place, project)
    secrets = [WANDB_KEY] + ([place.s3.key_id, place.s3.secret] if place.kind == S3 else [])
    assert next(place.ray_tmp.glob("*/ray/session_*/logs/raylet.out"))  # (where its Rays were)
    assert not files_holding(secrets, place.tmp, place.ray_tmp, project / f"mlflow-{place.kind}.db")
    root = place.files()
    seen["continued"] = "resumed at epoch" in "".join(
        (root / t / "trial.log").read_text() for t in seen.pop("trial_ids")
    )
    return seen


def _unheld(place: Place, within_s: float = 120) -> None:
    """Wait until no run holds the place: `python -m tuner` killed with -9 takes its driver (a
    child process, tuner/driver/stopping.py) down with it, a moment later (conftest.unheld)."""
    from tuner.config import ConfigError
    from tuner.sweepdir import place_of

    deadline = time.monotonic() + within_s  # (a hang guard)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in place.env.items():
            mp.setenv(k, v)
        while True:
            try:
                place_of(place.uri).refuse_if_held()
                return
            except ConfigError:
                assert time.monotonic() < deadline, "the killed driver still holds the place"
                time.sleep(0.05)


def _read_back(place: Place, project: Path) -> dict[str, Any]:
    """The readers (report, export, load_best, warm start by path) on the place, and the
    place's files read independently."""
    from tests.best_task import accuracy

    report = cli("report", place.uri, "--format", "md", env=place.env, cwd=project)
    assert report.returncode == 0, report.stderr
    exported = place.tmp / "exported"
    out = cli("export", place.uri, "--output", str(exported), env=place.env, cwd=project)
    assert out.returncode == 0, out.stderr
    root = place.files()
    summary = json.loads((root / "summary.json").read_text())
    with pytest.MonkeyPatch.context() as mp:
        for k, v in place.env.items():
            mp.setenv(k, v)
        mp.chdir(project)
        mp.syspath_prepend(str(project))
        import tuner
        from tuner.config import load_sweep
        from tuner.search import warm
        from tuner.sweepdir import place_for

        correct, n = accuracy(tuner.load_best(place.uri))
        by_path = load_sweep(project / "sweep.yaml", {"name": "d", "search.warm_start": [place.uri + "/"]})
        sources = warm.sources(by_path, place_for(place.output, "d"))
        used = [(Path(s.sweep).name, s.trials, len(s.used)) for s in warm.load(by_path, sources)]
    assert correct == round(summary["best"]["metrics"]["val_acc"] * n)
    assert summary["best"]["trial_id"] in report.stdout
    return {
        "trial_ids": [t["trial_id"] for t in summary["trials"]],
        "summary": _summary(summary),
        "journals": _journals(root, summary),
        "tree": _tree(root, summary),
        "board": _board(root, summary),
        "warm_start": [
            {**s, "sweep": Path(s["sweep"]).name}
            for s in json.loads((root / "warm_start.json").read_text())["sources"]
        ],
        "mlflow": _mlflow(project / f"mlflow-{place.kind}.db"),
        "wandb": _wandb(place, summary),
        "export": _untimed(json.loads((exported / "metrics.json").read_text())),
        "best": _untimed(json.loads((root / "best" / "metrics.json").read_text())),
        "warm_by_path": used,
    }


def _untimed(metrics: dict[str, Any]) -> dict[str, Any]:
    """An epoch's metrics without how long it took (the machine's, not the place's)."""
    return {k: v for k, v in metrics.items() if k not in ("epoch_time_s", "samples_per_s", "wall_time")}


def _named(summary: dict[str, Any]) -> dict[str, str]:
    """trial id -> the trial's configuration as a key (ids are Tune's, random)."""
    return {t["trial_id"]: key(t["config"]) for t in summary["trials"]}


def _summary(summary: dict[str, Any]) -> dict[str, Any]:
    def origin(t: dict[str, Any]) -> Any:  # start_with, or the earlier sweep's place: its name
        return t.get("origin") if t.get("origin") in (None, "start_with") else Path(t["origin"]).name

    trials = sorted(
        (key(t["config"]), t["status"], t["epochs"], t["best_value"], origin(t)) for t in summary["trials"]
    )
    sources = [Path(s["sweep"]).name for s in summary.get("warm_start", [])]
    return {"trials": trials, "status": summary["status"], "counts": summary["counts"], "sources": sources}


def _journals(root: Path, summary: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    out = {}
    for trial, name in _named(summary).items():
        rows = [json.loads(r) for r in (root / trial / "metrics.jsonl").read_text().splitlines()]
        out[name] = [(r["epoch"], r["val_acc"]) for r in rows]
    return out


# Left out of the comparison, by design: Ray's own state files of the driver (named by the
# time it started) and of a trial (its loggers' files, there or not as a kill caught them:
# tuner reads none of them); how checkpoints are kept (a local trial's own files, Tune's
# directories in object storage); the local lock file (the bucket's lease is removed at the
# end); the report, which a reader writes beside its own copy of a sweep in object storage
# (where its user opens it), never into the bucket (readers do not write the sweep); W&B's own
# files, in the driver's working copy (compared as runs: _wandb).
_NOT_COMPARED = re.compile(
    r"^(experiment_state|basic-variant-state|search_gen_state|searcher-state)-.*|tuner\.pkl|\.validate_storage_marker"
    r"|^report\.(html|md)$|^[a-z_]+\.png$|(^|/)(params\.json|params\.pkl|progress\.csv|result\.json)$"
    r"|^wandb/"
)
_CHECKPOINTS = re.compile(r"(^|/)(checkpoint_e\d{6}\.pt|checkpoint_\d{6}(/.*)?)$")
_EVENTS = re.compile(r"events\.out\.tfevents\.\d+\.[^/]+?(\.\d+)?(\.[a-z-]+)?$")


def _tree(root: Path, summary: dict[str, Any]) -> list[str]:
    named = _named(summary)
    out = set()
    for p in root.rglob("*"):
        rel = str(p.relative_to(root))
        if not p.is_file() or _NOT_COMPARED.search(rel) or _CHECKPOINTS.search(rel) or rel == ".tuner.lock":
            continue
        first, _, rest = rel.partition("/")
        rel = f"<{named[first]}>/{rest}" if first in named else rel
        out.add(_EVENTS.sub(lambda m: f"events.out.tfevents{m.group(2) or ''}", rel))
    return sorted(out)


def _board(root: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """What tuner writes for TensorBoard: each trial's best columns and outcome (their last
    values), and the sweep run's last point."""
    from tests import tbread

    out: dict[str, Any] = {}
    for trial, name in _named(summary).items():
        values: dict[str, float] = {}
        for f in sorted((root / trial).glob("events.out.tfevents.*.tuner-best")):  # (by time: each driver's)
            values.update({t: v[-1] for t, v in tbread.scalars(f).items()})
        out[name] = values
    run = {t: v[-1] for f in sorted((root / "sweep").glob("events.*")) for t, v in tbread.scalars(f).items()}
    out["<sweep>"] = {t: v for t, v in run.items() if not t.endswith(("_s", "/time"))}
    return out


def _wandb(place: Place, summary: dict[str, Any]) -> dict[str, Any]:
    """The W&B offline runs, by their ids (W&B's file names: run-<id>.wandb, a part per
    driver that opened the run) in the driver's working copies (in object storage: both
    caches', the killed driver's and the resume's elsewhere; W&B's files are not uploaded)."""
    parts: dict[str, int] = {}
    for f in place.tmp.rglob("wandb/offline-run-*/run-*.wandb"):
        run_id = f.stem[len("run-") :]
        parts[run_id] = parts.get(run_id, 0) + 1
    named = _named(summary)
    ids = [run_id.split("-", 1) for run_id in parts]  # (the sweep's prefix, the trial's name)
    return {
        "prefixes": len({prefix for prefix, _ in ids}),
        "runs": sorted((named.get(name, name), parts[f"{prefix}-{name}"]) for prefix, name in ids),
    }


def _mlflow(db: Path) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return {
        "parents": len(runs) - len(children),
        "children": sorted(
            (
                key({k: yaml.safe_load(v) for k, v in r.data.params.items()}),
                r.info.status,
                r.data.metrics.get("val_acc"),
            )
            for r in children
        ),
    }


@pytest.mark.slow
def test_every_feature_gives_the_same_on_every_place(s3, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "tests" / "best_task.py", project / "best_task.py")
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    seen = {}
    for kind in (LOCAL, S3):
        base = tmp_path / kind
        base.mkdir()
        sweep_file = _sweep_file(project, project / f"mlflow-{kind}.db")
        place = Place(kind, base, s3)
        try:
            seen[kind] = _exercise(place, project, sweep_file)
        finally:
            shutil.rmtree(place.ray_tmp, ignore_errors=True)
    local, remote = seen[LOCAL], seen[S3]
    assert local["continued"] and remote["continued"]  # from checkpoints, after the kill
    assert len(local["summary"]["trials"]) == TRIALS + 1
    assert [s["sweep"] for s in local["warm_start"]] == ["earlier"]  # once, with its link
    assert local["mlflow"]["parents"] == 1  # one MLflow run for the sweep, through kill, resume, extend
    assert local["wandb"]["prefixes"] == 1 and len(local["wandb"]["runs"]) == TRIALS + 1, local["wandb"]
    differ = {part: (local[part], remote[part]) for part in local if local[part] != remote[part]}
    (tmp_path / "differ.json").write_text(json.dumps(differ, indent=1, default=str))
    assert not differ, f"{sorted(differ)} differ (each place's in {tmp_path / 'differ.json'})"
