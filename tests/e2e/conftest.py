"""Browser tests: Debian's Chromium driven by Playwright against the live stack.

The live stack fixtures come from tests/support/live_stack.py (a plugin of the root conftest, so
the browser tests share the one session stack with the integration tests). Without Chromium or
Playwright the tests skip locally; under CI (CI=true) that is a failure instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
IN_CI = os.environ.get("CI", "").lower() == "true"
#: Where the browser tests save their screenshots: the README's copies with UPDATE_SCREENSHOTS=1, else var/ (a test run
#: does not dirty the work tree).
_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = _ROOT / "docs" / "screenshots" if os.environ.get("UPDATE_SCREENSHOTS") else _ROOT / "var" / "screenshots"


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"browser tests cannot run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(live_stack: Any) -> Iterator[Any]:
    """Chromium for one test module. Starts after the live stack, so the stack's processes never see the flag below."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -r requirements-dev.txt)")
    if not CHROMIUM.exists():
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    # Playwright's sync API keeps an asyncio loop in this thread, which makes Django refuse the ORM calls the
    # tests make to arrange data and check the database. This test thread is not async code: allow them here.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                yield chromium
            finally:
                chromium.close()
                connections.close_all()  # the tests' connection, opened under Playwright's loop: not left for teardown
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    try:
        yield page
    finally:
        context.close()
