"""Sphinx pieces of the tilebook site.

* ``:datasheet:`h100.memory_bandwidth``` renders a published figure from
  :mod:`tilebook.datasheet` (value and unit) as a link to its row, with its
  source, in the datasheet table of the glossary page.  It is how a lesson's
  prose states a hardware figure without typing a number.
* ``:repo:`benchmarks/softmax.py``` links a file of the repository ("view
  source") when the site knows the repository's URL, and checks that the file
  exists either way.
* ``tilebook-install`` shows the commands that get a reader from the page to a
  running lesson, from the same URL; ``tilebook-records`` lists the
  measurements behind the site; ``datasheet-table`` the datasheet.
* Each lesson page gets an "Open in Colab" link when the URL is a GitHub one.

The URL is one setting: ``tilebook_repo_url`` in ``conf.py``, which reads the
environment variable ``TILEBOOK_REPO_URL`` (unset: no links, and the pages say
how to work from a clone).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.util.docutils import SphinxRole

GLOSSARY_DOC = "glossary"


class DatasheetRole(SphinxRole):
    """``:datasheet:`h200.memory_bandwidth``` (a named GPU's figure) or
    ``:datasheet:`gpu.memory_bandwidth``` (the build GPU's; where the datasheet has no
    row for it, the H200's, followed by that GPU's name)."""

    def run(self):
        from tilebook.datasheet import BUILD, build_fact, fact

        key = self.text.strip()
        try:
            prefix, _, name = key.partition(".")
            f = build_fact(name) if prefix == BUILD else fact(key)
        except (KeyError, LookupError) as exc:
            msg = self.inliner.reporter.error(str(exc), line=self.lineno)
            return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]
        shown = f.text()
        if prefix == BUILD and not f.key.startswith(_build_key_prefix()):
            shown += f" (an {f.gpu}'s: this GPU has no datasheet row)"
        builder = self.env.app.builder
        try:
            uri = builder.get_relative_uri(self.env.docname, GLOSSARY_DOC) + "#" + f.anchor
        except Exception:  # noqa: BLE001  (non-HTML builders: plain text is fine)
            return [nodes.Text(shown)], []
        ref = nodes.reference(
            "", shown, internal=True, refuri=uri, classes=["tb-datasheet"],
            reftitle=f"{f.gpu}: {f.what} ({f.source_title})",
        )  # fmt: skip
        return [ref], []


def _build_key_prefix() -> str:
    from tilebook.datasheet import build_gpu

    gpu = build_gpu()
    return f"{gpu.key}." if gpu else "\0"


class BuildGpuRole(SphinxRole):
    """``:build-gpu:`name``` renders the name of the GPU the page speaks for: the
    device that ran the lessons (GPU build), or the GPU of the records shown (CPU)."""

    def run(self):
        from tilebook.datasheet import build_gpu_name

        return [nodes.emphasis(text=build_gpu_name() or "no GPU (no records)")], []


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


def _repo(app) -> tuple[str | None, str]:
    url = (app.config.tilebook_repo_url or "").rstrip("/") or None
    return url, app.config.tilebook_repo_branch


class RepoRole(SphinxRole):
    """A file of the repository: a link to it when the URL is known, else its path."""

    def run(self):
        label, _, target = self.text.partition(" <")
        target = (target.rstrip(">") if target else label).strip()
        root = Path(self.env.app.srcdir).parent
        if not (root / target).exists():
            msg = self.inliner.reporter.error(
                f"repo role: {target!r} is not a file of the repository", line=self.lineno
            )
            return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]
        url, branch = _repo(self.env.app)
        text = nodes.literal(text=label.strip())
        if url is None:
            return [text], []
        kind = "tree" if (root / target).is_dir() else "blob"
        ref = nodes.reference("", "", internal=False, refuri=f"{url}/{kind}/{branch}/{target}")
        ref += text
        return [ref], []


class InstallCommands(Directive):
    """How a reader gets tilebook, from the configured repository URL."""

    has_content = False

    def run(self):
        url, _ = _repo(self.state.document.settings.env.app)
        if url:
            code = (
                f"git clone {url} tilebook && cd tilebook\n"
                "python -m pip install .\n"
                "# or, without a clone:\n"
                f'python -m pip install "tilebook @ git+{url}"'
            )
        else:
            code = (
                "# this build of the site names no repository URL (TILEBOOK_REPO_URL);\n"
                "# from a copy of the tilebook repository:\n"
                "cd tilebook\n"
                "python -m pip install ."
            )
        block = nodes.literal_block(code, code)
        block["language"] = "bash"
        return [block]


def _lesson_context(app, pagename, templatename, context, doctree):
    """Colab and source links for lesson pages."""
    url, _ = _repo(app)
    context["tilebook_colab_url"] = None
    m = re.fullmatch(r"lessons/(\w+)/(\d\d_\w+)", pagename)
    if not m or url is None:
        return
    gh = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", url)
    if gh:
        owner, repo = gh.groups()
        context["tilebook_colab_url"] = (
            f"https://colab.research.google.com/github/{owner}/{repo}/blob/"
            f"{app.config.tilebook_pages_branch}/notebooks/{m.group(2)}.ipynb"
        )


def _copy_notebooks(app, exception):
    """Put every lesson notebook at a stable path of the site, ``notebooks/NN_name.ipynb``
    (what the Colab links open, once the site is published on the pages branch)."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir) / "notebooks"
    out.mkdir(exist_ok=True)
    for nb in (Path(app.srcdir) / "lessons").glob("*/[0-9][0-9]_*.ipynb"):
        shutil.copyfile(nb, out / nb.name)


#: A terminal colour code (Sphinx colours its log on a colour terminal, or with
#: FORCE_COLOR set, as nox does).
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def _plain(msg: object) -> str:
    return _COLOUR.sub("", str(msg))


class _QuietMyst(logging.Filter):
    """MyST logs its whole configuration on every build: noise that needs no action."""

    def filter(self, record):
        return not _plain(record.msg).startswith("myst v")


#: Options that extensions fill in as they start (pydata-sphinx-theme, sphinx-gallery,
#: sphinx-copybutton, sphinx-design, the offline MathJax): the configuration Sphinx
#: saved at the end of the last build holds their additions, the one it compares it
#: with at the start of the next does not yet, so these always differ.  (A change of
#: one of them by hand still rebuilds what it affects: the HTML builder compares them
#: on its own.)
_FILLED_BY_EXTENSIONS = frozenset({
    "html_css_files", "html_js_files", "html_permalinks_icon", "html_static_path",
    "html_theme_options", "mathjax4_config", "mathjax3_config", "sphinx_gallery_conf",
    "templates_path",
})  # fmt: skip


class _QuietGallery(logging.Filter):
    """sphinx-gallery announces how it converts text for notebooks on every build (our
    notebooks are written again by tilebook_notebooks anyway): noise that needs no
    action."""

    def filter(self, record):
        return not _plain(record.msg).startswith("Using Sphinx-Gallery to convert rst")


def _quiet_config_change() -> None:
    """Leave those options out of the list behind Sphinx's "The configuration has
    changed" message, which otherwise opens every rebuild: noise that needs no action.
    Sphinx uses the list for that message alone (whether pages are read again it
    decides from the options that affect reading, and none of these does)."""
    from sphinx import environment

    differing = getattr(environment, "_differing_config_keys", None)
    if differing is None or getattr(differing, "tilebook", False):
        return  # another Sphinx: its message stays as it is

    def without_filled(old, new):
        return frozenset(differing(old, new) - _FILLED_BY_EXTENSIONS)

    without_filled.tilebook = True
    environment._differing_config_keys = without_filled


def setup(app):
    logging.getLogger("sphinx.myst_parser.sphinx_ext.main").addFilter(_QuietMyst())
    logging.getLogger("sphinx.sphinx-gallery").addFilter(_QuietGallery())
    _quiet_config_change()
    app.add_config_value("tilebook_repo_url", None, "html")
    app.add_config_value("tilebook_repo_branch", "main", "html")
    app.add_config_value("tilebook_pages_branch", "gh-pages", "html")
    app.add_role("repo", RepoRole())
    app.add_directive("tilebook-course-map", CourseMap)
    app.add_directive("tilebook-install", InstallCommands)
    app.connect("html-page-context", _lesson_context)
    app.connect("build-finished", _copy_notebooks)
    app.add_role("datasheet", DatasheetRole())
    app.add_role("build-gpu", BuildGpuRole())
    app.add_directive("datasheet-table", DatasheetTable)
    app.add_directive("tilebook-records", RecordsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# -- the course map of the landing page ----------------------------------------------

#: The course as the syllabus lays it out: (part title, [(number, short name, what)]).
COURSE = [
    ("Part I: the model, tiles not threads", [
        ("01", "Why Triton", "what makes GPU code fast, and what Triton hands to its compiler"),
        ("02", "Programs and the grid", "@triton.jit, specialisation, who owns which tile"),
        ("03", "From Python to PTX", "every compiler stage, compiled ahead of time on any machine"),
    ]),
    ("Part II: the DSL, every primitive you will touch", [
        ("04", "Pointers, masks and strides", "2-D tiles, masks, coalescing measured"),
        ("05", "tl.dot and tensor cores", "mma, wgmma or an FMA loop; accumulation precision"),
        ("06", "Reductions and the online softmax", "tile reductions, atomics, the running max"),
    ]),
    ("Part III: building real kernels", [
        ("07", "vector_add", "grid, launch, mask, do_bench, the copy ceiling"),
        ("08", "fused linear + activation", "an epilogue in registers, one store"),
        ("09", "tiled matmul", "K loop, grouped order, autotuning, the Hopper path"),
        ("10", "softmax", "one program per row, the online version, backward"),
        ("11", "rms_norm", "fused statistic and scale, lock-free backward"),
    ]),
    ("Part IV: the flagship", [
        ("12", "flash attention", "forward and backward, built from lessons 04 to 11"),
    ]),
    ("Part V: performance and production", [
        ("13", "Autotune, pipelining and pitfalls", "configs, stages, spills, stale caches"),
        ("14", "Autograd, profiling, when not to write Triton", "torch.library, proton, ncu"),
    ]),
]  # fmt: skip

#: The kernel chain: each kernel one step past the last (lesson numbers).
CHAIN = [
    ("07", "vector_add"),
    ("08", "linear + act"),
    ("09", "tiled matmul"),
    ("10", "softmax"),
    ("11", "rms_norm"),
    ("12", "flash attention"),
]


def _published(app) -> dict[str, str]:
    """Lesson number -> page name, for every lesson script in the gallery."""
    gallery = (Path(app.srcdir) / ".." / "gallery").resolve()
    out = {}
    for script in gallery.glob("*/[0-9][0-9]_*.py"):
        out[script.name[:2]] = f"lessons/{script.parent.name}/{script.stem}"
    return out


def _chain_svg(published: dict[str, str], uri) -> str:
    box_w, box_h, gap, y = 118, 44, 22, 8
    parts = []
    for i, (num, name) in enumerate(CHAIN):
        x = 4 + i * (box_w + gap)
        live = num in published
        fill = "var(--pst-color-primary-bg, #dbe9f6)" if live else "transparent"
        dash = "" if live else ' stroke-dasharray="5 4"'
        label = f"{num} {name}"
        shape = (
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="8" '
            f'fill="{fill}" stroke="currentColor" stroke-width="1.5"{dash}/>'
            f'<text x="{x + box_w / 2}" y="{y + 18}" text-anchor="middle" font-size="13" '
            f'font-weight="600" fill="currentColor">{num}</text>'
            f'<text x="{x + box_w / 2}" y="{y + 35}" text-anchor="middle" font-size="12.5" '
            f'fill="currentColor">{html_escape(name)}</text>'
        )
        if live:
            shape = f'<a href="{uri(published[num])}" aria-label="lesson {label}">{shape}</a>'
        parts.append(shape)
        if i + 1 < len(CHAIN):
            x1, x2, ym = x + box_w + 2, x + box_w + gap - 3, y + box_h / 2
            parts.append(
                f'<line x1="{x1}" y1="{ym}" x2="{x2}" y2="{ym}" stroke="currentColor" '
                f'stroke-width="1.5" marker-end="url(#tb-arrow)"/>'
            )
    width = 8 + len(CHAIN) * (box_w + gap) - gap
    return (
        f'<svg class="tb-chain" role="group" viewBox="0 0 {width} {box_h + 16}" '
        f'aria-labelledby="tb-chain-title"><title id="tb-chain-title">The kernel chain: '
        + ", then ".join(n for _, n in CHAIN)
        + "; each kernel is one step past the last. Solid boxes are published lessons."
        "</title><defs><marker id='tb-arrow' viewBox='0 0 10 10' refX='9' refY='5' "
        "markerWidth='7' markerHeight='7' orient='auto-start-reverse'>"
        "<path d='M0,0 L10,5 L0,10 z' fill='currentColor'/></marker></defs>"
        + "".join(parts)
        + "</svg>"
    )


def html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class CourseMap(Directive):
    """The five parts, which lessons are published (linked), and the kernel chain."""

    has_content = False

    def run(self):
        env = self.state.document.settings.env
        app = env.app
        published = _published(app)

        def uri(page):
            try:
                return app.builder.get_relative_uri(env.docname, page)
            except Exception:  # noqa: BLE001
                return page + ".html"

        chain = nodes.raw("", _chain_svg(published, uri), format="html")
        out = [chain]
        for title, lessons in COURSE:
            section = nodes.container(classes=["tb-part"])
            section += nodes.rubric(text=title)
            items = nodes.bullet_list()
            for num, name, what in lessons:
                item = nodes.list_item()
                para = nodes.paragraph()
                if num in published:
                    ref = nodes.reference(
                        "", "", internal=True, refuri=uri(published[num]), classes=["tb-live"]
                    )
                    ref += nodes.strong(text=f"{num} {name}")
                    para += ref
                    para += nodes.Text(f": {what}")
                else:
                    para += nodes.Text(f"{num} {name}: {what} ")
                    para += nodes.emphasis(text="(in preparation)")
                item += para
                items += item
            section += items
            out.append(section)
        return out
