"""Lesson 08 (linear_act): its epilogue is the package's, its kernels compute the layer,
its byte count is right and its records cover what it shows.

Running the whole lesson takes a while, so these tests lift the lesson's definitions
out of the script (by their source) into a small module and check them.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from exercise_blocks import exercise_blocks, exercise_intro, exercise_text, run_blocks
from lesson_source import LessonSource

import tilebook
from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.experiments import linear_act as experiment
from tilebook.ops import epilogue as package_epilogue

SCRIPT = LessonSource(8)
# How a check names the first wrong tile of the exercises' 45 x 37 outputs: the
# interpreter's small tiles cut them in several, a GPU's one tile covers them.
_TILE_00 = "tiles (0, 0)" if tilebook.is_interpreter() else "tile (0, 0) of a 1 x 1 grid"

#: The lesson's definitions the tests lift out, in lesson order.
LIFTED = [
    "LAYER",
    "textbook_activation",
    "linear_act_kernel",
    "GPU_TILE",
    "TILE",
    "WARPS",
    "MAX_K",
    "launch",
    "fused",
    "activation",
    "epilogue",
    "linear_epilogue_kernel",
    "fused_fitted",
    "activation_kernel",
    "unfused",
]

# sigmoid of a large negative input overflows exp() in the interpreter: harmless.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as an importable module (Triton needs their source)."""
    header = "import tilebook\nimport torch\nimport triton\nimport triton.language as tl\n"
    header += "from tilebook.ops.epilogue import HW_TANH, tanh_approx\n"
    folder = tmp_path_factory.mktemp("lesson08")
    # registered: the interpreter looks kernels' globals up in sys.modules
    module = SCRIPT.lift(LIFTED, folder, header + "\n\n", register=True)
    yield module
    del sys.modules[module.__name__]


def _python_function(obj):
    while not inspect.isfunction(obj):
        obj = obj.fn
    return obj


@pytest.mark.parametrize("name", ["activation", "epilogue"])
def test_lesson_shows_the_package_epilogue(name):
    """Compared as syntax trees: the lesson wraps lines for the page; any change to
    the code itself (names, constants, branches) fails."""
    src = textwrap.dedent(inspect.getsource(_python_function(getattr(package_epilogue, name))))
    package = ast.parse(src).body[0]
    shown = SCRIPT.node(name)
    assert ast.dump(shown) == ast.dump(package), (
        f"{name} differs from tilebook.ops.epilogue.{name}:\n"
        f"--- lesson\n{ast.unparse(shown)}\n--- package\n{ast.unparse(package)}"
    )


def test_package_matmul_kernels_use_the_public_epilogue():
    from tilebook.ops import matmul as mm

    assert mm.epilogue is package_epilogue.epilogue
    for kernel in (mm.matmul_kernel, mm.matmul_tma_kernel):
        assert "epilogue(" in inspect.getsource(_python_function(kernel))


def test_teaching_kernel_takes_all_of_k_in_one_dot():
    """One step past lesson 07: no loop over K (that is lesson 09's), one tl.dot, one
    store; and the final kernel ends in the package's epilogue."""
    for name in ("linear_act_kernel", "linear_epilogue_kernel"):
        code = ast.get_source_segment(SCRIPT.text, SCRIPT.node(name))
        assert code.count("tl.dot(") == 1 and code.count("tl.store(") == 1, name
        assert not any(isinstance(n, ast.For | ast.While) for n in ast.walk(SCRIPT.node(name)))
    final = ast.get_source_segment(SCRIPT.text, SCRIPT.node("linear_epilogue_kernel"))
    assert final.count("epilogue(") == 1


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("activation", list(experiment.TORCH_ACT))
def test_lesson_kernels_compute_the_layer(lesson, device, activation):
    # K = 50 and N = 37 are no multiple of any tile; no bias for "none".
    bias = activation != "none"
    x, w, b = experiment.layer(33, 37, 50, torch.float32, device, bias)
    ref = experiment.reference(x, w, b, activation)
    tol = 1e-5 if tilebook.is_interpreter() else 5e-3
    for fn in (lesson.fused, lesson.fused_fitted, lesson.unfused):
        out = fn(x, w, b, activation)
        assert out.shape == (33, 37) and out.dtype == x.dtype
        assert _rel(out, ref) < tol, (fn.__name__, activation)


def test_launcher_refuses_a_k_past_one_block(lesson, device):
    k = lesson.MAX_K + 1
    x, w, b = experiment.layer(4, 8, k, torch.float32, device)
    with pytest.raises(ValueError, match="does not fit one block"):
        lesson.fused(x, w, b, "relu")


