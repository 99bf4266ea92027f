#!/usr/bin/env bash
# Pack tuner's dependencies for an offline machine whose Python already has torch and the
# common scientific stack (a lent GPU machine: x86-64, CPython 3.12, no network), as one
# archive of them installed for that Python: Ray's wheel alone (79 MB) is over what such a
# machine can be sent (64 MiB), installed and compressed with xz all of them are 45 MB.
#
#   scripts/pack_deps.sh [PYTHON_VERSION]     # default 3.12; writes .gpusite/site.tar.xz
#
# There, from the repository root:
#   mkdir -p /tmp/site && tar xJf .gpusite/site.tar.xz -C /tmp/site
#   sed -i '1s|^#!.*python.*|#!/usr/bin/env python3|' /tmp/site/bin/*
#   export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
#   python3 -m pytest -q -m gpu tests/test_gpu_cuda.py tests/test_gpu_any_training.py
#
# The versions are this checkout's .venv's (scripts/setup.sh first). Left out: torch, numpy,
# pandas, scipy, scikit-learn, matplotlib, tensorboard, grpcio, protobuf, aiohttp and the like
# (in the GPU image: /work/.library/device/KINDS.md lists it), the test-only packages
# (moto, playwright, mlflow, s3fs), Ray's Java jars and RLlib.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-3.12}"
out=.gpusite
grep -qx '/.gpusite/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.gpusite/ >>.git/info/exclude; }
names=(
  ray jsonschema referencing rpds-py jsonschema-specifications pydantic pydantic_core annotated-types
  typing-inspection tensorboardX optuna alembic SQLAlchemy greenlet colorlog Mako ConfigSpace
  more-itertools aiohttp-cors colorful opencensus opencensus-context google-api-core google-auth
  googleapis-common-protos proto-plus pyasn1 pyasn1_modules cachetools smart_open virtualenv distlib
  platformdirs python-discovery opentelemetry-api opentelemetry-exporter-prometheus
  opentelemetry-proto opentelemetry-sdk opentelemetry-semantic-conventions importlib_metadata
  Pyro4 serpent
)
freeze="$(.venv/bin/python -m pip freeze 2>/dev/null)"
pins=()
for n in "${names[@]}"; do
  pin="$(grep -i "^${n//[-_]/[-_]}==" <<<"$freeze" || true)"
  [[ -n "$pin" ]] || { echo "error: $n is not in .venv (run scripts/setup.sh)" >&2; exit 2; }
  pins+=("$pin")
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_5_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  "${plat[@]}" -d "$work/wheels" "${pins[@]}"
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$py" \
  --implementation cp "${plat[@]}" --target "$work/site" "$work"/wheels/*.whl
rm -rf "$work/site/ray/jars" "$work/site/ray/rllib" "$work/site/bin/py-spy"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$out"
tar cf - -C "$work/site" . | xz -T0 -6 >"$out/site.tar.xz"
echo "$out/site.tar.xz: $(du -h "$out/site.tar.xz" | cut -f1), for CPython $py on x86-64"
