"""Lesson 01 (why Triton): its kernel, its launchers, and the measurements it defines.

The lesson's kernel and launchers are lifted out of the script (by their
source) into a small module and checked with the exercise checker, as a reader
would; the byte counting, the reading of Inductor's output and the widget's
agreement with the checker are checked on data that can go wrong.
"""

from __future__ import annotations

import pytest
import torch
from lesson_source import LessonSource

from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.exercises import check_elementwise
from tilebook.course.experiments import why_triton as experiment
from tilebook.course.widgets_grid import ThreadsVsTilesExplorer

SCRIPT = LessonSource(1)
LIFTED = [
    "swiglu_eager",
    "swiglu_kernel",
    "BLOCK",
    "WARPS",
    "swiglu",
    "swiglu_floor_grid",
    "swiglu_on",
]


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    head = "import torch\nimport triton\nimport triton.language as tl\n\n"
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson01"), head)


def test_the_fused_kernel_passes_the_exercise_checker(lesson):
    v = check_elementwise(lesson.swiglu, lesson.swiglu_eager, block=lesson.BLOCK)
    assert v.ok, str(v)
    v16 = check_elementwise(
        lesson.swiglu, lesson.swiglu_eager, block=lesson.BLOCK, dtype=torch.float16
    )
    assert v16.ok, str(v16)


def test_the_floor_grid_loses_exactly_the_tail_the_widget_shows(lesson):
    v = check_elementwise(lesson.swiglu_floor_grid, lesson.swiglu_eager, block=lesson.BLOCK)
    widget = ThreadsVsTilesExplorer(sizes=[1], blocks=[lesson.BLOCK])
    for case in v.cases:
        n = int(case.label.removeprefix("n="))
        tail = widget.row(n, lesson.BLOCK, "N // BLOCK")["tail"]
        unwritten = [f.count for f in case.findings if f.kind == "unwritten"]
        assert unwritten == ([tail] if tail else []), case.label
        assert {f.kind for f in case.findings} <= {"unwritten"}


def test_one_program_per_element_is_right_but_launches_n_programs(lesson, device):
    n = 300
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    out = torch.full_like(x, float("nan"))
    lesson.swiglu_on(x, y, out, n)
    torch.testing.assert_close(out.double(), lesson.swiglu_eager(x.double(), y.double()))


def test_traffic_counts_every_operator_of_the_chain(lesson):
    x, y = torch.randn(1000), torch.randn(1000)
    ops = experiment.traffic(lesson.swiglu_eager, x, y)
    assert [r["op"] for r in ops] == ["sigmoid", "mul.Tensor", "mul.Tensor"]
    assert [(r["reads"], r["writes"]) for r in ops] == [(4000, 4000), (8000, 4000), (8000, 4000)]
    assert experiment.least_traffic(x, y, x) == 12_000
    # an operator that reads one tensor twice counts it once; a scalar not at all
    assert experiment.traffic(lambda a: a * a * 2.0, x) == [
        {"op": "mul.Tensor", "reads": 4000, "writes": 4000},
        {"op": "mul.Tensor", "reads": 4000, "writes": 4000},
    ]


INDUCTOR_OUTPUT = """
# kernel path: /tmp/x.py
triton_poi_fused_mul_sigmoid_0 = async_compile.triton('triton_poi_fused_mul_sigmoid_0', \'\'\'
import triton
import triton.language as tl

@triton_heuristics.pointwise(
    size_hints={'x': 1048576}, filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'in_ptr1': '*fp32', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}},
)
@triton.jit
def triton_poi_fused_mul_sigmoid_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + (xindex), xmask)
    tl.store(out_ptr0 + (xindex), tmp0, xmask)
\'\'\', device_str='cuda')

def call(args):
    triton_poi_fused_mul_sigmoid_0.run(arg0_1, arg1_1, buf0, s0, stream=stream0)
"""


def test_inductor_kernels_are_found_and_printed_within_the_page_width():
    (name, src), *rest = experiment.kernels_in(INDUCTOR_OUTPUT)
    assert not rest and name == "triton_poi_fused_mul_sigmoid_0"
    assert src.startswith("import triton") and src.rstrip().endswith("xmask)")
    text = experiment.kernel_text(src)
    assert text.startswith("@triton.jit") and "heuristics" not in text
    assert max(len(line) for line in text.splitlines()) <= 88
    assert "XBLOCK : tl.constexpr" in text.replace(" \\\n        ", " ")
    assert experiment.kernels_in("no kernels here") == []


def test_committed_records_have_the_experiment_s_shape():
    fusion = load_record("lesson01_fusion", RECORDS_DIR)
    grid = load_record("lesson01_grid", RECORDS_DIR)
    code = load_record("lesson01_inductor", RECORDS_DIR)
    # The page shows them without a fallback: a CPU build needs all three.
    assert None not in (fusion, grid, code)
    assert fusion.values("log2n") == list(experiment.EXPONENTS)
    assert fusion.values("impl") == ["eager", "Triton", "torch.compile"]
    for r in fusion.rows:
        assert r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r["traffic"] >= r["bytes"] == 12 * r["n"]
    assert grid.values("grid") == ["cdiv(n, BLOCK)", "n"]
    assert all(r["source"] and r["kernel"] for r in code.rows)


