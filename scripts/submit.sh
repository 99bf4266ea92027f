#!/usr/bin/env bash
# `python -m tuner submit ...` with the repository's .venv (made on first use):
#
#   scripts/submit.sh SWEEP.yaml [ray job submit options] [-- tuner sweep options]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$root/.venv/bin/python" ] || "$root/scripts/setup.sh" >&2
exec "$root/.venv/bin/python" -m tuner submit "$@"
