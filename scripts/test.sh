#!/usr/bin/env bash
# The tests: set up (first run only), lint, then pytest. Extra arguments go to pytest
# (e.g. -k config, -x). GPU tests skip themselves where there is no CUDA GPU.
#
#   ./scripts/test.sh           every test (what CI runs)
#   ./scripts/test.sh --quick   the quick tier, for the edit-test loop: no Ray, no browser,
#                               nothing marked slow; a test over 5 s fails (tests/tiers.py)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ " $* " != *" --quick "* ]]; then
  scripts/setup_browser.sh   # chromium + Playwright for the TensorBoard UI and report tests
fi
.venv/bin/ruff check tuner tests scripts

exec scripts/pytest_resuming.sh -q -ra --durations=25 "$@"
