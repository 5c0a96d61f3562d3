"""tilebook.course.exercises: each mistake a reader makes is named, not just "mismatch".

Every test runs a small kernel with one deliberate mistake through the checker
and asserts the finding that names it (kind, the elements or programs, the
hint), so a checker that stopped seeing a mistake fails here.  They run under
the interpreter on a CPU and for real on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import tilebook
from tilebook.course.exercises import GUARD, SIZES, ExerciseError, Verdict, check, check_elementwise

BLOCK = 256


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, MASK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK:
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        y = tl.load(y_ptr + offs, mask=m)
        tl.store(out_ptr + offs, x + y, mask=m)
    else:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def good(x, y, out):
    n = x.numel()
    _add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK, MASK=True)


def no_mask(x, y, out):
    n = x.numel()
    _add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK, MASK=False)


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))  # no mask: copies the input's guard


def copy_no_mask(x, out):
    n = x.numel()
    _copy_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)


def floor_grid(x, y, out):
    n = x.numel()
    _add_kernel[(max(n // BLOCK, 1),)](x, y, out, n, BLOCK=BLOCK, MASK=True)


def _finding(verdict: Verdict, label: str, kind: str):
    found = [f for lbl, f in verdict.findings if lbl == label and f.kind == kind]
    assert found, f"no {kind!r} finding for {label}:\n{verdict}"
    return found[0]


def test_a_right_kernel_passes_every_size():
    v = check_elementwise(good, torch.add, block=BLOCK)
    assert v.ok, str(v)
    assert [c.label for c in v.cases] == [f"n={n}" for n in SIZES]
    assert "right in all" in str(v)
    assert v.assert_ok() is v


def test_a_missing_mask_is_a_write_past_the_end_by_the_last_program():
    v = check_elementwise(no_mask, torch.add, block=BLOCK, sizes=(97, 1024, 1025))
    assert v.kinds() == {"outside"}
    assert [c.label for c in v.cases if not c.ok] == ["n=97", "n=1025"]  # 1024 fits exactly
    f = _finding(v, "n=1025", "outside")
    assert f.count == BLOCK - 1  # lanes 1025..1279 of program 4
    assert "past the end" in f.message and "last program (4)" in f.hint
    with pytest.raises(ExerciseError, match="past the end"):
        v.assert_ok()


def test_an_unmasked_copy_is_caught_too():
    # A plain copy moves the input's guard bits into the output's guard unchanged:
    # only if the two guards hold different poison does the store show.
    v = check_elementwise(copy_no_mask, lambda x: x, inputs=1, block=BLOCK, sizes=(97,))
    assert v.kinds() == {"outside"}, str(v)
    assert _finding(v, "n=97", "outside").count == BLOCK - 97


def test_a_grid_too_small_leaves_the_tail_unwritten_and_says_why():
    v = check_elementwise(floor_grid, torch.add, block=BLOCK, sizes=(1025,))
    f = _finding(v, "n=1025", "unwritten")
    assert f.count == 1
    assert "element 1024" in f.message and "program 4 of 5" in f.message
    assert "Program 4 never ran" in f.hint and "triton.cdiv" in f.hint


@triton.jit
def _step_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, STEP: tl.constexpr):
    offs = tl.program_id(0) * STEP + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def test_every_program_skipping_lanes_is_named():
    def half(x, y, out):  # steps by 512 but declares a 256-element block
        n = x.numel()
        _step_kernel[(triton.cdiv(n, 512),)](x, y, out, n, BLOCK=256, STEP=512)

    v = check_elementwise(half, torch.add, block=512, sizes=(1024,))
    f = _finding(v, "n=1024", "unwritten")
    assert f.count == 512 and "programs 0-1 of 2" in f.message
    assert "lanes 256-511" in f.hint


def test_a_wrong_value_names_its_element_and_program():
    def off_by_one(x, y, out):
        good(x, y, out)
        out[700] += 1.0

    v = check_elementwise(off_by_one, torch.add, block=BLOCK, sizes=(1025,))
    f = _finding(v, "n=1025", "wrong")
    assert f.count == 1 and "element 700" in f.message and "program 2 of 5" in f.message
    assert v.kinds() == {"wrong"}


def test_a_wrong_ragged_block_gets_the_tail_hint():
    def bad_tail(x, y, out):
        good(x, y, out)
        out[1024] = 0.0

    f = _finding(
        check_elementwise(bad_tail, torch.add, block=BLOCK, sizes=(1025,)), "n=1025", "wrong"
    )
    assert "ragged" in f.hint


def test_nan_where_the_reference_is_finite():
    def nan(x, y, out):
        good(x, y, out)
        out[3] = float("nan")

    f = _finding(check_elementwise(nan, torch.add, sizes=(97,)), "n=97", "nan")
    assert f.count == 1 and "element 3" in f.message


def test_a_write_into_an_input_is_reported():
    def clobber(x, y, out):
        good(x, y, out)
        x[0] = 0.0

    v = check_elementwise(clobber, torch.add, sizes=(97,))
    f = _finding(v, "n=97", "input")
    assert "argument 0" in f.message and "inside it" in f.message


def test_an_exception_is_reported_with_a_hint():
    def not_pow2(x, y, out):
        n = x.numel()
        _add_kernel[(triton.cdiv(n, 100),)](x, y, out, n, BLOCK=100, MASK=True)

    f = _finding(check_elementwise(not_pow2, torch.add, sizes=(97,)), "n=97", "raised")
    assert "power-of-two" in f.hint

    def no_out_param(x, y, output):
        good(x, y, output)

    f = _finding(check_elementwise(no_out_param, torch.add, sizes=(97,)), "n=97", "raised")
    assert "name a parameter out" in f.hint


def test_a_function_that_allocates_is_checked_on_what_it_returns():
    def alloc(x, y):
        out = torch.empty_like(x)
        good(x, y, out)
        return out

    v = check_elementwise(alloc, torch.add, sizes=(97, 1025))
    assert v.ok and "no out parameter" in str(v)

    def wrong_dtype(x, y):
        return (x + y).double()

    assert _finding(check_elementwise(wrong_dtype, torch.add, sizes=(5,)), "n=5", "dtype")


def test_a_function_that_ignores_out_is_told_so():
    def ignores(x, y, out):
        return x + y

    v = check_elementwise(ignores, torch.add, sizes=(5,))
    assert v.kinds() == {"returned", "unwritten"}


@triton.jit
def _stamp_2d(out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)[:, None]
    cols = pid_n * BN + tl.arange(0, BN)[None, :]
    ids = tl.zeros((BM, BN), dtype=tl.int32) + pid_m * tl.num_programs(1) + pid_n
    tl.store(out_ptr + rows * N + cols, ids, mask=(rows < M) & (cols < N))


def _stamp_ref(M, N, BM, BN):
    grid_n = triton.cdiv(N, BN)
    rows = torch.arange(M)[:, None] // BM
    cols = torch.arange(N)[None, :] // BN
    return (rows * grid_n + cols).to(torch.int32)


def test_integer_outputs_and_2d_tiles():
    def right(M, N, out):
        _stamp_2d[(triton.cdiv(M, 8), triton.cdiv(N, 16))](out, M, N, BM=8, BN=16)

    def short_rows(M, N, out):  # one program row short
        _stamp_2d[(M // 8, triton.cdiv(N, 16))](out, M, N, BM=8, BN=16)

    def ref(M, N):
        return _stamp_ref(M, N, 8, 16)

    cases = {"20x33": (20, 33), "16x32": (16, 32)}
    assert check(right, ref, cases, block=(8, 16)).ok
    v = check(short_rows, ref, cases, block=(8, 16))
    f = _finding(v, "20x33", "unwritten")
    assert f.count == 4 * 33 and "tiles (2, 0), (2, 1), (2, 2) of a 3 x 3 grid" in f.message
    assert [c.label for c in v.cases if not c.ok] == ["20x33"]


def test_strided_arguments_keep_their_strides(device):
    seen = []

    def fn(x, out):
        seen.append(x.stride())
        out.copy_(x)

    x = torch.randn(6, 4, device=device).t()  # a transposed view
    assert check(fn, lambda x: x, [(x,)]).ok
    if not tilebook.is_interpreter():  # the interpreter's run happens in a child process
        assert seen == [x.stride()]


@pytest.mark.skipif(not tilebook.is_interpreter(), reason="only the interpreter forks")
def test_a_grid_far_too_large_without_a_mask_cannot_harm_the_session():
    def one_program_per_element(x, y, out):
        n = x.numel()  # "one thread per element" with 1024-element programs
        _add_kernel[(n,)](x, y, out, n, BLOCK=1024, MASK=False)

    n = 4 * GUARD // 1024 + 1  # writes reach four guards past the end
    v = check_elementwise(one_program_per_element, torch.add, block=1024, sizes=(n,))
    assert not v.ok and v.kinds() <= {"crashed", "outside"}, str(v)
    assert torch.add(torch.ones(3), torch.ones(3)).sum().item() == 6  # still alive


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="Triton kernel"):
        check_elementwise(_add_kernel, torch.add)
    with pytest.raises(TypeError, match="callable"):
        check_elementwise(good, "torch.add")
    with pytest.raises(ValueError, match="inputs"):
        check_elementwise(good, torch.add, inputs=0)
    with pytest.raises(ValueError, match="sizes"):
        check_elementwise(good, torch.add, sizes=(0,))
    with pytest.raises(TypeError, match="floating"):
        check_elementwise(good, torch.add, dtype=torch.int32)
    with pytest.raises(ValueError, match="block"):
        check_elementwise(good, torch.add, block=0)
    with pytest.raises(ValueError, match="tol"):
        check_elementwise(good, torch.add, tol=-1)
    with pytest.raises(ValueError, match="at least one case"):
        check(good, torch.add, [])


def test_the_verdict_renders_for_a_page():
    v = check_elementwise(floor_grid, torch.add, block=BLOCK, sizes=(1025,))
    page = v._repr_html_()
    assert 'data-tilebook-exercise="0"' in page and "never written" in page
    assert "WRONG in 1 of 1" in str(v)


@pytest.mark.gpu
def test_on_a_gpu_the_guards_catch_a_missing_mask():
    assert check_elementwise(good, torch.add, block=BLOCK).ok
    v = check_elementwise(no_mask, torch.add, block=BLOCK, sizes=(1025,))
    assert _finding(v, "n=1025", "outside").count == BLOCK - 1


@triton.jit
def _add_and_scale_rows(x_ptr, y_ptr, s_ptr, p_ptr, n_cols, BN: tl.constexpr, SUM: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BN)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m)
    y = tl.load(y_ptr + row * n_cols + cols, mask=m)
    if SUM:
        tl.store(s_ptr + row * n_cols + cols, x + y, mask=m)
    tl.store(p_ptr + row * n_cols + cols, x * y, mask=m)


def test_row_wise_findings_name_rows_and_a_stack_names_its_slice():
    """Two results through one out (out[0] and out[1]); without block, rows are named."""

    def both(x, y, out, write_sum=True):
        rows, cols = x.shape
        bn = triton.next_power_of_2(cols)
        _add_and_scale_rows[(rows,)](x, y, out[0], out[1], cols, BN=bn, SUM=write_sum)

    def ref(x, y):
        return torch.stack([x + y, x * y])

    dev = tilebook.device()
    cases = {"5x37": (torch.randn(5, 37, device=dev), torch.randn(5, 37, device=dev))}
    assert check(both, ref, cases).ok
    v = check(lambda x, y, out: both(x, y, out, write_sum=False), ref, cases)
    f = _finding(v, "5x37", "unwritten")
    assert f.count == 5 * 37 and "never written in out[0]." in f.message, str(v)

    def last_rows_wrong(x, y, out):
        both(x, y, out)
        out[:, 3:] += 1.0

    f = _finding(check(last_rows_wrong, ref, cases), "5x37", "wrong")
    assert f.count == 2 * 2 * 37 and " in out[i] for i in 0-1;" in f.message

    def one_row_wrong(x, y):  # a 2-D result: the rows are named
        return x * y + (torch.arange(x.shape[0], device=x.device)[:, None] == 2)

    f = _finding(check(one_row_wrong, lambda x, y: x * y, cases), "5x37", "wrong")
    assert f.count == 37 and " in rows 2;" in f.message
