"""Lesson 05 (tl.dot and tensor cores): its kernels, its rule, its exercises, its measurement.

Running the whole lesson takes a while (it compiles for three GPUs), so these
tests lift its kernels and its rule out of the script (by their source) into a
small module: the kernels against float64 under the interpreter, the rule of
what ``tl.dot`` becomes against compiles the lesson does not make itself, the
exercises' checks on a right and a wrong answer, and the measurement it shares,
:func:`tilebook.course.experiments.dot.paths` (its kernel under the interpreter, the
whole measurement on a GPU).
"""

from __future__ import annotations

import ast
import re

import pytest
import torch
import triton
import triton.language as tl
from lesson_source import LessonSource

import tilebook
from tilebook.course.aot import compile_many
from tilebook.course.exercises import check
from tilebook.course.experiments import dot as experiment

SCRIPT = LessonSource(5)
LIFTED = [
    "tile_dot_kernel",
    "tile_dot",
    "CHOICES",
    "SHAPES",
    "TILES",
    "TILE",
    "TL",
    "job",
    "label",
    "dot_ops",
    "smallest_k",
    "lowering",
    "chain_kernel",
    "STYLE",
]


def _source(name: str) -> str:
    """Every top-level definition of ``name`` (one at least); ``TL`` with the
    ``TL.update(...)`` calls that extend it."""
    found = SCRIPT.nodes(name)
    assert found, f"lesson 05 defines no {name!r} at top level"
    out = [SCRIPT.segment(node) for node in found]
    if name == "TL":
        for node in SCRIPT.tree.body:
            text = ast.get_source_segment(SCRIPT.text, node)
            if isinstance(node, ast.Expr) and text.startswith("TL.update"):
                out.append(text)
    return "\n".join(out)


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    head = (
        "import re\nfrom collections import Counter\n"
        "import torch\nimport triton\nimport triton.language as tl\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.backends.nvidia.compiler import min_dot_size\n"
        "from tilebook.course.experiments import dot as experiment\n\n"
    )
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson05"), head, source=_source)


def _rel(x, exact):
    return ((x.double() - exact).norm() / exact.norm()).item()


@pytest.mark.parametrize(("m", "n", "k"), [(16, 16, 16), (32, 16, 64), (16, 64, 32)])
def test_tile_dot_matches_float64(lesson, device, m, n, k):
    a = torch.randn(m, k, device=device, dtype=torch.float16)
    b = torch.randn(k, n, device=device, dtype=torch.float16)
    c = lesson.tile_dot(a, b)
    assert c.dtype == torch.float32 and c.shape == (m, n)
    assert _rel(c, a.double() @ b.double()) < 1e-5


def test_tile_dot_kernel_options(lesson, device):
    a = torch.randn(32, 64, device=device, dtype=torch.float16)
    b = torch.randn(64, 16, device=device, dtype=torch.float16)
    c = torch.empty(32, 16, device=device, dtype=torch.float16)
    lesson.tile_dot_kernel[(1,)](a, b, c, M=32, N=16, K=64, OUT_DTYPE=tl.float16)
    assert _rel(c, a.double() @ b.double()) < 2e-3


def _chain(lesson, device, acc, k, mn=16):
    g = torch.Generator().manual_seed(k)
    a = torch.randn(mn, k, generator=g).to(device, torch.float16)
    b = torch.randn(k, mn, generator=g).to(device, torch.float16)
    c = torch.empty(mn, mn, device=device, dtype=torch.float16)
    lesson.chain_kernel[(1,)](a, b, c, k, M=mn, STEP=16, ACC=acc)
    exact = a.double() @ b.double()
    return _rel(c, exact) / _rel(exact.half(), exact)


def test_chain_kernel_float32_accumulator_costs_only_the_rounding(lesson, device):
    for k in (16, 256, 1024):
        assert _chain(lesson, device, tl.float32, k) < 1.5


def test_chain_kernel_fp16_accumulator_loses_accuracy_with_k(lesson, device):
    short, long = (_chain(lesson, device, tl.float16, k) for k in (16, 1024))
    assert short < 1.5 and long > 2


@pytest.mark.gpu
def test_chain_kernel_bf16_accumulator_on_a_gpu(lesson):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 4096, generator=g).to("cuda", torch.bfloat16)
    b = torch.randn(4096, 64, generator=g).to("cuda", torch.bfloat16)
    exact = a.double() @ b.double()
    ratio = {}
    for acc in (tl.float32, tl.bfloat16):
        c = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
        lesson.chain_kernel[(1,)](a, b, c, 4096, M=64, STEP=16, ACC=acc)
        ratio[acc] = _rel(c, exact) / _rel(exact.bfloat16(), exact)
    assert ratio[tl.float32] < 1.5 and ratio[tl.bfloat16] > 2


def test_the_accumulator_plot_tells_fp16_from_bf16(lesson):
    """Two settings whose errors coincide (fp16 -> fp32 and bf16 -> fp32 on a GPU)
    must both stay visible: a line drawn over another differs in dash and marker."""
    fp16, bf16 = lesson.STYLE["fp16"], lesson.STYLE["bf16"]
    assert fp16["linestyle"] != bf16["linestyle"] and fp16["marker"] != bf16["marker"]
    assert bf16.get("markerfacecolor") == "none"  # an open marker shows the one below


