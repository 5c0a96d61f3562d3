"""LayerNorm, forward and backward: its kernels, one launcher per direction, its
autograd and its ``torch.library`` operator.

``y = (x - mean) * rstd * weight + bias`` with ``rstd = 1 / sqrt(var + eps)``, the
mean and (biased) variance taken over the last dimension: ``F.layer_norm(x, (N,),
weight, bias, eps)``; ``weight`` and ``bias`` are each optional.  The kernels share
out the work as :mod:`tilebook.ops.rms_norm`'s do, and everything around them
(configuration, plans of repeat calls, checks, the backward's partial sums) is
:mod:`tilebook.ops.norms`'.  Here: the math, in five kernels of some 270 lines (two
row statistics, two sums over rows and optional parameters make them the longest of
the norms), with their measured reasons: they make the module longer than 500 lines.

* Forward: the mean, then the variance of ``x - mean`` (two reductions over
  registers, so no cancellation); ``mean`` and ``rstd`` (fp32, per row) are kept.
  Long rows (:func:`layer_norm_fwd_chunked_kernel`): the first walk sums ``x - k``
  and ``(x - k)**2`` lane by lane, ``k`` the mean of the row's first chunk (a shift
  close to the mean keeps ``E[(x-k)^2] - E[x-k]^2`` free of cancellation); the second
  (newest chunk first) writes ``y``.
* Backward: ``dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))`` with ``g = dy *
  weight``; ``dweight = sum(dy * x_hat)`` and ``dbias = sum(dy)`` over all rows.  The
  two accumulators cost registers, so at 16384 columns whole rows spill; one way out
  is kept as an option (``col_splits``: programs sharing a row, each keeping the
  accumulators for its share of the columns), though the chunked kernels
  (:func:`layer_norm_bwd_dot_kernel`, :func:`layer_norm_bwd_chunked_kernel`) beat it.

All arithmetic is fp32 whatever the storage dtype.  A constant row has variance 0
and ``x_hat = 0``: ``y = bias`` (finite, as ``eps > 0``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._launch import PLANS, call_key, plain
from . import library, norms

# Bare names for the kernels, as in rms_norm (Inductor re-emits the kernels).
from .norms import MAX_HIDDEN, columns, row_sums, row_tile, walk_row
from .partials import sum_partials_kernel
from .precision import autocasting, upper
from .rows import load_rows, store_rows

__all__ = [
    "BWD_CHUNKED_THRESHOLD",
    "CHUNK_BWD",
    "CHUNK_FWD",
    "FWD_CHUNKED_THRESHOLD",
    "MAX_HIDDEN",
    "LayerNormFunction",
    "compile_jobs",
    "launch_layer_norm_bwd",
    "launch_layer_norm_fwd",
    "layer_norm",
    "layer_norm_bwd_chunked_kernel",
    "layer_norm_bwd_dot_kernel",
    "layer_norm_bwd_kernel",
    "layer_norm_fwd_chunked_kernel",
    "layer_norm_fwd_kernel",
]

#: Rows longer than this take the chunked forward (whole rows in registers start
#: to spill past 32768 columns, as in rms_norm).  Module-level so tests can lower it.
FWD_CHUNKED_THRESHOLD = 32768
# At 16384 columns column splits measured 1525 GB/s against 1658 chunked (H100,
# bf16, 2**26 elements, launchers only).
#: Rows longer than this take the chunked backward: at 16384 columns whole rows
#: spill (236 bytes), and the chunked kernels beat column splits.
BWD_CHUNKED_THRESHOLD = 8192
#: Chunk widths (powers of two) of the chunked kernels; tests set them small.
CHUNK_FWD = 16384
CHUNK_BWD = 4096


# ---------------------------------------------------------------------------
# Whole rows in registers
# ---------------------------------------------------------------------------


@triton.jit
def _centred(x, mean, mask, EVEN: tl.constexpr):
    # Padding columns (masked) must not add (0 - mean)**2 to the variance.
    xc = x - mean[:, None]
    return xc if EVEN else tl.where(mask, xc, 0.0)


@triton.jit
def layer_norm_fwd_kernel(
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,) or unused (HAS_W False)
    b_ptr,  # (n_cols,) or unused (HAS_B False)
    y_ptr,  # (n_rows, n_cols), unit stride along a row
    stats_ptr,  # (2, n_rows) fp32: mean, then rstd
    n_rows, n_cols, x_row_stride, y_row_stride, eps,
    BLOCK_N: tl.constexpr,  # next power of two >= n_cols
    ROWS: tl.constexpr,  # rows per program
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    RELOAD: tl.constexpr,  # read x again for y (from L2) instead of keeping it in registers
    EVEN: tl.constexpr,  # n_cols == BLOCK_N and ROWS divides n_rows: no masks at all
):  # fmt: skip
    cols, col_ok = columns(0, n_cols, BLOCK_N)
    rows, row_ok, mask, rows64 = row_tile(tl.program_id(0) * ROWS, ROWS, n_rows, col_ok)
    x_ptrs = x_ptr + rows64 * x_row_stride + cols[None, :]

    # evict_last measured faster than no hint for rms_norm's same access pattern.
    x = load_rows(x_ptrs, mask, EVEN, "evict_last")
    mean = tl.sum(x, axis=1) / n_cols
    xc = _centred(x, mean, mask, EVEN)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
    if RELOAD:
        # evict_last above kept the row in L2: its last use may leave it now.
        xc = _centred(load_rows(x_ptrs, mask, EVEN, "evict_first"), mean, mask, EVEN)
    y = xc * rstd[:, None]
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        y = y * w.to(tl.float32)[None, :]
    if HAS_B:
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        y = y + b.to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows64 * y_row_stride + cols[None, :]
    store_rows(y_ptrs, y.to(y_ptr.dtype.element_ty), mask, EVEN)
    store_rows(stats_ptr + rows, mean, row_ok, EVEN)
    store_rows(stats_ptr + n_rows + rows, rstd, row_ok, EVEN)


@triton.jit
def layer_norm_bwd_kernel(
    dy_ptr, x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,) or unused (HAS_W False)
    stats_ptr,  # (2, n_rows) fp32 from the forward: mean, rstd
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    partial_ptr,  # (num_programs(1), 2, n_cols) fp32: dweight, dbias per program
    n_rows, n_cols, dy_row_stride, x_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr,  # next power of two >= n_cols
    ROWS: tl.constexpr,  # rows per loop step
    COL_SPLITS: tl.constexpr,  # programs that share a row, each owning BLOCK_N // COL_SPLITS
    HAS_W: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)  # which slice of the columns this program owns
    pid = tl.program_id(1)
    n_progs = tl.num_programs(1)
    SLICE: tl.constexpr = BLOCK_N // COL_SPLITS
    cols, col_ok = columns(0, n_cols, BLOCK_N)
    own = split * SLICE + tl.arange(0, SLICE)
    own_ok = own < n_cols
    dw_acc = tl.zeros((ROWS, SLICE), dtype=tl.float32)
    db_acc = tl.zeros((ROWS, SLICE), dtype=tl.float32)

    # Grid-stride loop: neighbouring programs take neighbouring row blocks, so at
    # any moment the grid streams through one region of memory (and the programs
    # that share a row read it at the same time).
    for start in range(pid * ROWS, n_rows, n_progs * ROWS):
        rows, row_ok, mask, rows64 = row_tile(start, ROWS, n_rows, col_ok)
        # Rows past the end get mean = rstd = 0 and dy = 0: they add nothing.
        mean = tl.load(stats_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(stats_ptr + n_rows + rows, mask=row_ok, other=0.0)
        x = tl.load(x_ptr + rows64 * x_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows64 * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        # Padding columns load x = 0, which is not x_hat = 0: mask them out.
        x_hat = tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
        g = dy.to(tl.float32)
        if HAS_W:
            # Reloaded each step (an L1 hit) rather than held across the loop: the
            # registers are better spent on the accumulators.
            w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            g = g * w[None, :]
        # d/dx of (x - mean) * rstd: the direct term minus the terms through the
        # mean's and rstd's dependence on every element of the row.
        c1 = tl.sum(g, axis=1) / n_cols
        c2 = tl.sum(g * x_hat, axis=1) / n_cols

        if COL_SPLITS > 1:
            # This program's slice again: an L1 or L2 hit, since the row was just read.
            omask = row_ok[:, None] & own_ok[None, :]
            x = tl.load(x_ptr + rows64 * x_row_stride + own[None, :], mask=omask, other=0.0)
            dy = tl.load(dy_ptr + rows64 * dy_row_stride + own[None, :], mask=omask, other=0.0)
            x_hat = tl.where(omask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
            g = dy.to(tl.float32)
            if HAS_W:
                w = tl.load(w_ptr + own, mask=own_ok, other=0.0).to(tl.float32)
                g = g * w[None, :]
        else:
            omask = mask
        dx = (g - c1[:, None] - x_hat * c2[:, None]) * rstd[:, None]
        tl.store(
            dx_ptr + rows64 * dx_row_stride + own[None, :],
            dx.to(dx_ptr.dtype.element_ty),
            mask=omask,
        )
        if NEED_DW:
            dw_acc += dy.to(tl.float32) * x_hat
        if NEED_DB:
            db_acc += dy.to(tl.float32)

    out = partial_ptr + pid * 2 * n_cols + own
    if NEED_DW:
        tl.store(out, tl.sum(dw_acc, axis=0), mask=own_ok)
    if NEED_DB:
        tl.store(out + n_cols, tl.sum(db_acc, axis=0), mask=own_ok)


# ---------------------------------------------------------------------------
# Long rows: chunked kernels
# ---------------------------------------------------------------------------


@triton.jit
def layer_norm_fwd_chunked_kernel(
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr, b_ptr,
    y_ptr,  # (n_rows, n_cols), unit stride along a row
    stats_ptr,  # (2, n_rows) fp32: mean, then rstd
    n_rows, n_cols, x_row_stride, y_row_stride, eps,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    # A persistent grid, as in rms_norm_fwd_chunked_kernel.
    for i in tl.range(0, tl.cdiv(n_rows - tl.program_id(0), tl.num_programs(0))):
        row, x_row, y_row = walk_row(i, x_ptr, y_ptr, x_row_stride, y_row_stride)
        # The shift k: the first chunk's mean, close to the row's.
        x0 = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        k = tl.sum(x0, axis=0) / tl.minimum(n_cols, BLOCK_N)
        # Lane-wise sums, reduced once per row: no block-wide reduction per chunk.
        s1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        s2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for c in tl.range(0, n_chunks):
            offs = c * BLOCK_N + cols
            m = offs < n_cols
            # evict_last: the second walk wants to find this chunk in L2.
            x = tl.load(x_row + offs, mask=m, other=0.0, eviction_policy="evict_last")
            d = tl.where(m, x.to(tl.float32) - k, 0.0)
            s1 += d
            s2 += d * d
        d_mean = tl.sum(s1, axis=0) / n_cols
        var = tl.maximum(tl.sum(s2, axis=0) / n_cols - d_mean * d_mean, 0.0)
        mean = k + d_mean
        rstd = tl.rsqrt(var + eps)
        tl.store(stats_ptr + row, mean)
        tl.store(stats_ptr + n_rows + row, rstd)
        for j in tl.range(0, n_chunks):
            offs = (n_chunks - 1 - j) * BLOCK_N + cols  # newest chunk first: still in L2
            m = offs < n_cols
            x = tl.load(x_row + offs, mask=m, other=0.0, eviction_policy="evict_first")
            y = (x.to(tl.float32) - mean) * rstd
            if HAS_W:
                y = y * tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
            tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def layer_norm_bwd_dot_kernel(
    dy_ptr, x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,
    stats_ptr,  # (2, n_rows) fp32: mean, rstd
    dot_ptr,  # (2, n_rows, n_chunks) fp32: sum(g), sum(g * x_hat) per row chunk
    n_rows, n_cols, dy_row_stride, x_row_stride,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
    HAS_W: tl.constexpr,
):  # fmt: skip
    # One program per (row, chunk), row-major: the grid streams through memory in
    # order, and program pid's partial sums land at dot_ptr + pid.
    pid = tl.program_id(0)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    row = pid // n_chunks
    row64 = row.to(tl.int64)
    cols = (pid % n_chunks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    mean = tl.load(stats_ptr + row)
    rstd = tl.load(stats_ptr + n_rows + row)
    x = tl.load(x_ptr + row64 * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(dy_ptr + row64 * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_W:
        g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x_hat = tl.where(mask, (x - mean) * rstd, 0.0)
    tl.store(dot_ptr + pid, tl.sum(g, axis=0))
    tl.store(dot_ptr + n_rows * n_chunks + pid, tl.sum(g * x_hat, axis=0))


@triton.jit
def layer_norm_bwd_chunked_kernel(
    dy_ptr, x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,
    stats_ptr,  # (2, n_rows) fp32: mean, rstd
    dot_ptr,  # (2, n_rows, n_dots) fp32, from layer_norm_bwd_dot_kernel
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    partial_ptr,  # (num_programs(1), 2, n_cols) fp32
    n_rows, n_cols, n_dots, dy_row_stride, x_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr,  # column chunk of this program, a power of two
    ROWS: tl.constexpr,  # rows per loop step
    DOTS: tl.constexpr,  # next power of two >= n_dots
    HAS_W: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
):  # fmt: skip
    # Program (chunk, split) owns columns [chunk * BLOCK_N, (chunk + 1) * BLOCK_N)
    # and every num_programs(1)-th row block: its share of dweight and dbias for
    # those columns stays in registers, as in layer_norm_bwd_kernel.
    split = tl.program_id(1)
    cols, col_ok = columns(tl.program_id(0) * BLOCK_N, n_cols, BLOCK_N)
    n_blocks = tl.cdiv(n_rows, ROWS)
    dw_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    db_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    # Last row block first, as in rms_norm_bwd_chunked_kernel.
    for b in tl.range(split, n_blocks, tl.num_programs(1)):
        rows, row_ok, mask, rows64 = row_tile((n_blocks - 1 - b) * ROWS, ROWS, n_rows, col_ok)
        # The whole row's sums, from its chunks' partial sums.
        c1 = row_sums(dot_ptr, rows, row_ok, n_dots, DOTS) / n_cols
        c2 = row_sums(dot_ptr + n_rows * n_dots, rows, row_ok, n_dots, DOTS) / n_cols
        # Rows past the end get rstd = 0 and dy = 0: they add nothing.
        mean = tl.load(stats_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(stats_ptr + n_rows + rows, mask=row_ok, other=0.0)

        x = tl.load(x_ptr + rows64 * x_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows64 * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = dy.to(tl.float32)
        x_hat = tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
        g = dy
        if HAS_W:
            g = g * tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        dx = (g - c1[:, None] - x_hat * c2[:, None]) * rstd[:, None]
        tl.store(
            dx_ptr + rows64 * dx_row_stride + cols[None, :],
            dx.to(dx_ptr.dtype.element_ty),
            mask=mask,
        )
        if NEED_DW:
            dw_acc += dy * x_hat
        if NEED_DB:
            db_acc += dy

    out = partial_ptr + split * 2 * n_cols + cols
    if NEED_DW:
        tl.store(out, tl.sum(dw_acc, axis=0), mask=col_ok)
    if NEED_DB:
        tl.store(out + n_cols, tl.sum(db_acc, axis=0), mask=col_ok)


# ---------------------------------------------------------------------------
# Launchers: configuration, then one launcher per direction
# ---------------------------------------------------------------------------

_OP = "layer_norm"

# Winners of `benchmarks/layer_norm.py --tune` (H100, bf16, 2**26 elements, triton
# 3.6) where they differ from the rules of tilebook.ops.norms; every other candidate
# was within 2%.  At 1024 every setting is at the copy bandwidth, torch.compile's
# too; one row per program of 4 warps was the one ahead of it beyond the spread (1%).
_FWD_TUNED = {1024: (1, 4)}  # rows per program, num_warps
# Widths whose forward reads x a second time for y, as Inductor's kernel does: at
# 4096 x 16384 it took 94.6 us against 96.0 keeping x in registers and 95.5 for
# torch.compile; at 8192 columns it was slower (94.6 against 93.8).  H100, bf16,
# 5 interleaved rounds, spread under 0.8 us.
_FWD_RELOAD = frozenset({16384})
_BWD_TUNED = {2048: (2, 8, 2)}  # rows per step, num_warps, programs per SM


def _fwd_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, rows per program, num_warps) for :func:`layer_norm_fwd_kernel`."""
    block_n, rows, warps = norms.fwd_rule(n_cols)
    return (block_n, *_FWD_TUNED.get(block_n, (rows, warps)))


