"""Opening a page in headless Chromium (Debian's ``chromium`` package), driven by
Playwright over its DevTools pipe: console errors, every request, the DOM, a
screenshot. Playwright (PyPI) rather than Selenium: it reports console messages, page
errors and each network request as events, and needs no chromedriver matching the
browser; it launches the system's Chromium (no browser download).

Skipped where Chromium or Playwright is missing, unless
SNAKEMAKE_CONTEXT_REQUIRE_CHROMIUM=1 (CI), where that fails the test."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: Where tests leave what a person may look at (screenshots).
ARTIFACTS = Path(
    os.environ.get(
        "SNAKEMAKE_CONTEXT_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"
    )
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium() -> str:
    """The Chromium binary, or skip (fail under SNAKEMAKE_CONTEXT_REQUIRE_CHROMIUM=1)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    problem = None if found else "no chromium on PATH (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problem = problem or "playwright is not installed (pip install playwright)"
    if problem:
        if os.environ.get("SNAKEMAKE_CONTEXT_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"headless Chromium is required here: {problem}")
        pytest.skip(problem)
    assert found is not None
    return found


@dataclass
class Opened:
    """What a page did when opened: console errors, requests, and JS values asked for."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)


def open_page(path: Path, screenshot: Path, ready: str, asks: dict[str, str]) -> Opened:
    """Open ``path`` (a file), wait until the JS expression ``ready`` is true, evaluate
    ``asks`` (name -> JS expression), and save a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    binary = chromium()
    opened = Opened()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            profile, executable_path=binary, headless=True, args=FLAGS,
            viewport={"width": 1400, "height": 900},
        )  # fmt: skip
        try:
            page = context.new_page()
            page.on(
                "console", lambda m: opened.errors.append(m.text) if m.type == "error" else None
            )
            page.on("pageerror", lambda e: opened.errors.append(str(e)))
            page.on("request", lambda r: opened.requests.append(r.url))
            page.goto(path.resolve().as_uri())
            try:
                page.wait_for_function(ready, timeout=60_000)
            except Exception as error:
                state = page.evaluate("[document.readyState, typeof window.Bokeh]")
                raise AssertionError(f"{path} never got ready ({state}): {opened}") from error
            opened.values = {name: page.evaluate(js) for name, js in asks.items()}
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            context.close()
    return opened
