"""The lesson form, checked from a lesson's source (used by test_lesson_form.py).

Run it on any lesson while writing one, with the project's environment (which
``python3 dev.py -s env`` makes, and every session shares)::

    .nox/tilebook/bin/python tests/lesson_form.py gallery/03_real_kernels/07_vector_add.py

What it checks, and why:

* **No typed figures.**  A number followed by a unit of measurement (GB/s,
  TFLOP/s, µs, ms, %, a ratio such as ``1.5x``, registers, warps, programs,
  SMs) must not appear in a lesson's prose, its code comments or its string
  literals.  A measured figure reaches the reader from the data of the same
  build (``tilebook.course.prose.say``, tables, plots); a published one through the
  ``:datasheet:`` role.  Typed figures go stale and contradict the output
  printed beside them.
* **No private names** of tilebook (``_epilogue``, ``mm._PICKED``): lessons use
  the public API, which the API page documents.
* **No lint pragmas** (``# noqa``, ``# fmt: skip``) in the code a reader sees.
* **Glossary terms** are linked (``:term:``) at their first use in the prose.
* **Shape**: "You will learn", "Try this" with solutions, a correctness report
  that stops the build, a widget, claims checked in code where a lesson
  measures, a link to the API, and a length a reader can take in.
"""

from __future__ import annotations

import ast
import io
import os
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

try:
    from sphinx_gallery.py_source_parser import split_code_and_text_blocks
except ModuleNotFoundError as missing:
    if __name__ != "__main__":
        raise
    # Run by hand with another Python: say which, and the command that works.
    here = Path(__file__).resolve()
    env = os.path.relpath(here.parents[1] / ".nox" / "tilebook" / "bin" / "python")
    sys.exit(
        f"lesson_form.py reads lessons with sphinx-gallery's parser, and {sys.executable} "
        f"has no {missing.name}. Run it with the project's environment:\n"
        f"    {env} {os.path.relpath(here)} {' '.join(sys.argv[1:])}\n"
        f"(python3 dev.py -s env makes that environment, if {env} is missing)"
    )

ROOT = Path(__file__).resolve().parents[1]
LESSON_GLOB = "gallery/*/[0-9][0-9]_*.py"
MAX_LINE_CHARS = 88  # code lines: what fits a code block at 1280 px

_NUM_CORE = r"(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_NUMBER = rf"(?<![\w.^/]){_NUM_CORE}"
_RANGE = rf"{_NUMBER}(?:\s*(?:-|–|to)\s*{_NUM_CORE})?"
_UNITS = [
    r"[KMGTP]i?B/s\b",
    r"[KMGTP]?FLOP/s",
    r"[KMGTP]?FLOPS\b",
    r"(?:µs|us|ms|ns)\b",
    r"seconds?\b",
    r"%",
    r"percent\b",
    r"(?:x|×)(?![\w])",
    r"times\s+(?:faster|slower|as\s+fast|the\s+speed)",
    r"registers?\b",
    r"warps?\b",
    r"programs?\b",
    r"SMs?\b",
]
FIGURE = re.compile(rf"{_RANGE}\s?(?:{'|'.join(_UNITS)})")

GLOSSARY_TERMS = {
    # term (as linked) -> pattern of its uses in prose
    "SM": r"\bSMs?\b",
    "warp": r"(?i)\bwarps?\b",
    "warpgroup": r"(?i)\bwarpgroups?\b",
    "HBM": r"\bHBM\b",
    "L2": r"\bL2\b",
    "shared memory": r"(?i)\bshared memory\b",
    "register": r"(?i)\bregisters?\b",
    "spill": r"(?i)\bspill(?:s|ed|ing)?\b",
    "PTX": r"\bPTX\b",
    "SASS": r"\bSASS\b",
    "TMA": r"\bTMA\b",
    "mma": r"\bmma\b",
    "wgmma": r"\bwgmma\b",
    "occupancy": r"(?i)\boccupancy\b",
    "coalesced": r"(?i)\b(?:un)?coalesc(?:ed|ing)\b",
}
_ROLE = re.compile(r":term:`([^`<]*?)(?:\s*<([^`>]+)>)?`")
_LITERAL = re.compile(r"``.+?``|:(?:math|func|class|mod|meth|attr|data|doc|ref):`[^`]*`")
_PRAGMA = re.compile(r"#\s*(?:noqa\b|fmt:\s*(?:skip|off|on)\b|type:\s*ignore\b|pragma\b)")


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.text}"


