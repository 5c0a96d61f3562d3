"""
08. linear_act: the activation fused into the matmul
====================================================

The feed-forward block of a transformer starts with a linear layer followed by
an activation, ``gelu(x @ W.T + b)``.  Run eagerly in PyTorch, that is two
kernels.  The matrix product (cuBLAS, which folds the bias into its own
epilogue) writes the output ``Y`` to memory, and an element-wise kernel reads
``Y`` back, applies GELU and writes it a second time.  A Triton matmul finishes
with its output tile still in registers, so it can apply the bias and the
activation right there, for a few instructions per element and no memory
traffic, and store the result once.

This lesson writes that kernel, counts the bytes the separate activation pass
costs, and measures what removing it is worth on an H100.  The answer depends
on the shape, and on the activation.

.. rubric:: You will learn

- how one program computes a tile of ``X @ W.T`` with a loop over ``K`` and
  ``tl.dot``, and where its float32 accumulator lives meanwhile;
- how to write an *epilogue*: bias and activation applied to the accumulator
  in registers, chosen at compile time with a ``tl.constexpr``, then one store;
- how to count the memory traffic of the unfused version (two extra passes over
  ``Y``) and weigh it against the matmul's arithmetic;
- why fusion pays most when the inner dimension ``K`` is small, why an
  expensive epilogue can eat the saving, and how to make the GELU cheap;
- how many instructions each activation adds per output element, read from the
  compiled kernel.

The finished op lives in the package as :func:`tilebook.linear_act` (source:
:mod:`tilebook.ops.linear_act`, with the matmul kernels and the epilogue in
:mod:`tilebook.ops.matmul`).  Lesson 09 takes the matmul part apart in depth:
tile order, autotuning and the Hopper TMA path.  Here it stays brief.
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` is imported first, so that it can choose between the GPU and
# Triton's interpreter before Triton loads.

import tilebook  # noqa: I001  (chooses GPU or interpreter before triton loads)

import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tilebook.bench import Record, measure, record_or_measure
from tilebook.check import CorrectnessReport
from tilebook.ops import matmul as mm
from tilebook.ops.matmul import ACTIVATIONS
from tilebook.plots import plot_record
from tilebook.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
torch.manual_seed(0)
# The interpreter computes sigmoid with numpy, whose exp() warns when a large
# negative input overflows to infinity; the result (0) is still right.
warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)

# %%
# What the layer computes
# -----------------------
# A linear layer with ``K`` inputs and ``N`` outputs holds a weight ``W`` of shape
# ``(N, K)`` (this is how ``torch.nn.Linear`` stores it) and a bias ``b`` of
# ``N`` numbers.  For a batch ``X`` of ``M`` rows (tokens), of shape ``(M, K)``:
#
# .. math::
#
#    Y = \mathrm{act}\left(X W^\top + b\right), \qquad
#    Y_{ij} = \mathrm{act}\Big(\sum_{k} X_{ik} W_{jk} + b_j\Big).
#
# The activations that :func:`tilebook.linear_act` offers, applied element by
# element to the pre-activation :math:`z`:
#
# .. math::
#
#    \mathrm{relu}(z) &= \max(z, 0) \\
#    \mathrm{gelu}(z) &= \tfrac{z}{2}\Big(1 + \mathrm{erf}\big(z / \sqrt{2}\big)\Big) \\
#    \mathrm{gelu\_tanh}(z) &= \tfrac{z}{2}\Big(1 + \tanh\big(\sqrt{2/\pi}\,
#        (z + 0.044715 z^3)\big)\Big) \\
#    \mathrm{silu}(z) &= z \, \sigma(z) = \frac{z}{1 + e^{-z}}
#
# and ``"none"``, which leaves :math:`z` alone.  In PyTorch, as a model runs it:

TORCH_ACT = {
    "none": lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


def linear_act_eager(x, w, b, activation):
    y = F.linear(x, w, b)  # one matmul kernel; cuBLAS adds b in its epilogue
    return TORCH_ACT[activation](y)  # a second kernel: reads y, writes a new y


# %%
# Counting the bytes
# ------------------
# Count what *must* cross the memory bus, each tensor once: the matmul reads
# ``X`` (``M*K`` elements), ``W`` (``N*K``) and ``b`` (``N``), and writes ``Y``
# (``M*N``).  The separate activation then reads all of ``Y`` and writes all of
# it again: two extra passes over ``M*N`` elements.  A fused kernel makes none.


def traffic(m: int, n: int, k: int, elem: int, fused: bool = True) -> int:
    """Bytes that must move: inputs read once, outputs written once."""
    matmul = (m * k + n * k + n + m * n) * elem
    return matmul if fused else matmul + 2 * m * n * elem


M, N, K = 8192, 4096, 4096  # 8192 tokens, a 4096 -> 4096 layer, bf16 (2 bytes)
MiB = 2**20
fused_bytes, unfused_bytes = traffic(M, N, K, 2), traffic(M, N, K, 2, fused=False)
flops = 2 * M * N * K
print(
    f"X {M * K * 2 / MiB:.0f} MiB, W {N * K * 2 / MiB:.0f} MiB, "
    f"Y {M * N * 2 / MiB:.0f} MiB"
)
print(f"fused:   {fused_bytes / MiB:5.0f} MiB moved")
print(
    f"unfused: {unfused_bytes / MiB:5.0f} MiB moved "
    f"({unfused_bytes / fused_bytes:.2f}x)"
)
print(
    f"matmul:  {flops / 1e9:.0f} GFLOP, "
    f"{flops / fused_bytes:.0f} FLOP per byte when fused"
)

# %%
# The unfused layer moves 80% more bytes.  That does not make it 80% slower:
# at about 1600 floating-point operations per byte the matmul is limited by
# the tensor cores, not by memory, and its own bytes move while they work.  The
# activation pass is the opposite, a handful of operations per element and
# nothing to hide its traffic behind, so it costs what its bytes cost: about
# ``4 * M * N / bandwidth`` for bf16, on top of the matmul.
#
# The ratio of the two is worth writing down.  The matmul takes about
# :math:`2MNK / F` seconds at a rate of :math:`F` FLOP/s, the extra pass about
# :math:`2MNe / B` at a bandwidth of :math:`B` bytes/s, with :math:`e` bytes per
# element:
#
# .. math::
#
#    \frac{t_\text{extra pass}}{t_\text{matmul}} \approx \frac{e\,F}{K\,B}.
#
# ``M`` and ``N`` cancel.  With :math:`F/B` a few hundred FLOP per byte on a
# modern GPU, the pass is a small tax on a layer with ``K = 4096`` and a large
# one when ``K`` is a few hundred: what fusion saves shrinks as ``1/K``.  We will
# measure exactly that.
#
# Where the accumulator lives
# ---------------------------
# One program computes one ``BLOCK_M x BLOCK_N`` tile of ``Y``.  It keeps a
# float32 accumulator of that shape, walks along ``K`` in steps of ``BLOCK_K``,
# and at each step loads a ``BLOCK_M x BLOCK_K`` tile of ``X`` and a
# ``BLOCK_K x BLOCK_N`` tile of ``W.T`` and adds their product with ``tl.dot``
# (lesson 05).  The accumulator is a tensor of the program, so the compiler
# keeps it in registers, spread over the program's threads, for the whole loop:
# a 128 x 128 tile held by 8 warps (256 threads) is 64 float32 values per
# thread.  On a Hopper GPU the ``wgmma`` instructions take the tiles from shared
# memory and accumulate straight into those registers.
#
# When the loop ends, the finished tile of ``X @ W.T`` exists nowhere but in
# registers.  Whatever we do to it now, before ``tl.store``, costs instructions
# and no memory traffic: that is the epilogue.
#
# The epilogue
# ------------
# Two small ``@triton.jit`` functions, shared by every matmul kernel of the
# package.  A jitted function called from a kernel is inlined into it, so there
# is no call at run time.  ``ACTIVATION`` is a ``tl.constexpr`` string: the
# ``if`` chain is decided when the kernel compiles, and each activation gets its
# own binary with only its own arithmetic in it.
#
# ``_activation`` is the element-wise function.  The tanh GELU is written
# without a tanh, through the identity :math:`\tfrac12(1 + \tanh u) =
# \sigma(2u)`, because Triton's tanh goes through libdevice.  The erf GELU does
# without ``erf`` too, for a reason of cost that the instruction count below
# makes plain.  GELU is :math:`x\,\Phi(x)`, with :math:`\Phi` the normal
# distribution function, and its left tail :math:`\Phi(-a)` for :math:`a \ge 0`
# is smooth and positive, so its base-2 logarithm is well fitted by a polynomial
# :math:`P(a)`: seven multiply-adds and one ``exp2`` give :math:`\Phi(-a)`.  By
# symmetry, :math:`\Phi(a) = 1 - \Phi(-a)`, so for either sign of ``x``
#
# .. math::
#
#    x\,\Phi(x) = \max(x, 0) - |x|\,\Phi(-|x|) .
#
# The fit was made once, offline, over :math:`0 \le a \le 5.5`; past that,
# :math:`\Phi(-a) < 2 \cdot 10^{-8}`, and the clamp keeps the polynomial where
# it was fitted.  The result is within :math:`6 \cdot 10^{-7}` of the exact erf
# form everywhere (relative error under :math:`6 \cdot 10^{-6}`), far below what
# a bf16 or fp16 output can resolve; the package's tests hold it to that.


@triton.jit
def _activation(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        # x * Phi(x) without erf.  For a = |x|, Phi(-a) = 2^P(a) with P a
        # degree-7 fit of log2 Phi(-a) on [0, 5.5] (past it the tail is below
        # float32's reach), and x * Phi(x) = max(x, 0) - a * Phi(-a) for either
        # sign (with a clamped too, so that +inf stays inf).  One exp2 and 11
        # instructions against libdevice erf's ~30; within 6e-7 of the erf
        # form, and 6e-6 of it relatively.
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
        # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u): no tanh, which would
        # need libdevice
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x * tl.sigmoid(2.0 * u)
    elif ACTIVATION == "silu":
        x = x * tl.sigmoid(x)
    return x


# %%
# ``_epilogue`` takes the accumulator and the column indices of the tile
# (``offs_n``), loads the ``BLOCK_N`` bias values of those columns (masked past
# ``N``), adds them to every row of the tile, and applies the activation.  The
# bias is the only memory it touches: ``BLOCK_N`` numbers per tile, which the
# programs of a column share through the L2 cache.  Everything stays float32
# until the store.


@triton.jit
def _epilogue(
    acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr
):
    # Runs on the float32 accumulator while it is still in registers.
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    return _activation(acc, ACTIVATION)


# %%
# The kernel
# ----------
# A plain tiled matmul with the epilogue on the end.  The arguments:
#
# ``x_ptr``
#     The input ``X``, ``(M, K)``, row-major (contiguous).
# ``w_ptr``
#     The weight ``W``, ``(N, K)``, row-major, as ``nn.Linear`` stores it.  The
#     kernel never transposes it in memory: the tile of ``W.T`` it needs is just
#     a different set of offsets into ``W``.
# ``bias_ptr``
#     The bias, ``N`` numbers; any pointer when ``HAS_BIAS`` is False.
# ``y_ptr``
#     The output ``Y``, ``(M, N)``, row-major.
# ``M``, ``N``, ``K``
#     The sizes.  Nothing needs to be a multiple of the block sizes.
# ``HAS_BIAS: tl.constexpr``, ``ACTIVATION: tl.constexpr``
#     Passed through to ``_epilogue``; each combination compiles once.
# ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K: tl.constexpr``
#     The tile shape.  ``tl.dot`` needs each of them to be at least 16.
#
# The grid is two-dimensional: ``program_id(0)`` picks the row of tiles and
# ``program_id(1)`` the column.  ``x_ptrs`` starts as the ``(BLOCK_M, BLOCK_K)``
# tile of pointers at the left edge of the program's rows of ``X``; ``w_ptrs`` as
# the ``(BLOCK_K, BLOCK_N)`` tile of ``W.T``, whose element ``[k, n]`` is
# ``W[n, k]`` and so lies at ``n * K + k``.  Each step moves both ``BLOCK_K``
# elements to the right along ``K``.  The masks zero whatever lies past ``M``,
# ``N`` or ``K``, and a zero adds nothing to the dot product.  After the loop come
# the epilogue and the single store, cast to the output's element type.


@triton.jit
def linear_act_kernel(
    x_ptr,  # (M, K), row-major
    w_ptr,  # (N, K), row-major: nn.Linear's layout
    bias_ptr,  # (N,), or anything when HAS_BIAS is False
    y_ptr,  # (M, N), row-major
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # one of ACTIVATIONS
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m[:, None] < M
    n_ok = offs_n[None, :] < N
    x_ptrs = x_ptr + offs_m[:, None] * K + offs_k[None, :]  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + offs_n[None, :] * K + offs_k[:, None]  # (BLOCK_K, BLOCK_N)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # in registers throughout
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        x = tl.load(x_ptrs, mask=m_ok & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok, other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    # The epilogue: bias and activation on the registers, then one store.
    acc = _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
    y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok & n_ok)


# %%
# Launching it
# ------------
# The launcher flattens any leading batch dimensions of ``x`` into ``M``, as
# ``F.linear`` does, and launches one program per output tile.  On a GPU the
# tiles are 128 x 128 with ``BLOCK_K = 64``; the interpreter gets 32 x 32 tiles,
# so that small test shapes still span several programs and ragged edges.
#
# The GPU launch uses 8 warps, which leaves 64 accumulator values to each
# thread.  With 4 warps it would be 128, and that is fine for the matmul alone,
# but the activation needs a few temporaries per value on top: compiled for an
# H100, the 4-warp kernel needs about 200 registers per thread with the GELU and
# reaches the cap of 255 with SiLU, one temporary away from spilling to local
# memory (exercise 4 shows how to see it).  The epilogue's registers come out of
# the same budget as the accumulator's.
#
# ``num_stages`` says how many steps of the K loop the compiler may load ahead
# of the one being multiplied (lessons 09 and 13 measure what it buys).  Every
# stage buffers a tile of ``X`` and one of ``W.T`` in shared memory: 32 KiB in a
# 16-bit type, 64 KiB in float32.  An H100 gives one program at most 227 KiB, so
# 16-bit inputs get four stages and float32 three; ask for four in float32 and
# the launch fails with ``OutOfResources``.
#
# (The offsets are 32-bit: this kernel is for tensors of fewer than ``2**31``
# elements.  The package's kernel switches to 64-bit offsets past that, takes
# any strides, and orders its tiles for the L2 cache; lesson 09 covers all of
# that.)

BLOCKS = tilebook.pick(gpu=(128, 128, 64), cpu=(32, 32, 32))


def num_stages(dtype: torch.dtype) -> int:
    """Pipeline depth that fits an H100's shared memory with ``BLOCKS``."""
    return 4 if dtype.itemsize == 2 else 3


