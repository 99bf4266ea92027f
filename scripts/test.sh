#!/usr/bin/env bash
# The tests: set up (first run only), lint, then pytest. Extra arguments go to pytest
# (e.g. -k config, -x). GPU tests skip themselves where there is no CUDA GPU.
#
#   ./scripts/test.sh           every test (what CI runs)
#   ./scripts/test.sh --quick   the quick tier, for the edit-test loop: no Ray, no browser,
#                               nothing marked slow; a test over 5 CPU-s fails (tests/tiers.py)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ " $* " != *" --quick "* ]]; then
  scripts/setup_browser.sh   # chromium + Playwright for the TensorBoard UI and report tests
fi
.venv/bin/ruff check tuner tests scripts

# The full tier runs in three pytest-xdist workers (TUNER_TEST_WORKERS, default 3; 1: one
# process), each given whole files at a time, the heaviest first (tests/conftest.py): the suite
# is CPU-bound, and a worker leaves a core idle whenever its test waits (on 2 cores: one
# process kept 1.2 busy on average, two 1.75, three 1.95). A stalled worker is ended, not
# replaced, and what it had not finished runs again (pytest_resuming.sh).
workers=()
if [[ " $* " != *" --quick "* && "${TUNER_TEST_WORKERS:-3}" -gt 1 ]]; then
  workers=(-n "${TUNER_TEST_WORKERS:-3}" --max-worker-restart 0)
fi
if [[ " $* " == *" --quick "* ]]; then
  exec scripts/pytest_resuming.sh -q -ra --durations=25 "${workers[@]}" "$@"
fi

# The full tier's budget is a ratio that holds on any machine (issue 50): its wall against the
# wall of one `tuner sweep search_spaces/debug.yaml` on the same machine, timed here first.
sweep_s="$(.venv/bin/python scripts/sweep_wall.py)" || sweep_s=""
# Each test file's seconds (tests/conftest.py): copied to tests/durations.json after a run that
# passed, they order the next runs' files longest first.
export TUNER_TEST_DURATIONS_OUT=test-artifacts/durations.json
rm -f "$TUNER_TEST_DURATIONS_OUT"
began="$(date +%s)"
rc=0
scripts/pytest_resuming.sh -q -ra --durations=25 "${workers[@]}" "$@" || rc=$?
.venv/bin/python scripts/sweep_wall.py --ratio "$(($(date +%s) - began))" "$sweep_s"
echo "[test.sh] seconds per test file: $TUNER_TEST_DURATIONS_OUT (tests/durations.json orders runs by them)"
exit "$rc"
