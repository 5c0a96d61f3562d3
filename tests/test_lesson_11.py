"""Lesson 11 (rms_norm): its kernels, what it says about the package, and its records.

Running the whole lesson takes a while, so these tests lift its kernels and
launchers out of the script (by their source) into a small module and check
them against float64.  What the lesson says about the package (which launch
rules apply at its widths, which kernels the package's launchers run) is
checked against :mod:`tilebook.ops.rms_norm`, and the lesson and
``benchmarks/rms_norm.py`` must measure through the one definition in
:mod:`tilebook.course.experiments.rms_norm`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
import triton
from exercise_blocks import exercise_blocks, exercise_intro, exercise_text, run_blocks
from lesson_source import LessonSource

import tilebook
import tilebook._launch as launching
from tilebook.course import bench
from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.check import default_tolerance
from tilebook.course.experiments import rms_norm as exp
from tilebook.ops import rms_norm as op

ROOT = Path(__file__).parents[1]
SCRIPT = LessonSource(11)
LIFTED = ["fwd_kernel", "warps_for", "forward", "bwd_kernel", "backward", "grid_for"]
LIFTED += ["lesson_bwd", "bwd_kernel_bf16"]


HIDDEN = SCRIPT.constant("HIDDEN")
WRONG = SCRIPT.constant("WRONG")


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file, as Triton needs source)."""
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if tilebook.is_gpu() else 4
    head = (
        "import torch\nimport triton\nimport triton.language as tl\n"
        "from tilebook.ops import rms_norm as package\n\n"
        f"EPS = {exp.EPS!r}\nSM_COUNT = {sm_count}\n\n"
    )
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson11"), head)


def _close(got, want, dtype):
    rel = exp.rel_err(got, want)
    assert rel <= default_tolerance(dtype), rel


@pytest.mark.parametrize(
    ("n_rows", "n_cols", "dtype"),
    [
        (37, 7, torch.float32),
        (9, 1000, torch.float16),
        (16, 300, torch.float32),
        (1, 64, torch.float32),
    ],
)
def test_lesson_kernels_match_float64(lesson, device, n_rows, n_cols, dtype):
    x, w, dy = exp.inputs(n_rows, n_cols, dtype, device=device, seed=n_cols)
    y64, dx64, dw64 = exp.reference(x, w, dy)
    y, rstd = lesson.forward(x, w)
    _close(y, y64, dtype)
    torch.testing.assert_close(rstd.double(), torch.rsqrt(x.double().pow(2).mean(-1) + exp.EPS))
    for programs in (1, 5, n_rows, lesson.grid_for(n_cols)):
        dx, dw = lesson.backward(dy, x, w, rstd, programs)
        _close(dx, dx64, dtype)
        _close(dw, dw64, dtype)


def test_the_lesson_matches_the_package(lesson, device):
    x, w, dy = exp.inputs(21, 200, torch.float32, device=device)
    y, rstd = lesson.forward(x, w)
    dx, dw = lesson.lesson_bwd(dy, x, w, rstd)
    y_p, rstd_p = op.launch_rms_norm_fwd(x, w, exp.EPS)
    dx_p, dw_p = op.launch_rms_norm_bwd(dy, x, w, rstd_p)
    torch.testing.assert_close(y, y_p, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rstd, rstd_p)
    torch.testing.assert_close(dx, dx_p, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dw, dw_p, rtol=1e-5, atol=1e-5)  # sums grouped differently


def test_the_backward_rejects_what_it_cannot_read(lesson, device):
    x, w, dy = exp.inputs(8, 64, torch.float32, device=device)
    _, rstd = lesson.forward(x, w)
    with pytest.raises(AssertionError):
        lesson.backward(dy.t().contiguous().t(), x, w, rstd, 4)


def test_the_bf16_kernel_differs_only_in_the_marked_lines():
    plain = SCRIPT.source("bwd_kernel").splitlines()[2:]
    bf16 = SCRIPT.source("bwd_kernel_bf16").splitlines()[2:]
    assert len(plain) == len(bf16)
    changed = [b for a, b in zip(plain, bf16, strict=True) if a != b]
    marked = [b for b in bf16 if b.endswith("# bf16")]
    assert changed == marked and len(marked) == 4
    for a, b in zip(plain, bf16, strict=True):
        if a != b:  # the same statement, with the fp32 sums turned into bf16 ones
            assert _without_casts(a) == _without_casts(b), (a, b)


