"""tilebook.course.widgets_grid: the figures the Part I widgets show, for every setting.

The widgets' JavaScript only draws rows computed here; these tests check the
rows' arithmetic (programs, the unprocessed tail, unowned tiles, launch order)
on settings worked out by hand and against a kernel's own output, and that the
HTML is self-contained and marks its wrong settings.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import triton
import triton.language as tl

from tilebook.course.widgets_grid import (
    GRID_RULES,
    TILE_RULES,
    GridExplorer,
    ThreadsVsTilesExplorer,
    ownership_figure,
)


def _payload(widget) -> dict:
    page = widget._repr_html_()
    m = re.search(r'<script type="application/json" class="tbw-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def _rows(widget) -> list[dict]:
    d = _payload(widget)
    texts = d["texts"]

    def value(v):
        return texts[int(v[1:])] if isinstance(v, str) and v.startswith("@") else v

    return [{c: value(v) for c, v in zip(d["columns"], row, strict=True)} for row in d["table"]]


def test_threads_vs_tiles_rows_by_hand():
    w = ThreadsVsTilesExplorer(sizes=[1000, 4097], blocks=[256, 1024], num_warps=4)
    r = w.row(4097, 1024, "cdiv(N, BLOCK)")
    assert (r["programs"], r["tail"], r["idle"], r["wrong"], r["slow"]) == (5, 0, 0, "", "")
    assert r["threads_per_program"] == 128 and r["elements_per_thread"] == "8"
    r = w.row(4097, 1024, "N // BLOCK")
    assert (r["programs"], r["covered"], r["tail"]) == (4, 4096, 1)
    assert "element 4096 is never processed" in r["wrong"]
    r = w.row(1000, 256, "N")
    assert (r["programs"], r["needed"], r["idle"], r["tail"]) == (1000, 4, 996, 0)
    assert r["slow"] and not r["wrong"]
    assert w.row(1000, 1024, "N // BLOCK")["programs"] == 0  # nothing runs at all


def test_threads_vs_tiles_payload_holds_every_setting_and_its_notes():
    w = ThreadsVsTilesExplorer(
        sizes=[97, 1025], blocks=[128, 1024], notes={"N": "measured: slow"}, caption="c"
    )
    rows = _rows(w)
    assert len(rows) == 2 * 2 * len(GRID_RULES)
    assert rows == w.rows()
    assert all(r["note"] == ("measured: slow" if r["grid"] == "N" else "") for r in rows)
    page = w._repr_html_()
    assert 'data-tilebook-widget="threads-vs-tiles"' in page
    assert "http" not in page.split("<script>")[1]  # no external request


def test_grid_explorer_rows_by_hand():
    r = GridExplorer.row(GridExplorer([8], [8]), 40, 64, 16, 16, "cdiv")
    assert (r["grid_0"], r["grid_1"], r["tiles"], r["unowned"], r["idle"]) == (3, 4, 12, 0, 0)
    r = GridExplorer.row(GridExplorer([8], [8]), 40, 64, 16, 16, "floor")
    assert (r["grid_0"], r["grid_1"], r["unowned"]) == (2, 4, 4) and r["wrong"]
    r = GridExplorer.row(GridExplorer([8], [8]), 40, 64, 16, 16, "swapped axes")
    # grid (4, 3): tiles (i, j) with j == 3 have no owner; programs with p0 == 3 own nothing
    assert (r["grid_0"], r["grid_1"], r["unowned"], r["idle"]) == (4, 3, 3, 3)
    assert GridExplorer.owners(40, 64, 16, 16, "cdiv") == [
        [0, 3, 6, 9],
        [1, 4, 7, 10],
        [2, 5, 8, 11],
    ]
    r = GridExplorer.row(GridExplorer([8], [8]), 64, 64, 16, 16, "swapped axes")
    assert r["unowned"] == 0 and not r["wrong"]  # square: the mistake does not show


@triton.jit
def _stamp_tiles(out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)[:, None]
    cols = pid_n * BN + tl.arange(0, BN)[None, :]
    order = tl.zeros((BM, BN), dtype=tl.int32) + pid_m + pid_n * tl.num_programs(0)
    tl.store(out_ptr + rows * N + cols, order, mask=(rows < M) & (cols < N))


@pytest.mark.parametrize("rule", TILE_RULES)
def test_grid_explorer_owners_are_what_a_kernel_writes(rule, device):
    for m, n, bm, bn in ((40, 24, 16, 8), (24, 40, 8, 16)):
        out = torch.full((m, n), -1, dtype=torch.int32, device=device)
        _stamp_tiles[GridExplorer.grid(m, n, bm, bn, rule)](out, m, n, BM=bm, BN=bn)
        want = GridExplorer.owners(m, n, bm, bn, rule)
        assert out[::bm, ::bn].tolist() == want
        row = GridExplorer.row(GridExplorer([8], [8]), m, n, bm, bn, rule)
        assert row["unowned"] == sum(v < 0 for line in want for v in line)


def test_grid_explorer_payload_and_knob_order():
    w = GridExplorer(sizes=[16, 40], tiles=[8, 16], initial={"m": 40, "n": 16})
    d = _payload(w)
    assert [k["name"] for k in d["knobs"]] == ["m", "n", "block_m", "block_n", "grid"]
    assert d["knobs"][0]["kind"] == "slider" and d["knobs"][-1]["values"] == list(TILE_RULES)
    rows = _rows(w)
    assert len(rows) == 2 * 2 * 2 * 2 * 3
    assert any(r["wrong"] for r in rows) and any(not r["wrong"] for r in rows)
    assert 'data-tilebook-widget="grid-explorer"' in w._repr_html_()


def test_bad_widget_arguments_are_refused():
    with pytest.raises(ValueError, match="sizes"):
        ThreadsVsTilesExplorer(sizes=[], blocks=[128])
    with pytest.raises(ValueError, match="blocks"):
        ThreadsVsTilesExplorer(sizes=[10], blocks=[0])
    with pytest.raises(ValueError, match="grid rules"):
        ThreadsVsTilesExplorer(sizes=[10], blocks=[8], notes={"N / 2": "x"})
    with pytest.raises(ValueError, match="initial"):
        GridExplorer(sizes=[16], tiles=[8], initial={"m": 17})
    with pytest.raises(ValueError, match="unknown grid rule"):
        GridExplorer.grid(8, 8, 4, 4, "diagonal")


def test_ownership_figure_marks_each_program():
    owner = torch.tensor([0, 0, 1, 1, -1], dtype=torch.int32)
    fig = ownership_figure(owner, title="t")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["0", "1"]
    grid = torch.tensor([[0, 0, 2], [1, 1, -1]], dtype=torch.int32)
    fig = ownership_figure(grid, tile=(1, 2))
    assert [t.get_text() for t in fig.axes[0].texts] == ["0", "2", "1", "none"]
    with pytest.raises(ValueError, match="1-D or 2-D"):
        ownership_figure(torch.zeros(2, 2, 2))


@pytest.mark.browser
def test_programs_started_marks_exactly_the_first_tiles():
    """Moving "programs started" to k leaves tiles 0..k-1 started and the rest waiting
    (it once redrew before taking the new value: every tile waited)."""
    from conftest import CHROMIUM, CHROMIUM_ARGS, require_browser

    require_browser()
    from playwright.sync_api import sync_playwright

    w = GridExplorer([40, 64], [16], initial={"m": 40, "n": 64})  # 3 x 4 tiles, 12 programs
    page_html = f"<!doctype html><html lang='en'><body><main>{w._repr_html_()}</main></body></html>"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        problems = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.set_content(page_html)
        root = page.locator('[data-tilebook-widget="grid-explorer"]')
        step = root.get_by_role("slider", name="programs started")
        assert root.locator(".tbw-cell.run").count() == 12
        step.focus()
        for _ in range(5):
            page.keyboard.press("ArrowLeft")
        assert root.locator("output").last.inner_text() == "7"
        started = root.locator(".tbw-cell.run span:first-child").all_inner_texts()
        assert sorted(started) == sorted(f"#{i}" for i in range(7))  # in launch order
        # the numbers are the linear index, which a GPU follows mostly (lesson 02
        # measures how closely), not a start order the widget could vouch for
        assert "mostly, not exactly" in root.locator(".tbw-note").inner_text()
        assert root.locator(".tbw-cell.run").first.get_attribute("title").endswith("linear index 0")
        assert root.locator(".tbw-cell.wait").count() == 5
        assert root.get_attribute("data-value").endswith("/7")
        # a grid knob resets the count to the new grid's size
        root.get_by_role("radio", name="floor").check()
        assert root.locator(".tbw-cell.wait").count() == 0
        browser.close()
    assert not problems
