"""RMSNorm, forward and backward: its kernels, one launcher per direction, its
autograd and its ``torch.library`` operator.

``y = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x**2) + eps)`` over the last
dimension, the normalisation of Llama-style transformers.  How the kernels share
out the work (whole rows in registers, a persistent backward whose ``dweight``
partial sums :func:`~tilebook.ops.partials.sum_partials_kernel` adds up, chunked
kernels for long rows) and everything around them that :mod:`tilebook.ops.layer_norm`
does alike (configuration, plans of repeat calls, checks) is in
:mod:`tilebook.ops.norms`.  Here: the math, in five kernels of some 180 lines with
their measured reasons, which make the module longer than 500 lines.

* Forward (:func:`rms_norm_fwd_kernel`): rows reduced to ``rstd`` and scaled before
  anything is written back, so ``x`` is read from memory once; ``rstd`` (fp32, one
  per row) is kept for the backward.  Long rows
  (:func:`rms_norm_fwd_chunked_kernel`): one walk for the sum of squares, a second
  one (newest chunk first, the likeliest still in L2) to write ``y``.
* Backward: ``dx = rstd * (g - x_hat * mean(g * x_hat))`` with ``g = dy * weight``,
  and ``dweight = sum(dy * x_hat)`` over all rows.  Long rows:
  :func:`rms_norm_bwd_dot_kernel` writes each (row, chunk)'s ``sum(dy * w * x)``,
  :func:`rms_norm_bwd_chunked_kernel` adds a row's up to get its ``c`` and writes
  ``dx`` and its columns' share of ``dweight``.

Both passes are memory-bound: a handful of flops per element against 2 (forward)
or 3 (backward) full tensors of traffic, so the aim is the copy bandwidth.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .._launch import PLANS, call_key, plain
from . import library, norms

# The kernels call the shared tile helpers by bare name: Inductor re-emits a user
# kernel with the @triton.jit functions it names, and a module attribute
# (`norms.columns`) would be a NameError there.
from .norms import BWD_WARPS_PER_SM, MAX_HIDDEN, columns, row_sums, row_tile, walk_row
from .partials import sum_partials_kernel
from .precision import autocasting, upper
from .rows import load_rows, store_rows

__all__ = [
    "BWD_CHUNKED_THRESHOLD",
    "BWD_WARPS_PER_SM",
    "CHUNK_BWD",
    "CHUNK_FWD",
    "FWD_CHUNKED_THRESHOLD",
    "MAX_HIDDEN",
    "RMSNormFunction",
    "bwd_config",
    "compile_jobs",
    "fwd_config",
    "launch_rms_norm_bwd",
    "launch_rms_norm_fwd",
    "rms_norm",
    "rms_norm_bwd_chunked_kernel",
    "rms_norm_bwd_dot_kernel",
    "rms_norm_bwd_kernel",
    "rms_norm_fwd_chunked_kernel",
    "rms_norm_fwd_kernel",
]

# The sweep behind the two thresholds (``benchmarks/rms_norm.py --tune-long``; H100,
# bf16, 2**26 elements, launchers): forward 2794 against 2645 GB/s chunked at 32768
# columns, 1560 against 2603 at 65536; backward 2371 against 1585 GB/s chunked at
# 16384, 201 against 1692 at 65536.
#: Rows longer than this take the chunked forward.  A whole row in registers is
#: read once and stays the fastest up to this length; past it, it spills.
#: Module-level so that tests can lower it.
FWD_CHUNKED_THRESHOLD = 32768
#: Rows longer than this take the chunked backward.  The register kernel holds
#: ``x``, ``dy`` and the ``dweight`` accumulator, and spills past this length (a
#: few bytes at 16384 columns, 640 bytes per thread at 32768, over 2 KiB at 65536).
BWD_CHUNKED_THRESHOLD = 16384
#: Chunk widths (powers of two) of the chunked kernels.  Tests set them small to
#: get many chunks out of short rows.
CHUNK_FWD = 32768
CHUNK_BWD = 4096


@triton.jit
def rms_norm_fwd_kernel(
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    y_ptr,  # (n_rows, n_cols), unit stride along a row
    rstd_ptr,  # (n_rows,) fp32
    n_rows, n_cols, x_row_stride, y_row_stride, eps,
    BLOCK_N: tl.constexpr,  # next power of two >= n_cols
    ROWS: tl.constexpr,  # rows per program
    STORE_RSTD: tl.constexpr,  # False: no backward follows (rstd_ptr is unused)
    X_EVICT: tl.constexpr,  # L2 policy of the x loads: "" or "evict_last" (see _x_evict)
    EVEN: tl.constexpr,  # n_cols == BLOCK_N and ROWS divides n_rows: no masks at all
):  # fmt: skip
    cols, col_ok = columns(0, n_cols, BLOCK_N)
    rows, row_ok, mask, rows64 = row_tile(tl.program_id(0) * ROWS, ROWS, n_rows, col_ok)
    x_ptrs = x_ptr + rows64 * x_row_stride + cols[None, :]
    y_ptrs = y_ptr + rows64 * y_row_stride + cols[None, :]
    x = load_rows(x_ptrs, mask, EVEN, X_EVICT)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
    w = w.to(tl.float32)
    # Masked columns load as 0, so they add nothing to the sum of squares.
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = (x * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty)
    store_rows(y_ptrs, y, mask, EVEN)
    if STORE_RSTD:
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _store_dx(dx_ptrs, mask, g, x_hat, c, rstd):
    # d/dx of x * rstd(x): the direct term minus the term through rstd's dependence
    # on every element of the row (c: mean(g * x_hat) over the row).
    dx = (g - x_hat * c[:, None]) * rstd[:, None]
    tl.store(dx_ptrs, dx.to(dx_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_bwd_kernel(
    dy_ptr, x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    rstd_ptr,  # (n_rows,) fp32, from the forward pass
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    dw_partial_ptr,  # (num_programs, n_cols) fp32, contiguous
    n_rows, n_cols, dy_row_stride, x_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,  # rows per loop step
):  # fmt: skip
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    cols, col_ok = columns(0, n_cols, BLOCK_N)
    dw_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    # Grid-stride loop: neighbouring programs take neighbouring row blocks, so at
    # any moment the grid streams through one region of memory.
    for start in range(pid * ROWS, n_rows, n_progs * ROWS):
        rows, row_ok, mask, rows64 = row_tile(start, ROWS, n_rows, col_ok)
        x = tl.load(x_ptr + rows64 * x_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows64 * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        # Rows past the end get rstd = 0, so they contribute nothing to dw.
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)

        # Reloaded each step (an L1 hit) rather than held across the loop: the
        # registers are better spent on the dw accumulator.
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x_hat = x.to(tl.float32) * rstd[:, None]
        dy = dy.to(tl.float32)
        g = dy * w[None, :]
        c = tl.sum(g * x_hat, axis=1) / n_cols
        _store_dx(dx_ptr + rows64 * dx_row_stride + cols[None, :], mask, g, x_hat, c, rstd)
        dw_acc += dy * x_hat

    dw = tl.sum(dw_acc, axis=0)
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=col_ok)


# ---------------------------------------------------------------------------
# Long rows: chunked kernels
# ---------------------------------------------------------------------------


@triton.jit
def rms_norm_fwd_chunked_kernel(
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    y_ptr,  # (n_rows, n_cols), unit stride along a row
    rstd_ptr,  # (n_rows,) fp32
    n_rows, n_cols, x_row_stride, y_row_stride, eps,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    # A persistent grid: few rows are in flight at once, so that a row read by the
    # first walk is still in L2 when the second walk reads it again.
    for i in tl.range(0, tl.cdiv(n_rows - tl.program_id(0), tl.num_programs(0))):
        row, x_row, y_row = walk_row(i, x_ptr, y_ptr, x_row_stride, y_row_stride)
        # Lane-wise sums, reduced once per row: no block-wide reduction per chunk.
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for c in tl.range(0, n_chunks):
            offs = c * BLOCK_N + cols
            # evict_last: the second walk wants to find this chunk in L2.
            x = tl.load(x_row + offs, mask=offs < n_cols, other=0.0, eviction_policy="evict_last")
            x = x.to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        tl.store(rstd_ptr + row, rstd)
        for j in tl.range(0, n_chunks):
            offs = (n_chunks - 1 - j) * BLOCK_N + cols  # newest chunk first: still in L2
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=0.0, eviction_policy="evict_first")
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y = x.to(tl.float32) * rstd * w
            tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_bwd_dot_kernel(
    dy_ptr, x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    dot_ptr,  # (n_rows, n_chunks) fp32, contiguous: sum(dy * w * x) per row chunk
    n_cols, dy_row_stride, x_row_stride,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
):  # fmt: skip
    # One program per (row, chunk), row-major: the grid streams through memory in
    # order, and the partial dot of program pid lands at dot_ptr + pid.
    pid = tl.program_id(0)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    row64 = (pid // n_chunks).to(tl.int64)
    cols = (pid % n_chunks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row64 * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row64 * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(dot_ptr + pid, tl.sum(dy * w * x, axis=0))


@triton.jit
def rms_norm_bwd_chunked_kernel(
    dy_ptr, x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    rstd_ptr,  # (n_rows,) fp32, from the forward pass
    dot_ptr,  # (n_rows, n_dots) fp32, from rms_norm_bwd_dot_kernel
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    dw_partial_ptr,  # (num_programs(1), n_cols) fp32, contiguous
    n_rows, n_cols, n_dots, dy_row_stride, x_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr,  # column chunk of this program, a power of two
    ROWS: tl.constexpr,  # rows per loop step
    DOTS: tl.constexpr,  # next power of two >= n_dots
):  # fmt: skip
    # Program (chunk, split) owns columns [chunk * BLOCK_N, (chunk + 1) * BLOCK_N)
    # and every num_programs(1)-th row block: its share of dweight for those columns
    # stays in registers, as in rms_norm_bwd_kernel.
    split = tl.program_id(1)
    cols, col_ok = columns(tl.program_id(0) * BLOCK_N, n_cols, BLOCK_N)
    n_blocks = tl.cdiv(n_rows, ROWS)
    dw_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    for b in tl.range(split, n_blocks, tl.num_programs(1)):
        # Last row block first: the dot kernel read the rows in order, so the last
        # ones are the likeliest still to be in L2.
        rows, row_ok, mask, rows64 = row_tile((n_blocks - 1 - b) * ROWS, ROWS, n_rows, col_ok)
        # The whole row's sum(dy * w * x), from its chunks' partial sums.
        dot = row_sums(dot_ptr, rows, row_ok, n_dots, DOTS)
        # Rows past the end get rstd = 0, so they contribute nothing to dw.
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        c = dot * rstd / n_cols  # sum(g * x_hat) / H

        x = tl.load(x_ptr + rows64 * x_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows64 * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x_hat = x.to(tl.float32) * rstd[:, None]
        dy = dy.to(tl.float32)
        g = dy * w[None, :]
        _store_dx(dx_ptr + rows64 * dx_row_stride + cols[None, :], mask, g, x_hat, c, rstd)
        dw_acc += dy * x_hat

    dw = tl.sum(dw_acc, axis=0)
    tl.store(dw_partial_ptr + split * n_cols + cols, dw, mask=col_ok)


# ---------------------------------------------------------------------------
# Launchers: configuration, then one launcher per direction
# ---------------------------------------------------------------------------

_OP = "rms_norm"

# The x loads' L2 policy depends on the tensor's size, not the row's.  evict_last
# measured about 1% faster than no hint where x is far larger than L2 (2**26 bf16
# elements, 128 MB, against the H100's 50 MB: lesson11_steps), but about 10% slower
# at 16384 x 1024 (32 MB) and 5% at 16384 x 2048 (64 MB), timed with L2 flushed
# between calls (H100, bf16, 2026-11-27).  So the hint is given past twice L2.
# Without it, 4 rows of 2 warps were the fastest setting at 1024 columns (24.2 us
# against 25.1 for the rule's 8 warps and 24.6 for torch.compile), and at 2048
# columns 2 rows of 4 warps (47.2 us against 49.6 for the rule's 8 warps and 51.3 for
# torch.compile; H100, 16384 rows, 5 interleaved rounds, 2026-11-28).
_FWD_TUNED_NO_HINT = {1024: (4, 2), 2048: (2, 4)}  # rows per program, num_warps


def _x_evict(x: torch.Tensor) -> str:
    if not x.is_cuda:  # the interpreter and meta tensors: no policy to tune
        return ""
    big = x.numel() * x.element_size() > 2 * _l2_bytes(x.get_device())
    return "evict_last" if bool(big) else ""  # a plain bool even for symbolic shapes


@functools.cache
def _l2_bytes(index: int) -> int:
    return torch.cuda.get_device_properties(index).L2_cache_size


def fwd_config(n_cols: int) -> tuple[int, int, int]:
    """``(BLOCK_N, rows per program, num_warps)`` of :func:`rms_norm_fwd_kernel` for rows
    of ``n_cols``; rows longer than :data:`FWD_CHUNKED_THRESHOLD` take the chunked kernel."""
    return norms.fwd_rule(n_cols)


def bwd_config(n_cols: int) -> tuple[int, int, int, int]:
    """``(BLOCK_N, rows per loop step, num_warps, programs per SM)`` of
    :func:`rms_norm_bwd_kernel` for rows of ``n_cols``; rows longer than
    :data:`BWD_CHUNKED_THRESHOLD` take the chunked kernels."""
    return norms.bwd_rule(n_cols)


# Long rows (``benchmarks/rms_norm.py --tune-long``: H100, bf16, 2**26 elements,
# triton 3.6).  The chunked forward's first walk loads chunks of 32768 with 32
# warps, as the whole-row forward does at 32768 columns (32 values per thread, 62
# registers), one program per SM: at 65536 columns only 132 rows (16 MiB of bf16)
# then wait in L2 for their second walk, and it moves 2600 GB/s, where three full
# passes over HBM would cap it near 2000.  Smaller chunks, more programs per SM or
# one program per row were all slower (1840-2400 GB/s).  The backward's column
# chunks take the short-row backward's settings for rows of one chunk (4096: one
# row per step, 8 warps, 2 programs per SM), and the dot kernel the forward's; at
# 65536 that gives 1690 GB/s, against 1530-1690 for the other settings tried and a
# ceiling near 1800 for its 10 bytes of traffic per bf16 element.


def _fwd_plan(x, store_rstd=True, rows=None, num_warps=None, chunked=None, chunk=None,
              per_sm=None):  # fmt: skip
    """(kernel, grid, constexprs and options) of the forward launch for a 2-D ``x``;
    ``store_rstd=False`` (no backward follows) lets the whole-row kernel skip rstd."""
    n_cols = x.shape[1]
    if n_cols > FWD_CHUNKED_THRESHOLD if chunked is None else chunked:
        kernel = rms_norm_fwd_chunked_kernel
        return norms.chunked_fwd_plan(_OP, x, kernel, CHUNK_FWD, 1024, {}, rows, num_warps,
                                      chunk, per_sm)  # fmt: skip
    block_n, def_rows, def_warps = fwd_config(n_cols)
    evict = _x_evict(x)
    if not evict and block_n in _FWD_TUNED_NO_HINT:
        def_rows, def_warps = _FWD_TUNED_NO_HINT[block_n]
    flags = {"STORE_RSTD": store_rstd, "X_EVICT": evict}
    return norms.row_fwd_plan(_OP, x, rms_norm_fwd_kernel, block_n, rows or def_rows,
                              num_warps or def_warps, flags)  # fmt: skip


def _plan(x: torch.Tensor, weight: torch.Tensor, grad: bool, *settings) -> norms.FwdPlan:
    """The forward plan of a call on ``x`` (any shape and strides); ``grad``: rstd is kept."""
    return norms.plan(x, _fwd_plan, 1, grad, *settings)


def launch_rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *,
    rows_per_program: int | None = None, num_warps: int | None = None,
    chunked: bool | None = None, chunk: int | None = None, programs_per_sm: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Run the forward kernel on a checked 2-D ``x`` with unit column stride.

    Returns ``(y, rstd)``: ``y`` contiguous with ``x``'s shape and dtype, ``rstd``
    fp32 of shape ``(n_rows,)``.  ``chunked`` picks the kernel (default: the chunked
    one for rows longer than :data:`FWD_CHUNKED_THRESHOLD`).  The other keywords
    override the heuristic (the benchmark sweeps them): ``rows_per_program`` for
    the whole-row kernel, ``chunk`` and ``programs_per_sm`` for the chunked one.
    """
    plan = _plan(x, weight, True, rows_per_program, num_warps, chunked, chunk, programs_per_sm)
    y, rstd, _ = norms.forward(plan, x, (weight,), eps)
    return y, rstd


