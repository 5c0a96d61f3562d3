"""The site's pages agree with the code and with each other (issue 27, item 3).

Without building the site: the lists of lessons come from the gallery, the
measurements page reads its settings from the code, every docstring on the API page
renders as written, and no public docstring types in a measured figure.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path
from typing import ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GALLERY = ROOT / "gallery"
SRC = ROOT / "src" / "tilebook"
sys.path.insert(0, str(DOCS / "_ext"))

import tilebook_course
import tilebook_measurements

from tilebook.course import bench

# -- the lists of lessons ---------------------------------------------------------------


def test_the_course_is_every_lesson_script_of_the_gallery_in_order():
    parts = tilebook_course.course(GALLERY)
    scripts = sorted(GALLERY.glob("*/[0-9][0-9]_*.py"))
    lessons = [les for p in parts for les in p.lessons]
    assert [les.stem for les in lessons] == [s.stem for s in scripts]
    assert [les.number for les in lessons] == [f"{i:02d}" for i in range(1, len(scripts) + 1)]
    for part in parts:
        header = (GALLERY / part.folder / "GALLERY_HEADER.rst").read_text()
        assert header.splitlines()[0] == part.title
        assert part.intro and part.lessons, part.folder
    for les in lessons:
        assert les.name, les
        # The "You will learn" list is whole: every item, continuation lines included.
        items = [line for line in les.learn.splitlines() if line.startswith("- ")]
        assert len(items) >= 3, les.stem
        assert les.learn.rstrip().endswith((".", ";")), les.stem


def test_a_lesson_title_that_does_not_match_its_file_fails(tmp_path):
    script = tmp_path / "03_x.py"
    script.write_text('"""\n04. x: y\n=======\n"""\n')
    with pytest.raises(ValueError, match="file's number"):
        tilebook_course.lesson(script)


def test_learn_list_stops_at_the_paragraph_after_it():
    doc = (
        "01. a: b\n\n.. rubric:: You will learn\n\n- one;\n- two, on\n  two lines;\n\n"
        "- three.\n\nThe package's op is x.\n"
    )
    assert tilebook_course._learn_list(doc) == "- one;\n- two, on\n  two lines;\n- three."


def test_number_words():
    assert [tilebook_course.number_word(n) for n in (5, 14, 21)] == ["five", "fourteen", "21"]


#: Words that say a lesson is missing or not yet out, or a count of lessons typed in.
STALE = re.compile(
    r"in preparation|published so far|as they are published|coming soon|"
    r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
    r"fourteen|fifteen|\d+) (?:lessons|parts)\b",
    re.I,
)


def _pages() -> list[Path]:
    return [*DOCS.glob("*.md"), *GALLERY.glob("**/GALLERY_HEADER.rst")]


def test_no_page_calls_a_lesson_missing_or_counts_them_by_hand():
    found = {
        str(p.relative_to(ROOT)): m.group(0)
        for p in _pages()
        for m in [STALE.search(p.read_text())]
        if m
    }
    assert not found, found


def test_syllabus_and_landing_page_list_no_lesson_by_hand():
    """Their lists of lessons come from the gallery (tilebook-syllabus,
    tilebook-course-map): no link to a lesson page, no numbered lesson typed in."""
    for name in ("syllabus.md", "index.md"):
        text = (DOCS / name).read_text()
        assert not re.search(r"lessons/\d\d_|lessons/\w+/\d\d_", text), name
        assert not re.search(r"^\s*\d\d\.\s", text, re.M), name
    assert "{tilebook-syllabus}" in (DOCS / "syllabus.md").read_text()
    assert "{tilebook-course-map}" in (DOCS / "index.md").read_text()


# -- the measurements page ----------------------------------------------------------------


def _prose(text: str) -> str:
    """The page's own words: roles, code spans and directive blocks taken out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"\{[\w:-]+\}`[^`]*`", "", text)
    return re.sub(r"`[^`]*`", "", text)


def test_measurements_page_types_no_setting():
    """Warm-up, repetitions, rounds and the copy's size reach the page from the code."""
    prose = _prose((DOCS / "measurements.md").read_text())
    assert not re.search(r"\d", prose), re.findall(r".{30}\d.{30}", prose)
    assert not re.search(r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten) rounds", prose)


