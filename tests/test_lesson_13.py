"""Lesson 13 (autotune, pipelining, pitfalls): each pitfall it shows really happens and
its fix really fixes it; the compiled grid follows the rules the lesson checks; the
warps x stages widget reads compiled facts and records as the lesson says.

Running the whole lesson takes a while (it compiles a grid of matmuls for sm_90), so
its definitions are lifted out of the script (by their source) into a small module,
as for lessons 05 and 09.
"""

from __future__ import annotations

import ast
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from lesson_source import LessonSource

import tilebook
from tilebook.course.aot import AotError, CompiledKernel, compile_many
from tilebook.course.bench import Record
from tilebook.course.claims import ClaimError, Claims
from tilebook.course.datasheet import fact
from tilebook.course.experiments import tuning
from tilebook.course.widgets_pipeline import PipelineExplorer, pipeline_rows

SCRIPT = LessonSource(13)
DEV = tilebook.device()
# float32 products: exact under the interpreter; a GPU's tl.dot takes them as TF32.
FP32_TOL = 1e-6 if tilebook.is_interpreter() else 5e-3
LIFTED = [
    "matmul_kernel",
    "matmul",
    "TILE",
    "sum_into_kernel",
    "three_runs",
    "SUM_CONFIGS",
    "tuned_sum",
    "sum_grid",
    "N_SUM",
    "whole_sum_kernel",
    "smallest_cover",
    "WHOLE_CONFIGS",
    "whole_sum",
    "running_sum_kernel",
    "running_sum",
    "offsets_kernel",
    "SIG",
]


def _source(name: str) -> str:
    """The one definition of ``name``, with the statements that extend it (``SIG.update(...)``
    right after ``SIG``)."""
    node = SCRIPT.node(name)
    follow = [
        n
        for n in SCRIPT.tree.body
        if isinstance(n, ast.Expr)
        and n.lineno == node.end_lineno + 1
        and ast.unparse(n).startswith(f"{name}.")
    ]
    return SCRIPT.segment(node) + "".join("\n" + ast.unparse(n) for n in follow)


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    header = textwrap.dedent(
        """\
        import time

        import torch
        import triton
        import triton.language as tl

        GPU = False
        DEVICE = "cpu"
        """
    )
    folder = tmp_path_factory.mktemp("lesson13")
    # registered: the interpreter looks kernels' globals up in sys.modules
    module = SCRIPT.lift(LIFTED, folder, header + "\n\n", source=_source, register=True)
    yield module
    del sys.modules[module.__name__]


# ------------------------------------------------------------------ the kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul_matches_float64_on_ragged_shapes(lesson, dtype):
    torch.manual_seed(0)
    a, b = (
        torch.randn(37, 70, dtype=dtype, device=DEV),
        torch.randn(70, 53, dtype=dtype, device=DEV),
    )
    cfg = triton.Config(dict.fromkeys(lesson.TILE, 32), num_warps=4, num_stages=1)
    ref = a.double() @ b.double()
    err = ((lesson.matmul(a, b, cfg).double() - ref).norm() / ref.norm()).item()
    assert err < (FP32_TOL if dtype == torch.float32 else 2e-3)


def test_matmul_refuses_transposed_operands(lesson):
    cfg = triton.Config(dict.fromkeys(lesson.TILE, 32))
    a = torch.randn(32, 32, device=DEV)
    with pytest.raises(ValueError, match="contiguous"):
        lesson.matmul(a, a.t(), cfg)


# ------------------------------------------------------------------ autotune hooks


def _tuned_sum(lesson, x, start, **hooks):
    out = torch.full((1,), start, device=DEV)
    lesson.tuned_sum(**hooks)[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](
        x, out, x.numel(), MASKED=True
    )
    return out.item()


def test_without_reset_to_zero_the_tuning_runs_add_into_the_output(lesson):
    x = torch.rand(300, device=DEV)
    total = x.double().sum().item()
    runs = len(lesson.SUM_CONFIGS) * 3 + 1  # three_runs per config, plus the launch
    assert _tuned_sum(lesson, x, 0.0) == pytest.approx(runs * total, rel=1e-5)
    assert _tuned_sum(lesson, x, 0.0, reset_to_zero=["out_ptr"]) == pytest.approx(total, rel=1e-5)


def test_reset_to_zero_loses_a_running_total_and_restore_value_keeps_it(lesson):
    x = torch.rand(300, device=DEV)
    total = x.double().sum().item()
    reset = _tuned_sum(lesson, x, 50.0, reset_to_zero=["out_ptr"])
    restored = _tuned_sum(lesson, x, 50.0, restore_value=["out_ptr"])
    assert reset == pytest.approx(total, rel=1e-5)
    assert restored == pytest.approx(50.0 + total, rel=1e-5)


