"""The course as the gallery holds it: every list of lessons on the site is made here.

A part is a folder of ``gallery/`` with a ``GALLERY_HEADER.rst`` (its title is the
header's first line, its introduction the text under the title); a lesson is a script
``NN_name.py`` in it (its title, ``NN. name: what it is about``, and its "You will
learn" list come from the script's docstring).  A list made from these cannot name a
lesson that does not exist, call one "in preparation" that does, or miss one.

* ``tilebook-course-map`` (landing page): the kernel chain, then each part with its
  lessons, linked.
* ``tilebook-syllabus`` (syllabus page): each part with its introduction, each lesson
  with what it teaches.
* ``:course-count:`lessons``` renders "fourteen lessons" (``parts``: "five parts"), so
  that no page types how many there are.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.util.docutils import SphinxRole

#: The parts whose lessons form the kernel chain drawn on the landing page: each
#: kernel one step past the last, up to the flagship.
CHAIN_PARTS = ("03_real_kernels", "04_flagship")

_TITLE = re.compile(r"(?P<number>\d\d)\.\s+(?P<name>[^:]+?)(?::\s+(?P<subtitle>.+))?")
_LEARN = ".. rubric:: You will learn"


@dataclass(frozen=True)
class Lesson:
    number: str  # "07"
    stem: str  # "07_vector_add"
    part: str  # "03_real_kernels"
    name: str  # "vector_add"
    subtitle: str  # "your first complete kernel"
    learn: str  # the "You will learn" list, reST

    @property
    def page(self) -> str:
        return f"lessons/{self.part}/{self.stem}"

    @property
    def title(self) -> str:
        return f"{self.number}. {self.name}" + (f": {self.subtitle}" if self.subtitle else "")


@dataclass(frozen=True)
class Part:
    folder: str  # "03_real_kernels"
    title: str  # "Part III: building real kernels"
    intro: str  # reST
    lessons: tuple[Lesson, ...]


def _learn_list(doc: str) -> str:
    """The bullet list under the docstring's "You will learn" rubric, as reST."""
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == _LEARN) + 1
    except StopIteration:
        return ""
    out: list[str] = []
    for i, line in enumerate(lines[start:], start):
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith("- ") or (line.startswith("  ") and out):
            out.append(line)
        elif not line.strip() and (not out or following.startswith("- ")):
            continue
        else:
            break
    return "\n".join(out)


def lesson(script: Path) -> Lesson:
    """A lesson script's number, name, subtitle and "You will learn" list."""
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    first = next((line.strip() for line in doc.splitlines() if line.strip()), "")
    m = _TITLE.fullmatch(first)
    if m is None or m["number"] != script.name[:2]:
        raise ValueError(
            f"{script}: the docstring's title must read 'NN. name: what it is about' with "
            f"NN the file's number, not {first!r}"
        )
    return Lesson(
        number=m["number"],
        stem=script.stem,
        part=script.parent.name,
        name=m["name"].strip(),
        subtitle=(m["subtitle"] or "").strip(),
        learn=_learn_list(doc),
    )


def course(gallery: Path) -> list[Part]:
    """The parts of ``gallery`` in order, each with its lessons in order."""
    parts = []
    for header in sorted(gallery.glob("*/GALLERY_HEADER.rst")):
        lines = header.read_text(encoding="utf-8").strip().splitlines()
        if len(lines) < 2 or not re.fullmatch(r"([-=~^])\1+", lines[1].strip()):
            raise ValueError(f"{header}: must open with a title and its underline")
        scripts = sorted(header.parent.glob("[0-9][0-9]_*.py"))
        parts.append(
            Part(
                folder=header.parent.name,
                title=lines[0].strip(),
                intro="\n".join(lines[2:]).strip(),
                lessons=tuple(lesson(s) for s in scripts),
            )
        )
    return parts


def lessons(gallery: Path) -> list[Lesson]:
    return [les for part in course(gallery) for les in part.lessons]


_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
    "eighteen", "nineteen", "twenty",
)  # fmt: skip


def number_word(n: int) -> str:
    """``14`` -> ``"fourteen"`` (up to twenty; digits past that)."""
    return _WORDS[n] if 0 <= n < len(_WORDS) else str(n)


def _gallery(app) -> Path:
    return (Path(app.srcdir) / ".." / "gallery").resolve()


def _uri(env, page: str) -> str:
    try:
        return env.app.builder.get_relative_uri(env.docname, page)
    except Exception:  # noqa: BLE001  (non-HTML builders)
        return page + ".html"


def _note_dependencies(env, gallery: Path) -> None:
    """A page made from the gallery is read again when a lesson or a header changes."""
    for path in [*gallery.glob("*/GALLERY_HEADER.rst"), *gallery.glob("*/[0-9][0-9]_*.py")]:
        env.note_dependency(str(path))


def _parse_rst(directive: Directive, text: str, node: nodes.Element) -> None:
    """Parse reST (a lesson's list, a part's introduction) into ``node``, from a page
    written in reST or in MyST Markdown."""
    if type(directive.state).__module__.startswith("myst_parser"):
        text = f"```{{eval-rst}}\n{text}\n```"
    directive.state.nested_parse(
        directive.content.__class__(text.splitlines(), "<gallery>"), 0, node
    )