def test_from_code_reads_defaults_and_constants():
    value, owner = tilebook_measurements.code_value("tilebook.course.bench.measure(warmup)")
    assert value == inspect.signature(bench.measure).parameters["warmup"].default
    assert owner == "tilebook.course.bench.measure"
    rounds = inspect.signature(bench.compare).parameters["rounds"].default
    assert tilebook_measurements.code_value("tilebook.course.bench.compare(rounds)")[0] == rounds
    assert tilebook_measurements.code_value("tilebook.course.bench.RECORD_DIR_ENV")[0] == (
        bench.RECORD_DIR_ENV
    )
    with pytest.raises(KeyError, match="no parameter"):
        tilebook_measurements.code_value("tilebook.course.bench.measure(nothing)")
    with pytest.raises(ValueError, match="no default"):
        tilebook_measurements.code_value("tilebook.course.bench.measure(fn)")


def test_from_code_formats():
    fmt = tilebook_measurements.formatted
    assert fmt(1 << 30, "bytes") == "1 GiB"
    assert fmt(3 << 20, "bytes") == "3 MiB"
    assert fmt(25.0) == "25" and fmt(2.5) == "2.5"
    assert fmt(5, "word") == "five"
    assert fmt(bench.Measurement, "percentiles") == "20th and 80th"
    assert fmt(0.01, "percent") == "1%" and fmt(0.025, "percent") == "2.5%"
    with pytest.raises(TypeError, match="percent"):
        fmt("1%", "percent")
    with pytest.raises(ValueError, match="unknown format"):
        fmt(1, "furlongs")


def _timing_constants() -> dict[str, dict]:
    """``TIMING = {...}`` of each script of ``benchmarks/``, where it has one."""
    found = {}
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.parse(script.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "TIMING" for t in node.targets
            ):
                found[script.name] = ast.literal_eval(node.value)
    return found


def test_benchmarks_time_with_the_defaults_the_page_states():
    """The page says the benchmarks run measure_interleaved's default rounds, warm-up
    and repetitions: their TIMING settings are those."""
    params = inspect.signature(bench.measure_interleaved).parameters
    defaults = {k: params[k].default for k in ("rounds", "warmup", "rep")}
    timings = _timing_constants()
    assert timings, "no benchmark names its TIMING"
    different = {name: t for name, t in timings.items() if t != defaults}
    assert not different, (defaults, different)
    # compare()'s docstring: a lesson's defaults are fewer and shorter rounds.
    lesson = inspect.signature(bench.compare).parameters
    assert all(lesson[k].default <= defaults[k] for k in defaults), lesson


# -- docstrings on the API page -----------------------------------------------------------


def _api_objects() -> list[tuple[str, object]]:
    """Every object docs/api.md documents: (dotted name, object)."""
    text = (DOCS / "api.md").read_text()
    out = []
    current = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"\.\. currentmodule:: (\S+)", line):
            current = m[1]
        elif m := re.match(r"\.\. autofunction:: (\S+)", line):
            name = m[1] if "." in m[1] else f"{current}.{m[1]}"
            out.append(name)
        elif m := re.match(r"\.\. automodule:: (\S+)", line):
            module = m[1]
            out.append(module)
            members = ""
            for follow in lines[i + 1 :]:
                if follow.strip().startswith(":members:"):
                    members = follow.split(":members:", 1)[1]
                elif members and follow.startswith("      "):
                    members += follow
                else:
                    break
            out += [f"{module}.{n.strip()}" for n in members.split(",") if n.strip()]
    objects = []
    for name in out:
        objects.append((name, tilebook_measurements._resolve(name)))
    return objects


def _unwrap(obj):
    """The Python function behind a Triton kernel or an autotuner."""
    while hasattr(obj, "fn") and not inspect.isfunction(obj):
        obj = obj.fn
    return obj


_SPHINX_DIRECTIVES = (
    "attribute", "method", "function", "class", "data", "seealso", "versionadded",
    "versionchanged", "deprecated",
)  # fmt: skip
_SPHINX_ROLES = (
    "func", "meth", "class", "mod", "data", "attr", "exc", "obj", "term", "doc", "ref",
    "const", "py:func", "py:class", "py:mod", "py:data", "py:meth", "py:attr", "py:obj",
    "datasheet", "repo", "download", "numref", "envvar",
)  # fmt: skip


