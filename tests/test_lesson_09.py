"""Lesson 09 (tiled matmul): the kernels it calls the package's are the package's, its
model counts what it says, its kernels compute the product, and its records cover
what it shows.

The lesson's definitions are lifted out of the script (by their source) into a small
module, as for lesson 08: running the whole lesson takes a while.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import re
import sys
import textwrap
import types

import pytest
import torch
from exercise_blocks import exercise_text, run_blocks
from lesson_source import LessonSource

import tilebook
from tilebook.course.bench import RECORDS_DIR
from tilebook.course.experiments import matmul as experiment
from tilebook.ops import matmul as mm

SCRIPT = LessonSource(9)

#: The kernels the lesson shows in full as the package's.
SHOWN = ["tile_coords", "matmul_tma_kernel"]
LIFTED = [
    "flops_per_byte",
    "tile_coords",
    "tiled_matmul_kernel",
    "cdiv",
    "matmul",
    "grouped_order",
    "l2_model",
    "SIZE",
    "SWEEP",
    "ORDERS",
    "model",
    "matmul_tma_kernel",
    "matmul_tma",
]


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    header = textwrap.dedent(
        """\
        import torch
        import triton
        import triton.language as tl
        from triton.tools.tensor_descriptor import TensorDescriptor

        from tilebook.course.datasheet import build_fact, fact
        from tilebook.ops import matmul as mm
        from tilebook.ops.epilogue import epilogue

        N_SM = 4
        """
    )
    folder = tmp_path_factory.mktemp("lesson09")
    # registered: the interpreter looks kernels' globals up in sys.modules
    module = SCRIPT.lift(LIFTED, folder, header + "\n\n", register=True)
    yield module
    del sys.modules[module.__name__]


def _python_function(obj):
    while not inspect.isfunction(obj):  # JITFunction, Autotuner, Heuristics: .fn
        obj = obj.fn
    return obj


@pytest.mark.parametrize("name", SHOWN)
def test_lesson_shows_the_package_kernel(name):
    """Compared as syntax trees: the lesson wraps lines and comments for the page."""
    src = textwrap.dedent(inspect.getsource(_python_function(getattr(mm, name))))
    package = ast.parse(src).body[0]
    shown = SCRIPT.node(name)
    assert ast.dump(shown) == ast.dump(package), (
        f"{name} differs from tilebook.ops.matmul.{name}:\n"
        f"--- lesson\n{ast.unparse(shown)}\n--- package\n{ast.unparse(package)}"
    )


def test_teaching_kernel_is_the_package_pointer_kernel_without_its_extras(lesson):
    """The package's pointer kernel adds the epilogue, EVEN_K, INT64 and F32_DOT to the lesson's."""
    shown = set(inspect.signature(_python_function(lesson.tiled_matmul_kernel)).parameters)
    package = set(inspect.signature(_python_function(mm.matmul_kernel)).parameters)
    assert package - shown == {"bias_ptr", "HAS_BIAS", "ACTIVATION", "EVEN_K", "INT64", "F32_DOT"}
    assert shown <= package


# --------------------------------------------------------------- the program order


def _package_order():
    """The package's ``tile_coords`` as plain Python on ints (``tl.minimum`` -> ``min``)."""
    fn = _python_function(mm.tile_coords)
    stub = type("tl", (), {"minimum": staticmethod(min)})
    return types.FunctionType(fn.__code__, {**fn.__globals__, "tl": stub})


PACKAGE_ORDER = _package_order()


