"""Rewrite README.md's sweep-file reference from the code (tests/test_docs.py checks it).

usage: python scripts/sync_readme.py
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.config import reference_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- reference:start -->", "<!-- reference:end -->"


def synced(text: str) -> str:
    """README text with the reference section regenerated."""
    block = f"{START}\n{reference_markdown()}{END}"
    return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)


if __name__ == "__main__":
    README.write_text(synced(README.read_text()))
    print(f"updated {README}")
