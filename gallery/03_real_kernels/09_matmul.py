"""
09. tiled_matmul: tiles, a K loop and the order of the programs
===============================================================

A product of two 8192 x 8192 bf16 matrices is 1.1 TFLOP of arithmetic on 384 MB
of data.  An H100's tensor cores could finish it in about 1.1 ms, but its memory
delivers only 3.35 TB/s, and a kernel that fetched two operands from memory for
every multiply-add would need several hundred times longer.  Everything that makes a
matrix multiplication fast is about fetching each number once and using it many
times: a program owns a whole tile of the output and walks the shared dimension
in steps, the tiles are handed out in an order that lets neighbouring programs
share what they fetch through the L2 cache, and on Hopper the copy engine (TMA)
fetches the tiles while a persistent grid keeps every multiprocessor busy.

This lesson builds that kernel, checks it against a float64 product, measures it
against cuBLAS and then turns the knobs (tile shape, program order, kernel) to
see which of them matter and by how much.

.. rubric:: You will learn

- how a program computes a ``BLOCK_M x BLOCK_N`` tile of ``C = A @ B`` with a
  loop over ``K`` and a float32 accumulator, and why the tile shape sets how
  often each loaded number is reused;
- how masks make the same kernel correct for any ``M``, ``N`` and ``K``, and
  what ``EVEN_K`` saves when ``K`` divides evenly;
- how grouped ("swizzled") program order turns the L2 cache into a second level
  of reuse, with a model you can run on any machine and a measurement on a GPU;
- how ``triton.autotune`` picks tile shape, warps and stages, and how pruning
  keeps the search short;
- what tensor descriptors (TMA) and a persistent grid change on Hopper, and how
  to see it in the SASS of an ahead-of-time compile;
- how close the result comes to cuBLAS, and which settings waste the GPU.

The finished kernels live in the package as :func:`tilebook.matmul` (source,
configurations and launchers: :mod:`tilebook.ops.matmul`).
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` is imported first, so that it can choose between the GPU and
# Triton's interpreter before Triton loads.  On a CPU every program of the grid
# runs one after another in Python, so the matrices there are tens of rows, not
# thousands.

import tilebook  # noqa: I001  (chooses GPU or interpreter before triton loads)

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tilebook.aot import compile_kernel
from tilebook.bench import measure, record_or_measure
from tilebook.check import CorrectnessReport
from tilebook.ops import matmul as mm
from tilebook.ops.matmul import _epilogue  # lesson 08: bias and activation in registers
from tilebook.plots import PALETTE, house_style, plot_record
from tilebook.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
torch.manual_seed(0)
STARTED = time.monotonic()  # the GPU sweep at the end keeps the whole run short
# Streaming multiprocessors: the real count on a GPU.  The interpreter has none; it
# pretends to have 4, as the package does, so that a persistent grid loops.
N_SM = 4
if tilebook.is_gpu():
    N_SM = torch.cuda.get_device_properties(0).multi_processor_count

# %%
# A tile and its K loop
# ---------------------
# Each entry of :math:`C = AB` is a dot product of a row of :math:`A` and a column
# of :math:`B`.  A program that computed one entry would load :math:`2K` numbers
# for :math:`2K` floating-point operations: one FLOP per number, hopeless on a
# machine that does about 295 bf16 FLOPs in the time it reads one byte from HBM
# (989 TFLOP/s against 3.35 TB/s on an H100 SXM).
#
# So one program owns a ``BLOCK_M x BLOCK_N`` tile of :math:`C`.  It walks along
# :math:`K` in steps of ``BLOCK_K``: at each step it loads a ``BLOCK_M x BLOCK_K``
# tile of :math:`A` and a ``BLOCK_K x BLOCK_N`` tile of :math:`B` and adds their
# product to an accumulator that stays in registers for the whole loop:
#
# .. math::
#
#    C_{\text{tile}} = \sum_{k=0}^{\lceil K / \texttt{BLOCK\_K} \rceil - 1}
#        A_{\text{tile}}^{(k)} \, B_{\text{tile}}^{(k)} .
#
# Per step that is :math:`2\,\texttt{BLOCK\_M}\,\texttt{BLOCK\_N}\,\texttt{BLOCK\_K}`
# FLOPs for :math:`(\texttt{BLOCK\_M} + \texttt{BLOCK\_N})\,\texttt{BLOCK\_K}`
# loaded elements: every element of the ``A`` tile is used ``BLOCK_N`` times and
# every element of the ``B`` tile ``BLOCK_M`` times.  Summed over all programs,
# the bytes loaded are :math:`MNK\,e\,(1/\texttt{BLOCK\_M} + 1/\texttt{BLOCK\_N})`
# for elements of :math:`e` bytes: bigger tiles, less traffic.  ``BLOCK_K`` does
# not appear; it only sets how much each step loads at once (and ``tl.dot`` wants
# at least 16).
#
# The ceiling on the tile is the accumulator: ``BLOCK_M * BLOCK_N`` float32 values
# spread over the program's threads, next to everything else the program holds.
# A thread may have 255 registers.


def flops_per_byte(bm: int, bn: int, elem: int = 2) -> float:
    """FLOPs a program does per byte it loads, for a BLOCK_M x BLOCK_N tile."""
    return 2 * bm * bn / ((bm + bn) * elem)


print(f"{'tile':>9} {'FLOP per byte loaded':>21} {'accumulator registers/thread':>30}")
for bm, bn, warps in [(16, 16, 1), (32, 32, 4), (64, 64, 4), (128, 128, 8),
                      (128, 256, 8), (256, 256, 8)]:  # fmt: skip
    regs = bm * bn // (32 * warps)
    print(f"{bm:>4}x{bn:<4} {flops_per_byte(bm, bn):>21.1f} {regs:>16} ({warps} warps)")

# %%
# Even a 128 x 256 tile does only 85 FLOPs per byte it loads, well short of the
# 295 that the tensor cores need per byte of HBM traffic: if every load went to
# HBM, the kernel would run at under a third of its peak.  The rest has to come
# from caches: the programs that run at the same time load many of the same
# tiles, and when one of them has brought a tile into the 50 MB L2 cache, the
# others find it there.  How much they share depends on which tiles run
# together, and that is the next topic.  And 256 x 256 would need 256 registers
# per thread for the accumulator alone, more than a thread may have: 128 x 256
# with 8 warps (two *warpgroups* of four, the unit in which a Hopper tensor core
# instruction works) is as large as a tile gets.
#
# Which program computes which tile
# ---------------------------------
# The grid is one-dimensional: ``num_m * num_n`` programs for ``num_m`` rows and
# ``num_n`` columns of tiles.  The GPU starts programs roughly in the order of
# their id, as many at once as fit on its multiprocessors (a *wave*), and starts
# the next one whenever one finishes.  The function that turns an id into tile
# coordinates therefore decides which tiles are computed together.
#
# The obvious choice is row-major: ``pid_m = pid // num_n``, ``pid_n = pid %
# num_n``.  A wave then covers a few rows of tiles completely: it needs a few
# row-panels of ``A`` but *every* column-panel of ``B``.  Grouped order walks
# *down* ``GROUP_M`` rows of tiles before it moves one column to the right, so a
# wave covers a squarer patch of ``C`` and needs fewer panels in all.  This is
# the package's function, used by both kernels below:
#
# ``tile``
#     The tile's number in launch order (the program id, or the loop counter of
#     a persistent program).
# ``num_m``, ``num_n``
#     Rows and columns of tiles: ``cdiv(M, BLOCK_M)`` and ``cdiv(N, BLOCK_N)``.
# ``GROUP_M: tl.constexpr``
#     Rows of tiles per group; 1 gives row-major order.  The last group may have
#     fewer rows (``rows``) when ``GROUP_M`` does not divide ``num_m``.


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    # Consecutive tiles walk down GROUP_M rows of tiles before moving right, so the
    # programs in flight at once share rows of A and columns of B in L2.
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows
    pid_n = (tile % per_group) // rows
    return pid_m, pid_n


# %%
# The same arithmetic in plain Python lets us reason about the order on any
# machine.  To be sure it *is* the same, a tiny kernel stores what
# ``_tile_coords`` returns for every program, on a grid of 8 x 12 tiles with a
# group size that divides 8 and one that does not:


def tile_coords(tile: int, num_m: int, num_n: int, group_m: int) -> tuple[int, int]:
    """``_tile_coords`` in plain Python: (row, column) of tile number ``tile``."""
    per_group = group_m * num_n
    first_m = (tile // per_group) * group_m
    rows = min(num_m - first_m, group_m)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@triton.jit
def tile_map_kernel(out_ptr, num_m, num_n, GROUP_M: tl.constexpr):
    pid = tl.program_id(axis=0)
    pid_m, pid_n = _tile_coords(pid, num_m, num_n, GROUP_M)
    tl.store(out_ptr + 2 * pid, pid_m)
    tl.store(out_ptr + 2 * pid + 1, pid_n)


MAP_M, MAP_N = 8, 12
for group in (1, 3, 4):
    out = torch.empty(MAP_M * MAP_N, 2, dtype=torch.int32, device=DEVICE)
    tile_map_kernel[(MAP_M * MAP_N,)](out, MAP_M, MAP_N, GROUP_M=group)
    model = [tile_coords(t, MAP_M, MAP_N, group) for t in range(MAP_M * MAP_N)]
    assert out.tolist() == [list(rc) for rc in model], group
    assert sorted(model) == [(m, n) for m in range(MAP_M) for n in range(MAP_N)]
    print(f"GROUP_M={group}: kernel and Python agree; every tile exactly once; "
          f"first 8 tiles {model[:8]}")  # fmt: skip

# %%
# Here are the two orders on that 8 x 12 grid, with a wave of 20 programs (the
# framed tiles).  The shaded margins are the row-panels of ``A`` and the
# column-panels of ``B`` that the first wave needs.

WAVE_DEMO = 20


def draw_order(ax, group_m: int, wave: int = WAVE_DEMO) -> None:
    order = torch.zeros(MAP_M, MAP_N)
    for t in range(MAP_M * MAP_N):
        m, n = tile_coords(t, MAP_M, MAP_N, group_m)
        order[m, n] = t
    ax.imshow(order, cmap="Blues_r", extent=(0, MAP_N, MAP_M, 0), vmin=-30)
    rows_needed, cols_needed = set(), set()
    for t in range(wave):
        m, n = tile_coords(t, MAP_M, MAP_N, group_m)
        rows_needed.add(m)
        cols_needed.add(n)
        ax.add_patch(plt.Rectangle((n, m), 1, 1, fill=False, lw=2, ec="#D55E00"))
    for m in range(MAP_M):
        for n in range(MAP_N):
            colour = "white" if order[m, n] < 40 else "black"
            ax.text(n + 0.5, m + 0.5, f"{int(order[m, n])}", ha="center", va="center",
                    fontsize=7, color=colour)  # fmt: skip
    for m in rows_needed:
        ax.add_patch(plt.Rectangle((-0.9, m), 0.7, 1, color="#E69F00", clip_on=False))
    for n in cols_needed:
        ax.add_patch(plt.Rectangle((n, -0.9), 1, 0.7, color="#009E73", clip_on=False))
    name = "row-major (GROUP_M=1)" if group_m == 1 else f"grouped, GROUP_M={group_m}"
    ax.set_title(f"{name}\nfirst {wave} programs: {len(rows_needed)} A panels + "
                 f"{len(cols_needed)} B panels", fontsize=9)  # fmt: skip
    ax.set_xlim(-1, MAP_N)
    ax.set_ylim(MAP_M, -1)
    ax.set_axis_off()


with house_style():
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, group in zip(axes, (1, 4), strict=True):
        draw_order(ax, group)
    key = ("numbers: launch order;  framed: the first wave;  orange: the row-panels "
           "of A it needs;  green: the column-panels of B")  # fmt: skip
    fig.text(0.5, 0.02, key, ha="center", fontsize=8)
    fig.subplots_adjust(left=0.03, right=0.99, top=0.86, bottom=0.08, wspace=0.08)

# %%
# Row-major, the first 20 programs need 2 row-panels of ``A`` and all 12
# column-panels of ``B``: 14 panels.  Grouped by 4, they need 4 + 5 = 9 for the
# same 20 tiles of output.
#
# A model of L2 reuse
# -------------------
# The same count, done for a whole product, gives a model of the traffic.  Its
# assumption: the programs of a wave move along ``K`` together, so that a tile
# fetched by one of them is found in L2 by the others.  Then at each step of the
# ``K`` loop a wave of ``W`` programs *asks* for ``2W`` tiles (what every program
# loads, from L2 or further) but HBM has to deliver only the *distinct* ones.
# Summed over all waves and steps:
#
# - ``requested``: bytes the programs load, :math:`MNK\,e\,(1/\texttt{BLOCK\_M}
#   + 1/\texttt{BLOCK\_N})`; only the tile shape changes it;
# - ``hbm``: bytes of the distinct panels each wave touches; the order changes it;
# - ``reuse``: ``requested / hbm``, how many programs share each byte fetched.
#
# Real programs drift apart along ``K`` and the L2 is finite, so the model is a
# best case for each order; the measurement further down says what it is worth.


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def l2_model(M, N, K, bm, bn, group_m, wave, elem=2) -> dict:
    """Tiles and bytes for C = A @ B done in waves of ``wave`` consecutive tiles."""
    num_m, num_n = cdiv(M, bm), cdiv(N, bn)
    tiles = num_m * num_n
    hbm, first = 0, None
    for start in range(0, tiles, wave):
        rows, cols = set(), set()
        for t in range(start, min(start + wave, tiles)):
            m, n = tile_coords(t, num_m, num_n, group_m)
            rows.add(m)
            cols.add(n)
        first = first or (len(rows), len(cols))
        hbm += (len(rows) * bm + len(cols) * bn) * K * elem
    requested = tiles * (bm + bn) * K * elem
    return {
        "tiles": tiles,
        "waves": tiles / wave,
        "a_tiles": first[0],  # distinct A tiles per K step, first wave
        "b_tiles": first[1],  # distinct B tiles per K step, first wave
        "requested": requested,
        "hbm": hbm,
        "reuse": requested / hbm,
    }


demo = {g: l2_model(8 * 64, 12 * 64, 4096, 64, 64, g, WAVE_DEMO) for g in (1, 4)}
for g, r in demo.items():
    print(f"GROUP_M={g}: first wave {r['a_tiles']} A + {r['b_tiles']} B tiles per "
          f"step, {r['requested'] / 2**20:.0f} MiB requested, "
          f"{r['hbm'] / 2**20:.0f} MiB from HBM, reuse {r['reuse']:.1f}x")  # fmt: skip

# %%
# The pointer kernel
# ------------------
# Now the kernel itself, as :func:`tilebook.matmul` runs it for any layout and
# dtype.  Its arguments:
#
# ``a_ptr``, ``b_ptr``, ``c_ptr``
#     The three matrices, as pointers to their first elements.  Their element
#     types come from the tensors; the store casts the float32 accumulator to
#     ``c_ptr.dtype.element_ty``.
# ``bias_ptr``
#     Lesson 08's fused bias.  :func:`tilebook.matmul` passes ``HAS_BIAS=False``
#     and any tensor here, which the kernel then never reads.
# ``M``, ``N``, ``K``
#     The problem: ``A`` is ``M x K``, ``B`` is ``K x N``.  Plain integers, so one
#     binary serves every size (Triton still specialises on whether each is a
#     multiple of 16, which lets it vectorise).
# ``stride_am`` ... ``stride_cn``
#     Six strides, two per matrix (``stride_am``, ``stride_ak`` for ``A``, and so
#     on): elements between neighbours along each dimension.  With strides the same
#     kernel reads a transposed or sliced view in place: ``b.t()`` just swaps
#     ``stride_bk`` and ``stride_bn``.  A stride equal to 1 is specialised too, so
#     the common row-major case gets contiguous, vectorised loads.
# ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K: tl.constexpr``
#     The tile shape, from the autotuner.  ``tl.static_assert`` refuses a
#     ``BLOCK_K`` below 16 at compile time, since ``tl.dot`` cannot use it.
# ``GROUP_M: tl.constexpr``
#     The program order, as above.
# ``HAS_BIAS``, ``ACTIVATION: tl.constexpr``
#     Lesson 08's epilogue.  ``_epilogue`` (imported from the package above)
#     adds the bias and applies the activation to the accumulator in registers;
#     with ``False`` and ``"none"`` it compiles to nothing.
# ``EVEN_K: tl.constexpr``
#     True when ``BLOCK_K`` divides ``K``.  Then no ``K`` step runs past the end
#     and the loads need only the row and column masks.
# ``INT64: tl.constexpr``
#     Offsets are 32-bit unless a tensor spans more than ``2**31 - 1`` elements;
#     the launcher switches to 64-bit offsets only then.
#
# Inside: ``offs_m`` and ``offs_n`` are the rows and columns of ``C`` this
# program owns; broadcasting them against ``offs_k`` (``[:, None]`` and
# ``[None, :]``) times the strides gives a 2-D tile of pointers for each operand.
# Rows past ``M`` and columns past ``N`` are masked; masked elements load as 0,
# so they add nothing to the dot products.  In the ``K`` loop, ``tl.dot(a, b,
# acc)`` multiplies the two tiles on the tensor cores and adds into the float32
# accumulator: bf16 or fp16 inputs, fp32 sums, so a long ``K`` does not lose the
# small terms (lesson 05 measures what a 16-bit accumulator costs).  Then the
# pointers advance by one ``K`` step.  The last ``K`` step of a ragged ``K``
# masks the columns of ``A`` and rows of ``B`` past the end, again with zeros.
# After the loop, one masked store writes the tile.


@triton.jit
def matmul_kernel(
    a_ptr,  # (M, K), any strides
    b_ptr,  # (K, N), any strides
    c_ptr,  # (M, N) output, any strides
    bias_ptr,  # (N,) contiguous, or anything when HAS_BIAS is False
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # one of ACTIVATIONS
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K
    INT64: tl.constexpr,  # element offsets may pass 2**31 - 1
):
    tl.static_assert(BLOCK_K >= 16, "tl.dot needs K tiles of at least 16")
    pid = tl.program_id(axis=0)
    pid_m, pid_n = _tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if INT64:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    # Masks rather than clamped indices: a clamped index breaks the contiguity that
    # vectorised loads need when M or N is the unit-stride dimension.
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    acc = _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


# %%
# Launching it with one configuration
# -----------------------------------
# A configuration is a :class:`triton.Config`: values for the tile constants plus
# the launch options ``num_warps`` (threads per program, in warps of 32) and
# ``num_stages`` (how many ``K`` steps the compiler keeps in flight: it turns the
# loop into a pipeline that loads step ``k + stages - 1`` into shared memory while
# the tensor cores work on step ``k``).  The grid is one program per tile.  The
# package's first configuration is the default: 128 x 256 x 64 tiles on a GPU,
# 32 x 32 x 32 in the interpreter.


def matmul_ptr(a, b, cfg: triton.Config = mm.PTR_CONFIGS[0]) -> torch.Tensor:
    """C = A @ B with the pointer kernel and one fixed configuration."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    kw = cfg.kwargs  # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    grid = (cdiv(M, kw["BLOCK_M"]) * cdiv(N, kw["BLOCK_N"]),)
    matmul_kernel[grid](
        a, b, c, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
        **kw, HAS_BIAS=False, ACTIVATION="none", EVEN_K=K % kw["BLOCK_K"] == 0,
        INT64=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return c


print("the first configuration:", mm.PTR_CONFIGS[0])
a = torch.randn(37, 29, device=DEVICE, dtype=torch.float16)
b = torch.randn(29, 53, device=DEVICE, dtype=torch.float16)
exact = a.double() @ b.double()
err = (matmul_ptr(a, b).double() - exact).abs().max().item()
print(f"fp16, 37x53x29: max |matmul_ptr(a, b) - a @ b| = {err:.1e}")
err = (matmul_ptr(a, b.t().contiguous().t()).double() - exact).abs().max().item()
print(f"the same with b as a transposed view: {err:.1e}")

# %%
# Autotuning: tile shape, warps and stages
# ----------------------------------------
# Which configuration is fastest depends on the GPU, the dtype and the shape, and
# the honest way to find out is to time them.  ``triton.autotune`` does that: on
# the first call for each value of its ``key`` it runs every configuration, keeps
# the fastest and reuses it for later calls with the same key.  Two helpers keep
# that affordable:
#
# - ``triton.heuristics`` computes ``EVEN_K`` from the arguments and whichever
#   ``BLOCK_K`` is being tried, so the caller need not;
# - ``prune_configs_by={"early_config_prune": ...}`` throws out configurations
#   before they are compiled.  The package's pruner drops those whose pipeline
#   does not fit in shared memory (``stages * (BLOCK_M + BLOCK_N) * BLOCK_K``
#   elements, against about 220 KB on an H100) and gives small problems one
#   128 x 128 configuration, since timing six would take longer than it saves.
#
# Here are the package's GPU configurations, what their pipeline needs and what
# survives pruning for three problems:

SMEM_BUDGET = 220 * 1024  # bytes of shared memory a program may use on an H100


def pipeline_bytes(cfg: triton.Config, elem: int) -> int:
    kw = cfg.kwargs
    return cfg.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * elem


def describe(cfg: triton.Config) -> str:
    kw = cfg.kwargs
    return (f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} "
            f"w{cfg.num_warps} s{cfg.num_stages}")  # fmt: skip