def _bwd_config(n_cols: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, rows per loop step, num_warps, programs per SM, column splits) for
    :func:`layer_norm_bwd_kernel`.  No column splits: they measured slower wherever
    whole rows fit, and past that the chunked kernels beat them."""
    # Column splits against whole rows (H100, bf16): 966 against 2249 GB/s at 8192
    # columns, 1666 against 2250 at 4096.
    block_n, *rule = norms.bwd_rule(n_cols)
    return (block_n, *_BWD_TUNED.get(block_n, rule), 1)


def _bwd_rule(n_cols: int) -> tuple[int, int, int, int]:
    return _bwd_config(n_cols)[:4]


def _fwd_plan(x, weight, bias, rows=None, num_warps=None, chunked=None, chunk=None,
              per_sm=None):  # fmt: skip
    """(kernel, grid, constexprs and options) of the forward launch for a 2-D ``x``."""
    n_cols = x.shape[1]
    flags = {"HAS_W": weight is not None, "HAS_B": bias is not None}
    if n_cols > FWD_CHUNKED_THRESHOLD if chunked is None else chunked:
        # rms_norm's chunked forward loads 32768-wide chunks with 32 warps; this one
        # keeps two lane-wise sums instead of one, which at 32 values per thread spills
        # (152 bytes), so it takes 16384-wide chunks: 16 values per thread.
        kernel = layer_norm_fwd_chunked_kernel
        return norms.chunked_fwd_plan(_OP, x, kernel, CHUNK_FWD, 512, flags, rows, num_warps,
                                      chunk, per_sm)  # fmt: skip
    block_n, def_rows, def_warps = _fwd_config(n_cols)
    flags["RELOAD"] = block_n in _FWD_RELOAD
    return norms.row_fwd_plan(_OP, x, layer_norm_fwd_kernel, block_n, rows or def_rows,
                              num_warps or def_warps, flags)  # fmt: skip


def _plan(x: torch.Tensor, weight, bias, *settings) -> norms.FwdPlan:
    """The forward plan of a call on ``x`` (any shape and strides)."""
    return norms.plan(x, _fwd_plan, 2, weight, bias, *settings)


def _params(x, weight, bias) -> tuple:
    # An absent weight or bias is never read (HAS_W / HAS_B False): x keeps the signature.
    return (x if weight is None else weight, x if bias is None else bias)


def launch_layer_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float, *,
    rows_per_program: int | None = None, num_warps: int | None = None,
    chunked: bool | None = None, chunk: int | None = None, programs_per_sm: int | None = None,
    via=None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Run the forward kernel on a checked 2-D ``x`` with unit column stride.

    Returns ``(y, stats)``: ``y`` contiguous with ``x``'s shape and dtype, ``stats``
    fp32 of shape ``(2, n_rows)`` holding each row's mean and rstd.  ``chunked``
    picks the kernel (default: the chunked one for rows longer than
    :data:`FWD_CHUNKED_THRESHOLD`); the other keywords override the heuristic.
    ``via``: the launcher (default: :func:`tilebook._launch.launch`).
    """
    settings = (rows_per_program, num_warps, chunked, chunk, programs_per_sm)
    launch = _fwd_plan(x, weight, bias, *settings) if x.numel() else None
    # x is rows already: no data pointers to compare (the operator's body sees fakes).
    plan = norms.FwdPlan(launch, x, x, (2, x.shape[0]), True)
    y, stats, _ = norms.forward(plan, x, _params(x, weight, bias), eps, via)
    return y, stats


