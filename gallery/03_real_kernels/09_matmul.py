"""
09. tiled_matmul: the K loop, program order, autotuning and the Hopper path
===========================================================================

Lesson 08's kernel held all of the inner dimension ``K`` in one block: fine for
a layer with a hundred inputs, not for one with four thousand.  This lesson
walks ``K`` in steps, with a float32 accumulator that stays in
:term:`registers <register>` for the whole loop, then makes the kernel fast:
it orders the programs so that neighbours share what they load through the
:term:`L2` cache, lets ``triton.autotune`` pick the tile, and on Hopper lets
the copy engine (:term:`TMA`) fetch the tiles for a grid of programs that stays
resident.  Lesson 08's epilogue on top of it is :func:`tilebook.linear_act`.

.. rubric:: You will learn

- how a program computes a tile of ``C = A @ B`` with a loop over ``K``, and
  why the tile shape sets how often each loaded number is used;
- how masks make one kernel correct for any ``M``, ``N`` and ``K``;
- how grouped program order turns the L2 cache into a second level of reuse,
  with a model you can run anywhere and a measurement on a GPU;
- how ``triton.autotune`` picks tile shape, :term:`warps <warp>` and stages,
  and how pruning keeps the search short;
- what tensor descriptors and a resident grid change on Hopper, in the
  :term:`SASS` of an ahead-of-time compile, and how close it comes to cuBLAS.

The finished kernels live in the package as :func:`tilebook.matmul`
(:mod:`tilebook.ops.matmul`).
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` comes first, to pick the GPU or the interpreter before Triton
# loads.  The interpreter has no :term:`SMs <SM>`; like the package, it
# pretends to have four, so that a resident grid still loops.  The tables,
# sentences, claims and explorer settings this page makes of its records are made
# in :mod:`tilebook.course.experiments.matmul` (``experiment`` below).

import tilebook  # chooses GPU or interpreter before triton loads

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tilebook.course.aot import compile_many, instruction_table
from tilebook.course.bench import compare, record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.datasheet import build_fact
from tilebook.course.experiments import linear_act as linear_experiment
from tilebook.course.experiments import matmul as experiment
from tilebook.ops import matmul as mm
from tilebook.ops.epilogue import epilogue
from tilebook.course.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
torch.manual_seed(0)
N_SM = 4
if tilebook.is_gpu():
    N_SM = torch.cuda.get_device_properties(0).multi_processor_count

# %%
# A tile and its K loop
# ---------------------
# One program owns a ``BLOCK_M x BLOCK_N`` tile of :math:`C` and walks along
# ``K`` in steps of ``BLOCK_K``.  At each step it loads a ``BLOCK_M x BLOCK_K``
# tile of :math:`A` and a ``BLOCK_K x BLOCK_N`` tile of :math:`B` and adds
# their product to a float32 accumulator:
#
# .. math::
#
#    C_\mathrm{tile} = \sum_{s=0}^{\lceil K / B_K \rceil - 1}
#        A_\mathrm{tile}^{(s)} \, B_\mathrm{tile}^{(s)} .
#
# A step does :math:`2 B_M B_N B_K` operations on :math:`(B_M + B_N) B_K`
# loaded elements: each element of the ``A`` tile is used ``BLOCK_N`` times,
# each of the ``B`` tile ``BLOCK_M`` times.  ``BLOCK_K`` cancels; larger tiles
# in ``M`` and ``N`` load fewer bytes per operation, up to what the
# accumulator (``BLOCK_M * BLOCK_N`` float32 values over the program's threads)
# allows.  The GPU this page speaks for does :datasheet:`gpu.bf16_dense` against
# :datasheet:`gpu.memory_bandwidth` of :term:`HBM`:


def flops_per_byte(bm: int, bn: int, elem: int = 2) -> float:
    """Operations a program does per byte it loads, for a BLOCK_M x BLOCK_N tile."""
    return 2 * bm * bn / ((bm + bn) * elem)


experiment.say_balance(flops_per_byte(128, 256))

# %%
# Even a large tile loads more than HBM alone could feed: the rest must come
# from caches, and that depends on which programs run together.
#
# Which program computes which tile
# ---------------------------------
# The grid is one-dimensional, one program per tile, and the GPU starts them roughly
# in order of their id, as many at once as fit (a *wave*).  Row-major order (``pid //
# num_n``, ``pid % num_n``) gives a wave a few whole rows of tiles: a few row-panels
# of ``A`` but every column-panel of ``B``.  Grouped order walks *down* ``GROUP_M``
# rows of tiles before it moves right, so a wave covers a squarer patch of ``C`` and
# needs fewer panels.  This is the package's function; ``GROUP_M = 1`` is row-major
# order, and the last group has fewer rows when ``GROUP_M`` does not divide ``num_m``.


@triton.jit
def tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    # Consecutive tiles walk down GROUP_M rows of tiles before moving right, so
    # the programs in flight at once share rows of A and columns of B in L2.
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows
    pid_n = (tile % per_group) // rows
    return pid_m, pid_n


# %%
# The kernel
# ----------
# Lesson 08's kernel with a loop over ``K``.  New arguments: six strides, two
# per matrix (elements between neighbours along each dimension), so that the
# kernel reads a transposed view in place (``b.t()`` swaps ``stride_bk`` and
# ``stride_bn``), and ``GROUP_M``.  Rows past ``M``, columns past ``N`` and on
# the last step the elements past ``K`` load as zeros and add nothing.


@triton.jit
def tiled_matmul_kernel(
    a_ptr,  # (M, K), any strides
    b_ptr,  # (K, N), any strides
    c_ptr,  # (M, N), any strides
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
    GROUP_M: tl.constexpr,  # 1: row-major order
):
    pid = tl.program_id(0)
    pid_m, pid_n = tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m[:, None] < M, offs_n[None, :] < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # in registers throughout
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_ok & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok, other=0.0)
        acc = tl.dot(a, b, acc)  # acc += a @ b on the tensor cores
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok & n_ok)


# %%
# A launch takes a :class:`triton.Config`: the tile constants, the warps
# (``num_warps``) and ``num_stages``, how many ``K`` steps the compiler keeps in
# flight (it turns the loop into a pipeline that loads step ``s + stages - 1``
# into :term:`shared memory` while the tensor cores work on step ``s``).  The
# default is the package's first configuration that fits the element size
# (:func:`tilebook.ops.matmul.prune_configs`, below).


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def matmul(a, b, cfg=None):
    """C = A @ B by the lesson's kernel, with one configuration."""
    (M, K), N = a.shape, b.shape[1]
    cfg = cfg or mm.prune_configs(mm.PTR_CONFIGS, 4096, 4096, 4096, a.element_size())[0]
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    kw, strides = cfg.kwargs, (*a.stride(), *b.stride(), *c.stride())
    grid = (cdiv(M, kw["BLOCK_M"]) * cdiv(N, kw["BLOCK_N"]),)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    tiled_matmul_kernel[grid](a, b, c, M, N, K, *strides, **kw, **opts)
    return c


