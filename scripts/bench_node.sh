#!/usr/bin/env bash
# A node started by `python -m tuner cluster node` against one started by a plain `ray start`:
# `tuner sweep search_spaces/debug.yaml` joined to each (--address), twice per node, the two
# kinds alternating round by round. Prints each sweep's wall. BENCHMARKS.md, "A node of your
# own cluster".
#
#   scripts/bench_node.sh [ROUNDS]     (default 3; a head of 2 CPUs on this machine's address)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -c 'import secrets; print(secrets.token_hex(32))' > "$work/token"
chmod 600 "$work/token"
export RAY_AUTH_TOKEN_PATH="$work/token" RAY_AUTH_MODE=token RAY_TMPDIR="$work/ray"
mkdir -p "$RAY_TMPDIR"
ip=$(hostname -I | awk '{print $1}')
port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
for round in $(seq "$rounds"); do
  for kind in "ray start" "tuner cluster node"; do
    if [ "$kind" = "ray start" ]; then start=(.venv/bin/ray start --block); else start=(.venv/bin/python -m tuner cluster node --); fi
    "${start[@]}" --head --port="$port" --num-cpus=2 --disable-usage-stats --include-dashboard=false \
      > "$work/node.log" 2>&1 &
    node=$!
    for _ in $(seq 120); do .venv/bin/ray health-check --address "$ip:$port" > /dev/null 2>&1 && break; sleep 1; done
    sleep 3  # (the node's warm process, if any, done importing)
    walls=()
    for run in 1 2; do
      began=$(date +%s.%N)
      .venv/bin/python -m tuner sweep search_spaces/debug.yaml --address "$ip:$port" \
        --output "$work/runs-$round-$run-${kind// /-}" > "$work/sweep.log" 2>&1 || { cat "$work/sweep.log"; exit 1; }
      walls+=("$(python3 -c "import time; print(f'{time.time() - $began:.2f}')")")
    done
    echo "round $round, $kind: ${walls[*]} s"
    kill -TERM "$node"
    wait "$node" 2> /dev/null || true
    sleep 2
  done
done