_BWD_KERNELS = (layer_norm_bwd_kernel, layer_norm_bwd_dot_kernel, layer_norm_bwd_chunked_kernel)


def _bwd_plan(x, weight, needs, shape=None, strides=None, rows=None, warps=None, per_sm=None,
              splits=None, chunked=None, chunk=None) -> norms.BwdPlan:  # fmt: skip
    """The backward's launches for a 2-D ``x`` (:func:`tilebook.ops.norms.bwd_plan`)."""
    n_cols = x.shape[1]
    if chunked is None:
        chunked = n_cols > BWD_CHUNKED_THRESHOLD
    if not chunked:
        splits = splits or _bwd_config(n_cols)[4]
    flags = {"HAS_W": weight is not None, "NEED_DW": needs[0], "NEED_DB": needs[1]}
    return norms.bwd_plan(
        _OP, x, _BWD_KERNELS, _bwd_rule, sums=2, needs=needs, flags=flags,
        settings=(rows, warps, per_sm, chunk), chunked=chunked, chunk=CHUNK_BWD,
        col_splits=splits, shape=shape, strides=strides,
    )  # fmt: skip


def launch_layer_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor, *,
    need_dw: bool | None = None, need_db: bool = True,
    rows_per_program: int | None = None, num_warps: int | None = None,
    programs_per_sm: int | None = None, col_splits: int | None = None,
    chunked: bool | None = None, chunk: int | None = None, via=None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """Run the backward kernels on checked 2-D ``dy`` and ``x`` (unit column stride).

    Returns ``dx`` in ``x``'s dtype and ``dweight`` and ``dbias`` in the weight's
    (``x``'s, or float32); ``dweight`` is None unless ``need_dw`` (default: whether there
    is a weight), ``dbias`` None unless ``need_db``.  ``chunked`` picks the kernels
    (default: the chunked ones for rows longer than :data:`BWD_CHUNKED_THRESHOLD`);
    the other keywords override the heuristic.  ``via``: the launcher.
    """
    need_dw = weight is not None if need_dw is None else need_dw
    if need_dw and weight is None:
        raise ValueError("layer_norm: dweight needs a weight")
    strides = (dy.stride(0), x.stride(0), x.shape[1])
    plan = _bwd_plan(x, weight, (need_dw, need_db), None, strides, rows_per_program, num_warps,
                     programs_per_sm, col_splits, chunked, chunk)  # fmt: skip
    return norms.backward(plan, dy, x, weight, stats, x.dtype, via)


