"""The browser suite's one chromium (Debian's, launched by its path: Playwright cannot download its own here),
shared by the notebooks' tests (test_jupyterlab.py) and the docs site's (test_docs_site.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
#: the suite's screenshots, for people to look at
SHOTS = Path(__file__).resolve().parent.parent / "traces" / "browser"


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield b
        b.close()
