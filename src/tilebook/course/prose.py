"""Sentences made from data: how a measured figure reaches a lesson's prose.

A lesson's comment blocks never hold a measured number (a test scans them).
Where a paragraph must state one, the lesson builds it from the data of the
same build::

    say("The kernel moves {gbps:,.0f} GB/s, {frac:.0%} of the copy.",
        gbps=row["gbps"], frac=row["gbps"] / copy)

On the site the result reads as ordinary body text, not as an ``Out:`` box (its
``_repr_html_`` is a paragraph); in a notebook it shows the same way, and in a
terminal its ``repr`` is the plain sentence.  Templates take Python's format
specs and a little inline markup: ````code````, ``*emphasis*`` and
``**strong**``.  Values are escaped, so data cannot inject markup.
"""

from __future__ import annotations

import html
import re
import string
import textwrap
from typing import Any

from . import display

__all__ = ["Prose", "say"]

_INLINE = [
    (re.compile(r"``(.+?)``"), r"<code>\1</code>"),
    (re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])"), r"<em>\1</em>"),
]


def _markup(text: str) -> str:
    """Escape ``text`` for HTML, then turn the inline markup into tags."""
    out = html.escape(text, quote=False)
    for rx, repl in _INLINE:
        out = rx.sub(repl, out)
    return out


def _plain(text: str) -> str:
    return text.replace("``", "").replace("**", "")


class Prose:
    """One or more paragraphs of text, displayed as body text of the page.

    Build it with :func:`say`; ``a + b`` puts two pieces one after the other as
    separate paragraphs.
    """

    def __init__(self, *paragraphs: str) -> None:
        for p in paragraphs:
            if not isinstance(p, str):
                raise TypeError(f"Prose takes strings, got {type(p).__name__}")
        self.paragraphs = [p.strip() for p in paragraphs if p.strip()]
        display.register(self)

    def __add__(self, other: Prose) -> Prose:
        if not isinstance(other, Prose):
            return NotImplemented
        joined = Prose.__new__(Prose)
        joined.paragraphs = [*self.paragraphs, *other.paragraphs]
        display.register(joined, replaces=(self, other))
        return joined

    def __str__(self) -> str:
        return "\n\n".join(textwrap.fill(_plain(p), 79) for p in self.paragraphs)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        body = "".join(f"<p>{_markup(p)}</p>" for p in self.paragraphs)
        return f'<div class="tb-prose" data-tilebook-prose="1">{body}</div>'


def say(template: str, /, **values: Any) -> Prose:
    """A paragraph from ``template`` with ``values`` filled in (``str.format`` rules).

    Every ``{field}`` in the template must be given, and every value given must
    be used: a sentence that silently drops a figure, or shows a placeholder,
    is a bug.
    """
    if not isinstance(template, str):
        raise TypeError(f"say() takes a template string, got {type(template).__name__}")
    fields = {
        name.split(".")[0].split("[")[0]
        for _, name, _, _ in string.Formatter().parse(template)
        if name is not None
    }
    if "" in fields or any(f.isdigit() for f in fields):
        raise ValueError("say() templates name their fields: {gbps:.0f}, not {} or {0}")
    missing = sorted(fields - values.keys())
    unused = sorted(values.keys() - fields)
    if missing:
        raise KeyError(f"say(): no value for {', '.join(missing)} in {template!r}")
    if unused:
        raise ValueError(f"say(): values {', '.join(unused)} are not used by {template!r}")
    return Prose(template.format(**values))