def test_byte_count():
    m, n, k = 16384, 4096, 128
    fused = experiment.traffic(m, n, k, 2)
    assert fused == (m * k + n * k + n + m * n) * 2
    assert experiment.traffic(m, n, k, 2, passes=2) - fused == 2 * m * n * 2  # read, write Y
    # the lesson's claim that this layer is memory-bound: below the H100's balance
    from tilebook.course.datasheet import fact

    balance = fact("h100.bf16_dense").si / fact("h100.memory_bandwidth").si
    assert 2 * m * n * k / fused < balance


def test_lesson_links_and_exercises():
    assert ":mod:`tilebook.ops.epilogue`" in SCRIPT.text
    assert ":func:`tilebook.linear_act`" in SCRIPT.text
    names = re.findall(r'record_or_measure\(\s*"([^"]+)"', SCRIPT.text)
    assert names and all(n.startswith("lesson08_") for n in names), names
    tail = SCRIPT.text[SCRIPT.text.index("# Try this") :]
    exercises = re.findall(r"^# (\d+)\. ", tail, flags=re.M)
    assert len(exercises) >= 3
    assert tail.count(".. dropdown:: Solution") == len(exercises)


# --------------------------------------------------------------------------- the record


def _record(name):
    path = RECORDS_DIR / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name} has not been recorded on a GPU yet")
    return json.loads(path.read_text())


def fused_bytes(m, n, k):
    return experiment.traffic(m, n, k, 2)


def test_fusion_record_covers_the_page():
    rec = _record("lesson08_fusion")
    prov = rec["provenance"]
    assert prov["mode"] == "gpu" and prov.get("gpu") and prov.get("copy_gbps", 0) > 0
    rows = rec["rows"]
    by = {(r["sweep"], r["K"], r["activation"], r["impl"]): r for r in rows}
    m, n, k = 16384, 4096, 128
    for act in ("relu", "gelu", "gelu_tanh", "silu"):  # the table, claims and widget
        for way in ("fused", "unfused, Triton pass", "unfused, PyTorch"):
            row = by["act", k, act, way]
            extra = 0 if way == "fused" else 2
            assert row["bytes"] == experiment.traffic(m, n, k, 2, passes=extra)
    assert ("act", k, "gelu", "fused, erf GELU") in by
    alone = by["act", k, "none", "unfused, PyTorch"]  # F.linear alone: no extra trips
    assert alone["bytes"] == by["act", k, "none", "fused"]["bytes"] == fused_bytes(m, n, k)
    for kk in (32, 128, 256):  # the plot and its claim
        for way in ("fused", "unfused, PyTorch", "F.linear alone"):
            assert ("K", kk, "gelu", way) in by, (kk, way)
    for r in rows:
        assert 0 < r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r["rel_err"] < 1e-2


def _timed(activation, impl, us):
    return {"activation": activation, "impl": impl, "median_ms": us / 1e3}


