#!/usr/bin/env bash
# The tests: set up (first run only), lint, then pytest. Extra arguments go to pytest
# (e.g. -k config, -x). GPU tests skip themselves where there is no CUDA GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup_browser.sh   # chromium + Playwright for the TensorBoard UI and report tests
.venv/bin/ruff check tuner tests scripts
exec .venv/bin/python -m pytest -q -ra --durations=25 "$@"