# ---------------------------------------------------------------------------
# The torch.library operators (what torch.compile traces; see tilebook.ops.library)
# ---------------------------------------------------------------------------


def _op_forward(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, stats)`` for a 2-D ``x`` with unit column stride and contiguous parameters."""
    return launch_layer_norm_fwd(x, weight, bias, eps, via=library.launch)


def _op_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    stats: torch.Tensor,
    need_dw: bool,
    need_db: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dweight, dbias)`` for 2-D ``dy`` and ``x`` with unit column stride; a
    gradient not asked for is an empty tensor."""
    dx, dw, db = launch_layer_norm_bwd(
        dy, x, weight, stats, need_dw=need_dw, need_db=need_db, via=library.launch
    )
    # Outputs may not alias one another: a fresh empty tensor for each one absent.
    return dx, x.new_empty(0) if dw is None else dw, x.new_empty(0) if db is None else db


layer_norm_op, layer_norm_backward_op = norms.define_ops(
    _OP, _op_forward, _op_backward, (layer_norm_fwd_kernel, layer_norm_fwd_chunked_kernel,
                                     *_BWD_KERNELS, sum_partials_kernel)
)  # fmt: skip


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The six kernels as jobs of :func:`tilebook.course.aot.compile_many` for ``sm_<arch>``,
    configured as the launchers configure them, with a weight and a bias: rows of 4096
    (whole rows), of 16384 (the chunked backward) and of 65536 (the chunked forward)."""
    return norms.norm_compile_jobs(
        arch, dtype, lambda x, w: _op_forward(x, w, w, 1e-5),
        lambda x, w, stats: _op_backward(x, x, w, stats, True, True), 2,
        ((64, 4096, True, True), (8, 16384, False, True), (8, 65536, True, False)),
    )  # fmt: skip


# ---------------------------------------------------------------------------
# Autograd and the public function
# ---------------------------------------------------------------------------

_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


class LayerNormFunction(torch.autograd.Function):
    """Autograd for :func:`layer_norm` (``weight`` and ``bias`` with unit stride): the
    kernels, or, inside ``torch.compile``, the operators.

    ``plan`` is the call's forward plan (:class:`tilebook.ops.norms.FwdPlan`; default:
    planned here): plumbing of :func:`layer_norm`, with no gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, plan=None) -> torch.Tensor:
        if _compiling():
            return norms.traced_forward(ctx, layer_norm_op, x, weight, bias, eps)
        ctx.plan = plan = plan or _plan(x, weight, bias)
        y, stats, x2 = norms.forward(plan, x, _params(x, weight, bias), eps)
        ctx.save_for_backward(x2, weight, stats)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, stats = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        needs = (need_w and weight is not None, need_b)
        if _compiling():
            op = layer_norm_backward_op
            dx, dw, db = norms.traced_backward(op, dy, x2, weight, stats, *needs)
        else:
            dx, dw, db = norms.backward_of(ctx.plan, _bwd_plan, dy, x2, weight, stats, needs)
        dw, db = (dw if needs[0] else None), (db if needs[1] else None)  # the operator's empties
        return (dx if need_x else None), dw, db, None, None


