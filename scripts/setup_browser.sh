#!/usr/bin/env bash
# The headless browser the TensorBoard UI test drives: Debian's chromium (apt, only when
# /usr/bin/chromium is missing) and Playwright's Python driver in the venv. Playwright's own
# browser download (`playwright install`) is never used: it fetches from outside PyPI/Debian.
# Safe to run again: it installs only what is missing.
#
#   scripts/setup_browser.sh            # after scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

if [ ! -x /usr/bin/chromium ]; then
  echo "[setup] installing chromium (Debian) for the browser test"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
if ! "$VENV/bin/python" -c "import playwright" >/dev/null 2>&1; then
  echo "[setup] installing playwright (python driver) into $VENV"
  "$VENV/bin/python" -m pip --disable-pip-version-check install -q "playwright>=1.45"
fi
