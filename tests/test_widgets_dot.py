"""The tl.dot explorer (tilebook.course.widgets_dot): its data, its checks, and a real browser."""

from __future__ import annotations

import json
import re

import pytest

from tilebook.course.widgets_dot import DotExplorer

KNOBS = {"target": ["sm_90", "sm_80"], "inputs": ["fp16 -> fp32", "fp16 -> fp16"]}
FACTS = {"acc": "accumulator", "rate": "rate"}


def _rows():
    rows = []
    for t in KNOBS["target"]:
        for i in KNOBS["inputs"]:
            r = {"target": t, "inputs": i, "headline": f"{t} {i}", "acc": i[-4:]}
            if t == "sm_90":
                r["rate"] = "measured <here> & there"
            if i.endswith("fp16"):
                r["wrong"] = "the accumulator loses accuracy"
            rows.append(r)
    return rows


def _widget(**kw):
    return DotExplorer(_rows(), KNOBS, FACTS, caption="test data", **kw)


def test_data_holds_every_row_with_its_facts_and_flags():
    data = _widget().data()
    assert [k["name"] for k in data["knobs"]] == ["target", "inputs"]
    assert data["knobs"][0]["values"] == ["sm_90", "sm_80"]  # the order given, not sorted
    assert len(data["rows"]) == 4
    wrong = [r for r in data["rows"] if "wrong" in r]
    assert {r["knobs"]["inputs"] for r in wrong} == {"fp16 -> fp16"}
    sm80 = next(
        r for r in data["rows"] if r["knobs"] == {"target": "sm_80", "inputs": "fp16 -> fp32"}
    )
    assert sm80["facts"] == {"acc": "fp32"}  # no rate fact where the row has none
    assert [f["label"] for f in data["facts"]] == ["accumulator", "rate"]


def test_row_lookup():
    w = _widget()
    assert w.row(target="sm_80", inputs="fp16 -> fp16")["headline"] == "sm_80 fp16 -> fp16"
    with pytest.raises(ValueError, match="every knob"):
        w.row(target="sm_80")


def test_html_escapes_the_data_and_marks_the_root():
    html = _widget(title="tl.dot <explorer>")._repr_html_()
    assert 'data-tilebook-widget="dot"' in html
    assert "<here>" not in html and "\\u003chere\\u003e" in html
    assert "tl.dot &lt;explorer&gt;" in html
    payload = re.search(r'class="tbw-data">(.*?)</script>', html).group(1)
    assert json.loads(payload)["rows"][0]["facts"]["rate"] == "measured <here> & there"


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([], "at least one row"),
        ([{"target": "sm_90", "headline": "x"}], "lacks"),
        ([{"target": "sm_70", "inputs": "fp16 -> fp32", "headline": "x"}], "not among"),
        ([{**_rows()[0]}, {**_rows()[0]}], "two rows"),
        ([{**r, "wrong": "no"} for r in _rows()], "not wrong"),
    ],
)
def test_bad_rows_are_refused(rows, match):
    with pytest.raises(ValueError, match=match):
        DotExplorer(rows, KNOBS, FACTS, caption="")


def test_bad_knobs_and_initial_values_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        DotExplorer(_rows(), {"target": ["sm_90", "sm_90"]}, FACTS, caption="")
    with pytest.raises(ValueError, match="initial"):
        _widget(initial={"target": "sm_75"})
    with pytest.raises(TypeError, match="text"):
        DotExplorer([{**_rows()[0], "acc": 32}], KNOBS, FACTS, caption="")


@pytest.mark.browser
def test_the_first_knob_changes_the_display_and_wrong_rows_are_flagged():
    from conftest import CHROMIUM, CHROMIUM_ARGS, require_browser

    require_browser()
    from playwright.sync_api import sync_playwright

    page_html = f"<!doctype html><html><body>{_widget()._repr_html_()}</body></html>"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        problems = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.set_content(page_html)
        w = page.locator('[data-tilebook-widget="dot"]')
        before = (w.get_attribute("data-value"), w.locator(".tbw-readout").inner_text())
        assert before == ("sm_90 | fp16 -> fp32", "sm_90 fp16 -> fp32")
        assert w.get_attribute("data-verdict") == "ok"
        assert "measured <here> & there" in w.inner_text()
        w.locator("input[type=radio]").nth(1).check()  # first knob: sm_80
        assert w.get_attribute("data-value") == "sm_80 | fp16 -> fp32"
        assert w.locator(".tbw-readout").inner_text() == "sm_80 fp16 -> fp32"
        assert "rate" not in w.locator(".tbw-facts").inner_text()
        w.locator("input[type=radio]").nth(3).check()  # second knob: fp16 -> fp16
        assert w.get_attribute("data-verdict") == "wrong"
        assert "tbw-wrong" in (w.get_attribute("class") or "")
        assert w.locator(".tbw-verdict").inner_text() == "Wrong: the accumulator loses accuracy"
        page.keyboard.press("Shift+Tab")  # the radios are native: reachable by keyboard
        browser.close()
    assert not problems, problems