def linear_act_lesson(x, w, b=None, activation="gelu"):
    """``activation(F.linear(x, w, b))`` by the lesson's kernel."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    w = w.contiguous()
    (m, k), n = x2.shape, w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm, bn, bk = BLOCKS
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    linear_act_kernel[grid](
        x2,
        w,
        y if b is None else b,
        y,
        m,
        n,
        k,
        HAS_BIAS=b is not None,
        ACTIVATION=activation,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=8,
        num_stages=num_stages(x.dtype),
    )
    return y.reshape(*x.shape[:-1], n)


x = torch.randn(45, 70, device=DEVICE)
w = torch.randn(37, 70, device=DEVICE) / 70**0.5
b = torch.randn(37, device=DEVICE)
y = linear_act_lesson(x, w, b, "gelu")
tiles = triton.cdiv(45, BLOCKS[0]) * triton.cdiv(37, BLOCKS[1])
print("programs for a 45x70 -> 37 layer:", tiles)
err = (y - linear_act_eager(x, w, b, "gelu")).abs().max().item()
print("max |lesson - eager| =", err)

# %%
# The unfused version, in Triton
# ------------------------------
# To measure what fusion itself is worth, we also need the *same* matmul without
# it: the kernel with ``ACTIVATION="none"``, then a separate element-wise kernel,
# in the style of lesson 07, that reads ``Y``, applies ``_activation`` and writes
# ``Y`` back in place.  Those are the two extra passes, and nothing else differs.


@triton.jit
def activation_kernel(
    y_ptr,  # (n_elements,) contiguous, updated in place
    n_elements,
    ACTIVATION: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per program
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)  # extra pass 1: read Y
    y = _activation(y, ACTIVATION).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs, y, mask=mask)  # extra pass 2: write Y


def activation_pass(y, activation):
    """Apply ``activation`` to a contiguous ``y`` in place, as a kernel of its own."""
    if activation != "none":
        n = y.numel()
        activation_kernel[(triton.cdiv(n, 2048),)](y, n, activation, BLOCK=2048)
    return y


def linear_act_unfused(x, w, b=None, activation="gelu", matmul=linear_act_lesson):
    """The matmul with bias but no activation, then the activation pass."""
    return activation_pass(matmul(x, w, b, "none"), activation)


print("max |unfused - fused| =", (linear_act_unfused(x, w, b) - y).abs().max().item())

# %%
# Is it right?
# ------------
# Every activation, with and without a bias, against ``F.linear`` and the
# activation computed in float64 from the same inputs: a ragged 2-D shape (no
# size a multiple of the 32-wide tiles) and a batch with two leading dimensions,
# for the lesson's kernel and for :func:`tilebook.linear_act`.  Then one large
# layer.  The float16 tolerance allows for the output's rounding, about
# :math:`2^{-11}` of each value.  On a GPU the check runs in bfloat16, the type
# these layers use in practice (and one the interpreter gets wrong, so it is not
# checked on a CPU).  On a GPU, float32 would run on the tensor cores as TF32,
# with a tolerance of its own.


def reference(x, w, b, activation):
    b64 = None if b is None else b.double()
    return TORCH_ACT[activation](F.linear(x.double(), w.double(), b64))


def make_layer(lead, k, n, dtype, bias=True):
    x = torch.randn(*lead, k, device=DEVICE).to(dtype)
    w = (torch.randn(n, k, device=DEVICE) / k**0.5).to(dtype)
    b = torch.randn(n, device=DEVICE).to(dtype) if bias else None
    return x, w, b


CASES = [  # (leading dims of x, K, N, bias)
    ((45,), 70, 37, True),
    ((3, 7), 50, 33, False),
]
BIG = tilebook.pick(gpu=(M, K, N), cpu=(128, 256, 96))
dtypes = [torch.bfloat16] if tilebook.is_gpu() else [torch.float32, torch.float16]
report = CorrectnessReport("linear_act vs float64 reference")
for dtype in dtypes:
    for activation in ACTIVATIONS:
        for lead, k, n, bias in CASES:
            x, w, b = make_layer(lead, k, n, dtype, bias)
            ref = reference(x, w, b, activation)
            shape = "x".join(map(str, (*lead, k))) + f" -> {n}"
            shape += "" if bias else ", no bias"
            out = linear_act_lesson(x, w, b, activation)
            report.check(f"lesson {activation}, {shape}", out, ref)
            out = tilebook.linear_act(x, w, b, activation)
            report.check(f"tilebook {activation}, {shape}", out, ref)
    m, k, n = BIG
    x, w, b = make_layer((m,), k, n, dtype)
    ref = reference(x, w, b, "gelu")
    shape = f"{m}x{k} -> {n}"
    report.check(f"lesson gelu, {shape}", linear_act_lesson(x, w, b, "gelu"), ref)
    report.check(f"tilebook gelu, {shape}", tilebook.linear_act(x, w, b, "gelu"), ref)
    report.check(f"unfused gelu, {shape}", linear_act_unfused(x, w, b, "gelu"), ref)
    del x, w, b, ref
report.assert_ok()

# %%
# Fusion is also a little more accurate
# -------------------------------------
# There is a second, quieter difference.  The unfused pair rounds the
# pre-activation to the output type when the matmul stores it, and the activation
# then starts from that rounded value and rounds again.  The fused kernel applies
# the activation to the float32 accumulator and rounds once.  Here is the error
# of both against float64, on the large layer in 16-bit, for every activation:

low = torch.bfloat16 if tilebook.is_gpu() else torch.float16
m, k, n = BIG
x, w, b = make_layer((m,), k, n, low)
print(f"{'activation':<10} {'fused':>9} {'unfused':>9}   (relative error, {low})")
for activation in ACTIVATIONS:
    ref = reference(x, w, b, activation)
    errs = [
        ((fn(x, w, b, activation).double() - ref).norm() / ref.norm()).item()
        for fn in (linear_act_lesson, linear_act_unfused)
    ]
    print(f"{activation:<10} {errs[0]:9.2e} {errs[1]:9.2e}")
del x, w, b, ref

# %%
# With no activation the two are the same computation.  With one, the unfused
# error is a little larger, never by much: one extra rounding of a 16-bit value.
# It is not a reason to fuse, but it means a fused kernel should be checked
# against float64, not against the unfused PyTorch pair with a tolerance of zero.
#
# What the activation costs in instructions
# -----------------------------------------
# The epilogue is free of memory traffic, not of work.  A matmul tile of 128 x 256
# held by 8 warps leaves 128 accumulator values to each thread, and every one of
# them goes through ``_activation``.  How much code is that?  We compile the
# package's Hopper kernel (the one that runs the large bf16 layers below) for an
# H100 with each activation, without needing one (lesson 03), and count the SASS
# instructions against the kernel with no activation.

# One of the configurations the package's autotuner picks from; one whose loop
# over tiles is not flattened, so that the SASS holds one copy of the epilogue.
unflattened = [c for c in mm.GPU_TMA_CONFIGS if not c.kwargs.get("FLATTEN")]
TMA_CONFIG = (unflattened or mm.GPU_TMA_CONFIGS)[0]
bm, bn, bk = (TMA_CONFIG.kwargs[f"BLOCK_{d}"] for d in "MNK")
per_thread = bm * bn // (32 * TMA_CONFIG.num_warps)  # accumulator values per thread
print(
    f"tile {bm} x {bn} (BLOCK_K {bk}), {TMA_CONFIG.num_warps} warps: "
    f"{per_thread} accumulator values per thread"
)


def compile_for_h100(activation):
    return mm.compile_ahead(
        "tma", TMA_CONFIG, "bf16", activation=activation, has_bias=True, b_t=True
    )


# On a CPU each compile runs in a child process, so five can run at once; on a
# GPU they run in this process, one after another.
with ThreadPoolExecutor(max_workers=1 if tilebook.is_gpu() else 5) as pool:
    kernels = list(pool.map(compile_for_h100, ACTIVATIONS))
compiled = dict(zip(ACTIVATIONS, kernels, strict=True))
INSTRUCTION = r"^\s+/\*[0-9a-f]{4,}\*/\s+\S"  # one SASS instruction per line
base = compiled["none"].count(INSTRUCTION)
print(
    f"{'activation':<10} {'SASS':>6} {'per element':>12} {'MUFU':>5} {'registers':>10}"
)
for activation, k in compiled.items():
    total = k.count(INSTRUCTION)
    print(
        f"{activation:<10} {total:6d} {(total - base) / per_thread:12.1f} "
        f"{k.count(r'MUFU') - compiled['none'].count(r'MUFU'):5d} {k.registers:10d}"
    )

# %%
# (``per element`` is the extra instructions divided by the values each thread
# holds; ``MUFU`` counts the extra calls to the special-function unit,
# which computes ``exp2`` and reciprocals.)  ReLU is one instruction per element.
# SiLU is about a dozen: an exponential and a reciprocal for the sigmoid, and the
# arithmetic around them.  The tanh GELU adds its cubic.  The erf GELU, in the
# fitted form above, is eleven: the clamp, seven multiply-adds, one ``exp2`` and
# two instructions for the final line.  Written the textbook way, as
# ``0.5 * x * (1 + tl.math.erf(x * 0.7071...))``, it compiles to about thirty
# per element, with libdevice's ``erf`` choosing between two polynomials for
# every value.  That difference is measurable: on an H100 in Triton 3.6 these
# instructions run between the matmuls of successive tiles, while the tensor
# cores wait for them.  With the textbook ``erf`` the fused layer ran 0.99x the
# unfused PyTorch pair (8192 x 4096 -> 4096, bf16); with the fitted form, 1.04x
# to 1.08x across our runs on one H100 (the table below is one of them).  An
# epilogue is worth a second look at its instruction count.
#
# How much does fusion save?
# --------------------------
# On a GPU the sweep below runs live: an 8192-token batch through a layer with
# 4096 outputs, bf16, with ``K`` from 512 to 8192 inputs: every activation at
# ``K = 4096``, and ReLU, GELU and SiLU at every ``K``.  Four implementations, each
# timed with ``do_bench``:
#
# ``fused``
#     :func:`tilebook.linear_act`, the package's kernel (on an H100, the
#     persistent TMA kernel of lesson 09) with the epilogue of this lesson.
# ``unfused, Triton pass``
#     The same kernel with ``activation="none"``, then ``activation_pass``:
#     the difference from ``fused`` is the fusion and nothing else.
# ``unfused, PyTorch``
#     ``act(F.linear(x, w, b))``, what a model runs without a fused kernel.
# ``F.linear``
#     The matmul with its bias and no activation at all: the floor.
#
# TFLOP/s counts the matmul's :math:`2MNK` operations (the activation's few per
# element are not counted), so all four share one yardstick.  On a CPU, the
# committed record of a GPU run is shown instead.

SWEEP_M, SWEEP_N = 8192, 4096
SLOW_FRACTION = 0.9  # the widgets flag settings below 90% of the best one
DEPTH_ACTIVATIONS = ("relu", "gelu", "silu")  # measured at every K; the rest at K only
DEPTH_ACTIVATION = "relu"  # the activation the second widget follows across K
SWEEP_K = [512, 1024, 2048, 4096, 8192]
FUSED, TRITON_PASS, TORCH_PAIR, LINEAR = (
    "fused",
    "unfused, Triton pass",
    "unfused, PyTorch",
    "F.linear",
)


def implementations(x, w, b, activation):
    """The four ways to run the layer, as functions of no arguments."""
    act = TORCH_ACT[activation]
    return {
        FUSED: lambda: tilebook.linear_act(x, w, b, activation),
        TRITON_PASS: lambda: linear_act_unfused(
            x, w, b, activation, matmul=tilebook.linear_act
        ),
        TORCH_PAIR: lambda: act(F.linear(x, w, b)),
        LINEAR: lambda: F.linear(x, w, b),
    }


def fusion_sweep():
    rows = []
    for k in SWEEP_K:
        x, w, b = make_layer((SWEEP_M,), k, SWEEP_N, torch.bfloat16)
        fused_bytes = traffic(SWEEP_M, SWEEP_N, k, 2)
        for activation in ACTIVATIONS if k == K else DEPTH_ACTIVATIONS:
            impls = implementations(x, w, b, activation)
            if k == K and activation == "gelu":  # the lesson's own kernel, once
                impls["lesson kernel"] = partial(linear_act_lesson, x, w, b, "gelu")
            for impl, fn in impls.items():
                has_pass = impl in (TRITON_PASS, TORCH_PAIR) and activation != "none"
                nbytes = traffic(SWEEP_M, SWEEP_N, k, 2, fused=not has_pass)
                rows.append(
                    {
                        "K": k,
                        "activation": activation,
                        "impl": impl,
                        "bytes": nbytes,
                        "extra_bytes": nbytes - fused_bytes,
                        **measure(fn, flops=2 * SWEEP_M * SWEEP_N * k).as_row(),
                    }
                )
        del x, w, b
        torch.cuda.empty_cache()
    return rows


record = record_or_measure(
    "lesson08_fusion",
    "linear + activation, bf16, 8192 x K -> 4096: fused against unfused",
    fusion_sweep,
)

# %%
# First the headline shape, ``K = 4096``, every activation.  ``saved`` is the
# time of the Triton-unfused pair minus the fused kernel: what fusion is worth,
# all else equal.  ``pass`` is what the activation pass should cost, its bytes
# at the speed of the 1 GiB copy measured in the same run.


def row(rec, **where):
    (r,) = rec.select(**where)
    return r


if record is not None:
    print(record.caption())
    copy_gbps = record.provenance["copy_gbps"]
    print(
        f"{'activation':<10} {'fused':>7} {'Triton pass':>12} {'PyTorch':>8} "
        f"{'F.linear':>9}  {'saved':>6} {'pass':>6}   (TFLOP/s; us)"
    )
    for activation in ACTIVATIONS:
        r = {
            i: row(record, K=K, activation=activation, impl=i)
            for i in (FUSED, TRITON_PASS, TORCH_PAIR, LINEAR)
        }
        saved_us = 1e3 * (r[TRITON_PASS]["median_ms"] - r[FUSED]["median_ms"])
        pass_us = r[TRITON_PASS]["extra_bytes"] / (copy_gbps * 1e9) * 1e6
        print(
            f"{activation:<10} {r[FUSED]['tflops']:7.0f} "
            f"{r[TRITON_PASS]['tflops']:12.0f} "
            f"{r[TORCH_PAIR]['tflops']:8.0f} {r[LINEAR]['tflops']:9.0f}  "
            f"{saved_us:6.0f} {pass_us:6.0f}"
        )
    lesson = row(record, K=K, activation="gelu", impl="lesson kernel")
    print(f"(the lesson's own kernel, gelu: {lesson['tflops']:.0f} TFLOP/s)")
else:
    print("No committed GPU record of this benchmark yet: nothing to show.")

# %%
# Read ``saved`` against ``pass``.  Where the two agree, fusion removed the
# activation pass and nothing else changed.  Where ``saved`` falls short, the
# fused kernel paid for its epilogue: the activation's instructions, counted
# above, run while the tensor cores wait, so the fused kernel is slower than the
# same kernel with ``"none"`` (compare its column with the ``none`` row).  Expect
# that most for the activations with the longest epilogues (the tanh GELU and
# SiLU, with their exponential and reciprocal), and least for ReLU, with one.  An activation that costs more in the epilogue than
# its pass costs in memory is not worth fusing on this GPU, at this shape.
#
# The ``PyTorch`` column is the comparison that matters in practice: cuBLAS and
# then PyTorch's own element-wise kernel.  ``F.linear`` is the floor, the matmul
# with nothing after it; a fused layer can only beat it where its matmul is
# faster than cuBLAS's.  The last line is this lesson's kernel, the same
# computation without lesson 09's grouped tile order, autotuned tile shapes, TMA
# loads and persistent grid: the gap to the ``fused`` column is what those are
# worth.
#
# Fusion against the inner dimension
# ----------------------------------
# The plot follows the erf GELU across ``K``.  Expect every line to rise with
# ``K``, since a longer loop over ``K`` spreads each tile's start-up and store
# over more tensor-core work, and the gap between the fused and unfused lines to
# narrow: the activation pass moves ``4 * M * N`` bytes whatever ``K`` is, a
# fixed cost that a growing matmul dwarfs.

if record is not None:
    gelu = Record(
        record.name,
        record.title,
        [r for r in record.select(activation="gelu") if r["impl"] != "lesson kernel"],
        record.provenance,
        live=record.live,
    )
else:
    gelu = None
fig = plot_record(
    gelu,
    x="K",
    y="tflops",
    series="impl",
    logx=True,
    title="linear + GELU, bf16, 8192 x K -> 4096",
    xlabel="K (inputs of the layer)",
    ylabel="TFLOP/s (2MNK / time)",
    order=[FUSED, TRITON_PASS, TORCH_PAIR, LINEAR],
    name="lesson08_fusion",
)

# %%
# The same sweep as speed relative to ``F.linear``, for the three activations
# measured at every ``K`` (1.00 is the matmul alone; the smaller the number, the
# more the activation cost).  The last line puts the record's own numbers into
# the formula from the start of the lesson: the ``K`` at which the activation
# pass would take as long as the matmul.

if record is not None:
    print(
        f"{'activation':<10} {'K':>5} {'fused':>7} {'Triton pass':>12} {'PyTorch':>8}"
    )
    for activation in DEPTH_ACTIVATIONS:
        for k in SWEEP_K:
            t_lin = row(record, K=k, activation=activation, impl=LINEAR)["median_ms"]
            cells = [
                t_lin / row(record, K=k, activation=activation, impl=i)["median_ms"]
                for i in (FUSED, TRITON_PASS, TORCH_PAIR)
            ]
            print(
                f"{activation:<10} {k:5d} {cells[0]:7.2f} {cells[1]:12.2f} "
                f"{cells[2]:8.2f}"
            )
    peak = max(r["tflops"] for r in record.select(impl=LINEAR))
    bw = record.provenance["copy_gbps"]
    print(
        f"e F / B = 2 bytes x {peak:.0f} TFLOP/s / {bw:.0f} GB/s: the pass costs as "
        f"much as the matmul at K = {2 * peak * 1e12 / (bw * 1e9):.0f}"
    )

# %%
# The formula says what to look for.  The unfused columns should climb towards
# 1.00 as ``K`` grows and sit lowest at ``K = 512``, the closest to the
# break-even point, where the matmul is short enough for the pass to add a large
# share of its time: that is the ``1/K``.  The fused columns should stay closer
# to 1.00 throughout.  For ReLU, whose epilogue is one instruction, there is
# nothing left to pay; for SiLU and GELU the epilogue's arithmetic is a cost per
# output element too, so its share also shrinks as ``K`` grows.  The practical
# rule: fuse the activation into any matmul whose ``K`` is in the hundreds or
# low thousands, and keep the epilogue cheap.
#
# Turning the knobs
# -----------------
# The widgets below hold the whole sweep.  Their readout is the speed relative to
# ``F.linear`` at the same shape: 1.00 is the bare matmul, and anything below it
# is what the activation cost, in arithmetic or in traffic.  Next to it: the
# time, the TFLOP/s and the bytes moved, of which the unfused pass adds
# ``4 * M * N``.  The first widget is the headline layer, ``K = 4096``, for every
# activation; the second follows one activation across ``K``.  Move the sliders,
# or click a cell.

WAYS = (FUSED, TRITON_PASS, TORCH_PAIR)


def widget_rows(rec):
    """The sweep's rows for the widgets: a 'fusion' knob and the speed vs F.linear."""
    out = []
    for r in rec.rows:
        if r["impl"] not in WAYS:
            continue
        linear = row(rec, K=r["K"], activation=r["activation"], impl=LINEAR)
        detail = (
            f"{1e3 * r['median_ms']:.0f} us, {r['tflops']:.0f} TFLOP/s; "
            f"{r['bytes'] / MiB:.0f} MiB moved"
        )
        if r["extra_bytes"]:
            detail += f", {r['extra_bytes'] / MiB:.0f} MiB of it the activation pass"
        out.append(
            {
                **r,
                "fusion": r["impl"],
                "vs_linear": linear["median_ms"] / r["median_ms"],
                "detail": detail,
            }
        )
    return out


