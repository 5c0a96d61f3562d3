"""Softmax over one dimension, forward and backward, as Triton kernels.

``y = exp(x - max(x)) / sum(exp(x - max(x)))`` along a row.  Both directions are
memory-bound: the forward reads ``x`` and writes ``y``; the backward reads ``y`` and
``dy`` and writes ``dx = y * (dy - sum(dy * y))``.  The aim is to touch each byte
of HBM once, so the kernels come in two shapes:

* **single pass** (rows up to :data:`ONLINE_THRESHOLD` elements, padded to a power
  of two, in both directions): a program loads a tile of
  ``BLOCK_M`` whole rows into registers, reduces them and writes the result.  Short
  rows share a program so that each one still moves enough bytes to hide the
  latency of HBM.
* **online** (longer rows): a program walks its row in chunks of ``BLOCK_N``
  keeping a running maximum and a running sum that is rescaled whenever the maximum
  grows (Milakov & Gimelshein, 2018), then walks the row again to write.  The
  second walk goes backwards, so that it starts on the chunks most likely to still
  be in L2.

Arithmetic is in float32 whatever the storage dtype.  ``-inf`` entries get
probability 0 and a row that is all ``-inf`` becomes NaN, as in ``torch.softmax``.

The module is longer than 500 lines because of those two shapes in two directions:
four kernels of some 160 lines, and the configurations measured for each row length
and direction, with their reasons, another 100.  The launcher, the plan of a call,
the autograd path and the operator take the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .._launch import PLANS, Step, call_key, plain, plain_grad, sm_count
from ..validation import check_tensor
from . import library
from .precision import autocasting, upper

__all__ = ["ONLINE_BLOCK", "ONLINE_THRESHOLD", "SoftmaxConfig", "SoftmaxFunction", "compile_jobs",
           "launch_softmax_backward", "launch_softmax_forward", "pick_config", "softmax"]  # fmt: skip

#: Rows whose padded length exceeds this many elements take the online kernels.
#: Module-level so that tests can lower it and reach the online path at small sizes.
ONLINE_THRESHOLD = 32768
#: Chunk length of the online kernels; None keeps the tuned one (4096 forward, 8192
#: backward).  Tests set it small to get many chunks out of short rows.
ONLINE_BLOCK: int | None = None


# --------------------------------------------------------------------------- kernels
# EVICT is the L2 policy of loads and stores that stream (read or written once):
# "" (the default), "evict_first" or "evict_last" (which, against intuition, measured
# fastest for the single-pass kernels).  INT64 widens row offsets past 2**31.


@triton.jit
def softmax_fwd_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    stride_x,  # elements between consecutive rows of x
    stride_y,
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,  # n_cols padded to a power of two
    EVEN_M: tl.constexpr,  # n_rows % BLOCK_M == 0: no row mask
    EVEN_N: tl.constexpr,  # n_cols == BLOCK_N: no column mask
    NUM_STAGES: tl.constexpr,  # >1 lets the compiler prefetch the next tile
    EVICT: tl.constexpr,
    INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    num_tiles = tl.cdiv(n_rows, BLOCK_M)
    # With one program per tile this loop runs once; with a persistent grid each
    # program strides over the tiles.
    for tile in tl.range(pid, num_tiles, nprog, num_stages=NUM_STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        if EVEN_N:
            mask = (rows < n_rows)[:, None]
        else:
            mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        if INT64:
            rows = rows.to(tl.int64)
        x_ptrs = x_ptr + rows[:, None] * stride_x + cols[None, :]
        if EVEN_M and EVEN_N:  # no predicates at all on exact tiles
            x = tl.load(x_ptrs, eviction_policy=EVICT)
        else:
            x = tl.load(x_ptrs, mask=mask, other=-float("inf"), eviction_policy=EVICT)
        x = x.to(tl.float32)
        # An all -inf row gives -inf - -inf = NaN here, which is what torch returns.
        e = tl.exp(x - tl.max(x, axis=1)[:, None])
        y = (e * (1.0 / tl.sum(e, axis=1))[:, None]).to(y_ptr.dtype.element_ty)
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        if EVEN_M and EVEN_N:
            tl.store(y_ptrs, y, eviction_policy=EVICT)
        else:
            tl.store(y_ptrs, y, mask=mask, eviction_policy=EVICT)


@triton.jit
def softmax_fwd_online_kernel(
    x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y,
    BLOCK_N: tl.constexpr,  # chunk length
    NUM_STAGES: tl.constexpr, EVICT: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if INT64:
        pid = pid.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    for i in tl.range(0, tl.cdiv(n_rows - pid, nprog)):
        row = pid + i * nprog
        x_row = x_ptr + row * stride_x
        y_row = y_ptr + row * stride_y
        m = tl.full([], -float("inf"), tl.float32)  # running maximum
        s = tl.zeros([], tl.float32)  # running sum of exp(x - m)
        for c in tl.range(0, n_chunks, num_stages=NUM_STAGES):
            offs = c * BLOCK_N + cols
            # evict_last: the second walk wants to find this chunk in L2.
            x = tl.load(
                x_row + offs, mask=offs < n_cols, other=-float("inf"), eviction_policy="evict_last"
            ).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            # Shift by 0 while everything seen is -inf, so that exp(-inf - -inf) does
            # not turn the sum into NaN before a finite value arrives.
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
            m = m_new
        # An all -inf row ends with s == 0, and 0 * (1 / 0) = NaN as in torch.
        shift = tl.where(m == -float("inf"), 0.0, m)
        inv = 1.0 / s
        for j in tl.range(0, n_chunks, num_stages=NUM_STAGES):
            offs = (n_chunks - 1 - j) * BLOCK_N + cols  # newest chunk first: still in L2
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=-float("inf"), eviction_policy=EVICT)
            y = tl.exp(x.to(tl.float32) - shift) * inv
            tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy=EVICT)


@triton.jit
def softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, stride_y, stride_dy, stride_dx,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    NUM_STAGES: tl.constexpr, EVICT: tl.constexpr, INT64: tl.constexpr,
    RELOAD: tl.constexpr,  # read y and dy again for dx (see SoftmaxConfig.reload)
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    num_tiles = tl.cdiv(n_rows, BLOCK_M)
    for tile in tl.range(pid, num_tiles, nprog, num_stages=NUM_STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        if EVEN_N:
            mask = (rows < n_rows)[:, None]
        else:
            mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        if INT64:
            rows = rows.to(tl.int64)
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        dy_ptrs = dy_ptr + rows[:, None] * stride_dy + cols[None, :]
        y, dy = _load_pair(y_ptrs, dy_ptrs, mask, EVEN_M and EVEN_N, EVICT)
        dot = tl.sum(y * dy, axis=1)
        if RELOAD:
            # The rows again, from L2 (EVICT keeps them there), instead of from
            # registers: registers then hold one use of the rows, not both.
            y, dy = _load_pair(y_ptrs, dy_ptrs, mask, EVEN_M and EVEN_N, "evict_first")
        dx = (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty)
        dx_ptrs = dx_ptr + rows[:, None] * stride_dx + cols[None, :]
        LAST: tl.constexpr = "evict_first" if RELOAD else EVICT  # the rows' last use
        if EVEN_M and EVEN_N:
            tl.store(dx_ptrs, dx, eviction_policy=LAST)
        else:
            tl.store(dx_ptrs, dx, mask=mask, eviction_policy=LAST)


@triton.jit
def _load_pair(y_ptrs, dy_ptrs, mask, EVEN: tl.constexpr, EVICT: tl.constexpr):
    """y and dy as float32 (masked unless the tile is EVEN)."""
    if EVEN:
        y = tl.load(y_ptrs, eviction_policy=EVICT)
        dy = tl.load(dy_ptrs, eviction_policy=EVICT)
    else:
        y = tl.load(y_ptrs, mask=mask, other=0.0, eviction_policy=EVICT)
        dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy=EVICT)
    return y.to(tl.float32), dy.to(tl.float32)


@triton.jit
def softmax_bwd_online_kernel(
    y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, stride_y, stride_dy, stride_dx,
    BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, EVICT: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if INT64:
        pid = pid.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    for i in tl.range(0, tl.cdiv(n_rows - pid, nprog)):
        row = pid + i * nprog
        y_row = y_ptr + row * stride_y
        dy_row = dy_ptr + row * stride_dy
        dx_row = dx_ptr + row * stride_dx
        # Accumulate lane-wise and reduce once: no cross-warp reduction per chunk.
        acc = tl.zeros([BLOCK_N], tl.float32)
        for c in tl.range(0, n_chunks, num_stages=NUM_STAGES):
            offs = c * BLOCK_N + cols
            mask = offs < n_cols
            y = tl.load(y_row + offs, mask=mask, other=0.0, eviction_policy="evict_last")
            dy = tl.load(dy_row + offs, mask=mask, other=0.0, eviction_policy="evict_last")
            acc += y.to(tl.float32) * dy.to(tl.float32)
        dot = tl.sum(acc, axis=0)
        for j in tl.range(0, n_chunks, num_stages=NUM_STAGES):
            offs = (n_chunks - 1 - j) * BLOCK_N + cols
            mask = offs < n_cols
            y = tl.load(y_row + offs, mask=mask, other=0.0, eviction_policy=EVICT)
            dy = tl.load(dy_row + offs, mask=mask, other=0.0, eviction_policy=EVICT)
            dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
            tl.store(
                dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask, eviction_policy=EVICT
            )


# -------------------------------------------------------------------------- launching


@dataclass(frozen=True)
class SoftmaxConfig:
    """How one launch tiles the work.

    ``block_n`` is the padded row (single pass) or the chunk length (online);
    ``block_m`` rows share a program in the single-pass kernels.  ``ctas_per_sm``
    makes the grid persistent (that many programs per SM, each looping over
    tiles); ``None`` launches one program per tile.  ``evict`` is the L2 policy of
    the streaming loads and stores: ``""``, ``"evict_first"`` or ``"evict_last"``.
    ``reload`` (single-pass backward only) loads ``y`` and ``dy`` a second time for
    ``dx``, from L2, rather than keeping them in registers past the row sum.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1
    online: bool = False
    ctas_per_sm: int | None = None
    evict: str = ""
    reload: bool = False


