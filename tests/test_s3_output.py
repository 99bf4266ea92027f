"""`output: s3://bucket/prefix` against a real S3-compatible server (moto's, tests/s3server.py):
what cannot work is refused in one line naming the output and the cause, before Ray starts.
(Whole sweeps into the server: tests/test_places.py, every feature on a directory and in S3,
credentials in no file left; read back from elsewhere: tests/test_cluster_s3.py.)"""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

import pytest

from tests.conftest import debug_config
from tuner.config import ConfigError
from tuner.sweepdir import remote


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def _refusal(output: str) -> str:
    with pytest.raises(ConfigError) as err:
        remote.check_output(output)
    line = f"error: {err.value}"
    assert "\n" not in line and err.value.path == "output"
    return line


def test_a_reachable_bucket_with_our_credentials_passes(s3_env) -> None:
    bucket = s3_env.make_bucket("good")
    remote.check_output(f"s3://{bucket}/runs")
    remote.check_output(f"s3://{bucket}")  # the bucket's top


def test_bad_s3_outputs_are_one_line_naming_the_output_and_the_cause(
    s3_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = s3_env.secret
    bucket = s3_env.make_bucket("present")
    missing = _refusal("s3://no-such-bucket/runs")
    assert missing.startswith("error: output: s3://no-such-bucket/runs: bucket 'no-such-bucket' does not")
    assert s3_env.endpoint in missing

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + secret)
    wrong = _refusal(f"s3://{bucket}/runs")
    assert "refused the credentials (SignatureDoesNotMatch" in wrong, wrong
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTKNOWNHERE0000")
    unknown = _refusal(f"s3://{bucket}/runs")
    assert "refused the credentials (InvalidAccessKeyId" in unknown, unknown

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    none = _refusal(f"s3://{bucket}/runs")
    assert "no S3 credentials found" in none

    for k, v in s3_env.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://user:pw@127.0.0.1:{_closed_port()}")
    away = _refusal(f"s3://{bucket}/runs")
    assert "does not answer (AWS_ENDPOINT_URL)" in away and "pw@" not in away, away
    for line in (missing, wrong, unknown, none, away):
        assert secret not in line and "not-" + secret not in line