def test_the_widget_judges_each_way_against_the_same_computation():
    """F.linear alone (activation "none") is the fastest row of all; were it the widget's
    best, every fused activation would read as slow.  Each way is held against the
    ways that compute the same thing (the erf GELU with the fitted one)."""
    rows = [
        _timed("none", "fused", 79.2),
        _timed("none", "unfused, PyTorch", 51.3),
        _timed("gelu", "fused", 92.0),
        _timed("gelu", "unfused, PyTorch", 138.9),
        _timed("gelu (erf)", "fused", 137.6),
        _timed("silu", "fused", 81.9),
        _timed("silu", "unfused, PyTorch", 121.8),
    ]
    keys = [(r["activation"], r["impl"]) for r in rows]
    got = dict(zip(keys, experiment.against_fastest(rows), strict=True))
    assert got["none", "unfused, PyTorch"] == got["gelu", "fused"] == got["silu", "fused"] == 1
    assert got["none", "fused"] == pytest.approx(79.2 / 51.3)
    assert got["gelu", "unfused, PyTorch"] == pytest.approx(138.9 / 92.0)
    assert got["gelu (erf)", "fused"] == pytest.approx(137.6 / 92.0)
    assert got["silu", "unfused, PyTorch"] == pytest.approx(121.8 / 81.9)
    # and the lesson's widget shows those ratios, flagging them with the lesson's SLOW
    call = next(
        n
        for n in ast.walk(SCRIPT.tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "experiment.fusion_knobs"
    )
    assert [ast.unparse(k.value) for k in call.keywords if k.arg == "slow"] == ["SLOW"]
    assert 0 < SCRIPT.constant("SLOW") < 1


def test_the_widget_reads_the_record_as_the_lesson_says():
    _record("lesson08_fusion")  # skips where there is none
    record = load_record("lesson08_fusion", RECORDS_DIR)
    knobs = experiment.fusion_knobs(record, slow=0.8)
    assert knobs["metric"] == "vs" and knobs["slow_fraction"] == 0.8
    rows = knobs["rows"]
    assert {r["activation"] for r in rows} == set(experiment.SHOWN_ACTIVATIONS)
    assert {r["impl"] for r in rows} == set(experiment.WAYS)  # the erf GELU as "fused"
    assert min(r["vs"] for r in rows) == 1 and all(r["why"] and r["moved"] for r in rows)
    assert experiment.fusion_knobs(None, slow=0.8) is None


def test_the_lesson_writes_microseconds_as_elsewhere():
    assert not re.search(r"\(us\)|\bunit=\"us\"", SCRIPT.text)
    assert "h100" not in SCRIPT.text.lower()  # compile targets name the architecture


# --------------------------------------------------------------------------- exercises


def _said(number: int) -> str:
    return " ".join(exercise_text(SCRIPT.text, number).split())


def _inline(text: str) -> list[str]:
    return re.findall(r"``(.+?)``", text)


def _exercise_run(path: Path, *code: str, change: tuple[str, str] = ("", "")):
    """The lesson's kernels and launchers (with ``change`` made), the exercises' cases,
    then ``code``; what it prints is in ``PRINTED``."""
    (cases,) = [c for c in _inline(exercise_intro(SCRIPT.text)) if c.startswith("cases = ")]
    head = (
        "import torch\nimport triton\nimport triton.language as tl\nimport tilebook\n"
        "from tilebook.course import exercises\n"
        "from tilebook.course.experiments import linear_act as experiment\n\n"
        "DEVICE = tilebook.device()\n"
    )
    body = "\n\n\n".join(SCRIPT.source(n) for n in LIFTED)
    assert change[0] in body
    return run_blocks(path, head, body.replace(*change), cases, *code)


def _check_line(number: int) -> str:
    (line,) = [c for c in _inline(_said(number)) if c.startswith("exercises.check(")]
    return f"print({line})"


def test_exercise_1_relu2_solution_passes_its_check(tmp_path):
    (branch,) = exercise_blocks(SCRIPT.text)[1]
    tail = (
        "        x = 0.5 * x + 0.5 * x * tanh_approx(0.5 * x) if HW_TANH else x * tl.sigmoid(x)\n"
    )
    tail += "    return x"
    assert SCRIPT.source("activation").endswith(tail)
    code = tail.replace("    return x", textwrap.indent(branch, "    ") + "    return x")
    mod = _exercise_run(tmp_path / "ex1.py", _check_line(1), change=(tail, code))
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)
    # The teaching kernel has no "relu2": every value is left as plain z, and named.
    mod = _exercise_run(tmp_path / "ex1_none.py", _check_line(1))
    (verdict,) = mod.PRINTED
    assert verdict.kinds() == {"wrong"} and _TILE_00 in str(verdict), str(verdict)


def test_exercise_2_residual_solution_passes_its_check(tmp_path):
    (add,) = [c for c in _inline(_said(2)) if c.startswith("acc += tl.load(r_ptr")]
    kernel = SCRIPT.source("linear_act_kernel")
    kernel = kernel.replace("def linear_act_kernel(", "def residual_kernel(")
    param = '    ACTIVATION: tl.constexpr,  # "none", "relu", "gelu", "gelu_tanh" or "silu"\n'
    store = "    y_tile = y_ptr + offs_m[:, None] * N + offs_n[None, :]\n"
    assert param in kernel and store in kernel
    kernel = kernel.replace(param, param + "    r_ptr,\n").replace(store, f"    {add}\n" + store)
    mod = _exercise_run(tmp_path / "ex2.py", kernel, _check_line(2))
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)
    # Without the added line, every tile is wrong by r, and the report says so.
    plain = kernel.replace(f"    {add}\n", "")
    mod = _exercise_run(tmp_path / "ex2_plain.py", plain, _check_line(2))
    (verdict,) = mod.PRINTED
    ((_, wrong),) = verdict.findings
    assert wrong.kind == "wrong" and wrong.count > 45 * 37 // 2, str(verdict)
    # The interpreter's tiles cut 45 x 37 in four; a GPU's larger ones leave one.
    every = "tiles (0, 0), (0, 1), (1, 0), (1, 1)" if tilebook.is_interpreter() else _TILE_00
    assert every in wrong.message
