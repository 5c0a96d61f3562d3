"""The sector model of a warp's load and the coalescing explorer built on it.

The model (:func:`tilebook.course.experiments.memory_access.warp_access`) is checked on
cases worked by hand; the explorer on what each setting shows: the right
verdict, notes that are true of their row only, the measured rate only where a
record of that dtype has the stride, and HTML that is self-contained.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from tilebook.course.bench import Record
from tilebook.course.experiments import memory_access as ma
from tilebook.course.widgets_memory import DTYPES, CoalescingExplorer

# ----------------------------------------------------------------------------- the model


def test_contiguous_float32_fills_whole_sectors():
    a = ma.warp_access(1, 4)
    assert (a.sectors, a.useful_bytes, a.efficiency) == (4, 128, 1.0)
    assert (a.loads, a.load_bytes) == (1, 4)
    assert a.sector_map == "hhhh"
    wide = ma.warp_access(1, 4, 4)  # four float32 per thread: one 16-byte load each
    assert (wide.loads, wide.load_bytes, wide.sectors) == (1, 16, 16)
    fp64 = ma.warp_access(1, 8, 4)  # 32 bytes per thread: two 16-byte loads
    assert (fp64.loads, fp64.load_bytes) == (2, 16)


@pytest.mark.parametrize(("stride", "sectors"), [(2, 8), (4, 16), (8, 32), (32, 32)])
def test_a_stride_spreads_the_warp_over_more_sectors(stride, sectors):
    a = ma.warp_access(stride, 4)
    assert a.sectors == sectors
    assert a.efficiency == pytest.approx(128 / (32 * sectors))
    assert (a.loads, a.load_bytes) == (1, 4)  # strided elements load one by one
    assert len(a.sector_map) == (31 * stride * 4 + 3) // 32 + 1
    assert a.sector_map.count(".") == len(a.sector_map) - sectors


def test_the_mask_decides_whether_the_tail_is_read():
    masked = ma.warp_access(1, 4, 1, valid=24, masked=True)
    assert (masked.sectors, masked.past_end, masked.past_end_sectors) == (3, 0, 0)
    assert masked.sector_map == "hhh,"
    open_ = ma.warp_access(1, 4, 1, valid=24, masked=False)
    assert (open_.sectors, open_.past_end, open_.past_end_sectors) == (4, 8, 1)
    assert open_.sector_map == "hhhx"
    assert open_.useful_bytes == masked.useful_bytes == 96
    # A sector holding both wanted elements and elements past the end:
    mixed = ma.warp_access(1, 4, 1, valid=20, masked=False)
    assert mixed.sector_map == "hhDx"


def test_predicted_ratio_counts_the_read_sectors_and_the_write():
    assert ma.predicted_ratio(1, 4) == 1.0
    assert ma.predicted_ratio(2, 4) == pytest.approx(2 / 3)
    assert ma.predicted_ratio(8, 4) == pytest.approx(2 / 9)
    assert ma.predicted_ratio(32, 4) == ma.predicted_ratio(8, 4)
    assert ma.predicted_ratio(16, 2) == pytest.approx(2 / 17)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stride": 0, "itemsize": 4},
        {"stride": 1, "itemsize": 3},
        {"stride": 1, "itemsize": 64},
        {"stride": True, "itemsize": 4},
        {"stride": 1, "itemsize": 4, "valid": 33},
        {"stride": 1, "itemsize": 4, "per_thread": 0},
    ],
)
def test_the_model_refuses_nonsense(kwargs):
    with pytest.raises(ValueError, match="warp_access"):
        ma.warp_access(**kwargs)


def test_specialization_is_what_triton_learns():
    big = ma.view_inputs(8192, 8192, device="meta")
    out = torch.empty(8192, 8192, device="meta")
    c = ma.specialization(ma.scale_2d_args(big["contiguous"], out, 2.0))
    assert c["constexprs"] == {"stride_xn": 1, "stride_on": 1}
    assert set(c["divisible_by_16"]) == {"x_ptr", "out_ptr", "M", "N", "stride_xm", "stride_om"}
    assert c["signature"]["alpha"] == "fp32" and c["signature"]["x_ptr"] == "*fp32"
    t = ma.specialization(ma.scale_2d_args(big["transposed"], out, 2.0))
    assert t["constexprs"] == {"stride_xm": 1, "stride_on": 1}
    s = ma.specialization(ma.scale_2d_args(big["column slice"], out, 2.0))
    assert "x_ptr" not in s["divisible_by_16"] and "stride_xm" not in s["divisible_by_16"]
    names = ["stride_xm", "stride_xn", "stride_om", "stride_on"]
    u = ma.specialization(ma.scale_2d_args(big["contiguous"], out, 2.0), do_not_specialize=names)
    assert all(u["signature"][n] == "i32" for n in names)
    assert not set(names) & (set(u["divisible_by_16"]) | set(u["constexprs"]))
    with pytest.raises(ValueError, match="unknown"):
        ma.specialization({"n": 3}, do_not_specialize=["m"])
    with pytest.raises(TypeError, match="bool"):
        ma.specialization({"flag": True})


# ----------------------------------------------------------------------------- launchers


def test_launchers_refuse_bad_input(device, monkeypatch):
    x = torch.randn(8, 8, device=device)
    with pytest.raises(ValueError, match="1 dimensions"):
        ma.strided_copy(x)
    with pytest.raises(TypeError, match="dtype"):
        ma.strided_copy(torch.arange(8, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        ma.strided_copy(x[0], torch.empty(16, device=device)[::2])
    with pytest.raises(ValueError, match="power of two"):
        ma.strided_copy(x[0], block_size=1000)
    with pytest.raises(ValueError, match="2 dimensions"):
        ma.scale_2d(x[0], 2.0)
    with pytest.raises(TypeError, match="alpha"):
        ma.scale_2d(x, torch.tensor(2.0))
    with pytest.raises(ValueError, match="shape"):
        ma.scale_2d(x, 2.0, torch.empty(8, 9, device=device))
    with pytest.raises(TypeError, match="dtype"):
        ma.scale_2d(x, 2.0, torch.empty(8, 8, device=device, dtype=torch.float16))
    monkeypatch.setattr(ma, "_INT32_MAX", 40)  # a small stand-in for 2**31 - 1
    with pytest.raises(ValueError, match="int32"):
        ma.scale_2d(x, 2.0)


# ----------------------------------------------------------------------------- the widget


def _record(gbps_by_stride: dict[int, float], dtype: str = "float32") -> Record:
    rows = [
        {"stride": s, "dtype": dtype, "gbps": g, "median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0}
        for s, g in gbps_by_stride.items()
    ]
    return Record("lesson04_strides", "t", rows, {"gpu": "TEST GPU", "date": "2000-01-01"})


def test_every_setting_has_a_row_with_the_model_s_counts():
    w = CoalescingExplorer()
    data = w.data()
    assert len(data["rows"]) == 6 * len(DTYPES) * 3 * 2
    assert [k["name"] for k in data["knobs"]] == ["stride", "dtype", "per_thread", "mask"]
    assert data["knobs"][0]["kind"] == "slider"  # the first knob reacts to a key press
    for r in data["rows"]:
        k = r["knobs"]
        elements = ma.WARP_SIZE * k["per_thread"]
        valid, masked = round(0.75 * elements), k["mask"] == "on"
        a = ma.warp_access(
            k["stride"], DTYPES[k["dtype"]], k["per_thread"], valid=valid, masked=masked
        )
        assert (r["sectors"], r["map"], r["past_end"]) == (a.sectors, a.sector_map, a.past_end)


def test_verdicts_and_notes_are_true_of_their_row():
    w = CoalescingExplorer()
    rows = {tuple(r["knobs"].values()): r for r in w.data()["rows"]}
    ok = rows[(1, "float32", 4, "on")]
    assert ok["verdict"] == "ok" and ok["efficiency"] == 1.0
    assert "16-byte" in ok["note"] and "switches off" in ok["note"]
    wrong = rows[(1, "float32", 4, "off")]
    assert wrong["verdict"] == "wrong" and wrong["past_end"] == 32
    assert "past the end" in wrong["headline"] and "switches off" not in wrong["note"]
    slow = rows[(8, "float32", 1, "on")]
    assert slow["verdict"] == "slow" and "sector of its own" in slow["note"]
    half = rows[(2, "float32", 1, "on")]
    assert half["verdict"] == "slow" and "one element in 2" in half["note"]
    for r in rows.values():
        assert (r["verdict"] == "wrong") == (r["past_end"] > 0)
        if r["verdict"] != "wrong":
            assert (r["verdict"] == "slow") == (r["efficiency"] < 0.75)
        one_wide_load = r["loads"] == 1 and r["load_bytes"] == 16
        if "16-byte instruction" in r["note"]:
            assert one_wide_load
        if r["verdict"] == "ok":
            assert ("16-byte instruction" in r["note"]) == one_wide_load


def test_measured_rates_show_only_where_they_were_measured():
    w = CoalescingExplorer(_record({1: 2000.0, 2: 1200.0, 8: 400.0}))
    rows = {tuple(r["knobs"].values()): r for r in w.data()["rows"]}
    text = rows[(2, "float32", 1, "on")]["measured"]
    assert "TEST GPU" in text and "60%" in text and "67%" in text
    assert rows[(4, "float32", 1, "on")]["measured"] is None  # stride 4 not in the record
    assert rows[(2, "float16", 1, "on")]["measured"] is None  # another dtype
    assert "TEST GPU" in w.data()["caption"]
    plain = CoalescingExplorer()
    assert all(r["measured"] is None for r in plain.data()["rows"])
    assert "no measured" in plain.data()["caption"]


def test_html_is_self_contained_and_marked():
    html = CoalescingExplorer(initial={"stride": 2})._repr_html_()
    assert 'data-tilebook-widget="coalescing"' in html
    payload = re.search(r'<script type="application/json" class="tbw-data">(.*?)</script>', html)
    data = json.loads(payload.group(1))
    assert data["knobs"][0]["initial"] == 2
    urls = set(re.findall(r"https?://[^\s\"']+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}  # an XML namespace, never fetched
    assert "<" not in payload.group(1)
    assert "--tbw-accent" in html and "aria-live" in html


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strides": []},
        {"strides": [0]},
        {"dtypes": ["float128"]},
        {"per_thread": [1.5]},
        {"tail": 1.0},
        {"slow_below": 0},
        {"initial": {"stride": 3}},
        {"initial": {"colour": "red"}},
    ],
)
def test_the_widget_refuses_nonsense(kwargs):
    with pytest.raises(ValueError, match="CoalescingExplorer"):
        CoalescingExplorer(**kwargs)


def test_the_widget_wants_a_record():
    with pytest.raises(TypeError, match="Record"):
        CoalescingExplorer({"stride": 1})
