"""README, --help and the shipped files stay in step with the code."""

from __future__ import annotations

import importlib.util
import re

from tests.conftest import ROOT, cli


def _sync_module():
    spec = importlib.util.spec_from_file_location("sync_readme", ROOT / "scripts" / "sync_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_reference_is_current() -> None:
    text = (ROOT / "README.md").read_text()
    assert _sync_module().synced(text) == text, "run: python scripts/sync_readme.py"


def test_readme_opens_with_the_two_setup_commands() -> None:
    code = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in code.splitlines() if line.strip()]
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci


def test_help_lists_every_command_and_override() -> None:
    out = cli("--help")
    for cmd in ("sweep", "validate", "schema"):
        assert cmd in out.stdout
    sweep_help = cli("sweep", "--help").stdout
    for flag in ("--algorithm", "--num-samples", "--seed", "--max-epochs", "--output", "--address", "--set"):
        assert flag in sweep_help
