"""Shared test set-up: GPU-only tests skip themselves on a CPU build; the built site and
a browser on it for the site tests."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

import tilebook

# The site is built once per session, in the background from the end of collection
# on, into a folder that the session's processes (pytest-xdist's workers) share: the
# controller names it before it starts any worker.
SITE_SHARED = "TILEBOOK_SITE_SHARED"
SITE_KEEP_S = 4 * 3600  # longer than any test session (CI allows 90 minutes)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        # Keep the sites of the last two sessions (to look at, or to reuse through
        # TILEBOOK_BUILT_SITE=<folder>/site), as pytest keeps its last temporary folders,
        # and any from the last few hours: another session running beside this one may
        # still be reading its site after the build.
        import site_build

        old = sorted(Path(tempfile.gettempdir()).glob("tilebook-site-*"), key=os.path.getmtime)
        recent = time.time() - SITE_KEEP_S
        for folder in old[:-2]:
            if os.path.getmtime(folder) < recent and not site_build.building(folder):
                shutil.rmtree(folder, ignore_errors=True)
        os.environ[SITE_SHARED] = tempfile.mkdtemp(prefix="tilebook-site-")


@pytest.hookimpl(tryfirst=True)  # under xdist: before the worker reports its collection
def pytest_collection_finish(session):
    if os.environ.get("TILEBOOK_BUILT_SITE") or session.testsfailed:  # collection errors
        return
    if any("built_site" in getattr(item, "fixturenames", ()) for item in session.items):
        import site_build

        shared = Path(os.environ[SITE_SHARED])
        if hasattr(session.config, "workerinput"):
            # The controller starts it (pytest_xdist_node_collection_finished): a worker
            # may end before the build does, and the process that starts a build must
            # outlive it, to end it and collect its exit.
            (shared / "wanted").touch()
        else:
            site_build.start(shared)
        # The build times every lesson against its CPU budget: the tests running beside
        # it yield the CPU to it (the build, started first, keeps its priority).
        if hasattr(os, "nice"):
            os.nice(10)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller, as each worker reports its collection (before any test is sent
    to a worker): start the build if a worker's tests want it."""
    shared = Path(os.environ[SITE_SHARED])
    if (shared / "wanted").is_file():
        import site_build

        site_build.start(shared)


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        import site_build

        site_build.stop(Path(os.environ[SITE_SHARED]))


def pytest_collection_modifyitems(config, items):
    # The tests of the built site last: the site builds in the background meanwhile,
    # and pytest-xdist hands out tests in this order, so no worker sits waiting for the
    # build while other tests could run (CI's two cores were idle for minutes).
    items.sort(key=lambda item: "built_site" in getattr(item, "fixturenames", ()))
    if tilebook.is_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; tilebook is in CPU (interpreter) mode")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    return tilebook.device()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def built_site():
    """The site, built once in CPU mode: (html directory, build log).

    ``TILEBOOK_BUILT_SITE=<dir>`` (a build's output folder holding ``html/`` and
    ``build.log``) reuses a site built before, to iterate on the site tests.
    """
    given = os.environ.get("TILEBOOK_BUILT_SITE")
    if given:
        root = Path(given)
        return root / "html", (root / "build.log").read_text()
    import site_build

    return site_build.wait(Path(os.environ[SITE_SHARED]))


def lesson_pages(html_dir) -> list[str]:
    """Every lesson page of a built site, relative to its root."""
    return sorted(
        str(p.relative_to(html_dir)) for p in (html_dir / "lessons").glob("*/[0-9][0-9]_*.html")
    )


# -- a real browser (Debian's Chromium, driven by Playwright) on the built site -----------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
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


def require_browser():
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
    httpd.server_close()
    thread.join(timeout=5)


@pytest.fixture
def browser_page(server):
    require_browser()
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


def _lesson_pages(html_dir):
    return sorted(
        str(p.relative_to(html_dir)) for p in (html_dir / "lessons").glob("*/[0-9][0-9]_*.html")
    )
