"""A real headless browser for the UI tests: Debian's chromium driven by Playwright.

scripts/setup_browser.sh installs both (scripts/test.sh runs it). Nothing here skips: a
missing browser fails the test that needs it, with the command that installs it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def browser_page(profile: Path, width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A page in a fresh chromium profile (`profile` must not be in use)."""
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} missing: run scripts/setup_browser.sh"
    from playwright.sync_api import sync_playwright  # installed by scripts/setup_browser.sh

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": width, "height": height},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; AssertionError when it is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, "the first chunk of a PNG is IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height
