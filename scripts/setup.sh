#!/usr/bin/env bash
# Set up .venv for tuner on this machine: the right PyTorch build first, then tuner itself
# (editable) with its test tools. Safe to run again: it only installs what is missing.
#
#   scripts/setup.sh            # .venv next to this repository
#   VENV=/tmp/v scripts/setup.sh
#
# PyTorch: with an NVIDIA GPU (nvidia-smi works) the CUDA build from PyPI; without one, the
# CPU build (a local wheel where pip's find-links has one, else PyTorch's CPU index), never
# the multi-GB CUDA build a bare `pip install torch` would pull onto a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
# The interpreter of a new venv: $PYTHON if set; else the distribution's own python3 when it
# is 3.10 or newer and can make a venv; else the python3 on PATH. Distributions build Python
# with profile-guided optimisation and LTO, pyenv (by default) and plain source builds do not:
# on this project's 2-core machines a `tuner sweep` of debug.yaml took 9% less CPU and wall
# under Debian's 3.11 than under pyenv's (3 runs each, alternating; docs/development.md), and
# the test suite is CPU-bound there.
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  if /usr/bin/python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    PYTHON=/usr/bin/python3
  fi
fi
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())'))"
  "$PYTHON" -m venv "$VENV"
fi
# The venv's own interpreter, never its bin/activate: a venv copied from another checkout
# has an activate that points back at the original, and pip would install into that one.
python() { "$VENV/bin/python" "$@"; }
pip() { python -m pip --disable-pip-version-check "$@"; }

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if ! python -c "import torch" >/dev/null 2>&1; then
  if has_gpu; then
    echo "[setup] NVIDIA GPU found: installing torch==$TORCH_VERSION (CUDA build)"
    pip install -q "torch==$TORCH_VERSION"
  elif pip install -q --no-index --no-deps "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1; then
    echo "[setup] no GPU: installed torch==$TORCH_VERSION+cpu from a local wheel"
    pip install -q "torch==$TORCH_VERSION+cpu"   # its dependencies
  else
    echo "[setup] no GPU: installing torch==$TORCH_VERSION+cpu from PyTorch's CPU index"
    pip install -q "torch==$TORCH_VERSION+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi

if ! python -c "import tuner, ray, pytest" >/dev/null 2>&1 || [ pyproject.toml -nt "$VENV/.tuner-installed" ]; then
  echo "[setup] installing tuner and its dependencies into $VENV"
  pip install -q -e ".[dev]"
  touch "$VENV/.tuner-installed"
fi
# tuner's own bytecode, as pip writes it for every installed package: an editable install
# gets none, and where PYTHONDONTWRITEBYTECODE is set (this project's machines) every process
# that imports tuner (each trial actor and driver) would compile its modules again: ~0.07
# CPU-seconds each. Python recompiles any module edited since, in memory.
python -m compileall -q tuner >/dev/null
python -c "import torch, ray; print(f'[setup] ready: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), ray {ray.__version__}')"
