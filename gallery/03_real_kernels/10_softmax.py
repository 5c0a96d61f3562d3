"""
10. softmax: whole rows in registers, long rows online
======================================================

Softmax turns a row of scores into probabilities: subtract the row's largest
entry, exponentiate, divide by the sum.  It closes every classifier and sits
inside every attention layer, and it does only a handful of operations per
element, so its speed is set by traffic to HBM, not by arithmetic.  The best
a softmax can do is read each input once and write each output once.  This
lesson writes kernels that come close: one for rows short enough to sit in
registers, one for rows that are not, and the backward pass; then it holds
them against ``torch.softmax`` and ``torch.compile`` on tensors far larger
than the L2 cache.  Along the way it sizes a persistent grid from the
occupancy of the compiled kernel, and lets a measurement say whether that was
worth doing.

.. rubric:: You will learn

- how one program computes the maximum, the exponentials and the sum of a tile
  of whole rows in registers, and why short rows share a program;
- how the online softmax recurrence walks a row that does not fit in chunks,
  reading it twice instead of three times;
- how the backward pass ``dx = y * (dy - sum(y * dy))`` becomes one more row
  kernel;
- how to work out how many programs fit on a streaming multiprocessor from
  the registers, shared memory and warps of the compiled kernel, and size a
  persistent grid from that;
- how to let a measurement, not folklore, decide whether the persistent grid
  pays, and how the kernels compare with PyTorch from 256 to 131072 columns.

The finished kernels live in the package as :func:`tilebook.softmax`, which
takes any dimension of any tensor and has autograd (source, launchers and the
tuned configurations: :mod:`tilebook.ops.softmax`).
"""

# %%
# Setting up
# ----------
# As in every lesson, :mod:`tilebook` is imported first so that it can choose
# between the GPU and Triton's interpreter before Triton loads.

import tilebook  # noqa: I001  (chooses GPU or interpreter before triton loads)

import sys
import warnings
from dataclasses import replace

import torch
import triton
import triton.language as tl

from tilebook.aot import compile_kernel
from tilebook.bench import measure, record_or_measure
from tilebook.check import CorrectnessReport
from tilebook.ops.softmax import (
    SoftmaxConfig,
    launch_softmax_backward,
    launch_softmax_forward,
    pick_config,
    softmax,
)
from tilebook.plots import plot_record
from tilebook.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
# The interpreter computes with numpy, which warns when an all -inf row gives
# -inf - -inf or 1 / 0.  The NaNs that result are what torch returns too.
warnings.filterwarnings("ignore", "(invalid value|divide by zero)", RuntimeWarning)

# %%
# What a softmax has to move
# --------------------------
# For a row :math:`x_1, \dots, x_n`,
#
# .. math::
#
#    y_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}}, \qquad m = \max_j x_j .
#
# Subtracting the maximum changes nothing mathematically (it cancels between
# numerator and denominator) but keeps every exponent at or below zero, so
# nothing overflows: in float16, :math:`e^{12}` is already past the largest
# finite value.  Written as separate PyTorch operations (``max``, subtract,
# ``exp``, ``sum``, divide), five operations read the data and three write a
# result back: eight passes over HBM where two would do.  A fused kernel reads
# ``x`` once and writes ``y`` once, ``2 * n * element_size`` bytes per row,
# and that is the number every GB/s figure below divides by.
#
# The single-pass kernel
# ----------------------
# When a row fits in registers, the whole softmax is a load, two reductions
# and a store.  One program owns a *tile* of ``BLOCK_M`` consecutive rows,
# each padded to ``BLOCK_N`` columns: a ``BLOCK_M x BLOCK_N`` block whose
# maximum and sum along ``axis=1`` are the statistics of one row each (lesson
# 06 shows how ``tl.max`` and ``tl.sum`` become warp shuffles and shared
# memory).  The arguments:
#
# ``x_ptr``, ``y_ptr``
#     The input and the output.  Triton reads their element type from the
#     tensors, and ``y_ptr.dtype.element_ty`` is the type to round to when
#     storing; the arithmetic is float32 whatever the storage type.
# ``n_rows``, ``n_cols``
#     The problem: ``n_rows`` independent rows of ``n_cols`` entries.
# ``stride_x``, ``stride_y``
#     Elements from the start of one row to the start of the next.  Along a
#     row the stride must be 1; the rows themselves may lie anywhere, so a
#     slice such as ``x[:, 5:40]`` needs no copy.
# ``BLOCK_M: tl.constexpr``
#     Rows per tile.  A row of 256 bfloat16 values is 512 bytes, too little
#     work for a program; 64 such rows give it 32 KiB of loads in flight.
#     Long rows get ``BLOCK_M = 1``.
# ``BLOCK_N: tl.constexpr``
#     ``n_cols`` rounded up to a power of two, because ``tl.arange`` needs
#     one.  The padding columns load ``-inf``: they cannot raise the maximum,
#     and their exponential is 0, so they drop out of the sum.
# ``EVEN_M``, ``EVEN_N: tl.constexpr``
#     True when the tiles fit the tensor exactly (``n_rows % BLOCK_M == 0``,
#     ``n_cols == BLOCK_N``).  Then the loads and stores carry no mask at
#     all.  Each combination compiles its own binary, so the test costs
#     nothing at run time.
# ``NUM_STAGES: tl.constexpr``
#     Software pipelining of the loop over tiles (see the persistent grid
#     below): with 2, the compiler loads the next tile into shared memory
#     while it reduces this one.  With one program per tile the loop runs
#     once, and 1 is right.
# ``EVICT: tl.constexpr``
#     The L2 policy of the loads and stores: ``""`` (the default),
#     ``"evict_first"``, a hint that the data will not be used again, or
#     ``"evict_last"``, a hint to keep it.  Only measurement says which is
#     faster: on an H100 the package's tables pick ``"evict_last"`` for this
#     kernel, about 1% ahead of no hint, although nothing here is read twice.
# ``INT64: tl.constexpr``
#     Row offsets ``row * stride`` are 32-bit integers unless this is set;
#     the package sets it only when a tensor reaches past ``2**31`` elements.
#
# The loop ``for tile in tl.range(pid, num_tiles, nprog)`` runs once per
# program when the grid has one program per tile; with a smaller grid, each
# program strides over several tiles.  We come back to that.


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


