"""Claims about measurements, stated in code and checked against the page's data.

A sentence such as "grouped order helps large tiles" is a claim about a
measurement.  A lesson states it next to the code that checks it, on the data
the page shows (live on a GPU, the committed record on a CPU)::

    claims = Claims("09 matmul", sweep)
    g = speedup(sweep.one(tile="128x256", order="grouped"),
                sweep.one(tile="128x256", order="row-major"))
    claims.check("Grouped order is faster for the large tiles", g.faster, g.evidence())
    claims            # shown on the page: each claim with its evidence

A claim the data contradict stops the build with a :class:`ClaimError` naming
the lesson and the claim.  ``TILEBOOK_CLAIMS=show`` instead shows it to the
reader, marked as contradicted (never silently published either way).

Differences inside the measured spread are not differences: :func:`speedup`
calls two timings *tied* when their 20th-80th percentile intervals overlap, so
a claim of "faster" holds only beyond the noise.  Time what you compare in
interleaved rounds (:func:`tilebook.course.bench.measure_interleaved`); then the
spread includes the drift of the GPU's clocks.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import display
from .prose import Prose, _markup

__all__ = [
    "MIN_NOISE",
    "ClaimError",
    "Claims",
    "Comparison",
    "all_faster",
    "speedup",
    "within",
]

CLAIMS_ENV = "TILEBOOK_CLAIMS"
#: The smallest relative difference ever called real, whatever the spread says.
MIN_NOISE = 0.01


class ClaimError(AssertionError):
    """A lesson's claim is contradicted by the data it was checked against."""


def _times(row: dict[str, Any]) -> tuple[float, float, float]:
    try:
        med, p20, p80 = (float(row[k]) for k in ("median_ms", "p20_ms", "p80_ms"))
    except KeyError as exc:
        raise KeyError(f"a timed row needs median_ms, p20_ms and p80_ms; missing {exc}") from None
    if not (0 < p20 <= med <= p80):
        raise ValueError(f"inconsistent timing row: p20 {p20}, median {med}, p80 {p80}")
    return med, p20, p80


@dataclass(frozen=True)
class Comparison:
    """How many times faster ``a`` ran than ``b``, with the range the spread allows.

    ``ratio`` is ``b``'s median time over ``a``'s; ``low`` and ``high`` are the
    ratios at the ends of the two 20th-80th percentile intervals.
    """

    ratio: float
    low: float
    high: float
    min_noise: float = MIN_NOISE

    @property
    def faster(self) -> bool:
        """``a`` is faster than ``b`` beyond the spread (and beyond ``min_noise``)."""
        return self.low > 1.0 and self.ratio > 1.0 + self.min_noise

    @property
    def slower(self) -> bool:
        """``a`` is slower than ``b`` beyond the spread (and beyond ``min_noise``)."""
        return self.high < 1.0 and self.ratio < 1.0 - self.min_noise

    @property
    def tied(self) -> bool:
        """Neither is faster beyond the spread."""
        return not (self.faster or self.slower)

    @property
    def verdict(self) -> str:
        """``a`` against ``b`` in a word: ``"ahead"``, ``"behind"`` or ``"tie"``."""
        return "ahead" if self.faster else "behind" if self.slower else "tie"

    @property
    def standing(self) -> str:
        """``a`` against ``b`` for a sentence: "is ahead of", "is behind" or "ties with"."""
        return {"ahead": "is ahead of", "behind": "is behind", "tie": "ties with"}[self.verdict]

    def evidence(self, a: str = "it", b: str = "the other") -> str:
        said = (
            f"{a} runs {self.ratio:.3f}x the speed of {b} (spread {self.low:.3f}-{self.high:.3f}x"
        )
        if self.tied and (self.low > 1.0 or self.high < 1.0):  # the floor, not the spread
            said += f"; within the {self.min_noise:.0%} noise floor"
        return said + ")"


def speedup(a: dict[str, Any], b: dict[str, Any], *, min_noise: float = MIN_NOISE) -> Comparison:
    """Compare two timed rows (``median_ms``, ``p20_ms``, ``p80_ms``): how much faster is ``a``?"""
    a_med, a20, a80 = _times(a)
    b_med, b20, b80 = _times(b)
    return Comparison(b_med / a_med, b20 / a80, b80 / a20, min_noise)


def all_faster(pairs: dict[tuple[str, str], Comparison]) -> tuple[bool, str]:
    """``(holds, evidence)`` for "each ``a`` is faster than its ``b``", from
    ``{(a, b): speedup(row_a, row_b)}``: a claim of :meth:`Claims.check_all` in one line.
    No pairs hold nothing."""
    evidence = "; ".join(c.evidence(a, b) for (a, b), c in pairs.items())
    return bool(pairs) and all(c.faster for c in pairs.values()), evidence


