"""Open lesson 07 in a real browser (Debian's Chromium), turn the widget's knob."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from urllib.parse import urlparse

import pytest

pytestmark = [pytest.mark.site, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
LESSON = "lessons/03_real_kernels/07_vector_add.html"
# Flags for a closed network: no background connections, no sandbox as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
]


def _require_browser():
    if os.path.exists(CHROMIUM):
        return
    if os.environ.get("CI"):
        pytest.fail(f"Chromium not found at {CHROMIUM} (CI must install Debian's chromium)")
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def server(built_site):
    html_dir, _ = built_site
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html_dir))

    class Quiet(handler.func):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, **handler.keywords)
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def browser_page(server):
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        problems: list[str] = []
        outside: list[str] = []

        def guard(route):
            host = urlparse(route.request.url).hostname
            if host in ("127.0.0.1", "localhost") or route.request.url.startswith("data:"):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        page.route("**/*", guard)
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on(
            "response",
            lambda r: problems.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None,
        )
        yield page, problems, outside
        browser.close()


def test_widget_knob_changes_the_display(server, browser_page):
    page, problems, outside = browser_page
    page.goto(f"{server}/{LESSON}", wait_until="load")
    widget = page.locator('[data-tilebook-widget="sweep"]')
    widget.scroll_into_view_if_needed()
    readout = widget.locator(".tbw-readout")
    before_text = readout.inner_text()
    before_value = widget.get_attribute("data-value")
    assert "GB/s" in before_text

    # Turn the BLOCK_SIZE knob all the way down with the keyboard, as a reader would.
    knob = widget.locator('input[data-knob="BLOCK_SIZE"]')
    knob.focus()
    for _ in range(8):
        page.keyboard.press("ArrowLeft")
    after_text = readout.inner_text()
    assert after_text != before_text
    assert widget.get_attribute("data-value") != before_value
    assert widget.locator("output").first.inner_text() == "128"

    # Clicking a grid cell moves both knobs; the slowest cell must be flagged as slow.
    cells = widget.locator("td[title]")
    values = [float(c.inner_text()) for c in cells.all()]
    slowest = cells.nth(values.index(min(values)))
    slowest.click()
    assert "tbw-slow" in (widget.get_attribute("class") or "")
    assert widget.locator(".tbw-verdict").inner_text().startswith("Slow")
    page.screenshot(path=str(os.environ.get("TILEBOOK_SCREENSHOT", "/tmp/tilebook-lesson07.png")))

    assert not problems, problems
    assert not outside, f"requests left localhost: {outside}"


def test_pages_load_clean_in_dark_mode(server, browser_page):
    page, problems, outside = browser_page
    for path in ("index.html", "api.html", "measurements.html", LESSON):
        page.goto(f"{server}/{path}", wait_until="load")
    page.evaluate("document.documentElement.dataset.theme = 'dark'")
    assert page.locator("h1").first.is_visible()
    assert not problems, problems
    assert not outside, f"requests left localhost: {outside}"
