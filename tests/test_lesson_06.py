"""Lesson 06 (reductions and the online softmax): its kernels, its exercises, its experiment.

The lesson takes a while to run, so these tests lift its kernels and launchers
out of the script (by their source) into a small module and check them against
float64 on shapes of their own.  They also check that the online kernel's loop
is the first walk of the package's ``softmax_fwd_online_kernel``, that the
lesson times through :mod:`tilebook.course.experiments.reductions`, that the
exercises' solutions pass the checker the exercises name, and that the
compiled ``tl.sum`` has the three levels the lesson counts.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from lesson_source import LessonSource

from tilebook.course.exercises import check
from tilebook.course.experiments import reductions as experiment
from tilebook.ops import softmax as sm

SCRIPT = LessonSource(6)
LIFTED = [
    "row_reduce_kernel",
    "row_reduce",
    "lse_combine",
    "row_lse_kernel",
    "row_lse",
    "block_sum_kernel",
    "atomic_sum_kernel",
    "atomic_max_kernel",
    "atomic_sum",
    "atomic_max",
    "locked_sum_kernel",
    "locked_sum",
    "partial_sums",
    "two_pass_kernel",
    "online_kernel",
    "row_stats",
]


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file, as Triton needs source)."""
    head = "import torch\nimport triton\nimport triton.language as tl\n\n"
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson06"), head)


@pytest.mark.parametrize("cols", [1, 5, 33])
def test_tile_reductions_match_float64(lesson, device, cols):
    x = torch.randn(4, cols + 4, device=device) - 3.0  # negative: padding must not win
    for xv in (x[:, :cols].contiguous(), x[:, 4:]):
        s, m, a, c = lesson.row_reduce(xv)
        x64 = xv.double()
        torch.testing.assert_close(s.double(), x64.sum(1), rtol=1e-5, atol=1e-5)
        assert torch.equal(m.double(), x64.amax(1))
        assert torch.equal(a.long().cpu(), x64.argmax(1).cpu())
        torch.testing.assert_close(c.double(), x64.cumsum(1), rtol=1e-5, atol=1e-5)
        lse = lesson.row_lse(xv).double()
        torch.testing.assert_close(lse, x64.logsumexp(1), rtol=1e-6, atol=1e-6)


def test_lse_combine_survives_empty_groups_and_infinities(lesson, device):
    x = torch.randn(3, 20, device=device)
    x[0, 5:] = -float("inf")  # most of the tile: pairs of empty groups meet
    x[1, 0] = 200.0  # exp(200) overflows float32 unless the maximum is subtracted
    got = lesson.row_lse(x).double()
    torch.testing.assert_close(got, x.double().logsumexp(1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("n", "block"), [(1, 64), (1000, 64), (4097, 256)])
def test_sums_across_programs_match_float64(lesson, device, n, block):
    x = experiment.inputs(n, device=device)
    want = x.double().sum()
    for got in (
        lesson.atomic_sum(x, block),
        lesson.atomic_sum(x, block, 5),
        lesson.locked_sum(x, block),
        lesson.partial_sums(x, block),
    ):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert lesson.atomic_max(x, block).item() == x.max().item()


def test_atomic_max_of_negative_numbers(lesson, device):
    x = -1.0 - experiment.inputs(1000, device=device)  # all below zero
    assert lesson.atomic_max(x, 64).item() == x.max().item()


def test_online_and_two_pass_statistics_agree(lesson, device):
    x = torch.randn(5, 777, device=device) * 5
    x[1, :300] = -float("inf")  # the first blocks hold nothing but -inf
    x[2] = torch.linspace(-10, 40, 777, device=device)  # the maximum grows each block
    m1, s1 = lesson.row_stats(lesson.two_pass_kernel, x, 64)
    m2, s2 = lesson.row_stats(lesson.online_kernel, x, 64)
    assert torch.equal(m1, m2) and torch.equal(m1.double(), x.double().amax(1))
    s64 = torch.exp(x.double() - m1.double()[:, None]).sum(1)
    for s in (s1, s2):
        torch.testing.assert_close(s.double(), s64, rtol=1e-6, atol=0)


def _statements(fn) -> list[str]:
    src = textwrap.dedent(inspect.getsource(fn))
    return [ast.unparse(n) for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Assign)]


def test_the_online_loop_is_the_package_s_first_walk():
    """The recurrence lines of the lesson's loop appear, in order, in the package's kernel."""
    (loop,) = [
        n for n in ast.walk(ast.parse(SCRIPT.source("online_kernel"))) if isinstance(n, ast.For)
    ]
    ours = [ast.unparse(s) for s in loop.body if isinstance(s, ast.Assign)]
    recurrence = ours[ours.index("m_new = tl.maximum(m, tl.max(x, axis=0))") :]
    package = _statements(sm.softmax_fwd_online_kernel.fn)
    at = [package.index(line) for line in recurrence]
    assert len(recurrence) == 4 and at == sorted(at)