print(f"{'config':<20} {'bf16 KB':>8} {'fp32 KB':>8}  fits fp32?")
for cfg in mm.GPU_PTR_CONFIGS:
    bf16, fp32 = pipeline_bytes(cfg, 2), pipeline_bytes(cfg, 4)
    assert (fp32 <= SMEM_BUDGET) == mm._fits(cfg, 4)  # the package's own rule
    print(f"{describe(cfg):<20} {bf16 // 1024:>8} {fp32 // 1024:>8}  "
          f"{'yes' if fp32 <= SMEM_BUDGET else 'no'}")  # fmt: skip
for n, elem in [(8192, 2), (8192, 4), (512, 2)]:
    kept = mm._prune(mm.GPU_PTR_CONFIGS, n, n, n, elem)
    print(f"{n}^3, {elem}-byte elements: tries {[describe(c) for c in kept]}")

# %%
# The autotuned kernel is the plain kernel wrapped twice.  ``key`` lists the
# arguments whose values start a new search: here the problem size.  (On a CPU
# the package's list holds the one interpreter configuration, and nothing is
# timed.)

even_k = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
tuned_matmul_kernel = triton.autotune(
    configs=mm.PTR_CONFIGS,
    key=["M", "N", "K"],
    prune_configs_by={"early_config_prune": mm._prune_ptr},
)(even_k(matmul_kernel))


