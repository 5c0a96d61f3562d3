"""Sphinx pieces of the tilebook site: datasheet facts, the records table.

``:datasheet:`h100.hbm_bandwidth``` renders a published figure from
:mod:`tilebook.datasheet` (value and unit) as a link to its row, with its
source, in the datasheet table of the glossary page.  It is how a lesson's
prose states a hardware figure without typing a number.
"""

from __future__ import annotations

import os
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.util.docutils import SphinxRole

GLOSSARY_DOC = "glossary"


class DatasheetRole(SphinxRole):
    def run(self):
        from tilebook.datasheet import fact

        try:
            f = fact(self.text.strip())
        except KeyError as exc:
            msg = self.inliner.reporter.error(str(exc), line=self.lineno)
            return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]
        builder = self.env.app.builder
        try:
            uri = builder.get_relative_uri(self.env.docname, GLOSSARY_DOC) + "#" + f.anchor
        except Exception:  # noqa: BLE001  (non-HTML builders: plain text is fine)
            return [nodes.Text(f.text())], []
        ref = nodes.reference(
            "", f.text(), internal=True, refuri=uri, classes=["tb-datasheet"],
            reftitle=f"{f.gpu}: {f.what} ({f.source_title})",
        )  # fmt: skip
        return [ref], []


class DatasheetTable(Directive):
    """The whole datasheet, one row per fact, each row linkable by its key."""

    has_content = False

    def run(self):
        from tilebook.datasheet import FACTS

        table = nodes.table(classes=["tb-datasheet-table"])
        group = nodes.tgroup(cols=5)
        table += group
        for width in (14, 26, 10, 18, 32):
            group += nodes.colspec(colwidth=width)
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body

        def row(cells, parent, ids=None):
            r = nodes.row(ids=ids or [])
            for cell in cells:
                entry = nodes.entry()
                entry += cell if isinstance(cell, nodes.Node) else nodes.paragraph(text=str(cell))
                r += entry
            parent += r

        row(["GPU", "what", "value", "key", "source"], head)
        for f in FACTS.values():
            link = nodes.paragraph()
            link += nodes.reference("", f.source_title, refuri=f.source_url)
            key = nodes.paragraph()
            key += nodes.literal(text=f.key)
            row([f.gpu, f.what, f.text(), key, link], body, ids=[f.anchor])
        return [table]


class RecordsTable(Directive):
    """The measurements behind the site: this build's (GPU) and the committed ones."""

    has_content = False

    def _table(self, records):
        table = nodes.table()
        group = nodes.tgroup(cols=4)
        table += group
        for width in (18, 30, 6, 46):
            group += nodes.colspec(colwidth=width)
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body

        def row(cells, parent):
            r = nodes.row()
            for text in cells:
                entry = nodes.entry()
                entry += nodes.paragraph(text=str(text))
                r += entry
            parent += r

        row(["record", "what", "points", "provenance"], head)
        for rec in records:
            row([rec.name, rec.title, len(rec.rows), rec.caption()], body)
        return table

    def run(self):
        import tilebook
        from tilebook.bench import RECORD_DIR_ENV, RECORDS_DIR, load_record

        out = []
        built = Path(os.environ.get(RECORD_DIR_ENV) or "tilebook-records")
        live = []
        if tilebook.is_gpu() and built.is_dir() and built.resolve() != RECORDS_DIR.resolve():
            live = [load_record(p.stem, built) for p in sorted(built.glob("*.json"))]
            live = [r for r in live if r is not None and r.provenance.get("mode") == "gpu"]
        if live:
            out.append(nodes.paragraph(text="Measured in this build (what the lessons show):"))
            out.append(self._table(live))
            out.append(nodes.paragraph(text="Committed with the package (what a CPU build shows):"))
        committed = [load_record(p.stem, RECORDS_DIR) for p in sorted(RECORDS_DIR.glob("*.json"))]
        if not committed:
            out.append(nodes.paragraph(text="No GPU record has been committed yet."))
        else:
            out.append(self._table(committed))
        return out


def setup(app):
    app.add_role("datasheet", DatasheetRole())
    app.add_directive("datasheet-table", DatasheetTable)
    app.add_directive("tilebook-records", RecordsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
