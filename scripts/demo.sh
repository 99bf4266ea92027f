#!/usr/bin/env bash
# The demo: set up (first run only), then sweep an MLP on sklearn's digits with BOHB on a
# private local Ray. Extra arguments go to `tuner sweep` (e.g. --algorithm random).
# Each run gets its own directory under runs/, so running it again never touches old results.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m tuner sweep search_spaces/digits_mlp.yaml \
  --name "digits-mlp-$(date +%Y%m%d-%H%M%S)" "$@"