def _render(rst: str) -> list[str]:
    """docutils' warnings and errors for ``rst``, Sphinx's roles taken as plain text."""
    from docutils.core import publish_doctree
    from docutils.parsers.rst import Directive, directives, roles
    from docutils.utils import Reporter

    def plain(name, rawtext, text, lineno, inliner, options=None, content=None):
        from docutils import nodes

        return [nodes.literal(rawtext, text)], []

    class Described(Directive):
        """Sphinx's object descriptions (``.. attribute:: name``, which napoleon writes
        for an Attributes section) and admonitions: their content is reST."""

        optional_arguments = 1
        final_argument_whitespace = True
        has_content = True
        option_spec: ClassVar = {"type": directives.unchanged, "value": directives.unchanged}

        def run(self):
            from docutils import nodes

            node = nodes.container()
            self.state.nested_parse(self.content, self.content_offset, node)
            return [node]

    for role in _SPHINX_ROLES:
        roles.register_local_role(role, plain)
    for name in _SPHINX_DIRECTIVES:
        directives.register_directive(name, Described)
    doctree = publish_doctree(
        rst,
        settings_overrides={"report_level": Reporter.SEVERE_LEVEL + 1, "halt_level": 5},
    )
    return [
        m.astext()
        for m in doctree.findall(lambda n: n.tagname == "system_message")
        if m["level"] >= Reporter.WARNING_LEVEL
    ]


API_OBJECTS = _api_objects()


@pytest.mark.parametrize(("name", "obj"), API_OBJECTS, ids=[n for n, _ in API_OBJECTS])
def test_api_docstring_renders_as_written(name, obj):
    """Napoleon turns the docstring into reST that docutils reads without a warning,
    and every parameter it lists is one of the function's (a paragraph left under
    "Parameters" becomes a parameter named by its first word: issue 27)."""
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import NumpyDocstring

    if not (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)):
        return  # a constant: its #: comment is in the scan below
    doc = inspect.getdoc(obj)
    if not doc:
        return
    what = "module" if inspect.ismodule(obj) else "class" if inspect.isclass(obj) else "function"
    config = Config(napoleon_numpy_docstring=True, napoleon_google_docstring=False)
    rst = str(NumpyDocstring(doc, config, what=what, name=name, obj=obj))
    assert not _render(rst), (name, _render(rst))
    assert not _stray_paragraphs(doc), (name, _stray_paragraphs(doc))
    fn = _unwrap(obj)
    if what == "module" or not callable(fn):
        return
    try:
        params = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    listed = {p.strip("*\\ ") for m in re.finditer(r"^:param ([^:]+):", rst, re.M) for p in
              m[1].split(",")}  # fmt: skip
    unknown = listed - params
    if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()):
        unknown = {p for p in unknown if not p[0].isupper()}
    assert not unknown, f"{name}: documented parameters it does not take: {sorted(unknown)}"


_SECTIONS = {"Parameters", "Other Parameters", "Returns", "Yields", "Raises", "Attributes"}


def _stray_paragraphs(doc: str) -> list[str]:
    """Lines of a numpy-style list section (Parameters, Returns, ...) that napoleon would
    take for an entry's name or type but that are prose: a paragraph that belongs
    under Notes, left at the section's indentation."""
    lines = doc.splitlines()
    stray, section = [], None
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if re.fullmatch(r"-{3,}", following.strip()):
            section = line.strip()
            continue
        if section not in _SECTIONS or not line or line[0].isspace():
            continue
        name, colon, _ = line.partition(" : ")
        if colon:  # "name : type": the names must be names
            if not re.fullmatch(r"[\w*\\]+(?:, [\w*\\]+)*", name.strip()):
                stray.append(line)
        elif len(line.split()) > 6 or line.rstrip().endswith((".", ",", ";")):
            stray.append(line)
    return stray


def test_the_render_check_catches_a_paragraph_left_under_parameters():
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import NumpyDocstring

    def f(x, y):
        """Add.

        Parameters
        ----------
        x, y
            Tensors.

        Differentiable: gradients flow to ``x`` and ``y`` (not through ``out=``, which,
        as in PyTorch, cannot be used).
        """

    rst = str(NumpyDocstring(inspect.getdoc(f), Config(), what="function", obj=f))
    assert ":param Differentiable" in rst
    stray = _stray_paragraphs(inspect.getdoc(f))
    assert stray[0].startswith("Differentiable: gradients flow")


# -- no measured figure typed into a docstring --------------------------------------------

_NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*"
#: A measured figure: a rate, a time, or a ratio of two timings.
FIGURE = re.compile(
    rf"{_NUMBER}\s*(?:[TGM]?FLOP/s|[KMGT]i?B/s)"
    rf"|{_NUMBER}\s*(?:µs|us|ns|ms)\b"
    rf"|{_NUMBER}x\b(?![\d-])"
    rf"|{_NUMBER}\s*%\s+(?:faster|slower)"
    r"|\b(?:measured|timed|tuned|swept|took|ran)\b[^.;]{0,60}\bon an? "
    r"(?:H100|H200|A100|L4|T4|RTX ?\d{4}|V100|B200)\b",
    re.I,
)
#: Where figures belong: published hardware figures, each with its source.
FIGURES_ALLOWED_IN = {"datasheet.py"}