# %%
# A launcher needs the tile shape and the warps.  The package's
# :func:`~tilebook.ops.softmax.pick_config` holds the values tuned on an H100
# for each padded row length, and this launcher takes them from there unless
# it is told otherwise.


def softmax_rows(x: torch.Tensor, block_m: int = 0, num_warps: int = 0) -> torch.Tensor:
    """Softmax of each row of the 2-D ``x`` (unit row stride), a tile a program."""
    n_rows, n_cols = x.shape
    cfg = pick_config(n_cols)
    block_m = block_m or cfg.block_m
    block_n = triton.next_power_of_2(n_cols)
    y = torch.empty_like(x)
    grid = (triton.cdiv(n_rows, block_m),)
    softmax_fwd_kernel[grid](
        x, y, n_rows, n_cols, x.stride(0), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n,
        EVEN_M=n_rows % block_m == 0, EVEN_N=n_cols == block_n,
        NUM_STAGES=1, EVICT="", INT64=False,
        num_warps=num_warps or cfg.num_warps,
    )  # fmt: skip
    return y


x = torch.randn(6, 10, device=DEVICE)
err = (softmax_rows(x, block_m=4) - torch.softmax(x, -1)).abs().max().item()
print("max |softmax_rows - torch.softmax| =", err)
print("row sums:", softmax_rows(x).sum(-1).tolist())

# %%
# What the package picks for each row length, forward and backward:


def describe(c: SoftmaxConfig) -> str:
    if c.online:
        return f"online, chunks of {c.block_n}, {c.num_warps} warps"
    rows = "1 row" if c.block_m == 1 else f"{c.block_m} rows"
    return f"{rows} x {c.block_n} a program, {c.num_warps} warps"


print(f"{'n_cols':>7}  {'forward':<38} backward")
for n in (100, 256, 1024, 4096, 16384, 32768, 32769, 131072):
    fwd, bwd = pick_config(n), pick_config(n, backward=True)
    print(f"{n:>7}  {describe(fwd):<38} {describe(bwd)}")

# %%
# Two things stand out.  Short rows are grouped so that every program owns at
# least 16 KiB of bfloat16 (64 rows of 256, 8 rows of 1024, …).  And the
# single pass stops at ``ONLINE_THRESHOLD`` = 32768 columns: there, with 16
# warps, each thread already holds 64 float32 values of its row.  Double the
# row and the values alone would take 128 registers a thread, which is all
# that the SM's 65536 registers allow each of 512 threads; the compiler would
# spill to local memory.  (More warps do not help: 1024 threads may have 64
# registers each.)  The backward pass holds two rows, so it walks rows of
# 32768 in chunks already.
#
# When the row does not fit: the online softmax
# ---------------------------------------------
# A row of 131072 entries cannot sit in registers, so the program has to walk
# it in chunks.  The textbook way takes three walks: one for the maximum, one
# for the sum, one to write.  The *online* softmax (Milakov and Gimelshein,
# 2018) folds the first two together.  Keep a running maximum :math:`m` and a
# running sum :math:`s` of :math:`e^{x - m}`; when a chunk :math:`c` arrives,
#
# .. math::
#
#    m' = \max\bigl(m, \max_{i \in c} x_i\bigr), \qquad
#    s' = s \, e^{m - m'} + \sum_{i \in c} e^{x_i - m'} .
#
# The factor :math:`e^{m - m'}` rescales everything summed so far to the new
# maximum (it is 1 when the maximum did not move).  After the last chunk,
# :math:`s` is exactly the denominator, and a second walk writes
# :math:`y_i = e^{x_i - m} / s`.  Lesson 06 (see the :doc:`/syllabus`) steps
# through the recurrence chunk by chunk; flash attention (lesson 12) runs the
# same recurrence along the rows of an attention matrix that it never stores.
#
# The arguments are those of the single-pass kernel, except:
#
# ``BLOCK_N: tl.constexpr``
#     The chunk length, a power of two (4096 in the package), no longer the
#     row length; the last chunk is masked.
# ``NUM_STAGES: tl.constexpr``
#     Now pipelines the two walks over the chunks of a row.
#
# There is no ``BLOCK_M``: a program owns one row at a time, and loops over
# rows ``pid, pid + nprog, …`` when the grid is smaller than ``n_rows``.
# Three details are worth finding in the code.  The first walk loads with
# ``evict_last``, asking L2 to keep the row for the second walk.  The second
# walk goes *backwards*, starting with the chunks read last, which are the
# likeliest still to be in L2.  And ``shift`` replaces a maximum of ``-inf``
# (everything seen so far is ``-inf``) by 0, because ``-inf - (-inf)`` is NaN
# and one NaN would poison the sum for the rest of the row.


@triton.jit
def softmax_fwd_online_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    stride_x,
    stride_y,
    BLOCK_N: tl.constexpr,  # chunk length
    NUM_STAGES: tl.constexpr,
    EVICT: tl.constexpr,
    INT64: tl.constexpr,
):
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


# %%
# Its launcher starts one program per row:


def softmax_online(x: torch.Tensor, chunk: int = 4096, num_warps: int = 8):
    """Softmax of each row of the 2-D ``x``, walking every row in chunks."""
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    softmax_fwd_online_kernel[(n_rows,)](
        x, y, n_rows, n_cols, x.stride(0), y.stride(0),
        BLOCK_N=chunk, NUM_STAGES=1, EVICT="evict_first", INT64=False,
        num_warps=num_warps,
    )  # fmt: skip
    return y


