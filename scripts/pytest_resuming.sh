#!/usr/bin/env bash
# pytest with .venv's Python (arguments go to pytest), resumed once after a stall: a test
# stuck inside C code, out of pytest-timeout's reach, ends its process after its native stacks
# are printed (tests/stall.py, exit 75), and the tests not yet run then run in a new process.
# The verdict counts both processes: a failure before the stall still fails the run, and so
# does a second stall. scripts/test.sh runs the suite through this.
set -euo pipefail
cd "$(dirname "$0")/.."
run="$(mktemp -d)"
trap 'rm -rf "$run"' EXIT
unset TUNER_TEST_RESUME  # (set only for the second process below)
export TUNER_TEST_PROGRESS="$run/progress" TUNER_TEST_STALLED="$run/stalled"
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [[ $rc -eq 75 ]]; then
  done_n="$(grep -c '^done ' "$run/progress" || true)"
  failed="$(grep '^failed ' "$run/progress" | cut -d' ' -f2- | sort -u || true)"
  echo "[pytest_resuming] $(cat "$run/stalled") stalled inside C code (its native stacks are" \
    "above) after $done_n tests had finished; the rest run in a new process" >&2
  rc=0
  TUNER_TEST_RESUME=1 .venv/bin/python -m pytest "$@" || rc=$?
  if [[ -n "$failed" ]]; then
    echo "[pytest_resuming] failed before the stall:" >&2
    sed 's/^/FAILED /' <<<"$failed" >&2
    [[ $rc -ne 0 ]] || rc=1
  fi
fi
exit "$rc"