class _DropCasts(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
            return node.func.value
        return node


def _without_casts(line: str) -> str:
    tree = _DropCasts().visit(ast.parse(line.strip()))
    return ast.unparse(tree).replace("bfloat16", "float32")


@pytest.mark.gpu
def test_bf16_sums_are_wrong_by_the_lesson_s_yardstick(lesson):
    x, w, dy = exp.inputs(8192, 1024)
    dw64 = exp.reference(x, w, dy)[2]
    _, rstd = lesson.forward(x, w)
    _, dw = lesson.lesson_bwd(dy, x, w, rstd)
    _, dw_bf16 = lesson.lesson_bwd(dy, x, w, rstd, lesson.bwd_kernel_bf16)
    floor = exp.rounding_err(dw64, torch.bfloat16)
    assert exp.rel_err(dw, dw64) <= WRONG * floor
    assert exp.rel_err(dw_bf16, dw64) > WRONG * floor


def test_the_launch_rules_the_lesson_states(lesson):
    short, mid, long_h = HIDDEN
    # Short rows: the package groups rows in both passes ("hint only" exists there).
    assert op.fwd_config(short)[1] > 1 and op.bwd_config(short)[1] > 1
    # Middle rows: the package runs the lesson's configuration (the hint is all
    # that differs forward; "the same launch configuration" backward).
    block = triton.next_power_of_2(mid)
    assert op.fwd_config(mid) == (block, 1, lesson.warps_for(block))
    per_sm = lesson.grid_for(mid) // lesson.SM_COUNT
    assert op.bwd_config(mid) == (block, 1, lesson.warps_for(block), per_sm)
    # Long rows take the chunked kernels, the others the whole-row ones.
    for threshold in (op.FWD_CHUNKED_THRESHOLD, op.BWD_CHUNKED_THRESHOLD):
        assert short <= threshold and mid <= threshold < long_h
    # "Keeps BWD_WARPS_PER_SM warps on each SM, as the package does."
    for h in (short, mid):
        lesson_warps = (
            lesson.grid_for(h) // lesson.SM_COUNT * lesson.warps_for(triton.next_power_of_2(h))
        )
        _, _, warps, per_sm = op.bwd_config(h)
        assert lesson_warps == warps * per_sm == op.BWD_WARPS_PER_SM


def test_the_values_a_thread_holds_are_as_the_lesson_says(lesson):
    """The page says a thread holds one number of a row's values over one span of
    widths, fewer below it (down to a fraction: copies) and more above it."""
    per = {2**k: 2**k / (32 * lesson.warps_for(2**k)) for k in range(3, 17)}
    steady = max(per.values(), key=list(per.values()).count)
    flat = [b for b, v in per.items() if v == steady]
    assert flat == [b for b in per if flat[0] <= b <= flat[-1]]  # one span
    assert min(per) < flat[0] and flat[-1] < max(per)  # with widths on both sides
    assert all(per[b] < steady for b in per if b < flat[0]) and per[min(per)] < 1
    assert all(per[b] > steady for b in per if b > flat[-1])
    assert "every thread holds the same" not in " ".join(SCRIPT.text.split())


def test_the_package_kernels_the_lesson_names(monkeypatch, device):
    """At the widths the lesson describes, the package's launchers run the kernels it links."""
    launched = []
    real = launching.launch  # every op launches through it (a plan's steps too)
    monkeypatch.setattr(
        launching,
        "launch",
        lambda kernel, *a, **k: launched.append(kernel) or real(kernel, *a, **k),
    )
    launching.PLANS.clear()  # no step relaunches a kernel it kept from another test
    # Small stand-ins for the thresholds, so that the interpreter stays quick.
    monkeypatch.setattr(op, "FWD_CHUNKED_THRESHOLD", 64)
    monkeypatch.setattr(op, "BWD_CHUNKED_THRESHOLD", 64)
    monkeypatch.setattr(op, "CHUNK_FWD", 64)
    monkeypatch.setattr(op, "CHUNK_BWD", 64)
    for n_cols, fwd, bwd in [
        (64, [op.rms_norm_fwd_kernel], [op.rms_norm_bwd_kernel, op.sum_partials_kernel]),
        (
            200,
            [op.rms_norm_fwd_chunked_kernel],
            [op.rms_norm_bwd_dot_kernel, op.rms_norm_bwd_chunked_kernel, op.sum_partials_kernel],
        ),
    ]:
        x, w, dy = exp.inputs(6, n_cols, torch.float32, device=device)
        launched.clear()
        _, rstd = op.launch_rms_norm_fwd(x, w, exp.EPS)
        assert launched == fwd
        launched.clear()
        op.launch_rms_norm_bwd(dy, x, w, rstd)
        assert launched == bwd
    linked = set(re.findall(r"tilebook\.ops\.rms_norm\.(\w+)", SCRIPT.text))
    assert linked and linked <= set(op.__all__), linked - set(op.__all__)


def _calls(tree: ast.AST) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_lesson_and_benchmark_share_one_definition():
    lesson = _calls(SCRIPT.tree)
    bench_calls = _calls(ast.parse((ROOT / "benchmarks" / "rms_norm.py").read_text()))
    assert {"exp.kernels", "exp.versus", "exp.ops"} <= lesson
    assert {"exp.versus", "exp.ops"} <= bench_calls
    assert "package.launch_rms_norm_fwd" in lesson
    assert "package.launch_rms_norm_bwd" in {ast.unparse(n) for n in ast.walk(SCRIPT.tree)}
    for calls in (lesson, bench_calls):
        assert not {"measure_interleaved", "compare", "bench.compare"} & calls


def _fake_compare(impls, *, bytes_moved, **fields):
    """bench.compare without a GPU: runs each function once and invents no speed."""
    fields = {k: v for k, v in fields.items() if k not in ("rounds", "warmup", "rep")}
    for fn in impls.values():
        fn()
    return [{**fields, "impl": n, "median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0} for n in impls]


def test_experiment_plumbing_on_the_interpreter(lesson, monkeypatch, device):
    monkeypatch.setattr(bench, "compare", _fake_compare)
    pairs = {"lesson": (lesson.forward, lesson.lesson_bwd)}
    rows = exp.kernels(
        pairs, 96, passes=["forward", "step"], elements=96 * 12, dtype=torch.float32, device=device
    )
    assert [(r["pass"], r["impl"], r["hidden"], r["rows"]) for r in rows] == [
        ("forward", "lesson", 96, 12),
        ("step", "lesson", 96, 12),
    ]
    assert all(r["err_dw"] < 1e-5 and r["floor_dw"] < 1e-6 for r in rows)
    with pytest.raises(ValueError, match="unknown passes"):
        exp.kernels(pairs, 96, passes=["sideways"])
    ops = {"tilebook": lambda x, w: tilebook.rms_norm(x, w, exp.EPS)}
    rows = exp.versus(ops, [32, 48], n_rows=5, dtype=torch.float32, device=device)
    assert [(r["hidden"], r["pass"]) for r in rows] == [
        (32, "forward"),
        (32, "backward"),
        (48, "forward"),
        (48, "backward"),
    ]
    assert all(r["err_dx"] < 1e-5 for r in rows)


def test_experiment_arithmetic():
    assert exp.traffic(10, 100) == (2 * 10 * 100 * 2 + 200, 3 * 10 * 100 * 2 + 40 + 400)
    ref = torch.tensor([1.0, 1.0 + 2**-10], dtype=torch.float64)
    assert exp.rounding_err(ref, torch.bfloat16) > 0 == exp.rounding_err(ref, torch.float32)


RECORDS = ["lesson11_grid", "lesson11_steps", "lesson11_versus", "lesson11_accumulate"]


@pytest.mark.parametrize("name", RECORDS)
def test_committed_records_are_gpu_measurements(name):
    rec = load_record(name, RECORDS_DIR)
    assert rec is not None, f"{name} has not been recorded on a GPU"
    assert rec.provenance["mode"] == "gpu" and rec.provenance.get("gpu")
    assert rec.provenance.get("copy_gbps", 0) > 0
    for r in rec.rows:
        assert 0 < r["p20_ms"] <= r["median_ms"] <= r["p80_ms"] and r["gbps"] > 0


def test_committed_records_hold_what_the_lesson_reads():
    steps = load_record("lesson11_steps", RECORDS_DIR)
    vs = load_record("lesson11_versus", RECORDS_DIR)
    acc = load_record("lesson11_accumulate", RECORDS_DIR)
    grid = load_record("lesson11_grid", RECORDS_DIR)
    assert steps.values("hidden") == vs.values("hidden") == acc.values("hidden") == list(HIDDEN)
    assert vs.values("impl") == list(exp.ops(compiled=False))
    assert acc.values("impl") == ["fp32", "bf16"]
    assert grid.values("impl")[0] == "one per row"
    steps.one(hidden=HIDDEN[0], impl="hint only", **{"pass": "forward"})
    tol = default_tolerance(torch.bfloat16)
    for rec in (steps, vs, acc):
        assert max(r[k] for r in rec.rows for k in ("err_y", "err_dx", "err_dw")) <= tol


def test_the_page_s_claims_hold_on_its_records_and_bite(lesson):
    from tilebook.course.claims import ClaimError, Claims

    steps, vs, acc, grid = (load_record(n, RECORDS_DIR) for n in RECORDS[1:] + RECORDS[:1])
    tol = default_tolerance(exp.DTYPE)
    sms = acc.provenance["sm_count"]
    chain = {h: exp.ELEMENTS // h / lesson.grid_for(h, sms) for h in HIDDEN}
    for record, said in [
        (grid, exp.grid_claims(grid)),
        (steps, exp.additions_claims(steps, HIDDEN, tol)),
        (vs, exp.versus_claims(vs, HIDDEN, tol)),
        (acc, exp.accumulate_claims(acc, HIDDEN, chain, WRONG, tol)),
    ]:
        assert Claims("11", record).check_all(said).ok
    with pytest.raises(ClaimError, match="right to tolerance"):  # a tolerance no sum meets
        Claims("11", steps).check_all(exp.additions_claims(steps, HIDDEN, 1e-9))
    with pytest.raises(ClaimError, match="wrong at every width"):  # a yardstick too lax
        Claims("11", acc).check_all(exp.accumulate_claims(acc, HIDDEN, chain, 1e9, tol))
    table = exp.additions_table(steps, HIDDEN)
    assert table.column("adds")[-1] == "the chunked kernels"


def test_the_lesson_is_in_the_lesson_form():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from lesson_form import check_lesson

    assert [str(p) for p in check_lesson(SCRIPT.path)] == []


# ----------------------------------------------------------------------------- exercises


def _said(number: int) -> str:
    return " ".join(exercise_text(SCRIPT.text, number).split())


def _check_line(number: int) -> str:
    """The exercise's checking line, as its text gives it."""
    (line,) = [c for c in re.findall(r"``(.+?)``", _said(number)) if c.startswith("check(")]
    return f"print({line})"


def _exercise_module(path: Path, *code: str, names=("fwd_kernel", "warps_for", "forward")):
    intro = exercise_intro(SCRIPT.text)
    (cases,) = [c for c in re.findall(r"``(.+?)``", intro) if c.startswith("cases = ")]
    head = (
        "import torch\nimport triton\nimport triton.language as tl\nimport tilebook\n"
        "from tilebook.course.exercises import check\n"
        "from tilebook.course.experiments import rms_norm as exp\n\n"
        "DEVICE, EPS = tilebook.device(), exp.EPS\n"
    )
    body = "\n\n\n".join(SCRIPT.source(name) for name in names)
    return run_blocks(path, head, body, cases, *code)


def test_exercise_1_fused_residual_solution_passes_its_check(tmp_path):
    (solution,) = exercise_blocks(SCRIPT.text)[1]
    mod = _exercise_module(tmp_path / "ex1.py", solution, _check_line(1))
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)
    # Forgetting to store h is named: out[0] is never written.
    no_h = solution.replace("    tl.store(H + offs, h, mask=mask)\n", "")
    assert no_h != solution
    mod = _exercise_module(tmp_path / "ex1_no_h.py", no_h, _check_line(1))
    (verdict,) = mod.PRINTED
    assert verdict.kinds() == {"unwritten"}, str(verdict)
    ((_, unwritten),) = verdict.findings
    assert unwritten.count == 37 * 1000 and "never written in out[0]" in unwritten.message


def test_exercise_2_atomic_dw_passes_its_check(tmp_path):
    atomic = "tl.atomic_add(DW_PART + cols, dw, mask=mask)"
    assert f"``{atomic}``" in _said(2)
    store = "tl.store(DW_PART + pid * n_cols + cols, dw, mask=mask)"
    empty = "x.new_empty(programs, n_cols, dtype=torch.float32)"
    kernel, launcher = SCRIPT.source("bwd_kernel"), SCRIPT.source("backward")
    assert store in kernel and empty in launcher and "``x.new_zeros``" in _said(2)
    kernel = kernel.replace(store, atomic)
    launcher = launcher.replace(empty, empty.replace("new_empty", "new_zeros"))
    mod = _exercise_module(tmp_path / "ex2.py", kernel, launcher, _check_line(2))
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)
    # The check sees dw: a kernel that adds nothing leaves the zeros, and fails.
    lost = kernel.replace(atomic, "")
    mod = _exercise_module(tmp_path / "ex2_lost.py", lost, launcher, _check_line(2))
    (verdict,) = mod.PRINTED
    assert verdict.kinds() == {"wrong"}, str(verdict)