def figures_in(text: str) -> list[str]:
    """Typed figures (a number with a unit of measurement) in a piece of text."""
    found = []
    for m in FIGURE.finditer(text):
        s = " ".join(m.group(0).split())
        if re.search(r"\s(?:x|×)$", s):  # "128 x 128": a shape, not a ratio
            continue
        found.append(s)
    return found


def _text_blocks(path: Path):
    _, blocks = split_code_and_text_blocks(str(path))
    return blocks


def _strip_headings(lines: list[str]) -> list[str]:
    out = []
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        is_title = bool(re.fullmatch(r"\s*([-=~^\"'])\1{3,}\s*", nxt)) and line.strip()
        is_rule = bool(re.fullmatch(r"\s*([-=~^\"'])\1{3,}\s*", line))
        out.append("" if (is_title or is_rule) else line)
    return out


def check_prose_figures(path: Path, rel: str) -> list[Problem]:
    problems = []
    for block in _text_blocks(path):
        if block.type != "text":
            continue
        text = block.content
        for m in FIGURE.finditer(text):
            if figures_in(m.group(0)):
                line = block.lineno + text.count("\n", 0, m.start())
                fig = " ".join(m.group(0).split())
                problems.append(Problem(rel, line, "typed figure in prose", fig))
    return problems


def check_code(path: Path, rel: str) -> list[Problem]:
    """Comments and string literals of code cells: typed figures and pragmas."""
    problems = []
    source = path.read_text()
    blocks = _text_blocks(path)
    starts = [b.lineno for b in blocks] + [source.count("\n") + 2]
    prose_lines = {
        line
        for b, end in zip(blocks, starts[1:], strict=False)
        if b.type == "text"
        for line in range(max(1, b.lineno - 1), end)
    }
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    # Python 3.12 tokenizes f-strings (PEP 701): their text and the format specs of
    # their replacement fields ({x:.1%}) both come as FSTRING_MIDDLE; a spec is code.
    # ``fields`` counts open braces; each f-string remembers the count it began at.
    fields, began = 0, []
    for tok in tokens:
        line = tok.start[0]
        if tok.type == tokenize.OP and tok.string in "{}":
            fields += 1 if tok.string == "{" else -1
        elif tok.type == getattr(tokenize, "FSTRING_START", -1):
            began.append(fields)
        elif tok.type == getattr(tokenize, "FSTRING_END", -1):
            began.pop()
        if tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1) and fields != began[-1]:
            continue  # a format spec
        if tok.type == tokenize.COMMENT:
            if line in prose_lines or tok.string.startswith("# %%"):
                continue  # a text block: checked as prose
            if _PRAGMA.search(tok.string):
                problems.append(Problem(rel, line, "lint pragma in lesson code", tok.string))
            for fig in figures_in(tok.string):
                problems.append(Problem(rel, line, "typed figure in a comment", fig))
        elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            if tok.start[0] == 1:  # the module docstring is prose: checked as text
                continue
            # Replacement fields ({x:8.1%}) are code, not typed figures.
            literal, fewer = tok.string, None
            while fewer != literal:  # nested fields ({x:>{w}.1%}) from the inside out
                fewer, literal = literal, re.sub(r"\{[^{}]*\}", "", literal)
            for fig in figures_in(literal):
                problems.append(Problem(rel, line, "typed figure in a string", fig))
    for i, text in enumerate(source.splitlines(), 1):
        if len(text) > MAX_LINE_CHARS and not text.startswith("#"):
            problems.append(Problem(rel, i, f"code line over {MAX_LINE_CHARS} chars", text[:60]))
    return problems


