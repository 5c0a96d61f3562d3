"""The warps x stages widget's pitfall toggles (tilebook.course.widgets_pipeline): their checks,
their data, and a real browser that switches them with the mouse and the keyboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tilebook.course.aot import CompiledKernel
from tilebook.course.widgets_pipeline import PipelineExplorer, Pitfall


def _kernel(warps, stages, shared, regs, spill):
    return CompiledKernel(
        name="matmul_kernel",
        arch=90,
        stages={},
        num_warps=warps,
        num_stages=stages,
        shared_bytes=shared,
        registers=regs,
        spill_stores_bytes=spill,
        spill_loads_bytes=spill,
    )


COMPILED = {
    (4, 1): _kernel(4, 1, 49152, 255, 1536),
    (4, 2): _kernel(4, 2, 98304, 255, 2048),
    (8, 1): _kernel(8, 1, 49152, 232, 0),
    (8, 2): _kernel(8, 2, 98304, 205, 0),
}
REFUSED = {(8, 3): 245760}
ROOT = Path(__file__).resolve().parents[1]
PITFALLS = [
    Pitfall("fp16 accumulator", "the sum is off by 1.1e-01 of itself", "accumulate in fp32."),
    {"name": "no mask", "wrong": "reads <past> the end & sums 2.8e+07", "fix": "mask the loads"},
]


def _widget(**kw):
    kw = {"refused": REFUSED, "source": "aot", "title": "t", "pitfalls": PITFALLS, **kw}
    return PipelineExplorer(COMPILED, **kw)


def test_pitfalls_reach_the_data_in_order_as_dicts():
    data = _widget().data()
    assert data["pitfalls"] == [
        {
            "name": "fp16 accumulator",
            "wrong": "the sum is off by 1.1e-01 of itself",
            "fix": "accumulate in fp32.",
        },
        {
            "name": "no mask",
            "wrong": "reads <past> the end & sums 2.8e+07",
            "fix": "mask the loads",
        },
    ]
    # the rest of the data is the widget's as before: refused and spilling rows included
    rows = {(r["knobs"]["warps"], r["knobs"]["stages"]): r for r in data["rows"]}
    assert rows[8, 3]["refused"] is True and "240 KiB" in rows[8, 3]["wrong"]
    assert "spills 1536 bytes" in rows[4, 1]["note"]
    assert _widget(pitfalls=None).data()["pitfalls"] == []
    wrapped = Pitfall("fp16 accumulator", "off by 1.1e-01 of the sum,\nthe float32 one", "fp32")
    assert _widget(pitfalls=[wrapped]).data()["pitfalls"][0]["wrong"] == (
        "off by 1.1e-01 of the sum, the float32 one"
    )
    assert PipelineExplorer(COMPILED, source="s", title="t").pitfalls == []


def test_html_escapes_the_pitfalls_and_carries_their_script_and_css():
    html = _widget()._repr_html_()
    assert "<past>" not in html and "\\u003cpast\\u003e" in html
    payload = re.search(r'class="tbw-data">(.*?)</script>', html).group(1)
    assert json.loads(payload)["pitfalls"][1]["wrong"] == "reads <past> the end & sums 2.8e+07"
    assert html.count("<style>") == 1 and "table.tbw-pitfall-on td" in html
    assert "function settingUpdate(){" in html and "function update(){settingUpdate()" in html


@pytest.mark.parametrize(
    ("pitfalls", "error", "match"),
    [
        ("no mask", TypeError, "sequence of Pitfall"),
        ({"name": "a", "wrong": "b", "fix": "c"}, TypeError, "sequence of Pitfall"),
        (42, TypeError, "sequence of Pitfall"),
        ([("a", "b", "c")], TypeError, r"pitfalls\[0\] is not a Pitfall"),
        ([{"name": "a", "wrong": "b"}], ValueError, r"missing \['fix'\]"),
        ([{"name": "a", "wrong": "b", "fix": "c", "why": "d"}], ValueError, "unknown"),
        ([{"name": "a", "wrong": 3, "fix": "c"}], TypeError, "wrong must be text"),
        ([{"name": "a", "wrong": "b", "fix": "  "}], ValueError, "fix must not be empty"),
        ([Pitfall("a", "b", "c"), {"name": "a", "wrong": "d", "fix": "e"}], ValueError, "differ"),
    ],
)
def test_bad_pitfalls_are_refused(pitfalls, error, match):
    with pytest.raises(error, match=match):
        _widget(pitfalls=pitfalls)


def test_a_pitfall_checks_its_own_fields():
    with pytest.raises(TypeError, match="name must be text"):
        Pitfall(None, "b", "c")
    with pytest.raises(ValueError, match="labels a checkbox"):
        Pitfall("a name far too long to label one checkbox on a line", "b", "c")
    with pytest.raises(ValueError, match="wrong must not be empty"):
        Pitfall("a", "", "c")


def _site_css() -> str:
    """The lesson pages' styles: the site theme's (Bootstrap inside) and the project's."""
    import pydata_sphinx_theme

    theme = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme"
    css = theme / "static" / "styles" / "pydata-sphinx-theme.css"
    return css.read_text() + (ROOT / "docs" / "_static" / "tilebook.css").read_text()


