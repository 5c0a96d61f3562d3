"""Plots in one house style, drawn only from measured records.

:func:`plot_record` draws a :class:`tilebook.course.bench.Record`, live or committed,
and writes its provenance into the figure itself ("measured live on …" or
"recorded on …"), so a screenshot of the plot still says where the numbers came
from.  Given no record it draws nothing and says so in text.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

# Headless builds and scripts draw off-screen (a script's figures go on its page,
# see tilebook.course.display).  A notebook keeps the backend its kernel chose, or its
# plots would not show; so does anyone who chose one with MPLBACKEND.
if "ipykernel" not in sys.modules and not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .bench import Record

__all__ = [
    "PALETTE",
    "caption_figure",
    "house_style",
    "no_record_message",
    "place_legend",
    "plot_record",
    "run_caption",
    "series_colors",
]

# Colour-blind-safe (Okabe-Ito); tilebook's own series is always the first colour.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442"]


def series_colors(
    keys: Sequence[Any],
    order: Sequence[Any] | None = None,
    colors: Mapping[Any, str] | None = None,
) -> dict[Any, str]:
    """The colour of each series in ``keys``: ``colors[k]`` where given, else the
    palette's colour at ``k``'s place in ``order``.

    A series keeps its colour from one plot to the next as long as the plots share
    ``order``, whichever series each plot leaves out: a page that plots the forward
    with five implementations and the backward with four must not repaint the
    fourth in the third's colour.  Series outside ``order`` take the colours after
    it, in the order they come.
    """
    colors = dict(colors or {})
    slots = list(dict.fromkeys(order or ()))
    slots += [k for k in keys if k not in slots]
    out = {}
    for k in keys:
        out[k] = colors.get(k) or PALETTE[slots.index(k) % len(PALETTE)]
    return out


_STYLE: dict[str, Any] = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
    "font.size": 10,
    # A legend that must sit on the axes hides no line behind a transparent box.
    "legend.frameon": True,
    "legend.framealpha": 0.92,
    "legend.edgecolor": "0.8",
    "legend.facecolor": "white",
    "lines.linewidth": 2.0,
    "lines.markersize": 5,
}


def house_style():
    """A context manager applying tilebook's matplotlib style."""
    return plt.rc_context(_STYLE)


def place_legend(ax, **kwargs):
    """``ax``'s legend outside the axes, on their right: wherever the lines go, the
    legend hides none of them.  ``kwargs`` go to :meth:`matplotlib.axes.Axes.legend`
    (a ``title``, say).  Returns the legend."""
    where = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0}
    return ax.legend(**(where | kwargs))


def no_record_message(name: str) -> str:
    return (
        f"No GPU measurement named {name!r} has been recorded yet, so there is nothing "
        "to plot here. Run this lesson on a CUDA GPU (or `nox -s bench`) to measure it."
    )


_RATES = ("gbps", "tflops")


def _spread(row: dict[str, Any], y: str) -> tuple[float, float] | None:
    """(low, high) of ``y`` at the row's 20th and 80th percentile times, if it has them."""
    med, p20, p80 = row.get("median_ms"), row.get("p20_ms"), row.get("p80_ms")
    if None in (med, p20, p80) or row.get(y) is None:
        return None
    if y in _RATES:  # a rate is inversely proportional to the time
        return row[y] * med / p80, row[y] * med / p20
    if y.endswith(("_ms", "_us")):
        scale = row[y] / med
        return p20 * scale, p80 * scale
    return None


#: Font size (points) of the provenance caption under a plot.
CAPTION_FONTSIZE = 7.5


def _caption_lines(text: str, fig_width_in: float, fontsize: float) -> list[str]:
    """The caption cut into lines that fit the figure's width: an average character
    of the default sans-serif font (digits included) is at most about 0.62 of the
    font size wide."""
    import textwrap

    per_line = max(20, int(fig_width_in * 72 / (0.62 * fontsize)) - 2)
    return textwrap.wrap(text, per_line, break_on_hyphens=False) or [""]