def _needs_grad(*ts) -> bool:
    return any(t is not None and t.requires_grad for t in ts) and _grad_enabled()


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Layer normalisation over the last dimension, with an optional scale and shift.

    Computes ``(x - mean) / sqrt(var + eps) * weight + bias`` (mean and biased
    variance over the last dimension) in fp32 and returns it in ``x.dtype``; the
    same as ``torch.nn.functional.layer_norm(x, (N,), weight, bias, eps)`` up to
    rounding.  Differentiable with respect to ``x``, ``weight`` and ``bias``; the
    gradients of ``weight`` and ``bias`` are summed without atomics, in a fixed
    order, so they are the same from run to run.

    Inside ``torch.compile`` the call is traced to the operators
    ``torch.ops.tilebook.layer_norm`` and ``layer_norm_backward`` (:mod:`tilebook.ops.library`):
    no graph break, and Inductor sees the kernels.

    Parameters
    ----------
    x
        Tensor of shape ``(..., N)`` (``N`` at most :data:`MAX_HIDDEN`, ``2**20``; long
        rows take the chunked kernels), float16, bfloat16 or float32, on tilebook's
        device.  Any strides: rows that are not evenly strided are copied first.
    weight, bias
        None, or 1-D tensors of size ``N`` on ``x``'s device, with ``x``'s dtype or,
        for a float16 or bfloat16 ``x``, both in float32 (mixed precision: their
        gradients are then float32 too).
    eps
        Positive number added to the variance, for stability.

    Examples
    --------
    >>> y = tilebook.layer_norm(x, weight, bias, eps=1e-5)   # doctest: +SKIP
    """
    if autocasting(x):  # as torch's layer_norm under autocast
        x, weight, bias = upper("layer_norm", x, weight, bias)
    key = plan = None
    if (not _compiling() and plain(x) and (weight is None or plain(weight))
            and (bias is None or plain(bias))):  # fmt: skip
        # A repeat call: its key fixes everything the checks and the plan looked at
        # but eps (a runtime argument of the kernels, so it may differ).
        key = call_key(x, weight, bias, _plan, FWD_CHUNKED_THRESHOLD, CHUNK_FWD,
                       BWD_CHUNKED_THRESHOLD, CHUNK_BWD)  # fmt: skip
        plan = PLANS.get(key)
        if plan is not None and type(eps) is float and 0 < eps < math.inf:
            if _needs_grad(x, weight, bias):
                return LayerNormFunction.apply(x, weight, bias, eps, plan)
            return norms.forward(plan, x, _params(x, weight, bias), eps)[0]
    eps = norms.check_args(_OP, x, eps, weight=weight, bias=bias)
    # The kernels read weight and bias with unit stride (a copy is recorded).
    w = None if weight is None else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    if _compiling():  # traced: the Function calls the operators
        return LayerNormFunction.apply(x, w, b, eps)
    if plan is None:
        plan = _plan(x, w, b)
        if key is not None and w is weight and b is bias:
            PLANS.remember(key, plan)
    if _needs_grad(x, weight, bias):
        return LayerNormFunction.apply(x, w, b, eps, plan)
    return norms.forward(plan, x, _params(x, w, b), eps)[0]