def matmul_tuned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)
    tuned_matmul_kernel[grid](
        a, b, c, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
        HAS_BIAS=False, ACTIVATION="none", INT64=False,
    )  # fmt: skip
    return c


err = (matmul_tuned(a, b).double() - exact).abs().max().item()
print(f"max |matmul_tuned(a, b) - a @ b| = {err:.1e}")
print("the autotuner chose:", tuned_matmul_kernel.best_config)

# %%
# The Hopper path: tensor descriptors and a persistent grid
# ---------------------------------------------------------
# The pointer kernel makes every thread compute addresses and issue its own
# loads, and the compiler turns them into ``cp.async`` copies into shared memory
# (``LDGSTS`` in SASS).  Hopper has a copy engine, the Tensor Memory Accelerator,
# that moves a whole tile with one instruction: a *tensor descriptor* tells it
# the base address, shape, strides and tile shape of a matrix, and the kernel
# then asks for "the tile at row ``r``, column ``c``".  The engine does the
# address arithmetic, fills whatever lies past the edges with zeros (no masks),
# and signals a barrier when the tile has arrived, so the threads' registers
# and issue slots are left to the tensor cores.
#
# The second change is the grid.  Instead of one program per tile, a
# *persistent* grid starts as many programs as can run at once (one per SM by
# default), and each one loops over tiles ``start, start + step, ...``.  The tiles
# are still taken in the order of ``_tile_coords``, a wave at a time.  What it
# buys: no program launch and tear-down per tile, and the loads of a program's
# next tile can start while it finishes the current one (with ``FLATTEN``, the
# compiler pipelines across the tile boundary, not only along ``K``).
#
# The arguments of :func:`~tilebook.ops.matmul.matmul_tma_kernel`:
#
# ``a_desc``, ``b_desc``, ``c_desc``
#     Tensor descriptors, built on the host with
#     ``triton.tools.tensor_descriptor.TensorDescriptor(tensor, shape, strides,
#     block_shape)``.  ``desc.load([i, j])`` returns the ``block_shape`` tile
#     whose first element is ``[i, j]``; ``desc.store([i, j], tile)`` writes one.
#     TMA requires a unit stride in the last dimension and rows aligned to 16
#     bytes, which is why the package takes this path only for 16-bit operands
#     that satisfy it.
# ``bias_ptr``, ``HAS_BIAS``, ``ACTIVATION``
#     The fused epilogue, as before.
# ``M``, ``N``, ``K``
#     The problem size; no strides, they live in the descriptors.
# ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M: tl.constexpr``
#     Tile shape and program order, as before.
# ``A_T``, ``B_T: tl.constexpr``
#     True when an operand is stored transposed (column-major).  Its descriptor
#     then describes the transpose, which *is* row-major, and the loaded tile is
#     flipped with ``.T``.  ``tl.dot`` reads the flipped tile straight from shared
#     memory.
# ``CTAS_PER_SM: tl.constexpr``
#     Programs per SM in the persistent grid.  The kernel never reads it; it is a
#     constexpr only so that the autotuner can choose it with the rest, and the
#     launcher sizes the grid from it.
# ``SPLIT_N: tl.constexpr``
#     Store the tile in two halves of ``BLOCK_N // 2`` columns: the staging buffer
#     in shared memory that the TMA store reads from is half as large, and fewer
#     registers are live while the epilogue works.
# ``FLATTEN: tl.constexpr``
#     Passed to ``tl.range(..., flatten=...)``: whether the compiler may merge the
#     tile loop and the ``K`` loop into one pipelined loop.
#
# Because the loads of the next tile may already be in flight when a tile's
# epilogue runs, the epilogue recomputes its own tile from a second counter,
# ``out_tile``, instead of trusting variables of the loop.


