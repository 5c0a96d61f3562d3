"""The helpers of the lesson form: sentences from data, claims, tables, the datasheet."""

from __future__ import annotations

import pytest

from tilebook.course import datasheet
from tilebook.course.bench import Record
from tilebook.course.claims import ClaimError, Claims, speedup, within
from tilebook.course.prose import Prose, say
from tilebook.course.tables import table
from tilebook.course.widgets import SweepExplorer


def timed(med, p20, p80, **kw):
    return {"median_ms": med, "p20_ms": p20, "p80_ms": p80, **kw}


# -- prose ---------------------------------------------------------------------------


def test_say_fills_the_template_and_renders_a_paragraph():
    p = say(
        "The kernel moves {gbps:,.0f} GB/s, ``{frac:.0%}`` of the copy.", gbps=2981.4, frac=0.991
    )
    assert str(p) == "The kernel moves 2,981 GB/s, 99% of the copy."
    html = p._repr_html_()
    assert html.startswith('<div class="tb-prose"')
    assert "<p>The kernel moves 2,981 GB/s, <code>99%</code> of the copy.</p>" in html


def test_say_escapes_values_and_refuses_unused_or_missing_fields():
    assert "&lt;script&gt;" in say("{x}", x="<script>")._repr_html_()
    with pytest.raises(KeyError, match="no value for b"):
        say("{a} {b}", a=1)
    with pytest.raises(ValueError, match="not used"):
        say("{a}", a=1, b=2)
    with pytest.raises(ValueError, match="name their fields"):
        say("{} GB/s", a=1)


def test_prose_adds_paragraphs():
    p = say("one {a}", a=1) + say("two {b}", b=2)
    assert isinstance(p, Prose)
    assert p._repr_html_().count("<p>") == 2


# -- claims --------------------------------------------------------------------------


def test_speedup_calls_overlapping_spreads_a_tie():
    a = timed(1.00, 0.98, 1.02)
    b = timed(1.03, 1.01, 1.05)  # 3% slower in the median, but the spreads overlap
    s = speedup(a, b)
    assert s.ratio == pytest.approx(1.03)
    assert s.tied and not s.faster and not s.slower


def test_speedup_beyond_the_spread():
    a = timed(1.00, 0.99, 1.01)
    b = timed(1.10, 1.09, 1.11)
    assert speedup(a, b).faster
    assert speedup(b, a).slower
    # a ratio inside the noise floor is a tie even with tight spreads
    c = timed(1.005, 1.0049, 1.0051)
    assert speedup(timed(1.0, 0.9999, 1.0001), c).tied


def test_speedup_rejects_rows_without_spread():
    with pytest.raises(KeyError, match="p20_ms"):
        speedup({"median_ms": 1.0}, timed(1, 1, 1))
    with pytest.raises(ValueError, match="inconsistent"):
        speedup(timed(1.0, 1.2, 1.3), timed(1, 1, 1))


class _Source:
    def caption(self):
        return "recorded on a test GPU"


def test_a_contradicted_claim_stops_the_build(monkeypatch):
    monkeypatch.delenv("TILEBOOK_CLAIMS", raising=False)
    claims = Claims("07", _Source())
    claims.check("the kernel keeps pace", True, "ratio 1.0")
    with pytest.raises(ClaimError, match=r"lesson 07: .*'the kernel wins'.*test GPU"):
        claims.check("the kernel wins", False, "ratio 0.9")


def test_show_mode_displays_a_contradiction(monkeypatch):
    monkeypatch.setenv("TILEBOOK_CLAIMS", "show")
    claims = Claims("07", _Source()).check("the kernel wins", False, "ratio 0.9")
    assert not claims.ok
    html = claims._repr_html_()
    assert "contradicted by this build" in html and "tb-claim-bad" in html


def test_claims_without_data_are_shown_as_unchecked():
    claims = Claims("07", None).check("the kernel wins", False)
    assert claims.ok
    assert "not checked" in repr(claims)


def test_within():
    assert within(0.97, 1.0, 0.05)
    assert not within(0.9, 1.0, 0.05)
    with pytest.raises(ValueError, match="rel must be"):
        within(1, 1, -0.1)


# -- tables and records -----------------------------------------------------------------


def test_table_formats_columns_and_filters_rows():
    rows = [{"n": 4096, "impl": "a", "gbps": 2981.44}, {"n": 8192, "impl": "b", "gbps": 12.0}]
    t = table(rows, {"n": "n", "GB/s": ("gbps", "{:,.0f}"), "half": lambda r: r["gbps"] / 2},
              where={"impl": "a"}, caption="recorded")  # fmt: skip
    assert t.rows == [["4096", "2,981", "1490.72"]]
    text = repr(t)
    assert text.splitlines()[0].split() == ["n", "GB/s", "half"]
    assert "(recorded)" in text
    assert "<td class=tb-num>2,981</td>" in t._repr_html_()


def test_record_one_fails_loudly():
    rec = Record("r", "t", [{"a": 1}, {"a": 1}, {"a": 2}], {})
    assert rec.one(a=2) == {"a": 2}
    assert rec.values("a") == [1, 2]
    with pytest.raises(LookupError, match="2 rows match"):
        rec.one(a=1)
    with pytest.raises(LookupError, match="0 rows match"):
        rec.one(a=3)


# -- datasheet ------------------------------------------------------------------------


def test_every_fact_has_a_source_and_a_unit():
    for f in datasheet.FACTS.values():
        assert f.source in datasheet.SOURCES, f.key
        assert f.source_url.startswith("https://"), f.key
        assert f.unit and f.value > 0, f.key
    assert datasheet.fact("h100.memory_bandwidth").text() == "3.35 TB/s"
    assert datasheet.fact("cuda.registers_per_sm").text() == "65,536 registers"
    with pytest.raises(KeyError, match="known"):
        datasheet.fact("h100.nothing")


# -- widgets --------------------------------------------------------------------------


def test_sweep_explorer_orders_choices_and_flags_wrong_rows():
    rows = [
        {"acc": acc, "hidden": h, "err": e, "why": "bf16 sums lose bits" if acc == "bf16" else ""}
        for acc in ("fp32", "bf16")
        for h, e in ((1024, 1e-3), (4096, 2e-3))
    ]
    w = SweepExplorer(rows, ["acc", "hidden"], "err", "rel. error", caption="c",
                      better="lower", order={"acc": ["bf16", "fp32"]}, wrong="why")  # fmt: skip
    data = w.data()
    acc, hidden = data["knobs"]
    assert acc["kind"] == "choice" and acc["values"] == ["bf16", "fp32"]
    assert hidden["kind"] == "slider" and hidden["values"] == [1024, 4096]
    flagged = [r for r in data["rows"] if "wrong" in r]
    assert len(flagged) == 2 and all(r["knobs"]["acc"] == "bf16" for r in flagged)
    assert data["better"] == "lower"


def test_sweep_explorer_rejects_bad_settings():
    rows = [{"k": "a", "v": 1.0}]
    with pytest.raises(ValueError, match="no row has"):
        SweepExplorer(rows, ["k"], "v", "u", caption="c", order={"k": ["b"]})
    with pytest.raises(ValueError, match="not among its values"):
        SweepExplorer(rows, ["k"], "v", "u", caption="c", initial={"k": "z"}).data()
    with pytest.raises(ValueError, match="not wrong"):
        SweepExplorer([{"k": "a", "v": 1.0, "w": "bad"}], ["k"], "v", "u", caption="c", wrong="w")