def within(value: float, target: float, rel: float) -> bool:
    """``value`` is within ``rel`` (a fraction) of ``target``."""
    if rel < 0:
        raise ValueError(f"within(): rel must be >= 0, got {rel}")
    return abs(value - target) <= rel * abs(target)


@dataclass(frozen=True)
class _Claim:
    text: str
    holds: bool | None  # None: no data to check it against
    evidence: str


def _state_class(items: list[_Claim]) -> str:
    """The box's colour: the failure colour when a claim is contradicted, a neutral one
    when none could be checked, else the success colour (no extra class)."""
    if any(c.holds is False for c in items):
        return " tb-claims-failed"
    if items and all(c.holds is None for c in items):
        return " tb-claims-unchecked"
    return ""


class Claims:
    """The claims one part of a lesson makes, each checked when it is stated.

    ``source`` is the record (or anything with a ``caption()``, or a string that
    says where the data come from, e.g. "compiled ahead of time for sm_90") the claims are
    checked against; None means there is no measurement, and each claim is then
    shown as unchecked rather than asserted.
    """

    def __init__(self, lesson: str, source: Any = None) -> None:
        if not isinstance(lesson, str) or not lesson:
            raise TypeError("Claims(lesson, source): lesson is the lesson's name, e.g. '07'")
        self.lesson = lesson
        self.source = source
        self.items: list[_Claim] = []
        display.register(self)

    def check(self, text: str, holds: bool, evidence: str | Prose = "") -> Claims:
        """State ``text``; ``holds`` is the check on the data; ``evidence`` says what it saw.

        Raises :class:`ClaimError` when ``holds`` is false, unless
        ``TILEBOOK_CLAIMS=show``.  Returns ``self``, so checks can be chained.
        """
        if not isinstance(text, str) or not text.strip():
            raise TypeError("Claims.check(): the claim must be a non-empty sentence")
        evidence = str(evidence)
        if self.source is None:
            self.items.append(_Claim(text, None, "no measurement to check it against"))
            return self
        holds = bool(holds)
        if not holds and os.environ.get(CLAIMS_ENV, "").strip().lower() != "show":
            raise ClaimError(
                f"lesson {self.lesson}: the data contradict the claim {text!r}"
                + (f": {evidence}" if evidence else "")
                + f" ({self._caption()})"
            )
        self.items.append(_Claim(text, holds, evidence))
        return self

    def check_all(self, claims: Mapping[str, Any]) -> Claims:
        """:meth:`check` each ``{text: check}`` in order: one table of a part's claims.

        A check is ``holds``, ``(holds, evidence)``, a :class:`Comparison` (the claim
        that its ``a`` is faster beyond the spread; its evidence says by how much), or
        a function that returns one of those, called only when there is data to check
        against (``source`` not None): a check may then read rows that a missing
        record lacks.  Returns ``self``, so that ``Claims(...).check_all({...})``
        ending a cell shows the claims.
        """
        if not isinstance(claims, Mapping) or not claims:
            raise TypeError("Claims.check_all() takes a non-empty {claim: check} mapping")
        for text, spec in claims.items():
            if self.source is None:
                self.check(text, False)  # shown as not checked
                continue
            if callable(spec) and not isinstance(spec, Comparison):
                spec = spec()
            if isinstance(spec, Comparison):
                spec = (spec.faster, spec.evidence())
            holds, evidence = spec if isinstance(spec, tuple) else (spec, "")
            self.check(text, holds, evidence)
        return self

    @property
    def ok(self) -> bool:
        return all(c.holds is not False for c in self.items)

    def _caption(self) -> str:
        if isinstance(self.source, str):
            return self.source
        cap = getattr(self.source, "caption", None)
        return cap() if callable(cap) else "no record"

    def __repr__(self) -> str:
        mark = {True: "checked", False: "CONTRADICTED", None: "not checked"}
        lines = [f"Claims of lesson {self.lesson}, against data {self._caption()}:"]
        for c in self.items:
            lines.append(
                f"- [{mark[c.holds]}] {c.text}" + (f" ({c.evidence})" if c.evidence else "")
            )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        items = []
        for c in self.items:
            cls, mark = {
                True: ("ok", "&#10003;"),
                False: ("bad", "&#10007; contradicted by this build&#39;s data:"),
                None: ("none", "&#8211; not checked:"),
            }[c.holds]
            ev = f' <span class="tb-evidence">({_markup(c.evidence)})</span>' if c.evidence else ""
            items.append(f'<li class="tb-claim-{cls}">{mark} {_markup(c.text)}{ev}</li>')
        caption = html.escape(self._caption())
        return (
            f'<div class="tb-claims{_state_class(self.items)}" '
            f'data-tilebook-claims="{len(self.items)}">'
            f'<p class="tb-claims-head">Checked against the data above ({caption}):</p>'
            f"<ul>{''.join(items)}</ul></div>"
        )