def test_lesson_times_through_the_experiment():
    calls = {ast.unparse(n.func) for n in ast.walk(SCRIPT.tree) if isinstance(n, ast.Call)}
    assert {"experiment.contention", "experiment.repeatability"} <= calls
    assert not {"measure", "measure_interleaved", "compare"} & calls


def test_experiment_arithmetic():
    assert experiment.programs(1, 256) == 1
    assert experiment.programs(experiment.N, experiment.BLOCK) == 2**16 + 1
    assert experiment.distinct([1.0, 1.0, 1.0 + 2**-23]) == 2
    assert experiment.distinct([0.1, 0.1]) == 1
    x = experiment.inputs(5000, device="cpu", exact=True)
    parts = x[:4096].view(-1, 64).sum(1)
    sums = set()
    for order in (torch.arange(64), torch.randperm(64), torch.randperm(64)):
        acc = torch.zeros((), dtype=torch.float32)
        for value in parts[order]:
            acc += value
        sums.add(acc.item())
    assert sums == {x[:4096].double().sum().item()}  # exact in any order
    with pytest.raises(ValueError, match="positive"):
        experiment.programs(0, 256)
    with pytest.raises(ValueError, match="runs"):
        experiment.repeatability({}, torch.zeros(1), runs=1)


# -- the exercises' solutions pass the checks the exercises give -------------


@triton.jit
def row_min_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ptrs = x_ptr + tl.program_id(0) * stride + cols
    x = tl.load(ptrs, mask=cols < n_cols, other=float("inf"))
    tl.store(out_ptr + tl.program_id(0), tl.min(x, axis=0))


def row_min(x, out):
    block = triton.next_power_of_2(x.shape[1])
    row_min_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), block)


@triton.jit
def attend_kernel(x_ptr, v_ptr, o_ptr, n_cols, stride, D: tl.constexpr, BLOCK: tl.constexpr):
    x_row = x_ptr + tl.program_id(0) * stride
    cols = tl.arange(0, BLOCK)
    dims = tl.arange(0, D)
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    o = tl.zeros([D], tl.float32)
    for start in tl.range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf"))
        vb = tl.load(
            v_ptr + offs[:, None] * D + dims[None, :], mask=(offs < n_cols)[:, None], other=0.0
        )
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.exp(x - shift)
        alpha = tl.exp(m - shift)
        s = s * alpha + tl.sum(p, axis=0)
        o = o * alpha + tl.sum(p[:, None] * vb, axis=0)
        m = m_new
    tl.store(o_ptr + tl.program_id(0) * D + dims, o / s)


def attend(x, v, out):
    attend_kernel[(x.shape[0],)](x, v, out, x.shape[1], x.stride(0), v.shape[1], 128)


def test_exercise_solutions_pass_their_checks(device):
    rows = [(torch.randn(5, 7, device=device),), (torch.randn(3, 1000, device=device),)]
    assert check(row_min, lambda x: x.amin(1), rows).ok
    cases = [(torch.randn(3, 1000, device=device), torch.randn(1000, 16, device=device))]
    verdict = check(attend, lambda x, v: torch.softmax(x, -1) @ v, cases)
    assert verdict.ok, str(verdict)


def test_a_zero_padding_fails_the_minimum_check(device):
    """The exercise's point: the checker catches the wrong neutral element."""

    @triton.jit
    def bad_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + tl.program_id(0) * stride + cols, mask=cols < n_cols, other=0.0)
        tl.store(out_ptr + tl.program_id(0), tl.min(x, axis=0))

    def bad(x, out):
        bad_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), 8)

    x = torch.rand(4, 7, device=device) + 1.0  # positive: a zero padding wins
    assert not check(bad, lambda x: x.amin(1), [(x,)]).ok


# -- the lowering the lesson counts -------------------------------------------


def test_tl_sum_lowers_to_the_three_levels(lesson):
    from tilebook.course.aot import compile_many

    ks = compile_many(
        {w: {"num_warps": w} for w in (1, 4)},
        kernel=lesson.block_sum_kernel,
        signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
        constexprs={"BLOCK": 1024},
        arch=90,
    )
    for w, k in zip((1, 4), ks.values(), strict=True):
        shuffles = k.count(r"\bshfl\.sync\.bfly", "ptx")
        assert shuffles == math.log2(32 * w)
        assert k.count(r"\badd\.f32", "ptx") == 1024 // (32 * w) - 1 + shuffles
        assert (k.count(r"\bbar\.sync", "ptx") > 0) == (w > 1)
        # What the lesson says of its listing: each add is credited to the tl.sum line,
        # to Triton's library (its combine function), or to both, never to another line.
        ptx = k.stage("ptx").splitlines()
        adds = {n for n, text in enumerate(ptx, 1) if re.search(r"\badd\.f32", text)}
        assert len(adds) == k.count(r"\badd\.f32", "ptx")
        listed = {line.number for line in k.lines_for("tl.sum(x", "ptx")}
        index = k.line_index("ptx")
        library = {n for loc, ns in index.items() if loc[0] != k.kernel_file for n in ns}
        assert adds <= listed | library
        mine = {n for loc, ns in index.items() if loc[0] == k.kernel_file for n in ns}
        assert not (adds & mine) - listed  # no add belongs to another line of the kernel