_C = SoftmaxConfig
# Winners of `python benchmarks/softmax.py --tune` per padded row length: H100 SXM,
# bf16, 256 MB inputs, triton 3.6.  Widths below the smallest key keep its tile size
# in elements.  evict_last on the single-pass kernels' loads and stores beat no hint
# by about 1% at every width (2026-11-22, interleaved timings, 256 to 8192 columns),
# and evict_first won for the second walk of the online ones.  Backward holds two
# rows (y and dy): at 32768 its single pass spills 16 bytes (8 warps, 255 registers;
# 14 bytes at 16 warps), yet measured 534 us against 575 for the two-walk online
# kernel and 527 for torch.compile (H100, bf16, 8192 rows, 2026-11-27).  Reading
# the rows again for dx (reload: from L2, as Inductor's kernel does) took
# 526.5-527.6 us over 12 settings against torch.compile's 527.2 and 533.8 without.
_L = "evict_last"
_FWD_TABLE: dict[int, SoftmaxConfig] = {
    256: _C(16, 256, 16, evict=_L),
    512: _C(16, 512, 16, evict=_L),
    1024: _C(8, 1024, 16, evict=_L),
    2048: _C(4, 2048, 16, evict=_L),
    4096: _C(2, 4096, 16, evict=_L),
    8192: _C(1, 8192, 16, evict=_L),
    16384: _C(1, 16384, 16, evict=_L),
    32768: _C(1, 32768, 16, evict=_L),
}
_BWD_TABLE: dict[int, SoftmaxConfig] = {
    256: _C(32, 256, 16, evict=_L),
    512: _C(16, 512, 16, evict=_L),
    1024: _C(8, 1024, 8, evict=_L),
    2048: _C(4, 2048, 16, evict=_L),
    4096: _C(2, 4096, 16, evict=_L),
    8192: _C(1, 8192, 16, evict=_L),
    16384: _C(1, 16384, 16, evict=_L),
    32768: _C(1, 32768, 32, evict=_L, reload=True),
}
# Rows longer than ONLINE_THRESHOLD (the best online configurations of the sweep).
_FWD_ONLINE = _C(1, 4096, 8, online=True, evict="evict_first")
_BWD_ONLINE = _C(1, 8192, 16, online=True, evict="evict_first")


