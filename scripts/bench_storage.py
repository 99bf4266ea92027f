"""Where a sweep's results go, side by side: the same sweep to a local directory, to an S3
server (moto's, on this machine), and on a 2-node cluster of separate machines (network and
mount namespaces: tests/nscluster.py, root) into that server. Wall time of `tuner sweep`
and what the bucket holds afterwards (objects, bytes).

    sudo .venv/bin/python scripts/bench_storage.py [--trials 30] [--rounds 1]

The three runs alternate within each round, so a loaded machine weighs on all of them alike.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import s3server  # noqa: E402
from tests.nscluster import NsCluster  # noqa: E402

SWEEP = ROOT / "search_spaces" / "debug.yaml"


def _sweep_text(trials: int) -> str:
    raw = yaml.safe_load(SWEEP.read_text())
    raw["search"]["num_samples"] = trials
    return yaml.safe_dump(raw)


def _bucket(server: s3server.S3Server, bucket: str, prefix: str) -> tuple[int, int]:
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [o for page in pages for o in page.get("Contents", [])]
    return len(objects), sum(int(o["Size"]) for o in objects)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    (work / "sweep.yaml").write_text(_sweep_text(args.trials))
    cluster = NsCluster(workers=1, cpus=1)

    def storage(c: NsCluster) -> dict[str, str]:
        c.s3 = s3server.start(c.host_ip)
        c.on_stop.append(c.s3.stop)
        return c.s3.env()

    cluster.start(setup=storage)
    server = cluster.s3
    server.make_bucket("bench")
    cluster.put(cluster.head, "/tmp/work/sweep.yaml", _sweep_text(args.trials))
    rows = []
    try:
        for r in range(args.rounds):
            for kind in ("local disk", "S3 (one machine)", "S3, 2-node cluster"):
                name = f"r{r}-{kind.split()[0].lower().strip(',')}-{len(rows)}"
                t = time.monotonic()
                if kind == "local disk":
                    cmd = [sys.executable, "-m", "tuner", "sweep", str(work / "sweep.yaml"), "--output",
                           str(work / "runs"), "--name", name, "--num-cpus", "2"]  # fmt: skip
                    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                elif kind == "S3 (one machine)":
                    cmd = [sys.executable, "-m", "tuner", "sweep", str(work / "sweep.yaml"), "--output",
                           "s3://bench/runs", "--name", name, "--num-cpus", "2"]  # fmt: skip
                    env = {**os.environ, **server.env(), "TUNER_CACHE_DIR": str(work / "cache")}
                    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
                else:
                    cmd = ["python", "-m", "tuner", "sweep", "sweep.yaml", "--address", cluster.gcs,
                           "--output", "s3://bench/runs", "--name", name]  # fmt: skip
                    out = cluster.run(cluster.head, cmd, timeout=3600)
                wall = time.monotonic() - t
                if out.returncode != 0 and "timed out during startup" in out.stderr:
                    print(f"{kind}: Ray did not start within its 30 s (a loaded machine); not counted")
                    continue
                if out.returncode != 0:
                    print(f"{kind}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
                    return 1
                objects, size = _bucket(server, "bench", f"runs/{name}/") if "S3" in kind else (0, 0)
                rows.append((kind, wall, objects, size))
                print(f"{kind:22s} {wall:7.1f} s  {objects:5d} objects  {size / 1e6:7.2f} MB", flush=True)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
