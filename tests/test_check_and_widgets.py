"""Correctness reports and widget HTML."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from importlib import resources

import pytest
import torch

import tilebook
import tilebook.course
from tilebook.course.check import CorrectnessError, CorrectnessReport
from tilebook.course.widgets import SweepExplorer, Widget, embed_json


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


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_widget_file_exists_and_every_file_is_used():
    """The widgets' CSS and JavaScript ship as files of the package: none missing, none idle."""
    modules = [
        importlib.import_module(f"tilebook.course.{m.name}")
        for m in pkgutil.iter_modules(tilebook.course.__path__)
        if m.name.startswith("widgets")
    ]
    folder = resources.files("tilebook.course") / "widgets_static"
    files = {f.name for f in folder.iterdir() if f.name.endswith((".css", ".js"))}
    named = {"base.css", "helpers.js"}  # every widget's, named by Widget._repr_html_
    for cls in _subclasses(Widget):
        named |= {*cls.scripts, *cls.styles}
    for module in modules:  # files a widget's data or script reads itself
        named |= set(re.findall(r"""asset\(["']([^"']+)["']\)""", inspect.getsource(module)))
    assert sorted(named - files) == [], "named by a widget, missing from widgets_static/"
    assert sorted(files - named) == [], "in widgets_static/, used by no widget"
    assert all((folder / name).read_text(encoding="utf-8").strip() for name in files)