@triton.jit
def matmul_tma_kernel(
    a_desc,  # descriptor of A (M, K), or of A^T (K, M) when A_T
    b_desc,  # descriptor of B (K, N), or of B^T (N, K) when B_T
    c_desc,  # descriptor of C (M, N); blocks of BLOCK_N // 2 columns when SPLIT_N
    bias_ptr,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    CTAS_PER_SM: tl.constexpr,  # read by the launcher only: programs per SM in the grid
    SPLIT_N: tl.constexpr,  # store C in two halves: half the shared memory for the epilogue
    FLATTEN: tl.constexpr,  # let the compiler pipeline across tiles, not only along K
):
    tl.static_assert(BLOCK_K >= 16, "tl.dot needs K tiles of at least 16")
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    start = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)  # the grid is persistent: each program strides over tiles
    # The epilogue recomputes its tile from a counter of its own: once the loops are
    # flattened, the loads of the next tile may already be in flight.
    out_tile = start - step
    for tile in tl.range(start, num_m * num_n, step, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            off_k = kk * BLOCK_K
            # The copy engine fills out-of-bounds elements with zeros: no masks.
            a = a_desc.load([off_k, off_m]).T if A_T else a_desc.load([off_m, off_k])
            b = b_desc.load([off_n, off_k]).T if B_T else b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc)

        out_tile += step
        pid_m, pid_n = _tile_coords(out_tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SPLIT_N:
            # Finish one half at a time: fewer registers live in the activation.
            half: tl.constexpr = BLOCK_N // 2
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, half)), (0, 2, 1)))
            offs_n = off_n + tl.arange(0, half)
            left = _epilogue(left, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            right = _epilogue(right, bias_ptr, offs_n + half, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n + half], right.to(c_desc.dtype))
        else:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            acc = _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


# %%
# ``tl.reshape`` to ``(BLOCK_M, 2, half)`` puts columns ``j`` and ``j + half`` side
# by side, ``tl.permute`` moves that pair to the last axis, and ``tl.split``
# separates a last axis of 2 into its two halves: the left and right half of the
# tile.
#
# The launcher builds the three descriptors with the block shapes of the
# configuration and starts ``min(N_SM * CTAS_PER_SM, tiles)`` programs.  This one
# takes row-major operands only; the package's also handles transposed ones
# (``A_T``, ``B_T``).  It runs under the interpreter too, which emulates the copy
# engine, so the CPU build checks it as well.


def matmul_tma(a, b, cfg: triton.Config = mm.TMA_CONFIGS[0]) -> torch.Tensor:
    """C = A @ B with the TMA kernel (row-major 16-bit operands, aligned rows)."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    kw = cfg.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    c_cols = bn // 2 if kw["SPLIT_N"] else bn
    a_desc = TensorDescriptor(a, [M, K], list(a.stride()), [bm, bk])
    b_desc = TensorDescriptor(b, [K, N], list(b.stride()), [bk, bn])
    c_desc = TensorDescriptor(c, [M, N], list(c.stride()), [bm, c_cols])
    grid = (min(N_SM * kw["CTAS_PER_SM"], cdiv(M, bm) * cdiv(N, bn)),)
    matmul_tma_kernel[grid](
        a_desc, b_desc, c_desc, c, M, N, K, **kw,
        A_T=False, B_T=False, HAS_BIAS=False, ACTIVATION="none",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return c


a16 = torch.randn(70, 40, device=DEVICE, dtype=torch.float16)
b16 = torch.randn(40, 72, device=DEVICE, dtype=torch.float16)
tma_kw = mm.TMA_CONFIGS[0].kwargs
tiles = cdiv(70, tma_kw["BLOCK_M"]) * cdiv(72, tma_kw["BLOCK_N"])
print(f"the first TMA configuration: {mm.TMA_CONFIGS[0]}")
print(f"70x72 output: tiles {tiles}, persistent programs {min(N_SM, tiles)}")
err = (matmul_tma(a16, b16).double() - a16.double() @ b16.double()).abs().max().item()
print(f"max |matmul_tma(a, b) - a @ b| = {err:.1e}")

# %%
# Is it right?
# ------------
# Every kernel of the lesson, and the package's :func:`tilebook.matmul`, against
# the product computed in float64 from the same inputs.  The shapes are the
# awkward ones: a single element, sizes that leave every edge ragged,
# ``K`` shorter than one ``BLOCK_K`` and longer than several, and a transposed
# operand.  The TMA kernel gets shapes whose rows are 16-byte aligned (multiples
# of 8 for 16-bit types) but whose tiles are still ragged.
#
# The reported error is norm-wise relative, :math:`\|C - C_{64}\|/\|C_{64}\|`.
# Expect about :math:`2^{-12}` for fp16 outputs and :math:`2^{-9}` for bf16: the
# rounding of the stored result, since the float32 accumulator adds almost
# nothing.  One caveat for float32 inputs on a GPU: ``tl.dot`` feeds them to the
# tensor cores as **TF32** (its default ``input_precision="tf32"``), which keeps
# 10 bits of mantissa instead of 23, as ``torch.matmul`` does with
# ``torch.backends.cuda.matmul.allow_tf32``.  The error is then about 1e-3
# rather than 1e-7, and we allow 5e-3 for float32 on a GPU.  The interpreter
# multiplies in true float32.  The CPU build checks float32 and float16; the GPU
# build float32 and bfloat16 (the interpreter computes bf16 wrongly).

SHAPES = tilebook.pick(
    gpu=[(1, 1, 1), (37, 53, 29), (255, 257, 130), (1000, 600, 1100)],
    cpu=[(1, 1, 1), (37, 53, 29), (64, 64, 64), (100, 72, 130)],
)
TMA_SHAPES = tilebook.pick(
    gpu=[(17, 40, 24), (1000, 1096, 600)],
    cpu=[(17, 40, 24), (70, 72, 40)],
)
# Each new dtype and shape class costs the GPU a compile, so there it checks the
# two dtypes that matter: fp32 (for TF32) and bf16.
dtypes = tilebook.pick(
    gpu=[torch.float32, torch.bfloat16],
    cpu=[torch.float32, torch.float16],
)


def ptr_config(elem: int) -> triton.Config:
    """The package's first configuration whose pipeline fits for this element size."""
    return next(c for c in mm.PTR_CONFIGS if pipeline_bytes(c, elem) <= SMEM_BUDGET)


