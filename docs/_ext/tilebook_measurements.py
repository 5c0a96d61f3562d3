"""The measurements page, read from the code that measures.

* ``{from-code}`tilebook.course.bench.measure(warmup)``` renders the default of a
  parameter; ``{from-code}`tilebook.course.bench.RECORDS_GPU_ENV``` a module's constant.
  After a ``|``, a format: ``word`` (``5`` -> "five"), ``bytes`` (``2**30`` ->
  "1 GiB"), ``percentiles`` (a dataclass with ``p20_ms`` and ``p80_ms`` fields ->
  "20th and 80th"), ``percent`` (``0.01`` -> "1%"), ``code`` (shown as code).  The value links to the object's entry on the API page, so a
  reader can see where it comes from, and the page changes when the code does.
* ``tilebook-records`` lists the committed record sets, one per GPU kind (its GPU,
  dates and commits), says which one a CPU build shows, and lists that set's
  records; a GPU build lists first what it measured itself.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes
from sphinx.util.docutils import SphinxRole
from tilebook_course import number_word

_CALL = re.compile(r"(?P<obj>[\w.]+)\((?P<param>\w+)\)")


def _resolve(dotted: str) -> Any:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module in {dotted!r}")


def code_value(spec: str) -> tuple[Any, str]:
    """The value ``spec`` names and the dotted name of the object it belongs to.

    ``pkg.mod.func(param)`` is the default of ``param``; ``pkg.mod.NAME`` the object.
    """
    m = _CALL.fullmatch(spec)
    if m is None:
        return _resolve(spec), spec
    fn = _resolve(m["obj"])
    try:
        default = inspect.signature(fn).parameters[m["param"]].default
    except KeyError:
        raise KeyError(f"{m['obj']} has no parameter {m['param']!r}") from None
    if default is inspect.Parameter.empty:
        raise ValueError(f"{m['obj']}'s parameter {m['param']!r} has no default")
    return default, m["obj"]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def formatted(value: Any, fmt: str = "") -> str:
    """``value`` as the page states it (see the module's docstring for ``fmt``)."""
    if fmt == "word":
        if not isinstance(value, int):
            raise TypeError(f"'word' takes an int, not {value!r}")
        return number_word(value)
    if fmt == "bytes":
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= size and value % size == 0:
                return f"{value // size} {unit}"
        return f"{value} bytes"
    if fmt == "percentiles":
        fields = [f.name for f in dataclasses.fields(value)]
        found = [int(m[1]) for f in fields if (m := re.fullmatch(r"p(\d+)_ms", f))]
        if not found:
            raise ValueError(f"{value!r} has no pNN_ms fields")
        words = [_ordinal(p) for p in found]
        return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]
    if fmt == "percent":
        if not isinstance(value, (int, float)):
            raise TypeError(f"'percent' takes a number, not {value!r}")
        return f"{value:.0%}" if round(100 * value, 6).is_integer() else f"{value:.1%}"
    if fmt and fmt != "code":
        raise ValueError(f"unknown format {fmt!r} (word, bytes, percentiles, percent, code)")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class FromCodeRole(SphinxRole):
    def run(self):
        spec, _, fmt = self.text.partition("|")
        try:
            value, owner = code_value(spec.strip())
            text = formatted(value, fmt.strip())
        except (ImportError, AttributeError, KeyError, ValueError, TypeError) as exc:
            msg = self.inliner.reporter.error(f"from-code: {exc}", line=self.lineno)
            return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]
        ref = addnodes.pending_xref(
            "", refdomain="py", reftype="obj", reftarget=owner, refexplicit=True,
            refwarn=False, **{"py:module": None, "py:class": None},
        )  # fmt: skip
        shown = nodes.literal if fmt.strip() == "code" else nodes.inline
        ref += shown(text=text, classes=["tb-from-code"])
        return [ref], []


# -- the records ----------------------------------------------------------------------


def _load(folder: Path) -> list:
    from tilebook.course.bench import load_record

    records = [load_record(p.stem, folder) for p in sorted(folder.glob("*.json"))]
    return [r for r in records if r is not None]


def _short(commit: str) -> str:
    sha, plus, rest = str(commit).partition("+")
    return sha[:12] + plus + rest


