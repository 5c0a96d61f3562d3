"""The decision tree of lesson 14: Triton, CUDA C++, torch.compile or a library.

:class:`DecisionTree` walks a reader through a few questions (what the op is,
how large, which tool they would reach for) to a leaf.  Each leaf is a
:class:`Leaf`: the choice, a verdict (``good``, ``level``, ``slow`` or
``wrong``) and the evidence behind it, a sentence made by the lesson from a
committed or live record, with the record's name and caption.  The verdicts
``slow`` and ``wrong`` are flagged in the widget's colours.

Everything the widget shows is computed in Python (:meth:`DecisionTree.paths`
lists every way through the tree), so a test can check that each leaf is
reachable and cites a record; the JavaScript only draws the answers chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .widgets import Widget, asset

__all__ = ["VERDICTS", "DecisionTree", "Leaf", "Question"]

#: The verdicts a leaf can carry, from best to worst.  ``level``: no faster
#: than the alternative, so the work of writing it buys nothing.
VERDICTS = ("good", "level", "slow", "wrong", "unknown")


@dataclass(frozen=True)
class Question:
    """A node: ``text`` asked, and for each answer (in the order shown) the next key."""

    text: str
    answers: Mapping[str, str]


@dataclass(frozen=True)
class Leaf:
    """Where a path ends: ``choice`` with its ``verdict`` and the ``evidence``.

    ``record`` names the record the evidence comes from; ``source`` is that
    record's caption (or says that there is no record).
    """

    choice: str
    verdict: str
    evidence: str
    record: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Leaf verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if not self.record:
            raise ValueError(f"leaf {self.choice!r} cites no record")


class DecisionTree(Widget):
    """Questions leading to leaves; ``start`` is the first question's key.

    Raises :class:`ValueError` when an answer leads to a key that is neither a
    question nor a leaf, when a key is both, when a question has no answers, or
    when some node cannot be reached from ``start`` (or the tree has a cycle).
    """

    kind = "decision"
    scripts = ("decision.js",)

    def __init__(
        self,
        questions: Mapping[str, Question],
        leaves: Mapping[str, Leaf],
        start: str,
        *,
        title: str = "Which tool?",
        caption: str = "",
    ) -> None:
        self.questions, self.leaves = dict(questions), dict(leaves)
        self.start, self.title, self.caption = start, title, caption
        both = self.questions.keys() & self.leaves.keys()
        if both:
            raise ValueError(f"keys both question and leaf: {sorted(both)}")
        if start not in self.questions:
            raise ValueError(f"start {start!r} is not a question")
        for key, q in self.questions.items():
            if not q.answers:
                raise ValueError(f"question {key!r} has no answers")
            for answer, nxt in q.answers.items():
                if nxt not in self.questions and nxt not in self.leaves:
                    raise ValueError(f"answer {answer!r} of {key!r} leads to unknown {nxt!r}")
        reached = {k for path in self.paths() for k in path["keys"]}
        unreached = (self.questions.keys() | self.leaves.keys()) - reached
        if unreached:
            raise ValueError(f"not reachable from {start!r}: {sorted(unreached)}")

    def paths(self) -> list[dict[str, Any]]:
        """Every way from ``start`` to a leaf: ``keys`` visited, ``answers`` given, ``leaf``."""
        out: list[dict[str, Any]] = []

        def walk(key: str, keys: list[str], answers: list[str]) -> None:
            if key in keys:
                raise ValueError(f"the tree has a cycle through {key!r}")
            keys = [*keys, key]
            if key in self.leaves:
                out.append({"keys": keys, "answers": answers, "leaf": key})
                return
            for answer, nxt in self.questions[key].answers.items():
                walk(nxt, keys, [*answers, answer])

        walk(self.start, [], [])
        return out

    def flagged(self) -> list[str]:
        """The leaves whose verdict is ``slow`` or ``wrong``."""
        return [k for k, v in self.leaves.items() if v.verdict in ("slow", "wrong")]

    def data(self) -> dict[str, Any]:
        questions = {
            k: {"text": q.text, "answers": [[a, n] for a, n in q.answers.items()]}
            for k, q in self.questions.items()
        }
        return {
            "start": self.start,
            "questions": questions,
            "leaves": {k: asdict(v) for k, v in self.leaves.items()},
            "caption": self.caption,
            "css": asset("decision.css"),
        }
