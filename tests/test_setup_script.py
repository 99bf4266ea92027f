"""scripts/setup.sh on a copied virtual environment (issue 26, minor): it works on the copy.

A copied venv's bin/activate still names the original (its path is written into it), so a
script that sourced it ran and installed into the original instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import ROOT


def test_setup_uses_the_venv_it_is_given_not_the_one_it_was_copied_from(tmp_path: Path) -> None:
    original, copy = tmp_path / "original", tmp_path / "copy"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(original)], check=True)
    purelib = Path(sysconfig.get_paths(vars={"base": str(original), "platbase": str(original)})["purelib"])
    # The copy sees this test's packages (torch, ray, tuner): setup.sh has nothing to install.
    shutil.copytree(original, copy, symlinks=True)
    site = Path(sysconfig.get_paths(vars={"base": str(copy), "platbase": str(copy)})["purelib"])
    ours = sysconfig.get_paths()["purelib"]
    (site / "tests_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    (copy / ".tuner-installed").touch()
    os.utime(copy / ".tuner-installed", (2**31, 2**31))  # newer than pyproject.toml
    assert purelib.is_dir() and not (purelib / "tests_env.pth").exists()  # the original has none
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=ROOT,
        env={**env, "VENV": str(copy)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[setup] ready: torch" in done.stdout
