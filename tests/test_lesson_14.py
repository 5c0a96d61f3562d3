"""Lesson 14 (autograd, torch.library, profiling, the decision tree).

Running the whole lesson takes a while, so these tests lift its kernels, its
``autograd.Function``, its ``torch.library`` registration (the interpreter's
branch) and its decision tree out of the script, by their source, into a small
module, and check what the lesson says about them: the gradient check passes,
and fails for a wrong backward; the registered op compiles with
``fullgraph=True`` and no graph break while the bare Function is refused under
the interpreter; every leaf of the tree cites a committed record, and the claims
the lesson makes about the tree hold on those records.  The widget class is
tested on its own.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from lesson_source import LessonSource, bound_names

import tilebook
from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.check import default_tolerance
from tilebook.course.claims import ClaimError, Claims
from tilebook.course.experiments import decision
from tilebook.course.widgets_decision import VERDICTS, DecisionTree, Leaf, Question

ROOT = Path(__file__).parents[1]
SCRIPT = LessonSource(14)
LIFTED = [
    "BLOCK",
    "swiglu_fwd_kernel",
    "swiglu_bwd_kernel",
    "acc_type",
    "swiglu_fwd",
    "swiglu_bwd",
    "SwiGLU",
    "reference",
    "grad_ok",
    "swiglu_bwd_wrong",
    "SwiGLUWrong",
    "REGISTRATION",  # the `if GPU: ... else: ...` block
    "setup_context",
    "swiglu_backward",
    "swiglu.register_autograd",
    "block",
    "records",
    "reading",
    "tree",
]
NAMESPACE = "lesson14_test"  # the lesson's own namespace stays free for the lesson
DEVICE, GPU = tilebook.device(), tilebook.is_gpu()
BACKEND = "inductor" if GPU else "aot_eager"


def _names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines; besides, ``REGISTRATION`` names the
    ``if GPU: ... else: ...`` block and a bare call is named for what it calls."""
    if isinstance(node, ast.If) and ast.unparse(node.test) == "GPU" and node.orelse:
        return ["REGISTRATION"]
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return [ast.unparse(node.value.func)]
    return bound_names(node)


