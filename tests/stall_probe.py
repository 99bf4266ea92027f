"""Tests for tests/test_stall.py to run in a pytest of their own (the name keeps them out of
the suite): one passes, one fails, one blocks inside C code holding the GIL (libc's sleep
through ctypes.PyDLL, SIGALRM blocked so that pytest-timeout cannot end it) in the first
process only, one passes after it."""

import ctypes
import os
import signal


def test_passes_before() -> None:
    pass


def test_fails_before() -> None:
    assert os.environ.get("PROBE_FAIL") != "1", "the failure before the stall"


def test_blocks_in_c_code() -> None:
    if os.environ.get("TUNER_TEST_RESUME") != "1" or os.environ.get("PROBE_STALL_AGAIN") == "1":
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        ctypes.PyDLL(None).sleep(120)  # PyDLL: the GIL stays held


def test_passes_after() -> None:
    pass
