"""The tests' real browser: Debian's Chromium (``/usr/bin/chromium``), headless, driven by
Playwright (no browser download: Playwright only speaks to it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = "/usr/bin/chromium"

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
"""Headless, and nothing Chromium would fetch on its own (updates, sync, first-run pages)."""


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium for the block, closed after it."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()
