"""Interactive widgets as self-contained HTML: no server, no external URL.

A widget is a Python object whose ``_repr_html_`` returns one ``<div>`` holding
its data (JSON, escaped so that it cannot close the ``<script>`` tag around it),
a little CSS and a little JavaScript.  sphinx-gallery puts that HTML into the
lesson page, and Jupyter shows it in a notebook, with the same code.  The data
are measurements (live or from a committed record), never made-up numbers.

The CSS and JavaScript are files of ``tilebook/course/widgets_static/``, shipped with
the package and read once (:func:`asset`); the page carries them inline, so it
still needs nothing beyond itself.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from importlib import resources
from typing import Any

from . import display

__all__ = ["SweepExplorer", "Widget", "embed_json"]


@functools.cache
def asset(name: str) -> str:
    """The text of ``widgets_static/<name>``, a CSS or JavaScript file of the package."""
    return (resources.files(__package__) / "widgets_static" / name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` survive unescaped."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _escape_html(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


class Widget:
    """Base class: subclasses provide ``title``, :meth:`data`, :attr:`scripts` and :attr:`styles`.

    Every widget's script runs after ``helpers.js``, inside a function of its own
    (so two widgets on a page never share a name), with ``root`` (the widget's
    div) and ``data`` (its parsed JSON).  ``helpers.js`` defines, once for all:
    ``body``, the widget's emptied body; ``el``, which makes an element; and
    ``knobRows``, which adds one row per knob (a slider, or radio choices) that
    keeps ``state[name]`` and calls ``onchange()``, and returns a setter per knob
    that moves it as a reader would.
    """

    kind = "widget"
    title = ""
    #: Files of ``widgets_static/`` that make the widget's script, joined in this order.
    scripts: tuple[str, ...] = ()
    #: Files of ``widgets_static/`` whose CSS follows ``base.css`` in the widget's style.
    styles: tuple[str, ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any):
        obj = super().__new__(cls)
        display.register(obj)  # a lesson run as a script shows it on its page at exit
        return obj

    def data(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def script(self) -> str:
        """The widget's own JavaScript, as the page runs it after ``helpers.js``."""
        return "".join(asset(name) for name in self.scripts)

    def _repr_html_(self) -> str:
        uid = f"tbw-{uuid.uuid4().hex[:10]}"
        payload = embed_json(self.data())
        css = "".join(asset(name) for name in ("base.css", *self.styles))
        return (
            f'<div class="tbw tbw-{self.kind}" id="{uid}" data-tilebook-widget="{self.kind}">'
            f"<style>{css}</style>"
            f"<h4>{_escape_html(self.title)}</h4>"
            f'<div class="tbw-body"><noscript>This widget needs JavaScript.</noscript></div>'
            f'<script type="application/json" class="tbw-data">{payload}</script>'
            "<script>(function(){"
            f'var root=document.getElementById("{uid}");'
            'var data=JSON.parse(root.querySelector("script.tbw-data").textContent);'
            f"{asset('helpers.js')}{self.script}"
            "})();</script></div>"
        )

    def __repr__(self) -> str:
        return f"<tilebook {type(self).__name__}: {self.title} (open in a browser or notebook)>"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class SweepExplorer(Widget):
    """Knobs over the settings of a measured sweep; shows the metric of the chosen one.

    Parameters
    ----------
    rows
        One dict per measured setting, holding every knob and the metric.
    knobs
        The row keys the reader turns, in order (two knobs also draw a grid).
        Numeric knobs are sliders in numeric order; other knobs (names,
        booleans) are choice lists in the order of ``order`` or, without it,
        of their first appearance in ``rows``: never alphabetical.
    metric, unit
        Row key of the measured value and its unit, e.g. ``"gbps"``, ``"GB/s"``.
    caption
        Where the numbers come from (use ``Record.caption()``).
    better
        ``"higher"`` (rates, the default) or ``"lower"`` (times, errors).
    order
        ``{knob: [values in the order to show them]}``.
    ceiling, ceiling_label
        An upper reference measured in the same run, e.g. the copy bandwidth.
    slow_fraction
        Settings below this fraction of the best are flagged as slow.
    note
        Row key of an explanation that belongs to that row alone (why *this*
        setting is slow, say); shown only when the row is selected.
    wrong
        Row key holding, for a setting that computes a wrong result, why it is
        wrong (an empty value means the row is right).  Wrong settings are
        flagged and never count as the best.
    extra
        Row key of a neutral detail shown with the row (time, bytes, ...).
    """

    kind = "sweep"
    scripts = ("sweep.js",)

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        knobs: Sequence[str],
        metric: str,
        unit: str,
        *,
        caption: str,
        title: str = "Sweep explorer",
        labels: dict[str, str] | None = None,
        order: dict[str, Sequence[Any]] | None = None,
        initial: dict[str, Any] | None = None,
        better: str = "higher",
        ceiling: float | None = None,
        ceiling_label: str = "the copy bandwidth",
        slow_fraction: float = 0.6,
        near_fraction: float = 0.95,
        note: str | None = None,
        wrong: str | None = None,
        extra: str | None = None,
    ) -> None:
        if not rows:
            raise ValueError("SweepExplorer needs at least one measured row")
        if not knobs:
            raise ValueError("SweepExplorer needs at least one knob")
        if better not in ("higher", "lower"):
            raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
        for r in rows:
            missing = [k for k in (*knobs, metric) if k not in r]
            if missing:
                raise ValueError(f"row {r} lacks {missing}")
        order = {k: list(v) for k, v in (order or {}).items()}
        for k, wanted in order.items():
            if k not in knobs:
                raise ValueError(f"order names {k!r}, which is not a knob")
            have = {repr(r[k]) for r in rows}
            unknown = [v for v in wanted if repr(v) not in have]
            if unknown:
                raise ValueError(f"order[{k!r}] lists values no row has: {unknown}")
        if sum(1 for r in rows if not (wrong and r.get(wrong))) == 0:
            raise ValueError("SweepExplorer needs at least one row that is not wrong")
        self.rows = list(rows)
        self.knobs = list(knobs)
        self.metric = metric
        self.unit = unit
        self.caption = caption
        self.title = title
        self.labels = dict(labels or {})
        self.order = order
        self.initial = dict(initial or {})
        self.better = better
        self.ceiling = ceiling
        self.ceiling_label = ceiling_label
        self.slow_fraction = slow_fraction
        self.near_fraction = near_fraction
        self.note = note
        self.wrong = wrong
        self.extra = extra

    def _values(self, knob: str) -> tuple[str, list[Any]]:
        seen = list(dict.fromkeys(r[knob] for r in self.rows))
        numeric = all(_is_number(v) for v in seen)
        if knob in self.order:
            wanted = self.order[knob]
            values = list(wanted) + [v for v in seen if v not in wanted]
        else:
            values = sorted(seen) if numeric else seen
        return ("slider" if numeric else "choice"), values

    def data(self) -> dict[str, Any]:
        knobs = []
        for k in self.knobs:
            kind, values = self._values(k)
            initial = self.initial.get(k, values[0])
            if initial not in values:
                raise ValueError(f"initial {k}={initial!r} is not among its values {values}")
            knobs.append(
                {
                    "name": k,
                    "label": self.labels.get(k, k),
                    "kind": kind,
                    "values": values,
                    "initial": initial,
                }
            )

        def text(r, key):
            return str(r[key]) if key and r.get(key) else None

        rows = []
        for r in self.rows:
            row = {"knobs": {k: r[k] for k in self.knobs}, "value": float(r[self.metric])}
            for name, key in (("note", self.note), ("wrong", self.wrong), ("extra", self.extra)):
                if text(r, key):
                    row[name] = text(r, key)
            rows.append(row)
        return {
            "knobs": knobs,
            "rows": rows,
            "unit": self.unit,
            "caption": self.caption,
            "better": self.better,
            "ceiling": self.ceiling,
            "ceiling_label": self.ceiling_label,
            "slow_fraction": self.slow_fraction,
            "near_fraction": self.near_fraction,
        }
