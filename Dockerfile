# tuner on Ray, for KubeRay (deploy/kuberay/rayjob.yaml) or any cluster of containers.
#
#   docker build -t tuner:0.1.0 .
#
# The versions are the ones the tests run: Ray as pyproject.toml pins it, torch as
# scripts/setup.sh installs it (tests/test_deploy.py checks both). Ray's own image brings Ray,
# CUDA and what KubeRay needs in a container (bash, wget); torch's CUDA build comes from PyPI.
FROM rayproject/ray:2.60.0-py311-gpu

ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}"

WORKDIR /app
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users tuner ./tuner
COPY --chown=ray:users search_spaces ./search_spaces
# The s3 extra: object storage as output (s3://...), with credentials from the environment.
RUN pip install --no-cache-dir ".[s3]"
