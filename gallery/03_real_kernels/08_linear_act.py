"""
08. linear_act: the activation fused into the matmul
====================================================

A transformer's feed-forward block starts with ``gelu(x @ W.T + b)``.  Run
eagerly in PyTorch that is two kernels: the matrix product writes its output
``Y`` to :term:`HBM`, and an element-wise kernel reads ``Y`` back, applies the
activation and writes it again.  A Triton kernel that computes the product
holds its output tile in :term:`registers <register>` when it finishes, so it
can add the bias and apply the activation right there and store once: the
kernel's *epilogue*.

This lesson writes the smallest such kernel, one step past lesson 07: a 2-D
output tile and one ``tl.dot`` over the whole inner dimension ``K``, which
limits it to small ``K``: the layers where the unfused extra trip through
memory costs most.  We count the bytes, predict, measure, then read the
compiled epilogue and make the GELU cheaper.

.. rubric:: You will learn

- how one program computes a 2-D tile of ``X @ W.T`` with one ``tl.dot``, and
  reads ``W.T`` without transposing anything in memory;
- what an epilogue is: bias and activation applied to the float32 result in
  registers, chosen at compile time with a ``tl.constexpr``, then one store;
- how to count the bytes an unfused activation adds, and predict from them
  what fusion saves while a layer is limited by memory;
- how to count the instructions an epilogue costs in the compiled kernel, why the
  package's GELU is a fitted ``exp2``, not ``erf``, and its SiLU one ``tanh.approx``.

The epilogue lives in the package as :mod:`tilebook.ops.epilogue`.  Lesson 09
adds the loop over ``K`` that large layers need; :func:`tilebook.linear_act`
is that kernel with this epilogue.
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` comes first: it picks the GPU or Triton's interpreter before
# Triton loads.  ``LAYER`` is the layer we measure.  The measurements live in
# :mod:`tilebook.course.experiments.linear_act`, shared with lesson 09 and the
# benchmarks.

import tilebook  # chooses GPU or interpreter before triton loads

import warnings

import torch
import triton
import triton.language as tl

from tilebook.course.aot import compile_many
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.experiments import linear_act as experiment
from tilebook.ops.epilogue import HW_TANH, tanh_approx
from tilebook.course.plots import plot_record
from tilebook.course.tables import table
from tilebook.course.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
torch.manual_seed(0)
# The interpreter's sigmoid warns when exp() overflows to inf; the result is right.
warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
LAYER = (16384, 4096, 128)  # M tokens, N outputs, K inputs

# %%
# Count the bytes first
# ---------------------
# ``torch.nn.Linear`` with ``K`` inputs and ``N`` outputs stores a weight ``W``
# of shape ``(N, K)`` and a bias ``b`` of ``N`` numbers.  For ``M`` tokens
# ``X`` of shape ``(M, K)``:
#
# .. math::
#
#    Y_{ij} = \mathrm{act}\Big(\sum_{k} X_{ik} W_{jk} + b_j\Big),
#
# the activation applied element by element: :math:`\max(z, 0)` (ReLU),
# :math:`z\,\Phi(z) = \tfrac{z}{2}(1 + \mathrm{erf}(z/\sqrt2))` (GELU), its tanh
# approximation, :math:`z\,\sigma(z)` (SiLU), or none.  Count what must cross
# the memory bus, each tensor once: the product reads ``X`` (``M*K``
# elements), ``W`` (``N*K``) and ``b`` (``N``) and writes ``Y`` (``M*N``).
# Unfused, the activation then reads all of ``Y`` and writes all of it again:
# two more trips of ``M*N`` elements.  ``experiment.traffic`` is that count, and
# ``experiment.traffic_said`` says it for ``LAYER``.

experiment.traffic_said(LAYER)

# %%
# (The balance is the datasheet's bf16 peak over its memory bandwidth, both of
# the GPU this page speaks for: :datasheet:`gpu.bf16_dense` over
# :datasheet:`gpu.memory_bandwidth`.)  The arithmetic is the smaller cost, so the
# time should follow the bytes: the unfused pair should take about as many
# times longer as it moves more bytes.  As ``K`` grows the arithmetic grows
# while the extra trips stay ``2MN`` elements, and the saving shrinks.
#
# The kernel
# ----------
# One program computes one ``BLOCK_M x BLOCK_N`` tile of ``Y``: it loads the
# ``BLOCK_M`` rows of ``X`` it needs, all ``K`` columns of them, and the
# ``BLOCK_N`` rows of ``W``, and multiplies them with one ``tl.dot`` into a
# float32 tile held in registers.  The four pointers are the row-major
# tensors; ``M``, ``N`` and ``K`` the sizes, which masks free from being
# multiples of a block.
# ``HAS_BIAS`` and ``ACTIVATION`` are decided at compile time: each combination
# compiles into its own binary holding only its own arithmetic.  ``BLOCK_K`` is
# the power of two at or above ``K``: the whole of ``K`` in one block.
#
# The grid is two-dimensional: ``program_id(0)`` picks the row of tiles and
# ``program_id(1)`` the column.  The tile of ``W.T`` that ``tl.dot`` wants has
# element ``[k, n]`` at ``W[n, k]``, offset ``n * K + k``: the transpose is a
# choice of offsets, not a copy.  Masked elements load as zero and add nothing.
# After the ``tl.dot`` comes the epilogue, then one store in ``Y``'s type.
# ``textbook_activation`` computes the activations as the formulas write them
# (the tanh GELU through :math:`\tfrac12(1 + \tanh u) = \sigma(2u)`: Triton's
# tanh needs libdevice).


@triton.jit
def textbook_activation(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        x = x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    elif ACTIVATION == "silu":
        x = x * tl.sigmoid(x)
    return x


@triton.jit
def linear_act_kernel(
    x_ptr,  # (M, K), row-major
    w_ptr,  # (N, K), row-major: nn.Linear's layout
    b_ptr,  # (N,); never read when HAS_BIAS is False
    y_ptr,  # (M, N), row-major
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # "none", "relu", "gelu", "gelu_tanh" or "silu"
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # a power of two >= K: all of K in one block
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok, k_ok = offs_m[:, None] < M, offs_n[None, :] < N, offs_k < K
    x_tile = x_ptr + offs_m[:, None] * K + offs_k[None, :]
    x = tl.load(x_tile, mask=m_ok & k_ok[None, :], other=0.0)
    w_tile = w_ptr + offs_n[None, :] * K + offs_k[:, None]  # the tile of W.T
    w = tl.load(w_tile, mask=k_ok[:, None] & n_ok, other=0.0)
    acc = tl.dot(x, w)  # (BLOCK_M, BLOCK_N), float32, in registers
    # The epilogue: no memory touched but the bias.
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    acc = textbook_activation(acc, ACTIVATION)
    y_tile = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(y_tile, acc.to(y_ptr.dtype.element_ty), mask=m_ok & n_ok)


# %%
# Launching it
# ------------
# One program per tile, ``cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N)`` of them, each
# on ``WARPS`` :term:`warps <warp>`.  The interpreter gets smaller tiles, so
# that small test layers still span several programs and ragged edges.  Both
# input tiles of all of ``K`` sit in :term:`shared memory` at once for
# ``tl.dot``, so the launcher refuses a ``K`` past ``MAX_K``.

GPU_TILE = (64, 128)  # (BLOCK_M, BLOCK_N) on a GPU
TILE = tilebook.pick(gpu=GPU_TILE, cpu=(32, 32))
WARPS = 4
MAX_K = 256


def launch(kernel, x, w, b, activation, **extra):
    """``activation(x @ w.T + b)`` by ``kernel``, for 2-D row-major ``x`` and ``w``
    (``extra``: more arguments, by name, for the exercises' kernels)."""
    (rows, inner), outs = x.shape, w.shape[0]
    if inner > MAX_K:
        raise ValueError(f"K = {inner} does not fit one block (at most {MAX_K})")
    y = torch.empty(rows, outs, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(rows, TILE[0]), triton.cdiv(outs, TILE[1]))
    meta = {"BLOCK_M": TILE[0], "BLOCK_N": TILE[1], "num_warps": WARPS, **extra}
    meta["BLOCK_K"] = max(16, triton.next_power_of_2(inner))  # tl.dot wants >= 16
    bias = y if b is None else b
    kernel[grid](x, w, bias, y, rows, outs, inner, b is not None, activation, **meta)
    return y


def fused(x, w, b, activation):
    return launch(linear_act_kernel, x, w, b, activation)


PER_THREAD = GPU_TILE[0] * GPU_TILE[1] // (32 * WARPS)  # values of the tile
experiment.tile_said(GPU_TILE, PER_THREAD, MAX_K)

# %%
# Is it right?
# ------------
# Every activation, against the layer computed in float64 from the same inputs
# (``experiment.reference``): ragged layers, no size a multiple of a tile, with and
# without bias.  On a GPU (where each new case compiles) the check runs in bfloat16 on
# a ragged layer and on ``LAYER`` cut to its first rows; the interpreter checks float32
# and float16 (it computes bf16 wrongly).  A case passes when its norm-wise ``rel
# err`` is within ``tol``, its type's tolerance; ``max abs err`` is for reference.

ALL = list(experiment.TORCH_ACT)
LAYER_MKN = (experiment.CHECK_ROWS, LAYER[2], LAYER[1])  # (M, K, N)
RAGGED = [((45, 70, 37), True, ALL), ((33, 50, 40), False, ["none", "gelu"])]
DTYPES = tilebook.pick(gpu=[torch.bfloat16], cpu=[torch.float32, torch.float16])


def check(title, impls, cases):
    report = CorrectnessReport(title)
    for dtype in DTYPES:
        for (rows, inner, outs), bias, acts in cases:
            x, w, b = experiment.layer(rows, outs, inner, dtype, DEVICE, bias)
            case = f"K={inner}" + ("" if bias else ", no bias")  # M x N: the shape
            for act in acts:
                ref = experiment.reference(x, w, b, act)
                for name, fn in impls.items():
                    report.check(f"{name} {act}, {case}", fn(x, w, b, act), ref)
    report.assert_ok()


GPU_CASES = [(RAGGED[0][0], True, ["gelu"]), (LAYER_MKN, True, ["gelu"])]
CASES = tilebook.pick(gpu=GPU_CASES, cpu=RAGGED)
check("first kernel vs float64", {"fused": fused}, CASES)

# %%
# What the activation costs in instructions
# -----------------------------------------
# The epilogue moves no memory, but every value of the tile goes through it.
# :func:`tilebook.course.aot.compile_many` compiles the kernel for Hopper (``sm_90``)
# without needing such a GPU and maps the :term:`SASS` back to the lines of Python, so we can
# count the instructions the activation's line became, per value a thread
# holds.  ``MUFU`` counts the kernel's calls to the special-function unit
# (exponentials, reciprocals); the last column shows whether anything
# :term:`spills <spill>`.

SIG = {p: "*bf16" for p in ("x_ptr", "w_ptr", "b_ptr", "y_ptr")}
SIG.update(M="i32", N="i32", K="i32")
CONSTS = {"HAS_BIAS": True, "BLOCK_K": 128}
CONSTS.update(BLOCK_M=GPU_TILE[0], BLOCK_N=GPU_TILE[1])


def compile_for_sm90(kernel, acts, label=""):
    jobs = {
        act + label: {"kernel": kernel, "constexprs": {**CONSTS, "ACTIVATION": act}}
        for act in acts
    }
    return compile_many(jobs, signature=SIG, num_warps=WARPS, divisible_by_16=list(SIG))


def epilogue_counts(compiled):
    counts = {}
    for name, k in compiled.items():
        n = len(k.lines_for("activation(acc, ACTIVATION)", "sass"))
        mufu, spilled = k.instructions("MUFU")["MUFU"], k.spill_stores_bytes
        counts[name] = {"activation": name, "SASS": n, "MUFU": mufu}
        counts[name].update(per=n / PER_THREAD, registers=k.registers, spilled=spilled)
    return counts


counts = epilogue_counts(compile_for_sm90(linear_act_kernel, ["silu", "gelu"]))
table(list(counts.values()), experiment.COUNT_COLUMNS)

# %%
# The erf GELU is the long one: libdevice's ``erf`` evaluates a polynomial on
# each of two ranges of its argument and picks one.
experiment.gelu_cost_said(counts)

# %%
# A cheaper GELU
# --------------
# :math:`\mathrm{GELU}(x) = x\,\Phi(x)`, :math:`\Phi` the normal distribution
# function.  Its left tail :math:`\Phi(-a)`, :math:`a \ge 0`, is smooth and
# positive, so its base-2 logarithm is fitted well by a polynomial
# :math:`P(a)`: seven multiply-adds and one ``exp2`` give :math:`\Phi(-a)`.
# Since :math:`\Phi(a) = 1 - \Phi(-a)`, for either sign of ``x``
#
# .. math::
#
#    x\,\Phi(x) = \max(x, 0) - |x|\,\Phi(-|x|) .
#
# The fit was made once, offline, on :math:`0 \le a \le 5.5`; past that
# :math:`\Phi(-a)` is below float32's reach next to ``x``, and the clamp keeps
# the polynomial where it was fitted.  The result is within :math:`6 \cdot
# 10^{-7}` of the erf form, far below what a 16-bit output resolves (the
# package's tests hold it to that).  The tanh GELU and SiLU multiply by a sigmoid:
# an exponential and a reciprocal, two ``MUFU`` instructions a value.  As
# :math:`x\,\sigma(v) = \tfrac{x}{2} + \tfrac{x}{2}\tanh\tfrac{v}{2}` they need one,
# :term:`PTX`'s ``tanh.approx.f32`` (``tanh_approx``, by ``tl.inline_asm_elementwise``),
# its error too below a 16-bit output's resolution.  The interpreter runs no assembly:
# there ``HW_TANH`` is false and the sigmoid form runs.  These are the package's
# epilogue, :mod:`tilebook.ops.epilogue`: ``epilogue`` adds the bias, loaded for the
# tile's columns and masked past ``N``, and calls ``activation``.


@triton.jit
def activation(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        # x * Phi(x) = max(x, 0) - a * Phi(-a) with a = |x| (clamped: +inf stays
        # inf), and Phi(-a) = 2^P(a), P a degree-7 fit of log2 Phi(-a) on [0, 5.5].
        t = tl.minimum(tl.abs(x), 5.5)
        p = -1.7934344214154407e-06 * t + 6.090377428336069e-05
        p = p * t - 0.0009260259685106575
        p = p * t + 0.00849374569952488
        p = p * t - 0.053937822580337524
        p = p * t - 0.4584805369377136
        p = p * t - 1.1512467861175537
        p = p * t - 0.9999954700469971
        x = tl.maximum(x, 0.0) - t * tl.exp2(p)
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * x * (1 + tanh(u)), or x * sigmoid(2u) where there is no tanh_approx
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = 0.5 * x + 0.5 * x * tanh_approx(u) if HW_TANH else x * tl.sigmoid(2.0 * u)
    elif ACTIVATION == "silu":
        # x * sigmoid(x) == x/2 + x/2 * tanh(x/2): one MUFU instruction, not two
        x = 0.5 * x + 0.5 * x * tanh_approx(0.5 * x) if HW_TANH else x * tl.sigmoid(x)
    return x


@triton.jit
def epilogue(
    acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr
):
    # Runs on the float32 accumulator while it is still in registers.
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    return activation(acc, ACTIVATION)


# %%
# The kernel with the package's epilogue differs from the first in its last
# lines only:


@triton.jit
def linear_epilogue_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok, k_ok = offs_m[:, None] < M, offs_n[None, :] < N, offs_k < K
    x_tile = x_ptr + offs_m[:, None] * K + offs_k[None, :]
    x = tl.load(x_tile, mask=m_ok & k_ok[None, :], other=0.0)
    w_tile = w_ptr + offs_n[None, :] * K + offs_k[:, None]
    w = tl.load(w_tile, mask=k_ok[:, None] & n_ok, other=0.0)
    acc = epilogue(tl.dot(x, w), b_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
    y_tile = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(y_tile, acc.to(y_ptr.dtype.element_ty), mask=m_ok & n_ok)


def fused_fitted(x, w, b, activation):
    return launch(linear_epilogue_kernel, x, w, b, activation)


# %%
# Its instructions, counted the same way, next to the erf form's:

fit = compile_for_sm90(linear_epilogue_kernel, ["gelu"], ", fitted")
counts.update(epilogue_counts(fit))
table([counts["gelu"], counts["gelu, fitted"]], experiment.COUNT_COLUMNS)

# %%
# The unfused version, in Triton
# ------------------------------
# To measure fusion and nothing else we need the *same* product without it: the
# kernel with ``"none"``, then an element-wise kernel in the style of lesson 07
# that reads ``Y``, applies the same ``activation`` and writes it back.  Those
# are the two extra trips, and nothing else differs.


@triton.jit
def activation_kernel(y_ptr, n_elements, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)  # extra trip 1: read Y
    y = activation(y, ACTIVATION)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # 2: write Y


def unfused(x, w, b, act):
    y = fused_fitted(x, w, b, "none")
    if act != "none":
        activation_kernel[(triton.cdiv(y.numel(), 2048),)](
            y, y.numel(), act, BLOCK=2048
        )
    return y


impls = {"fused": fused_fitted, "unfused": unfused}
check(
    "package epilogue vs float64",
    impls,
    tilebook.pick(gpu=[(LAYER_MKN, True, ALL)], cpu=RAGGED),
)

# %%
# How much does fusion save?
# --------------------------
# On a GPU the sweep runs live on ``LAYER`` in bf16: for each activation the
# fused kernel, the same kernel plus the Triton pass, and ``act(F.linear(x, w,
# b))`` (cuBLAS, then PyTorch's element-wise kernel); for GELU also the first
# kernel's erf form.  Then GELU across ``K``, with ``F.linear`` alone (the
# product and the bias, no activation) for reference.  Each point is checked against float64, then its ways are timed in
# interleaved rounds (:func:`tilebook.course.experiments.linear_act.layer_versus`).
# On a CPU the committed record of a GPU run is shown instead.

WAYS = {
    "fused": fused_fitted,
    "unfused, Triton pass": unfused,
    "unfused, PyTorch": experiment.unfused_torch,
}
SWEEP_K = [32, 128, 256]
EXTRA = {"unfused, Triton pass": 2, "unfused, PyTorch": 2}  # trips of Y
# Short rounds (these layers take microseconds), five of them, so that one
# disturbed round moves neither end of the spread much.
TIMING = {"rounds": 5, "warmup": 5, "rep": 12}


def linear_alone(x, w, b, act):
    return torch.nn.functional.linear(x, w, b)


def fusion_sweep():
    m, n, k = LAYER
    rows = []
    for act in ALL:
        ways = dict(WAYS, **({experiment.ERF: fused} if act == "gelu" else {}))
        if act == "none":  # nothing to unfuse: the PyTorch way is F.linear alone
            del ways["unfused, Triton pass"]
        extra = EXTRA if act != "none" else {}
        rows += experiment.layer_versus(
            m, n, k, act, ways, passes=extra, sweep="act", **TIMING
        )
    depth = {"fused": fused_fitted, "unfused, PyTorch": experiment.unfused_torch}
    depth["F.linear alone"] = linear_alone
    alone = {"F.linear alone": "none"}
    for k in SWEEP_K:
        rows += experiment.layer_versus(
            m, n, k, "gelu", depth, passes=EXTRA, computes=alone, sweep="K", **TIMING
        )
    return rows


record = record_or_measure(
    "lesson08_fusion", "linear + activation, bf16: fused against unfused", fusion_sweep
)

# %%
# The activations at ``LAYER``, with the bytes each way must move and the time
# those bytes would take at the copy bandwidth measured in the same run
# (``at copy``).  The first kernel's erf GELU shows as ``gelu (erf)``.

experiment.fusion_table(record)

# %%
# The prediction was that times follow bytes.  How far they do, for ReLU, whose
# epilogue is one instruction a value, and how the two GELUs compare
# (:func:`~tilebook.course.experiments.linear_act.read_fusion` checks the claims and
# says what the record shows):

claims = Claims("08 linear_act", record)
note = experiment.read_fusion(record, claims)
note

# %%
claims

# %%
# Turning the knobs
# -----------------
# The widget holds the same measurements: pick an activation and a way to run
# it.  A way is judged only against the ways that compute the same thing: the
# erf GELU with the fitted one, and under ``none`` the fused kernel with
# ``F.linear`` alone (:func:`~tilebook.course.experiments.linear_act.against_fastest`).
# The readout is its time over the fastest of those (lower
# is better), with the time itself and the bytes moved beside it; a way whose
# speed is below ``SLOW`` of that fastest one is flagged slow.

SLOW = 0.8
knobs = experiment.fusion_knobs(record, slow=SLOW)  # None without a record
widget = SweepExplorer(**knobs) if knobs else "No GPU record of the sweep yet."
widget

# %%
# Fusion against the inner dimension
# ----------------------------------
# GELU across ``K``: the fused kernel, the unfused PyTorch pair and ``F.linear``
# alone.  The axis is TFLOP/s of the product, one yardstick for all three.

fig = plot_record(
    record,
    x="K",
    y="tflops",
    series="impl",
    where={"sweep": "K"},
    logx=True,
    title="linear + GELU, bf16, 16384 tokens -> 4096",
    xlabel="K (inputs of the layer)",
    ylabel="TFLOP/s (2MNK / time)",
    name="lesson08_fusion",
)

# %%
# TFLOP/s counts the product's arithmetic, which grows with ``K`` while the
# bytes of ``Y`` do not.  What fusion is worth, the fused kernel's speed over
# the PyTorch pair's, should shrink as ``K`` grows:

claims_k = Claims("08 linear_act", record)
last = experiment.read_depth(record, claims_k, SWEEP_K, LAYER[2])
claims_k

# %%
last

# %%
# A kernel with all of ``K`` in one block has nothing to overlap: each program
# loads its two tiles, multiplies, stores, and only then can the next start
# loading, while the tiles of all of ``K`` crowd the shared memory of an
# :term:`SM` so that few programs share it, and the launcher refuses a longer
# ``K`` than it allows (above).  Lesson 09 walks ``K`` in steps instead, loading
# the next step while the tensor cores work on this one, and runs this same
# epilogue after its loop: :func:`tilebook.linear_act` is that kernel with
# :func:`tilebook.ops.epilogue.epilogue`.  There the product is long and the
# epilogue runs while the tensor cores wait for it, which is why the package
# keeps the shorter GELU.
#
# Try this
# --------
#
# Each exercise that asks for a kernel ends with the line that checks it
# (``from tilebook.course import exercises``; ``cases = [experiment.layer(45, 37, 70,
# torch.float16, DEVICE)]``, each ``(x, w, b)``).
#
# 1. Add squared ReLU, :math:`\max(z, 0)^2`, as a new ``ACTIVATION`` value.
#    What does it cost in the epilogue?  ``exercises.check(lambda x, w, b:
#    fused_fitted(x, w, b, "relu2"), lambda x, w, b: torch.relu(x @ w.T + b) **
#    2, cases, block=TILE)``.
#
#    .. dropdown:: Solution
#
#       One more branch in ``activation``:
#
#       .. code-block:: python
#
#          elif ACTIVATION == "relu2":
#              x = tl.maximum(x, 0.0)
#              x = x * x
#
#       Two instructions a value: fusing it saves the whole extra trip.
#
# 2. A residual connection, ``out = r + x @ W.T + b``, is an epilogue too.  Add
#    ``r`` to a copy of ``linear_act_kernel``, ``residual_kernel``, as ``r_ptr``
#    after ``ACTIVATION``.  What does fusing it save?  ``exercises.check(lambda
#    x, w, b, r: launch(residual_kernel, x, w, b, "none", r_ptr=r), lambda x, w,
#    b, r: r + x @ w.T + b, [(*c, torch.randn(45, 37, device=DEVICE).half()) for
#    c in cases], block=TILE)``.
#
#    .. dropdown:: Solution
#
#       Before the store, load the tile of ``r`` with the store's offsets and
#       mask and add it in float32: ``acc += tl.load(r_ptr + offs_m[:, None] * N
#       + offs_n[None, :], mask=m_ok & n_ok, other=0.0).to(tl.float32)``.
#       Unfused, ``Y`` makes two trips for nothing, as with an activation.
#
# 3. Why can this kernel not take ``K`` = 4096, and what would it take?
#
#    .. dropdown:: Solution
#
#       Both tiles of all of ``K`` must sit in shared memory for ``tl.dot``:
#       ``(BLOCK_M + BLOCK_N) * 4096`` bf16 values, far more than this page's GPU
#       gives a program (:datasheet:`gpu.smem_per_block`).  Walk ``K`` in steps of
#       ``BLOCK_K`` and add each step's product into the float32 tile: lesson
#       09's kernel.
