#!/usr/bin/env bash
# A Ray cluster on this machine for `ray job submit`, secure by default: every port on
# 127.0.0.1 (random free ones), token authentication on (a token is made, mode 0600, where
# Ray looks for it if there is none; it is never printed).
#
#   scripts/cluster.sh start [--workers N] [--num-cpus N] [--object-store-mb MB]
#   scripts/cluster.sh status          # nodes, addresses, where the token is
#   eval "$(scripts/cluster.sh env)"   # point `ray job ...`, `ray status` at it
#   scripts/cluster.sh stop            # stops what start started, nothing else
#
# The cluster is recorded in $TUNER_CLUSTER_DIR (default ~/.local/state/tuner/cluster).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$root/.venv/bin/python" ] || "$root/scripts/setup.sh" >&2
exec "$root/.venv/bin/python" -m tuner.cluster.local "$@"
