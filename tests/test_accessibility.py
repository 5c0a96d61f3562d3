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


def _violations(page, rules: list[str] | None = None, context: dict | None = None) -> list[dict]:
    """axe's serious and critical violations on the page (``rules``: only those;
    ``context``: axe's include and exclude lists, default the whole document)."""
    global AXE
    if not page.evaluate("() => typeof axe !== 'undefined'"):
        AXE = AXE or _axe_source()
        page.add_script_tag(content=AXE)
    options = {"resultTypes": ["violations"]}
    if rules:
        options["runOnly"] = {"type": "rule", "values": rules}
    result = page.evaluate("async ([c, o]) => await axe.run(c || document, o)", [context, options])
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"][:3]]}
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


#: The rules whose verdict depends on colours: all that the dark theme can change
#: (it sets colours and nothing else), so the dark pass runs only these, and the
#: alt text of images the theme shows only in the dark (its logo).
COLOUR_RULES = ["color-contrast", "link-in-text-block", "image-alt"]
#: Highlighted code and output: a span per token, two thirds of axe's time on a lesson
#: page (13 s of 15 on lesson 05, 2026-12-08), and the same stylesheet on every page.
#: The pages' pass leaves them out; :func:`test_code_blocks_light_and_dark` checks them
#: whole on the lesson with the most code.
CODE = "div.highlight"


def _themes(page, context: dict | None) -> dict[str, list]:
    """Violations in the light theme (every rule) and the dark (the colour rules)."""
    page.add_style_tag(content="*, *::before, *::after { transition: none !important; }")
    found = {}
    for theme, rules in (("light", None), ("dark", COLOUR_RULES)):
        page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
        bad = _violations(page, rules, context)
        if bad:
            found[theme] = bad
    return found


def test_no_serious_accessibility_violations_light_and_dark(server, browser_page, built_site):
    """Every page, light and dark, on one page load each; code blocks apart (below)."""
    page, _, outside = browser_page
    html_dir, _ = built_site
    found = {}
    for path in ["index.html", *lesson_pages(html_dir)]:
        page.goto(f"{server}/{path}", wait_until="load")
        bad = _themes(page, {"exclude": [[CODE]]})
        if bad:
            found[path] = bad
    assert not found, found
    assert not outside, f"requests left localhost: {outside}"


def test_code_blocks_light_and_dark(server, browser_page, built_site):
    page, _, _ = browser_page
    html_dir, _ = built_site
    longest = max(lesson_pages(html_dir), key=lambda p: (html_dir / p).stat().st_size)
    page.goto(f"{server}/{longest}", wait_until="load")
    assert page.locator(CODE).count() > 10, longest
    assert _themes(page, {"include": [[CODE]]}) == {}, longest


def test_the_dark_pass_sees_a_contrast_failure(server, browser_page, built_site):
    """The colour rules bite in the dark theme: grey text on the dark background."""
    page, _, _ = browser_page
    page.goto(f"{server}/index.html", wait_until="load")
    page.evaluate("document.documentElement.dataset.theme = 'dark'")
    page.evaluate(
        "() => { const p = document.createElement('p'); p.textContent = 'low contrast';"
        " p.style.color = '#333'; document.querySelector('article').prepend(p); }"
    )
    assert any(v["id"] == "color-contrast" for v in _violations(page, COLOUR_RULES))


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
