#!/usr/bin/env bash
# `python -m tuner cluster ...` with the repository's .venv (made on first use):
#
#   scripts/cluster.sh start [--workers N] [--num-cpus N] [--object-store-mb MB]
#   scripts/cluster.sh status | env | stop
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$root/.venv/bin/python" ] || "$root/scripts/setup.sh" >&2
exec "$root/.venv/bin/python" -m tuner cluster "$@"