if record is not None:
    shown = widget_rows(record)
    by_activation = SweepExplorer(
        [r for r in shown if r["K"] == K],
        knobs=["activation", "fusion"],
        metric="vs_linear",
        unit="x the speed of F.linear",
        title=f"8192 x {K} -> 4096, bf16: activation and fusion",
        caption=record.caption(),
        initial={"activation": "gelu", "fusion": FUSED},
        slow_fraction=SLOW_FRACTION,
        slow_hint=(
            "the activation costs this layer a noticeable share of its time: "
            "an extra pass over Y, or an expensive epilogue."
        ),
        extra="detail",
    )
else:
    by_activation = "No committed GPU record of the sweep yet: nothing to show."
by_activation

# %%
# Orange cells run at less than 90% of the best setting in the grid.  Across a
# row, ``fused`` against ``unfused, Triton pass`` is the fusion and nothing else;
# the two unfused columns differ in whose activation pass runs (and in whose
# matmul).  Down the ``fused`` column, the spread is the epilogue's arithmetic:
# ReLU should sit with ``none``, GELU lowest.
#
# The second widget follows ReLU across ``K``.  Its epilogue is a single
# instruction, so all that separates fused from unfused is the traffic of the
# pass.  Start at ``K = 512`` with the Triton pass, then slide ``K`` up.