def check_private_names(path: Path, rel: str) -> list[Problem]:
    tree = ast.parse(path.read_text())
    problems = []
    tilebook_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "tilebook":
                    tilebook_names.add((a.asname or a.name).split(".")[0])
                    if any(p.startswith("_") for p in a.name.split(".")):
                        problems.append(Problem(rel, node.lineno, "private import", a.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tilebook":
            mod_parts = node.module.split(".")
            if any(p.startswith("_") for p in mod_parts):
                problems.append(Problem(rel, node.lineno, "private import", node.module))
            for a in node.names:
                if a.name.startswith("_"):
                    problems.append(
                        Problem(rel, node.lineno, "private import", f"{node.module}.{a.name}")
                    )
                tilebook_names.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in tilebook_names:
                problems.append(Problem(rel, node.lineno, "private name", node.attr))
    return problems


def check_glossary_links(path: Path, rel: str) -> list[Problem]:
    """Each glossary term's first use in the prose is a :term: link to it."""
    events: list[tuple[int, int, str, bool]] = []  # (block, offset, term, linked)
    for bi, block in enumerate(_text_blocks(path)):
        if block.type != "text":
            continue
        text = "\n".join(_strip_headings(block.content.splitlines()))
        linked_spans = []
        for m in _ROLE.finditer(text):
            target = (m.group(2) or m.group(1)).strip()
            linked_spans.append((m.start(), m.end()))
            events.append((bi, m.start(), target, True))
        blanked = text
        for m in list(_ROLE.finditer(text)) + list(_LITERAL.finditer(text)):
            blanked = blanked[: m.start()] + " " * (m.end() - m.start()) + blanked[m.end() :]
        for term, pattern in GLOSSARY_TERMS.items():
            for m in re.finditer(pattern, blanked):
                events.append((bi, m.start(), term, False))
    problems = []
    seen: set[str] = set()
    for _, _, term, linked in sorted(events, key=lambda e: (e[0], e[1])):
        if term in seen or term not in GLOSSARY_TERMS:
            continue
        seen.add(term)
        if not linked:
            problems.append(Problem(rel, 0, "glossary term not linked at first use", term))
    return problems


def check_shape(path: Path, rel: str) -> list[Problem]:
    src = path.read_text()
    need = {
        "a 'You will learn' list": r"\.\. rubric:: You will learn",
        "a 'Try this' section": r"\nTry this\n|# Try this\n",
        "solutions to the exercises": r"\.\. dropdown:: Solution",
        "a correctness report": r"CorrectnessReport\(",
        "a check that stops the build": r"\.assert_ok\(\)",
        "a widget": r"Explorer\(|widgets\.|widgets_\w+ import \(?\s*\w+",
        "a link to the API": r":func:`tilebook\.",
    }
    problems = [
        Problem(rel, 0, "missing", what) for what, rx in need.items() if not re.search(rx, src)
    ]
    if re.search(r"record_or_measure\(|bench\.compare\(|\.measure\(", src) and "Claims(" not in src:
        problems.append(Problem(rel, 0, "missing", "claims checked against its measurements"))
    return problems


CHECKS = (check_prose_figures, check_code, check_private_names, check_glossary_links, check_shape)


def check_lesson(path: Path) -> list[Problem]:
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return [p for check in CHECKS for p in check(path, rel)]


def lessons() -> list[Path]:
    return sorted(ROOT.glob(LESSON_GLOB))


if __name__ == "__main__":
    paths = [Path(a).resolve() for a in sys.argv[1:]] or lessons()
    total = 0
    for p in paths:
        found = check_lesson(p)
        total += len(found)
        for problem in found:
            print(problem)
    print(f"{total} problem(s) in {len(paths)} lesson(s)")
    sys.exit(1 if total else 0)
