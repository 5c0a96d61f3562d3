"""LayerNorm, forward and backward, as one ``torch.autograd.Function``.

``y = (x - mean) * rstd * weight + bias`` with ``rstd = 1 / sqrt(var + eps)``, the
mean and (biased) variance taken over the last dimension: ``F.layer_norm(x, (N,),
weight, bias, eps)``.  ``weight`` and ``bias`` are each optional.  One file holds
the kernels, their launchers and the autograd glue; it follows
:mod:`tilebook.ops.rms_norm`, whose structure it shares.

* Forward: one pass.  A program loads whole rows into registers, takes the mean,
  then the variance of ``x - mean`` (two reductions over registers, so no
  cancellation), and writes ``y``; ``x`` is read from memory once.  ``mean`` and
  ``rstd`` (fp32, one each per row) are kept for the backward pass.
* Backward: ``dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))`` with
  ``g = dy * weight``, row by row, and ``dweight = sum(dy * x_hat)``, ``dbias =
  sum(dy)``, sums over *all* rows.  No atomics or locks: a persistent grid (a few
  programs per SM) walks the rows, each program adds its rows' contributions into
  fp32 accumulators that stay in registers and writes them once, as one row of a
  ``(programs, 2, N)`` buffer; :func:`tilebook.ops.partials.sum_partials_kernel` adds that
  small buffer up (always in the same order: deterministic) and casts it.

  The two accumulators cost registers: at 16384 columns a program holding whole
  rows of ``x`` and ``dy`` *and* both accumulators spills.  One way out is kept
  as an option (``col_splits``), though it measured slower than the chunked
  kernels: ``COL_SPLITS`` programs share a row, each reading the whole row for the
  two row sums but keeping the accumulators and writing ``dx`` only for its share
  of the columns (the second read of a row is meant to hit L2).

**Long rows** (more than :data:`FWD_CHUNKED_THRESHOLD` columns forward,
:data:`BWD_CHUNKED_THRESHOLD` backward) take chunked kernels whose registers scale
with a chunk, not with ``N``, as in :mod:`tilebook.ops.rms_norm`:

* Forward (:func:`layer_norm_fwd_chunked_kernel`): a persistent program walks a
  row twice.  The first walk sums ``x - k`` and ``(x - k)**2`` lane by lane, with
  ``k`` the mean of the row's first chunk: a shift close to the mean keeps the
  one-pass variance ``E[(x-k)^2] - E[x-k]^2`` free of cancellation.  The second
  walk (newest chunk first: the likeliest still in L2) writes ``y``.
* Backward, in two kernels: :func:`layer_norm_bwd_dot_kernel` writes each (row,
  chunk)'s ``sum(g)`` and ``sum(g * x_hat)``; :func:`layer_norm_bwd_chunked_kernel`
  splits ``N`` across programs, each owning one column chunk and a share of the
  rows, adds up its rows' partial sums, writes ``dx`` and keeps ``dweight`` and
  ``dbias`` for its columns in registers.

All arithmetic is fp32 whatever the storage dtype.  A constant row has variance 0
and ``x_hat = 0``: ``y = bias`` (finite, as ``eps > 0``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._launch import (
    device_guard,
    direct_launch_enabled,
    launch,
    launcher_for,
    plain,
    sm_count,
)
from ..validation import check_tensor
from . import library
from .partials import SUM_BLOCK_C, SUM_BLOCK_P, sum_partials_grid, sum_partials_kernel
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

#: Largest hidden size: it only keeps launch sizes sane (long rows are chunked).
MAX_HIDDEN = 1 << 20

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
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    BLOCK_N: tl.constexpr,  # next power of two >= n_cols
    ROWS: tl.constexpr,  # rows per program
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    RELOAD: tl.constexpr,  # read x again for y (from L2) instead of keeping it in registers
    EVEN: tl.constexpr,  # n_cols == BLOCK_N and ROWS divides n_rows: no masks at all
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    # int64 row offsets: n_rows * stride passes 2**31 for large activations.
    rows64 = rows.to(tl.int64)[:, None]
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
    dy_ptr,  # (n_rows, n_cols), unit stride along a row
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,) or unused (HAS_W False)
    stats_ptr,  # (2, n_rows) fp32 from the forward: mean, rstd
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    partial_ptr,  # (num_programs(1), 2, n_cols) fp32: dweight, dbias per program
    n_rows,
    n_cols,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    BLOCK_N: tl.constexpr,  # next power of two >= n_cols
    ROWS: tl.constexpr,  # rows per loop step
    COL_SPLITS: tl.constexpr,  # programs that share a row, each owning BLOCK_N // COL_SPLITS
    HAS_W: tl.constexpr,
    NEED_DW: tl.constexpr,
    NEED_DB: tl.constexpr,
):
    split = tl.program_id(0)  # which slice of the columns this program owns
    pid = tl.program_id(1)
    n_progs = tl.num_programs(1)
    SLICE: tl.constexpr = BLOCK_N // COL_SPLITS
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    own = split * SLICE + tl.arange(0, SLICE)
    own_ok = own < n_cols
    dw_acc = tl.zeros((ROWS, SLICE), dtype=tl.float32)
    db_acc = tl.zeros((ROWS, SLICE), dtype=tl.float32)

    # Grid-stride loop: neighbouring programs take neighbouring row blocks, so at
    # any moment the grid streams through one region of memory (and the programs
    # that share a row read it at the same time).
    for start in range(pid * ROWS, n_rows, n_progs * ROWS):
        rows = start + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        rows64 = rows.to(tl.int64)[:, None]
        # Rows past the end get mean = rstd = 0 and dy = 0: they add nothing.
        mean = tl.load(stats_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(stats_ptr + n_rows + rows, mask=row_ok, other=0.0)

        mask = row_ok[:, None] & col_ok[None, :]
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
    w_ptr,
    b_ptr,
    y_ptr,  # (n_rows, n_cols), unit stride along a row
    stats_ptr,  # (2, n_rows) fp32: mean, then rstd
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
):
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    # A persistent grid: few rows are in flight at once, so that a row read by the
    # first walk is still in L2 when the second walk reads it again.
    for i in tl.range(0, tl.cdiv(n_rows - pid, n_progs)):
        row = pid + i * n_progs
        row64 = row.to(tl.int64)
        x_row = x_ptr + row64 * x_row_stride
        y_row = y_ptr + row64 * y_row_stride
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
    dy_ptr,  # (n_rows, n_cols), unit stride along a row
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,
    stats_ptr,  # (2, n_rows) fp32: mean, rstd
    dot_ptr,  # (2, n_rows, n_chunks) fp32: sum(g), sum(g * x_hat) per row chunk
    n_rows,
    n_cols,
    dy_row_stride,
    x_row_stride,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
    HAS_W: tl.constexpr,
):
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
    dy_ptr,  # (n_rows, n_cols), unit stride along a row
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,
    stats_ptr,  # (2, n_rows) fp32: mean, rstd
    dot_ptr,  # (2, n_rows, n_dots) fp32, from layer_norm_bwd_dot_kernel
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    partial_ptr,  # (num_programs(1), 2, n_cols) fp32
    n_rows,
    n_cols,
    n_dots,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    BLOCK_N: tl.constexpr,  # column chunk of this program, a power of two
    ROWS: tl.constexpr,  # rows per loop step
    DOTS: tl.constexpr,  # next power of two >= n_dots
    HAS_W: tl.constexpr,
    NEED_DW: tl.constexpr,
    NEED_DB: tl.constexpr,
):
    # Program (chunk, split) owns columns [chunk * BLOCK_N, (chunk + 1) * BLOCK_N)
    # and every num_programs(1)-th row block: its share of dweight and dbias for
    # those columns stays in registers, as in layer_norm_bwd_kernel.
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    parts = tl.arange(0, DOTS)
    n_blocks = tl.cdiv(n_rows, ROWS)
    dw_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    db_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    for b in tl.range(split, n_blocks, n_splits):
        # Last row block first: the dot kernel read the rows in order, so the last
        # ones are the likeliest still to be in L2.
        rows = (n_blocks - 1 - b) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        # The whole row's sums from its chunks' partial sums, always added in the
        # same order: every column chunk of a row gets the same c1 and c2.
        dot_mask = row_ok[:, None] & (parts < n_dots)[None, :]
        dot_ptrs = dot_ptr + rows[:, None] * n_dots + parts[None, :]
        c1 = tl.sum(tl.load(dot_ptrs, mask=dot_mask, other=0.0), axis=1) / n_cols
        dot_ptrs += n_rows * n_dots
        c2 = tl.sum(tl.load(dot_ptrs, mask=dot_mask, other=0.0), axis=1) / n_cols
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
# Launch configuration
# ---------------------------------------------------------------------------


def _warps(tile: int, block_n: int) -> int:
    # About 16 values per thread: 16-byte loads, and no spills.  Past 16 warps the
    # block-wide reductions cost more than they save, except for very long rows.
    return min(32 if block_n > 16384 else 16, max(1, tile // 512))


# Winners of `benchmarks/layer_norm.py --tune` (H100, bf16, 2**26 elements, triton
# 3.6) where they differ from the rules below; every other candidate was within 2%.
# At 1024 every setting is at the copy bandwidth, torch.compile's too; one row per
# program of 4 warps was the one ahead of it beyond the rounds' spread (1%).
_FWD_TUNED = {1024: (1, 4)}  # rows per program, num_warps
# Widths whose forward reads x a second time for y, as Inductor's kernel does: at
# 4096 x 16384 it took 94.6 us against 96.0 keeping x in registers and 95.5 for
# torch.compile; at 8192 columns it was slower (94.6 against 93.8).  H100, bf16,
# 5 interleaved rounds, spread under 0.8 us.
_FWD_RELOAD = frozenset({16384})
_BWD_TUNED = {2048: (2, 8, 2)}  # rows per step, num_warps, programs per SM


def _fwd_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, rows per program, num_warps) for :func:`layer_norm_fwd_kernel`.

    Short rows are grouped until a program moves about 4096 elements, enough bytes
    in flight per program to keep the memory system busy (rms_norm's rule).
    """
    block_n = 1 << (n_cols - 1).bit_length()
    if block_n in _FWD_TUNED:
        return (block_n, *_FWD_TUNED[block_n])
    rows = min(16, max(1, 4096 // block_n))
    return block_n, rows, _warps(rows * block_n, block_n)


#: Resident warps per SM that the persistent backward grid aims for.
BWD_WARPS_PER_SM = 16


def _bwd_config(n_cols: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, rows per loop step, num_warps, programs per SM, column splits) for
    :func:`layer_norm_bwd_kernel`.

    rms_norm's rule: short rows grouped half as far as in the forward; the grid
    holds :data:`BWD_WARPS_PER_SM` warps per SM.  No column splits: they measured
    slower wherever whole rows fit, and past that the chunked kernels beat them.
    """
    # Column splits against whole rows (H100, bf16): 966 against 2249 GB/s at 8192
    # columns, 1666 against 2250 at 4096.
    block_n = 1 << (n_cols - 1).bit_length()
    if block_n in _BWD_TUNED:
        return (block_n, *_BWD_TUNED[block_n], 1)
    rows = min(8, max(1, 2048 // block_n))
    warps = _warps(rows * block_n, block_n)
    return block_n, rows, warps, max(1, BWD_WARPS_PER_SM // warps), 1


def _grid_size(x: torch.Tensor, n_blocks: int, programs_per_sm: int) -> int:
    """Programs of a persistent grid: ``programs_per_sm`` per SM, no more than blocks."""
    # Under the interpreter a handful of programs exercises the partial-sum path
    # without making the (serial) interpreter slow.
    sms = sm_count(x.device) if x.is_cuda else 4
    return max(1, min(n_blocks, sms * programs_per_sm))


def _fwd_chunked_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, programs per SM) for :func:`layer_norm_fwd_chunked_kernel`.

    rms_norm's chunked forward loads 32768-wide chunks with 32 warps, one program
    per SM; this one keeps two lane-wise sums instead of one, which at 32 values per
    thread spills (152 bytes), so it takes 16384-wide chunks: 16 values per thread.
    """
    block_n = min(CHUNK_FWD, 1 << (n_cols - 1).bit_length())
    return block_n, max(1, min(32, block_n // 512)), 1


def _bwd_chunked_config(n_cols: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, rows per loop step, num_warps, programs per SM) for
    :func:`layer_norm_bwd_chunked_kernel`: the short-row rules for rows of one chunk."""
    return _bwd_config(min(CHUNK_BWD, 1 << (n_cols - 1).bit_length()))[:4]


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _check_config(rows: int, num_warps: int) -> None:
    if not _pow2(rows):
        raise ValueError(f"layer_norm: rows per program must be a power of two, got {rows}")
    if num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"layer_norm: num_warps must be a power of two up to 32, got {num_warps}")


def _check_chunk(chunk: int) -> None:
    if not _pow2(chunk):
        raise ValueError(f"layer_norm: the chunk width must be a power of two, got {chunk}")


# ---------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------


def launch_layer_norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    chunked: bool | None = None,
    chunk: int | None = None,
    programs_per_sm: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel on a checked 2-D ``x`` with unit column stride.

    Returns ``(y, stats)``: ``y`` contiguous with ``x``'s shape and dtype, ``stats``
    fp32 of shape ``(2, n_rows)`` holding each row's mean and rstd.  ``chunked``
    picks the kernel (default: the chunked one for rows longer than
    :data:`FWD_CHUNKED_THRESHOLD`); the other keywords override the heuristic.
    """
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    stats = torch.empty((2, n_rows), dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return y, stats
    kernel, grid, meta = _fwd_plan(
        x, weight, bias, rows_per_program, num_warps, chunked, chunk, programs_per_sm
    )
    with device_guard(x):
        launch(
            kernel, grid,
            x, _or(weight, x), _or(bias, x), y, stats,
            n_rows, n_cols, x.stride(0), y.stride(0), eps, **meta,
        )  # fmt: skip
    return y, stats


def _or(t: torch.Tensor | None, other: torch.Tensor) -> torch.Tensor:
    # An absent weight or bias is never read (HAS_W / HAS_B is False); any pointer
    # of the right kind keeps the signature.
    return other if t is None else t


def _fwd_plan(
    x, weight, bias, rows_per_program=None, num_warps=None, chunked=None, chunk=None, per_sm=None
):
    """(kernel, grid, constexprs and options) of the forward launch for a 2-D ``x``."""
    n_rows, n_cols = x.shape
    flags = {"HAS_W": weight is not None, "HAS_B": bias is not None}
    if chunked is None:
        chunked = n_cols > FWD_CHUNKED_THRESHOLD
    if chunked:
        if rows_per_program is not None:
            raise ValueError("layer_norm: the chunked forward takes one row at a time")
        block_n, warps, default_per_sm = _fwd_chunked_config(n_cols)
        block_n = chunk or block_n
        warps = num_warps or warps
        _check_config(1, warps)
        _check_chunk(block_n)
        n_progs = _grid_size(x, n_rows, per_sm or default_per_sm)
        meta = {"BLOCK_N": block_n, **flags, "num_warps": warps}
        return layer_norm_fwd_chunked_kernel, (n_progs,), meta
    block_n, rows, warps = _fwd_config(n_cols)
    rows = rows_per_program or rows
    warps = num_warps or warps
    _check_config(rows, warps)
    grid = (-(-n_rows // rows),)
    even = bool(n_cols == block_n and n_rows % rows == 0)  # a plain bool for symbolic sizes
    meta = {"BLOCK_N": block_n, "ROWS": rows, **flags, "RELOAD": block_n in _FWD_RELOAD,
            "EVEN": even, "num_warps": warps}  # fmt: skip
    return layer_norm_fwd_kernel, grid, meta


def launch_layer_norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    stats: torch.Tensor,
    *,
    need_dw: bool | None = None,
    need_db: bool = True,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    programs_per_sm: int | None = None,
    col_splits: int | None = None,
    chunked: bool | None = None,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Run the backward kernels on checked 2-D ``dy`` and ``x`` (unit column stride).

    Returns ``(dx, dweight, dbias)`` in ``x``'s dtype (which validation makes the
    parameters' too); ``dweight`` is None unless ``need_dw`` (default: whether there
    is a weight), ``dbias`` None unless ``need_db``.  ``chunked`` picks the kernels
    (default: the chunked ones for rows longer than :data:`BWD_CHUNKED_THRESHOLD`);
    the other keywords override the heuristic.
    """
    need_dw = weight is not None if need_dw is None else need_dw
    if need_dw and weight is None:
        raise ValueError("layer_norm: dweight needs a weight")
    plan = _bwd_plan(
        x, weight is not None, need_dw, need_db,
        rows_per_program, num_warps, programs_per_sm, col_splits, chunked, chunk,
    )  # fmt: skip
    return _launch_bwd(plan, dy, x, weight, stats)[:3]


def _launch_bwd(plan, dy, x, weight, stats, run=None) -> tuple:
    """Run ``plan``, each kernel started by ``run``; returns every buffer of
    :func:`_bwd_buffers`, filled."""
    run = run or launch  # looked up at the call, so a test's stand-in for launch is seen
    out = _bwd_buffers(plan, x)
    if x.numel() == 0:
        dx, dw, db = out[:3]
        return (dx, _zero(dw), _zero(db), *out[3:])
    # Each launch runs on the GPU of its first tensor (both runs see to it).
    steps = zip(plan.launches, _bwd_args(plan, dy, x, weight, stats, *out), strict=True)
    for (kernel, grid, meta), args in steps:
        run(kernel, grid, *args, **meta)
    return out


class _BwdPlan:
    """Everything about a backward launch that depends on sizes and settings alone."""

    __slots__ = ("chunked", "dots_shape", "launches", "n_chunks", "need_db", "need_dw",
                 "partial_shape", "shape")  # fmt: skip

    def __init__(self, shape, chunked, need_dw, need_db, partial_shape, dots_shape, launches):
        self.shape, self.chunked = shape, chunked
        self.need_dw, self.need_db = need_dw, need_db
        self.partial_shape, self.dots_shape = partial_shape, dots_shape
        self.n_chunks = dots_shape[2] if dots_shape else 0
        self.launches = launches  # [(kernel, grid, constexprs and options)]


def _bwd_plan(x, has_w, need_dw, need_db, rows=None, warps=None, per_sm=None, splits=None,
              chunked=None, chunk=None) -> _BwdPlan:  # fmt: skip
    n_rows, n_cols = x.shape
    if chunked is None:
        chunked = n_cols > BWD_CHUNKED_THRESHOLD
    flags = {"HAS_W": has_w, "NEED_DW": need_dw, "NEED_DB": need_db}
    needed = need_dw or need_db
    launches = []
    dots_shape = None
    if chunked:
        if splits not in (None, 1):
            raise ValueError("layer_norm: the chunked backward splits columns by chunk")
        block_n, def_rows, def_warps, def_per_sm = _bwd_chunked_config(n_cols)
        block_n = chunk or block_n
        rows = rows or def_rows
        warps = warps or def_warps
        _check_config(rows, warps)
        _check_chunk(block_n)
        n_chunks = -(-n_cols // block_n)
        # 1. Each (row, chunk): its sum(g) and sum(g * x_hat), into (2, n_rows, n_chunks).
        dots_shape = (2, n_rows, n_chunks)
        dot_meta = {"BLOCK_N": block_n, "HAS_W": has_w, "num_warps": _warps(block_n, block_n)}
        launches.append((layer_norm_bwd_dot_kernel, (n_rows * n_chunks,), dot_meta))
        # 2. dx, and the gradients of weight and bias per (split, column chunk).
        n_progs = _grid_size(x, n_rows * n_chunks, per_sm or def_per_sm)
        n_parts = max(1, min(-(-n_rows // rows), n_progs // n_chunks))
        meta = {"BLOCK_N": block_n, "ROWS": rows, "DOTS": 1 << (n_chunks - 1).bit_length(),
                **flags, "num_warps": warps}  # fmt: skip
        launches.append((layer_norm_bwd_chunked_kernel, (n_chunks, n_parts), meta))
    else:
        block_n, def_rows, def_warps, def_per_sm, def_splits = _bwd_config(n_cols)
        rows = rows or def_rows
        warps = warps or def_warps
        splits = splits or def_splits
        _check_config(rows, warps)
        if not _pow2(splits) or splits > block_n:
            raise ValueError(
                f"layer_norm: col_splits must be a power of two up to {block_n}, got {splits}"
            )
        n_progs = _grid_size(x, -(-n_rows // rows), per_sm or def_per_sm)
        n_parts = max(1, n_progs // splits)
        meta = {"BLOCK_N": block_n, "ROWS": rows, "COL_SPLITS": splits, **flags,
                "num_warps": warps}  # fmt: skip
        launches.append((layer_norm_bwd_kernel, (splits, n_parts), meta))
    if needed:
        sum_meta = {"BLOCK_P": SUM_BLOCK_P, "BLOCK_C": SUM_BLOCK_C, "NEED_A": need_dw,
                    "NEED_B": need_db, "num_warps": 4}  # fmt: skip
        launches.append((sum_partials_kernel, sum_partials_grid(n_cols), sum_meta))
    # Never read when neither gradient is wanted: one element keeps the signature.
    partial_shape = (n_parts, 2, n_cols) if needed else (1,)
    return _BwdPlan(x.shape, chunked, need_dw, need_db, partial_shape, dots_shape, launches)


def _bwd_buffers(plan: _BwdPlan, x: torch.Tensor) -> tuple:
    """(dx, dweight or None, dbias or None, partial sums, dots or None), uninitialised."""
    dev, n_cols = x.device, plan.shape[1]
    dx = torch.empty(plan.shape, dtype=x.dtype, device=dev)
    dw = torch.empty(n_cols, dtype=x.dtype, device=dev) if plan.need_dw else None
    db = torch.empty(n_cols, dtype=x.dtype, device=dev) if plan.need_db else None
    partial = torch.empty(plan.partial_shape, dtype=torch.float32, device=dev)
    dots = torch.empty(plan.dots_shape, dtype=torch.float32, device=dev) if plan.chunked else None
    return dx, dw, db, partial, dots


def _bwd_args(plan: _BwdPlan, dy, x, w, stats, dx, dw, db, partial, dots) -> list[tuple]:
    """The runtime arguments of each of ``plan.launches``, in order."""
    n_rows, n_cols = plan.shape
    # An absent weight or gradient is never touched (HAS_W / NEED_* False): any
    # pointer of the right kind keeps the signature.
    w = x if w is None else w
    strides = (dy.stride(0), x.stride(0), dx.stride(0))
    if plan.chunked:
        args = [
            (dy, x, w, stats, dots, n_rows, n_cols, dy.stride(0), x.stride(0)),
            (dy, x, w, stats, dots, dx, partial, n_rows, n_cols, plan.n_chunks, *strides),
        ]
    else:
        args = [(dy, x, w, stats, dx, partial, n_rows, n_cols, *strides)]
    if len(plan.launches) > len(args):
        args.append((partial, x if dw is None else dw, x if db is None else db,
                     partial.shape[0], n_cols, 2 * n_cols))  # fmt: skip
    return args


def _zero(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.zeros_like(t)


# ---------------------------------------------------------------------------
# Autograd and the public function
# ---------------------------------------------------------------------------


def _as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as ``(rows, n_cols)`` with unit column stride, copying only when needed.

    ``reshape`` keeps a view whenever the leading dimensions collapse into one row
    stride (slices along the batch, for instance); otherwise it copies.  A stride
    other than 1 along a row (a transpose, or the stride-0 ``dy`` that
    ``y.sum().backward()`` produces) needs a copy too.
    """
    rows = t.reshape(-1, n_cols)
    if rows.stride(-1) != 1 and n_cols > 1:
        rows = rows.contiguous()
    return rows


class LayerNormFunction(torch.autograd.Function):
    """Autograd for :func:`layer_norm` (``weight`` and ``bias`` with unit stride).

    ``run`` is a remembered launch (see :data:`_FAST`) to try first: plumbing of
    :func:`layer_norm`, with no gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, run=None) -> torch.Tensor:
        got = run(x, weight, bias, eps) if run is not None else None
        if got is not None:  # x is contiguous: the key says so
            y, stats = got
            x2 = x.view(stats.shape[1], x.shape[-1])
        else:
            x2 = _as_rows(x, x.shape[-1])
            y, stats = launch_layer_norm_fwd(x2, weight, bias, eps)
            y = y.view(x.shape)
        ctx.save_for_backward(x2, weight, stats)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, stats = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx, dw, db = _backward(_as_rows(dy, x2.shape[1]), x2, weight, stats, need_w, need_b)
        return (dx.view(dy.shape) if need_x else None), dw, db, None, None


# The backward's host time.  autograd.grad through a Python Function cost about
# 200 us of host time per call on the H100 box, more than the kernels' 175 us at
# 2**26 elements: measured through autograd, the backward ran at 1150-1380 GB/s
# against 2220-2250 for the bare launcher (benchmarks/notes/layer_norm_dropout.md).
# So, as for the forward, a backward keeps its plan and its direct launchers under
# the key of everything they were specialised on, and the next backward of the same
# kind only allocates its buffers and launches.
_BWD_FAST: dict[tuple, object] = {}


def _backward(dy, x, w, stats, need_dw: bool, need_db: bool) -> tuple:
    key = (
        x.shape, x.stride(0), dy.stride(0), x.dtype, dy.dtype, x.device, w is not None,
        need_dw, need_db, dy.data_ptr() % 16 == 0, x.data_ptr() % 16 == 0,
        w is None or w.data_ptr() % 16 == 0, BWD_CHUNKED_THRESHOLD, CHUNK_BWD,
    )  # fmt: skip
    run = _BWD_FAST.get(key)
    if run is not None:
        out = run(dy, x, w, stats)
        if out is not None:
            return out
    plan = _bwd_plan(x, w is not None, need_dw, need_db)
    bufs = _launch_bwd(plan, dy, x, w, stats)
    if x.is_cuda and x.numel() and len(_BWD_FAST) < _FAST_LIMIT and direct_launch_enabled():
        _remember_bwd(key, plan, dy, x, w, stats, bufs)
    return bufs[:3]


def _remember_bwd(key, plan, dy, x, w, stats, bufs) -> None:
    gos = []
    steps = zip(plan.launches, _bwd_args(plan, dy, x, w, stats, *bufs), strict=True)
    for (kernel, grid, meta), args in steps:
        found = launcher_for(kernel, args, meta)
        if found is None:
            return
        gos.append((found[0], grid, found[1]))

    def run(dy, x, w, stats) -> tuple | None:
        bufs = _bwd_buffers(plan, x)
        if any(t is not None and t.data_ptr() % 16 for t in bufs):
            return None  # not the specialisation compiled for: the ordinary path
        for (go, grid, tail), args in zip(gos, _bwd_args(plan, dy, x, w, stats, *bufs)):  # noqa: B905
            if not go(grid, (*args, *tail)):
                return None  # another device is current, or a hook listens
        return bufs[:3]

    _BWD_FAST[key] = run


# Repeat calls.  A 65536 x 1024 bf16 forward takes about 90 us on an H100, not much
# more than the Python of the checks, autograd.Function and launch key around it.
# So a call on contiguous tensors keeps what its launch needs under the key of its
# shapes, strides, dtypes, device and alignment; the next call with the same key only
# allocates the outputs and launches (eps is a runtime argument of the kernels, so it
# may differ).  A call that needs a gradient does that inside LayerNormFunction, which
# keeps the statistics the kernel writes anyway: on an H100's host a forward with
# grad took 94 us of host time through the checks and the configuration, where
# F.layer_norm took 22.
_FAST: dict[tuple, object] = {}
_FAST_LIMIT = 1024
_grad_enabled = torch.is_grad_enabled


def _meta_key(t: torch.Tensor | None) -> tuple | None:
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def _fast_key(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> tuple:
    # FWD_CHUNKED_THRESHOLD is in it: tests change it to reach the chunked kernel.
    return (_meta_key(x), _meta_key(weight), _meta_key(bias), FWD_CHUNKED_THRESHOLD, CHUNK_FWD)


def _remember_fast(x, weight, bias) -> None:
    if not direct_launch_enabled():  # nothing to remember: skip the work on every call
        return
    n_cols = x.shape[-1]
    if len(_FAST) >= _FAST_LIMIT or x.numel() == 0 or not x.is_contiguous() or x.data_ptr() % 16:
        return
    for t in (weight, bias):
        if t is not None and (not t.is_contiguous() or t.data_ptr() % 16):
            return
    x2 = x.view(-1, n_cols)
    n_rows = x2.shape[0]
    kernel, grid, meta = _fwd_plan(x2, weight, bias)
    stats_like = torch.empty(1, dtype=torch.float32, device=x.device)  # for its dtype only
    w, b = _or(weight, x2), _or(bias, x2)
    args = (x2, w, b, x2, stats_like, n_rows, n_cols, n_cols, n_cols, 1e-5)
    found = launcher_for(kernel, args, meta)
    if found is None:
        return
    go, tail = found
    shape = x.shape

    def run(t, w_now, b_now, eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        y = torch.empty(shape, dtype=t.dtype, device=t.device)
        stats = torch.empty((2, n_rows), dtype=torch.float32, device=t.device)
        if y.data_ptr() % 16 or stats.data_ptr() % 16:
            return None
        w_now = t if w_now is None else w_now
        b_now = t if b_now is None else b_now
        args = (t, w_now, b_now, y, stats, n_rows, n_cols, n_cols, n_cols, eps, *tail)
        return (y, stats) if go(grid, args) else None

    _FAST[_fast_key(x, weight, bias)] = run


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        raise TypeError(f"layer_norm: eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    # Comparisons, not math.isfinite: torch.compile traces them when eps is symbolic.
    if not 0 < eps < math.inf:
        raise ValueError(f"layer_norm: eps must be a positive finite number, got {eps!r}")
    return eps


def _check_param(t: object, name: str, x: torch.Tensor, n_cols: int) -> None:
    if t is None:
        return
    check_tensor(t, name, "layer_norm", ndim=1)
    if t.shape[0] != n_cols:
        raise ValueError(
            f"layer_norm: {name} must have shape ({n_cols},) to match the last dimension of x "
            f"{tuple(x.shape)}, got {tuple(t.shape)}"
        )
    if t.dtype != x.dtype:
        raise TypeError(
            f"layer_norm: {name} must have the dtype of x "
            f"({str(x.dtype).removeprefix('torch.')}), got {str(t.dtype).removeprefix('torch.')}"
        )
    if t.device != x.device:
        raise ValueError(
            f"layer_norm: x and {name} are on different devices ({x.device}, {t.device})"
        )


def _needs_grad(*ts) -> bool:
    return any(t is not None and t.requires_grad for t in ts) and _grad_enabled()


# ---------------------------------------------------------------------------
# The torch.library operators (what torch.compile traces; see tilebook.ops.library)
# ---------------------------------------------------------------------------


def _op_forward(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, stats)`` for a 2-D ``x`` with unit column stride and contiguous parameters."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    stats = torch.empty((2, n_rows), dtype=torch.float32, device=x.device)
    if x.numel():
        kernel, grid, meta = _fwd_plan(x, weight, bias)
        library.launch(
            kernel, grid,
            x, _or(weight, x), _or(bias, x), y, stats,
            n_rows, n_cols, x.stride(0), y.stride(0), eps, **meta,
        )  # fmt: skip
    return y, stats


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
    plan = _bwd_plan(x, weight is not None, need_dw, need_db)
    dx, dw, db = _launch_bwd(plan, dy, x, weight, stats, run=library.launch)[:3]
    # Outputs may not alias one another: a fresh empty tensor for each one absent.
    dw = x.new_empty(0) if dw is None else dw
    return dx, dw, x.new_empty(0) if db is None else db


_KERNELS = (
    layer_norm_fwd_kernel, layer_norm_fwd_chunked_kernel, layer_norm_bwd_kernel,
    layer_norm_bwd_dot_kernel, layer_norm_bwd_chunked_kernel, sum_partials_kernel,
)  # fmt: skip
layer_norm_op = library.define("layer_norm", _op_forward, kernels=_KERNELS)
layer_norm_backward_op = library.define("layer_norm_backward", _op_backward, kernels=_KERNELS)


def _op_setup(ctx, inputs, output) -> None:
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.has_bias = bias is not None


def _op_grad(ctx, dy, _dstats):
    x, weight, stats = ctx.saved_tensors
    need_w = weight is not None and ctx.needs_input_grad[1]
    need_b = ctx.has_bias and ctx.needs_input_grad[2]
    dy2 = _as_rows(dy, x.shape[1])
    dx, dw, db = layer_norm_backward_op(dy2, x, weight, stats, need_w, need_b)
    return dx, (dw if need_w else None), (db if need_b else None), None


layer_norm_op.register_autograd(_op_grad, setup_context=_op_setup)


def _compiled(x, weight, bias, eps) -> torch.Tensor:
    """:func:`layer_norm` inside torch.compile: the checks, then the operator."""
    eps = _check_args(x, weight, bias, eps)
    w = None if weight is None else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    y, _ = layer_norm_op(_as_rows(x, x.shape[-1]), w, b, eps)
    return y.view(x.shape)


def _check_args(x: object, weight: object, bias: object, eps: object) -> float:
    """Every check of :func:`layer_norm`'s arguments; returns ``eps`` as a float."""
    check_tensor(x, "x", "layer_norm", min_ndim=1)
    eps = _check_eps(eps)
    n_cols = x.shape[-1]
    if n_cols == 0:
        raise ValueError(
            f"layer_norm: the last dimension of x must not be empty, got {tuple(x.shape)}"
        )
    _check_param(weight, "weight", x, n_cols)
    _check_param(bias, "bias", x, n_cols)
    if n_cols > MAX_HIDDEN:
        raise ValueError(
            f"layer_norm: the last dimension of x is {n_cols}, but layer_norm supports at most "
            f"{MAX_HIDDEN}"
        )
    return eps


_compiling = torch.compiler.is_compiling


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The six kernels as jobs of :func:`tilebook.aot.compile_many` for ``sm_<arch>``,
    configured as the launchers configure them, with a weight and a bias: rows of 4096
    (whole rows), of 16384 (the chunked backward) and of 65536 (the chunked forward)."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    jobs = {}
    for n_rows, n_cols, fwd, bwd in ((64, 4096, True, True), (8, 16384, False, True),
                                     (8, 65536, True, False)):  # fmt: skip
        x = targets.meta_tensor(n_rows, n_cols, dtype=dt)
        w = targets.meta_tensor(n_cols, dtype=dt)
        stats = targets.meta_tensor(2, n_rows)
        where = f"{n_rows}x{n_cols}"
        if fwd:
            jobs |= targets.recorded(lambda x=x, w=w: _op_forward(x, w, w, 1e-5), arch, where)
        if bwd:
            body = lambda x=x, w=w, s=stats: _op_backward(x, x, w, s, True, True)
            jobs |= targets.recorded(body, arch, where)
    return jobs


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

    Parameters
    ----------
    x
        Tensor of shape ``(..., N)``, float16, bfloat16 or float32, on tilebook's
        device.  Any strides: rows that are not evenly strided are copied first.
        ``N`` may be at most :data:`MAX_HIDDEN` (``2**20``); long rows take the
        chunked kernels.
    weight, bias
        None, or 1-D tensors of size ``N`` with the dtype and device of ``x``.
    eps
        Positive number added to the variance, for stability.

    Notes
    -----
    Inside ``torch.compile`` the call is the operator ``torch.ops.tilebook.layer_norm``
    (:mod:`tilebook.ops.library`): no graph break, and Inductor sees the kernels.

    Examples
    --------
    >>> y = tilebook.layer_norm(x, weight, bias, eps=1e-5)   # doctest: +SKIP
    """
    if _compiling():
        return _compiled(x, weight, bias, eps)
    if (
        plain(x)
        and type(eps) is float
        and (weight is None or plain(weight))
        and (bias is None or plain(bias))
    ):
        run = _FAST.get(_fast_key(x, weight, bias))
        if run is not None and eps > 0 and math.isfinite(eps):
            if _needs_grad(x, weight, bias):
                return LayerNormFunction.apply(x, weight, bias, eps, run)  # falls back inside
            got = run(x, weight, bias, eps)
            if got is not None:
                return got[0]
    eps = _check_args(x, weight, bias, eps)
    n_cols = x.shape[-1]
    # The kernels read weight and bias with unit stride.
    w = None if weight is None else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    if _needs_grad(x, weight, bias):
        y = LayerNormFunction.apply(x, w, b, eps)
    else:
        y = launch_layer_norm_fwd(_as_rows(x, n_cols), w, b, eps)[0].view(x.shape)
    if x.is_cuda:
        _remember_fast(x, weight, bias)  # the caller's tensors: a strided one is never remembered
    return y