def test_a_figure_the_lesson_draws_carries_its_provenance():
    import matplotlib.pyplot as plt

    from tilebook.course.plots import caption_figure, run_caption

    caption = run_caption()
    if tilebook.is_gpu():
        assert caption.startswith("measured live on ")
    else:
        assert caption.startswith("computed under Triton's interpreter on a CPU")
    assert f"triton {triton.__version__}" in caption
    fig, _ = plt.subplots()
    assert caption_figure(fig, caption) is fig
    assert caption.split(",")[0] in "".join(t.get_text() for t in fig.texts)
    with pytest.raises(ValueError, match="where the data came from"):
        caption_figure(fig, " ")
    plt.close(fig)


def test_the_timed_tile_is_the_experiments(lesson):
    assert lesson.TILES[lesson.TILE] == (*experiment.TILE, experiment.WARPS)
    assert set(lesson.CHOICES) >= {f"{p} -> fp32" for p in experiment.PATHS}


def test_smallest_k_is_tritons(lesson):
    assert lesson.smallest_k("fp16") == lesson.smallest_k("bf16") == 16
    assert lesson.smallest_k("fp8e4nv") == lesson.smallest_k("fp8e5") == 32
    assert lesson.smallest_k("fp32") in (8, 16)  # 16 in Triton 3.6, 8 from 3.8


def test_the_rule_on_compiles_the_lesson_does_not_make(lesson):
    """Settings the widget shows from the rule alone, compiled here."""
    tiles = list(lesson.TILES)
    settings = [
        (90, "fp16 -> fp32", tiles[1]),  # two warpgroups: wgmma
        (80, "fp32 tf32 -> fp32", lesson.TILE),  # Ampere's tf32 mma
        (90, "fp8 e5m2 -> fp32", tiles[2]),  # two warps: mma, fp8 converted first
        (75, "fp16 -> fp16", lesson.TILE),  # a T4: HFMA2
    ]
    compiled = compile_many(
        {lesson.label(s): lesson.job(*s) for s in settings}, kernel=lesson.tile_dot_kernel
    )
    expected = ["HGMMA", "HMMA", "HMMA", "FMA"]
    for s, want in zip(settings, expected, strict=True):
        assert lesson.lowering(*s) == want
        op = lesson.dot_ops(compiled[lesson.label(s)])[0][0].split(".")[0]
        assert {"FFMA": "FMA", "HFMA2": "FMA"}.get(op, op) == want, (s, op)


def test_the_rule_refuses_what_the_compiler_refuses(lesson):
    tiles = list(lesson.TILES)
    assert lesson.lowering(90, "fp16 -> fp32", tiles[-1]).startswith("refused: K = 8")
    assert lesson.lowering(80, "fp8 e4m3 -> fp32", lesson.TILE).startswith("refused")
    assert lesson.lowering(90, "fp8 e4m3 -> fp32", lesson.TILE) == "QGMMA"
    assert lesson.lowering(75, "fp8 e5m2 -> fp32", tiles[-1]).startswith("refused: K = 8")


# -- the exercises' checks ------------------------------------------------------------


@triton.jit
def _abt_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rn[None, :] * K + rk[:, None])  # exercise 1's solution
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