def _axe_violations(page) -> list[dict]:
    import axe_playwright_python

    axe = Path(axe_playwright_python.__file__).parent / "axe.min.js"
    page.add_script_tag(content=axe.read_text())
    found = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"][:3]]}
        for v in found["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.browser
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_pitfall_checkboxes_switch_the_verdict_and_back(theme):
    from conftest import CHROMIUM, CHROMIUM_ARGS, require_browser

    require_browser()
    from playwright.sync_api import sync_playwright

    page_html = (
        f"<!doctype html><html lang='en' data-theme='{theme}'><head><title>w</title>"
        f"<style>{_site_css()}</style></head><body><main>{_widget()._repr_html_()}"
        f"{_widget(pitfalls=None)._repr_html_()}</main>"
        "</body></html>"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        problems = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.set_content(page_html)
        w, plain = page.locator('[data-tilebook-widget="sweep"]').all()
        # without pitfalls, no group and no fix line: the widget as it was
        assert plain.locator("fieldset, .tbw-fix").count() == 0
        assert plain.get_attribute("data-verdict") == "ok"
        verdict = w.locator(".tbw-verdict")
        # the initial setting (8 warps, 2 stages: the deepest that compiled) is untimed
        assert w.get_attribute("data-verdict") == "ok"
        assert verdict.inner_text().startswith("Not timed here")
        group = page.get_by_role("group", name="Put a pitfall into the kernel")
        assert group.evaluate("e => e.tagName") == "FIELDSET"
        boxes = group.get_by_role("checkbox")
        assert boxes.count() == 2
        # below the knobs, above the readout
        order = w.evaluate("e => [...e.querySelector('.tbw-body').children].map(c => c.className)")
        assert order.index("tbw-pitfalls") > order.index("tbw-knob")
        assert order.index("tbw-pitfalls") < order.index("tbw-readout")
        # the legend sits in the group's border, at the widget's size, not as the theme's
        # floating heading
        legend = group.locator("legend")
        assert legend.evaluate("e => getComputedStyle(e).cssFloat") == "none"
        assert legend.evaluate("e => getComputedStyle(e).fontSize") == "14px"

        # the mouse: a click on the label's checkbox
        acc = page.get_by_role("checkbox", name="fp16 accumulator")
        acc.click()
        assert acc.is_checked()
        assert verdict.inner_text() == "Wrong: the sum is off by 1.1e-01 of itself"
        assert w.get_attribute("data-verdict") == "wrong"
        assert "tbw-wrong" in w.get_attribute("class")
        fix = "Fix: accumulate in fp32. Until then no setting in the grid is right."
        assert w.locator(".tbw-fix").inner_text() == fix
        grid = w.locator("table.tbw-grid")
        assert "tbw-pitfall-on" in grid.get_attribute("class")
        right_cell = grid.locator("td[data-a='8'][data-b='2']")
        red = right_cell.evaluate("e => getComputedStyle(e).backgroundColor")
        assert red == "rgb(179, 38, 30)", red
        cross = "e => getComputedStyle(e, '::before').content"
        assert right_cell.evaluate(cross) == '"\u2717 "'
        assert _axe_violations(page) == []  # the red cells' contrast, the group's name
        acc.click()
        assert not acc.is_checked()
        assert verdict.inner_text().startswith("Not timed here")
        assert w.get_attribute("data-verdict") == "ok"
        assert "tbw-wrong" not in w.get_attribute("class")
        assert "tbw-pitfall-on" not in grid.get_attribute("class")
        assert w.locator(".tbw-fix").inner_text() == ""
        assert right_cell.evaluate("e => getComputedStyle(e).backgroundColor") != red
        assert right_cell.evaluate(cross) == "none"
        # both on: both texts, in the order given
        acc.click()
        page.get_by_role("checkbox", name="no mask").click()
        assert verdict.inner_text() == (
            "Wrong: the sum is off by 1.1e-01 of itself; reads <past> the end & sums 2.8e+07"
        )
        assert w.get_attribute("data-pitfalls") == "fp16 accumulator|no mask"
        acc.click()
        page.get_by_role("checkbox", name="no mask").click()
        assert w.get_attribute("data-verdict") == "ok"

        # the keyboard: focus and Space
        mask = page.get_by_role("checkbox", name="no mask")
        mask.focus()
        page.keyboard.press("Space")
        assert mask.is_checked()
        assert verdict.inner_text() == "Wrong: reads <past> the end & sums 2.8e+07"
        assert w.get_attribute("data-pitfalls") == "no mask"
        # a knob moved with a pitfall on: every setting stays wrong...
        w.locator("td[data-a='4'][data-b='1']").click()
        assert w.locator(".tbw-readout").inner_text().startswith("48")
        assert verdict.inner_text() == "Wrong: reads <past> the end & sums 2.8e+07"
        # ...but a refused setting still says why it builds nothing
        w.locator("td[data-a='8'][data-b='3']").click()
        assert verdict.inner_text().startswith("Refused: its pipeline needs 240 KiB")
        w.locator("td[data-a='4'][data-b='1']").click()
        mask.focus()
        page.keyboard.press("Space")
        assert not mask.is_checked()
        # off again: the setting's own verdict and its spills note come back
        assert verdict.inner_text().startswith("Not timed here")
        assert "spills 1536 bytes" in w.locator(".tbw-note").first.inner_text()
        assert w.get_attribute("data-verdict") == "ok"
        browser.close()
    assert not problems, problems
