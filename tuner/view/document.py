"""A tiny document model for the sweep report, rendered as Markdown or as one HTML file.

The report is built once as blocks (headings, paragraphs, tables, code, images) and each
renderer walks them, so report.md and report.html always say the same thing. The HTML is
self-contained: styles inline, images as data: URIs, no script, nothing fetched when it opens.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field
from typing import Union


@dataclass
class Heading:
    text: str


@dataclass
class Text:
    text: str


@dataclass
class Code:
    text: str


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)  # numeric columns, right-aligned


@dataclass
class Image:
    path: str  # a PNG beside the report
    alt: str


Block = Union[Heading, Text, Code, Table, Image]


def to_markdown(title: str, blocks: list[Block]) -> str:
    """GitHub-flavoured Markdown; images are linked by file name (they sit beside it)."""
    out = [f"# {_md(title)}", ""]
    for b in blocks:
        if isinstance(b, Heading):
            out += [f"## {_md(b.text)}", ""]
        elif isinstance(b, Text):
            out += [_md(b.text), ""]
        elif isinstance(b, Code):
            fence = "`" * max(3, _longest_run(b.text, "`") + 1)  # nothing inside can close it
            out += [f"{fence}bash", b.text, fence, ""]
        elif isinstance(b, Table):
            align = ["---:" if i in b.right else "---" for i in range(len(b.headers))]
            out += [_md_row(b.headers), _md_row(align), *(_md_row(r) for r in b.rows), ""]
        else:
            out += [f"![{_md(b.alt)}]({os.path.basename(b.path)})", ""]
    return "\n".join(out)


def _md(text: str) -> str:
    """Text as Markdown shows it literally: names and values from a sweep (a parameter, a
    model's error) may hold HTML, which Markdown viewers would otherwise render or run."""
    return html.escape(text, quote=False)


def _longest_run(text: str, char: str) -> int:
    run = best = 0
    for c in text:
        run = run + 1 if c == char else 0
        best = max(best, run)
    return best


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(_md(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1100px; padding: 0 1em; color: #1f2328; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; margin: .6em 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.r { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f8fa; padding: .7em; overflow-x: auto; white-space: pre-wrap; }
img { max-width: 100%; height: auto; display: block; margin: .5em 0; }
"""


def to_html(title: str, blocks: list[Block]) -> str:
    """One HTML page; every image is inlined, so the file opens offline, anywhere."""
    e = html.escape
    body = [f"<h1>{e(title)}</h1>"]
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h2>{e(b.text)}</h2>")
        elif isinstance(b, Text):
            body.append(f"<p>{e(b.text)}</p>")
        elif isinstance(b, Code):
            body.append(f"<pre><code>{e(b.text)}</code></pre>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{e(h)}</th>" for h in b.headers)
            rows = "".join(
                "<tr>" + "".join(_cell(c, i in b.right) for i, c in enumerate(r)) + "</tr>" for r in b.rows
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        else:
            with open(b.path, "rb") as f:
                data = base64.b64encode(f.read()).decode("ascii")
            body.append(f'<img alt="{e(b.alt)}" src="data:image/png;base64,{data}">')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _cell(text: str, right: bool) -> str:
    return f'<td class="r">{html.escape(text)}</td>' if right else f"<td>{html.escape(text)}</td>"