# Chunks of 16 on rows of 100: seven chunks, and the maximum comes in the last.
x = torch.randn(4, 100, device=DEVICE)
x[:, -1] = 12.0
err = (softmax_online(x, chunk=16) - torch.softmax(x, -1)).abs().max().item()
print("max |softmax_online - torch.softmax| =", err)

# %%
# The backward pass
# -----------------
# With :math:`y = \mathrm{softmax}(x)` and an incoming gradient :math:`dy`,
# the chain rule through
# :math:`\partial y_j / \partial x_i = y_j (\delta_{ij} - y_i)` gives
#
# .. math::
#
#    dx_i = \sum_j dy_j \, y_j (\delta_{ij} - y_i)
#         = y_i \Bigl(dy_i - \sum_j y_j \, dy_j\Bigr) .
#
# So the backward needs ``y`` (saved by the forward; ``x`` itself is not
# needed) and ``dy``, one dot product per row and one element-wise
# expression.  It is the single-pass kernel again, with two loads, one
# ``tl.sum`` in place of ``tl.max`` and ``tl.sum``, and three bytes moved for
# every two of the forward.  The arguments are the forward's, for three
# tensors: ``y_ptr``, ``dy_ptr`` and ``dx_ptr``, with the row strides
# ``stride_y``, ``stride_dy`` and ``stride_dx``.  Masked lanes load 0, which
# adds nothing to the dot product.