def test_a_key_without_n_hands_back_a_stale_block(lesson):
    x = torch.rand(1000, device=DEV)
    sums = {}
    for key in ([], ["n"]):
        kernel = lesson.whole_sum(key)
        for n in (100, 1000):
            out = torch.zeros(1, device=DEV)
            kernel[(1,)](x, out, n)
            sums[str(key), n] = (out.item(), kernel.best_config.kwargs["BLOCK"])
    right = x.double().sum().item()
    stale_sum, stale_block = sums["[]", 1000]
    assert stale_block < 1000 and abs(stale_sum - right) > 0.1 * right
    fresh_sum, fresh_block = sums["['n']", 1000]
    assert fresh_block >= 1000 and fresh_sum == pytest.approx(right, rel=1e-5)


def test_the_pruner_keeps_the_smallest_covering_block(lesson):
    kept = lesson.smallest_cover(lesson.WHOLE_CONFIGS, {"n": 129})
    assert [c.kwargs["BLOCK"] for c in kept] == [512]


# ------------------------------------------------------------------ pitfalls


def test_fp16_accumulator_is_far_off_and_float32_is_not(lesson):
    torch.manual_seed(0)
    x = (1 + torch.rand(2**16, device=DEV)).half()
    exact = x.double().sum()
    err = {
        acc: ((lesson.running_sum(x, acc).double() - exact).abs() / exact).item()
        for acc in (tl.float16, tl.float32)
    }
    assert err[tl.float16] > 1e-2
    assert err[tl.float32] < 1e-6


def test_missing_mask_reads_the_poisoned_neighbour(lesson):
    n = 100
    memory = torch.cat([torch.rand(n, device=DEV), torch.full((256,), 1e6, device=DEV)])
    x = memory[:n]
    sums = {}
    for masked in (False, True):
        out = torch.zeros(1, device=DEV)
        lesson.sum_into_kernel[(2,)](x, out, n, BLOCK=64, MASKED=masked)
        sums[masked] = out.item()
    assert sums[False] > 1e6
    assert sums[True] == pytest.approx(x.double().sum().item(), rel=1e-5)


def test_int32_offsets_wrap_past_2_31_and_int64_ones_do_not(lesson):
    first, row_len, rows = 2046, 2**20, 4
    got = {}
    for wide in (False, True):
        got[wide] = torch.zeros(rows, dtype=torch.int64, device=DEV)
        lesson.offsets_kernel[(rows,)](got[wide], first, row_len, WIDE=wide)
    exact = [(first + i) * row_len for i in range(rows)]
    assert got[True].tolist() == exact
    wrapped = [((e + 2**31) % 2**32) - 2**31 for e in exact]
    assert got[False].tolist() == wrapped
    assert any(v < 0 for v in wrapped)


# ------------------------------------------------------------------ the compiled grid


@pytest.fixture(scope="module")
def grid(lesson):
    job = {"kernel": lesson.matmul_kernel, "signature": lesson.SIG}
    job.update(constexprs=lesson.TILE, divisible_by_16=list(lesson.SIG))
    jobs = {s: {**job, "num_stages": s} for s in (1, 2)}
    return job, compile_many(jobs, arch=90, num_warps=8)


def test_stages_raise_shared_memory_by_one_tile_of_a_and_b(lesson, grid):
    _, compiled = grid
    tile = lesson.TILE
    per_stage = (tile["BLOCK_M"] + tile["BLOCK_N"]) * tile["BLOCK_K"] * 2
    for k in compiled.values():
        assert k.shared_bytes == k.num_stages * per_stage
        assert (k.count(r"\bLDGSTS\b") > 0) == (k.num_stages > 1)
        assert k.spill_stores_bytes == 0


def test_a_pipeline_too_deep_for_shared_memory_is_refused(lesson, grid):
    job, _ = grid
    limit = fact("sm90.smem_per_block").value * 1024
    with pytest.raises(AotError, match="shared memory") as info:
        compile_many([{**job, "num_stages": 5}], arch=90, num_warps=8, workers=1)
    assert "needs" in str(info.value)
    per_stage = (job["constexprs"]["BLOCK_M"] + job["constexprs"]["BLOCK_N"]) * 64 * 2
    assert 5 * per_stage > limit


# ------------------------------------------------------------------ the widget


def _kernel(warps, stages, shared, regs, spill):
    return CompiledKernel(
        name="k",
        arch=90,
        stages={},
        num_warps=warps,
        num_stages=stages,
        shared_bytes=shared,
        registers=regs,
        spill_stores_bytes=spill,
        spill_loads_bytes=spill,
    )


COMPILED = {
    (4, 1): _kernel(4, 1, 49152, 255, 1536),
    (8, 1): _kernel(8, 1, 49152, 232, 0),
    (8, 2): _kernel(8, 2, 98304, 205, 0),
}


def test_widget_without_record_shows_shared_memory_and_flags_rows():
    w = PipelineExplorer(COMPILED, refused={(8, 5): 245760}, source="aot", title="t")
    data = w.data()
    assert data["untimed"] is True and data["unit"].startswith("KiB")
    rows = {(r["knobs"]["warps"], r["knobs"]["stages"]): r for r in data["rows"]}
    assert rows[8, 2]["value"] == 96
    assert "spills 1536 bytes" in rows[4, 1]["note"]
    assert "no pipeline" in rows[8, 1]["note"]
    assert "note" not in rows[8, 2]
    assert "240 KiB" in rows[8, 5]["wrong"]
    # a refused setting is shown as refused, never as a value (a measured 0 TFLOP/s)
    assert rows[8, 5]["refused"] is True and rows[8, 2]["refused"] is False
    assert 'r.refused?"\\u2717 refused"' in w.script
    assert 'readout.textContent=r.refused?"refused' in w.script
    assert "data.untimed" in w.script
    assert data["caption"] == "aot"


