#!/usr/bin/env bash
# The tests: set up (first run only), lint, then pytest. Extra arguments go to pytest
# (e.g. -k config, -x). GPU tests skip themselves where there is no CUDA GPU.
#
#   ./scripts/test.sh           every test (what CI runs), in two processes at once
#   ./scripts/test.sh --quick   the quick tier, for the edit-test loop: no Ray, no browser,
#                               nothing marked slow; a test over 5 s fails (tests/tiers.py)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ " $* " != *" --quick "* ]]; then
  scripts/setup_browser.sh   # chromium + Playwright for the TensorBoard UI and report tests
fi
.venv/bin/ruff check tuner tests scripts

# The whole suite in two pytest-xdist workers (TUNER_TEST_WORKERS; 0: one process, as for
# --pdb): half its time one core waits on a process start, a sweep's trial or a server, so
# two run at once where one did not. A file's tests stay together (tests/conftest.py). A
# worker that stalls is ended (tests/stall.py) and not replaced: the run stops, and the
# tests not yet finished run again in a new one (pytest_resuming.sh).
workers=()
if [[ " $* " != *" --quick "* && "${TUNER_TEST_WORKERS:-2}" != 0 ]]; then
  workers=(-n "${TUNER_TEST_WORKERS:-2}" --max-worker-restart 0)
fi
exec scripts/pytest_resuming.sh -q -ra --durations=25 "${workers[@]}" "$@"