# %%
# Is it right?
# ------------
# Against the product in float64: a single element, ragged sizes, ``K`` shorter than
# one step and longer than several, and ``B`` as the transpose of a stored ``(N, K)``
# matrix.  On a GPU, where each new shape compiles, the check runs in bf16 (float32
# would run on the tensor cores as TF32, with 10 bits of mantissa); the interpreter
# gets bf16 wrong and checks float32 and float16 (verdict: ``rel err`` within ``tol``).

BF16, FP32, FP16 = torch.bfloat16, torch.float32, torch.float16
CASES = tilebook.pick(  # (M, N, K, dtype)
    gpu=[(37, 53, 29, BF16), (1000, 600, 1100, BF16)],
    cpu=[
        (*s, t) for t in (FP32, FP16) for s in [(1, 1, 1), (37, 53, 29), (70, 72, 130)]
    ],
)
report = CorrectnessReport("tiled matmul vs float64")
for m, n, k, dtype in CASES:
    a, b = experiment.operands(m, n, k, dtype, DEVICE)
    bt = torch.randn(n, k, device=DEVICE, dtype=dtype).t()  # strides (1, K)
    report.check(f"{m}x{n}x{k}", matmul(a, b), a.double() @ b.double())
    report.check(f"{m}x{n}x{k}, w.t()", matmul(a, bt), a.double() @ bt.double())
