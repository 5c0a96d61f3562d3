"""RMSNorm, forward and backward, as one ``torch.autograd.Function``.

``y = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x**2) + eps)`` over the last
dimension, the normalisation of Llama-style transformers.  One file holds the two
kernels, their launchers and the autograd glue.

* Forward: one pass.  A program loads whole rows into registers, reduces them to
  ``rstd`` and scales them before anything is written back, so ``x`` is read from
  memory once.  ``rstd`` (fp32, one per row) is kept for the backward pass.
* Backward: ``dx`` row by row, and ``dweight``, a sum over *all* rows.  Instead of
  atomics or locks, a persistent grid (a few programs per SM) walks the rows; each
  program adds its rows' ``dy * x_hat`` into an fp32 accumulator that stays in
  registers and writes it once, as one row of a ``(programs, H)`` buffer.  A
  final sum over that small buffer gives ``dweight``, deterministically.

Both passes are memory-bound: a handful of flops per element against 2 (forward)
or 3 (backward) full tensors of traffic, so the aim is the copy bandwidth.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ..validation import check_tensor

__all__ = [
    "MAX_HIDDEN",
    "RMSNormFunction",
    "launch_rms_norm_bwd",
    "launch_rms_norm_fwd",
    "rms_norm",
    "rms_norm_bwd_kernel",
    "rms_norm_fwd_kernel",
]

#: Largest hidden size.  A whole row (rounded up to a power of two) lives in one
#: program's registers: up to 8192 nothing spills; longer rows make the backward
#: kernel spill a little (at 16384 that is still the fastest configuration measured
#: on an H100), and more the longer they get.
MAX_HIDDEN = 65536


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
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    # int64 row offsets: n_rows * stride passes 2**31 for large activations.
    rows64 = rows.to(tl.int64)[:, None]

    x = tl.load(x_ptr + rows64 * x_row_stride + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    # Masked columns load as 0, so they add nothing to the sum of squares.
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows64 * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
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
# Launch configuration
# ---------------------------------------------------------------------------


# The heuristics below come from a sweep on an H100 (bf16, 16384 rows, hidden
# sizes 1024 to 16384; ``benchmarks/rms_norm.py --tune``).  Every choice within a
# few percent of the best was kept only if it followed one simple rule.


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
    block_n = triton.next_power_of_2(n_cols)
    rows = min(16, max(1, 4096 // block_n))
    return block_n, rows, _warps(rows * block_n, block_n)


#: Resident warps per SM that the persistent backward grid aims for.
BWD_WARPS_PER_SM = 16


def _bwd_config(n_cols: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, rows per loop step, num_warps, programs per SM) for the backward kernel.

    Short rows are grouped half as far as in the forward: the backward keeps the dw
    accumulator in registers as well as x and dy.  The grid holds
    :data:`BWD_WARPS_PER_SM` warps per SM: small programs come several to an SM,
    large ones one.
    """
    block_n = triton.next_power_of_2(n_cols)
    rows = min(8, max(1, 2048 // block_n))
    warps = _warps(rows * block_n, block_n)
    return block_n, rows, warps, max(1, BWD_WARPS_PER_SM // warps)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _bwd_grid_size(x: torch.Tensor, n_blocks: int, programs_per_sm: int) -> int:
    # Under the interpreter a handful of programs is enough to exercise the
    # partial-sum path without making the (serial) interpreter slow.
    sms = _sm_count(x.device.index or 0) if x.is_cuda else 4
    return max(1, min(n_blocks, sms * programs_per_sm))


def _check_config(rows: int, num_warps: int) -> None:
    if rows <= 0 or rows & (rows - 1):
        raise ValueError(f"rms_norm: rows per program must be a power of two, got {rows}")
    if num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"rms_norm: num_warps must be a power of two up to 32, got {num_warps}")


def launch_rms_norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel on a checked 2-D ``x`` with unit column stride.

    Returns ``(y, rstd)``: ``y`` contiguous with ``x``'s shape and dtype, ``rstd``
    fp32 of shape ``(n_rows,)``.  ``rows_per_program`` and ``num_warps`` override
    the heuristic (the benchmark sweeps them).
    """
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    rstd = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return y, rstd
    block_n, rows, warps = _fwd_config(n_cols)
    rows = rows_per_program or rows
    warps = num_warps or warps
    _check_config(rows, warps)
    grid = (triton.cdiv(n_rows, rows),)
    rms_norm_fwd_kernel[grid](
        x, weight, y, rstd, n_rows, n_cols, x.stride(0), y.stride(0), eps,
        BLOCK_N=block_n, ROWS=rows, num_warps=warps,
    )  # fmt: skip
    return y, rstd


def launch_rms_norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    programs_per_sm: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the backward kernel on checked 2-D ``dy`` and ``x`` (unit column stride).

    Returns ``(dx, dweight)`` in the dtypes of ``x`` and ``weight``.
    """
    n_rows, n_cols = x.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return dx, torch.zeros_like(weight)
    block_n, rows, warps, per_sm = _bwd_config(n_cols)
    rows = rows_per_program or rows
    warps = num_warps or warps
    _check_config(rows, warps)
    n_progs = _bwd_grid_size(x, triton.cdiv(n_rows, rows), programs_per_sm or per_sm)
    dw_partial = torch.empty((n_progs, n_cols), dtype=torch.float32, device=x.device)
    rms_norm_bwd_kernel[(n_progs,)](
        dy, x, weight, rstd, dx, dw_partial, n_rows, n_cols,
        dy.stride(0), x.stride(0), dx.stride(0),
        BLOCK_N=block_n, ROWS=rows, num_warps=warps,
    )  # fmt: skip
    return dx, dw_partial.sum(dim=0).to(weight.dtype)


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
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        n_cols = x.shape[-1]
        x2 = _as_rows(x, n_cols)
        y, rstd = launch_rms_norm_fwd(x2, weight, eps)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        dy2 = _as_rows(dy, x2.shape[1])
        dx, dw = launch_rms_norm_bwd(dy2, x2, weight, rstd)
        dx = dx.view(ctx.x_shape) if ctx.needs_input_grad[0] else None
        dw = dw if ctx.needs_input_grad[1] else None
        return dx, dw, None


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        raise TypeError(f"rms_norm: eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"rms_norm: eps must be a positive finite number, got {eps!r}")
    return eps


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
        ``H`` may be at most :data:`MAX_HIDDEN` (65536).
    weight
        1-D tensor of size ``H`` with the same dtype and device as ``x``.
    eps
        Positive number added to the mean square, for stability.

    Examples
    --------
    >>> y = tilebook.rms_norm(x, weight, eps=1e-6)   # doctest: +SKIP
    """
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
    if weight.device != x.device:
        raise ValueError(
            f"rms_norm: x and weight are on different devices ({x.device}, {weight.device})"
        )
    if n_cols > MAX_HIDDEN:
        raise ValueError(
            f"rms_norm: the last dimension of x is {n_cols}, but this kernel keeps a whole row "
            f"in registers and supports at most {MAX_HIDDEN}"
        )
    # The kernels read weight with unit stride.
    weight = weight.contiguous()
    return RMSNormFunction.apply(x, weight, eps)