def plot_record(
    record: Record | None,
    *,
    x: str,
    y: str,
    series: str | None = None,
    where: dict[str, Any] | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    logx: bool = False,
    ceiling: float | None = None,
    ceiling_label: str = "copy bandwidth",
    order: Sequence[str] | None = None,
    colors: Mapping[str, str] | None = None,
    name: str | None = None,
    spread: bool = True,
    legend_title: str | None = None,
):
    """Line plot of ``y`` against ``x``, one line per value of ``series``.

    ``where`` keeps only rows whose fields equal the given values.  ``order``
    orders the legend and fixes each series' colour (:func:`series_colors`), so
    plots of one page that pass the same ``order`` colour a series alike even
    where some series are missing; ``colors`` maps a series to a colour of its own.
    With ``spread`` (the default) each line carries a band from its rows' 20th to
    80th percentile times, so that a reader sees which gaps are inside the noise.
    ``ceiling`` draws a dashed horizontal line (e.g. the copy bandwidth measured in
    the same run as the record).  The legend (titled ``legend_title``) sits outside
    the axes, on their right (:func:`place_legend`), so that no line runs under it;
    the layout makes room for it, so change it here, not on the returned figure.
    Returns the figure, or None (after printing why) when
    ``record`` is None or has no matching rows; ``name`` names the missing
    record in that message.
    """
    if record is None:
        print(textwrap.fill(no_record_message(name or "this benchmark"), 80))
        return None
    rows = record.select(**(where or {}))
    rows = [r for r in rows if r.get(y) is not None]
    if not rows:
        print(
            f"The record {record.name!r} has no rows with {y!r} matching {where}; nothing plotted."
        )
        return None
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r.get(series) if series else y, []).append(r)
    keys = list(order) if order else list(groups)
    keys = [k for k in keys if k in groups] + [k for k in groups if k not in keys]
    color = series_colors(keys, order, colors)
    with house_style():
        fig, ax = plt.subplots()
        for k in keys:
            pts = sorted(groups[k], key=lambda r: r[x])
            xs = [p[x] for p in pts]
            (line,) = ax.plot(xs, [p[y] for p in pts], marker="o", label=str(k), color=color[k])
            band = [_spread(p, y) for p in pts]
            if spread and all(b is not None for b in band):
                ax.fill_between(
                    xs, [b[0] for b in band], [b[1] for b in band],
                    color=line.get_color(), alpha=0.22, linewidth=0,
                )  # fmt: skip
        if ceiling is not None:
            ax.axhline(ceiling, color="0.4", linestyle="--", linewidth=1.2, label=ceiling_label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(ylabel or y)
        ax.set_ylim(bottom=0)
        ax.set_title(title or record.title)
        if series or ceiling is not None:
            place_legend(ax, title=legend_title)
        caption_figure(fig, record.caption())
    return fig


def run_caption() -> str:
    """Where data that a page computes as it runs come from, for a plot's or a table's
    caption: ``measured live on <GPU>, …`` on a GPU, ``computed under Triton's
    interpreter on a CPU, …`` otherwise; with versions, date and commit."""
    from .bench import Record, _short_commit, provenance

    prov = provenance()
    if prov.get("mode") == "gpu":
        return Record("run", "this run", [], prov, live=True).caption()
    date = str(prov.get("date", "unknown date"))[:10]
    commit = f", commit {_short_commit(str(prov['commit']))}" if prov.get("commit") else ""
    return (
        f"computed under Triton's interpreter on a CPU, torch {prov.get('torch', '?')}, "
        f"triton {prov.get('triton', '?')}, {date}{commit}"
    )


def caption_figure(fig, text: str):
    """Write ``text`` (where the figure's data came from) under ``fig``, as
    :func:`plot_record` writes a record's provenance, and make room for it.

    For a figure a lesson draws itself; ``text`` is a record's
    :meth:`~tilebook.course.bench.Record.caption` or :func:`run_caption`.  Returns ``fig``.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("caption_figure() needs the text that says where the data came from")
    lines = _caption_lines(text, fig.get_figwidth(), CAPTION_FONTSIZE)
    fig.text(
        0.01, 0.005, "\n".join(lines),
        fontsize=CAPTION_FONTSIZE, color="0.35", ha="left", va="bottom",
    )  # fmt: skip
    # Room at the bottom for the caption's lines (a line is about 1.25 font sizes).
    line = 1.25 * CAPTION_FONTSIZE / (72 * fig.get_figheight())
    fig.tight_layout(rect=(0, 0.01 + line * len(lines), 1, 1))
    return fig