report.assert_ok()

# %%
# A model of L2 reuse
# -------------------
# The order's effect can be counted on any machine with ``grouped_order``,
# ``tile_coords`` in plain Python.  If the programs of a wave move along ``K``
# together, a tile fetched by one is found in L2 by the others: at each step a
# wave of ``W`` programs *requests* ``2W`` tiles, and HBM delivers only the
# *distinct* ones.  Summed over waves and steps, ``requested`` depends on the
# tile shape, ``hbm`` on the order too, and their ratio is the ``reuse``.  Real
# programs drift apart and L2 is finite: the model is a best case.


def grouped_order(tile: int, num_m: int, num_n: int, group_m: int) -> tuple[int, int]:
    per_group = group_m * num_n
    first_m = (tile // per_group) * group_m
    rows = min(num_m - first_m, group_m)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


def l2_model(M, N, K, bm, bn, group_m, wave, elem=2) -> dict:
    """Bytes requested and fetched from HBM when C = A @ B runs in waves."""
    num_m, num_n = cdiv(M, bm), cdiv(N, bn)
    tiles, hbm = num_m * num_n, 0
    for start in range(0, tiles, wave):
        wave_tiles = range(start, min(start + wave, tiles))
        rows, cols = zip(
            *(grouped_order(t, num_m, num_n, group_m) for t in wave_tiles), strict=True
        )
        hbm += (len(set(rows)) * bm + len(set(cols)) * bn) * K * elem
    requested = tiles * (bm + bn) * K * elem
    return {"requested": requested, "hbm": hbm, "reuse": requested / hbm}


# %%
# Program order and tile shape, measured
# --------------------------------------
# The sweep runs the lesson's kernel at ``SIZE`` cubed in bf16 for three tiles
# and both orders, each launch fixed (``SWEEP``: tile, warps, stages), all
# timed against each other in interleaved rounds.  The model's wave is the SMs
# times the programs whose pipelines fit in one SM's shared memory.

SIZE = 8192
SWEEP = {  # tile: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
    "64x64": (64, 64, 64, 4, 4),
    "128x128": (128, 128, 64, 8, 4),
    "128x256": (128, 256, 64, 8, 3),
}
ORDERS = {"row-major": 1, "grouped": 8}


def sweep_config(tile, group):
    bm, bn, bk, warps, stages = SWEEP[tile]
    kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group}
    return triton.Config(kw, num_warps=warps, num_stages=stages)


def model(tile, group, sms):
    bm, bn, bk, _, stages = SWEEP[tile]
    per_sm = build_fact("smem_per_sm").si // ((bm + bn) * bk * 2 * stages)
    return l2_model(SIZE, SIZE, SIZE, bm, bn, group, int(sms * per_sm))