@triton.jit
def _plus_kernel(a_ptr, b_ptr, c0_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    c0 = tl.load(c0_ptr + rm[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b, c0))  # exercise 2


def test_exercise_1_check_passes_the_solution_and_catches_a_b(lesson, device):
    a = torch.randn(32, 64, dtype=torch.float16, device=device)
    b = torch.randn(16, 64, dtype=torch.float16, device=device)

    def abt(a, b, out):
        (m, k), n = a.shape, b.shape[0]
        _abt_kernel[(1,)](a, b, out, M=m, N=n, K=k)

    def unchanged(a, b, out):  # the lesson's kernel, b read as if it were (K, N)
        (m, k), n = a.shape, b.shape[0]
        lesson.tile_dot_kernel[(1,)](a, b, out, M=m, N=n, K=k)

    kw = {"block": (32, 16), "out_dtype": torch.float32}
    assert check(abt, lambda a, b: a @ b.T, [(a, b)], **kw).ok
    wrong = check(unchanged, lambda a, b: a @ b.T, [(a, b)], **kw)
    assert not wrong.ok and "wrong" in wrong.kinds(), str(wrong)


def test_exercise_2_check_passes_the_solution(device):
    a = torch.randn(32, 64, dtype=torch.float16, device=device)
    b = torch.randn(64, 16, dtype=torch.float16, device=device)
    c0 = torch.randn(32, 16, device=device)

    def plus(a, b, c0, out):
        _plus_kernel[(1,)](a, b, c0, out, M=32, N=16, K=64)

    verdict = check(
        plus, lambda a, b, c0: a @ b + c0, [(a, b, c0)], block=(32, 16), out_dtype=torch.float32
    )
    assert verdict.ok, str(verdict)


# -- the measurement ----------------------------------------------------------------------


def test_repeat_dot_kernel_chains_the_product(device):
    a = torch.randn(64, 32, device=device)
    b = torch.randn(32, 64, device=device)
    c = torch.full((2, 64, 64), float("nan"), device=device)
    experiment.repeat_dot_kernel[(2,)](a, b, c, 3, M=64, N=64, K=32, PRECISION="ieee")
    want = 3 * (a.double() @ b.double())
    for p in range(2):
        assert _rel(c[p], want) < 1e-5


def test_paths_are_named_and_checked():
    assert next(iter(experiment.PATHS)) == "fp32 ieee"  # the baseline first
    assert experiment.available_paths((8, 0)) == [
        p for p in experiment.PATHS if not p.startswith("fp8")
    ]
    assert experiment.available_paths((9, 0)) == list(experiment.PATHS)
    with pytest.raises(ValueError, match="unknown paths"):
        experiment.paths(["fp64"])
    with pytest.raises(ValueError, match="positive"):
        experiment.paths(["bf16"], repeat=0)


@pytest.mark.gpu
def test_paths_on_a_gpu():
    names = ["fp32 ieee", "fp32 tf32", "bf16"]
    rows = experiment.paths(names, repeat=8, waves=1, rounds=1, warmup=1, rep=5)
    by = {r["path"]: r for r in rows}
    assert list(by) == names
    for r in rows:
        assert r["tflops"] > 0 and r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert {"err", "err_dot", "programs", "M", "N", "K"} <= set(r)
    assert by["fp32 ieee"]["err"] < by["fp32 tf32"]["err"] < 5e-3
    assert by["bf16"]["err"] > 10 * by["bf16"]["err_dot"]
    assert tilebook.is_gpu()


def test_the_lesson_times_its_own_copy_of_the_experiment_s_kernel():
    """The lesson shows and times ``repeat_dot_kernel``; the experiment's is the same."""
    import inspect
    import textwrap

    def body(src: str) -> list[str]:
        src = textwrap.dedent(src)
        (node,) = ast.parse(src[src.index("def ") :]).body
        return [ast.dump(node.args), *(ast.unparse(s) for s in node.body)]

    package = inspect.getsource(experiment.repeat_dot_kernel.fn)
    assert body(SCRIPT.source("repeat_dot_kernel")) == body(package)
    (call,) = [n for n in SCRIPT.nodes("measure_paths")]
    assert "kernel=repeat_dot_kernel" in ast.unparse(call) and "timer=timed" in ast.unparse(call)
    assert "do_bench" in SCRIPT.source("timed")


def test_the_page_s_claims_and_sentences_hold_on_the_committed_record_and_bite():
    """What the page says of the timed paths, made from the committed H200 record (the
    GPU build's branch) and from the accumulator's rows; each claim fails on data that
    contradicts it."""
    from tilebook.course.bench import RECORDS_DIR, load_record
    from tilebook.course.claims import ClaimError, Claims

    paths = load_record("lesson05_paths", RECORDS_DIR)
    assert Claims("05", paths).check_all(experiment.paths_claims(paths)).ok
    text = " ".join(str(experiment.say_tf32x3(paths)).split())
    assert re.search(r"is (faster than|slower than|tied with) the FMA loop \(\d+\.\d times", text)
    assert "appear once a GPU" in str(experiment.say_tf32x3(None))
    cells = experiment.paths_table(paths, _ops_of_paths(paths), 90, "64x64x32, 4 warps")
    assert cells.column("path") == [r["path"] for r in paths.rows]
    x3 = next(r for r in paths.rows if r["path"] == "fp32 tf32x3")
    x3["err"] = 1.0  # tf32x3 no more accurate than tf32: the claim must fail
    with pytest.raises(ClaimError, match="ten times as accurate"):
        Claims("05", paths).check_all(experiment.paths_claims(paths))

    pairs = [("fp16", "fp32"), ("fp16", "fp16")]
    rows = [{"pair": "fp16 -> fp32", "K": k, "ratio": 1.0} for k in (16, 4096)]
    rows += [{"pair": "fp16 -> fp16", "K": k, "ratio": r} for k, r in ((16, 1.0), (4096, 9.0))]
    assert Claims("05", "t").check_all(experiment.grows_claims(rows, pairs, [16, 4096], 2.0)).ok
    assert experiment.say_overlap(rows, [16, 4096]) is None  # the lines lie apart
    rows[-1]["ratio"] = 1.05  # no longer wrong at the longest K, and on fp32's line
    with pytest.raises(ClaimError, match="wrong at the longest"):
        Claims("05", "t").check_all(experiment.grows_claims(rows, pairs, [16, 4096], 2.0))
    said = " ".join(str(experiment.say_overlap(rows, [16, 4096])).split())
    assert "lines of fp16 -> fp32 and fp16 -> fp16 lie on each other" in said
    assert "differ by at most 5%" in said


def _ops_of_paths(paths):
    return {(90, f"{r['path']} -> fp32", "64x64x32, 4 warps"): [("HGMMA.x", 1)] for r in paths.rows}
