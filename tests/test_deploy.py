"""The recipes a cluster user starts from (deploy/, Dockerfile): they parse, the tuner commands
in them are valid commands on the shipped sweep files, and their versions are the tested ones."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_every_pod_of_the_rayjob_has_a_dev_shm_for_loaders_nccl_and_the_object_store() -> None:
    # Issue 49, E12: a container's /dev/shm is 64 MiB unless the pod mounts a larger one;
    # DataLoader workers hand batches over through it, NCCL's shared-memory transport and Ray's
    # object store live in it, and running out is a bus error, not an out-of-memory.
    cluster = yaml.safe_load(RAYJOB.read_text())["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]]
    pods += [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
            shm = volumes[mount["name"]]["emptyDir"]
            assert shm["medium"] == "Memory", shm
            limit = _gib(shm["sizeLimit"])
            # Counted against the container's memory: a part of it, not all, and well over 64 MiB.
            memory = _gib(container["resources"]["limits"]["memory"])
            assert 1 <= limit < memory, (shm, container["resources"])


def _gib(quantity: str) -> float:
    value, unit = re.fullmatch(r"(\d+)(Gi|Mi)", quantity).groups()  # type: ignore[union-attr]
    return int(value) / (1024 if unit == "Mi" else 1)


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
    # Every node (head, workers) is `tuner cluster node`, its workers copies of a warm process,
    # never a plain `ray start`; each keeps --block (its end is the node's end).
    code = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if "ray start" in ln]
    assert sum("python -m tuner cluster node -- " in ln for ln in code) == 2
    assert "--block" in next(ln for ln in code if ln.startswith("ray_common="))


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


def _verified(cert_path: Path, ca_path: Path) -> list[str]:
    """The IP addresses a certificate names, after checking the CA signed it."""
    from cryptography import x509

    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises if another key signed it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]


def test_every_pod_of_the_rayjob_makes_its_certificate_and_speaks_tls(tmp_path: Path) -> None:
    """Each pod's init container runs `tuner cluster cert` (run here for real, on a CA made by
    `tuner cluster ca` as the recipe's header says) into the volume whose files the Ray
    container's RAY_TLS_* variables name."""
    cluster = yaml.safe_load(RAYJOB.read_text())["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]]
    pods += [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    ca_dir = tmp_path / "ca"
    made = subprocess.run([sys.executable, "-m", "tuner", "cluster", "ca", str(ca_dir)], capture_output=True)
    assert made.returncode == 0, made.stderr
    for i, pod in enumerate(pods):
        (init,) = pod["initContainers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
        ca_volume = volumes[next(n for n, p in mounts.items() if p.endswith("/ca"))]
        assert ca_volume["secret"]["secretName"] == "tuner-ray-ca"
        tls_dir = next(p for n, p in mounts.items() if "emptyDir" in volumes[n])
        assert volumes["ray-tls"]["emptyDir"] == {"medium": "Memory"}  # the key never on a disk
        words = init["command"]
        _ = build_parser().parse_args(words[3:])  # a valid tuner command
        here = tmp_path / f"pod{i}"
        local = [str(ca_dir) if w.endswith("/ca") else str(here) if w == tls_dir else w for w in words]
        local = ["10.2.3.4" if w == "$(POD_IP)" else w for w in local]
        done = subprocess.run([sys.executable, *local[1:]], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        for container in pod["containers"]:
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["RAY_USE_TLS"] == "1"
            assert {m["mountPath"] for m in container["volumeMounts"]} - {"/dev/shm"} == {tls_dir}
            files = {k: here / Path(env[k]).relative_to(tls_dir) for k in env if k.startswith("RAY_TLS_")}
            assert files["RAY_TLS_SERVER_KEY"].stat().st_mode & 0o777 == 0o600
            assert "10.2.3.4" in _verified(files["RAY_TLS_SERVER_CERT"], files["RAY_TLS_CA_CERT"])
            assert files["RAY_TLS_CA_CERT"].read_bytes() == (ca_dir / "ca.crt").read_bytes()


@pytest.mark.parametrize("tls", ["1", "0"])
def test_the_sbatch_script_gives_each_node_and_the_driver_a_certificate_of_its_ca(
    tmp_path: Path, tls: str
) -> None:
    """The script's TLS part (from `on_node=()` to its `fi`) run for real in bash, then a node's
    wrapper (on_node) around `env` in place of `ray start`: the node's variables name its own
    certificate, signed by the job's CA; the driver's names the head's address. TLS=0: none."""
    text = SBATCH.read_text()
    block = re.search(r"^on_node=\(\)\n.*?^fi\n", text, re.S | re.M)
    assert block, "no TLS block in the sbatch script"
    ca_dir_line = re.search(r"^CA_DIR=.*$", text, re.M)
    assert ca_dir_line, "no CA_DIR in the sbatch script"
    job = f"t{os.getpid()}{tls}"
    script = (
        f"set -euo pipefail\nexport PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH\n"
        f"head_ip=10.9.8.7\n{ca_dir_line.group(0)}\n{block.group(0)}"
        '"${on_node[@]}" env | grep "^RAY_TLS\\|^RAY_USE" | sed "s/^/NODE /" || true\n'
        'env | grep "^RAY_TLS\\|^RAY_USE" | sed "s/^/DRIVER /" || true\n'
    )
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "SLURM_JOB_ID": job, "TLS": tls}
    env = {k: v for k, v in env.items() if not k.startswith("RAY_TLS") and k != "RAY_USE_TLS"}
    try:
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        seen: dict[str, dict[str, str]] = {"NODE": {}, "DRIVER": {}}
        for line in done.stdout.splitlines():
            who, kv = line.split(" ", 1)
            seen[who][kv.split("=", 1)[0]] = kv.split("=", 1)[1]
        if tls == "0":
            assert seen == {"NODE": {}, "DRIVER": {}}
            return
        ca_dir = home / ".tuner" / f"ca-{job}"
        assert ca_dir.stat().st_mode & 0o777 == 0o700 and (ca_dir / "ca.key").stat().st_mode & 0o777 == 0o600
        for who, where in (("NODE", "tls-node"), ("DRIVER", "tls-driver")):
            files = seen[who]
            assert files["RAY_USE_TLS"] == "1"
            assert files["RAY_TLS_SERVER_CERT"] == f"/tmp/ray-{job}/{where}/node.crt"
            assert Path(files["RAY_TLS_SERVER_KEY"]).stat().st_mode & 0o777 == 0o600
            ips = _verified(Path(files["RAY_TLS_SERVER_CERT"]), ca_dir / "ca.crt")
            assert ("10.9.8.7" in ips) == (who == "DRIVER"), ips  # the driver's names the head
    finally:
        shutil.rmtree(f"/tmp/ray-{job}", ignore_errors=True)