def pick_config(n_cols: int, *, backward: bool = False) -> SoftmaxConfig:
    """The launch configuration for rows of ``n_cols`` elements."""
    width = max(16, triton.next_power_of_2(n_cols))
    if width > ONLINE_THRESHOLD:
        base = _BWD_ONLINE if backward else _FWD_ONLINE
        return replace(base, block_n=min(ONLINE_BLOCK or base.block_n, width))
    table = _BWD_TABLE if backward else _FWD_TABLE
    key = min(max(width, min(table)), max(table))
    cfg = table[key]
    if cfg.online:
        return replace(cfg, block_n=min(ONLINE_BLOCK or cfg.block_n, width))
    return replace(cfg, block_m=max(1, cfg.block_m * key // width), block_n=width)


def _grid(n_rows: int, cfg: SoftmaxConfig, device: torch.device) -> tuple[int]:
    tiles = n_rows if cfg.online else triton.cdiv(n_rows, cfg.block_m)
    if cfg.ctas_per_sm is None or device.type != "cuda":
        return (tiles,)  # the interpreter gains nothing from a persistent grid
    return (max(1, min(tiles, cfg.ctas_per_sm * sm_count(device))),)


def _check_config(cfg: SoftmaxConfig, n_cols: int) -> None:
    if not all(v > 0 and v & (v - 1) == 0 for v in (cfg.block_m, cfg.block_n)):
        raise ValueError(f"softmax: block_m and block_n must be powers of two, got {cfg}")
    if cfg.num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"softmax: num_warps must be a power of two up to 32, got {cfg}")
    if cfg.evict not in ("", "evict_first", "evict_last"):
        raise ValueError(f"softmax: evict must be '', 'evict_first' or 'evict_last', got {cfg}")
    if cfg.reload and cfg.online:
        raise ValueError(f"softmax: reload is an option of the single-pass backward, got {cfg}")
    if not cfg.online and cfg.block_n < n_cols:
        raise ValueError(f"softmax: single-pass block_n must cover the row of {n_cols}, got {cfg}")


def _needs_int64(n_rows: int, cfg: SoftmaxConfig, *tensors: torch.Tensor) -> bool:
    # Padding rows of the last tile compute addresses too (masked, but they must not wrap).
    rows = n_rows if cfg.online else triton.cdiv(n_rows, cfg.block_m) * cfg.block_m
    reach = max(rows * abs(t.stride(0)) + max(t.shape[1], cfg.block_n) for t in tensors)
    return bool(reach >= 2**31)  # a plain bool even for symbolic shapes


def _meta(cfg: SoftmaxConfig, n_rows: int, n_cols: int, *tensors: torch.Tensor) -> dict:
    """The constexprs and launch options shared by the kernels of one direction."""
    meta = {"BLOCK_N": cfg.block_n, "NUM_STAGES": cfg.num_stages, "EVICT": cfg.evict,
            "INT64": _needs_int64(n_rows, cfg, *tensors), "num_warps": cfg.num_warps}  # fmt: skip
    if not cfg.online:
        meta |= {"BLOCK_M": cfg.block_m, "EVEN_M": n_rows % cfg.block_m == 0,
                 "EVEN_N": n_cols == cfg.block_n}  # fmt: skip
    return meta


def _step(cfg: SoftmaxConfig, n_rows: int, n_cols: int, *tensors, backward: bool = False) -> Step:
    """The launch of one direction on non-empty 2-D ``tensors`` with unit row stride:
    ``(x, y)`` forward, ``(y, dy, dx)`` backward (only their layouts are read)."""
    _check_config(cfg, n_cols)
    if cfg.reload and not backward:
        raise ValueError(f"softmax: reload is an option of the backward, got {cfg}")
    meta = _meta(cfg, n_rows, n_cols, *tensors)
    if not backward:
        kernel = softmax_fwd_online_kernel if cfg.online else softmax_fwd_kernel
    elif cfg.online:
        kernel = softmax_bwd_online_kernel
    else:
        kernel, meta["RELOAD"] = softmax_bwd_kernel, cfg.reload
    return Step(kernel, _grid(n_rows, cfg, tensors[0].device), meta)


def launch_softmax_forward(x, y, config: SoftmaxConfig | None = None, *, via=None):
    """Softmax of each row of the 2-D ``x`` into ``y``; returns ``y``.

    Both must have unit stride along the row; rows may be any distance apart.  ``via``:
    the launcher (default :func:`tilebook._launch.launch`; the operator passes its own).
    """
    n_rows, n_cols = x.shape
    if n_rows and n_cols:
        step = _step(config or pick_config(n_cols), n_rows, n_cols, x, y)
        args = (x, y, n_rows, n_cols, x.stride(0), y.stride(0))
        step.via(via, *args) if via is not None else step.anew(*args)
    return y


def launch_softmax_backward(y, dy, dx, config: SoftmaxConfig | None = None, *, via=None):
    """``dx = y * (dy - sum(dy * y))`` row by row into ``dx``, for 2-D tensors with unit
    row stride; returns ``dx``.  ``via`` as for :func:`launch_softmax_forward`."""
    n_rows, n_cols = y.shape
    if n_rows and n_cols:
        cfg = config or pick_config(n_cols, backward=True)
        step = _step(cfg, n_rows, n_cols, y, dy, dx, backward=True)
        args = (y, dy, dx, n_rows, n_cols, y.stride(0), dy.stride(0), dx.stride(0))
        step.via(via, *args) if via is not None else step.anew(*args)
    return dx


def _rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as ``(rows, n_cols)`` with unit stride along a row, copied only if need be
    (a transpose; the stride-0 ``dy`` of ``y.sum().backward()``)."""
    rows = t.reshape(-1, n_cols)
    return rows if n_cols <= 1 or rows.stride(1) == 1 else rows.contiguous()


# --------------------------------------------------------------------------- plans
# A 512-column softmax over 256 MB takes 180 us on an H100, and the checks, the
# configuration and Triton's launch as long again on the host: with do_bench's L2
# flush in between, that shows.  So a call is planned once per call key
# (tilebook._launch.call_key: x's layout, dim and the module's knobs) and the plan
# kept in PLANS; a repeat call allocates y and starts the kept compiled kernel.


class _Plan:
    """A call on ``x`` of one call key: softmax over ``dim`` (``moved``: not the last,
    so the kernels see ``x.movedim(dim, -1)``), the forward's launch (None: x is empty),
    the rows and x's row stride; ``direct``: x is passed as it is (its rows are evenly
    strided).  ``bwd``: the backward's launch, made by its first contiguous ``dy``."""

    __slots__ = ("bwd", "dim", "direct", "moved", "n_cols", "n_rows", "step", "x_stride")

    def __init__(self, x: torch.Tensor, dim: int):
        self.dim, self.moved = dim, dim != x.dim() - 1
        x = x.movedim(dim, -1) if self.moved else x
        self.n_cols = n_cols = x.shape[-1]
        self.n_rows = n_rows = math.prod(x.shape[:-1])
        self.step = self.bwd = None
        self.direct, self.x_stride = True, n_cols
        if n_rows and n_cols:
            x2 = _rows(x, n_cols)
            self.direct, self.x_stride = x2.data_ptr() == x.data_ptr(), x2.stride(0)
            y2 = torch.empty(x2.shape, dtype=x.dtype, device="meta")  # y's layout
            self.step = _step(pick_config(n_cols), n_rows, n_cols, x2, y2)


