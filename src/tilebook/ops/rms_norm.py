"""RMSNorm, forward and backward, as one ``torch.autograd.Function``.

``y = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x**2) + eps)`` over the last
dimension, the normalisation of Llama-style transformers.  One file holds the
kernels, their launchers and the autograd glue.

* Forward: one pass.  A program loads whole rows into registers, reduces them to
  ``rstd`` and scales them before anything is written back, so ``x`` is read from
  memory once.  ``rstd`` (fp32, one per row) is kept for the backward pass.
* Backward: ``dx`` row by row, and ``dweight``, a sum over *all* rows.  Instead of
  atomics or locks, a persistent grid (a few programs per SM) walks the rows; each
  program adds its rows' ``dy * x_hat`` into an fp32 accumulator that stays in
  registers and writes it once, as one row of a ``(programs, H)`` buffer.
  :func:`tilebook.ops.partials.sum_partials_kernel` adds that small buffer up in
  a fixed order (so ``dweight`` is deterministic) and casts it.

Both passes are memory-bound: a handful of flops per element against 2 (forward)
or 3 (backward) full tensors of traffic, so the aim is the copy bandwidth.

**Long rows** (more than :data:`FWD_CHUNKED_THRESHOLD` columns forward,
:data:`BWD_CHUNKED_THRESHOLD` backward) no longer fit in registers without
spilling, so they take chunked kernels whose registers scale with a chunk, not
with ``H``:

* Forward (:func:`rms_norm_fwd_chunked_kernel`): a persistent program walks a row
  twice, chunk by chunk: once for the sum of squares, then backwards (newest chunk
  first, the likeliest still in L2) to write ``y``.  With one row per SM in flight,
  the second read mostly hits L2.
* Backward, in two kernels.  :func:`rms_norm_bwd_dot_kernel` gives each (row,
  chunk) its own program and writes the chunk's ``sum(dy * w * x)`` to an fp32
  ``(n_rows, n_chunks)`` buffer.  :func:`rms_norm_bwd_chunked_kernel` then splits
  ``H`` across programs: each owns one column chunk and a share of the rows, adds
  up its rows' partial dots to get ``c``, writes ``dx`` and keeps ``dweight`` for its
  columns in registers, as the short-row kernel does.  ``x`` and ``dy`` are read
  twice, but nothing is read back from a partial buffer row by row, and the
  ``dweight`` buffer has only ``programs / n_chunks`` rows.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .._launch import (
    Launched,
    Memo,
    direct_launch_enabled,
    launch,
    plain,
    plain_grad,
    sm_count,
)
from ..validation import check_same_device, check_tensor
from . import library
from .partials import SUM_BLOCK_C, SUM_BLOCK_P, sum_partials_grid, sum_partials_kernel
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

#: Largest hidden size.  Rows up to the thresholds below live in one program's
#: registers; longer ones are walked in chunks, which bounds neither registers nor
#: the partial buffers by ``H``.  The limit only keeps the launch sizes sane.
MAX_HIDDEN = 1 << 20

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
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    BLOCK_N: tl.constexpr,  # next power of two >= n_cols
    ROWS: tl.constexpr,  # rows per program
    STORE_RSTD: tl.constexpr,  # False: no backward follows (rstd_ptr is unused)
    X_EVICT: tl.constexpr,  # L2 policy of the x loads: "" or "evict_last" (see _x_evict)
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
def rms_norm_bwd_kernel(
    dy_ptr,  # (n_rows, n_cols), unit stride along a row
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    rstd_ptr,  # (n_rows,) fp32, from the forward pass
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    dw_partial_ptr,  # (num_programs, n_cols) fp32, contiguous
    n_rows,
    n_cols,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,  # rows per loop step
):
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    dw_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    # Grid-stride loop: neighbouring programs take neighbouring row blocks, so at
    # any moment the grid streams through one region of memory.
    for start in range(pid * ROWS, n_rows, n_progs * ROWS):
        rows = start + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
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
        # d/dx of x * rstd(x): the direct term minus the term through rstd's
        # dependence on every element of the row.
        c = tl.sum(g * x_hat, axis=1) / n_cols
        dx = (g - x_hat * c[:, None]) * rstd[:, None]
        tl.store(
            dx_ptr + rows64 * dx_row_stride + cols[None, :],
            dx.to(dx_ptr.dtype.element_ty),
            mask=mask,
        )
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
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
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
    dy_ptr,  # (n_rows, n_cols), unit stride along a row
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    dot_ptr,  # (n_rows, n_chunks) fp32, contiguous: sum(dy * w * x) per row chunk
    n_cols,
    dy_row_stride,
    x_row_stride,
    BLOCK_N: tl.constexpr,  # chunk width, a power of two
):
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
    dy_ptr,  # (n_rows, n_cols), unit stride along a row
    x_ptr,  # (n_rows, n_cols), unit stride along a row
    w_ptr,  # (n_cols,)
    rstd_ptr,  # (n_rows,) fp32, from the forward pass
    dot_ptr,  # (n_rows, n_dots) fp32, from rms_norm_bwd_dot_kernel
    dx_ptr,  # (n_rows, n_cols), unit stride along a row
    dw_partial_ptr,  # (num_programs(1), n_cols) fp32, contiguous
    n_rows,
    n_cols,
    n_dots,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    BLOCK_N: tl.constexpr,  # column chunk of this program, a power of two
    ROWS: tl.constexpr,  # rows per loop step
    DOTS: tl.constexpr,  # next power of two >= n_dots
):
    # Program (chunk, split) owns columns [chunk * BLOCK_N, (chunk + 1) * BLOCK_N)
    # and every num_programs(1)-th row block: its share of dweight for those columns
    # stays in registers, as in rms_norm_bwd_kernel.
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    parts = tl.arange(0, DOTS)
    n_blocks = tl.cdiv(n_rows, ROWS)
    dw_acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    for b in tl.range(split, n_blocks, n_splits):
        # Last row block first: the dot kernel read the rows in order, so the last
        # ones are the likeliest still to be in L2.
        rows = (n_blocks - 1 - b) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        # The whole row's sum(dy * w * x), from its chunks' partial sums, always added
        # in the same order: every column chunk of a row gets the same c.
        dot_mask = row_ok[:, None] & (parts < n_dots)[None, :]
        dots = tl.load(dot_ptr + rows[:, None] * n_dots + parts[None, :], mask=dot_mask, other=0.0)
        # Rows past the end get rstd = 0, so they contribute nothing to dw.
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        c = tl.sum(dots, axis=1) * rstd / n_cols  # sum(g * x_hat) / H

        x = tl.load(x_ptr + rows64 * x_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows64 * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x_hat = x.to(tl.float32) * rstd[:, None]
        dy = dy.to(tl.float32)
        g = dy * w[None, :]
        dx = (g - x_hat * c[:, None]) * rstd[:, None]
        tl.store(
            dx_ptr + rows64 * dx_row_stride + cols[None, :],
            dx.to(dx_ptr.dtype.element_ty),
            mask=mask,
        )
        dw_acc += dy * x_hat

    dw = tl.sum(dw_acc, axis=0)
    tl.store(dw_partial_ptr + split * n_cols + cols, dw, mask=col_ok)


# ---------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------


# The heuristics below come from a sweep on an H100 (bf16, 16384 rows, hidden
# sizes 1024 to 16384; ``benchmarks/rms_norm.py --tune``).  Every choice within a
# few percent of the best was kept only if it followed one simple rule.


def _pow2(n: int) -> int:
    # int(): traced with a symbolic size (torch.compile's dynamic shapes), Triton's
    # bit-twiddling would build a symbolic expression that takes minutes to simplify;
    # a block size is a constant of the kernel anyway, so the size is specialised.
    return triton.next_power_of_2(int(n))


def _warps(tile: int, block_n: int) -> int:
    # About 16 values per thread: 16-byte loads, and no spills.  Past 16 warps the
    # block-wide reductions cost more than they save, except where rows are so long
    # that 16 warps would hold too many values per thread.
    return min(32 if block_n > 16384 else 16, max(1, tile // 512))


def _fwd_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, rows per program, num_warps) for the forward kernel.

    Short rows are grouped until a program moves about 4096 elements, enough bytes
    in flight per program to keep the memory system busy.
    """
    block_n = _pow2(n_cols)
    rows = min(16, max(1, 4096 // block_n))
    return block_n, rows, _warps(rows * block_n, block_n)


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


#: Resident warps per SM that the persistent backward grid aims for.
BWD_WARPS_PER_SM = 16


def _bwd_config(n_cols: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, rows per loop step, num_warps, programs per SM) for the backward kernel.

    Short rows are grouped half as far as in the forward: the backward keeps the dw
    accumulator in registers as well as x and dy.  The grid holds
    :data:`BWD_WARPS_PER_SM` warps per SM: small programs come several to an SM,
    large ones one.
    """
    block_n = _pow2(n_cols)
    rows = min(8, max(1, 2048 // block_n))
    warps = _warps(rows * block_n, block_n)
    return block_n, rows, warps, max(1, BWD_WARPS_PER_SM // warps)


def fwd_config(n_cols: int) -> tuple[int, int, int]:
    """``(BLOCK_N, rows per program, num_warps)`` of :func:`rms_norm_fwd_kernel` for rows
    of ``n_cols``; rows longer than :data:`FWD_CHUNKED_THRESHOLD` take the chunked kernel."""
    return _fwd_config(n_cols)


def bwd_config(n_cols: int) -> tuple[int, int, int, int]:
    """``(BLOCK_N, rows per loop step, num_warps, programs per SM)`` of
    :func:`rms_norm_bwd_kernel` for rows of ``n_cols``; rows longer than
    :data:`BWD_CHUNKED_THRESHOLD` take the chunked kernels."""
    return _bwd_config(n_cols)


def _grid_size(x: torch.Tensor, n_blocks: int, programs_per_sm: int) -> int:
    """Programs of a persistent grid: ``programs_per_sm`` per SM, no more than blocks."""
    # Under the interpreter a handful of programs is enough to exercise the
    # partial-sum path without making the (serial) interpreter slow.
    sms = sm_count(x.device) if x.is_cuda else 4
    return max(1, min(n_blocks, sms * programs_per_sm))


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

#: Programs per SM of the chunked forward's persistent grid.
FWD_CHUNKED_PROGRAMS_PER_SM = 1


def _fwd_chunked_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, programs per SM) for :func:`rms_norm_fwd_chunked_kernel`."""
    block_n = min(CHUNK_FWD, _pow2(n_cols))
    return block_n, max(1, min(32, block_n // 1024)), FWD_CHUNKED_PROGRAMS_PER_SM


def _bwd_chunked_config(n_cols: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, rows per loop step, num_warps, programs per SM) for
    :func:`rms_norm_bwd_chunked_kernel`: the short-row rules for rows of one chunk."""
    return _bwd_config(min(CHUNK_BWD, _pow2(n_cols)))


def _check_config(rows: int, num_warps: int) -> None:
    if rows <= 0 or rows & (rows - 1):
        raise ValueError(f"rms_norm: rows per program must be a power of two, got {rows}")
    if num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"rms_norm: num_warps must be a power of two up to 32, got {num_warps}")


def _check_chunk(chunk: int) -> None:
    if chunk <= 0 or chunk & (chunk - 1):
        raise ValueError(f"rms_norm: the chunk width must be a power of two, got {chunk}")


def launch_rms_norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    chunked: bool | None = None,
    chunk: int | None = None,
    programs_per_sm: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel on a checked 2-D ``x`` with unit column stride.

    Returns ``(y, rstd)``: ``y`` contiguous with ``x``'s shape and dtype, ``rstd``
    fp32 of shape ``(n_rows,)``.  ``chunked`` picks the kernel (default: the chunked
    one for rows longer than :data:`FWD_CHUNKED_THRESHOLD`).  The other keywords
    override the heuristic (the benchmark sweeps them): ``rows_per_program`` for
    the whole-row kernel, ``chunk`` and ``programs_per_sm`` for the chunked one.
    """
    plan = (rows_per_program, num_warps, chunked, chunk, programs_per_sm)
    y, rstd, _ = _forward(x, weight, eps, *plan)
    return y, rstd


def _forward(x, weight, eps, *plan, run=None, keep_rstd=True):
    """:func:`launch_rms_norm_fwd`'s work, plus what ``run`` returned (:func:`launch`:
    a Launched or None).  ``keep_rstd=False`` (no backward follows) lets the
    whole-row kernel skip writing ``rstd``; the ``rstd`` returned is then None."""
    run = run or launch  # looked up at the call, so a test's stand-in for launch is seen
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y, torch.empty((n_rows,), dtype=torch.float32, device=x.device), None
    kernel, grid, meta = _fwd_plan(x, *plan)
    if keep_rstd or kernel is not rms_norm_fwd_kernel:
        rstd = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    else:
        # One allocation less on the host, one store less per row: rstd_ptr is never
        # written, so any pointer keeps the signature.
        rstd, meta = None, {**meta, "STORE_RSTD": False}
    launched = run(
        kernel, grid,
        x, weight, y, x if rstd is None else rstd, n_rows, n_cols, x.stride(0), y.stride(0), eps,
        **meta,
    )  # fmt: skip
    return y, rstd, launched


def _fwd_plan(x, rows_per_program=None, num_warps=None, chunked=None, chunk=None, per_sm=None):
    """(kernel, grid, constexprs and options) of the forward launch for a 2-D ``x``."""
    n_rows, n_cols = x.shape
    if chunked is None:
        chunked = n_cols > FWD_CHUNKED_THRESHOLD
    if chunked:
        if rows_per_program is not None:
            raise ValueError("rms_norm: the chunked forward takes one row at a time")
        block_n, warps, default_per_sm = _fwd_chunked_config(n_cols)
        block_n = chunk or block_n
        warps = num_warps or warps
        _check_config(1, warps)
        _check_chunk(block_n)
        n_progs = _grid_size(x, n_rows, per_sm or default_per_sm)
        return rms_norm_fwd_chunked_kernel, (n_progs,), {"BLOCK_N": block_n, "num_warps": warps}
    block_n, rows, warps = _fwd_config(n_cols)
    evict = _x_evict(x)
    if not evict and block_n in _FWD_TUNED_NO_HINT:
        rows, warps = _FWD_TUNED_NO_HINT[block_n]
    rows = rows_per_program or rows
    warps = num_warps or warps
    _check_config(rows, warps)
    grid = (triton.cdiv(n_rows, rows),)
    even = bool(n_cols == block_n and n_rows % rows == 0)  # a plain bool for symbolic sizes
    meta = {"BLOCK_N": block_n, "ROWS": rows, "STORE_RSTD": True, "X_EVICT": evict,
            "EVEN": even, "num_warps": warps}  # fmt: skip
    return rms_norm_fwd_kernel, grid, meta


def launch_rms_norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    programs_per_sm: int | None = None,
    chunked: bool | None = None,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the backward kernels on checked 2-D ``dy`` and ``x`` (unit column stride).

    Returns ``(dx, dweight)`` in the dtypes of ``x`` and ``weight``.  ``chunked``
    picks the kernels (default: the chunked ones for rows longer than
    :data:`BWD_CHUNKED_THRESHOLD`); ``chunk`` is their column chunk, and the other
    keywords override the heuristic for the whole-row kernel or, chunked, for
    :func:`rms_norm_bwd_chunked_kernel`.
    """
    plan = (rows_per_program, num_warps, programs_per_sm, chunked, chunk)
    return _backward(dy, x, weight, rstd, *plan)


def _backward(dy, x, weight, rstd, rows_per_program=None, num_warps=None,
              programs_per_sm=None, chunked=None, chunk=None, *, run=None):  # fmt: skip
    """:func:`launch_rms_norm_bwd`'s work, its kernels started by ``run``.

    A call with the default settings and ``run`` (the eager path) remembers its
    launches: see :data:`_BWD_FAST`."""
    settings = (rows_per_program, num_warps, programs_per_sm, chunked, chunk)
    key = None
    if run is None and settings == (None,) * 5 and x.is_cuda and direct_launch_enabled():
        key = _bwd_key(dy, x, weight, rstd)
        fast = _BWD_FAST.get(key)
        if fast is not None:
            out = fast(dy, x, weight, rstd)
            if out is not None:
                return out
    run = run or launch  # looked up at the call, so a test's stand-in for launch is seen
    if x.numel() == 0:
        return torch.empty_like(x), torch.zeros_like(weight)
    plan = _bwd_plan(x, *settings)
    bufs = _bwd_buffers(plan, x, weight)
    steps = zip(plan.launches, _bwd_args(plan, dy, x, weight, rstd, *bufs), strict=True)
    launched = [run(kernel, grid, *args, **meta) for (kernel, grid, meta), args in steps]
    if key is not None and all(isinstance(go, Launched) for go in launched):
        _BWD_FAST.remember(key, _replay_bwd(plan, launched, dy.stride(0), x.stride(0)))
    return bufs[0], bufs[1]


# The backward's host time.  At 16384 x 1024 (bf16) the kernels take about 30 us, while
# the Python around them (configuration, buffers, three launches) took longer, so an
# eager backward keeps its plan and launches under the key of everything they were
# specialised on; the next backward of the same kind only allocates and launches.
_BWD_FAST = Memo()


def _bwd_key(dy, x, weight, rstd) -> tuple:
    return (
        x.shape, x.stride(0), dy.stride(0), x.dtype, dy.dtype, weight.dtype, x.device,
        dy.data_ptr() % 16 == 0, x.data_ptr() % 16 == 0, weight.data_ptr() % 16 == 0,
        rstd.data_ptr() % 16 == 0, BWD_CHUNKED_THRESHOLD, CHUNK_BWD,
    )  # fmt: skip


def _replay_bwd(plan, launched, dy_stride: int, x_stride: int):
    """``replay(dy, x, w, rstd) -> (dx, dweight) or None`` for tensors keyed like the
    ones launched (:func:`_bwd_key`).  The key fixes the row strides of ``dy`` and ``x``,
    so ``dy`` may be passed as the caller holds it (any shape) when its rows are
    ``dy_stride`` apart; ``dx`` comes back shaped like ``dy``, contiguous."""
    strides = (dy_stride, x_stride, plan.shape[1])

    def run(dy, x, w, rstd) -> tuple | None:
        bufs = _bwd_buffers(plan, x, w, dx_like=dy)
        if any(t.data_ptr() % 16 for t in bufs if t is not None):
            return None  # not the specialisation compiled for: the ordinary path
        args = _bwd_args(plan, dy, x, w, rstd, *bufs, strides=strides)
        for go, a in zip(launched, args):  # noqa: B905
            if not go(*a):
                return None  # another device is current, or a hook listens
        return bufs[0], bufs[1]

    return run


class _BwdPlan:
    """What a backward launch depends on that sizes and settings alone decide."""

    __slots__ = ("chunked", "dots_shape", "launches", "n_chunks", "partial_shape", "shape")

    def __init__(self, shape, chunked, partial_shape, dots_shape, launches):
        self.shape, self.chunked = shape, chunked
        self.partial_shape, self.dots_shape = partial_shape, dots_shape
        self.n_chunks = dots_shape[1] if dots_shape else 0
        self.launches = launches  # [(kernel, grid, constexprs and options)]


def _bwd_plan(x, rows=None, warps=None, per_sm=None, chunked=None, chunk=None) -> _BwdPlan:
    n_rows, n_cols = x.shape
    if chunked is None:
        chunked = n_cols > BWD_CHUNKED_THRESHOLD
    launches = []
    dots_shape = None
    if chunked:
        block_n, def_rows, def_warps, def_per_sm = _bwd_chunked_config(n_cols)
        block_n = chunk or block_n
        rows = rows or def_rows
        warps = warps or def_warps
        _check_config(rows, warps)
        _check_chunk(block_n)
        n_chunks = triton.cdiv(n_cols, block_n)
        # 1. Each (row, chunk): its sum(dy * w * x), into an (n_rows, n_chunks) buffer.
        dots_shape = (n_rows, n_chunks)
        dot_meta = {"BLOCK_N": block_n, "num_warps": _warps(block_n, block_n)}
        launches.append((rms_norm_bwd_dot_kernel, (n_rows * n_chunks,), dot_meta))
        # 2. dx, and dweight per (split, column chunk): the persistent grid of the
        #    short-row backward, spread over the column chunks.
        n_progs = _grid_size(x, n_rows * n_chunks, per_sm or def_per_sm)
        n_parts = max(1, min(triton.cdiv(n_rows, rows), n_progs // n_chunks))
        meta = {"BLOCK_N": block_n, "ROWS": rows, "DOTS": _pow2(n_chunks), "num_warps": warps}
        launches.append((rms_norm_bwd_chunked_kernel, (n_chunks, n_parts), meta))
    else:
        block_n, def_rows, def_warps, def_per_sm = _bwd_config(n_cols)
        rows = rows or def_rows
        warps = warps or def_warps
        _check_config(rows, warps)
        n_parts = _grid_size(x, triton.cdiv(n_rows, rows), per_sm or def_per_sm)
        meta = {"BLOCK_N": block_n, "ROWS": rows, "num_warps": warps}
        launches.append((rms_norm_bwd_kernel, (n_parts,), meta))
    # 3. dweight: the partial rows added up and cast, in one launch.
    sum_meta = {"BLOCK_P": SUM_BLOCK_P, "BLOCK_C": SUM_BLOCK_C, "NEED_A": True,
                "NEED_B": False, "num_warps": 4}  # fmt: skip
    launches.append((sum_partials_kernel, sum_partials_grid(n_cols), sum_meta))
    return _BwdPlan(x.shape, chunked, (n_parts, n_cols), dots_shape, launches)


def _bwd_buffers(plan: _BwdPlan, x: torch.Tensor, weight: torch.Tensor, dx_like=None) -> tuple:
    """(dx, dweight, partial sums, dots or None), uninitialised; ``dx`` contiguous, of
    ``plan``'s shape or, given ``dx_like``, of its shape (and x's dtype)."""
    dev = x.device
    if dx_like is None:
        dx = torch.empty(plan.shape, dtype=x.dtype, device=dev)
    else:
        dx = torch.empty_like(dx_like, dtype=x.dtype, memory_format=torch.contiguous_format)
    dw = torch.empty(plan.shape[1], dtype=weight.dtype, device=dev)
    partial = torch.empty(plan.partial_shape, dtype=torch.float32, device=dev)
    dots = torch.empty(plan.dots_shape, dtype=torch.float32, device=dev) if plan.chunked else None
    return dx, dw, partial, dots


def _bwd_args(plan: _BwdPlan, dy, x, w, rstd, dx, dw, partial, dots, strides=None) -> list[tuple]:
    """The runtime arguments of each of ``plan.launches``, in order; ``strides``: the
    row strides of dy, x and dx (default: their ``stride(0)``)."""
    n_rows, n_cols = plan.shape
    strides = strides or (dy.stride(0), x.stride(0), dx.stride(0))
    if plan.chunked:
        args = [
            (dy, x, w, dots, n_cols, *strides[:2]),
            (dy, x, w, rstd, dots, dx, partial, n_rows, n_cols, plan.n_chunks, *strides),
        ]
    else:
        args = [(dy, x, w, rstd, dx, partial, n_rows, n_cols, *strides)]
    # b_ptr is never touched (NEED_B=False): x, an input (see library._check_aliases).
    args.append((partial, dw, x, partial.shape[0], n_cols, n_cols))
    return args


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


class RMSNormFunction(torch.autograd.Function):
    """Autograd for :func:`rms_norm` (``weight`` with unit stride).

    ``run`` is a remembered launch (see :data:`_FAST_GRAD`) to try first; with
    ``remember`` the forward remembers its launch for the next call like this one.
    Both are plumbing of :func:`rms_norm`: they get no gradient.  A forward that ran
    ``run`` hands it to the backward, which keeps its own replay on it
    (``run.backward``): the forward's key fixes x, weight and rstd, so the backward
    needs no key of its own when dy is contiguous, aligned and of x's dtype.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, run=None,
                remember=False) -> torch.Tensor:  # fmt: skip
        got = run(x, weight, eps) if run is not None else None
        if got is not None:  # x is contiguous: the key says so
            y, rstd = got
            saved = x
        else:
            saved = _as_rows(x, x.shape[-1])
            y, rstd = _remembering_forward(x, saved, weight, eps, _FAST_GRAD if remember else None)
        ctx.replays = run if got is not None else None
        ctx.save_for_backward(saved, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        replays, got = ctx.replays, None
        replayable = replays is not None and plain_grad(dy, x.dtype)
        if replayable:
            kept = getattr(replays, "backward", None)
            if kept is not None and kept[:2] == (BWD_CHUNKED_THRESHOLD, CHUNK_BWD):
                got = kept[2](dy, x, weight, rstd)  # dx comes back shaped like dy
        if got is None:
            n_cols = x.shape[-1]
            x2, dy2 = _as_rows(x, n_cols), _as_rows(dy, n_cols)
            dx, dw = _backward(dy2, x2, weight, rstd)
            got = dx.view(dy.shape), dw
            replay = _BWD_FAST.get(_bwd_key(dy2, x2, weight, rstd)) if replayable else None
            if replay is not None:
                replays.backward = (BWD_CHUNKED_THRESHOLD, CHUNK_BWD, replay)
        dx, dw = got
        dx = dx if ctx.needs_input_grad[0] else None
        dw = dw if ctx.needs_input_grad[1] else None
        return dx, dw, None, None, None


# Repeat calls.  A 16384 x 4096 bf16 forward takes about 90 us on an H100, not much
# more than the Python of the checks, autograd.Function and launch key around it.
# So a call on contiguous tensors keeps the Launched of its kernel under the key of
# its shapes, strides, dtypes, device and alignment; the next call with the same key
# only allocates the outputs and launches (eps is a runtime argument of the kernels,
# so it may differ).  Calls that need no gradient skip writing rstd (_FAST); calls
# that do keep it for the backward (_FAST_GRAD), and run inside RMSNormFunction: on
# an H100's host such a forward took 138 us of host time through the checks and the
# configuration, where F.rms_norm took 18.
_FAST = Memo()
_FAST_GRAD = Memo()
_grad_enabled = torch.is_grad_enabled


def _fast_key(x: torch.Tensor, weight: torch.Tensor) -> tuple:
    # FWD_CHUNKED_THRESHOLD is in it: tests change it to reach the chunked kernel.
    return (
        x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0,
        weight.shape, weight.stride(), weight.dtype, weight.device,
        weight.data_ptr() % 16 == 0, FWD_CHUNKED_THRESHOLD,
    )  # fmt: skip


def _remembering_forward(x, x2, weight, eps, memo) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(y shaped like x, rstd)`` for ``x`` and its rows ``x2``; remembers the launch in
    ``memo`` for the next call like this one: :data:`_FAST` (no rstd: nothing for
    autograd to record), :data:`_FAST_GRAD` (with rstd) or None (remember nothing).
    ``weight`` is the caller's."""
    keep_rstd = memo is not _FAST
    y, rstd0, launched = _forward(x2, weight.contiguous(), eps, keep_rstd=keep_rstd)
    if (
        memo is not None
        and launched is not None
        and plain(x)
        and plain(weight)
        and x.is_contiguous()
        and weight.is_contiguous()  # a strided weight was copied: never remembered
    ):
        n_rows, n_cols = x2.shape
        ints = (n_rows, n_cols, x2.stride(0), y.stride(0))
        shape, dtype, device = x.shape, x.dtype, x.device  # the key fixes all three
        aligned = y.data_ptr() % 16 == 0
        empty = torch.empty

        if rstd0 is None:  # the whole-row kernel, told not to write rstd

            def run(t: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor | None:
                out = empty(shape, dtype=dtype, device=device)
                if (out.data_ptr() % 16 == 0) is not aligned:
                    return None  # not the specialisation compiled for: the slow path
                return out if launched(t, w, out, out, *ints, eps) else None

        else:

            def run(t: torch.Tensor, w: torch.Tensor, eps: float) -> tuple | None:
                out = empty(shape, dtype=dtype, device=device)
                rstd = empty((n_rows,), dtype=torch.float32, device=device)
                if (out.data_ptr() % 16 == 0) is not aligned or rstd.data_ptr() % 16:
                    return None  # not the specialisation compiled for: the slow path
                if not launched(t, w, out, rstd, *ints, eps):
                    return None
                return out if not keep_rstd else (out, rstd)

        memo.remember(_fast_key(x, weight), run)
    return y.view(x.shape), rstd0


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        raise TypeError(f"rms_norm: eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"rms_norm: eps must be a positive finite number, got {eps!r}")
    return eps


# ---------------------------------------------------------------------------
# The torch.library operators (what torch.compile traces; see tilebook.ops.library)
# ---------------------------------------------------------------------------


def _op_forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)`` for a 2-D ``x`` with unit column stride and a contiguous weight."""
    y, rstd, _ = _forward(x, weight, eps, run=library.launch)
    return y, rstd


def _op_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)`` for 2-D ``dy`` and ``x`` with unit column stride."""
    return _backward(dy, x, weight, rstd, run=library.launch)


_KERNELS = (
    rms_norm_fwd_kernel, rms_norm_fwd_chunked_kernel, rms_norm_bwd_kernel,
    rms_norm_bwd_dot_kernel, rms_norm_bwd_chunked_kernel, sum_partials_kernel,
)  # fmt: skip
rms_norm_op = library.define("rms_norm", _op_forward, kernels=_KERNELS)
rms_norm_backward_op = library.define("rms_norm_backward", _op_backward, kernels=_KERNELS)


def _op_setup(ctx, inputs, output) -> None:
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _op_grad(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward_op(_as_rows(dy, x.shape[1]), x, weight, rstd)
    return dx, dw, None


rms_norm_op.register_autograd(_op_grad, setup_context=_op_setup)


def _compiled(x: torch.Tensor, weight: torch.Tensor, eps: object) -> torch.Tensor:
    """:func:`rms_norm` inside torch.compile: the checks, then the operator."""
    eps = _check_args(x, weight, eps)
    y, _ = rms_norm_op(_as_rows(x, x.shape[-1]), weight.contiguous(), eps)
    return y.view(x.shape)


def _check_args(x: object, weight: object, eps: object) -> float:
    """Every check of :func:`rms_norm`'s arguments; returns ``eps`` as a float."""
    check_tensor(x, "x", "rms_norm", min_ndim=1)
    check_tensor(weight, "weight", "rms_norm", ndim=1)
    eps = _check_eps(eps)
    n_cols = x.shape[-1]
    if n_cols == 0:
        raise ValueError(
            f"rms_norm: the last dimension of x must not be empty, got {tuple(x.shape)}"
        )
    if weight.shape[0] != n_cols:
        raise ValueError(
            f"rms_norm: weight must have shape ({n_cols},) to match the last dimension of x "
            f"{tuple(x.shape)}, got {tuple(weight.shape)}"
        )
    if weight.dtype != x.dtype:
        raise TypeError(
            f"rms_norm: weight must have the dtype of x ({str(x.dtype).removeprefix('torch.')}), "
            f"got {str(weight.dtype).removeprefix('torch.')}"
        )
    check_same_device("rms_norm", x=x, weight=weight)
    if n_cols > MAX_HIDDEN:
        raise ValueError(
            f"rms_norm: the last dimension of x is {n_cols}, but rms_norm supports at most "
            f"{MAX_HIDDEN}"
        )
    return eps


_compiling = torch.compiler.is_compiling


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The five kernels as jobs of :func:`tilebook.aot.compile_many` for ``sm_<arch>``,
    configured as the launchers configure them: rows of 4096 (whole rows in
    registers) and of 65536 (the chunked kernels)."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    jobs = {}
    for n_rows, n_cols in ((64, 4096), (8, 65536)):
        x = targets.meta_tensor(n_rows, n_cols, dtype=dt)
        w = targets.meta_tensor(n_cols, dtype=dt)
        rstd = targets.meta_tensor(n_rows)
        where = f"{n_rows}x{n_cols}"
        jobs |= targets.recorded(lambda x=x, w=w: _op_forward(x, w, 1e-6), arch, where)
        jobs |= targets.recorded(lambda x=x, w=w, r=rstd: _op_backward(x, x, w, r), arch, where)
    return jobs


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension, with a learned scale.

    Computes ``x * rsqrt(mean(x**2, -1) + eps) * weight`` in fp32 and returns it in
    ``x.dtype``; the same as ``torch.nn.functional.rms_norm(x, (H,), weight, eps)``
    up to rounding.  Differentiable with respect to ``x`` and ``weight``.

    Parameters
    ----------
    x
        Tensor of shape ``(..., H)``, float16, bfloat16 or float32, on tilebook's
        device.  Any strides: rows that are not evenly strided are copied first.
        ``H`` may be at most :data:`MAX_HIDDEN` (``2**20``); long rows take the
        chunked kernels.
    weight
        1-D tensor of size ``H`` with the same dtype and device as ``x``.
    eps
        Positive number added to the mean square, for stability.

    Notes
    -----
    Inside ``torch.compile`` the call is the operator ``torch.ops.tilebook.rms_norm``
    (:mod:`tilebook.ops.library`): no graph break, and Inductor sees the kernels.

    Examples
    --------
    >>> y = tilebook.rms_norm(x, weight, eps=1e-6)   # doctest: +SKIP
    """
    if _compiling():
        return _compiled(x, weight, eps)
    grad = None
    if plain(x) and plain(weight) and type(eps) is float:
        grad = (x.requires_grad or weight.requires_grad) and _grad_enabled()
        run = (_FAST_GRAD if grad else _FAST).get(_fast_key(x, weight))
        if run is not None and eps > 0 and math.isfinite(eps):
            if grad:
                return RMSNormFunction.apply(x, weight, eps, run)  # falls back inside
            y = run(x, weight, eps)
            if y is not None:
                return y
    eps = _check_args(x, weight, eps)
    if grad is None:
        grad = (x.requires_grad or weight.requires_grad) and _grad_enabled()
    if not grad:
        return _remembering_forward(x, _as_rows(x, x.shape[-1]), weight, eps, _FAST)[0]
    # The kernels read weight with unit stride; a strided one is copied (and recorded).
    return RMSNormFunction.apply(x, weight.contiguous(), eps, None, weight.is_contiguous())