def set_summary(folder: Path) -> dict[str, Any]:
    """A record set's GPU names, number of records, first and last date, and commits."""
    gpus, dates, commits, count = [], [], [], 0
    for path in sorted(folder.glob("*.json")):
        prov = json.loads(path.read_text()).get("provenance", {})
        count += 1
        gpus.append(prov.get("gpu") or "an unknown GPU")
        dates.append(str(prov.get("date", ""))[:10])
        if prov.get("commit"):
            commits.append(_short(prov["commit"]))
    dates = sorted(d for d in dates if d)
    return {
        "gpus": list(dict.fromkeys(gpus)),
        "records": count,
        "first": dates[0] if dates else "unknown",
        "last": dates[-1] if dates else "unknown",
        "commits": list(dict.fromkeys(commits)),
    }


def _table(header: list[str], widths: list[int], rows: list[list[Any]]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body
    for cells, parent in [(header, head), *((r, body) for r in rows)]:
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            if isinstance(cell, nodes.Node):
                entry += nodes.paragraph("", "", cell)
            else:
                entry += nodes.paragraph(text=str(cell))
            row += entry
        parent += row
    return table


def _dates(first: str, last: str) -> nodes.inline:
    """``first to last`` (or one date), each date kept on one line: a date broken
    at its hyphen ("2026-11- / 23") reads as two figures."""
    out = nodes.inline()
    for i, date in enumerate([first] if first == last else [first, last]):
        if i:
            out += nodes.Text(" to ")
        out += nodes.inline(text=date, classes=["tb-nowrap"])
    return out


def _records_table(records) -> nodes.table:
    rows = [[r.name, r.title, len(r.rows), r.caption()] for r in records]
    return _table(["record", "what", "points", "provenance"], [18, 30, 6, 46], rows)


def _own_kind() -> str | None:
    """The GPU kind of this build's device (GPU builds), else None."""
    import tilebook

    if not tilebook.is_gpu():
        return None
    import torch

    from tilebook.course.datasheet import gpu_kind

    return gpu_kind(torch.cuda.get_device_name())


class RecordsTable(Directive):
    """The measurements behind the site: this build's (GPU), then the committed sets,
    which one a CPU build shows, and that set record by record."""

    has_content = False

    def run(self):
        from tilebook.course import bench

        out: list[nodes.Node] = []
        sets = bench.record_sets()
        shown = bench.shown_records_dir().resolve()
        own = _own_kind()
        built = Path(os.environ.get(bench.RECORD_DIR_ENV) or "tilebook-records")
        committed = {folder.resolve() for folder in sets.values()}
        if own is not None and built.is_dir() and built.resolve() not in committed:
            live = [r for r in _load(built) if r.provenance.get("mode") == "gpu"]
            if live:
                out.append(nodes.paragraph(text="Measured in this build (what its lessons show):"))
                out.append(_records_table(live))
        if not sets:
            out.append(nodes.paragraph(text="No GPU record has been committed yet."))
            return out
        out.append(nodes.paragraph(text="Committed with the package, one set per GPU kind:"))
        rows = []
        for kind, folder in sets.items():
            s = set_summary(folder)
            dates = _dates(s["first"], s["last"])
            readers = []
            if folder.resolve() == shown:
                readers.append("CPU builds")
            if kind == own:
                readers.append("this build, where it measured nothing itself")
            rows.append([
                kind, ", ".join(s["gpus"]), s["records"], dates, ", ".join(s["commits"]) or "-",
                " and ".join(readers) or "-",
            ])  # fmt: skip
        header = ["GPU kind", "GPU", "records", "dates", "commits", "shown by"]
        out.append(_table(header, [8, 20, 8, 20, 26, 18], rows))
        kind = next(k for k, f in sets.items() if f.resolve() == shown)
        which = "a CPU build shows" if own is not None else "this build shows"
        out.append(nodes.paragraph(text=f"The set {which}, {kind}, record by record:"))
        out.append(_records_table(_load(shown)))
        return out


def setup(app):
    app.add_role("from-code", FromCodeRole())
    # tilebook_ext registers RecordsTable as tilebook-records.