@pytest.mark.gpu
def test_experiments_run_on_a_gpu(lesson):
    rows = experiment.contention(
        lesson.atomic_sum, lesson.partial_sums, n=2**16 + 3, slots=(1, 8), rounds=1, rep=5
    )
    assert [r["label"] for r in rows] == [
        "atomic_add into 1",
        "atomic_add into 8",
        "partial sums",
        "torch.sum",
    ]
    assert all(r["gbps"] > 0 and r["programs"] == 2**8 + 1 for r in rows)
    x = experiment.inputs(2**16 + 3)
    ways = {"partial sums": lambda: lesson.partial_sums(x, 1024)}
    ways["atomic_max"] = lambda: lesson.atomic_max(x, 1024)
    got = experiment.repeatability(ways, x, reference={"atomic_max": x.max()}, runs=3)
    assert [r["distinct"] for r in got] == [1, 1]


def test_the_page_s_claims_hold_on_its_compiles_and_bite(lesson):
    from tilebook.course.aot import compile_many
    from tilebook.course.claims import ClaimError, Claims

    warps, ops = (1, 4, 16), ("add.f32", "shfl.sync.bfly", "st.shared", "ld.shared", "bar.sync")
    ks = compile_many(
        {str(w): {"num_warps": w} for w in warps},
        kernel=lesson.block_sum_kernel,
        signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
        constexprs={"BLOCK": 1024},
        arch=90,
    )
    counts = [
        {"warps": w, "per_thread": 1024 // (32 * w)}
        | {op: ks[str(w)].count(r"\b" + op.replace(".", r"\."), "ptx") for op in ops}
        for w in warps
    ]
    listing = ks["4"].lines_for("tl.sum(x", "ptx")
    said = experiment.lowering_claims(counts, ks["4"], listing, 32)
    assert Claims("06", "t").check_all(said).ok
    assert experiment.ptx_table(counts, 1024).column("bar.sync")[0] == "0"
    text = " ".join(str(experiment.say_adds(ks["4"], listing)).split())
    assert re.match(r"(All|None|\d+) of the \d+ float adds of the PTX (is|are) among", text)
    assert "in 2 more shuffles" in " ".join(str(experiment.say_warps(4, 8, 32)).split())
    counts[0]["bar.sync"] = 1  # one warp with a barrier: the claim must fail
    with pytest.raises(ClaimError, match="One warp needs no shared memory"):
        Claims("06", "t").check_all(experiment.lowering_claims(counts, ks["4"], listing, 32))


def test_the_page_s_claims_hold_on_the_committed_records_and_bite():
    """The GPU build's branch: the tables, claims and sentences of the committed H200
    records; and the claims of the page's own computations."""
    from tilebook.course.bench import RECORDS_DIR, load_record
    from tilebook.course.claims import ClaimError, Claims
    from tilebook.course.widgets_softmax import OnlineSoftmaxStepper

    repeat = load_record("lesson06_repeat", RECORDS_DIR)
    cont = load_record("lesson06_contention", RECORDS_DIR)
    assert Claims("06", repeat).check_all(experiment.repeat_claims(repeat)).ok
    assert Claims("06", cont).check_all(experiment.contention_claims(cont)).ok
    assert experiment.repeat_table(repeat).column("way") == [r["impl"] for r in repeat.rows]
    against = experiment.contention_table(cont).column("against partial sums")
    assert "" in against and any(re.match(r"(faster|slower|level)", a) for a in against)
    assert "No GPU record" in str(experiment.repeat_table(None))
    one = next(r for r in repeat.rows if r["impl"] == "atomic_add, one address")
    one["distinct"] = 1  # an atomic sum that repeats its bits: the claim must fail
    with pytest.raises(ClaimError, match="different bits from run to run"):
        Claims("06", repeat).check_all(experiment.repeat_claims(repeat))

    accuracy = [{"two-pass": 1.0, "online": 1.5}, {"two-pass": 2.0, "online": 2.0}]
    assert Claims("06", "t").check_all(experiment.accuracy_claims(accuracy)).ok
    assert "costs next to nothing" in str(experiment.say_rescale_cost(accuracy))
    accuracy[0]["online"] = 80.0
    with pytest.raises(ClaimError, match="within 64 eps"):
        Claims("06", "t").check_all(experiment.accuracy_claims(accuracy))
    assert "adds to its error" in " ".join(str(experiment.say_rescale_cost(accuracy)).split())

    settings = OnlineSoftmaxStepper().settings()
    assert Claims("06", "t").check_all(experiment.stepper_claims(settings)).ok
    wrong = next(r for r in settings if r["knobs"]["rescale"] == "skip" and r["rescales"] > 0)
    wrong["verdict"] = "ok"  # a skipped rescale that happens to be right: the claim fails
    with pytest.raises(ClaimError, match="wrong exactly where"):
        Claims("06", "t").check_all(experiment.stepper_claims(settings))