_BWD_KERNELS = (rms_norm_bwd_kernel, rms_norm_bwd_dot_kernel, rms_norm_bwd_chunked_kernel)


def _bwd_plan(x, _w=None, needs=(True, False), shape=None, strides=None, rows=None,
              warps=None, per_sm=None, chunked=None, chunk=None) -> norms.BwdPlan:  # fmt: skip
    """The backward's launches for a 2-D ``x`` (:func:`tilebook.ops.norms.bwd_plan`)."""
    if chunked is None:
        chunked = x.shape[1] > BWD_CHUNKED_THRESHOLD
    return norms.bwd_plan(
        _OP, x, _BWD_KERNELS, bwd_config, sums=1, needs=(True, False), flags={},
        settings=(rows, warps, per_sm, chunk), chunked=chunked, chunk=CHUNK_BWD, shape=shape,
        strides=strides,
    )  # fmt: skip


def launch_rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, *,
    rows_per_program: int | None = None, num_warps: int | None = None,
    programs_per_sm: int | None = None, chunked: bool | None = None, chunk: int | None = None,
    via=None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Run the backward kernels on checked 2-D ``dy`` and ``x`` (unit column stride).

    Returns ``(dx, dweight)`` in the dtypes of ``x`` and ``weight``.  ``chunked``
    picks the kernels (default: the chunked ones for rows longer than
    :data:`BWD_CHUNKED_THRESHOLD`); ``chunk`` is their column chunk, and the other
    keywords override the heuristic for the whole-row kernel or, chunked, for
    :func:`rms_norm_bwd_chunked_kernel`.  ``via``: the launcher (default:
    :func:`tilebook._launch.launch`; the operator's body passes its own).
    """
    strides = (dy.stride(0), x.stride(0), x.shape[1])
    plan = _bwd_plan(x, None, (True, False), None, strides, rows_per_program, num_warps,
                     programs_per_sm, chunked, chunk)  # fmt: skip
    dx, dw, _ = norms.backward(plan, dy, x, weight, rstd, x.dtype, via)
    return dx, dw


# ---------------------------------------------------------------------------
# The torch.library operators (what torch.compile traces; see tilebook.ops.library)
# ---------------------------------------------------------------------------


def _op_forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)`` for a 2-D ``x`` with unit column stride and a contiguous weight."""
    plan = norms.FwdPlan(_fwd_plan(x) if x.numel() else None, x, x, (x.shape[0],), True)
    y, rstd, _ = norms.forward(plan, x, (weight,), eps, via=library.launch)
    return y, rstd


def _op_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)`` for 2-D ``dy`` and ``x`` with unit column stride."""
    return launch_rms_norm_bwd(dy, x, weight, rstd, via=library.launch)


_FWD_KERNELS = (rms_norm_fwd_kernel, rms_norm_fwd_chunked_kernel)
rms_norm_op, rms_norm_backward_op = norms.define_ops(
    _OP, _op_forward, _op_backward, (*_FWD_KERNELS, *_BWD_KERNELS, sum_partials_kernel)
)


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The five kernels as jobs of :func:`tilebook.course.aot.compile_many` for ``sm_<arch>``,
    configured as the launchers configure them: rows of 4096 (whole rows in
    registers) and of 65536 (the chunked kernels)."""
    return norms.norm_compile_jobs(
        arch, dtype, lambda x, w: _op_forward(x, w, 1e-6),
        lambda x, w, rstd: _op_backward(x, x, w, rstd), 1,
        ((64, 4096, True, True), (8, 65536, True, True)),
    )  # fmt: skip