def _public_docs(path: Path):
    """(where, text) for the module's docstring, each public function's and class's
    (and their public methods'), and each documented attribute (``#:`` comments and
    string literals after an assignment), as autodoc shows them."""
    src = path.read_text()
    tree = ast.parse(src)
    module_doc = ast.get_docstring(tree)
    if module_doc:
        yield "module docstring", module_doc

    def walk(body, prefix):
        previous = None
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not node.name.startswith("_"):
                    doc = ast.get_docstring(node)
                    if doc:
                        yield f"{prefix}{node.name}", doc
                    if isinstance(node, ast.ClassDef):
                        yield from walk(node.body, f"{prefix}{node.name}.")
            elif (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and isinstance(previous, (ast.Assign, ast.AnnAssign))
            ):
                yield f"{prefix}attribute at line {node.lineno}", node.value.value
            previous = node

    yield from walk(tree.body, "")
    lines = src.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#:"):
            yield f"#: at line {i + 1}", line.lstrip()[2:]


def _public_modules() -> list[Path]:
    return [
        p
        for p in sorted(SRC.rglob("*.py"))
        if not any(part.startswith("_") and part != "__init__.py" for part in p.parts[-3:])
        and p.name not in FIGURES_ALLOWED_IN
    ]


def test_figure_pattern_finds_what_issue_27_found():
    for text in (
        "2048 cubed 593 TFLOP/s (1.00x cuBLAS)",
        "on an H100, 418 us in all",
        "2794 against 2645 GB/s chunked",
        "which measured 1-2% faster",
        "measured faster on an H100 in",
        "took 3.6 µs",
    ):
        assert FIGURE.search(text), text
    for text in (
        "``p20_ms`` and ``p80_ms``",
        "a 4096 x 4096 product",
        "sm_90 (H100, H200)",
        "2**31 elements",
        "Philox4x32-10, each 32x32-bit product",
        "within 6e-7 of the erf form",
    ):
        assert not FIGURE.search(text), text


def test_no_public_docstring_types_a_measured_figure():
    """A measured number reaches a reader from the data of the build (lessons, the
    benchmark records), never from a docstring written on some GPU once."""
    found = []
    for path in _public_modules():
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        for where, text in _public_docs(path):
            for m in FIGURE.finditer(text):
                found.append(f"{module}, {where}: {m.group(0)!r}")
    assert not found, "\n".join(found)


# -- the boxes of checks ------------------------------------------------------------------


def test_a_contradicted_claim_edges_its_box_in_the_failure_colour(monkeypatch):
    from tilebook.course.claims import Claims

    monkeypatch.setenv("TILEBOOK_CLAIMS", "show")
    good = Claims("99", "data").check("holds", True)._repr_html_()
    bad = Claims("99", "data").check("holds", True).check("fails", False)._repr_html_()
    unchecked = Claims("99", None).check("no data", True)._repr_html_()
    assert re.search(r'class="tb-claims"', good)
    assert re.search(r'class="tb-claims tb-claims-failed"', bad)
    assert re.search(r'class="tb-claims tb-claims-unchecked"', unchecked)


def test_a_failed_exercise_check_edges_its_box_in_the_failure_colour():
    import torch

    from tilebook.course.exercises import check_elementwise

    def right(x, y, out):
        out.copy_(x + y)

    def wrong(x, y, out):
        out.copy_(x - y)

    ok = check_elementwise(right, torch.add, sizes=[5])._repr_html_()
    bad = check_elementwise(wrong, torch.add, sizes=[5])._repr_html_()
    assert "tb-claims-failed" not in ok and "&#10003;" in ok
    assert re.search(r'class="tb-claims tb-exercise tb-claims-failed"', bad)


def _css_rules(css: str) -> dict[str, str]:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return {sel.strip(): body for sel, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css)}


def test_failure_boxes_and_table_headers_are_styled():
    rules = _css_rules((DOCS / "_static" / "tilebook.css").read_text())
    success = re.search(r"border-left:[^;]*", rules[".tb-claims"])[0]
    failed = rules[".tb-claims.tb-claims-failed"]
    assert "border-left-color" in failed and failed.split(":")[1] not in success
    th = rules["table.tb-table th"]
    assert "overflow-wrap: normal" in th and "word-break: normal" in th and "anywhere" not in th
    assert "overflow-x: auto" in rules[".tb-table-wrap"]