def _source(name: str) -> str:
    """The top-level statements that define ``name``, in order (one at least)."""
    found = [n for n in SCRIPT.tree.body if name in _names(n)]
    assert found, f"lesson 14 does not define {name!r} at top level"
    return "\n".join(SCRIPT.segment(node) for node in found)


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file, as Triton needs source)."""
    head = (
        "import torch\nimport torch.nn.functional as F\nimport triton\n"
        "import triton.language as tl\n"
        "from tilebook.course.bench import load_record\n"
        "from tilebook.course.experiments import decision\n"
        "from tilebook.course.widgets_decision import DecisionTree\n\n"
        f"DEVICE, GPU = torch.device({DEVICE.type!r}), {GPU}\n\n"
    )

    def source(name: str) -> str:
        return _source(name).replace('"lesson14::', f'"{NAMESPACE}::')

    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson14"), head, source=source)


@pytest.mark.parametrize(
    ("n", "dtype"), [(1, torch.float32), (1500, torch.float32), (1025, torch.float16)]
)
def test_function_matches_float64(lesson, n, dtype):
    g = torch.Generator().manual_seed(n)
    a, b, dy = (torch.randn(n, generator=g).to(DEVICE, dtype) for _ in range(3))
    want = lesson.reference(a, b, dy)
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = lesson.SwiGLU.apply(ag, bg)
    got = (y, *torch.autograd.grad(y, (ag, bg), dy))
    for o, r in zip(got, want, strict=True):
        rel = ((o.double() - r).norm() / r.norm()).item()
        assert rel <= default_tolerance(dtype), rel


def test_gradcheck_passes_and_catches_wrong_backwards(lesson):
    assert lesson.grad_ok(lesson.SwiGLU.apply)
    assert not lesson.grad_ok(lesson.SwiGLUWrong.apply)

    class Swapped(lesson.SwiGLU):  # da and db exchanged: shapes fit, values do not
        @staticmethod
        def backward(ctx, dy):
            da, db = lesson.SwiGLU.backward(ctx, dy)
            return db, da

    assert not lesson.grad_ok(Swapped.apply)


def test_the_wrong_kernel_differs_in_the_marked_line_only():
    right = _source("swiglu_bwd_kernel").splitlines()[2:]
    wrong = _source("swiglu_bwd_wrong").splitlines()[2:]
    changed = [w for r, w in zip(right, wrong, strict=True) if r != w]
    assert changed == [w for w in wrong if w.endswith("# wrong")] and len(changed) == 1


def test_launcher_rejects_what_it_cannot_read(lesson):
    a = torch.randn(8, 4, device=DEVICE)
    with pytest.raises(AssertionError):
        lesson.swiglu_fwd(a.t(), a.t())
    with pytest.raises(AssertionError):
        lesson.swiglu_fwd(a, a[:4])


def test_registered_op_compiles_to_one_graph(lesson):
    torch._dynamo.reset()
    a, b = (torch.randn(50, device=DEVICE, requires_grad=True) for _ in range(2))
    explained = torch._dynamo.explain(lesson.block(lesson.swiglu))(a, b)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    torch._dynamo.reset()
    step = torch.compile(lesson.block(lesson.swiglu), backend=BACKEND, fullgraph=True)
    out = step(a, b)
    out.backward()
    got = (out.detach(), a.grad.clone(), b.grad.clone())
    a.grad = b.grad = None
    ref = lesson.block(lesson.SwiGLU.apply)(a, b)
    ref.backward()
    for g, r in zip(got, (ref.detach(), a.grad, b.grad), strict=True):
        torch.testing.assert_close(g, r)
    assert lesson.grad_ok(lesson.swiglu)
    torch.library.opcheck(
        getattr(torch.ops, NAMESPACE).swiglu.default,
        (torch.randn(9, device=DEVICE), torch.randn(9, device=DEVICE)),
        test_utils=("test_schema", "test_faketensor"),
    )


@pytest.mark.skipif(GPU, reason="a statement about the interpreter (CPU mode)")
def test_bare_function_is_refused_under_the_interpreter(lesson):
    """What the lesson's table shows in CPU mode: fullgraph refuses the bare Function."""
    torch._dynamo.reset()
    a, b = (torch.randn(16, requires_grad=True) for _ in range(2))
    step = torch.compile(lesson.block(lesson.SwiGLU.apply), backend="aot_eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        step(a, b)
    torch._dynamo.reset()


def test_every_leaf_cites_a_committed_record(lesson):
    reading = lesson.reading
    assert set(reading.leaves) == set(decision.CASES)
    for key, leaf in reading.leaves.items():
        assert leaf.record == decision.CASES[key][0]
        rec = load_record(leaf.record, RECORDS_DIR)
        assert rec is not None, f"leaf {key} cites {leaf.record}, which is not committed"
        assert rec.provenance["mode"] == "gpu" and leaf.source == rec.caption()
        assert leaf.verdict in ("good", "level", "slow")


def test_every_path_ends_at_a_leaf_and_some_are_flagged(lesson):
    paths = lesson.tree.paths()
    leaves = lesson.reading.leaves
    assert sorted(p["leaf"] for p in paths) == sorted(leaves)
    assert all(p["keys"][0] == "op" for p in paths)
    flagged = set(lesson.tree.flagged())
    # flagged: exactly the leaves the records show slower beyond the spread
    assert flagged == {k for k, leaf in leaves.items() if leaf.verdict == "slow"}
    assert {"cublas_rag", "unfused"} <= flagged


def test_the_tree_claims_hold_on_the_committed_records(lesson):
    reading = lesson.reading
    for text, key, true_if in reading.expected():
        assert reading.leaves[key].verdict in true_if, (text, reading.leaves[key].evidence)
    claims = Claims("14", reading.source)
    assert reading.source is not None
    note = reading.check(claims)
    assert claims.ok and len(claims.items) >= 3
    assert (note is None) == reading.hopper


def test_the_tree_claims_fail_when_a_record_says_otherwise(lesson, monkeypatch):
    """The claims bite: a record where PyTorch as written beat the softmax kernel
    contradicts "PyTorch as written is the slow softmax"."""
    monkeypatch.delenv("TILEBOOK_CLAIMS", raising=False)
    rec = lesson.records["lesson10_forward"]
    rows = [
        dict(r, median_ms=r["median_ms"] / 100, p20_ms=r["p20_ms"] / 100, p80_ms=r["p80_ms"] / 100)
        if r["impl"] == "torch"
        else r
        for r in rec.rows
    ]
    swapped = decision.read({**lesson.records, "lesson10_forward": replace(rec, rows=rows)})
    assert swapped.leaves["eager_sm"].verdict == "good"
    with pytest.raises(ClaimError, match="slow softmax"):
        swapped.check(Claims("14", swapped.source))


def test_the_tree_says_where_its_figures_come_from_and_what_they_support(lesson):
    reading = lesson.reading
    for name, rec in lesson.records.items():
        assert name in reading.sources
        assert f"commit {rec.provenance['commit'][:7]}" in reading.sources
    assert reading.sources in lesson.tree.caption
    for leaf in reading.leaves.values():  # the wording follows the verdict
        assert f"{decision.VERDICT[leaf.verdict]} beyond the spread" in leaf.evidence
    # the square matmul is claimed not behind cuBLAS beyond the spread
    assert not reading.compared["triton_sq"].slower


def test_a_missing_record_gives_an_unknown_leaf(lesson):
    reading = decision.read({**lesson.records, "lesson07_sizes": None})
    got = reading.leaves["torch_small"]
    assert got.verdict == "unknown" and got.record == "lesson07_sizes"
    assert reading.source is None  # the claims are shown unchecked


def _tree(**changes):
    questions = {
        "q": Question("Which?", {"A": "a", "B": "next"}),
        "next": Question("Then?", {"C": "c"}),
    }
    leaves = {
        "a": Leaf("A", "good", "A ran faster.", "lesson07_sizes", "recorded"),
        "c": Leaf("C", "slow", "C ran slower.", "lesson07_sizes", "recorded"),
    }
    args = {"questions": questions, "leaves": leaves, "start": "q"} | changes
    return DecisionTree(args["questions"], args["leaves"], args["start"])


def test_decision_tree_widget():
    tree = _tree()
    assert [p["answers"] for p in tree.paths()] == [["A"], ["B", "C"]]
    assert tree.flagged() == ["c"]
    html = tree._repr_html_()
    assert 'data-tilebook-widget="decision"' in html and "C ran slower." in html
    assert tree.data()["questions"]["q"]["answers"] == [["A", "a"], ["B", "next"]]
    assert set(VERDICTS) >= {"good", "level", "slow", "wrong"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"start": "a"}, "is not a question"),
        ({"questions": {"q": Question("Which?", {"A": "zzz"})}}, "unknown"),
        ({"questions": {"q": Question("Which?", {})}}, "no answers"),
        ({"questions": {"q": Question("Which?", {"A": "a"})}}, "not reachable"),
        (
            {
                "questions": {
                    "q": Question("Which?", {"A": "r"}),
                    "r": Question("Again?", {"B": "q", "C": "a", "D": "c"}),
                }
            },
            "cycle",
        ),
    ],
)
def test_decision_tree_rejects_broken_trees(change, message):
    with pytest.raises(ValueError, match=message):
        _tree(**change)


def test_leaf_rejects_bad_verdicts_and_missing_records():
    with pytest.raises(ValueError, match="verdict"):
        Leaf("A", "fast", "text", "lesson07_sizes")
    with pytest.raises(ValueError, match="cites no record"):
        Leaf("A", "good", "text", "")


def test_the_lesson_is_in_the_lesson_form():
    sys.path.insert(0, str(ROOT / "tests"))
    from lesson_form import check_lesson

    assert [str(p) for p in check_lesson(SCRIPT.path)] == []
