"""tilebook.course.widgets_softmax: the online softmax stepper's numbers, for every setting.

The stepper's JavaScript only draws what :func:`online_steps` computed, so these
tests check the recurrence on rows worked out by hand, that leaving the
rescale out is wrong exactly where the maximum grows after the first block,
and that the HTML is self-contained and carries every setting.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from tilebook.course.widgets_softmax import ROWS, OnlineSoftmaxStepper, online_steps


def _payload(widget) -> dict:
    page = widget._repr_html_()
    m = re.search(r'<script type="application/json" class="tbw-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_two_values_by_hand():
    out = online_steps([0.0, 1.0], 1)
    first, second = out["steps"][1], out["steps"][2]
    assert (first["m"], first["s"], first["factor"]) == (0.0, 1.0, None)
    assert second["m_old"] == 0.0 and second["m"] == 1.0
    assert second["factor"] == pytest.approx(math.exp(-1))
    assert second["s"] == pytest.approx(math.exp(-1) + 1)
    assert out["rescales"] == 1
    assert out["p"] == pytest.approx([1 / (1 + math.e), math.e / (1 + math.e)])
    assert out["sum_p"] == pytest.approx(1.0)


def test_skipping_the_rescale_overcounts_the_earlier_terms():
    out = online_steps([0.0, 1.0], 1, rescale=False)
    # The first term stays measured against 0, not 1: e^0 instead of e^-1.
    assert out["steps"][2]["s"] == pytest.approx(2.0)
    assert out["sum_p"] == pytest.approx((math.exp(-1) + 1) / 2)
    assert out["max_err"] > 0.1


def test_the_first_step_is_before_any_block_and_blocks_cover_the_row():
    out = online_steps(list(range(10)), 4)
    assert out["steps"][0]["hi"] == 0 and out["steps"][0]["m"] is None
    assert [(s["lo"], s["hi"]) for s in out["steps"][1:]] == [(0, 4), (4, 8), (8, 10)]


@pytest.mark.parametrize("name", list(ROWS))
@pytest.mark.parametrize("block", [1, 2, 4, 8, 16])
def test_with_the_rescale_every_row_is_the_true_softmax(name, block):
    out = online_steps(ROWS[name], block)
    assert out["max_err"] < 1e-12
    assert out["sum_p"] == pytest.approx(1.0, abs=1e-12)


def test_skipping_is_wrong_exactly_where_the_maximum_grows():
    w = OnlineSoftmaxStepper(blocks=(2, 4, 8))
    for r in w.settings():
        if r["knobs"]["rescale"] == "on":
            assert r["verdict"] == "ok"
        else:
            assert (r["verdict"] == "wrong") == (r["rescales"] > 0), r["knobs"]
    # The rows are chosen so that each case shows: always wrong, never wrong.
    assert w.steps("rising", 4, "skip")["verdict"] == "wrong"
    assert w.steps("spike last", 8, "skip")["verdict"] == "wrong"
    lucky = w.steps("max first", 4, "skip")
    assert lucky["verdict"] == "ok" and "by luck" in lucky["note"]
    assert w.steps("spike last", 4, "skip")["sum_p"] < 1  # the sum is too large


def test_notes_belong_to_their_setting():
    w = OnlineSoftmaxStepper()
    wrong = w.steps("rising", 4, "skip")
    assert "too large" in wrong["note"] and f"{wrong['sum_p']:.3f}" in wrong["note"]
    assert "exp(0) = 1" in w.steps("max first", 4, "on")["note"]


def test_payload_is_self_contained_and_holds_every_setting():
    w = OnlineSoftmaxStepper(initial={"row": "spike last", "block": 2, "rescale": "skip"})
    page = w._repr_html_()
    assert 'data-tilebook-widget="online-softmax"' in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "root.dataset.value" in page and "aria-label" in page
    d = _payload(w)
    assert len(d["settings"]) == len(ROWS) * len(w.blocks) * 2
    assert d["initial"] == {"row": "spike last", "block": 2, "rescale": "skip", "step": 0}
    assert list(d["rows"]) == list(ROWS)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rows": {"empty": []}},
        {"rows": {"inf": [1.0, math.inf]}},
        {"blocks": (0,)},
        {"blocks": ()},
        {"initial": {"row": "nope"}},
        {"initial": {"block": 3}},
        {"initial": {"rescale": "maybe"}},
        {"initial": {"step": -1}},
    ],
)
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError, match=r"row|block|rescale|step|finite"):
        OnlineSoftmaxStepper(**kwargs)


def test_online_steps_checks_its_arguments():
    with pytest.raises(ValueError, match="empty"):
        online_steps([], 2)
    with pytest.raises(ValueError, match="block"):
        online_steps([1.0], 0)
    with pytest.raises(ValueError, match="rescale"):
        OnlineSoftmaxStepper().steps("rising", 4, "off")
