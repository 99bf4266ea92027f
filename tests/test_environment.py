"""What a sweep records of its environment (tuner.environment), checked against independent
answers: git's own commands on a repository made here, the packages' own version attributes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner import environment, sweepdir


def git(repo: Path, *args: str) -> str:
    who = {f"GIT_{role}_{what}": value for role in ("AUTHOR", "COMMITTER") for what, value in
           (("NAME", "t"), ("EMAIL", "t@t"))}  # fmt: skip
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **who}, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "models").mkdir(parents=True)
    (root / "models" / "net.py").write_text("WIDTH = 8\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_code_state_is_git_s_commit_and_dirty_state(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    elsewhere = tmp_path / "not-a-repo"
    elsewhere.mkdir()
    # A subdirectory names its work tree once, whichever code directory comes first.
    found = environment.code_state([str(elsewhere), str(repo / "models"), str(repo)])
    assert found == [{"dir": str(repo), "commit": head, "dirty": False}]
    (repo / "notes.txt").write_text("untracked: not a change of the code\n")
    assert environment.code_state([str(repo)])[0]["dirty"] is False
    (repo / "models" / "net.py").write_text("WIDTH = 16\n")
    assert environment.code_state([str(repo)])[0]["dirty"] is True
    git(repo, "commit", "-q", "-am", "wider")
    now = environment.code_state([str(repo)])[0]
    assert now == {"dir": str(repo), "commit": git(repo, "rev-parse", "HEAD"), "dirty": False}
    assert now["commit"] != head
    assert environment.code_state([str(elsewhere)]) == []


def test_a_repository_without_a_commit_says_so(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    assert environment.code_state([str(tmp_path)]) == [{"dir": str(tmp_path), "commit": None, "dirty": False}]


def test_versions_are_the_packages_own() -> None:
    import platform

    import ray
    import torch

    from tuner.version import __version__

    env = environment.describe([])
    found = (env["torch"], env["cuda"], env["ray"], env["python"], env["tuner"])
    python = platform.python_version()
    assert found == (torch.__version__, torch.version.cuda, ray.__version__, python, __version__)
    assert env["code"] == []


def test_describe_imports_neither_torch_nor_ray() -> None:
    probe = (
        "import sys; from tuner import environment; environment.describe(['.']); "
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_gpu_kinds_of_a_cluster() -> None:
    nodes = [
        {"CPU": 8.0, "GPU": 4.0, "accelerator_type:H200": 1.0},
        {"CPU": 8.0},
        {"CPU": 8.0, "GPU": 4.0, "accelerator_type:H200": 1.0},
        {"CPU": 4.0, "GPU": 1.0},
    ]
    assert environment.gpu_kinds(nodes) == {"GPU": 1, "H200": 8}
    assert environment.gpu_kinds([{"CPU": 2.0}]) == {}


def test_environment_json_keeps_each_run_and_differences_name_what_changed(tmp_path: Path) -> None:
    first = {"python": "3.11.2", "torch": "2.13.0", "code": [{"dir": "/p", "commit": "a", "dirty": False}]}
    second = {"python": "3.11.2", "torch": "2.14.0", "code": [{"dir": "/p", "commit": "b", "dirty": True}]}
    assert sweepdir.read_environments(str(tmp_path)) == []
    sweepdir.add_environment(str(tmp_path), first)
    sweepdir.add_environment(str(tmp_path), second)
    assert sweepdir.read_environments(str(tmp_path)) == [first, second]
    assert environment.differences(first, second) == [
        "torch: 2.13.0 -> 2.14.0",
        "/p commit: a -> b",
        "/p dirty: False -> True",
    ]
    assert environment.differences(first, first) == []
    (tmp_path / sweepdir.ENVIRONMENT_FILE).write_text("{damaged")
    assert sweepdir.read_environments(str(tmp_path)) == []
