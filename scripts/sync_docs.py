"""Rewrite the parts of the manual that are made from the code (tests/test_docs.py checks them).

usage: python scripts/sync_docs.py

- docs/reference/sweep-file.md: every field of the sweep file, from the config's descriptions;
- docs/reference/cli.md: every command's arguments and options, from the argument parser;
- docs/reference/python.md: every name of `tuner`'s public surface, from its signature and docstring;
- docs/explanation/architecture.md: every package and module, from their docstrings.

Each part sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`; the rest of a page is
written by hand and left alone.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _between(text: str, name: str, body: str) -> str:
    """`text` with the part called `name` replaced by `body` (it must be there, once)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    pattern = re.escape(start) + r".*?" + re.escape(end)
    if len(re.findall(pattern, text, flags=re.S)) != 1:
        raise SystemExit(f"expected one {start} ... {end} in the page")
    return re.sub(pattern, lambda _: f"{start}\n{body}{end}", text, flags=re.S)


def _cell(text: str) -> str:
    """One table cell: one line, `|` escaped, and `<`/`>` as entities outside code spans (where
    Markdown would take `<name>` for an HTML tag; inside them it shows entities as they are)."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    text = "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)
    return text.replace("|", "\\|")


# --- the sweep file's fields -------------------------------------------------------------------


def sweep_fields() -> str:
    from tuner.config import reference_markdown

    return reference_markdown()


# --- the command line --------------------------------------------------------------------------


def _commands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(`python -m tuner sweep`, its one-line help, its parser) of every command, nested ones too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                words = f"{prefix} {name}"
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield words, helps.get(name, ""), sub
                    yield from _commands(sub, words)
                else:
                    yield words, helps.get(name, ""), sub


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{_positional(action)}`"
    flags = ", ".join(f"`{s}`" for s in action.option_strings)
    if action.nargs == 0:
        return flags
    value = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
    )
    return f"{flags} `{value}`"


def _positional(action: argparse.Action) -> str:
    name = action.metavar or action.dest.upper()
    return name + (" ..." if action.nargs in ("+", "*") and name != "..." else "")


def _usage(words: str, parser: argparse.ArgumentParser) -> str:
    parts = [words]
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            parts.append("{" + "|".join(a.choices) + "} ...")
        elif not a.option_strings:
            parts.append(_positional(a))
    if any(a.option_strings and not isinstance(a, argparse._HelpAction) for a in parser._actions):
        parts.append("[options]")
    return " ".join(parts)


def command_line() -> str:
    from tuner.cli import build_parser

    out = []
    for words, summary, parser in _commands(build_parser(), "python -m tuner"):
        out += [f"### {words[len('python -m ') :]}", "", f"`{_usage(words, parser)}`: {_cell(summary)}", ""]
        rows = [
            a
            for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        if rows:
            out += ["| argument | meaning |", "| --- | --- |"]
            for a in rows:
                default = f" (default: {a.default})" if a.choices and a.default is not None else ""
                out.append(f"| {_argument(a)} | {_cell((a.help or '') + default)} |")
            out.append("")
    return "\n".join(out)


# --- the Python API ---------------------------------------------------------------------------


def _signature(obj: object) -> str:
    """`(a: int, b: str = 'x') -> None`, annotations as written (they are strings here)."""
    sig = inspect.signature(obj)  # type: ignore[arg-type]
    plain = sig.replace(
        parameters=[p.replace(annotation=_bare(p.annotation)) for p in sig.parameters.values()],
        return_annotation=_bare(sig.return_annotation),
    )
    return str(plain)


class _Bare(str):
    def __repr__(self) -> str:  # an annotation shown as written, without quotes
        return str(self)


def _bare(annotation: object) -> object:
    return _Bare(annotation) if isinstance(annotation, str) else annotation


def python_api() -> str:
    import tuner

    out = []
    for name in tuner.__all__:
        obj = getattr(tuner, name)
        kind = "class" if inspect.isclass(obj) else "def"
        head = f"class tuner.{name}" if kind == "class" else f"tuner.{name}{_signature(obj)}"
        paragraphs = [" ".join(par.split()) for par in (inspect.getdoc(obj) or "").split("\n\n")]
        out += [f"### tuner.{name}", "", "```python", head, "```", ""]
        out += [line for par in paragraphs for line in (par, "")]
    return "\n".join(out)


# --- the module map ----------------------------------------------------------------------------


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def module_map() -> str:
    out = []
    packages = sorted({p.parent for p in (ROOT / "tuner").rglob("__init__.py")})
    for package in packages:
        name = package.relative_to(ROOT).as_posix() + "/"
        init = _summary(package / "__init__.py")
        out += [f"### `{name}`", "", *([init, ""] if init else [])]
        out += ["| module | what it holds |", "| --- | --- |"]
        for module in sorted(package.glob("*.py")):
            if module.name != "__init__.py":
                out.append(f"| `{module.name}` | {_cell(_summary(module))} |")
        out.append("")
    return "\n".join(out)


# --- the pages ---------------------------------------------------------------------------------

PARTS: dict[str, tuple[Path, Callable[[], str]]] = {
    "reference": (DOCS / "reference" / "sweep-file.md", sweep_fields),
    "cli": (DOCS / "reference" / "cli.md", command_line),
    "python": (DOCS / "reference" / "python.md", python_api),
    "modules": (DOCS / "explanation" / "architecture.md", module_map),
}


def synced() -> dict[Path, str]:
    """Every page with a generated part, as it should read."""
    pages: dict[Path, str] = {}
    for name, (page, make) in PARTS.items():
        pages[page] = _between(pages.get(page) or page.read_text(), name, make())
    return pages


if __name__ == "__main__":
    for page, text in synced().items():
        if page.read_text() != text:
            page.write_text(text)
            print(f"updated {page.relative_to(ROOT)}")
