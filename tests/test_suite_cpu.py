"""scripts/suite_cpu.py: each process of a test run charged to the test that started it."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from suite_cpu import _V3, Proc, charge, read_pacct  # noqa: E402


def _record(pid: int, ppid: int, btime: int, etime_s: float, cpu_ticks: int, comm: bytes) -> bytes:
    # (cpu_ticks below 8192: a comp_t with exponent 0 is the number itself)
    return _V3.pack(0, 3, 0, 0, 0, 0, pid, ppid, btime, etime_s * 100, cpu_ticks, 0, 0, 0, 0, 0, 0, 0, comm)


def test_records_are_read_as_the_kernel_writes_them(tmp_path: Path) -> None:
    f = tmp_path / "pacct"
    big = (2 << 13) | 100  # a comp_t: 100 * 8**2 ticks
    f.write_bytes(
        _record(7, 1, 1000, 2.5, 150, b"python")
        + _V3.pack(0, 3, 0, 0, 0, 0, 8, 7, 1001, 0, big, 0, 0, 0, 0, 0, 0, 0, b"raylet")
    )
    got = read_pacct(str(f))
    assert got == [Proc(7, 1, 1000.0, 1002.5, 1.5, "python"), Proc(8, 7, 1001.0, 1001.0, 64.0, "raylet")]


def test_a_process_goes_to_the_test_its_pytest_process_ran_when_it_started() -> None:
    windows = [
        {"pid": 100, "test": "a.py::one", "t0": 10.0, "t1": 20.0, "cpu": 1.0},
        {"pid": 100, "test": "a.py::two", "t0": 20.0, "t1": 40.0, "cpu": 0.5},
        {"pid": 200, "test": "b.py::three", "t0": 10.0, "t1": 40.0, "cpu": 2.0},
    ]
    procs = [
        Proc(300, 100, 12.0, 15.0, 3.0, "python"),  # a driver of test one
        Proc(301, 300, 13.0, 15.0, 4.0, "python"),  # its child
        Proc(300, 200, 30.0, 35.0, 5.0, "python"),  # pid 300 again, later: test three's
        Proc(302, 300, 31.0, 34.0, 6.0, "ray::Im"),  # under the second 300: three
        Proc(303, 1, 31.0, 36.0, 7.0, "ray::Dash"),  # orphan born after 302: three
        Proc(900, 1, 5.0, 6.0, 8.0, "other"),  # nothing of the run
        Proc(100, 1, 0.0, 50.0, 9.0, "python"),  # a pytest process: charged from windows
    ]
    cpu, count, lost_cpu, lost = charge(procs, windows)
    assert cpu == {"a.py::one": 1.0 + 3.0 + 4.0, "a.py::two": 0.5, "b.py::three": 2.0 + 5.0 + 6.0 + 7.0}
    assert count == {"a.py::one": 2, "b.py::three": 3}
    assert (lost_cpu, lost) == (8.0, 1)
