"""Lesson 10 (softmax): it shows the package's kernels, and its records hold up."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

from tilebook.bench import load_record
from tilebook.ops import softmax as sm

LESSON = Path(__file__).parents[1] / "gallery" / "03_real_kernels" / "10_softmax.py"
SHOWN_IN_FULL = [
    "softmax_fwd_kernel",
    "softmax_fwd_online_kernel",
    "softmax_bwd_kernel",
]
IMPLS = {"tilebook", "torch", "torch.compile"}
VARIANTS = {
    "tilebook",
    "persistent grid",
    "persistent grid, 2 stages",
    "one row per program",
    "online path forced",
}


def _lesson_tree() -> tuple[str, ast.Module]:
    text = LESSON.read_text()
    return text, ast.parse(text)


@pytest.mark.parametrize("name", SHOWN_IN_FULL)
def test_lesson_shows_the_package_kernel(name):
    """Lesson 10 writes these kernels out in full; they must stay the package's."""
    text, tree = _lesson_tree()
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    (node,) = [n for n in defs if n.name == name]
    assert any(ast.unparse(d) == "triton.jit" for d in node.decorator_list)
    lesson_src = ast.get_source_segment(text, node)
    package_src = textwrap.dedent(inspect.getsource(getattr(sm, name).fn))
    package_src = package_src[package_src.index(f"def {name}") :]
    assert lesson_src.strip() == package_src.strip()


def test_lesson_does_not_redefine_the_package_launchers():
    """The lesson's launchers have names of their own: readers see which is which."""
    _, tree = _lesson_tree()
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    package = {"softmax", "launch_softmax_forward", "launch_softmax_backward"}
    assert not defined & package
    assert {"softmax_rows", "softmax_online", "softmax_persistent"} <= defined


def test_records_are_named_for_the_lesson():
    _, tree = _lesson_tree()
    names = [
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "record_or_measure"
        and isinstance(n.args[0], ast.Constant)
    ]
    assert sorted(names) == ["lesson10_sizes", "lesson10_variants"]


def test_structure():
    """A "you will learn" list, API links, and a solution for every exercise."""
    text, tree = _lesson_tree()
    doc = ast.get_docstring(tree)
    assert doc.startswith("10. softmax:")
    assert ".. rubric:: You will learn" in doc
    assert ":func:`tilebook.softmax`" in doc and ":mod:`tilebook.ops.softmax`" in doc
    try_this = text[text.index("# Try this") :]
    exercises = re.findall(r"^# (\d+)\. ", try_this, flags=re.M)
    assert exercises == [str(i) for i in range(1, len(exercises) + 1)]
    assert len(exercises) >= 3
    assert try_this.count(".. dropdown:: Solution") == len(exercises)


def _committed(name: str):
    rec = load_record(name)
    if rec is None:
        pytest.skip(f"no committed record {name!r}")
    return rec


def test_sizes_record():
    """Every length has the three implementations in both directions, on >= 256 MiB."""
    rec = _committed("lesson10_sizes")
    assert rec.provenance["mode"] == "gpu" and rec.provenance.get("copy_gbps")
    lengths = {r["n"] for r in rec.rows}
    assert min(lengths) <= 256 and max(lengths) > sm.ONLINE_THRESHOLD
    for kernel in ("forward", "backward"):
        for n in lengths:
            got = {r["impl"] for r in rec.select(kernel=kernel, n=n)}
            assert got == IMPLS, (kernel, n, got)
    for r in rec.rows:
        assert r["tensor_mib"] >= 256
        assert r["rows"] * r["n"] * 2 == r["tensor_mib"] * 2**20  # bfloat16
        passes = 2 if r["kernel"] == "forward" else 3
        assert r["bytes"] == passes * r["tensor_mib"] * 2**20
        assert r["gbps"] > 0


def test_widget_has_slow_cells():
    """The widget flags cells under 65% of the best forward figure: some must be."""
    rec = _committed("lesson10_sizes")
    forward = rec.select(kernel="forward")
    best = max(r["gbps"] for r in forward)
    assert any(r["gbps"] < 0.65 * best for r in forward)


def test_variants_record():
    rec = _committed("lesson10_variants")
    for n in {r["n"] for r in rec.rows}:
        assert {r["impl"] for r in rec.select(n=n)} == VARIANTS
    for r in rec.rows:
        if not r["impl"].startswith("persistent"):
            continue
        assert 1 <= r["programs_per_sm"] <= 32
        assert r["grid"] <= r["programs_per_sm"] * rec.provenance["sm_count"]


def _lesson_function(name: str, **globals_):
    """A top-level function of the lesson, compiled on its own with these globals."""
    _, tree = _lesson_tree()
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    (node,) = [n for n in defs if n.name == name]
    namespace = dict(globals_)
    code = compile(ast.Module([node], []), str(LESSON), "exec")
    exec(code, namespace)  # noqa: S102  (the lesson's own source, not run as a whole)
    return namespace[name]


@pytest.mark.parametrize(
    ("registers", "shared", "warps", "expected"),
    [
        (64, 128, 8, (4, "registers")),  # 64 x 256 threads: 4 x 16384 registers
        (61, 128, 8, (4, "registers")),  # rounded up to 64
        (65, 128, 8, (3, "registers")),  # rounded up to 72
        (128, 64, 16, (1, "registers")),
        (32, 0, 16, (4, "threads")),  # 512 threads of 2048
        (16, 0, 1, (32, "program slots")),
        (32, 100_000, 4, (2, "shared memory")),  # plus the 1 KiB reserved per program
    ],
)
def test_occupancy_arithmetic(registers, shared, warps, expected):
    h100 = {"sms": 132, "threads": 2048, "registers": 65536, "shared": 233472}
    programs_per_sm = _lesson_function("programs_per_sm", SM=h100)
    assert programs_per_sm(registers, shared, warps) == expected
