"""The tl.dot explorer of lesson 05: what one ``tl.dot`` becomes, costs and gets wrong.

:class:`DotExplorer` takes one row per setting of its knobs (target GPU, the
dtypes going in and accumulating, the tile and its warps) and shows the row
the knobs select: the instruction the dot became, the accumulator, the error
to expect and the measured rate, each as a line of text the lesson made from
its data (compiled output, measured errors, a timing record).  A setting that
does not compile or computes a wrong answer is flagged *wrong*, one that
leaves the tensor cores idle *slow*, each with the reason that belongs to that
row.  Every figure is computed in Python (a test can read :meth:`DotExplorer.data`);
the JavaScript only draws the selected row.  Like every
:class:`tilebook.course.widgets.Widget`: self-contained HTML, native radio buttons with
labels (keyboard accessible), colours from the page's theme, and a root
``data-value`` that changes when a knob turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .widgets import Widget, asset

__all__ = ["DotExplorer"]


class DotExplorer(Widget):
    """Choice knobs over settings of ``tl.dot``; shows the selected setting's facts.

    Parameters
    ----------
    rows
        One dict per setting: a value for every knob, ``headline`` (what the dot
        became, e.g. ``"wgmma: HGMMA.64x64x16.F32"``), a text for each key of
        ``facts``, and optionally ``wrong`` (why this setting fails to compile
        or computes a wrong answer), ``slow`` (why it is slow) and ``note``.
        Every value is text.
    knobs
        ``{row key: [values in the order to show them]}``, in knob order; each
        knob is a list of radio buttons.
    facts
        ``{row key: label}``: the lines shown for the selected row, in order.
    caption
        Where the figures come from.
    labels
        Knob labels (default: the row keys).
    initial
        The setting shown first (default: the first value of each knob).
    fine
        The verdict of a row that is neither wrong nor slow.
    """

    kind = "dot"
    scripts = ("dot.js",)

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        knobs: dict[str, Sequence[str]],
        facts: dict[str, str],
        *,
        caption: str,
        labels: dict[str, str] | None = None,
        initial: dict[str, str] | None = None,
        fine: str = "Runs on the tensor cores and keeps its accuracy.",
        title: str = "tl.dot explorer",
    ) -> None:
        if not rows:
            raise ValueError("DotExplorer needs at least one row")
        if not knobs:
            raise ValueError("DotExplorer needs at least one knob")
        self.knobs = {k: [str(v) for v in vs] for k, vs in knobs.items()}
        for k, vs in self.knobs.items():
            if not vs or len(set(vs)) != len(vs):
                raise ValueError(f"knob {k!r} needs distinct values, got {vs!r}")
        seen = set()
        for r in rows:
            missing = [k for k in (*self.knobs, "headline") if k not in r]
            if missing:
                raise ValueError(f"row {r} lacks {missing}")
            for k, vs in self.knobs.items():
                if str(r[k]) not in vs:
                    raise ValueError(f"row has {k}={r[k]!r}, not among the knob's values {vs}")
            key = tuple(str(r[k]) for k in self.knobs)
            if key in seen:
                raise ValueError(f"two rows for the setting {key}")
            seen.add(key)
            for field in (*facts, "headline", "wrong", "slow", "note"):
                if r.get(field) is not None and not isinstance(r[field], str):
                    raise TypeError(f"row field {field!r} must be text, got {r[field]!r}")
        if not any(not r.get("wrong") for r in rows):
            raise ValueError("DotExplorer needs at least one row that is not wrong")
        self.rows = list(rows)
        self.facts = dict(facts)
        self.caption = caption
        self.labels = dict(labels or {})
        self.initial = {k: vs[0] for k, vs in self.knobs.items()}
        for k, v in (initial or {}).items():
            if k not in self.knobs or str(v) not in self.knobs[k]:
                raise ValueError(f"initial {k}={v!r} is not a value of a knob")
            self.initial[k] = str(v)
        self.fine = fine
        self.title = title

    def row(self, **setting: str) -> dict[str, Any] | None:
        """The row of one setting (every knob given), or None when there is none."""
        if set(setting) != set(self.knobs):
            raise ValueError(f"give every knob: {list(self.knobs)}")
        for r in self.rows:
            if all(str(r[k]) == str(v) for k, v in setting.items()):
                return r
        return None

    def data(self) -> dict[str, Any]:
        return {
            "css": asset("dot.css"),
            "knobs": [
                {
                    "name": k,
                    "label": self.labels.get(k, k),
                    "values": vs,
                    "initial": self.initial[k],
                }
                for k, vs in self.knobs.items()
            ],
            "facts": [{"key": k, "label": label} for k, label in self.facts.items()],
            "rows": [
                {
                    "knobs": {k: str(r[k]) for k in self.knobs},
                    "headline": r["headline"],
                    "facts": {k: r[k] for k in self.facts if r.get(k)},
                    **{f: r[f] for f in ("wrong", "slow", "note") if r.get(f)},
                }
                for r in self.rows
            ],
            "caption": self.caption,
            "fine": self.fine,
        }