@pytest.mark.parametrize("group_m", [1, 2, 3, 8])
@pytest.mark.parametrize(("num_m", "num_n"), [(1, 7), (7, 1), (8, 12), (13, 17)])
def test_python_order_is_the_packages_and_a_permutation(lesson, num_m, num_n, group_m):
    tiles = range(num_m * num_n)
    coords = [lesson.grouped_order(t, num_m, num_n, group_m) for t in tiles]
    assert coords == [PACKAGE_ORDER(t, num_m, num_n, group_m) for t in tiles]
    assert sorted(coords) == [(m, n) for m in range(num_m) for n in range(num_n)]
    if group_m == 1:
        assert coords == [(t // num_n, t % num_n) for t in tiles]


def test_kernel_order_is_the_python_order(device):
    """``tile_coords`` inside a kernel gives what the lesson's Python model assumes."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(out_ptr, num_m, num_n, GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        pid_m, pid_n = mm.tile_coords(pid, num_m, num_n, GROUP_M)
        tl.store(out_ptr + 2 * pid, pid_m)
        tl.store(out_ptr + 2 * pid + 1, pid_n)

    out = torch.empty(5 * 7, 2, dtype=torch.int32, device=device)
    probe[(35,)](out, 5, 7, GROUP_M=3)
    assert out.tolist() == [list(PACKAGE_ORDER(t, 5, 7, 3)) for t in range(35)]


def _brute_force_hbm(M, N, K, bm, bn, group_m, wave, elem=2):
    num_m, num_n = math.ceil(M / bm), math.ceil(N / bn)
    order = [PACKAGE_ORDER(t, num_m, num_n, group_m) for t in range(num_m * num_n)]
    waves = [order[i : i + wave] for i in range(0, len(order), wave)]
    return sum(
        (len({m for m, _ in w}) * bm + len({n for _, n in w}) * bn) * K * elem for w in waves
    )


@pytest.mark.parametrize(
    ("shape", "tile", "group_m", "wave"),
    [
        ((8 * 64, 12 * 64, 4096), (64, 64), 4, 20),
        ((1000, 700, 300), (64, 128), 3, 7),
        ((8192, 8192, 512), (128, 256), 8, 132),
    ],
)
def test_l2_model_counts_what_it_says(lesson, shape, tile, group_m, wave):
    M, N, K = shape
    r = lesson.l2_model(M, N, K, *tile, group_m, wave)
    assert r["hbm"] == _brute_force_hbm(M, N, K, *tile, group_m, wave)
    tiles = math.ceil(M / tile[0]) * math.ceil(N / tile[1])
    assert r["requested"] == tiles * (tile[0] + tile[1]) * K * 2
    assert r["hbm"] <= r["requested"] and r["reuse"] == pytest.approx(r["requested"] / r["hbm"])


def test_what_the_prose_says_of_the_model(lesson):
    """'The small tile requests the most bytes by far, and the model says grouping cuts
    what HBM must deliver for every tile', for the sweep's settings on an H100."""
    sms = 132
    req = {t: lesson.model(t, 1, sms)["requested"] for t in lesson.SWEEP}
    assert max(req, key=req.get) == "64x64"
    for tile in lesson.SWEEP:
        grouped = lesson.model(tile, lesson.ORDERS["grouped"], sms)["hbm"]
        assert grouped < lesson.model(tile, 1, sms)["hbm"], tile
    # and that a large tile loads more than HBM alone could feed the tensor cores
    from tilebook.course.datasheet import fact

    balance = fact("h100.bf16_dense").si / fact("h100.memory_bandwidth").si
    assert lesson.flops_per_byte(128, 256) < balance
    # operations per byte: 2 * bm * bn * bk operations on (bm + bn) * bk elements
    for bm, bn in [(64, 64), (128, 256)]:
        ops, loaded = 2 * bm * bn * 64, (bm + bn) * 64 * 2
        assert lesson.flops_per_byte(bm, bn) == pytest.approx(ops / loaded)


# ---------------------------------------------------------------- the kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (37, 53, 29), (70, 72, 130)])
def test_lesson_kernel_computes_the_product(lesson, device, dtype, m, n, k):
    a, b = experiment.operands(m, n, k, dtype, device)
    ref = a.double() @ b.double()
    tol = 5e-3 if tilebook.is_gpu() else 3e-3
    assert ((lesson.matmul(a, b).double() - ref).norm() / ref.norm()).item() < tol
    bt = torch.randn(n, k, device=device, dtype=dtype).t()
    ref = a.double() @ bt.double()
    assert ((lesson.matmul(a, bt).double() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.skipif(not mm._tma_supported(tilebook.device()), reason="no TMA path here")
def test_hopper_launcher_computes_the_product(lesson, device):
    dtype = torch.bfloat16 if tilebook.is_gpu() else torch.float16
    a, b = experiment.operands(70, 72, 40, dtype, device)
    ref = a.double() @ b.double()
    out = lesson.matmul_tma(a, b)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


# ------------------------------------------------------- the package's public API


def test_prune_configs_keeps_what_fits_and_one_for_small_problems():
    big16 = mm.prune_configs(mm.GPU_PTR_CONFIGS, 8192, 8192, 8192, 2)
    big32 = mm.prune_configs(mm.GPU_PTR_CONFIGS, 8192, 8192, 8192, 4)
    assert big16 == [c for c in mm.GPU_PTR_CONFIGS if mm._fits(c, 2)]
    assert 0 < len(big32) < len(big16) and all(mm._fits(c, 4) for c in big32)
    assert len(mm.prune_configs(mm.GPU_PTR_CONFIGS, 512, 512, 512, 2)) == 1


def test_set_autotune_takes_the_first_config():
    previous = mm.set_autotune(False)
    try:
        assert mm.prune_configs(mm.GPU_PTR_CONFIGS, 8192, 8192, 8192, 2) == [mm.GPU_PTR_CONFIGS[0]]
        with pytest.raises(TypeError):
            mm.set_autotune("no")
    finally:
        mm.set_autotune(previous)
    assert len(mm.prune_configs(mm.GPU_PTR_CONFIGS, 8192, 8192, 8192, 2)) > 1


def test_picked_configs_reports_a_call(device):
    a, b = experiment.operands(40, 56, 24, torch.float32, device)
    mm.matmul(a, b)
    picks = [p for p in mm.picked_configs() if (p["M"], p["N"], p["K"]) == (40, 56, 24)]
    assert picks and picks[-1]["dtype"] == "float32" and picks[-1]["activation"] == "none"
    kw = picks[-1]["kwargs"]
    assert picks[-1]["config"].startswith(f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']}")


# --------------------------------------------------------------------- records


def _record(name):
    path = RECORDS_DIR / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name} has not been recorded on a GPU yet")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", ["lesson09_order", "lesson09_sizes", "lesson09_linear_act"])
def test_records_are_gpu_measurements(name):
    rec = _record(name)
    assert rec["provenance"]["mode"] == "gpu" and rec["provenance"].get("sm_count", 0) > 0
    for r in rec["rows"]:
        assert r["tflops"] > 0 and 0 < r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r.get("rel_err", 0) < 1e-2


def test_records_cover_the_page(lesson):
    order = {(r["tile"], r["order"]) for r in _record("lesson09_order")["rows"]}
    assert order == {(t, o) for t in lesson.SWEEP for o in lesson.ORDERS}
    sizes = {(r["shape"], r["impl"]) for r in _record("lesson09_sizes")["rows"]}
    for shape in ("4096x4096x4096", "4095x4097x4093"):  # the claims read these
        assert {(shape, "tilebook"), (shape, "cuBLAS")} <= sizes
    layer = {r["impl"] for r in _record("lesson09_linear_act")["rows"]}
    assert layer == {"tilebook", "unfused", "F.linear"}


# --------------------------------------------------------------------------- exercises


def test_exercise_3_the_checker_sees_a_missing_k_mask(tmp_path):
    said = " ".join(exercise_text(SCRIPT.text, 3).split())
    (line,) = [c for c in re.findall(r"``(.+?)``", said) if c.startswith("check(")]
    loads = (
        "a = tl.load(a_ptrs, mask=m_ok & k_ok[None, :], other=0.0)",
        "b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok, other=0.0)",
    )
    kernel = SCRIPT.source("tiled_matmul_kernel")
    assert all(load in kernel for load in loads)
    head = (
        "import torch\nimport triton\nimport triton.language as tl\nimport tilebook\n"
        "from tilebook.course.exercises import check\nfrom tilebook.ops import matmul as mm\n"
        "from tilebook.course.experiments import matmul as experiment\n\n"
        "DEVICE, FP16 = tilebook.device(), torch.float16\n"
    )
    names = ["tile_coords", "tiled_matmul_kernel", "cdiv", "matmul"]
    body = "\n\n\n".join(SCRIPT.source(n) for n in names)
    right = run_blocks(tmp_path / "ex3_right.py", head, body, f"print({line})")
    (verdict,) = right.PRINTED
    assert verdict.ok, str(verdict)
    unmasked = body.replace(loads[0], loads[0].replace(" & k_ok[None, :]", ""))
    unmasked = unmasked.replace(loads[1], loads[1].replace("k_ok[:, None] & ", ""))
    broken = run_blocks(tmp_path / "ex3_unmasked.py", head, unmasked, f"print({line})")
    (verdict,) = broken.PRINTED
    ragged, whole = verdict.cases
    assert whole.ok and "x29 " in ragged.label, str(verdict)
    ((nan),) = ragged.findings
    assert nan.kind == "nan" and nan.count == 37 * 53, str(verdict)  # every element


def test_the_page_s_claims_and_sentences_on_the_committed_records(lesson):
    """The GPU build's branches, on the committed H200 records: the claims hold and
    fail on data that contradicts them; another GPU's paths get the sentence instead
    of the Hopper claims."""
    from tilebook.course.bench import load_record
    from tilebook.course.claims import ClaimError, Claims

    order, sizes, layer = (
        load_record(n, RECORDS_DIR)
        for n in ("lesson09_order", "lesson09_sizes", "lesson09_linear_act")
    )
    said = experiment.order_claims(order, lesson.SWEEP, lesson.ORDERS)
    assert Claims("09", order).check_all(said).ok
    text = " ".join(str(experiment.say_order(order, lesson.SWEEP)).split())
    assert text.count("grouped is") == len(lesson.SWEEP)
    assert Claims("09", sizes).check_all(experiment.sizes_claims(sizes)).ok
    assert len(experiment.sizes_claims(sizes)) == 2 and experiment.say_other_paths(sizes) is None
    table = experiment.sizes_table(sizes)
    assert set(table.column("tilebook")) <= {"faster", "slower", "tied"}
    assert Claims("09", layer).check_all(experiment.layer_claims(layer)).ok
    assert "tilebook.linear_act is" in " ".join(str(experiment.say_layer(layer)).split())

    sizes.provenance["paths"] = "8.0"  # another GPU's paths: no Hopper claim, a sentence
    assert list(experiment.sizes_claims(sizes)) == [
        "cuBLAS: the ragged shape, under half of 4096 cubed"
    ]
    assert "compute capability 8.0" in " ".join(str(experiment.say_other_paths(sizes)).split())
    layer.provenance["paths"] = "8.0"
    assert experiment.layer_claims(layer) == {}

    slow = next(r for r in order.rows if (r["tile"], r["order"]) == ("64x64", "grouped"))
    slow["tflops"] = 1e6  # the small tile fastest: the claim must fail
    with pytest.raises(ClaimError, match="grouped: the 64x64 tiles are the slowest"):
        Claims("09", order).check_all(experiment.order_claims(order, lesson.SWEEP, lesson.ORDERS))
    ragged = sizes.one(shape="4095x4097x4093", impl="cuBLAS")
    ragged.update(tflops=1e6, median_ms=1e-9, p20_ms=1e-9, p80_ms=1e-9)
    with pytest.raises(ClaimError, match="under half of 4096 cubed"):
        Claims("09", sizes).check_all(experiment.sizes_claims(sizes))
    assert "There is no record" in str(experiment.say_order(None, lesson.SWEEP))