def operands(m, n, k, dtype):
    a = torch.randn(m, k, device=DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=DEVICE, dtype=dtype)
    return a, b, a.double() @ b.double()


report = CorrectnessReport("matmul vs float64 reference")
for dtype in dtypes:
    tol = 5e-3 if dtype == torch.float32 and tilebook.is_gpu() else None  # TF32
    check = partial(report.check, tol=tol)
    cfg = ptr_config(torch.finfo(dtype).bits // 8)
    for m, n, k in SHAPES:
        a, b, ref = operands(m, n, k, dtype)
        check(f"pointer kernel {m}x{n}x{k}", matmul_ptr(a, b, cfg), ref)
        check(f"tilebook.matmul {m}x{n}x{k}", tilebook.matmul(a, b), ref)
    check(f"autotuned {m}x{n}x{k}", matmul_tuned(a, b), ref)
    # B as the transpose of a stored (N, K) matrix: read in place through its strides.
    bt = torch.randn(n, k, device=DEVICE, dtype=dtype).t()
    ref = a.double() @ bt.double()
    check("pointer kernel, b = w.t()", matmul_ptr(a, bt, cfg), ref)
    check("tilebook.matmul, b = w.t()", tilebook.matmul(a, bt), ref)
    if dtype != torch.float32:  # TMA takes 16-bit types only
        for m, n, k in TMA_SHAPES:
            a, b, ref = operands(m, n, k, dtype)
            check(f"TMA kernel {m}x{n}x{k}", matmul_tma(a, b), ref)
            check(f"tilebook.matmul {m}x{n}x{k}", tilebook.matmul(a, b), ref)
report.assert_ok()

# %%
# What TF32 costs can be computed on any machine: round the float32 inputs to
# TF32 (keep 10 mantissa bits, rounding to nearest) and multiply exactly.  The
# error is that of the inputs' rounding, about :math:`2^{-11}` per element,
# partly averaged out over the sum.


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    bits = x.float().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)  # drop the last 13 bits


a = torch.randn(256, 1024)
b = torch.randn(1024, 256)
exact = a.double() @ b.double()
tf32 = round_to_tf32(a).double() @ round_to_tf32(b).double()
print(f"TF32 inputs, exact sums: relative error {rel_err(tf32, exact):.1e}")

# %%
# What the compiler made of it: HGMMA and UTMALDG
# -----------------------------------------------
# Nothing above needed a GPU, and neither does reading the machine code: Triton
# can compile for a GPU the machine does not have.
# :func:`~tilebook.ops.matmul.compile_ahead` compiles either kernel with one of
# the package's configurations for a chosen architecture and hands back its SASS.
# We compile three (in parallel, as each takes a few seconds): the pointer kernel
# for an A100 (``sm_80``) and for an H100 (``sm_90``), and the TMA kernel for an
# H100, all in bf16 with 128 x 256 x 64 tiles and 8 warps, and count the
# instructions that matter:
#
# ``HMMA``
#     Ampere's tensor core instruction: one warp, a 16 x 8 x 16 product.
# ``HGMMA``
#     Hopper's *warpgroup* instruction (``wgmma`` in PTX): four warps together,
#     here a 64 x 256 x 16 product whose operands (both of them, in these
#     kernels) are read straight from shared memory.
# ``LDGSTS``
#     ``cp.async``: one thread's copy from global to shared memory.
# ``UTMALDG``, ``UTMASTG``
#     A TMA tile load or store, issued by a single thread for the whole program.

AOT_JOBS = {  # sm_80 gets 3 stages: an A100 has 164 KB of shared memory, not 228
    "pointer, sm_80": ("pointer", mm._cfg(128, 256, 64, 8, 3), 80),
    "pointer, sm_90": ("pointer", mm.GPU_PTR_CONFIGS[0], 90),
    "TMA, sm_90": ("tma", mm.GPU_TMA_CONFIGS[0], 90),
}
COUNTED = ["HMMA", "HGMMA", "LDGSTS", "UTMALDG", "UTMASTG"]
PATTERNS = [rf"\b{name}\b" for name in COUNTED]  # whole words: HMMA is not HGMMA

# In CPU mode each compile runs in a child process, so threads overlap them; on a
# GPU they run in this process, one at a time.
with ThreadPoolExecutor(max_workers=1 if tilebook.is_gpu() else len(AOT_JOBS)) as pool:
    futures = {name: pool.submit(mm.compile_ahead, kind, cfg, "bf16", arch=arch)
               for name, (kind, cfg, arch) in AOT_JOBS.items()}  # fmt: skip
    compiled = {name: f.result() for name, f in futures.items()}

print(f"{'kernel, target':<16}" + "".join(f"{c:>9}" for c in COUNTED), " regs smem KB")
for name, k in compiled.items():
    counts = "".join(f"{k.count(pattern):>9}" for pattern in PATTERNS)
    print(f"{name:<16}{counts}  {k.registers!s:>4} {k.shared_bytes // 1024:>7}")

# %%
# One ``K`` step of a 128 x 256 x 64 tile is :math:`128 \cdot 256 \cdot 64 / (16
# \cdot 8 \cdot 16) = 1024` HMMA instructions for the program, 128 for each of its
# 8 warps, and that is what the ``sm_80`` compile unrolls.  On ``sm_90`` the same
# step is four HGMMAs per warpgroup: the whole ``K`` loop body of the pointer
# kernel now issues four matrix instructions, and the threads are free for the
# address arithmetic and ``LDGSTS`` copies.  The TMA kernel drops even those:
# its tiles arrive through a few ``UTMALDG``\s (six in the whole kernel here,
# each issued by a single thread for a whole tile), and the output leaves through
# ``UTMASTG``.  Registers fall accordingly, and the shared memory holds the
# pipeline stages (plus, for the TMA kernel, the staging buffer of the store).
#
# How fast is it?
# ---------------
# A matrix product does :math:`2MNK` floating-point operations, and TFLOP/s is
# that count over the time.  The reference is cuBLAS, through ``torch.matmul``
# on the same bf16 operands.  The sizes are squares from 1024 to 8192 and one
# ragged shape, 4095 x 4097 x 4093, whose odd rows rule out TMA: it takes the
# pointer kernel with every edge masked.  Each product is checked against float64
# (on its first 1024 rows) before it is timed.  On a CPU the plot comes from the
# committed GPU record.

BENCH_SQUARES = [1024, 2048, 3072, 4096, 6144, 8192]
BENCH_RAGGED = (4095, 4097, 4093)