# ---------------------------------------------------------------------------
# Autograd and the public function
# ---------------------------------------------------------------------------

_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


class RMSNormFunction(torch.autograd.Function):
    """Autograd for :func:`rms_norm` (``weight`` with unit stride): the kernels, or,
    inside ``torch.compile``, the operators.

    ``plan`` is the call's forward plan (:class:`tilebook.ops.norms.FwdPlan`, one that
    keeps rstd; default: planned here).  It is plumbing of :func:`rms_norm` and gets no
    gradient; the backward's plan is kept on it (:func:`tilebook.ops.norms.backward_of`).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, plan=None):
        if _compiling():
            return norms.traced_forward(ctx, rms_norm_op, x, weight, eps)
        ctx.plan = plan = plan or _plan(x, weight, True)
        y, rstd, x2 = norms.forward(plan, x, (weight,), eps)
        ctx.save_for_backward(x2, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        if _compiling():
            dx, dw = norms.traced_backward(rms_norm_backward_op, dy, x2, weight, rstd)
        else:
            dx, dw, _ = norms.backward_of(ctx.plan, _bwd_plan, dy, x2, weight, rstd, (True, False))
        need_x, need_w = ctx.needs_input_grad[:2]
        return (dx if need_x else None), (dw if need_w else None), None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension, with a learned scale.

    Computes ``x * rsqrt(mean(x**2, -1) + eps) * weight`` in fp32 and returns it in
    ``x.dtype``; the same as ``torch.nn.functional.rms_norm(x, (H,), weight, eps)``
    up to rounding.  Differentiable with respect to ``x`` and ``weight``.

    Inside ``torch.compile`` the call is traced to the operators
    ``torch.ops.tilebook.rms_norm`` and ``rms_norm_backward`` (:mod:`tilebook.ops.library`):
    no graph break, and Inductor sees the kernels.

    Parameters
    ----------
    x
        Tensor of shape ``(..., H)``, float16, bfloat16 or float32, on tilebook's
        device.  Any strides: rows that are not evenly strided are copied first.
        ``H`` may be at most :data:`MAX_HIDDEN` (``2**20``); long rows take the
        chunked kernels.
    weight
        1-D tensor of size ``H`` on ``x``'s device, with ``x``'s dtype or, for a
        float16 or bfloat16 ``x``, float32 (mixed precision: its gradient is then
        float32 too).
    eps
        Positive number added to the mean square, for stability.

    Examples
    --------
    >>> y = tilebook.rms_norm(x, weight, eps=1e-6)   # doctest: +SKIP
    """
    if autocasting(x):
        x, weight = upper("rms_norm", x, weight)  # as torch's rms_norm under autocast
    key = plan = None
    if not _compiling() and plain(x) and plain(weight):
        # A repeat call: its key fixes everything the checks and the plan looked at
        # but eps (a runtime argument of the kernels, so it may differ).
        grad = (x.requires_grad or weight.requires_grad) and _grad_enabled()
        key = call_key(x, weight, None, _plan, grad, FWD_CHUNKED_THRESHOLD, CHUNK_FWD,
                       BWD_CHUNKED_THRESHOLD, CHUNK_BWD)  # fmt: skip
        plan = PLANS.get(key)
        if plan is not None and type(eps) is float and 0 < eps < math.inf:
            if grad:
                return RMSNormFunction.apply(x, weight, eps, plan)
            return norms.forward(plan, x, (weight,), eps)[0]
    eps = norms.check_args(_OP, x, eps, False, weight=weight)
    grad = (x.requires_grad or weight.requires_grad) and _grad_enabled()
    w = weight.contiguous()  # the kernels read weight with unit stride (a copy is recorded)
    if _compiling():  # traced: the Function calls the operators
        return RMSNormFunction.apply(x, w, eps)
    if plan is None:
        plan = _plan(x, w, grad)
        if key is not None and w is weight:
            PLANS.remember(key, plan)
    if grad:
        return RMSNormFunction.apply(x, w, eps, plan)
    return norms.forward(plan, x, (w,), eps)[0]
