"""Sphinx pieces of the tilebook site.

* ``:datasheet:`h100.memory_bandwidth``` renders a published figure from
  :mod:`tilebook.course.datasheet` (value and unit) as a link to its row, with its
  source, in the datasheet table of the glossary page.  It is how a lesson's
  prose states a hardware figure without typing a number.
* ``:repo:`benchmarks/softmax.py``` links a file of the repository ("view
  source") when the site knows the repository's URL, and checks that the file
  exists either way.
* ``tilebook-install`` shows the commands that get a reader from the page to a
  running lesson, from the same URL; ``datasheet-table`` the datasheet.
* ``tilebook-records`` and ``:from-code:`` (the measurements page) are in
  ``tilebook_measurements``; the course map, the syllabus and ``:course-count:``
  (every list of lessons, made from the gallery) in ``tilebook_course``.
* Each lesson page gets an "Open in Colab" link when the URL is a GitHub one.

The URL is one setting: ``tilebook_repo_url`` in ``conf.py``, which reads the
environment variable ``TILEBOOK_REPO_URL`` (unset: no links, and the pages say
how to work from a clone).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import tilebook_course
import tilebook_measurements
from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.util.docutils import SphinxRole
from tilebook_measurements import RecordsTable

GLOSSARY_DOC = "glossary"


class DatasheetRole(SphinxRole):
    """``:datasheet:`h200.memory_bandwidth``` (a named GPU's figure) or
    ``:datasheet:`gpu.memory_bandwidth``` (the build GPU's; where the datasheet has no
    row for it, the H200's, followed by that GPU's name)."""

    def run(self):
        from tilebook.course.datasheet import BUILD, build_fact, fact

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
    from tilebook.course.datasheet import build_gpu

    gpu = build_gpu()
    return f"{gpu.key}." if gpu else "\0"


class BuildGpuRole(SphinxRole):
    """``:build-gpu:`name``` renders the name of the GPU the page speaks for: the
    device that ran the lessons (GPU build), or the GPU of the records shown (CPU)."""

    def run(self):
        from tilebook.course.datasheet import build_gpu_name

        return [nodes.emphasis(text=build_gpu_name() or "no GPU (no records)")], []


class DatasheetTable(Directive):
    """The whole datasheet, one row per fact, each row linkable by its key."""

    has_content = False

    def run(self):
        from tilebook.course.datasheet import FACTS

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
    tilebook_course.setup(app)  # lists of lessons, made from the gallery
    tilebook_measurements.setup(app)  # values read from the code that measures
    app.add_config_value("tilebook_repo_url", None, "html")
    app.add_config_value("tilebook_repo_branch", "main", "html")
    app.add_config_value("tilebook_pages_branch", "gh-pages", "html")
    app.add_role("repo", RepoRole())
    app.add_directive("tilebook-install", InstallCommands)
    app.connect("html-page-context", _lesson_context)
    app.connect("build-finished", _copy_notebooks)
    app.add_role("datasheet", DatasheetRole())
    app.add_role("build-gpu", BuildGpuRole())
    app.add_directive("datasheet-table", DatasheetTable)
    app.add_directive("tilebook-records", RecordsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
