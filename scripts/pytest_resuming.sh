#!/usr/bin/env bash
# pytest with .venv's Python (arguments go to pytest), resumed once after a stall: a test
# stuck inside C code, out of pytest-timeout's reach, has its process's native stacks printed
# and the process ended (tests/stall.py's watcher), and the tests not yet finished then run in
# a new process. The verdict counts both processes: a failure before the stall still fails
# the run, and a second stall ends it with 75. scripts/test.sh runs the suite through this.
set -euo pipefail
cd "$(dirname "$0")/.."
run="$(mktemp -d)"
trap 'rm -rf "$run"' EXIT
unset TUNER_TEST_RESUME  # (set only for the second process below)
export TUNER_TEST_PROGRESS="$run/progress" TUNER_TEST_STALLED="$run/stalled"
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [[ -s "$run/stalled" ]]; then
  done_n="$(grep -c '^done ' "$run/progress" || true)"
  failed="$(grep '^failed ' "$run/progress" | cut -d' ' -f2- | sort -u || true)"
  echo "[pytest_resuming] $(cat "$run/stalled") stalled inside C code (its native stacks are" \
    "above) after $done_n tests had finished; the rest run in a new process" >&2
  rc=0
  rm -f "$run/stalled"
  TUNER_TEST_RESUME=1 .venv/bin/python -m pytest "$@" || rc=$?
  if [[ -s "$run/stalled" ]]; then
    echo "[pytest_resuming] $(cat "$run/stalled") stalled too, in the second process" >&2
    rc=75
  fi
  if [[ -n "$failed" ]]; then
    echo "[pytest_resuming] failed before the stall:" >&2
    sed 's/^/FAILED /' <<<"$failed" >&2
    [[ $rc -ne 0 ]] || rc=1
  fi
fi
exit "$rc"
