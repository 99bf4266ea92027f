#!/usr/bin/env bash
# Submit a sweep to a Ray cluster with `ray job submit`: the documented way.
#
#   scripts/submit.sh SWEEP.yaml [ray job submit options] [-- tuner sweep options]
#   scripts/submit.sh search_spaces/digits_mlp.yaml --no-wait -- --num-samples 20
#
# It validates the file first, refuses a cluster without authentication that other
# machines can reach (unless --allow-insecure-cluster), uploads the working directory
# (default: the current one), and sets the job up so that `ray job stop` interrupts the
# sweep with SIGINT and lets it save a resumable state (TUNER_STOP_GRACE_S, default 60 s).
# The cluster: --address, else RAY_API_SERVER_ADDRESS, else the one scripts/cluster.sh started.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$root/.venv/bin/python" ] || "$root/scripts/setup.sh" >&2
exec "$root/.venv/bin/python" -m tuner.cluster.submit "$@"