_empty_like, _CONTIGUOUS = torch.empty_like, torch.contiguous_format


def _forward(plan: _Plan, x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` (as the plan's kernels see it) over its last dimension, into a
    contiguous ``y`` (empty_like: half of torch.empty's host time)."""
    y = _empty_like(x, memory_format=_CONTIGUOUS)
    step = plan.step
    if step is not None:
        x2 = x if plan.direct else _rows(x, plan.n_cols)
        args = (x2, y, plan.n_rows, plan.n_cols, plan.x_stride, plan.n_cols)
        if y.data_ptr() & 15:  # not the specialisation the plan launched: launch() keys it
            step.anew(*args)
        else:
            step(*args) or step.anew(*args)
    return y


def _backward(plan: _Plan, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """``dx`` for the forward of ``plan`` that returned ``y``, and ``dy`` of y's shape."""
    n_rows, n_cols = plan.n_rows, plan.n_cols
    dx = _empty_like(y)  # y is contiguous: the forward made it
    if plan.step is None:
        return dx
    if not plain_grad(dy, y.dtype):  # e.g. .sum().backward()'s expanded ones
        rows = (y.view(n_rows, n_cols), _rows(dy, n_cols), dx.view(n_rows, n_cols))
        launch_softmax_backward(*rows)
        return dx
    step = plan.bwd
    if step is None:  # y, dy and dx alike: contiguous
        rows = y.view(n_rows, n_cols)
        cfg = pick_config(n_cols, backward=True)
        step = plan.bwd = _step(cfg, n_rows, n_cols, rows, rows, rows, backward=True)
    args = (y, dy, dx, n_rows, n_cols, n_cols, n_cols, n_cols)
    if (y.data_ptr() | dx.data_ptr()) & 15:
        step.anew(*args)
    else:
        step(*args) or step.anew(*args)
    return dx


# --------------------------------------------------------------------------- autograd


_compiling = torch.compiler.is_compiling


class SoftmaxFunction(torch.autograd.Function):
    """Autograd for softmax over the last dimension of ``x`` (any strides).

    Eagerly it launches the kernels of ``plan`` (the call's plan, planned here if not
    given; plumbing of :func:`softmax`, it gets no gradient).  Inside torch.compile
    ``x`` is 2-D and the two directions are the operators ``torch.ops.tilebook.softmax``
    and ``softmax_backward``, which Dynamo puts in its graph as they are.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, plan: _Plan | None = None) -> torch.Tensor:
        if plan is None and _compiling():  # (softmax passes a plan whenever it is eager)
            ctx.plan, y = None, softmax_op(x)
        else:
            ctx.plan = plan = plan or _Plan(x, x.dim() - 1)
            y = _forward(plan, x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        if ctx.plan is None:  # the forward was traced
            return softmax_backward_op(y, dy), None
        return _backward(ctx.plan, y, dy), None


# -------------------------------------------------------------------------- torch.library


def _op_forward(x: torch.Tensor) -> torch.Tensor:
    """Softmax of each row of a 2-D ``x``."""
    x = _rows(x, x.shape[1])
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return launch_softmax_forward(x, y, via=library.launch)


def _op_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """``y * (dy - sum(dy * y))`` row by row, for 2-D ``y`` and ``dy``."""
    y, dy = _rows(y, y.shape[1]), _rows(dy, dy.shape[1])
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    return launch_softmax_backward(y, dy, dx, via=library.launch)


_KERNELS = (softmax_fwd_kernel, softmax_fwd_online_kernel, softmax_bwd_kernel,
            softmax_bwd_online_kernel)  # fmt: skip
softmax_op = library.define("softmax", _op_forward, kernels=_KERNELS)
softmax_backward_op = library.define("softmax_backward", _op_backward, kernels=_KERNELS)


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The four kernels as jobs of :func:`tilebook.course.aot.compile_many` for ``sm_<arch>``,
    configured as :func:`pick_config` configures them: rows of 16384 (the widest that
    both directions take in one pass) and rows past :data:`ONLINE_THRESHOLD`."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    jobs = {}
    for n_cols in (16384, 2 * ONLINE_THRESHOLD):
        rows = targets.meta_tensor(64, n_cols, dtype=dt)
        where = f"64x{n_cols}"
        jobs |= targets.recorded(lambda r=rows: _op_forward(r), arch, where)
        jobs |= targets.recorded(lambda r=rows: _op_backward(r, r), arch, where)
    return jobs


# --------------------------------------------------------------------------- the op


def _normalize_dim(dim: object, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"softmax: dim must be an int, got {type(dim).__name__}")
    rank = max(ndim, 1)  # a 0-d tensor accepts dim 0 and -1, like torch
    if not -rank <= dim < rank:
        raise ValueError(
            f"softmax: dim {dim} is out of range for a tensor with {ndim} dimension(s) "
            f"(expected {-rank} <= dim < {rank})"
        )
    return dim % rank


def _compiled(x: torch.Tensor, dim: object) -> torch.Tensor:
    """:func:`softmax` inside torch.compile: the checks, then the Function on rows."""
    check_tensor(x, "x", "softmax")
    dim = _normalize_dim(dim, x.dim())
    if x.dim() == 0:
        return _compiled(x.reshape(1), 0).reshape(())
    moved = x.movedim(dim, -1)
    y = SoftmaxFunction.apply(moved.reshape(-1, moved.shape[-1]))
    return y.reshape(moved.shape).movedim(-1, dim)


_grad_enabled = torch.is_grad_enabled


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Return ``torch.softmax(x, dim)`` computed by Triton kernels, with autograd.

    Parameters
    ----------
    x
        float16, bfloat16 or float32 tensor on tilebook's device, any shape and
        strides.  The result has ``x``'s dtype; arithmetic is in float32.
    dim
        The dimension to normalise over.  The kernels reduce along contiguous rows,
        so for any other ``dim`` (or a row that is not contiguous) the input is first
        copied with that dimension last, and the result is returned as a permuted
        view of a contiguous buffer.

    Notes
    -----
    Inside ``torch.compile`` the call is the operator ``torch.ops.tilebook.softmax``
    (:mod:`tilebook.ops.library`): no graph break, and Inductor sees the kernels.

    Examples
    --------
    >>> p = tilebook.softmax(logits, dim=-1)   # doctest: +SKIP
    """
    if autocasting(x):
        (x,) = upper("softmax", x)  # as torch.softmax under autocast (float32 on a GPU)
    if _compiling():
        return _compiled(x, dim)
    key = plan = None
    if plain(x) and type(dim) is int:  # a repeat call: its key fixes all the checks read
        key = call_key(x, None, None, _Plan, dim, ONLINE_THRESHOLD, ONLINE_BLOCK)
        plan = PLANS.get(key)
    if plan is None:
        check_tensor(x, "x", "softmax")
        d = _normalize_dim(dim, x.dim())
        if x.dim() == 0:
            return softmax(x.reshape(1), 0).reshape(())
        plan = _Plan(x, d)
        if key is not None:
            PLANS.remember(key, plan)
    grad = x.requires_grad and _grad_enabled()
    if plan.moved:
        moved = x.movedim(plan.dim, -1)
        y = SoftmaxFunction.apply(moved, plan) if grad else _forward(plan, moved)
        return y.movedim(-1, plan.dim)
    return SoftmaxFunction.apply(x, plan) if grad else _forward(plan, x)
