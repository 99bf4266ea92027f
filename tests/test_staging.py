"""driver/staging.py's OwnSecond: two runs of same-named sweeps on one node (two drivers of one
Ray cluster) stage in directories Tune names by the sweep's name and the second each began; the
second run begins Tune only once the first has named its own, and in a later second. On a clock
the test controls, with the real lock between two threads (a flock is per open file)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tuner.driver.staging import OwnSecond


class Clock:
    def __init__(self, now: float):
        self.now, self.slept = now, []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_second_run_of_the_name_waits_for_the_firsts_setup_and_begins_in_a_later_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    clock = Clock(100.3)
    first = OwnSecond("debug", clock.time, clock.sleep).__enter__()
    entered = threading.Event()

    def second_run() -> None:
        with OwnSecond("debug", clock.time, clock.sleep):
            entered.set()

    other = threading.Thread(target=second_run)
    other.start()
    assert not entered.wait(0.3)  # held while the first run's Tune has not named its staging
    clock.now = 100.6
    first.setup()  # Tune named it (in second 100 at most): the lock goes, the second is written
    assert entered.wait(60)
    other.join(60)
    assert clock.slept == [pytest.approx(0.4)] and int(clock.now) == 101
    first.__exit__(None, None, None)  # (nothing more to let go)


def test_past_the_second_nothing_waits_and_other_names_are_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    clock = Clock(100.3)
    with OwnSecond("debug", clock.time, clock.sleep) as own:
        with OwnSecond("other", clock.time, clock.sleep):  # another name: its own lock
            pass
        own.setup()
    clock.now = 101.2
    with OwnSecond("debug", clock.time, clock.sleep):
        pass
    assert clock.slept == []


def test_a_cache_that_cannot_be_written_leaves_the_run_as_tune_alone_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "file"))  # (a file: no directory in it)
    with OwnSecond("debug") as own:
        own.setup()
        assert own.fd is None