def picked_config(m: int, n: int, k: int) -> str:
    """The configuration the package's autotuner settled on for this problem (read
    from the launcher's private cache, so: "unknown" if that ever changes shape)."""
    try:
        for key, (kw, *_) in mm._PICKED.items():
            if tuple(key[1:4]) == (m, n, k):
                return (f"{key[0]} {kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} "
                        f"w{kw['num_warps']} s{kw['num_stages']}")  # fmt: skip
    except (AttributeError, KeyError, TypeError, ValueError):
        pass
    return "unknown"


def size_sweep():
    rows = []
    shapes = [(n, n, n) for n in BENCH_SQUARES] + [BENCH_RAGGED]
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        err = rel_err(tilebook.matmul(a, b)[:1024], a[:1024].double() @ b.double())
        assert err < 1e-2, (m, n, k, err)
        info = {
            "shape": f"{m}x{n}x{k}",
            "size": round((m * n * k) ** (1 / 3)),
            "kind": "square" if m == n == k else "ragged",
        }
        ours = {"config": picked_config(m, n, k), "rel_err": err}
        t = measure(partial(tilebook.matmul, a, b), flops=2 * m * n * k)
        rows.append({**info, "impl": "tilebook", **ours, **t.as_row()})
        t = measure(partial(torch.matmul, a, b), flops=2 * m * n * k)
        rows.append({**info, "impl": "cuBLAS", **t.as_row()})
        del a, b
        torch.cuda.empty_cache()
    return rows


sizes = record_or_measure(
    "lesson09_sizes", "matmul, bf16: TFLOP/s by size, tilebook vs cuBLAS", size_sweep
)
fig = plot_record(
    sizes,
    x="size",
    y="tflops",
    series="impl",
    where={"kind": "square"},
    logx=True,
    title="C = A @ B, bf16, square n x n x n (+ one ragged shape)",
    xlabel="n (ragged: cube root of M N K)",
    ylabel="TFLOP/s (2MNK / time)",
    order=["tilebook", "cuBLAS"],
    name="lesson09_sizes",
)
if fig is not None:
    ax = fig.axes[0]
    colours = {"tilebook": PALETTE[0], "cuBLAS": PALETTE[1]}  # as the lines
    for row in sizes.select(kind="ragged"):
        ax.scatter([row["size"]], [row["tflops"]], marker="D", s=40, zorder=3,
                   color=colours[row["impl"]],
                   label=f"{row['impl']}, ragged {row['shape']}")  # fmt: skip
    ax.set_ylim(0, 1000)  # room for the legend above the lines
    ax.legend(loc="upper left", fontsize=8, ncol=2)

# %%
# The numbers behind the plot, with the configuration the autotuner picked for
# each problem:

if sizes is not None:
    print(sizes.caption())
    head = f"{'shape':>16} {'tilebook':>9} {'cuBLAS':>7} {'ratio':>5} {'rel err':>8}"
    print(head + "  config")
    for shape in dict.fromkeys(r["shape"] for r in sizes.rows):
        (ours,) = sizes.select(shape=shape, impl="tilebook")
        (theirs,) = sizes.select(shape=shape, impl="cuBLAS")
        print(f"{shape:>16} {ours['tflops']:9.0f} {theirs['tflops']:7.0f} "
              f"{ours['tflops'] / theirs['tflops']:5.2f} {ours['rel_err']:8.1e}  "
              f"{ours['config']}")  # fmt: skip
else:
    print("No committed GPU record of this benchmark yet: nothing to show.")

# %%
# What the H100 record says.  From 4096 cubed up, and at 2048, :func:`tilebook.matmul`
# runs within about 5% of cuBLAS, on either side: 710 against 682 TFLOP/s at
# 4096, 688 against 667 at 6144, 678 against 708 at 8192 (the p20-p80 spread of
# these timings is itself a few percent).  Three points tell other stories:
#
# - **1024 cubed, 0.56x.**  Every TMA configuration of the package has 128 x 256
#   tiles, so this product is 8 x 4 = 32 tiles for 132 SMs: three quarters of the
#   GPU have nothing to do.  (The pruner's rule "small problems take a 128 x 128
#   configuration" finds none among the TMA configurations and keeps the first.)
#   At 17 us a call, the Python that :func:`tilebook.matmul` runs on the host for
#   every call (checking operands, building three descriptors) also starts to
#   matter: ``do_bench`` launches back to back, and a GPU that finishes before
#   the host has issued the next launch waits.
# - **3072 cubed, 0.77x.**  24 x 12 = 288 tiles on 132 SMs make two full rounds
#   and a third of 24 tiles, which takes as long as a full one: 2.18 rounds of
#   work in 3 rounds of time, 73% busy, close to the 0.77 measured.  This is
#   *wave quantisation*; cuBLAS, with more tile shapes to choose from, avoids it
#   here.
# - **The ragged shape, 125 against 158.**  Both libraries are four to six times
#   slower than at 4096, and the masks are not the reason.  A row of 4093 bf16
#   values is 8186 bytes, so the rows do not start on 16-byte boundaries: no
#   descriptor (TMA needs 16-byte aligned rows) and no 16-byte loads.
#
# The last point can be seen without a GPU.  Triton specialises every integer
# argument on whether it is a multiple of 16; a row stride that is not one tells
# the compiler that a row's start may lie anywhere.  Compile the pointer kernel
# with the autotuner's pick for the ragged shape (128 x 128 x 64, 8 warps, 4
# stages) twice for ``sm_90``, once with every size and stride a multiple of 16
# and once with none (``EVEN_K`` false as well), and count the memory
# instructions:

POINTERS = ["a_ptr", "b_ptr", "c_ptr", "bias_ptr"]
INTS = ["M", "N", "K", "stride_am", "stride_bk", "stride_cm"]
SIGNATURE = {name: "*bf16" for name in POINTERS} | {name: "i32" for name in INTS}
RAGGED_CONSTS = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
                 "HAS_BIAS": False, "ACTIVATION": "none", "INT64": False,
                 "stride_ak": 1, "stride_bn": 1, "stride_cn": 1}  # fmt: skip
ALIGNMENT_JOBS = {  # name: (EVEN_K, the arguments that are multiples of 16)
    "rows 16-byte aligned": (True, POINTERS + INTS),
    "odd row lengths": (False, POINTERS),
}
MEMORY_OPS = {
    "LDGSTS.128": r"LDGSTS\S*\.128",  # cp.async, 16 bytes per thread
    "LDG.U16": r"LDG\.E\.U16",  # an ordinary load of one 2-byte element
    "STG.128": r"STG\.E\.128",
    "STG.U16": r"STG\.E\.U16",
}


def compile_pointer(even_k: bool, aligned: list[str]):
    consts = {**RAGGED_CONSTS, "EVEN_K": even_k}
    return compile_kernel(
        "tilebook.ops.matmul:matmul_kernel", SIGNATURE, consts,
        num_warps=8, num_stages=4, divisible_by_16=aligned,
    )  # fmt: skip


with ThreadPoolExecutor(max_workers=1 if tilebook.is_gpu() else 2) as pool:
    jobs = {n: pool.submit(compile_pointer, *job) for n, job in ALIGNMENT_JOBS.items()}
    aligned_vs_odd = {n: job.result() for n, job in jobs.items()}
print(f"{'':<22}" + "".join(f"{op:>12}" for op in MEMORY_OPS) + "   regs")
for name, k in aligned_vs_odd.items():
    counts = "".join(f"{k.count(rx):>12}" for rx in MEMORY_OPS.values())
    print(f"{name:<22}{counts}   {k.registers}")

