"""The recipes a cluster user starts from (deploy/, Dockerfile): they parse, the tuner commands
in them are valid commands on the shipped sweep files, and their versions are the tested ones."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT
from tuner.cli import build_parser
from tuner.config import load_sweep
from tuner.config.flags import overrides_from

RAYJOB = ROOT / "deploy" / "kuberay" / "rayjob.yaml"
SBATCH = ROOT / "deploy" / "slurm" / "tuner.sbatch"
DOCKERFILE = ROOT / "Dockerfile"
APP = "/app"  # where the Dockerfile puts the repository


def _pins() -> tuple[str, str]:
    """(Ray as pyproject pins it, torch as scripts/setup.sh installs it)."""
    ray = re.search(r'"ray\[[^\]]*\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert ray, "pyproject.toml no longer pins Ray"
    torch = re.search(r"TORCH_VERSION=\$\{TORCH_VERSION:-([\d.]+)\}", (ROOT / "scripts/setup.sh").read_text())
    assert torch, "scripts/setup.sh no longer names its torch version"
    return ray.group(1), torch.group(1)


def _valid_sweep_command(words: list[str]) -> None:
    """`python -m tuner sweep ...` as tuner's own parser reads it, then validated as `tuner
    validate` would (the file, the flags, the output)."""
    assert words[:4] == ["python", "-m", "tuner", "sweep"], words
    args = build_parser().parse_args(words[3:])
    load_sweep(args.file, overrides_from(args))


def test_rayjob_parses_and_runs_a_valid_retryable_sweep() -> None:
    job = yaml.safe_load(RAYJOB.read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    ray, _ = _pins()
    assert cluster["rayVersion"] == ray
    assert cluster["authOptions"] == {"mode": "token", "secretName": "tuner-ray-token"}
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"  # the head runs no trial
    head_limits = head["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in head_limits
    workers = cluster["workerGroupSpecs"]
    assert any(
        c["resources"]["limits"].get("nvidia.com/gpu")
        for g in workers
        for c in g["template"]["spec"]["containers"]
    )
    assert spec["backoffLimit"] >= 1
    assert yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_SIGNAL"] == "SIGINT"
    words = [
        w.replace(APP, str(ROOT), 1) if w.startswith(APP + "/") else w
        for w in shlex.split(spec["entrypoint"])
    ]
    assert "--resume-if-exists" in words and any(w.startswith("s3://") for w in words)
    _valid_sweep_command(words)


def test_sbatch_script_is_valid_bash_and_runs_a_valid_retryable_sweep() -> None:
    text = SBATCH.read_text()
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    directives = re.findall(r"^#SBATCH (\S+)", text, re.M)
    assert "--requeue" in directives and any(d.startswith("--nodes=") for d in directives)
    # Defaults of the script's variables (VAR=${VAR:-default}) stand in for a user's.
    defaults = dict(re.findall(r"^(\w+)=\$\{\1:-(.*)\}$", text, re.M))
    defaults |= {"HOME": "/home/user", "SLURM_SUBMIT_DIR": str(ROOT), "head_ip": "10.0.0.1"}
    line = next(ln for ln in text.splitlines() if ln.startswith("python -m tuner sweep"))
    line = line.rstrip(" &")
    for _ in range(3):  # defaults that name other variables
        line = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), line)
    words = shlex.split(line)
    assert "--resume-if-exists" in words and "--address" in words
    _valid_sweep_command(words)
    # The token: made 0600 (umask 077, then chmod), named by RAY_AUTH_TOKEN_PATH, never echoed.
    assert "umask 077" in text and 'chmod 600 "$RAY_AUTH_TOKEN_PATH"' in text
    assert "export RAY_AUTH_MODE=token" in text and not re.search(r"(echo|cat) .*TOKEN", text)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_sbatch_script_passes_shellcheck() -> None:
    out = subprocess.run(["shellcheck", "-S", "warning", str(SBATCH)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_dockerfile_pins_the_tested_versions() -> None:
    text = DOCKERFILE.read_text()
    ray, torch = _pins()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray)}-py3\d+-gpu$", text, re.M), text
    assert f"ARG TORCH_VERSION={torch}" in text
    assert 'pip install --no-cache-dir ".[s3]"' in text
    # What it copies exists, so `docker build` finds it.
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), path


def test_recipes_are_named_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for recipe in ("deploy/kuberay/rayjob.yaml", "deploy/slurm/tuner.sbatch", "Dockerfile"):
        assert recipe in readme, recipe