if record is not None:
    by_depth = SweepExplorer(
        [r for r in shown if r["activation"] == DEPTH_ACTIVATION],
        knobs=["K", "fusion"],
        metric="vs_linear",
        unit="x the speed of F.linear",
        title=f"8192 x K -> 4096, bf16, {DEPTH_ACTIVATION}: inner dimension and fusion",
        caption=record.caption(),
        initial={"K": 512, "fusion": TRITON_PASS},
        slow_fraction=SLOW_FRACTION,
        slow_hint=(
            "the activation pass moves 4*M*N bytes whatever K is; with a small K "
            "the matmul is too short to hide it."
        ),
        extra="detail",
    )
else:
    by_depth = "No committed GPU record of the sweep yet: nothing to show."
by_depth

# %%
# Try this
# --------
#
# 1. Add squared ReLU, :math:`\max(z, 0)^2` (used in Primer and in some recent
#    large models), as a new ``ACTIVATION`` value.  What does it cost in the
#    epilogue?
#
#    .. dropdown:: Solution
#
#       One more branch in ``_activation``:
#
#       .. code-block:: python
#
#          elif ACTIVATION == "relu2":
#              x = tl.maximum(x, 0.0)
#              x = x * x
#
#       Two instructions per element instead of one: as cheap as an epilogue
#       gets, so fusing it saves the whole activation pass.  The reference for
#       the check is ``F.relu(z) ** 2`` in float64.
#
# 2. The second linear layer of a transformer block ends in a residual
#    connection: ``out = r + x @ W.T + b``.  Fuse the addition of ``r`` into the
#    epilogue.  How many bytes does that save for an ``M x N`` output?
#
#    .. dropdown:: Solution
#
#       After ``_epilogue``, load the tile of ``r`` with the offsets and mask of
#       the store, add it in float32, and store once:
#
#       .. code-block:: python
#
#          offs = offs_m[:, None] * N + offs_n[None, :]
#          r = tl.load(r_ptr + offs, mask=m_ok & n_ok, other=0.0)
#          acc = acc + r.to(tl.float32)
#          tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=m_ok & n_ok)
#
#       Fused, ``r`` is read once and ``out`` written once.  Unfused, the matmul
#       writes ``Y``, and the addition reads ``Y`` and ``r`` and writes ``out``:
#       ``Y`` is written and read back for nothing, two extra passes over
#       ``M * N`` elements, the same saving as for an activation.
#
# 3. Llama-style feed-forward blocks use SwiGLU:
#    ``silu(x @ W_gate.T) * (x @ W_up.T)``.  Sketch a kernel that computes it in
#    one launch.  What does it save, and what does it cost in registers?
#
#    .. dropdown:: Solution
#
#       Keep two accumulators, ``acc_g`` and ``acc_u``, load each tile of ``x``
#       once per step of the K loop and use it twice:
#       ``acc_g = tl.dot(x, wg, acc_g)`` and ``acc_u = tl.dot(x, wu, acc_u)``.
#       The epilogue is ``_activation(acc_g, "silu") * acc_u``, stored once.
#       Unfused, the two matmuls write ``G`` and ``U``, SiLU reads ``G`` and
#       writes ``S``, and the product reads ``S`` and ``U`` and writes the
#       output: seven passes over ``M * N`` elements where the fused kernel makes
#       one, and ``x`` is read once instead of twice.  The price is a second
#       accumulator: halve ``BLOCK_N`` (or double the warps) to keep the
#       registers per thread where they were.
#
# 4. Compile the lesson's kernel for an H100 with each activation, 4 warps
#    instead of 8, and look at the registers and spills.
#
#    .. dropdown:: Solution
#
#       Put ``_activation``, ``_epilogue`` and ``linear_act_kernel`` in a file of
#       their own (``compile_kernel`` imports the kernel from it), then:
#
#       .. code-block:: python
#
#          sig = {p: "*bf16" for p in ("x_ptr", "w_ptr", "bias_ptr", "y_ptr")}
#          sig.update(M="i32", N="i32", K="i32")
#          for act in ("none", "gelu", "silu"):
#              consts = dict(HAS_BIAS=True, ACTIVATION=act,
#                            BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
#              for warps in (4, 8):
#                  k = tilebook.aot.compile_kernel(
#                      "linear_kernel.py:linear_act_kernel", sig, consts,
#                      num_warps=warps, num_stages=4, divisible_by_16=list(sig))
#                  print(act, warps, k.registers, k.spill_stores_bytes)
#
#       With 4 warps every thread holds 128 accumulator values: about 200
#       registers with ``"none"`` or the GELU, and the SiLU's temporaries take
#       it to the cap of 255 (Triton 3.6; other versions land a few registers
#       either way, and past the cap ``ptxas`` spills to local memory).  With
#       8 warps, 64 values each, every activation needs about half that.  Try
#       the textbook ``tl.math.erf`` GELU in ``_activation`` too: at 4 warps it
#       spills.
#
# 5. Training needs the backward pass: ``dZ = dY * act'(Z)`` where ``Z`` is the
#    pre-activation.  What must the fused forward kernel do differently, and how
#    much of the saving is left?
#
#    .. dropdown:: Solution
#
#       The fused kernel never writes ``Z``, and GELU's derivative needs it (for
#       ReLU the sign of the output is enough).  Either the forward also stores
#       ``Z``, one extra write of ``M * N`` elements, or the backward recomputes
#       it, which is a whole second matmul.  Storing ``Z``: the forward writes
#       ``Z`` and ``Y`` (two passes) where the unfused pair writes ``Z``, reads it
#       and writes ``Y`` (three), so one pass of the two is still saved.  The
#       backward can fuse too: ``dY * act'(Z)`` is an element-wise prologue of the
#       matmuls that compute ``dX`` and ``dW``.
#
# 6. Using the break-even formula, predict how the unfused pair fares at
#    ``K = 256`` and at ``K = 16384``, then check the trend against the table.
#
#    .. dropdown:: Solution
#
#       The pass costs :math:`eF/(KB)` of the matmul.  With the break-even ``K``
#       printed above (a few hundred on an H100), ``K = 256`` lies near or below
#       it: the pass takes about as long as the matmul or longer, and the
#       unfused layer runs at around half of ``F.linear``'s speed or less.  At
#       ``K = 16384`` the pass is a few percent of the matmul, within the noise
#       of many benchmarks.  One correction: the matmul's own rate falls at
#       small ``K`` (each tile has fewer steps to spread its start-up and its
#       store over), so with the peak rate for :math:`F` the formula overstates
#       the pass's share there.  Read it as an upper bound.
