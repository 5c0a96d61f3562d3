"""Result tables: one call in a lesson, an HTML table on the page, text in a terminal.

::

    table(record.rows, {"n": "n", "GB/s": ("gbps", "{:,.0f}"),
                        "of copy": lambda r: f"{r['gbps'] / copy:.0%}"},
          where={"impl": "tilebook"}, caption=record.caption())

Each column is a row key, a ``(key, format)`` pair, or a function of the row.
On the site the table is HTML (cells wrap at spaces, never inside a word; a table
wider than the page scrolls inside its own box); ``repr`` gives aligned text for
terminals and logs.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import display

__all__ = ["Table", "table"]

Column = str | tuple[str, str] | Callable[[dict[str, Any]], Any]


def _cell(row: dict[str, Any], spec: Column) -> str:
    if callable(spec):
        value = spec(row)
        return "" if value is None else str(value)
    if isinstance(spec, tuple):
        key, fmt = spec
        value = row.get(key)
        return "n/a" if value is None else fmt.format(value)
    value = row.get(spec)
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _numeric(text: str) -> bool:
    t = text.replace(",", "").replace("%", "").replace("x", "").strip()
    try:
        float(t)
    except ValueError:
        return False
    return True


class Table:
    """A header and rows of already formatted cells, with an optional title and caption."""

    def __init__(
        self,
        header: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        title: str | None = None,
        caption: str | None = None,
    ) -> None:
        self.header = [str(h) for h in header]
        self.rows = [[str(c) for c in r] for r in rows]
        for r in self.rows:
            if len(r) != len(self.header):
                raise ValueError(f"row {r} has {len(r)} cells for {len(self.header)} columns")
        self.title = title
        self.caption = caption
        display.register(self)

    def column(self, name: str) -> list[str]:
        i = self.header.index(name)
        return [r[i] for r in self.rows]

    def __repr__(self) -> str:
        widths = [max(len(c) for c in col) for col in zip(self.header, *self.rows, strict=False)]
        right = [all(_numeric(r[i]) for r in self.rows) for i in range(len(self.header))]

        def line(cells):
            return "  ".join(
                c.rjust(w) if r else c.ljust(w)
                for c, w, r in zip(cells, widths, right, strict=False)
            ).rstrip()

        out = [self.title] if self.title else []
        out += [line(self.header), line("-" * w for w in widths)]
        out += [line(r) for r in self.rows]
        if self.caption:
            out.append(f"({self.caption})")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        right = [
            bool(self.rows) and all(_numeric(r[i]) for r in self.rows)
            for i in range(len(self.header))
        ]

        def cells(tag, values):
            return "".join(
                f"<{tag}{' class=tb-num' if r else ''}>{html.escape(v)}</{tag}>"
                for v, r in zip(values, right, strict=False)
            )

        head = f"<thead><tr>{cells('th', self.header)}</tr></thead>"
        body = "".join(f"<tr>{cells('td', r)}</tr>" for r in self.rows)
        title = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        foot = (
            f'<p class="tb-table-caption">{html.escape(self.caption)}</p>' if self.caption else ""
        )
        return (
            f'<div class="tb-table-wrap"><table class="tb-table">{title}{head}'
            f"<tbody>{body}</tbody></table>{foot}</div>"
        )


def table(
    rows: Sequence[dict[str, Any]],
    columns: Mapping[str, Column],
    *,
    where: dict[str, Any] | None = None,
    title: str | None = None,
    caption: str | None = None,
) -> Table:
    """A :class:`Table` of ``rows`` (dicts), one column per entry of ``columns``.

    ``where`` keeps only the rows whose fields equal the given values.
    """
    if not columns:
        raise ValueError("table() needs at least one column")
    kept = [r for r in rows if all(r.get(k) == v for k, v in (where or {}).items())]
    body = [[_cell(r, spec) for spec in columns.values()] for r in kept]
    return Table(list(columns), body, title=title, caption=caption)