@pytest.mark.gpu
def test_experiments_run_on_a_gpu(lesson):
    rows = experiment.fusion(
        lesson.swiglu_eager, lesson.swiglu, exponents=(12,), rounds=1, warmup=1, rep=5
    )
    assert [r["impl"] for r in rows] == ["eager", "Triton", "torch.compile"]
    assert rows[0]["traffic"] == 32 * 2**12 and rows[1]["traffic"] == 12 * 2**12
    rows = experiment.grid_waste(
        lesson.swiglu_on, lesson.BLOCK, n=2**14, eager=lesson.swiglu_eager, rounds=1, rep=5
    )
    assert [(r["grid"], r["programs"]) for r in rows] == [("cdiv(n, BLOCK)", 16), ("n", 2**14)]
    code = experiment.inductor_code(lesson.swiglu_eager, n=2**12)
    assert len(code) == 1 and code[0]["source"].count("tl.store(") == 1


# ------------------------------------------------- what the page says of its records
# The page's tables, claims and sentences are made by the experiment module from the
# records it shows; a CPU build shows the committed GPU records, so these run on them.


def _records():
    names = ("lesson01_fusion", "lesson01_inductor", "lesson01_grid")
    return [load_record(name, RECORDS_DIR) for name in names]


def test_the_page_s_claims_hold_on_its_records_and_bite(lesson):
    import copy

    from tilebook.course.claims import ClaimError, Claims

    fusion, inductor, waste = _records()
    near = SCRIPT.constant("NEAR")
    assert len(Claims("01", fusion).check_all(experiment.fusion_claims(fusion, near)).items) == 4
    assert Claims("01", inductor).check_all(experiment.inductor_claims(inductor)).ok
    assert Claims("01", waste).check_all(experiment.waste_claims(waste)).ok
    # no tolerance: the speed-up is not exactly the ratio of bytes
    with pytest.raises(ClaimError, match="ratio of bytes moved"):
        Claims("01", fusion).check_all(experiment.fusion_claims(fusion, 0.0))
    # a second kernel from Inductor, or one more store in its kernel
    two = copy.deepcopy(inductor)
    two.rows.append(dict(two.rows[0], kernel="triton_poi_second_1"))
    with pytest.raises(ClaimError, match="single Triton kernel"):
        Claims("01", two).check_all(experiment.inductor_claims(two))
    more = copy.deepcopy(inductor)
    more.rows[0]["source"] += "\n    tl.store(out_ptr1 + (xindex), tmp0, xmask)"
    with pytest.raises(ClaimError, match="stores once"):
        Claims("01", more).check_all(experiment.inductor_claims(more))
    # the two grids' timings swapped: one program per element would be the faster
    swapped = copy.deepcopy(waste)
    a, b = swapped.rows
    a["grid"], b["grid"] = b["grid"], a["grid"]
    with pytest.raises(ClaimError, match="slower than the grid"):
        Claims("01", swapped).check_all(experiment.waste_claims(swapped))


def test_the_page_s_tables_and_sentences_follow_the_data(lesson):
    fusion, _, _ = _records()
    x, y = torch.randn(4096), torch.randn(4096)
    ops = experiment.traffic(lesson.swiglu_eager, x, y)
    said = " ".join(str(experiment.say_traffic(ops, 3 * 4 * 4096, 4096)).split())
    # sigmoid reads x and writes; each mul reads two and writes one: 8 + 12 + 12 per element
    assert "One line, 3 kernels" in said and "131,072 bytes, 32 per element" in said
    assert "12 bytes per element" in said and "2.67 times that" in said
    assert experiment.traffic_table(ops, x).column("bytes read") == ["16,384", "32,768", "32,768"]
    table = experiment.fusion_table(fusion)
    assert table.column("n") == [f"2^{e}" for e in experiment.EXPONENTS]
    big = {r["impl"]: r for r in fusion.rows if r["log2n"] == max(experiment.EXPONENTS)}
    assert table.column("Triton µs")[-1] == f"{1e3 * big['Triton']['median_ms']:.1f}"
    said = str(experiment.say_versus_compile(fusion))
    assert f"At 2^{max(experiment.EXPONENTS)} elements our kernel" in said

    class Sass:  # what say_loads reads of a compiled kernel
        registers = 21

    said = " ".join(str(experiment.say_loads(Sass(), 8, 1024, 4)).split())
    assert "over the program's 128 threads, 8 elements per thread" in said
    assert "8 of them in the SASS" in said and "in 21 registers" in said


def test_the_explorer_starts_at_the_lesson_s_setting_and_agrees_with_the_checker(lesson):
    _, _, waste = _records()
    settings = experiment.explorer(waste, lesson.BLOCK, lesson.WARPS)
    widget = ThreadsVsTilesExplorer(**settings)
    start = {"n": experiment.EXPLORER_N, "block": lesson.BLOCK, "grid": "cdiv(N, BLOCK)"}
    assert widget.initial == start
    assert waste.provenance["gpu"] in widget.notes["N"]
    broken = check_elementwise(lesson.swiglu_floor_grid, lesson.swiglu_eager, block=lesson.BLOCK)
    experiment.check_explorer(broken, lesson.BLOCK)
    # The checker's verdict on a grid that misses nothing disagrees with the floor rule.
    right = check_elementwise(lesson.swiglu, lesson.swiglu_eager, block=lesson.BLOCK)
    with pytest.raises(AssertionError, match="disagree"):
        experiment.check_explorer(right, lesson.BLOCK)
