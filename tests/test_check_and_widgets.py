"""Correctness reports and widget HTML."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tilebook.check import CorrectnessError, CorrectnessReport
from tilebook.widgets import SweepExplorer, embed_json


def test_report_passes_and_prints_table(capsys):
    rep = CorrectnessReport("demo")
    x = torch.randn(100)
    rep.check("exact", x, x.double())
    rep.check("fp16", x.half(), x.double())
    rep.assert_ok()
    out = capsys.readouterr().out
    assert "max abs err" in out and "verdict" in out
    assert out.count(" ok") == 2


def test_report_raises_on_wrong_answer():
    rep = CorrectnessReport()
    x = torch.randn(100)
    rep.check("off by a bit", x + 1e-3, x.double())
    with pytest.raises(CorrectnessError, match="off by a bit"):
        rep.assert_ok()


def test_nan_and_inf_handling():
    rep = CorrectnessReport()
    ref = torch.tensor([1.0, float("nan"), float("-inf")], dtype=torch.float64)
    assert rep.check("same specials", ref.float(), ref).ok
    assert not rep.check("nan where finite", torch.tensor([float("nan"), 0.0, 0.0]), ref).ok
    assert not rep.check("inf sign", torch.tensor([1.0, float("nan"), float("inf")]), ref).ok


def test_empty_report_is_not_ok():
    with pytest.raises(CorrectnessError, match="no case"):
        CorrectnessReport().assert_ok()


def test_embed_json_cannot_close_the_script_tag():
    text = embed_json({"s": "</script><script>alert(1)</script>&"})
    assert "</script>" not in text and "<" not in text and "&" not in text
    assert json.loads(text) == {"s": "</script><script>alert(1)</script>&"}


def _rows():
    return [
        {"BLOCK_SIZE": b, "num_warps": w, "gbps": float(b * w)} for b in (128, 256) for w in (1, 4)
    ]


def test_sweep_widget_html_is_self_contained():
    w = SweepExplorer(_rows(), ["BLOCK_SIZE", "num_warps"], "gbps", "GB/s", caption="recorded on X")
    html = w._repr_html_()
    assert html.count("<script") == 2
    assert not re.search(r"(src|href)\s*=", html), "no external resources"
    data = json.loads(re.search(r'class="tbw-data">(.*?)</script>', html).group(1))
    assert [k["values"] for k in data["knobs"]] == [[128, 256], [1, 4]]
    assert len(data["rows"]) == 4 and data["caption"] == "recorded on X"
    # two widgets on one page must not collide
    assert re.search(r'id="(tbw-\w+)"', html).group(1) != re.search(
        r'id="(tbw-\w+)"', w._repr_html_()
    ).group(1)


def test_sweep_widget_rejects_bad_rows():
    with pytest.raises(ValueError, match="at least one measured row"):
        SweepExplorer([], ["a"], "gbps", "GB/s", caption="c")
    with pytest.raises(ValueError, match="lacks"):
        SweepExplorer([{"a": 1}], ["a"], "gbps", "GB/s", caption="c")