# %%
# With aligned rows the tiles travel by 16-byte ``cp.async`` copies straight into
# shared memory, which is what the ``num_stages`` pipeline is built from.  With
# odd rows every element is a separate 2-byte load into registers: many times the
# instructions, no asynchronous copies and so no pipeline, and a thread full of
# registers.  The cure is in the caller's hands: pad the matrices (exercise 6).
#
# Program order and tile shape, measured
# --------------------------------------
# Now the knobs.  The sweep below runs the lesson's two kernels at 8192 cubed in
# bf16, launched with explicit configurations (no autotuner), for four tile
# shapes, both orders (``GROUP_M=1``, row-major, and ``GROUP_M=8``, grouped) and
# both kernels:
#
# ===========  ========  =====  ======  =====================================
# tile         BLOCK_K   warps  stages  programs per SM (TMA: ``CTAS_PER_SM``)
# ===========  ========  =====  ======  =====================================
# 64 x 64      64        4      4       3
# 128 x 128    64        8      4       1
# 128 x 256    64        8      3       1
# 256 x 128    64        8      3       1
# ===========  ========  =====  ======  =====================================
#
# Programs per SM is what fits in its 228 KB of shared memory; it sets the wave
# (``N_SM`` times it) for the model and the persistent grid of the TMA kernel.
# First the model's prediction for each setting on an H100's 132 SMs:

SWEEP_SIZE = 8192
SWEEP_TILES = {  # name: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, programs per SM)
    "64x64": (64, 64, 64, 4, 4, 3),
    "128x128": (128, 128, 64, 8, 4, 1),
    "128x256": (128, 256, 64, 8, 3, 1),
    "256x128": (256, 128, 64, 8, 3, 1),
}
ORDERS = {"row-major": 1, "GROUP_M=8": 8}
KERNELS = ["pointer", "TMA"]
VARIANTS = [f"{kern}, {order}" for kern in KERNELS for order in ORDERS]


def sweep_model(tile: str, group_m: int, sms: int = 132) -> dict:
    bm, bn, _, _, _, per_sm = SWEEP_TILES[tile]
    return l2_model(SWEEP_SIZE, SWEEP_SIZE, SWEEP_SIZE, bm, bn, group_m, sms * per_sm)


print(f"{'tile':>8} {'order':>10} {'wave':>5} {'A+B tiles/step':>15} "
      f"{'requested GB':>13} {'HBM GB':>7} {'reuse':>6}")  # fmt: skip
for tile, spec in SWEEP_TILES.items():
    for order, group in ORDERS.items():
        r = sweep_model(tile, group)
        print(f"{tile:>8} {order:>10} {132 * spec[-1]:>5} "
              f"{r['a_tiles']:>7} + {r['b_tiles']:<5} {r['requested'] / 1e9:>13.1f} "
              f"{r['hbm'] / 1e9:>7.2f} {r['reuse']:>5.1f}x")  # fmt: skip

# %%
# The model predicts two separate effects.  The tile shape sets what the programs
# request: 64 x 64 tiles load 34 GB in all, 128 x 256 tiles 13 GB, for the same
# 1.1 TFLOP.  The order sets how much of that HBM must supply: grouping cuts it by
# a factor of 1.5 to 2.5, depending on the tile shape.  At 700 TFLOP/s the product takes
# about 1.6 ms, so 2.3 GB from HBM would need 1.5 TB/s, under half of what HBM
# gives.  The model therefore expects the order to matter less than the tile
# shape on an H100, unless the programs of a wave drift further apart than it
# assumes.  The measurement decides:


def sweep_config(tile: str, group_m: int, kernel: str) -> triton.Config:
    bm, bn, bk, warps, stages, per_sm = SWEEP_TILES[tile]
    kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m}
    if kernel == "TMA":
        kw.update(SPLIT_N=True, FLATTEN=True, CTAS_PER_SM=per_sm)
    return triton.Config(kw, num_warps=warps, num_stages=stages)


# On a GPU, stop starting new settings once the lesson has run this long (compiles
# add up); what was not measured shows as "n/a".  The most telling settings go first.
SWEEP_DEADLINE_S = 270
SWEEP_RUN_ORDER = ["128x256", "64x64", "128x128", "256x128"]


