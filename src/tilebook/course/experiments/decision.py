"""When not to write Triton: lesson 14's decision tree, read from the course's records.

Each leaf of the tree compares a choice with its alternative on two rows of one
record (:data:`CASES`): lessons 07-10's records and the package benchmark's
``bench_rms_norm``.  :func:`read` compares them
(:func:`~tilebook.course.claims.speedup`: a tie when the p20-p80 spreads overlap)
and returns a :class:`Reading`, whose leaves the lesson's widget shows, which checks the lesson's claims
on the same records and says what they show::

    records = {name: load_record(name) for name in decision.RECORDS}
    reading = decision.read(records)
    DecisionTree(decision.QUESTIONS, reading.leaves, "op", caption=reading.sources)
    reading.check(Claims("14", reading.source))

A missing record gives its leaves the verdict "unknown" and the claims no data.
Runs in either mode: it reads records, it measures nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..claims import MIN_NOISE, Comparison, speedup, within
from ..prose import say
from ..widgets_decision import Leaf, Question

__all__ = [
    "CASES",
    "NAMES",
    "QUESTIONS",
    "RECORDS",
    "VERDICT",
    "Reading",
    "read",
    "sources",
    "verdicts",
]

RN = {"kernel": "rms_norm_fwd", "shape": "16384x16384"}
#: Each leaf: its record, the choice's row, the alternative's row, the row's fields.
CASES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "cublas_sq": ("lesson09_sizes", "cuBLAS", "tilebook", {"size": 8192}),
    "triton_sq": ("lesson09_sizes", "tilebook", "cuBLAS", {"size": 8192}),
    "cuda_sq": ("lesson09_sizes", "cuBLAS", "tilebook", {"size": 8192}),
    "cublas_rag": ("lesson09_sizes", "cuBLAS", "tilebook", {"size": 4095}),
    "triton_rag": ("lesson09_sizes", "tilebook", "cuBLAS", {"size": 4095}),
    "fused": ("lesson09_linear_act", "tilebook", "unfused", {}),
    "unfused": ("lesson09_linear_act", "unfused", "tilebook", {}),
    "eager_sm": ("lesson10_forward", "torch", "tilebook", {"n": 2048}),
    "compile_sm": ("lesson10_forward", "torch.compile", "tilebook", {"n": 2048}),
    "triton_sm": ("lesson10_forward", "tilebook", "torch.compile", {"n": 2048}),
    "compile_rn": ("bench_rms_norm", "torch.compile", "tilebook", RN),
    "triton_rn": ("bench_rms_norm", "tilebook", "torch.compile", RN),
    "torch_small": ("lesson07_sizes", "torch.add", "tilebook", {"log2n": 12}),
    "triton_small": ("lesson07_sizes", "tilebook", "torch.add", {"log2n": 12}),
    "torch_large": ("lesson07_sizes", "torch.add", "tilebook", {"log2n": 28}),
    "triton_large": ("lesson07_sizes", "tilebook", "torch.add", {"log2n": 28}),
}
#: The records the leaves read, each once, in the order the leaves first name them.
RECORDS = list(dict.fromkeys(name for name, *_ in CASES.values()))
NAMES = {"tilebook": "the course's Triton kernel", "torch": "PyTorch as written"}
NAMES |= {"unfused": "cuBLAS, then PyTorch", "cuBLAS": "cuBLAS (CUDA C++ by hand)"}
VERDICT = {"good": "faster", "slow": "slower", "level": "neither faster nor slower"}

_TOOL = "Which do you reach for?"
#: The tree: what the op is, then its size or shape, then the tool.
QUESTIONS = {
    "op": Question(
        "What is the op?",
        {"a matrix multiply": "epi", "a row op": "row", "one elementwise op": "size"},
    ),
    "epi": Question("Is an activation applied to its output?", {"no": "shape", "yes": "act"}),
    "shape": Question("Its shape?", {"8192 cubed": "sq", "4095 x 4097 x 4093": "rag"}),
    "sq": Question(_TOOL, {"cuBLAS": "cublas_sq", "Triton": "triton_sq", "CUDA C++": "cuda_sq"}),
    "rag": Question(_TOOL, {"cuBLAS": "cublas_rag", "Triton": "triton_rag"}),
    "act": Question(_TOOL, {"Triton, fused": "fused", "cuBLAS, then the activation": "unfused"}),
    "row": Question("Which one?", {"softmax, rows of 2048": "sm", "rms_norm, rows of 16384": "rn"}),
    "sm": Question(
        _TOOL, {"PyTorch": "eager_sm", "torch.compile": "compile_sm", "Triton": "triton_sm"}
    ),
    "rn": Question(_TOOL, {"torch.compile": "compile_rn", "Triton": "triton_rn"}),
    "size": Question("How many elements?", {"2 to the 12": "small", "2 to the 28": "large"}),
    "small": Question(_TOOL, {"PyTorch": "torch_small", "Triton": "triton_small"}),
    "large": Question(_TOOL, {"PyTorch": "torch_large", "Triton": "triton_large"}),
}
#: A leaf's one case in words, filled from its record's row.
_CASE = {
    "lesson10_forward": "rows of {n}",
    "lesson09_linear_act": "{M} tokens through a {K}-to-{N} layer",
}
_NOT_FASTER = ("slow", "level")
#: How near the copy bandwidth "reaches the copy ceiling" is.
NEAR = 0.05


def sources(records: Mapping[str, Any]) -> str:
    """Where the figures come from: the records, grouped by GPU, date and commit."""
    runs: dict[str, list[str]] = {}
    for name, rec in records.items():
        p = rec.provenance if rec else {}
        run = f"{p['gpu']}, {p['date'][:10]}, commit {p['commit'][:7]}" if p else "none"
        runs.setdefault(run, []).append(name)
    return "; ".join(f"{', '.join(names)} ({run})" for run, names in runs.items())


def verdicts(rec: Any, mine: str, other: str, size: str, unit: str, **where: Any) -> str:
    """How ``mine`` ran against ``other`` at each ``size`` of ``rec``, by verdict:
    "faster at 2048 and 32768 columns, slower at 256 columns"."""
    if rec is None:
        return "unmeasured"
    held: dict[str, list[str]] = {}
    for row in rec.select(impl=mine, **where):
        c = speedup(row, rec.one(impl=other, **where, **{size: row[size]}))
        word = "faster" if c.faster else "slower" if c.slower else "level"
        held.setdefault(word, []).append(str(row[size]))
    return ", ".join(
        f"{word} at " + unit.format(", ".join(s[:-1]) + " and " * (len(s) > 1) + s[-1])
        for word, s in held.items()
    )


@dataclass
class Reading:
    """The tree's leaves as the records show them, and what the lesson says of them."""

    records: dict[str, Any]
    leaves: dict[str, Leaf] = field(default_factory=dict)
    #: Each leaf that has a record: its choice against its alternative.
    compared: dict[str, Comparison] = field(default_factory=dict)

    @property
    def sources(self) -> str:
        return sources(self.records)

    @property
    def source(self) -> str | None:
        """What the claims are checked against; None while a record is missing."""
        return None if None in self.records.values() else f"records {self.sources}"

    def leaf(self, key: str, choice: str) -> Leaf:
        """Leaf ``key``, reached by answering ``choice``: its verdict and evidence."""
        name, mine, other, where = CASES[key]
        rec = self.records[name]
        if rec is None:
            return Leaf(choice, "unknown", "No record of this comparison yet.", name, "")
        c = self.compared[key] = speedup(*(rec.one(impl=i, **where) for i in (mine, other)))
        verdict = "good" if c.faster else "slow" if c.slower else "level"
        text = (
            f"{NAMES.get(mine, mine)} ran at {c.ratio:.2f} times the speed of "
            f"{NAMES.get(other, other)}, p20-p80 spread {c.low:.2f} to {c.high:.2f}: "
            f"{VERDICT[verdict]} beyond the spread and the noise floor "
            f"({MIN_NOISE:.0%}, the least difference a claim counts)."
        )
        return Leaf(choice, verdict, text, name, rec.caption())

    def case(self, key: str) -> str:
        """The one case a leaf measured: a claim names it, as it holds for no other."""
        name, mine, _, where = CASES[key]
        rec = self.records[name]
        return _CASE[name].format(**rec.one(impl=mine, **where)) if rec else "its one case"

    def expected(self) -> list[tuple[str, str, tuple[str, ...]]]:
        """The lesson's claims on leaves: the claim, its leaf, the verdicts that make
        it true."""
        return [
            ("On the ragged shape cuBLAS is slow: Triton stages it", "cublas_rag", ("slow",)),
            (
                f"Fusing the activation beats cuBLAS then PyTorch for {self.case('fused')}",
                "fused",
                ("good",),
            ),
            ("PyTorch as written is the slow softmax", "eager_sm", ("slow",)),
            (
                f"Triton beats torch.compile on the softmax of {self.case('triton_sm')}",
                "triton_sm",
                ("good",),
            ),
            ("Triton is no faster than torch.add on tiny tensors", "triton_small", _NOT_FASTER),
        ]

    @property
    def hopper(self) -> bool:
        """Whether the matmul record took the Hopper paths (wgmma, TMA copies), for
        which the matmul leaves hold (no record: nothing to say otherwise)."""
        mm = self.records["lesson09_sizes"]
        return mm is None or str(mm.paths).startswith("9")

    def check(self, claims: Any):
        """Check ``claims`` (on :attr:`source`) of what the tree says: "not slower" where
        a tie is as good as a win, "not faster" where it is as bad as a loss, the
        square matmul not behind cuBLAS, and a large elementwise op at the copy
        ceiling for both.  The matmul's claims only for a record of the Hopper paths;
        returns the sentence that says so for another record, else None."""
        for text, key, true_if in self.expected():
            if self.hopper or not CASES[key][0].startswith("lesson09"):
                claims.check(text, self.leaves[key].verdict in true_if, self.leaves[key].evidence)
        sq = self.compared.get("triton_sq")
        if self.hopper:
            claims.check(
                "At 8192 cubed the Triton matmul is not slower than cuBLAS beyond the spread",
                sq is not None and not sq.slower,
                sq.evidence("the Triton matmul", "cuBLAS") if sq else "",
            )
        sizes = self.records["lesson07_sizes"]
        big = sizes.select(log2n=28) if sizes else []
        fractions = {r["impl"]: r["gbps"] / sizes.provenance["copy_gbps"] for r in big}
        claims.check(
            "For a large tensor, PyTorch and Triton both reach the copy ceiling",
            bool(fractions) and all(within(f, 1.0, NEAR) for f in fractions.values()),
            ", ".join(f"{k} at {f:.2f} of the copy" for k, f in fractions.items()),
        )
        if self.hopper:
            return None
        return say(
            "The matmul leaves were measured on the paths of compute capability {paths}, "
            "without the Hopper kernels and their copies; the advice below about the "
            "matmul is what they do on Hopper.",
            paths=self.records["lesson09_sizes"].paths,
        )

    def sizes_said(self, fusion: Any):
        """What one size per leaf hides: the softmax against torch.compile at every row
        length of its record, and lesson 08's fused layer (``fusion``, its record)
        across ``K``."""
        at_k = {"rec": fusion, "mine": "fused", "size": "K", "unit": "K = {}", "sweep": "K"}
        return say(
            "Each leaf is one size.  Against torch.compile, at every row length of its "
            "record, the course's softmax ran {sm}.  In lesson 08's sweep of ``K`` "
            "({where}), against cuBLAS then PyTorch, the fused linear and GELU ran {pair}; "
            "against ``F.linear`` alone, with no activation at all, it ran {alone}.",
            sm=verdicts(
                self.records["lesson10_forward"], "tilebook", "torch.compile", "n", "{} columns"
            ),
            where=fusion.caption() if fusion else "no record",
            pair=verdicts(other="unfused, PyTorch", **at_k),
            alone=verdicts(other="F.linear alone", **at_k),
        )

    def rms_norm_said(self):
        """The rms_norm leaf: torch.compile against the package's kernel."""
        rn, rec = self.compared.get("compile_rn"), self.records["bench_rms_norm"]
        return say(
            "On the rms_norm leaf, torch.compile ran at {ratio:.2f} times the speed of the "
            "package's kernel ({verdict}); that record was {where}.",
            ratio=rn.ratio if rn else float("nan"),
            verdict=VERDICT[self.leaves["compile_rn"].verdict] if rn else "no record",
            where=rec.caption() if rec else "none",
        )


def read(records: Mapping[str, Any]) -> Reading:
    """Each leaf of :data:`QUESTIONS` compared on ``records`` (by name; None where
    missing), in the order the tree asks."""
    reading = Reading(dict(records))
    for q in QUESTIONS.values():
        for answer, key in q.answers.items():
            if key in CASES:
                reading.leaves[key] = reading.leaf(key, answer)
    return reading