def test_the_driver_checks_an_s3_output_before_ray_starts(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.driver import sweep

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for an output that cannot work")

    monkeypatch.setattr(sweep, "connect", no_ray)
    cfg = debug_config(tmp_path, output="s3://no-such-bucket/runs")
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket' does not exist") as err:
        sweep.run_sweep(cfg)
    assert err.value.path == "output"


def test_a_failed_trial_set_aside_in_s3_leaves_its_name_empty_in_the_bucket(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resume --retry-failed` of an s3:// sweep: a failed trial's first run moves to retried/
    in the mirror and in the bucket (a trial continues from what the bucket holds under its
    name: left there, the run again would not start from scratch)."""
    from tuner.driver.sweep import _set_aside
    from tuner.sweepdir import place_of

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    bucket = s3_env.make_bucket(f"aside-{uuid.uuid4().hex[:8]}")
    mirror = place_of(f"s3://{bucket}/runs/s")
    for key in ("t1/metrics.jsonl", "t1/checkpoint_000001/state.pt", "t2/metrics.jsonl"):
        s3_env.client().put_object(Bucket=bucket, Key=f"runs/s/{key}", Body=b"x")
    mirror.pull()
    _set_aside(mirror, "t1")
    moved = ["retried/t1/checkpoint_000001/state.pt", "retried/t1/metrics.jsonl", "t2/metrics.jsonl"]
    assert sorted(s3_env.keys(bucket)) == [f"runs/s/{k}" for k in moved]
    assert (Path(mirror.local) / "retried" / "t1" / "metrics.jsonl").is_file()
    assert not (Path(mirror.local) / "t1").exists()


def test_a_place_reaches_the_store_its_environment_names_not_one_an_earlier_place_used(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsspec hands back the file system made before with the same arguments, whose client
    kept the endpoint and key of the environment it was first used in: in one process, a
    place made after they changed reached the old store (CI: another test's server, 'The
    specified bucket does not exist'). Here the earlier place's key is one the store refuses."""
    from tuner.errors import StorageUnavailable
    from tuner.sweepdir import place_of

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNER_S3_PATIENCE_S", "0")  # (a refused key: at once, not retried)
    bucket = s3_env.make_bucket(f"moved-{uuid.uuid4().hex[:8]}")
    s3_env.client().put_object(Bucket=bucket, Key="runs/s/sweep.yaml", Body=b"name: s\n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTKNOWNHERE0000")
    with pytest.raises(StorageUnavailable):
        place_of(f"s3://{bucket}/runs/s").exists()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_env.key_id)
    assert place_of(f"s3://{bucket}/runs/s").exists()


def test_a_key_leading_outside_the_sweep_is_never_written_outside_the_cache(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44 item 10: anyone who may write the bucket put `runs/debug/../../../../../X`
    beside a sweep; every reader (report, board, export, load_best) pulled it into the file
    the key's `..` names, outside the cache, overwriting it."""
    from tuner.config import settled, to_yaml
    from tuner.view import analysis

    cache = tmp_path / "a" / "b" / "c" / "d" / "cache"
    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))
    bucket = s3_env.make_bucket("traversal")
    client = s3_env.client()
    text = to_yaml(settled(debug_config(tmp_path, output=f"s3://{bucket}/runs"))[0])
    client.put_object(Bucket=bucket, Key="runs/debug/sweep.yaml", Body=text.encode())
    client.put_object(Bucket=bucket, Key="runs/debug/t1/tuner_trial.json", Body=b'{"trial_id": "t1"}')
    # Five names up from the working copy (<cache>/<copy>/traversal/runs/debug) at most; the
    # victim is wherever any copy's `..` walk ends, a file the user had.
    victims = [tmp_path / "a" / "b" / "c" / "d" / "victim", tmp_path / "a" / "b" / "c" / "victim"]
    for v in victims:
        v.parent.mkdir(parents=True, exist_ok=True)
        v.write_text("mine\n")
    for key in ("runs/debug/../../../../../victim", "runs/debug/../../../../../../victim"):
        client.put_object(Bucket=bucket, Key=key, Body=b"theirs\n")
    assert any(".." in k for k in s3_env.keys(bucket, "runs/debug/"))  # the store keeps them as they are
    before = {p for p in tmp_path.rglob("*")}
    try:
        analysis.load(f"s3://{bucket}/runs/debug")
    except ConfigError:
        pass  # (the trial has no journal: what matters is what the pull wrote)
    assert all(v.read_text() == "mine\n" for v in victims)
    written = {p for p in tmp_path.rglob("*")} - before
    assert written and all(p == cache or cache in p.parents for p in written), sorted(map(str, written))


def test_a_storage_uri_naming_a_parent_is_refused_at_validate(tmp_path: Path) -> None:
    """Issue 44 item 11: `output: s3://bkt/../../../r/victim` passed validate, and the sweep
    removed the local directory its working copy's path resolved to."""
    from tests.conftest import DEBUG, cli

    for output in ("s3://bkt/../../r/victim", "s3://bkt/runs/./x", "s3://bkt/runs//x", "s3://../runs"):
        out = cli("validate", str(DEBUG), "--output", output)
        assert out.returncode == 2, (output, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: output: {output}"), out.stderr
    out = cli("resume", "s3://bkt/runs/../debug")
    assert out.returncode == 2 and out.stderr.startswith("error: sweep_dir: s3://bkt/runs/../debug"), (
        out.stderr
    )
    assert cli("validate", str(DEBUG), "--output", "gs://bkt/runs").returncode == 2


def test_a_place_is_named_once_whatever_slashes_it_is_given_with() -> None:
    from tuner.sweepdir import place_for, place_of

    a = place_for("s3://bkt/runs/", "debug")
    for same in (
        place_of("s3://bkt/runs/debug/"),
        place_of("s3://bkt/runs/debug"),
        place_for("s3://bkt/runs", "debug"),
    ):
        assert (same.uri, same.local, same.ray_storage()[0::2]) == (a.uri, a.local, a.ray_storage()[0::2])
    assert a.uri == "s3://bkt/runs/debug" and a.ray_storage()[0::2] == ("bkt/runs", "debug")
    with pytest.raises(ConfigError, match="not one directory name"):
        place_for("s3://bkt/runs", "../x")
    with pytest.raises(ConfigError, match="not the bucket itself"):
        place_of("s3://bkt/")


def test_a_reader_beside_the_driver_never_touches_the_driver_s_working_copy(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44 item 15: `tuner report` (or load_best) of an s3 sweep while its driver ended
    pulled the bucket into the driver's own working copy: a record the driver had just
    written there (TERMINATED, its upload not yet done) went back to the bucket's RUNNING,
    and a later resume ran the finished trial again."""
    from tuner.config import settled, to_yaml
    from tuner.view import analysis

    cache = tmp_path / "cache"
    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))
    bucket = s3_env.make_bucket("beside")
    client = s3_env.client()
    text = to_yaml(settled(debug_config(tmp_path, output=f"s3://{bucket}/runs", name="busy"))[0])
    running = json.dumps({"trial_id": "t1", "status": "RUNNING", "config": {}})
    client.put_object(Bucket=bucket, Key="runs/busy/sweep.yaml", Body=text.encode())
    client.put_object(Bucket=bucket, Key="runs/busy/t1/tuner_trial.json", Body=running.encode())
    client.put_object(Bucket=bucket, Key="runs/busy/t1/metrics.jsonl", Body=b'{"epoch": 1, "val_acc": 0.5}\n')
    # The driver's working copy (tuner.sweepdir.remote: <cache>/s3/<bucket>/<key>), its
    # record of t1 just written, not yet pushed.
    driver = cache / "s3" / bucket / "runs" / "busy"
    (driver / "t1").mkdir(parents=True)
    (driver / "sweep.yaml").write_text(text)
    ended = json.dumps({"trial_id": "t1", "status": "TERMINATED", "config": {}, "ended": 1.0})
    (driver / "t1" / "tuner_trial.json").write_text(ended)
    before = sorted(str(p.relative_to(driver)) for p in driver.rglob("*"))
    data = analysis.load(f"s3://{bucket}/runs/busy")
    assert [t.status for t in data.records] == ["RUNNING"]  # the reader sees the bucket as it is
    assert (driver / "t1" / "tuner_trial.json").read_text() == ended
    assert sorted(str(p.relative_to(driver)) for p in driver.rglob("*")) == before
    assert not (driver / "t1" / "metrics.jsonl").exists()


def test_warm_start_auto_finds_the_sweeps_beside_one_in_object_storage(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: with `output: s3://...`, `search.warm_start: auto` found nothing (it listed the
    local directory `abspath("s3://...")`) and said nothing of it."""
    from tuner.config import settled, to_yaml
    from tuner.search import warm
    from tuner.sweepdir import place_for

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    bucket = s3_env.make_bucket("warm")
    client = s3_env.client()
    cfg = debug_config(tmp_path, output=f"s3://{bucket}/runs", name="new", search__warm_start="auto")
    for name, fp in (
        ("earlier", warm.fingerprint(cfg)),
        ("other", {**warm.fingerprint(cfg), "modules": {"m": "0"}}),
    ):
        text = to_yaml(settled(debug_config(tmp_path, output=f"s3://{bucket}/runs", name=name))[0])
        client.put_object(Bucket=bucket, Key=f"runs/{name}/sweep.yaml", Body=text.encode())
        code = {"import_from": cfg.code_dirs, "fingerprint": fp}
        client.put_object(Bucket=bucket, Key=f"runs/{name}/code.json", Body=json.dumps(code).encode())
        rows = "".join(json.dumps({"epoch": e, "val_acc": 0.5 + e / 10}) + "\n" for e in (1, 2, 3))
        record = {
            "trial_id": "t1",
            "status": "TERMINATED",
            "config": {"lr": 0.01, "optimizer": "adam", "width": 9},
        }
        client.put_object(Bucket=bucket, Key=f"runs/{name}/t1/metrics.jsonl", Body=rows.encode())
        client.put_object(
            Bucket=bucket, Key=f"runs/{name}/t1/tuner_trial.json", Body=json.dumps(record).encode()
        )
    found = warm.sources(cfg, place_for(cfg.output, cfg.name))
    assert [p.uri for p in found] == [f"s3://{bucket}/runs/earlier"]
    (source,) = warm.load(cfg, found)
    assert (source.trials, len(source.used)) == (1, 1)


def test_one_driver_per_sweep_in_object_storage_wherever_the_drivers_run(
    s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44 item 12: a second driver (another machine: another cache) on an s3 sweep ran
    beside the first. The lease in the bucket refuses it in one line; a holder that died on
    this machine, or whose lease went stale, is taken over."""
    import socket
    import subprocess

    from tuner.sweepdir import LOCK_FILE, lease, place_for

    bucket = s3_env.make_bucket("one-driver")

    def place(cache: str):
        monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / cache))
        return place_for(f"s3://{bucket}/runs", "x")

    first, second = place("here"), place("there")
    with first.claim(new=True, command="sweep"):
        for attempt in (lambda: second.claim(new=True, command="sweep").__enter__(), second.refuse_if_held):
            with pytest.raises(ConfigError) as err:
                attempt()
            said = str(err.value)
            assert f"s3://{bucket}/runs/x is in use by another tuner run (`sweep`, pid {os.getpid()}" in said
            assert "\n" not in said
        assert f"runs/x/{LOCK_FILE}" in s3_env.keys(bucket, "runs/x/")
    assert f"runs/x/{LOCK_FILE}" not in s3_env.keys(bucket, "runs/x/")  # released at the end
    # A holder gone: a process of this machine that is no more; a lease not renewed for long.
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True)
    for note, stale in (
        (dict(host=socket.gethostname(), pid=int(gone.stdout)), None),
        (dict(host="elsewhere", pid=1), -1.0),
    ):
        body = json.dumps({**note, "command": "sweep", "since": 0}).encode()
        s3_env.client().put_object(Bucket=bucket, Key=f"runs/x/{LOCK_FILE}", Body=body)
        if stale is None:
            with second.claim(new=True, command="sweep"):
                pass
        else:
            with pytest.raises(ConfigError, match="in use by another tuner run"):
                second.refuse_if_held()
            monkeypatch.setattr(lease, "LEASE_STALE_S", stale)
            second.refuse_if_held()
            with second.claim(new=True, command="sweep"):
                pass