def order_sweep():
    n = SWEEP_SIZE
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ref = a[:512].double() @ b.double()  # 512 rows: enough to catch a wrong tile
    launch = {"pointer": matmul_ptr, "TMA": matmul_tma}
    rows = []
    for tile in SWEEP_RUN_ORDER:
        for order, group in ORDERS.items():
            for kernel in KERNELS:
                setting = f"{tile} {kernel} {order}"
                if time.monotonic() - STARTED > SWEEP_DEADLINE_S:
                    print(f"out of time: {setting} not measured")
                    continue
                fn = partial(launch[kernel], a, b, sweep_config(tile, group, kernel))
                try:
                    err = rel_err(fn()[:512], ref)
                    t = measure(fn, flops=2 * n**3)
                except Exception as exc:  # noqa: BLE001  (a failure is a result too)
                    print(f"{setting}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                assert err < 1e-2, (setting, err)
                rows.append({"tile": tile, "order": order, "GROUP_M": group,
                             "kernel": kernel, "variant": f"{kernel}, {order}",
                             "rel_err": err, **t.as_row()})  # fmt: skip
    return rows


sweep = record_or_measure(
    "lesson09_order_sweep",
    "matmul, bf16, 8192^3: TFLOP/s by tile shape, program order and kernel",
    order_sweep,
)

# %%
# The widget holds that sweep: rows are tile shapes, columns the kernel and the
# program order.  Under the measured TFLOP/s it shows the model's account of the
# same setting: the wave, the distinct tiles it needs per ``K`` step, and the
# bytes requested and fetched from HBM.  Move the sliders, or click a cell.


class OrderedSweep(SweepExplorer):
    """A SweepExplorer whose knob values keep a given order instead of sorting."""

    def __init__(self, rows, *, order: dict, **kwargs):
        super().__init__(rows, **kwargs)
        self.order = order

    def data(self):
        d = super().data()
        for knob in d["knobs"]:
            wanted = self.order.get(knob["name"])
            if wanted:
                knob["values"] = [v for v in wanted if v in knob["values"]]
        return d


def explain(row: dict, sms: int) -> dict:
    tile, group = row["tile"], row["GROUP_M"]
    r = sweep_model(tile, group, sms)
    wave = sms * SWEEP_TILES[tile][-1]
    detail = (
        f"model: a wave of {wave} programs needs {r['a_tiles']} A + {r['b_tiles']} B "
        f"tiles per K step; {r['requested'] / 1e9:.1f} GB requested, "
        f"{r['hbm'] / 1e9:.2f} GB from HBM ({r['reuse']:.1f}x reuse)"
    )
    return {**row, "detail": detail}


if sweep is not None:
    sms = sweep.provenance.get("sm_count", 132)
    widget = OrderedSweep(
        [explain(r, sms) for r in sweep.rows],
        knobs=["tile", "variant"],
        metric="tflops",
        unit="TFLOP/s",
        labels={"tile": "BLOCK_M x BLOCK_N", "variant": "kernel, order"},
        order={"tile": list(SWEEP_TILES), "variant": VARIANTS},
        title="matmul 8192^3 bf16: tile shape, program order and kernel",
        caption=sweep.caption(),
        initial={"tile": "128x256", "variant": "TMA, GROUP_M=8"},
        slow_hint="small tiles load more bytes per FLOP than the caches can feed.",
        extra="detail",
    )
    print(sweep.caption())
    print(f"{'tile':>8} " + " ".join(f"{v:>20}" for v in VARIANTS) + "   (TFLOP/s)")
    for tile in SWEEP_TILES:
        cells = []
        for v in VARIANTS:
            got = sweep.select(tile=tile, variant=v)
            cells.append(f"{got[0]['tflops']:>20.0f}" if got else f"{'n/a':>20}")
        print(f"{tile:>8} " + " ".join(cells))
    print("grouped / row-major, same tile and kernel:")
    for tile in SWEEP_TILES:
        for kernel in KERNELS:
            pair = [sweep.select(tile=tile, variant=f"{kernel}, {o}") for o in ORDERS]
            if all(pair):
                gain = pair[1][0]["tflops"] / pair[0][0]["tflops"]
                hbm = [sweep_model(tile, g, sms)["hbm"] for g in ORDERS.values()]
                model = hbm[0] / hbm[1]
                print(f"  {tile:>8} {kernel:>7}: measured {gain:5.2f}x, "
                      f"model's HBM traffic {model:4.2f}x less")  # fmt: skip
else:
    widget = "No committed GPU record of the order sweep yet: nothing to show."
widget

# %%
# Reading the sweep (the H100 record above):
#
# - **The tile shape is the big knob.**  64 x 64 tiles run at 210 to 300 TFLOP/s
#   in every variant, less than half of the best (the widget marks them slow).
#   They request 34 GB for a product that 128 x 256 tiles do with 13 GB, and each
#   of their tensor core instructions (64 x 64 x 16) does a quarter of the work of
#   a large tile's (64 x 256 x 16), so issuing and waiting weigh four times more.
# - **Grouped order pays, by less than the model's best case.**  In six of the
#   eight pairs ``GROUP_M=8`` is faster, by 5 to 17% for the large tiles and by
#   42% for the pointer kernel's 64 x 64 tiles, the setting that requests the
#   most bytes.  The model promised 1.5 to 2.5 times less HBM traffic; the
#   measured gain is smaller because HBM is not the only limit (at 700 TFLOP/s
#   even row-major needs only half its bandwidth) and because the programs of a
#   wave drift apart, so some of the sharing the model counts never happens.
#   The two exceptions, the TMA kernel's 64 x 64 tiles (three programs per SM,
#   limited by the small ``tl.dot``) and the pointer kernel's 128 x 256 tiles
#   (3% slower, within the spread of its timings), show that the order is a
#   second-order knob once the tiles are large.
# - **The Hopper path wins where it counts.**  The TMA kernel with 128 x 256 tiles
#   and grouped order is the fastest setting, 724 TFLOP/s, 9% ahead of the best
#   pointer setting (664).  With 128 x 128 tiles, where a program does less work
#   per tile, the pointer kernel is a little ahead; the autotuner of the package
#   only offers the TMA kernel its 128 x 256 configurations.
#
# Try this
# --------
#
# 1. Which ``GROUP_M`` does the model prefer for 128 x 256 tiles at 8192 cubed on
#    132 SMs?  Try 1, 2, 4, 8, 16, 32 and 64.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          for g in (1, 2, 4, 8, 16, 32, 64):
#              r = l2_model(8192, 8192, 8192, 128, 256, g, 132)
#              print(g, r["a_tiles"], r["b_tiles"], f"{r['hbm'] / 1e9:.2f} GB")
#
#       ``GROUP_M=16`` wins, with 16 + 9 tiles per wave and 1.22 GB from HBM,
#       against 1.49 GB at 8 and 2.31 GB row-major.  The best group makes the
#       wave's patch of ``C`` about as tall, in bytes of panels, as it is wide:
#       ``B`` tiles are twice as wide as ``A`` tiles are tall, so the patch wants
#       about twice as many rows as columns.  ``GROUP_M=2`` is no better than
#       row-major (2.34 GB), since a row-major wave of 132 tiles already spans 5
#       rows.  Whether 16 beats the package's 8 on a real GPU is a question for the
#       sweep: add it to ``ORDERS`` and run the lesson there.
#
# 2. Launch ``matmul_ptr`` with a configuration whose ``BLOCK_K`` is 8.  What
#    happens?
#
#    .. dropdown:: Solution
#
#       Compilation stops at the ``tl.static_assert``: "tl.dot needs K tiles of
#       at least 16".  Without that line the error would come from ``tl.dot``
#       itself, further from the cause; the tensor core instructions multiply
#       ``K`` slices of 16 (bf16, fp16) or 8 (TF32) elements at a time.
#
# 3. A linear layer computes ``x @ w.t()`` with ``w`` stored as ``(N, K)``.  How
#    do you run it on the pointer kernel without copying ``w``, and what would the
#    TMA kernel need?
#
#    .. dropdown:: Solution
#
#       ``matmul_ptr(x, w.t())``: the view has strides ``(1, K)``, which the
#       kernel takes as ``stride_bk = 1``, ``stride_bn = K``; the correctness
#       table above checks exactly this.  A descriptor must have a unit stride in
#       its last dimension, which ``w.t()`` does not, so the TMA kernel describes
#       ``w`` itself, ``(N, K)`` with block ``[BLOCK_N, BLOCK_K]``, and passes
#       ``B_T=True`` so that the loaded tile is transposed: what
#       :func:`tilebook.matmul` does.
#
# 4. On 132 SMs, how many tiles does each persistent program of the TMA kernel
#    compute at 8192 cubed with 128 x 256 tiles, and how busy is the GPU in the
#    last round?
#
#    .. dropdown:: Solution
#
#       64 x 32 = 2048 tiles over 132 programs: 68 programs compute 16 tiles and
#       64 compute 15 (``2048 = 15 * 132 + 68``).  In the last round 68 of 132 SMs
#       work and the rest wait: 64 idle SMs for one round in 16, about 3% of the
#       product's time.  Small problems suffer far more: at 2048 cubed there are
#       128 tiles, one round with 4 SMs idle, and nothing to hide a slow program
#       behind; at 1024 cubed with 128 x 128 tiles, 64 tiles leave half the GPU
#       idle.
#
# 5. The pointer kernel masks its loads on every ``K`` step when ``EVEN_K`` is
#    false.  Find the cost: compile it ahead of time with ``EVEN_K=False`` and
#    compare the SASS with the ``EVEN_K=True`` version.
#
#    .. dropdown:: Solution
#
#       ``mm.compile_ahead`` fixes ``EVEN_K=True``; call
#       :func:`tilebook.aot.compile_kernel` on ``"tilebook.ops.matmul:matmul_kernel"``
#       with the same signature and ``EVEN_K=False``.  The masked version computes
#       ``k_left`` and fresh predicates for its loads on every step: with Triton
#       3.8 the SASS grows from 49 to 81 ``ISETP`` (comparisons) and from 27 to
#       75 ``SEL``, and the registers from 210 to 220.  The four ``HGMMA`` and 48
#       ``LDGSTS`` stay as they were.  That integer work runs beside the tensor
#       cores, so it costs little for a large ``K``.
#
# 6. The ragged shape of the benchmark ran at 126 TFLOP/s, against 717 at 4096
#    cubed.  Without touching the kernel, how would you get most of that back?
#
#    .. dropdown:: Solution
#
#       Pad with zeros so that ``K`` and ``N`` become multiples of 16, multiply,
#       and slice:
#
#       .. code-block:: python
#
#          a_pad = torch.zeros(4095, 4096, device="cuda", dtype=torch.bfloat16)
#          b_pad = torch.zeros(4096, 4112, device="cuda", dtype=torch.bfloat16)
#          a_pad[:, :4093] = a
#          b_pad[:4093, :4097] = b
#          c = tilebook.matmul(a_pad, b_pad)[:, :4097]
#
#       The zero columns of ``a_pad`` meet the zero rows of ``b_pad`` and add
#       nothing, and the extra columns of ``C`` are cut off.  Every row is now
#       16-byte aligned, so :func:`tilebook.matmul` takes the TMA kernel; only
#       ``M`` is still ragged, which the copy engine handles by zero fill.  Padding
#       only the strides (a view ``a_pad[:, :4093]``) is not enough: the masks on
#       ``K`` and ``N`` would still be ragged, and the compiler vectorises a masked
#       load only if it can prove the mask equal for all 8 elements of a 16-byte
#       vector.  (Compile both variants as above to see it: with the strides alone
#       padded the loads stay ``LDG.E.U16``; with ``K`` and ``N`` padded they become
#       16-byte ``LDGSTS``, even for the pointer kernel.)  The padded product does
#       0.4% more arithmetic and, unless the operands can be kept padded, two
#       copies.  The record above does not include it, so measure it with
#       :func:`tilebook.bench.measure` and compare with the 4096-cubed figure.
