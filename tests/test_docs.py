"""The manual (README.md, docs/), --help and the shipped files stay in step with the code.

What is made from the code (the sweep file's fields, the CLI's options, the module map) must be
current; every link and #anchor must land on a file and a heading; every path a page names must
exist, inside the repository; every pointer from the code into docs/ must resolve.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli
from tuner.errors import ExitCode

DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *DOCS.rglob("*.md")])
# The directories of the repository a page may name a path in (`tuner/cli.py`, `scripts/...`).
REPO_DIRS = ("tuner", "scripts", "tests", "search_spaces", "deploy", "docs", "benchmarks", ".ci")


def _sync_module():
    spec = importlib.util.spec_from_file_location("sync_docs", ROOT / "scripts" / "sync_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of a page outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every #anchor of a page's headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    for _, line in _prose(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            seen.setdefault(f"{base}-{n}" if n else base, 1)
    return frozenset(seen)


def _links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link and image of a page, outside code."""
    found = []
    for number, line in _prose(path):
        line = re.sub(r"``.*?``|`[^`]*`", "", line)
        for target in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            found.append((number, target))
    return found


def _external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target))


# --- what is made from the code ----------------------------------------------------------------


def test_generated_parts_of_the_manual_are_current() -> None:
    for page, text in _sync_module().synced().items():
        assert page.read_text() == text, f"{_rel(page)} is out of date: run python scripts/sync_docs.py"


def test_generated_parts_change_with_the_code() -> None:
    # The reference is really made from the code: a field's description reaches the page.
    from tuner.config.sections import SearchSection

    sync = _sync_module()
    described = SearchSection.model_fields["seed"].description
    assert described and described in sync.sweep_fields()
    assert "`--num-samples` `N`" in sync.command_line()
    assert "| `sweep.py` | The Ray driver" in sync.module_map()
    assert "tuner.load_best(sweep_dir: str," in sync.python_api()


def test_readme_opens_with_the_two_setup_commands() -> None:
    code = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in code.splitlines() if line.strip()]
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci


def test_readme_is_the_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the manual is docs/"


def test_docs_index_lists_every_page() -> None:
    linked = {(DOCS / target.split("#")[0]).resolve() for _, target in _links(DOCS / "index.md")}
    missing = [_rel(p) for p in DOCS.rglob("*.md") if p.name != "index.md" and p.resolve() not in linked]
    assert not missing, f"docs/index.md does not link {missing}"


def test_help_lists_every_command_and_override() -> None:
    out = cli("--help")
    for cmd in ("sweep", "validate", "schema"):
        assert cmd in out.stdout
    sweep_help = cli("sweep", "--help").stdout
    for flag in ("--algorithm", "--num-samples", "--seed", "--max-epochs", "--output", "--address", "--set"):
        assert flag in sweep_help


# --- links, anchors and paths ------------------------------------------------------------------


