"""The headless browser the browser tests drive: Debian's Chromium through the ``playwright`` package
(no browser is downloaded).

Where the browser is required — under CI (``CI`` set) or when the caller asked for the check (``required``)
— a missing browser fails the test module instead of skipping it, so the check cannot vanish unnoticed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browser_api(required: bool = False):
    """``playwright.sync_api``, or skip the module (fail it where the browser is required)."""
    required = required or bool(os.environ.get("CI"))
    stop = (lambda msg: pytest.fail(msg, pytrace=False)) if required else \
        (lambda msg: pytest.skip(msg, allow_module_level=True))
    if not CHROMIUM.exists():
        stop(f"{CHROMIUM} is missing (install it with `apt-get install chromium`)")
    try:
        from playwright import sync_api
    except ImportError:
        stop("the playwright package is missing (pip install it)")
    return sync_api


def screenshot_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $COURSE_SCREENSHOTS, else the test's temporary folder."""
    folder = Path(os.environ.get("COURSE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