@triton.jit
def softmax_bwd_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    n_rows,
    n_cols,
    stride_y,
    stride_dy,
    stride_dx,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVICT: tl.constexpr,
    INT64: tl.constexpr,
):
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
        if EVEN_M and EVEN_N:
            y = tl.load(y_ptrs, eviction_policy=EVICT).to(tl.float32)
            dy = tl.load(dy_ptrs, eviction_policy=EVICT).to(tl.float32)
        else:
            y = tl.load(y_ptrs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
            dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        dx = (y * (dy - tl.sum(y * dy, axis=1)[:, None])).to(dx_ptr.dtype.element_ty)
        dx_ptrs = dx_ptr + rows[:, None] * stride_dx + cols[None, :]
        if EVEN_M and EVEN_N:
            tl.store(dx_ptrs, dx, eviction_policy=EVICT)
        else:
            tl.store(dx_ptrs, dx, mask=mask, eviction_policy=EVICT)


# %%
# Holding two rows, the backward runs out of registers sooner.  Its online
# version, ``softmax_bwd_online_kernel`` in :mod:`tilebook.ops.softmax`, is
# simpler than the forward's: a dot product needs no rescaling, so the first
# walk accumulates ``y * dy`` lane by lane in a ``BLOCK_N`` vector and reduces
# it once at the end, and the second walk writes ``dx``.  The package wraps
# both directions in a :class:`torch.autograd.Function`, so that
# :func:`tilebook.softmax` can sit in a model that trains.


def softmax_backward_rows(
    y: torch.Tensor, dy: torch.Tensor, block_m: int, num_warps: int
) -> torch.Tensor:
    """``dx`` of a row softmax, from the saved output ``y`` and the gradient ``dy``."""
    n_rows, n_cols = y.shape
    block_n = triton.next_power_of_2(n_cols)
    dx = torch.empty_like(y)
    grid = (triton.cdiv(n_rows, block_m),)
    softmax_bwd_kernel[grid](
        y, dy, dx, n_rows, n_cols, y.stride(0), dy.stride(0), dx.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n,
        EVEN_M=n_rows % block_m == 0, EVEN_N=n_cols == block_n,
        NUM_STAGES=1, EVICT="", INT64=False, num_warps=num_warps,
    )  # fmt: skip
    return dx


x = torch.randn(3, 7, device=DEVICE, requires_grad=True)
w = torch.randn(3, 7, device=DEVICE)
(softmax(x) * w).sum().backward()
x64 = x.detach().double().requires_grad_()
(torch.softmax(x64, -1) * w.double()).sum().backward()
print("max |grad - float64 autograd| =", (x.grad - x64.grad).abs().max().item())

# %%
# A persistent grid sized from occupancy
# --------------------------------------
# So far every launch starts one program per tile: 8192 programs for a
# ``2**27``-element tensor of 256-column rows, 1024 for rows of 131072.  The
# GPU keeps as many of them *resident* on each streaming multiprocessor (SM)
# as its resources allow, and starts the next whenever one finishes.  A
# *persistent* grid starts only as many programs as can be resident at once,
# and each loops over the tiles ``pid, pid + nprog, pid + 2 * nprog, …``:
# exactly the ``tl.range(pid, num_tiles, nprog)`` loop that our kernels
# already have.  The hoped-for gains: no cost of starting and retiring
# programs, and a loop that the compiler can pipeline (``NUM_STAGES=2``
# fetches the next tile while this one is reduced).  The risks: the grid has
# to be sized right, and the hardware's own scheduling of short programs is
# hard to beat.
#
# The launcher needs nothing new in the kernel, only a smaller grid.  It
# returns what a Triton launch returns, the compiled kernel, because we are
# about to ask that kernel about its resources.


def launch_persistent(x: torch.Tensor, y: torch.Tensor, cfg: SoftmaxConfig, n_programs):
    """Launch ``cfg``'s forward kernel on at most ``n_programs`` programs."""
    n_rows, n_cols = x.shape
    knobs = {"NUM_STAGES": cfg.num_stages, "EVICT": cfg.evict, "INT64": False}
    if cfg.online:
        grid = (min(n_rows, n_programs),)
        return softmax_fwd_online_kernel[grid](
            x, y, n_rows, n_cols, x.stride(0), y.stride(0),
            BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **knobs,
        )  # fmt: skip
    grid = (min(triton.cdiv(n_rows, cfg.block_m), n_programs),)
    return softmax_fwd_kernel[grid](
        x, y, n_rows, n_cols, x.stride(0), y.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        EVEN_M=n_rows % cfg.block_m == 0, EVEN_N=n_cols == cfg.block_n,
        num_warps=cfg.num_warps, **knobs,
    )  # fmt: skip


def softmax_persistent(x: torch.Tensor, n_programs: int, cfg=None):
    """Row softmax of ``x`` by at most ``n_programs`` programs looping over tiles."""
    y = torch.empty_like(x)
    launch_persistent(x, y, cfg or pick_config(x.shape[1]), n_programs)
    return y


# %%
# How many programs fit on an SM?  Each one needs ``32 * num_warps`` threads,
# that many times its registers per thread, and its shared memory.  An H100
# SM has 2048 threads, 65536 registers and 228 KiB of shared memory, and
# holds at most 32 programs.  Registers are handed to each warp in blocks of
# 256, so a thread's count is rounded up to a multiple of 8, and every
# program also takes 1 KiB of shared memory that CUDA reserves for itself.
#
# The kernel's own figures come from the compiler.  On a GPU, the compiled
# kernel that a launch returns knows them once it is loaded: ``n_regs`` and
# ``metadata.shared``.  On a CPU, :func:`tilebook.aot.compile_kernel`
# compiles the same kernel for ``sm_90`` and reports what ``ptxas``
# allocated.  Likewise the SM's limits are read from the device on a GPU and
# are an H100 SXM's on a CPU.


def sm_limits() -> dict[str, int]:
    """Resources of one SM, and how many SMs: the GPU's, or an H100 SXM's on a CPU."""
    lim = {"sms": 132, "threads": 2048, "registers": 65536, "shared": 233472}
    if tilebook.is_gpu():
        p = torch.cuda.get_device_properties(0)
        lim["sms"] = p.multi_processor_count
        lim["threads"] = getattr(p, "max_threads_per_multi_processor", lim["threads"])
        lim["registers"] = getattr(p, "regs_per_multiprocessor", lim["registers"])
        lim["shared"] = getattr(p, "shared_memory_per_multiprocessor", lim["shared"])
    return lim


SM = sm_limits()
FWD_SIGNATURE = {"x_ptr": "*bf16", "y_ptr": "*bf16", "n_rows": "i32", "n_cols": "i32"}
FWD_SIGNATURE |= {"stride_x": "i32", "stride_y": "i32"}


def compile_forward(cfg: SoftmaxConfig, n_rows: int, n_cols: int):
    """The sm_90 binary that ``cfg`` launches for bfloat16 rows of aligned sizes."""
    consts = {"BLOCK_N": cfg.block_n, "NUM_STAGES": cfg.num_stages, "EVICT": cfg.evict}
    consts["INT64"] = False
    if not cfg.online:
        consts["BLOCK_M"] = cfg.block_m
        consts["EVEN_M"] = n_rows % cfg.block_m == 0
        consts["EVEN_N"] = n_cols == cfg.block_n
    name = "softmax_fwd_online_kernel" if cfg.online else "softmax_fwd_kernel"
    return compile_kernel(
        f"tilebook.ops.softmax:{name}",
        FWD_SIGNATURE,
        consts,
        num_warps=cfg.num_warps,
        divisible_by_16=list(FWD_SIGNATURE),  # as a launch on 2**k-wide rows sees them
    )


def kernel_resources(cfg: SoftmaxConfig, n_rows: int, n_cols: int) -> tuple[int, int]:
    """Registers a thread and bytes of shared memory of ``cfg``'s bfloat16 binary."""
    if tilebook.is_gpu():
        # One program walks every tile: slow, but it loads the very binary we time.
        x = torch.zeros(n_rows, n_cols, device=DEVICE, dtype=torch.bfloat16)
        k = launch_persistent(x, torch.empty_like(x), cfg, n_programs=1)
        return k.n_regs, k.metadata.shared
    k = compile_forward(cfg, n_rows, n_cols)
    return k.registers, k.shared_bytes


def programs_per_sm(registers: int, shared: int, num_warps: int) -> tuple[int, str]:
    """How many programs with these resources fit on one SM, and what limits them."""
    threads = 32 * num_warps
    registers = -(-registers // 8) * 8  # rounded up to a multiple of 8
    fits = {
        "threads": SM["threads"] // threads,
        "registers": SM["registers"] // (registers * threads),
        "shared memory": SM["shared"] // (shared + 1024),
        "program slots": 32,
    }
    limit = min(fits, key=fits.get)
    return fits[limit], limit


# %%
# Take rows of 1024 columns, for which the package runs 8 rows a program on 8
# warps, and ``2**17`` such rows (256 MiB of bfloat16).  Work it out for that
# configuration, and for the same one with the tile loop pipelined two deep:

demo_rows, demo_cols = 2**17, 1024
demo = pick_config(demo_cols)
for cfg in (demo, replace(demo, num_stages=2)):
    registers, shared = kernel_resources(cfg, demo_rows, demo_cols)
    fit, limit = programs_per_sm(registers, shared, cfg.num_warps)
    print(
        f"NUM_STAGES={cfg.num_stages}: {registers} registers a thread, "
        f"{shared} B of shared memory\n"
        f"  -> {fit} programs per SM (limited by {limit}), "
        f"a grid of {fit * SM['sms']} on {SM['sms']} SMs"
    )

# %%
# The pipelined binary needs a buffer in shared memory for the tile it
# fetches ahead, and usually a few more registers.
#
# (The package can do the same: a :class:`~tilebook.ops.softmax.SoftmaxConfig`
# with ``ctas_per_sm`` set launches that many programs per SM.  When the
# package was tuned on an H100, persistent candidates were in the sweep of
# ``benchmarks/softmax.py``, and none of them won.)
#
# Is it right?
# ------------
# Every kernel of the lesson, and :func:`tilebook.softmax` forward and
# backward, against PyTorch in float64.  The awkward cases are there on
# purpose: a width that is not a power of two, a row count that is not a
# multiple of the tile, entries of ``-inf`` (probability 0, which is what a
# causal mask produces) and a row that is entirely ``-inf``, where
# ``torch.softmax`` returns NaN and so must we.  The online kernels are
# reached on short rows by passing a small chunk, to the lesson's launcher or
# as an explicit :class:`~tilebook.ops.softmax.SoftmaxConfig` to the
# package's; the persistent launcher gets a grid of 3 programs, so each loops
# over several tiles.  The backward kernels are checked against the formula
# above, evaluated in float64 on the same ``y`` and ``dy``, and the whole
# autograd path against float64 autograd of ``torch.softmax``.

ROWS, COLS = tilebook.pick(gpu=(4096, 1000), cpu=(37, 1000))
LONG_ROWS, LONG_COLS = tilebook.pick(gpu=(64, 100_003), cpu=(5, 1000))
CHUNK = tilebook.pick(gpu=4096, cpu=64)
ONLINE = SoftmaxConfig(1, CHUNK, 4, online=True)  # the online path, whatever the length
inf = float("inf")


def with_infs(n_rows: int, n_cols: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(n_rows, n_cols, device=DEVICE) * 4
    x[0] = -inf  # all -inf: NaN, as in torch
    x[1, ::3] = -inf  # scattered -inf entries
    x[2, 1:] = -inf  # only the first entry survives: probability 1
    return x.to(dtype)


def grad_reference(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    y64, dy64 = y.double(), dy.double()
    return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))


dtypes = [torch.float32, torch.float16]
if tilebook.is_gpu():
    dtypes.append(torch.bfloat16)
report = CorrectnessReport("softmax vs float64 reference")
for dtype in dtypes:
    x = (torch.randn(ROWS, COLS, device=DEVICE) * 4).to(dtype)
    ref = torch.softmax(x.double(), -1)
    report.check("single pass (lesson kernel)", softmax_rows(x), ref)
    report.check("persistent grid of 3 programs", softmax_persistent(x, 3), ref)
    report.check("tilebook.softmax", softmax(x), ref)
    xl = (torch.randn(LONG_ROWS, LONG_COLS, device=DEVICE) * 4).to(dtype)
    xl[1, -1] = 30  # the maximum arrives in the last chunk: the sum must be rescaled
    ref = torch.softmax(xl.double(), -1)
    y = softmax_online(xl, CHUNK)
    report.check(f"online, chunks of {CHUNK} (lesson kernel)", y, ref)
    y = launch_softmax_forward(xl, torch.empty_like(xl), ONLINE)
    report.check("online (package launcher, SoftmaxConfig)", y, ref)
    report.check("tilebook.softmax, long rows", softmax(xl), ref)
    xi = with_infs(8, COLS, dtype)
    ref = torch.softmax(xi.double(), -1)
    report.check("-inf entries, all -inf row (single pass)", softmax_rows(xi), ref)
    xi = with_infs(8, LONG_COLS, dtype)
    ref = torch.softmax(xi.double(), -1)
    report.check("-inf entries, all -inf row (online)", softmax_online(xi, CHUNK), ref)
    # Backward, from the y and dy that a training step would hand over.
    y, dy = softmax(x), torch.randn_like(x)
    cfg = pick_config(COLS, backward=True)
    dx = softmax_backward_rows(y, dy, cfg.block_m, cfg.num_warps)
    report.check("backward, single pass (lesson kernel)", dx, grad_reference(y, dy))
    yl, dyl = softmax(xl), torch.randn_like(xl)
    dx = launch_softmax_backward(yl, dyl, torch.empty_like(yl), ONLINE)
    report.check("backward, online (package kernel)", dx, grad_reference(yl, dyl))
    xg = x.detach().requires_grad_()
    softmax(xg).backward(dy)
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    report.check("autograd through tilebook.softmax", xg.grad, x64.grad)
report.assert_ok()

# %%
# How fast is it?
# ---------------
# Softmax does a few operations for every two bytes of bfloat16 it moves, so
# like vector addition it is limited by memory bandwidth, and we report GB/s:
# the bytes that must move (``x`` read and ``y`` written; for the backward,
# ``y`` and ``dy`` read and ``dx`` written) over the median time.  Each tensor
# holds ``2**27`` bfloat16 values, 256 MiB, five times the H100's 50 MB of L2,
# so the figures measure HBM and not the cache.  The row length runs from 256
# to 131072 columns, with the number of rows adjusted to keep the size fixed.
#
# The competition is ``torch.softmax`` (PyTorch's own CUDA kernel, already
# one fused pass) and the same call through ``torch.compile``, whose Inductor
# backend writes a Triton kernel of its own for each shape.  For the
# backward, PyTorch's kernel is ``torch.ops.aten._softmax_backward_data``,
# the one autograd calls.  Compiling takes seconds, so every implementation
# is called once, and checked against PyTorch's answer, before it is timed:
# the compile happens in that call, never inside the measurement.  (On a GPU
# each line of the sweep is also logged to stderr as it is measured.)

BENCH_DTYPE = torch.bfloat16
ELEMENTS = tilebook.pick(gpu=2**27, cpu=2**12)  # per tensor: 256 MiB of bf16 on a GPU
ROW_LENGTHS = [2**k for k in range(8, 18)]


def bench_inputs(n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Scaled by 4 so that the rows have a real spread of probabilities.
    x = (torch.randn(ELEMENTS // n_cols, n_cols, device=DEVICE) * 4).to(BENCH_DTYPE)
    dy = torch.randn(x.shape, device=DEVICE).to(BENCH_DTYPE)
    return x, dy


def compiled(fn):
    torch._dynamo.reset()  # a fresh compile per shape: no recompile limit to run into
    return torch.compile(fn, dynamic=False)


def torch_softmax_backward(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


def warm_and_check(name: str, fn, want: torch.Tensor, atol: float) -> None:
    """Call ``fn`` once, compiling it if need be, and insist that it match ``want``."""
    err = (fn().float() - want.float()).abs().max().item()
    if not err <= atol:
        raise AssertionError(f"{name}: max |error| {err:.3g} vs torch > {atol:.3g}")


def timed(kernel: str, n: int, impl: str, fn, nbytes: int, **extra) -> dict:
    m = measure(fn, bytes_moved=nbytes)
    line = f"{kernel:<8} n={n:<6} {impl:<26} {m.gbps:5.0f} GB/s"
    print(line, file=sys.stderr, flush=True)
    return {
        "kernel": kernel,
        "n": n,
        "rows": ELEMENTS // n,
        "impl": impl,
        "dtype": str(BENCH_DTYPE).removeprefix("torch."),
        "tensor_mib": ELEMENTS * BENCH_DTYPE.itemsize / 2**20,
        **extra,
        **m.as_row(),
    }


def size_rows(n: int) -> list[dict]:
    x, dy = bench_inputs(n)
    nbytes = x.numel() * x.element_size()
    y = torch.softmax(x, -1)
    fwd_compiled = compiled(lambda t: torch.softmax(t, -1))
    forward = {
        "tilebook": lambda: softmax(x),
        "torch": lambda: torch.softmax(x, -1),
        "torch.compile": lambda: fwd_compiled(x),
    }
    out = []
    for impl, fn in forward.items():
        warm_and_check(f"forward {impl} n={n}", fn, y, 1e-2)
        out.append(timed("forward", n, impl, fn, 2 * nbytes))
    dx = torch_softmax_backward(dy, y)
    bwd_compiled = compiled(torch_softmax_backward)
    backward = {
        "tilebook": lambda: launch_softmax_backward(y, dy, torch.empty_like(y)),
        "torch": lambda: torch_softmax_backward(dy, y),
        "torch.compile": lambda: bwd_compiled(dy, y),
    }
    atol = 2e-2 * dx.abs().max().item()
    for impl, fn in backward.items():
        warm_and_check(f"backward {impl} n={n}", fn, dx, atol)
        out.append(timed("backward", n, impl, fn, 3 * nbytes))
    return out


def size_sweep() -> list[dict]:
    rows = []
    for n in ROW_LENGTHS:
        rows += size_rows(n)
        torch.cuda.empty_cache()
    return rows


sizes = record_or_measure(
    "lesson10_sizes",
    "softmax, bfloat16, 256 MiB per tensor: GB/s by row length",
    size_sweep,
)
copy_gbps = sizes.provenance.get("copy_gbps") if sizes else None
for kernel in ("forward", "backward"):
    plot_record(
        sizes,
        x="n",
        y="gbps",
        series="impl",
        where={"kernel": kernel},
        logx=True,
        title=f"softmax {kernel}, bfloat16, 256 MiB per tensor",
        xlabel="row length (columns)",
        ylabel="GB/s (bytes read + written)",
        ceiling=copy_gbps,
        ceiling_label="1 GiB device copy",
        order=["tilebook", "torch", "torch.compile"],
        name="lesson10_sizes",
    )

# %%
# The numbers behind the two plots, as a fraction of the copy bandwidth and
# as a ratio to the faster of the two PyTorch baselines (above 1: tilebook is
# faster):

if sizes is not None:
    print(sizes.caption())
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s")
    for kernel in ("forward", "backward"):
        print(f"\n{kernel:<8} {'n':>7} {'tilebook':>9} {'torch':>6}", end="")
        print(f" {'compile':>8}", end="")
        print(f" {'of copy':>8} {'vs best':>8}")
        for n in sorted({r["n"] for r in sizes.rows}):
            g = {r["impl"]: r["gbps"] for r in sizes.select(kernel=kernel, n=n)}
            best = max(g["torch"], g["torch.compile"])
            print(
                f"{'':<8} {n:>7} {g['tilebook']:9.0f} {g['torch']:6.0f} "
                f"{g['torch.compile']:8.0f} {g['tilebook'] / copy_gbps:8.1%} "
                f"{g['tilebook'] / best:8.2f}"
            )
else:
    print("No committed GPU record of this benchmark yet: nothing to show.")

# %%
# What the committed record says (an H100 SXM; the table above is the one to
# trust if the page was rebuilt on another GPU):
#
# - **Rows that fit** (256 to 32768 columns): tilebook's forward runs at 94
#   to 99% of the copy bandwidth at every length, and its backward sits on
#   the copy line up to 16384 columns (a fraction of a percent above it is
#   the noise of two separate measurements): each byte read once and written
#   once, as fast as the memory system moves bytes at all.
#   ``torch.compile`` matches it on short rows, then settles near 1700 to
#   1900 GB/s from 2048 columns on, where tilebook is 1.4 to 1.7 times
#   faster.  ``torch.softmax``'s forward is at its slowest between 2048 and
#   8192 columns, and its backward stays at about half the copy bandwidth at
#   every length.
# - **Rows that do not fit** (65536 and 131072): everyone drops.  The online
#   kernel reads the row twice, and the GB/s count only the two passes that
#   must happen; if the second read found nothing in L2, three passes at
#   copy speed would show here as two thirds of the copy line.  That is about
#   where tilebook's forward lands at 65536 (70%), and it falls further at
#   131072.  Inductor's kernels pay the same price.
# - **The one loss**: the backward at 32768 columns, which the package walks
#   in chunks (exercise 7 asks why), runs at about 90% of the copy line
#   while Inductor's kernel stays on it.

# %%
# Does the persistent grid pay?
# -----------------------------
# Now the question left open above.  For every row length, the sweep below
# takes the package's configuration, compiles it for the GPU, works out how
# many programs fit on an SM as before, and launches
# ``softmax_persistent`` with that many programs per SM: once as it is,
# and once with the tile loop pipelined two deep (``NUM_STAGES=2``, which
# changes the resources and so the grid).  Against them runs the same
# configuration with one program per tile.  Two deliberately worse launches
# join the sweep, for the widget that follows: one row per program (with the
# tuned tile's warps per row), and the online kernel forced onto rows that
# would fit in registers.


def variant_rows(n: int) -> list[dict]:
    x, _ = bench_inputs(n)
    n_rows = x.shape[0]
    nbytes = 2 * x.numel() * x.element_size()
    want = torch.softmax(x, -1)
    cfg = pick_config(n)
    tiles = n_rows if cfg.online else triton.cdiv(n_rows, cfg.block_m)
    out = []

    def run(impl: str, fn, detail: str, **extra) -> None:
        warm_and_check(f"{impl} n={n}", fn, want, 1e-2)
        out.append(timed("forward", n, impl, fn, nbytes, detail=detail, **extra))

    def package(c: SoftmaxConfig):
        return lambda: launch_softmax_forward(x, torch.empty_like(x), c)

    run("tilebook", package(cfg), f"{describe(cfg)}: {tiles} programs", grid=tiles)
    for stages, impl in ((1, "persistent grid"), (2, "persistent grid, 2 stages")):
        pcfg = replace(cfg, num_stages=stages)
        registers, shared = kernel_resources(pcfg, n_rows, n)
        fit, limit = programs_per_sm(registers, shared, pcfg.num_warps)
        grid = min(tiles, fit * SM["sms"])
        extra = {"programs_per_sm": fit, "limit": limit, "registers": registers}
        run(
            impl,
            lambda pcfg=pcfg, grid=grid: softmax_persistent(x, grid, pcfg),
            f"{grid} programs: {fit} per SM, limited by {limit}",
            grid=grid,
            shared_bytes=shared,
            **extra,
        )
    if cfg.online:  # both are what tilebook does anyway at this length
        one, forced = cfg, cfg
    else:
        one = replace(cfg, block_m=1, num_warps=max(1, cfg.num_warps // cfg.block_m))
        forced = SoftmaxConfig(1, min(n, 4096), 8, online=True, evict="evict_first")
    same = " (the same launch as tilebook's here)"
    detail = f"{describe(one)}: {n_rows} programs" + same * (one == cfg)
    run("one row per program", package(one), detail, grid=n_rows)
    detail = f"{describe(forced)}: {n_rows} programs" + same * (forced == cfg)
    run("online path forced", package(forced), detail, grid=n_rows)
    return out


def variant_sweep() -> list[dict]:
    rows = []
    for n in ROW_LENGTHS:
        rows += variant_rows(n)
        torch.cuda.empty_cache()
    return rows


variants = record_or_measure(
    "lesson10_variants",
    "softmax forward, bfloat16, 256 MiB: launch variants by row length",
    variant_sweep,
)
if variants is not None:
    print(variants.caption())
    print(f"{'n':>7} {'tiles':>7} {'a tile each':>12}", end="")
    print(f" {'persistent':>22} {'2 stages':>22}")
    lengths = sorted({r["n"] for r in variants.rows})
    faster = 0
    for n in lengths:
        (base,) = variants.select(n=n, impl="tilebook")
        (p1,) = variants.select(n=n, impl="persistent grid")
        (p2,) = variants.select(n=n, impl="persistent grid, 2 stages")
        cells = [f"{p['gbps']:5.0f} GB/s, {p['grid']:>4} progs" for p in (p1, p2)]
        print(f"{n:>7} {base['grid']:>7} {base['gbps']:7.0f} GB/s", end="")
        print(f" {cells[0]:>22} {cells[1]:>22}")
        faster += max(p1["gbps"], p2["gbps"]) > 1.02 * base["gbps"]
    print(
        f"\nA persistent grid beat one program per tile by more than 2% "
        f"at {faster} of {len(lengths)} row lengths."
    )
else:
    print("No committed GPU record of the launch variants yet: nothing to show.")

# %%
# How to read the comparison, whatever the count above says.  With one
# program per tile, the hardware already keeps every SM full: as one program
# retires, the next one starts in its place.  What a persistent grid can
# still save is the start-up of each program (computing its offsets, setting
# up its reductions), which is small next to moving 16 KiB or more.  The
# pipelined version buys its prefetch with shared memory and registers, and
# the occupancy arithmetic above turns those into fewer resident programs,
# which means fewer loads in flight on each SM.  When the package was tuned
# on an H100, the persistent candidates lost to one program per tile, and
# that is why no configuration in :mod:`tilebook.ops.softmax` sets
# ``ctas_per_sm``.  The lesson is the method, not the verdict: a kernel
# whose programs each produce a partial result to be combined afterwards
# (lesson 11's weight gradient) or that load something expensive once per
# program can come out the other way, and so can another GPU.  Size the grid
# from occupancy, measure both, keep the faster.

# %%
# All of it at once
# -----------------
# The widget holds the forward sweep: choose a row length and an
# implementation with the sliders, or click a cell of the grid.  Cells in
# orange run at under 65% of the best cell.  ``tilebook``, ``torch`` and
# ``torch.compile`` are the contenders.  When the record of the launch
# variants is present, the widget adds the two persistent grids and the two
# deliberate mistakes, ``one row per program`` and ``online path forced``,
# which show on short rows what the package's configurations avoid.  The
# slowest cells of the contenders tell the story of the plot: PyTorch between
# 2048 and 8192 columns, and everyone once the rows stop fitting.

if sizes is not None:
    detail = {"torch": "PyTorch's CUDA kernel", "torch.compile": "Inductor's kernel"}
    cells = [
        {**r, "detail": detail.get(r["impl"]) or describe(pick_config(r["n"]))}
        for r in sizes.select(kernel="forward")
    ]
    if variants is not None:  # its tilebook row was measured beside the persistent ones
        cells = [r for r in cells if r["impl"] != "tilebook"] + variants.rows
    widget = SweepExplorer(
        cells,
        knobs=["n", "impl"],
        metric="gbps",
        unit="GB/s",
        labels={"n": "row length", "impl": "implementation"},
        title="softmax forward: row length and implementation against bandwidth",
        caption=sizes.caption(),
        initial={"n": 1024, "impl": "tilebook"},
        ceiling=sizes.provenance.get("copy_gbps"),
        ceiling_label="the 1 GiB copy",
        slow_hint="too few bytes in flight per program, or a second walk over each row "
        "(the price of rows too long for registers, and pure waste on short ones).",
        slow_fraction=0.65,
        extra="detail",
    )
else:
    widget = "No committed GPU record of the softmax sweeps yet: nothing to show."
widget

# %%
# Try this
# --------
#
# 1. Skip the rescale: in ``softmax_online``'s kernel, replace
#    ``s = s * tl.exp(m - shift) + …`` by ``s = s + …``.  Which rows of the
#    correctness check go wrong, and in which direction?
#
#    .. dropdown:: Solution
#
#       Every row whose maximum does not sit in its first chunk.  Each
#       chunk's exponentials are then summed against the maximum known at
#       that moment, which is smaller than or equal to the final one, so
#       those terms are too large by :math:`e^{m_{final} - m_{then}}`: the
#       sum comes out too big and the probabilities too small (the row no
#       longer sums to 1).  The row with a 30 in its last chunk is the
#       clearest case.  Rows whose maximum comes first are still right,
#       which is why a test with random data can miss the bug.
#
# 2. Make the backward persistent: write ``softmax_backward_persistent(y,
#    dy, n_programs)`` and check it with a grid of 3 programs.
#
#    .. dropdown:: Solution
#
#       The kernel already strides over tiles; only the grid changes.
#
#       .. code-block:: python
#
#          def softmax_backward_persistent(y, dy, n_programs):
#              cfg = pick_config(y.shape[1], backward=True)  # single pass only
#              n_rows, n_cols = y.shape
#              dx = torch.empty_like(y)
#              grid = (min(triton.cdiv(n_rows, cfg.block_m), n_programs),)
#              softmax_bwd_kernel[grid](
#                  y, dy, dx, n_rows, n_cols, y.stride(0), dy.stride(0), dx.stride(0),
#                  BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
#                  EVEN_M=n_rows % cfg.block_m == 0, EVEN_N=n_cols == cfg.block_n,
#                  NUM_STAGES=1, EVICT="", INT64=False, num_warps=cfg.num_warps,
#              )
#              return dx
#
#          y, dy = softmax(x), torch.randn_like(x)
#          print((softmax_backward_persistent(y, dy, 3).double()
#                 - grad_reference(y, dy)).abs().max())
#
# 3. Add a temperature: ``softmax(x / T)`` in one pass, with ``T`` an
#    ordinary float argument.  What changes in the backward?
#
#    .. dropdown:: Solution
#
#       Pass ``inv_t = 1 / T`` as a (non-constexpr) float and scale right
#       after the load: ``x = x.to(tl.float32) * inv_t``.  The masked
#       ``-inf`` lanes stay ``-inf`` for any positive ``T``.  In the backward,
#       the chain rule adds the factor of the inner function:
#       ``dx = inv_t * y * (dy - sum(y * dy))``, one more multiply before the
#       store.  Neither change moves a single extra byte.
#
# 4. In the widget, compare ``tilebook`` with ``one row per program`` at 256
#    columns.  How many bytes does one program read in each case, and how
#    many programs are launched?
#
#    .. dropdown:: Solution
#
#       ``tilebook`` gives a program 64 rows: 64 x 256 x 2 B = 32 KiB read
#       and as much written, 8192 programs in all.  One row per program reads
#       512 B and writes 512 B, and 524288 programs are launched, each with
#       one warp.  Every program has a fixed cost (starting it, computing its
#       addresses, the reductions' synchronisation) and a warp can only keep
#       so many loads in flight; spread over 64 times fewer bytes, that cost
#       shows.  From 8192 columns on the two are the same launch.
#
# 5. Size the persistent grid for rows of 32768 columns, with one stage and
#    with two.  What limits it?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          for stages in (1, 2):
#              cfg = replace(pick_config(32768), num_stages=stages)
#              registers, shared = kernel_resources(cfg, 4096, 32768)
#              print(stages, programs_per_sm(registers, shared, cfg.num_warps))
#
#       A whole row is one tile on 16 warps (512 threads), and each thread
#       holds 64 float32 values of it, so ``ptxas`` gives the kernel roughly
#       90 to 130 registers a thread, depending on the Triton version.  That
#       is 512 x 96 = 49152 registers or more of the SM's 65536, so a second
#       program does not fit: one per SM, 132 in all, whether or not a 64 KiB
#       buffer is added for the prefetch.  One 16-warp program per SM leaves
#       three quarters of its thread slots empty, which is little to hide
#       HBM's latency with.
#
# 6. Write ``log_softmax``: ``x - m - log(s)``.  Which lines of the
#    single-pass kernel change?
#
#    .. dropdown:: Solution
#
#       Only the two lines that compute ``e`` and ``y``:
#
#       .. code-block:: python
#
#          z = x - tl.max(x, axis=1)[:, None]
#          lse = tl.log(tl.sum(tl.exp(z), axis=1))
#          y = (z - lse[:, None]).to(y_ptr.dtype.element_ty)
#
#       A fully ``-inf`` row still gives NaN (``-inf - -inf``), like
#       ``torch.log_softmax``.  The backward becomes
#       ``dx = dy - exp(y) * sum(dy)``.
#
# 7. Why does the backward walk rows of 32768 in chunks when the forward
#    holds them in registers?  Work it out before measuring anything.
#
#    .. dropdown:: Solution
#
#       The forward holds one row: 32768 float32 values over 512 threads is
#       64 registers of data a thread.  The backward holds two, ``y`` and
#       ``dy``: 128 a thread.  With 16 warps, the register file allows at
#       most 65536 / 512 = 128 registers a thread for everything, so the
#       data alone would fill it and the compiler would spill; with 32 warps
#       the cap drops to 64.  No single-pass launch fits, so the online
#       backward (chunks of 8192, one extra read of ``y`` and ``dy``) is the
#       way, and its cost is the 10% that the table shows at that length.