def test_widget_with_record_shows_rates():
    rec = Record(
        "lesson13_pipelining",
        "t",
        [{"warps": w, "stages": s, "tflops": 100.0 * s + w} for w, s in COMPILED],
        {"gpu": "H100"},
    )
    w = PipelineExplorer(COMPILED, record=rec, source="aot", title="t")
    data = w.data()
    assert data["untimed"] is False and data["unit"] == "TFLOP/s"
    assert {r["value"] for r in data["rows"]} == {104.0, 108.0, 208.0}
    assert "H100" in data["caption"]


def test_widget_refuses_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        pipeline_rows({})
    with pytest.raises(TypeError, match="not a CompiledKernel"):
        pipeline_rows({(8, 1): "not compiled"})
    rec = Record("r", "t", [{"warps": 8, "stages": 1, "tflops": 1.0}], {})
    with pytest.raises(LookupError, match="rows match"):
        pipeline_rows(COMPILED, record=rec)


def test_what_the_lesson_says_of_lesson_09_is_what_lesson_09_does():
    """The introduction says lesson 09 timed its tiles itself and ran
    ``triton.autotune`` only at a size where the package's pruner leaves one
    configuration, so that the autotuner timed nothing."""
    from tilebook.ops import matmul as mm

    intro = " ".join(SCRIPT.text.split("\n\n")[1].split())
    assert "the autotuner timed nothing there" in intro
    l09 = LessonSource(9)
    launches = [
        n
        for n in ast.walk(l09.tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Subscript)
        and ast.unparse(n.func.value) == "tuned_kernel"
    ]
    assert len(launches) == 1
    m, n, k = (ast.literal_eval(a) for a in launches[0].args[3:6])
    for configs in (mm.GPU_PTR_CONFIGS, mm.INTERPRETER_PTR_CONFIGS):
        for elem in (2, 4):
            assert len(mm.prune_configs(configs, m, n, k, elem)) == 1
    # Its measurements launch the first configuration that fits, timed by compare().
    calls = {ast.unparse(c) for c in ast.walk(l09.tree) if isinstance(c, ast.Call)}
    assert "mm.set_autotune(False)" in calls


# ------------------------------------------------------------------ what the page says


def _hook_rows(restored_right: bool = True):
    """The hooks' table as the lesson builds it: two configurations, seven runs."""
    rows = []
    for start in (0.0, 100.0):
        for hook in ("none", "reset_to_zero", "restore_value"):
            want = start + 10.0
            got = {"none": start + 70.0, "reset_to_zero": 10.0}.get(hook, want)
            if hook == "restore_value" and not restored_right:
                got = 10.0
            right = abs(got - want) <= 1e-5 * want
            rows.append(
                {
                    "start": start,
                    "hook": hook,
                    "got": got,
                    "want": want,
                    "verdict": "right" if right else "wrong",
                }
            )
    return rows


def test_the_hooks_claims_hold_on_the_hooks_table_and_bite(monkeypatch):
    monkeypatch.delenv("TILEBOOK_CLAIMS", raising=False)
    claims = Claims("13 autotune", tuning.HERE)
    assert tuning.check_hooks(claims, _hook_rows(), 7) is claims
    assert claims.ok and len(claims.items) == 3
    said = " ".join(str(tuning.hooks_said(_hook_rows(), 2, 7)).split())
    assert "7 additions of the sum" in said and "7.00 times" in said
    with pytest.raises(ClaimError, match="restore_value is right in both"):
        tuning.check_hooks(Claims("13", "t"), _hook_rows(restored_right=False), 7)
    with pytest.raises(ClaimError, match="adds into out"):
        tuning.check_hooks(Claims("13", "t"), _hook_rows(), 10)


def test_the_pitfall_claims_name_what_went_wrong(monkeypatch):
    monkeypatch.delenv("TILEBOOK_CLAIMS", raising=False)
    stale = {"n": 1000, "got": 60.0, "want": 500.0, "verdict": "wrong"}
    narrow, wide = [2145386496, -2147483648], [2145386496, 2147483648]
    errors, sums = {"e16": 0.05, "e32": 1e-8}, {"bad": 2e6, "good": 50.0}
    args = (errors, "acc", sums, "mask", 2046, narrow, wide, stale)
    claims = Claims("13 autotune", tuning.HERE)
    pitfalls = tuning.check_pitfalls(claims, *args)
    assert claims.ok and [p.name for p in pitfalls][-1] == "n left out of the key"
    assert "row 2047 starts at -2147483648, not 2147483648" in pitfalls[2].wrong
    with pytest.raises(ClaimError, match="int32 offsets wrap"):
        tuning.check_pitfalls(
            Claims("13", "t"), errors, "acc", sums, "mask", 2046, wide, wide, stale
        )
