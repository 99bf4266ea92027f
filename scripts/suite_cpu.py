"""Where the test suite's CPU goes, test by test: Linux process accounting of a run, each
process charged to the test that was running in the pytest process it descends from.

usage: python scripts/suite_cpu.py PACCT WINDOWS [--top N] [--json OUT]

Record a run (root; `apt-get install acct`):

    touch /tmp/pacct && accton /tmp/pacct
    TUNER_TEST_WINDOWS_OUT=/tmp/windows.jsonl ./scripts/test.sh
    accton off
    python scripts/suite_cpu.py /tmp/pacct /tmp/windows.jsonl

PACCT: the kernel's records (acct v3), one per process at its end: command, pid, parent,
start (whole seconds), elapsed time, user and system CPU. WINDOWS: tests/conftest.py's lines
(WINDOWS_ENV), one per test: its pytest process, start and end, that process's own CPU-s in it.
A process is charged to the test its pytest process was running when the process started,
found by walking its parents up to a pytest process (a parent's record is the one with that pid
alive at the time: pids are reused). A process whose parent had ended before it (Ray's
agents, re-parented to init) goes with the process born just before it that has a test; else
it is "unattributed". A process that outlived its test (a fixture's: a module's cluster, the
worker's shared Ray) goes to its file's "(fixtures)" line instead. Start times have
whole-second resolution: a process started within a second of a test's end may be charged to
its neighbour.
"""

from __future__ import annotations

import argparse
import bisect
import json
import struct
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16].
_V3 = struct.Struct("=BBHIIIIIIf8H16s")
_AHZ = 100.0  # comp_t ticks per second
# A process that outlived the test it started in by more than this is a fixture's (a module's
# cluster, a worker's shared Ray): charged to its file as "FILE::(fixtures)", not to the test.
OUTLIVED_S = 5.0
SHARED = "::(fixtures)"


def _comp(v: int) -> float:
    """A comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return float((v & 0x1FFF) << (3 * ((v >> 13) & 7)))


@dataclass
class Proc:
    pid: int
    ppid: int
    start: float  # seconds since the epoch (whole seconds)
    end: float
    cpu: float  # user + system seconds
    comm: str


def read_pacct(path: str) -> list[Proc]:
    """The v3 records of `path` (others are skipped)."""
    data = open(path, "rb").read()
    out = []
    for off in range(0, len(data) - _V3.size + 1, _V3.size):
        f = _V3.unpack_from(data, off)
        if f[1] & 0x7F != 3:
            continue
        _, _, _, _, _, _, pid, ppid, btime, etime, ut, st, *_, comm = f
        elapsed = etime / _AHZ
        cpu = (_comp(ut) + _comp(st)) / _AHZ
        name = comm.split(b"\0", 1)[0].decode(errors="replace")
        out.append(Proc(pid, ppid, float(btime), float(btime) + elapsed, cpu, name))
    return out


class Lineage:
    """Each pid's records, to find the one alive at a given time."""

    def __init__(self, procs: list[Proc]):
        self.by_pid: dict[int, list[Proc]] = defaultdict(list)
        for p in procs:
            self.by_pid[p.pid].append(p)
        for recs in self.by_pid.values():
            recs.sort(key=lambda r: r.start)

    def at(self, pid: int, t: float) -> Optional[Proc]:
        """The record of `pid` that had started by `t` (1 s slack) and lived longest past it."""
        recs = [r for r in self.by_pid.get(pid, ()) if r.start <= t + 1.0]
        return recs[-1] if recs else None


def charge(procs: list[Proc], windows: list[dict]) -> tuple[dict[str, float], dict[str, int], float, int]:
    """CPU-s and process count per test, and what could not be charged (CPU-s, processes).
    Each test is also charged its pytest process's own CPU-s in it."""
    by_worker: dict[int, list[dict]] = defaultdict(list)
    for w in windows:
        by_worker[int(w["pid"])].append(w)
    starts = {}
    for pid, ws in by_worker.items():
        ws.sort(key=lambda w: w["t0"])
        starts[pid] = [w["t0"] for w in ws]
    lineage = Lineage(procs)
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for w in windows:
        cpu[w["test"]] += float(w.get("cpu", 0.0))
    lost_cpu, lost = 0.0, 0
    orphans: list[Proc] = []
    given: dict[tuple[int, float], str] = {}
    for p in procs:
        if p.pid in by_worker:
            continue  # (a pytest process: its CPU is charged per test from WINDOWS)
        test = None
        node: Optional[Proc] = p
        for _ in range(30):
            if node is None:
                break
            if node.ppid in by_worker:
                ws, t = by_worker[node.ppid], p.start  # (when it began: a copy's parent is older)
                i = bisect.bisect_right(starts[node.ppid], t + 1.0) - 1
                if i >= 0:
                    test = ws[i]["test"]
                    if p.end > ws[i]["t1"] + OUTLIVED_S:  # a fixture's: the file's, not the test's
                        test = test.split("::", 1)[0] + SHARED
                break
            node = lineage.at(node.ppid, node.start)
        if test is None:
            orphans.append(p)
        else:
            given[(p.pid, p.start)] = test
            cpu[test] += p.cpu
            count[test] += 1
    # Orphans (their parent ended first: Ray's agents outlive their raylet) go with the
    # process born just before them, within a second, that has a test: pids are handed out in
    # order, so that is the process tree that started them, unless another test's started a
    # process in between.
    born = sorted(given)
    for p in orphans:
        i = bisect.bisect_left(born, (p.pid, p.start)) - 1
        near = born[i] if i >= 0 else None
        if near is not None and p.pid - near[0] < 64 and abs(p.start - near[1]) <= 1.0:
            cpu[given[near]] += p.cpu
            count[given[near]] += 1
        else:
            lost_cpu += p.cpu
            lost += 1
    return cpu, count, lost_cpu, lost


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pacct")
    ap.add_argument("windows")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", help="write every test's and file's CPU-s here")
    args = ap.parse_args(argv)
    procs = read_pacct(args.pacct)
    windows = [json.loads(line) for line in open(args.windows) if line.strip()]
    cpu, count, lost_cpu, lost = charge(procs, windows)
    files: dict[str, float] = defaultdict(float)
    for test, c in cpu.items():
        files[test.split("::", 1)[0]] += c
    total = sum(p.cpu for p in procs)
    charged = sum(cpu.values())
    print(
        f"{len(procs)} processes, {total:.0f} CPU-s recorded; {len(windows)} tests charged "
        f"{charged:.0f} CPU-s (their pytest processes' own included); unattributed: "
        f"{lost} processes, {lost_cpu:.0f} CPU-s"
    )
    print(f"\nfiles by CPU-s (top {args.top}):")
    for name, c in sorted(files.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {c:7.1f}  {name}")
    print(f"\ntests by CPU-s (top {args.top}):")
    for name, c in sorted(cpu.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {c:7.1f}  {count.get(name, 0):4d} proc  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tests": cpu, "files": files, "unattributed": lost_cpu}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