class CourseCount(SphinxRole):
    """``:course-count:`lessons``` -> "fourteen lessons"; ``Parts`` -> "Five parts"."""

    def run(self):
        what = self.text.strip()
        parts = course(_gallery(self.env.app))
        counts = {"lessons": sum(len(p.lessons) for p in parts), "parts": len(parts)}
        if what.lower() not in counts:
            msg = self.inliner.reporter.error(
                f"course-count: say 'lessons' or 'parts', not {what!r}", line=self.lineno
            )
            return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]
        _note_dependencies(self.env, _gallery(self.env.app))
        text = f"{number_word(counts[what.lower()])} {what.lower()}"
        if what[0].isupper():
            text = text[0].upper() + text[1:]
        return [nodes.Text(text)], []


def html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chain_svg(chain: list[Lesson], uri) -> str:
    """The kernel chain as an SVG of linked boxes, one per lesson, arrows between."""
    box_w, box_h, gap, y = 118, 44, 22, 8
    parts = []
    for i, les in enumerate(chain):
        x = 4 + i * (box_w + gap)
        shape = (
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="8" '
            f'fill="var(--pst-color-primary-bg, #dbe9f6)" stroke="currentColor" '
            f'stroke-width="1.5"/>'
            f'<text x="{x + box_w / 2}" y="{y + 18}" text-anchor="middle" font-size="13" '
            f'font-weight="600" fill="currentColor">{les.number}</text>'
            f'<text x="{x + box_w / 2}" y="{y + 35}" text-anchor="middle" font-size="12.5" '
            f'fill="currentColor">{html_escape(les.name)}</text>'
        )
        label = html_escape(f"{les.number} {les.name}")
        parts.append(f'<a href="{uri(les.page)}" aria-label="lesson {label}">{shape}</a>')
        if i + 1 < len(chain):
            x1, x2, ym = x + box_w + 2, x + box_w + gap - 3, y + box_h / 2
            parts.append(
                f'<line x1="{x1}" y1="{ym}" x2="{x2}" y2="{ym}" stroke="currentColor" '
                f'stroke-width="1.5" marker-end="url(#tb-arrow)"/>'
            )
    width = 8 + len(chain) * (box_w + gap) - gap
    return (
        f'<svg class="tb-chain" role="group" viewBox="0 0 {width} {box_h + 16}" '
        f'aria-labelledby="tb-chain-title"><title id="tb-chain-title">The kernel chain: '
        + html_escape(", then ".join(les.name for les in chain))
        + "; each kernel is one step past the last.</title>"
        "<defs><marker id='tb-arrow' viewBox='0 0 10 10' refX='9' refY='5' "
        "markerWidth='7' markerHeight='7' orient='auto-start-reverse'>"
        "<path d='M0,0 L10,5 L0,10 z' fill='currentColor'/></marker></defs>"
        + "".join(parts)
        + "</svg>"
    )


def _lesson_link(env, les: Lesson, text: str) -> nodes.reference:
    ref = nodes.reference("", "", internal=True, refuri=_uri(env, les.page))
    ref += nodes.strong(text=text)
    return ref


class CourseMap(Directive):
    """The kernel chain, then each part with its lessons, every lesson linked."""

    has_content = False

    def run(self):
        env = self.state.document.settings.env
        gallery = _gallery(env.app)
        _note_dependencies(env, gallery)
        parts = course(gallery)
        chain = [les for p in parts if p.folder in CHAIN_PARTS for les in p.lessons]
        out: list[nodes.Node] = []
        if chain:
            out.append(nodes.raw("", chain_svg(chain, lambda page: _uri(env, page)), format="html"))
        for part in parts:
            section = nodes.container(classes=["tb-part"])
            section += nodes.rubric(text=part.title)
            items = nodes.bullet_list()
            for les in part.lessons:
                para = nodes.paragraph()
                para += _lesson_link(env, les, f"{les.number} {les.name}")
                if les.subtitle:
                    para += nodes.Text(f": {les.subtitle}")
                item = nodes.list_item()
                item += para
                items += item
            section += items
            out.append(section)
        return out


class Syllabus(Directive):
    """Each part (a section: its title and introduction), each lesson in it (a
    subsection: its title, linked, and its "You will learn" list)."""

    has_content = False

    def run(self):
        env = self.state.document.settings.env
        document = self.state.document
        gallery = _gallery(env.app)
        _note_dependencies(env, gallery)
        out = []
        for part in course(gallery):
            section = self._section(part.title, document)
            section += nodes.title(text=part.title)
            if part.intro:
                _parse_rst(self, part.intro, section)
            for les in part.lessons:
                sub = self._section(les.title, document)
                title = nodes.title()
                title += nodes.reference("", les.title, internal=True, refuri=_uri(env, les.page))
                sub += title
                if les.learn:
                    sub += nodes.rubric(text="You will learn")
                    _parse_rst(self, les.learn, sub)
                section += sub
            out.append(section)
        return out

    @staticmethod
    def _section(title: str, document) -> nodes.section:
        section = nodes.section()
        section["names"].append(nodes.fully_normalize_name(title))
        document.note_implicit_target(section, section)
        return section


def setup(app):
    app.add_role("course-count", CourseCount())
    app.add_directive("tilebook-course-map", CourseMap)
    app.add_directive("tilebook-syllabus", Syllabus)
