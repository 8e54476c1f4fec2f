"""The browser suite's one chromium (Debian's, launched by its path: Playwright cannot download its own here),
shared by the notebooks' tests (test_jupyterlab.py) and the docs site's (test_docs_site.py)."""

from __future__ import annotations

import os

import pytest

CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()