def test_slug_is_githubs() -> None:
    assert slug("Your own loop (task.train)") == "your-own-loop-tasktrain"
    assert slug("The best model: best/, export, load_best") == "the-best-model-best-export-load_best"
    assert slug("Packing: `gpus_per_worker: pack`") == "packing-gpus_per_worker-pack"
    assert slug("Ray's private API, in one place") == "rays-private-api-in-one-place"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for number, target in _links(page):
        if _external(target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        where = f"{_rel(page)}:{number}: {target}"
        if not dest.is_relative_to(ROOT):
            broken.append(f"{where} (outside the repository)")
        elif not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_page_names_a_path_outside_the_repository(page: Path) -> None:
    # Paths in prose and code are written from the repository root; link targets are checked
    # above, relative to their page.
    text = re.sub(r"\]\([^)]*\)", "]", page.read_text())
    outside = [
        m.group(0)
        for m in re.finditer(r"(?<![\w.])(?:\.\./)+[\w.-]+(?:/[\w.-]*)*", text)
        if not (ROOT / m.group(0)).resolve().is_relative_to(ROOT)
    ]
    outside += re.findall(r"/work/[\w./-]*", text)
    assert not outside, f"{_rel(page)} names paths outside the repository: {outside}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_path_a_page_names_exists(page: Path) -> None:
    text = re.sub(r"\]\([^)]*\)", "]", page.read_text())
    dirs = "|".join(re.escape(d) for d in REPO_DIRS)
    pattern = rf"(?<![\w./<$-])(?:{dirs})/[\w./-]*[\w/]"
    missing = sorted({p for p in re.findall(pattern, text) if not (ROOT / p).exists()})
    assert not missing, f"{_rel(page)} names paths that do not exist: {missing}"


def _pointers() -> list[tuple[str, str]]:
    """(file:line, docs/PAGE.md#anchor) of every pointer from the code into the manual."""
    found = []
    for path in sorted((ROOT / "tuner").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for target in re.findall(r"docs/[\w/.-]+\.md(?:#[\w-]+)?", line):
                found.append((f"{_rel(path)}:{number}", target))
    return found


def test_every_pointer_from_the_code_into_the_manual_resolves() -> None:
    pointers = _pointers()
    assert len(pointers) >= 6  # the field descriptions' at least
    broken = []
    for where, target in pointers:
        file, _, anchor = target.partition("#")
        if not (ROOT / file).is_file():
            broken.append(f"{where}: {target} (no such page)")
        elif anchor and anchor not in anchors(ROOT / file):
            broken.append(f"{where}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    stale = [
        f"{_rel(p)}:{n}"
        for p in (ROOT / "tuner").rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "README:" in line
    ]
    assert not stale, f"README.md is no longer the manual; point into docs/ instead: {stale}"


def test_field_descriptions_point_into_the_manual() -> None:
    from tuner.config import reference_markdown

    pointers = set(re.findall(r"docs/[\w/.-]+\.md(?:#[\w-]+)?", reference_markdown()))
    assert "docs/how-to/own-loop.md" in pointers and "docs/how-to/search-space.md#constraints" in pointers


# --- pages that list what the code has ---------------------------------------------------------


def _constants(path: Path) -> dict[str, object]:
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if (
                name.isupper()
                and not name.startswith("_")
                and isinstance(node.value, (ast.Constant, ast.Dict))
            ):
                out[name] = ast.literal_eval(node.value)
    return out


def _as_named(value: str) -> str:
    """A file-name pattern as the docs write it: ^checkpoint_e(\\d{6})\\.pt$ -> checkpoint_eNNNNNN.pt,
    ^reports(-[0-9a-f]+)?\\.jsonl$ -> reports-<run>.jsonl."""
    return (
        value.strip("^$").replace(r"(\d{6})", "NNNNNN").replace("(-[0-9a-f]+)?", "-<run>").replace("\\", "")
    )


NOT_FILES = {"NOTICE", "SUMMARY_OLDER_DIRECTION"}  # names in sweepdir/files.py that are no file


def test_sweep_directory_page_names_every_file() -> None:
    page = (DOCS / "reference" / "sweep-directory.md").read_text()
    names: list[str] = []
    for name, value in _constants(ROOT / "tuner" / "sweepdir" / "files.py").items():
        if name in NOT_FILES:
            continue
        if isinstance(value, dict):
            names += list(value.values())
        elif isinstance(value, str):
            names.append(value)
    named = {part for span in re.findall(r"`([^`]*)`", page) for part in re.split(r"[/\s,()]+", span)}
    missing = [n for n in map(_as_named, names) if n not in named]
    assert len(names) > 15
    assert not missing, f"docs/reference/sweep-directory.md does not name {missing}"


def test_exit_codes_page_lists_every_code() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    table = page[page.index("## Exit codes") :]
    missing = [code.name for code in ExitCode if f"| `{int(code)}` |" not in table]
    assert not missing, f"docs/reference/cli.md#exit-codes lacks {missing}"


def test_ray_internals_page_names_every_private_use() -> None:
    page = (DOCS / "explanation" / "ray.md").read_text()
    tree = ast.parse((ROOT / "tuner" / "cluster" / "_ray_internals.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    assert len(functions) > 5
    missing = [f for f in functions if f"`{f}`" not in page]
    assert not missing, f"docs/explanation/ray.md does not name {missing}"
