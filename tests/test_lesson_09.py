"""Lesson 09 (tiled matmul): its kernels stay the package's, its model computes what
the lesson says it does, and its records cover what the lesson plots.

The lesson writes ``_tile_coords``, ``matmul_kernel`` and ``matmul_tma_kernel`` out
in full and adds launchers, an L2-reuse model and a few helpers of its own.  Running
the whole lesson takes a while, so these tests lift those definitions out of the
script (by their source) into a small module and check them against
:mod:`tilebook.ops.matmul` and against the numbers the lesson's prose quotes.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import math
import re
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import tilebook
from tilebook.aot import compile_kernel
from tilebook.bench import RECORDS_DIR
from tilebook.ops import matmul as mm

LESSON = Path(__file__).parents[1] / "gallery" / "03_real_kernels" / "09_matmul.py"
SOURCE = LESSON.read_text()
TREE = ast.parse(SOURCE)

#: The kernels the lesson shows in full; they must be the package's, line for line.
SHOWN_KERNELS = ["_tile_coords", "matmul_kernel", "matmul_tma_kernel"]

#: The lesson's definitions that the tests lift out, in the order they appear.
LIFTED = [
    "SMEM_BUDGET",
    "flops_per_byte",
    "_tile_coords",
    "tile_coords",
    "tile_map_kernel",
    "cdiv",
    "l2_model",
    "matmul_kernel",
    "matmul_ptr",
    "pipeline_bytes",
    "matmul_tma_kernel",
    "matmul_tma",
    "rel_err",
    "round_to_tf32",
    "SWEEP_SIZE",
    "SWEEP_TILES",
    "ORDERS",
    "sweep_model",
]


def _node(name: str) -> ast.stmt:
    """The top-level function or assignment of the lesson that defines ``name``."""

    def defines(node: ast.stmt) -> bool:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            return node.name == name
        if isinstance(node, ast.Assign):
            return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        return False

    found = [node for node in TREE.body if defines(node)]
    assert len(found) == 1, f"{name}: {len(found)} definitions in the lesson"
    return found[0]


def _with_decorators(node: ast.stmt) -> str:
    lines = SOURCE.splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1 : node.end_lineno])


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as an importable module (Triton needs their source)."""
    header = textwrap.dedent(
        """\
        import torch
        import triton
        import triton.language as tl
        from triton.tools.tensor_descriptor import TensorDescriptor

        from tilebook.ops import matmul as mm
        from tilebook.ops.matmul import _epilogue

        N_SM = 4
        """
    )
    body = "\n\n\n".join(_with_decorators(_node(name)) for name in LIFTED)
    path = tmp_path_factory.mktemp("lesson09") / "lesson09_lifted.py"
    path.write_text(header + "\n\n" + body + "\n")
    spec = importlib.util.spec_from_file_location("lesson09_lifted", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the interpreter looks kernels' globals up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


# --------------------------------------------------------------------- the kernels


def _python_function(obj):
    while not inspect.isfunction(obj):  # JITFunction, Autotuner, Heuristics: .fn
        obj = obj.fn
    return obj


@pytest.mark.parametrize("name", SHOWN_KERNELS)
def test_lesson_shows_the_package_kernel(name):
    """Each kernel appears in full in the lesson; it must stay the package's."""
    lesson_src = ast.get_source_segment(SOURCE, _node(name))
    package_src = textwrap.dedent(inspect.getsource(_python_function(getattr(mm, name))))
    package_src = package_src[package_src.index(f"def {name}") :]
    assert lesson_src.strip() == package_src.strip()


def test_lesson_kernels_are_jitted(lesson):
    for name in [*SHOWN_KERNELS, "tile_map_kernel"]:
        assert hasattr(getattr(lesson, name), "run"), f"{name} is not a @triton.jit kernel"


# --------------------------------------------------------------- the program order


GRIDS = [(1, 1), (1, 7), (7, 1), (8, 12), (5, 3), (13, 17), (64, 32)]


@pytest.mark.parametrize("group_m", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize(("num_m", "num_n"), GRIDS)
def test_tile_order_is_a_permutation(lesson, num_m, num_n, group_m):
    """Every tile exactly once, including a short last group."""
    coords = [lesson.tile_coords(t, num_m, num_n, group_m) for t in range(num_m * num_n)]
    assert sorted(coords) == [(m, n) for m in range(num_m) for n in range(num_n)]
    if group_m == 1:  # row-major
        assert coords == [(t // num_n, t % num_n) for t in range(num_m * num_n)]


@pytest.mark.parametrize("group_m", [1, 3, 4, 8])
@pytest.mark.parametrize(("num_m", "num_n"), [(8, 12), (5, 3), (13, 17)])
def test_python_order_is_the_kernels_order(lesson, device, num_m, num_n, group_m):
    """The plain-Python model of the order is what ``_tile_coords`` computes."""
    tiles = num_m * num_n
    out = torch.empty(tiles, 2, dtype=torch.int32, device=device)
    lesson.tile_map_kernel[(tiles,)](out, num_m, num_n, GROUP_M=group_m)
    model = [list(lesson.tile_coords(t, num_m, num_n, group_m)) for t in range(tiles)]
    assert out.tolist() == model


# ------------------------------------------------------------------ the L2 model


def _package_order():
    """The package's ``_tile_coords`` itself, called as plain Python on ints: its
    only Triton call, ``tl.minimum``, is swapped for ``min``."""
    fn = _python_function(mm._tile_coords)
    stub = type("tl", (), {"minimum": staticmethod(min)})
    return types.FunctionType(fn.__code__, {**fn.__globals__, "tl": stub})


PACKAGE_COORDS = _package_order()


def _brute_force(M, N, K, bm, bn, group_m, wave, elem=2):
    """The model's numbers, from the package's own order, counted another way."""
    num_m, num_n = math.ceil(M / bm), math.ceil(N / bn)
    order = [PACKAGE_COORDS(t, num_m, num_n, group_m) for t in range(num_m * num_n)]
    waves = [order[i : i + wave] for i in range(0, len(order), wave)]
    hbm = sum((len({m for m, _ in w}) * bm + len({n for _, n in w}) * bn) * K * elem for w in waves)
    return len({m for m, _ in waves[0]}), len({n for _, n in waves[0]}), hbm


@pytest.mark.parametrize(
    ("shape", "tile", "group_m", "wave"),
    [
        ((8 * 64, 12 * 64, 4096), (64, 64), 1, 20),
        ((8 * 64, 12 * 64, 4096), (64, 64), 4, 20),
        ((1000, 700, 300), (64, 128), 3, 7),
        ((8192, 8192, 512), (128, 256), 8, 132),
        ((8192, 8192, 512), (64, 64), 1, 396),
    ],
)
def test_l2_model_counts_what_it_claims(lesson, shape, tile, group_m, wave):
    M, N, K = shape
    bm, bn = tile
    r = lesson.l2_model(M, N, K, bm, bn, group_m, wave)
    a_tiles, b_tiles, hbm = _brute_force(M, N, K, bm, bn, group_m, wave)
    assert (r["a_tiles"], r["b_tiles"], r["hbm"]) == (a_tiles, b_tiles, hbm)
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    assert r["tiles"] == tiles
    assert r["requested"] == tiles * (bm + bn) * K * 2  # every program loads its own
    assert r["reuse"] == pytest.approx(r["requested"] / r["hbm"])
    assert r["hbm"] <= r["requested"]


def test_requested_bytes_follow_the_formula(lesson):
    """MNK e (1/BLOCK_M + 1/BLOCK_N) when the tiles divide the matrix."""
    for bm, bn in [(64, 64), (128, 128), (128, 256), (256, 128)]:
        r = lesson.l2_model(8192, 8192, 8192, bm, bn, 8, 132)
        assert r["requested"] == pytest.approx(8192**3 * 2 * (1 / bm + 1 / bn))


def test_the_numbers_the_lesson_quotes(lesson):
    # The 8 x 12 figure: 2 + 12 panels row-major, 4 + 5 grouped by 4, wave of 20.
    demo = {g: lesson.l2_model(8 * 64, 12 * 64, 4096, 64, 64, g, 20) for g in (1, 4)}
    assert (demo[1]["a_tiles"], demo[1]["b_tiles"]) == (2, 12)
    assert (demo[4]["a_tiles"], demo[4]["b_tiles"]) == (4, 5)
    # 8192 cubed, 128 x 256 tiles, 132 programs: 5 + 32 row-major, 8 + 17 grouped.
    rm = lesson.sweep_model("128x256", 1)
    gr = lesson.sweep_model("128x256", 8)
    assert (rm["a_tiles"], rm["b_tiles"]) == (5, 32)
    assert (gr["a_tiles"], gr["b_tiles"]) == (8, 17)
    assert rm["hbm"] / 1e9 == pytest.approx(2.31, abs=0.005)
    assert gr["hbm"] / 1e9 == pytest.approx(1.49, abs=0.005)
    # "64 x 64 tiles load 34 GB in all, 128 x 256 tiles 13 GB"
    assert lesson.sweep_model("64x64", 8)["requested"] / 1e9 == pytest.approx(34.4, abs=0.05)
    assert rm["requested"] / 1e9 == pytest.approx(12.9, abs=0.05)
    # "grouping cuts it by a factor of 1.5 to 2.5, depending on the tile shape"
    for tile in lesson.SWEEP_TILES:
        ratio = lesson.sweep_model(tile, 1)["hbm"] / lesson.sweep_model(tile, 8)["hbm"]
        assert 1.5 <= ratio <= 2.5, (tile, ratio)
    # Exercise 1: GROUP_M=16 is the model's best for 128 x 256 tiles; 2 is no better
    # than row-major.
    hbm = {
        g: lesson.l2_model(8192, 8192, 8192, 128, 256, g, 132)["hbm"]
        for g in (1, 2, 4, 8, 16, 32, 64)
    }
    assert min(hbm, key=hbm.get) == 16
    assert hbm[16] / 1e9 == pytest.approx(1.22, abs=0.005)
    assert hbm[2] >= hbm[1]
    # The intensity table: 128 x 256 tiles do 85 FLOPs per loaded byte.
    assert lesson.flops_per_byte(128, 256) == pytest.approx(85.33, abs=0.01)


def test_exercise_4_tiles_per_persistent_program():
    """Exercise 4's answer, from the package's first TMA config and its persistent
    grid (one program per SM and CTAS_PER_SM, each striding over the tiles as the
    kernel's ``tl.range(start, tiles, step)`` does), on 132 SMs at 8192 cubed."""
    cfg = mm.GPU_TMA_CONFIGS[0].kwargs
    tiles = mm._cdiv(8192, cfg["BLOCK_M"]) * mm._cdiv(8192, cfg["BLOCK_N"])
    step = min(132 * cfg["CTAS_PER_SM"], tiles)
    counts: dict[int, int] = {}
    for start in range(step):
        n = len(range(start, tiles, step))
        counts[n] = counts.get(n, 0) + 1
    quoted = re.search(
        r"(\d+) x (\d+) = (\d+) tiles over (\d+) programs: (\d+) programs compute (\d+) tiles"
        r" and\s*#?\s*(\d+) compute (\d+)",
        SOURCE,
    )
    assert quoted, "exercise 4's answer is no longer in the lesson"
    g = [int(v) for v in quoted.groups()]
    assert (g[0] * g[1], g[2], g[3]) == (tiles, tiles, step)
    assert counts == {g[5]: g[4], g[7]: g[6]}


def test_smem_rule_is_the_packages(lesson):
    for cfg in mm.GPU_PTR_CONFIGS + mm.GPU_TMA_CONFIGS:
        for elem in (2, 4):
            assert (lesson.pipeline_bytes(cfg, elem) <= lesson.SMEM_BUDGET) == mm._fits(cfg, elem)


def test_tf32_rounding(lesson):
    x = torch.randn(4096)
    r = lesson.round_to_tf32(x)
    assert (r.view(torch.int32) & 0x1FFF == 0).all(), "more than 10 mantissa bits left"
    assert ((r - x).abs() <= x.abs() * 2.0**-11).all(), "not rounded to nearest"
    exact = torch.tensor([1.0, -2.5, 1 + 2.0**-10, 3.0 * 2.0**20])  # representable in TF32
    assert torch.equal(lesson.round_to_tf32(exact), exact)
    a, b = torch.randn(64, 256), torch.randn(256, 64)
    exact = a.double() @ b.double()
    err = lesson.rel_err(lesson.round_to_tf32(a).double() @ lesson.round_to_tf32(b).double(), exact)
    assert 5e-5 < err < 1e-3  # "about 1e-3 rather than 1e-7"


# ---------------------------------------------------------------- the launchers


def _assert_matches(out, a, b, tol):
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (37, 53, 29), (100, 72, 130)])
def test_pointer_launcher_matches_the_package(lesson, device, dtype, m, n, k):
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    cfg = next(c for c in mm.PTR_CONFIGS if mm._fits(c, a.element_size()))
    ours = lesson.matmul_ptr(a, b, cfg)
    _assert_matches(ours, a, b, 5e-3 if tilebook.is_gpu() else 3e-3)
    if cfg is mm.PTR_CONFIGS[0] or tilebook.is_interpreter():
        torch.testing.assert_close(ours, mm.fused_matmul(a, b, impl="pointer"))


@pytest.mark.skipif(not mm._tma_supported(tilebook.device()), reason="no TMA path here")
@pytest.mark.parametrize(("m", "n", "k"), [(17, 40, 24), (70, 72, 40)])
def test_tma_launcher_matches_the_package(lesson, device, m, n, k):
    a = torch.randn(m, k, device=device, dtype=torch.float16)
    b = torch.randn(k, n, device=device, dtype=torch.float16)
    ours = lesson.matmul_tma(a, b)
    _assert_matches(ours, a, b, 3e-3)
    if tilebook.is_interpreter():  # same config, same grid of 4: the same numbers
        torch.testing.assert_close(ours, mm.fused_matmul(a, b, impl="tma"))


# ------------------------------------------------------- the alignment evidence


def test_odd_rows_lose_the_vector_copies():
    """The lesson blames 2-byte loads for the slow ragged shape; the SASS agrees."""
    pointers = ["a_ptr", "b_ptr", "c_ptr", "bias_ptr"]
    ints = ["M", "N", "K", "stride_am", "stride_bk", "stride_cm"]
    sig = {n: "*bf16" for n in pointers} | {n: "i32" for n in ints}
    consts = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
              "HAS_BIAS": False, "ACTIVATION": "none", "INT64": False,
              "stride_ak": 1, "stride_bn": 1, "stride_cn": 1}  # fmt: skip

    def build(even_k, aligned):
        return compile_kernel(
            "tilebook.ops.matmul:matmul_kernel",
            sig,
            {**consts, "EVEN_K": even_k},
            num_warps=8,
            num_stages=4,
            divisible_by_16=aligned,
        )

    aligned = build(True, pointers + ints)
    odd = build(False, pointers)
    assert aligned.count(r"LDGSTS\S*\.128") > 0 and aligned.count(r"LDG\.E\.U16") == 0
    assert odd.count(r"LDG\.E\.U16") > 0 and odd.count(r"LDGSTS") == 0


# --------------------------------------------------------------------- records


def _record(name):
    path = RECORDS_DIR / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name} has not been recorded on a GPU yet")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", ["lesson09_sizes", "lesson09_order_sweep"])
