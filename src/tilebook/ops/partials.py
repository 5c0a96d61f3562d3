"""The last step of a lock-free reduction over rows: adding up per-program partial sums.

The backward passes of :mod:`tilebook.ops.rms_norm` and :mod:`tilebook.ops.layer_norm`
need sums over *all* rows (``dweight``, ``dbias``).  Instead of atomics or a lock,
each program of a persistent grid keeps its rows' share in registers and writes it
once, as one row of a small fp32 buffer; :func:`sum_partials_kernel` then adds the
rows of that buffer, always in the same order (so the result is deterministic), and
casts the sums to the parameter's dtype: one launch where torch would take two (a
``sum`` and a ``to``) or, for two sums, four.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["SUM_BLOCK_C", "SUM_BLOCK_P", "sum_partials_grid", "sum_partials_kernel"]

#: Tile of :func:`sum_partials_kernel`: partial rows by columns.
SUM_BLOCK_P = 32
SUM_BLOCK_C = 128


@triton.jit
def sum_partials_kernel(
    partial_ptr,  # (n_parts, part_stride) fp32: sum A at column c, sum B at n_cols + c
    a_ptr,  # (n_cols,) sum A's output, or unused (NEED_A False)
    b_ptr,  # (n_cols,) sum B's output, or unused (NEED_B False)
    n_parts,
    n_cols,
    part_stride,  # n_cols for one sum per part, 2 * n_cols for two
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NEED_A: tl.constexpr,
    NEED_B: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    parts = tl.arange(0, BLOCK_P)
    acc_a = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        p = p0 + parts
        mask = (p < n_parts)[:, None] & col_ok[None, :]
        ptrs = partial_ptr + p[:, None] * part_stride + cols[None, :]
        if NEED_A:
            acc_a += tl.load(ptrs, mask=mask, other=0.0)
        if NEED_B:
            acc_b += tl.load(ptrs + n_cols, mask=mask, other=0.0)
    if NEED_A:
        tl.store(a_ptr + cols, tl.sum(acc_a, axis=0).to(a_ptr.dtype.element_ty), mask=col_ok)
    if NEED_B:
        tl.store(b_ptr + cols, tl.sum(acc_b, axis=0).to(b_ptr.dtype.element_ty), mask=col_ok)


def sum_partials_grid(n_cols: int) -> tuple[int]:
    """The launch grid of :func:`sum_partials_kernel` for ``n_cols`` columns."""
    return (-(-n_cols // SUM_BLOCK_C),)