def order_sweep():
    a, b = experiment.operands(SIZE, SIZE, SIZE)
    ref = a[:256].double() @ b.double()
    fns = {}
    for tile in SWEEP:
        for order, group in ORDERS.items():
            fn = functools.partial(matmul, a, b, sweep_config(tile, group))
            err = ((fn()[:256].double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (tile, order, err)
            fns[tile, order] = fn
    rows = compare({f"{t}, {o}": f for (t, o), f in fns.items()}, flops=2 * SIZE**3)
    for row, (tile, order) in zip(rows, fns, strict=True):
        row.update(tile=tile, order=order)
    return rows


sweep = record_or_measure(
    "lesson09_order", "matmul 8192 cubed, bf16: tile, order", order_sweep
)

# %%
# The widget holds the sweep; under the measured TFLOP/s, the model's account
# of the same setting.


def described(row, sms):
    r = model(row["tile"], ORDERS[row["order"]], sms)
    text = f"model: {r['requested'] / 1e9:.1f} GB requested, {r['hbm'] / 1e9:.2f} "
    why = "each loaded byte feeds few operations" if row["tile"] == "64x64" else ""
    return {**row, "model": text + f"from HBM (reuse {r['reuse']:.1f})", "why": why}


if sweep is not None:
    sms = sweep.provenance.get("sm_count", N_SM)
    rows = [described(r, sms) for r in sweep.rows]
    widget = SweepExplorer(rows, **experiment.order_explorer(sweep, SWEEP, ORDERS))
else:
    widget = "No committed GPU record of the order sweep yet: nothing to show."
widget

# %%
# The small tile requests the most bytes by far, and the model says grouping
# cuts what HBM must deliver for every tile.  What the measurement says:

experiment.say_order(sweep, SWEEP)

# %%
Claims("09 matmul", sweep).check_all(experiment.order_claims(sweep, SWEEP, ORDERS))

# %%
# Where grouping ties, HBM was not the limit at that setting (the tensor cores
# or the copies into shared memory were), or the wave's programs drifted apart
# along ``K`` and some of the sharing the model counts never happened.
#
# Autotuning
# ----------
# Which configuration wins depends on the GPU, the dtype and the shape.
# ``triton.autotune`` times a list of them on the first call for each value of
# ``key`` and keeps the fastest.  ``prune_configs_by`` drops some before they
# compile: the package's pruner keeps those whose pipeline fits in shared
# memory (float32 doubles every tile) and gives a small problem only the first,
# since timing the rest would cost more than it saves.

experiment.say_pruned()

# %%
# The autotuned kernel is the lesson's kernel wrapped.  This page does not run the
# search at a large size (compiling and timing every configuration costs more than the
# page's time budget): at a small size the pruner leaves one and nothing is timed.


def tile_of(cfg):
    return "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}".format(**cfg.kwargs) + f" w{cfg.num_warps}"


def prune(configs, named_args, **kwargs):
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    return mm.prune_configs(configs, M, N, K, named_args["a_ptr"].element_size())


tuned_kernel = triton.autotune(
    configs=mm.PTR_CONFIGS,
    key=["M", "N", "K"],
    prune_configs_by={"early_config_prune": prune},
)(tiled_matmul_kernel)
# bf16 on a GPU: the sweep compiled this configuration already.
a, b = experiment.operands(256, 256, 256, tilebook.pick(gpu=BF16, cpu=FP16), DEVICE)
c, exact = torch.empty_like(a), a.double() @ b.double()


def grid(meta):
    return (cdiv(256, meta["BLOCK_M"]) * cdiv(256, meta["BLOCK_N"]),)


tuned_kernel[grid](a, b, c, 256, 256, 256, *a.stride(), *b.stride(), *c.stride())
experiment.say_tuned(tile_of(tuned_kernel.best_config), c, exact)

# %%
# The Hopper path: tensor descriptors and a resident grid
# -------------------------------------------------------
# The kernel above makes every thread compute addresses and copy its share into shared
# memory.  Hopper's copy engine moves a whole tile with one instruction: a *tensor
# descriptor* holds a matrix's base, shape, strides and tile shape, and
# ``desc.load([r, c])`` asks for the tile at row ``r``, column ``c``.  It fills what
# lies past the edges with zeros (no masks) and wants rows aligned to 16 bytes: the
# package takes this path for 16-bit operands that have them.
#
# The second change is the grid: as many programs as run at once (``CTAS_PER_SM`` per
# SM; a CTA, a cooperative thread array, is CUDA's name for one program), each looping over tiles ``start, start + step, ...`` in ``tile_coords`` order.
# No launch per tile, and the loads of a program's next tile can start while it
# finishes the current one (``FLATTEN`` lets the compiler pipeline across tiles, not
# only along ``K``).  ``A_T`` and ``B_T`` mark an operand stored transposed: its
# descriptor describes the transpose, which *is* row-major, and the loaded tile is
# flipped with ``.T``.  ``SPLIT_N`` finishes the tile in two halves of columns, with
# fewer registers live in the epilogue, which is lesson 08's, imported from
# :mod:`tilebook.ops.epilogue`.  The package's kernel, in full:


@triton.jit
def matmul_tma_kernel(
    a_desc,  # descriptor of A (M, K), or of A^T (K, M) when A_T
    b_desc,  # descriptor of B (K, N), or of B^T (N, K) when B_T
    c_desc,  # descriptor of C; blocks of BLOCK_N // 2 columns when SPLIT_N
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
    CTAS_PER_SM: tl.constexpr,  # read by the launcher only: programs per SM
    SPLIT_N: tl.constexpr,  # store C in two halves
    FLATTEN: tl.constexpr,  # pipeline across tiles, not only along K
):
    tl.static_assert(BLOCK_K >= 16, "tl.dot needs K tiles of at least 16")
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    start = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)  # each program strides over the tiles
    out_tile = start - step
    for tile in tl.range(start, num_m * num_n, step, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
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
        pid_m, pid_n = tile_coords(out_tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SPLIT_N:
            half: tl.constexpr = BLOCK_N // 2
            left, right = tl.split(
                tl.permute(tl.reshape(acc, (BLOCK_M, 2, half)), (0, 2, 1))
            )
            offs_n = off_n + tl.arange(0, half)
            left = epilogue(left, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            right = epilogue(right, bias_ptr, offs_n + half, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n + half], right.to(c_desc.dtype))
        else:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            acc = epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


# %%
# ``tl.reshape`` to ``(BLOCK_M, 2, half)`` puts columns ``j`` and ``j + half``
# side by side, ``tl.permute`` moves that pair last, ``tl.split`` separates the
# halves.  The epilogue recomputes its tile from a counter of its own,
# ``out_tile``: with the loops flattened, the next tile's loads may be in
# flight.  The launcher takes row-major operands, builds the descriptors and
# starts ``min(SMs * CTAS_PER_SM, tiles)`` programs; the interpreter emulates
# the copy engine, so the CPU build checks this kernel too.


def matmul_tma(a, b, cfg=mm.TMA_CONFIGS[0]):
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    kw = cfg.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    a_desc = TensorDescriptor(a, [M, K], list(a.stride()), [bm, bk])
    b_desc = TensorDescriptor(b, [K, N], list(b.stride()), [bk, bn])
    c_blk = [bm, bn // 2 if kw["SPLIT_N"] else bn]
    c_desc = TensorDescriptor(c, [M, N], list(c.stride()), c_blk)
    grid = (min(N_SM * kw["CTAS_PER_SM"], cdiv(M, bm) * cdiv(N, bn)),)
    flags = {"A_T": False, "B_T": False, "HAS_BIAS": False, "ACTIVATION": "none"}
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    matmul_tma_kernel[grid](a_desc, b_desc, c_desc, c, M, N, K, **kw, **flags, **opts)
    return c


TMA_CASES = tilebook.pick(  # rows of 16-byte multiples, tiles still ragged
    gpu=[(1000, 1096, 600, torch.bfloat16)],
    cpu=[(17, 40, 24, torch.float16), (70, 72, 40, torch.float16)],
)
report = CorrectnessReport("Hopper kernel vs float64")
for m, n, k, dtype in TMA_CASES:
    a, b = experiment.operands(m, n, k, dtype, DEVICE)
    report.check(f"{m}x{n}x{k}", matmul_tma(a, b), a.double() @ b.double())
report.assert_ok()

# %%
# What the compiler made of it
# ----------------------------
# :func:`tilebook.course.aot.compile_many` compiles for GPUs the machine does not
# have: the lesson's kernel for Ampere (``sm_80``) and Hopper (``sm_90``),
# and the Hopper kernel for ``sm_90``, all bf16 with 128 x 256 x 64 tiles on
# eight warps.  ``HMMA`` is Ampere's tensor-core instruction (one warp),
# ``HGMMA`` Hopper's :term:`wgmma` (a :term:`warpgroup` of four warps, here a
# 64 x 256 x 16 product), ``LDGSTS`` one thread's copy into shared memory,
# ``UTMALDG`` and ``UTMASTG`` whole tiles moved by the copy engine.

BIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}
SIG = {p: "*bf16" for p in ("a_ptr", "b_ptr", "c_ptr")}
SIG.update({p: "i32" for p in ("M", "N", "K", "stride_am", "stride_bk", "stride_cm")})
tiled = {"kernel": tiled_matmul_kernel, "signature": SIG, "divisible_by_16": list(SIG)}
tiled["constexprs"] = {**BIG, "stride_ak": 1, "stride_bn": 1, "stride_cn": 1}
descs = {"a_desc": [128, 64], "b_desc": [64, 256], "c_desc": [128, 128]}
TMA_SIG = {d: f"tensordesc<bf16[{r}, {c}]>" for d, (r, c) in descs.items()}
TMA_SIG.update({"bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"})
flags = {"A_T": False, "B_T": False, "HAS_BIAS": False, "ACTIVATION": "none"}
flags.update(CTAS_PER_SM=1, SPLIT_N=True, FLATTEN=True)
jobs = {"tiled, sm_80": {**tiled, "arch": 80}, "tiled, sm_90": {**tiled, "arch": 90}}
jobs["Hopper, sm_90"] = {"kernel": matmul_tma_kernel, "signature": TMA_SIG}
jobs["Hopper, sm_90"]["constexprs"] = {**BIG, **flags}
compiled = compile_many(jobs, num_warps=8, num_stages=3)
counted = instruction_table(compiled, ["HMMA", "HGMMA", "LDGSTS", "UTMALDG", "UTMASTG"])
print(counted)

# %%
# On ``sm_80`` one ``K`` step of the tile is many warp-sized ``HMMA``; on
# ``sm_90`` it is a few ``HGMMA`` per warpgroup, and the threads are left with
# address arithmetic and copies.  The Hopper kernel drops the copies too: a
# handful of ``UTMALDG``, each issued by one thread for a whole tile.

# %%
# How close to cuBLAS?
# --------------------
# :func:`tilebook.matmul` runs the Hopper kernel for aligned 16-bit operands and
# :func:`~tilebook.ops.matmul.matmul_kernel` for the rest: this lesson's kernel
# with lesson 08's epilogue and a mask-free path when ``BLOCK_K`` divides
# ``K``.  Against ``torch.matmul`` (cuBLAS) on bf16 squares and one ragged
# shape whose odd rows rule out TMA as they stand, each checked against float64 first
# (:func:`tilebook.course.experiments.matmul.versus_cublas`).  This build does not
# autotune: :func:`~tilebook.ops.matmul.set_autotune` makes each call take the
# first configuration that fits, and the table names it.  The speed ratio is
# cuBLAS's median time over tilebook's; its :term:`spread` pairs the ends of the
# two timings' spreads.  A verdict other than *tied* needs that whole spread on
# one side of 1, and the ratio beyond the noise floor.

autotuning = mm.set_autotune(False)
SIZES = [(n, n, n) for n in (2048, 4096, 8192)] + [(4095, 4097, 4093)]
sizes_sweep = functools.partial(experiment.versus_cublas, SIZES)
sizes = record_or_measure(
    "lesson09_sizes", "matmul, bf16: tilebook, cuBLAS", sizes_sweep
)
experiment.sizes_table(sizes)

# %%
# A row of 4093 bf16 values is 8186 bytes: rows do not start on 16-byte boundaries,
# so neither descriptors nor 16-byte loads apply (exercise 2), and cuBLAS runs the
# ragged shape far slower than 4096 cubed.  For so large a product on Hopper,
# :func:`tilebook.matmul` copies ``A`` and ``B`` to rows padded to 16 bytes, runs the
# Hopper kernel into a padded output and copies that back, all in the table's time.
# Other GPUs (and ``TILEBOOK_ARCH=80``) run the pointer kernel on the ragged rows.

Claims("09 matmul", sizes).check_all(experiment.sizes_claims(sizes))

# %%
experiment.say_other_paths(sizes)

# %%
# tilebook.linear_act: this kernel plus lesson 08's epilogue
# ----------------------------------------------------------
# A linear layer is ``x @ w.T``: :func:`tilebook.linear_act` describes ``w`` as
# stored, ``(N, K)``, loads its tiles transposed (``B_T``) and runs lesson 08's
# epilogue on each finished tile.  Lesson 08 could not reach a layer with ``K``
# in the thousands; here the product is long and the activation runs while the
# tensor cores wait.  Against the unfused pair and ``F.linear`` alone
# (:func:`tilebook.course.experiments.linear_act.versus_torch`):


def layer_sweep():
    return linear_experiment.versus_torch([(8192, 4096, 4096, "gelu")])


layer = record_or_measure("lesson09_linear_act", "linear + GELU, bf16", layer_sweep)
mm.set_autotune(autotuning)
experiment.say_layer(layer)

# %%
said = experiment.layer_claims(layer)
Claims("09 matmul", layer).check_all(said) if said else None

# %%
# Try this
# --------
#
# 1. Which ``GROUP_M`` does the model prefer for 128 x 256 tiles at 8192 cubed
#    with one program per SM?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          for g in (1, 2, 4, 8, 16, 32):
#              print(g, l2_model(8192, 8192, 8192, 128, 256, g, N_SM)["hbm"])
#
#       The best group makes the wave's patch of ``C`` about as tall, in bytes
#       of panels, as it is wide; ``B`` tiles are twice as wide as ``A`` tiles
#       are tall, so it wants about twice as many rows as columns.  Whether it
#       beats the package's 8 is the sweep's to say: add it to ``ORDERS``.
#
# 2. Why are odd rows slow?  Compile ``tiled_matmul_kernel`` as above, but with
#    only the pointers in ``divisible_by_16``, and count ``LDG``.
#
#    .. dropdown:: Solution
#
#       Without the hint that sizes and strides are multiples of 16, the compiler
#       cannot prove a row's start aligned: the tiles are fetched by 2-byte loads into
#       registers instead of 16-byte ``LDGSTS`` into shared memory, with no pipeline.
#       Padding ``K`` and ``N`` to multiples of 16 with zeros gets the fast path back.
#
# 3. Drop the ``K`` mask from both loads of ``tiled_matmul_kernel``.  Which shapes go
#    wrong, and how?  ``check(matmul, lambda a, b: a @ b, [experiment.operands(37, 53,
#    k, FP16, DEVICE) for k in (29, 128)])``
#    (``from tilebook.course.exercises import check``).
#
#    .. dropdown:: Solution
#
#       Where ``K`` is not a multiple of ``BLOCK_K``, the last step reads past each
#       row of ``A`` and past the end of ``B``: the checker's poison there makes
#       every element NaN.  ``K = 128`` passes: round sizes never show the bug.
