"""The built site in a real browser (Debian's Chromium): widgets react to their knobs,
every lesson fits 1280 px, pages load clean in dark mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import lesson_pages

pytestmark = [pytest.mark.site, pytest.mark.browser]

LESSON = "lessons/03_real_kernels/07_vector_add.html"


def test_widget_knob_changes_the_display(server, browser_page):
    page, problems, outside = browser_page
    page.goto(f"{server}/{LESSON}", wait_until="load")
    widget = page.locator('[data-tilebook-widget="sweep"]').first
    widget.scroll_into_view_if_needed()
    readout = widget.locator(".tbw-readout")
    before_text = readout.inner_text()
    before_value = widget.get_attribute("data-value")
    assert "GB/s" in before_text

    # Turn the first slider all the way down with the keyboard, as a reader would.
    knob = widget.locator('input[type="range"]').first
    knob.focus()
    for _ in range(12):
        page.keyboard.press("ArrowLeft")
    assert readout.inner_text() != before_text
    assert widget.get_attribute("data-value") != before_value

    # Clicking a grid cell moves both knobs; the slowest cell must be flagged as slow.
    cells = widget.locator("td[title]")
    values = [float(c.inner_text().split()[-1]) for c in cells.all()]
    slowest = cells.nth(values.index(min(values)))
    slowest.click()
    assert "tbw-slow" in (widget.get_attribute("class") or "")
    assert widget.locator(".tbw-verdict").inner_text().startswith("Slow")
    page.screenshot(path=str(os.environ.get("TILEBOOK_SCREENSHOT", "/tmp/tilebook-lesson07.png")))

    assert not problems, problems
    assert not outside, f"requests left localhost: {outside}"


_FIT_JS = """() => {
  const art = document.querySelector('article.bd-article');
  const bad = [];
  const over = (e) => e.scrollWidth > e.clientWidth + 1;
  art.querySelectorAll('pre').forEach(p => { if (over(p)) bad.push('pre: ' +
      p.textContent.split('\\n').reduce((a, b) => a.length > b.length ? a : b).slice(0, 70)); });
  art.querySelectorAll('.tbw, .tb-table-wrap, table').forEach(w => {
      if (over(w) || w.getBoundingClientRect().right > art.getBoundingClientRect().right + 1)
        bad.push(w.className + ': ' + w.scrollWidth + ' > ' + w.clientWidth); });
  art.querySelectorAll('img').forEach(i => {
      const want = Math.min(i.naturalWidth, 600);
      if (i.naturalWidth > 0 && i.clientWidth < 0.9 * want)
        bad.push('img shown at ' + i.clientWidth + 'px of ' + i.naturalWidth + ': ' + i.src); });
  return bad;
}"""


def test_every_lesson_fits_1280px(server, browser_page, built_site):
    """No code or output block, table, widget or figure of a lesson overflows at 1280 px."""
    page, problems, outside = browser_page
    html_dir, _ = built_site
    lessons = lesson_pages(html_dir)
    assert lessons
    report = {}
    for path in lessons:
        page.goto(f"{server}/{path}", wait_until="load")
        bad = page.evaluate(_FIT_JS)
        if bad:
            report[path] = bad
    assert not report, report
    assert not problems, problems
    assert not outside, f"requests left localhost: {outside}"


def _turn_first_knob(page, widget) -> None:
    """Act on a widget's first control as a reader would: a slider by the keyboard, a
    choice by clicking an unchecked option, a list by picking another entry."""
    slider = widget.locator('input[type="range"]')
    radios = widget.locator('input[type="radio"]')
    selects = widget.locator("select")
    buttons = widget.locator("button")
    if slider.count():
        slider.first.focus()
        key = (
            "ArrowLeft"
            if slider.first.input_value() != slider.first.get_attribute("min")
            else "ArrowRight"
        )
        page.keyboard.press(key)
    elif radios.count():
        next(r for r in radios.all() if not r.is_checked()).check()
    elif selects.count():
        options = selects.first.locator("option").all()
        current = selects.first.input_value()
        other = next(
            o.get_attribute("value") for o in options if o.get_attribute("value") != current
        )
        selects.first.select_option(other)
    else:
        buttons.first.click()


def test_every_widget_reacts(server, browser_page, built_site):
    """Every widget of every lesson changes what it shows when its first control moves."""
    page, problems, outside = browser_page
    html_dir, _ = built_site
    seen = 0
    for path in lesson_pages(html_dir):
        page.goto(f"{server}/{path}", wait_until="load")
        widgets = page.locator("[data-tilebook-widget]")
        for i in range(widgets.count()):
            w = widgets.nth(i)
            kind = w.get_attribute("data-tilebook-widget")
            w.scroll_into_view_if_needed()
            before = (w.get_attribute("data-value"), w.inner_text())
            _turn_first_knob(page, w)
            after = (w.get_attribute("data-value"), w.inner_text())
            assert after != before, f"{path}: widget {i} ({kind}) did not react"
            seen += 1
    assert seen >= 1
    assert not problems, problems
    assert not outside, f"requests left localhost: {outside}"


SCREENSHOTS = Path(
    os.environ.get("TILEBOOK_SCREENSHOTS", Path(__file__).parents[1] / "docs/_build/screenshots")
)


def test_pages_load_clean_in_both_themes_and_are_photographed(server, browser_page):
    """Top-level pages load without errors in light and dark mode; the landing page and
    lesson 07 are saved as screenshots in both (docs/_build/screenshots), to look at."""
    page, problems, outside = browser_page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for theme in ("light", "dark"):
        for path in ("index.html", "api.html", "glossary.html", "measurements.html", LESSON):
            page.goto(f"{server}/{path}", wait_until="load")
            page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
            assert page.locator("h1").first.is_visible(), path
            if path in ("index.html", LESSON):
                name = Path(path).stem
                page.screenshot(path=str(SCREENSHOTS / f"{name}-{theme}.png"), full_page=True)
    for theme in ("light", "dark"):
        for name in ("index", Path(LESSON).stem):
            assert (SCREENSHOTS / f"{name}-{theme}.png").stat().st_size > 10_000
    assert not problems, problems
    assert not outside, f"requests left localhost: {outside}"