def test_committed_records_are_gpu_measurements(name):
    rec = _record(name)
    assert rec["provenance"]["mode"] == "gpu"
    assert rec["provenance"].get("gpu")
    assert rec["provenance"].get("sm_count", 0) > 0
    assert all(r["tflops"] > 0 for r in rec["rows"])
    assert all(r["rel_err"] < 1e-2 for r in rec["rows"] if "rel_err" in r)


def test_sizes_record_covers_the_plot():
    rows = _record("lesson09_sizes")["rows"]
    squares = {r["size"] for r in rows if r["kind"] == "square"}
    assert {1024, 2048, 4096, 8192} <= squares
    assert any(r["kind"] == "ragged" for r in rows)
    for shape in {r["shape"] for r in rows}:
        assert {r["impl"] for r in rows if r["shape"] == shape} == {"tilebook", "cuBLAS"}


def test_order_sweep_covers_the_widget_and_shows_a_slow_setting(lesson):
    rows = _record("lesson09_order_sweep")["rows"]
    settings = {(r["tile"], r["kernel"], r["GROUP_M"]) for r in rows}
    expected = {(t, k, g) for t in lesson.SWEEP_TILES for k in ("pointer", "TMA") for g in (1, 8)}
    assert settings == expected
    best = max(r["tflops"] for r in rows)
    slow = [r for r in rows if r["tflops"] < 0.6 * best]  # the widget's slow_fraction
    assert slow, "no setting the widget would flag as slow"
    # The lesson says the 64 x 64 tiles are the slow corner, for every variant.
    for kernel in ("pointer", "TMA"):
        for g in (1, 8):
            by_tile = {r["tile"]: r["tflops"] for r in rows
                       if r["kernel"] == kernel and r["GROUP_M"] == g}  # fmt: skip
            assert min(by_tile, key=by_tile.get) == "64x64", (kernel, g)
