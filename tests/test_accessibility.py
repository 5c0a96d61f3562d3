"""axe-core in headless Chromium: no serious or critical violation on the landing page
and every lesson, in light and dark mode; images have alt text; widgets work from the
keyboard (their knobs are native range inputs and radio groups, focusable with Tab)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import lesson_pages

pytestmark = [pytest.mark.site, pytest.mark.browser]

AXE = None


def _axe_source() -> str:
    import axe_playwright_python

    return (Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text()


def _violations(page) -> list[dict]:
    global AXE
    AXE = AXE or _axe_source()
    page.add_script_tag(content=AXE)
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"][:3]]}
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_no_serious_accessibility_violations(server, browser_page, built_site, theme):
    page, _, outside = browser_page
    html_dir, _ = built_site
    found = {}
    for path in ["index.html", *lesson_pages(html_dir)]:
        page.goto(f"{server}/{path}", wait_until="load")
        # colours are read at once: no transition may be half-way between themes
        page.add_style_tag(content="*, *::before, *::after { transition: none !important; }")
        page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
        bad = _violations(page)
        if bad:
            found[path] = bad
    assert not found, found
    assert not outside, f"requests left localhost: {outside}"


def test_every_image_has_alt_text(server, browser_page, built_site):
    page, _, _ = browser_page
    html_dir, _ = built_site
    missing = {}
    for path in ["index.html", *lesson_pages(html_dir)]:
        page.goto(f"{server}/{path}", wait_until="load")
        bad = page.evaluate(
            "() => [...document.querySelectorAll('article img')]"
            ".filter(i => !(i.getAttribute('alt') || '').trim()).map(i => i.src)"
        )
        if bad:
            missing[path] = bad
    assert not missing, missing


def test_widget_knobs_are_reachable_with_the_keyboard(server, browser_page, built_site):
    page, _, _ = browser_page
    html_dir, _ = built_site
    for path in lesson_pages(html_dir):
        page.goto(f"{server}/{path}", wait_until="load")
        widgets = page.locator('[data-tilebook-widget="sweep"]')
        if not widgets.count():
            continue
        first = widgets.first
        first.scroll_into_view_if_needed()
        knob = first.locator("input").first
        knob.focus()
        assert page.evaluate("() => document.activeElement.tagName") == "INPUT", path
        tag = first.locator("td[role=button]")
        if tag.count():
            tag.first.focus()
            page.keyboard.press("Enter")
            assert "tbw-cur" in (tag.first.get_attribute("class") or ""), path
