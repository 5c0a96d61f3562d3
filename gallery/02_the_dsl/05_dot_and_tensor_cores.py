"""
05. tl.dot and tensor cores: one line, many machines
====================================================

Most of what a GPU computes per second it computes in its tensor cores, units
that multiply small matrices in one instruction.  Triton reaches them through
one function, ``tl.dot``.  The same line of Python becomes a different
instruction on each GPU, or a plain loop of multiply-adds when the tensor cores
cannot take it, and the dtypes going in and the accumulator decide how accurate
the product is.  This lesson multiplies one tile with one ``tl.dot``, reads in
compiled code what that line became, measures what a low-precision accumulator
costs over a long inner dimension, and times the tensor cores against the loop
of multiply-adds.

.. rubric:: You will learn

- what ``tl.dot`` computes and takes: shapes, ``acc=``, ``out_dtype`` and
  ``input_precision`` (``"tf32"``, ``"tf32x3"``, ``"ieee"``);
- how to read which instruction it became, :term:`mma` (``HMMA``, Ampere),
  :term:`wgmma` (``HGMMA``, and ``QGMMA`` for fp8, Hopper) or a loop of fused
  multiply-adds, and what decides it: the target, the dtypes, the tile, the
  :term:`warps <warp>` and ``K``;
- why 16-bit inputs are added up in a float32 accumulator, and what an fp16
  or bf16 accumulator costs over a long ``K``;
- what tf32 does to float32 inputs, and what fp8 changes on Hopper;
- how much faster the tensor cores are than the loop, measured.

Lessons 08 and 09 build :func:`tilebook.linear_act` and :func:`tilebook.matmul`
on ``tl.dot``; the measurement of this lesson is
:func:`tilebook.course.experiments.dot.paths`.
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` first: it decides whether kernels run on a CUDA GPU or through
# Triton's interpreter, before Triton loads (lesson 01).  The tables, sentences
# and claims this page makes of its compiles and measurements are made in
# :mod:`tilebook.course.experiments.dot` (``experiment`` below).

import tilebook

import re
import textwrap
from collections import Counter
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import min_dot_size

from tilebook.course.aot import AotError, compile_many
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.experiments import dot as experiment
from tilebook.course.plots import (
    caption_figure,
    house_style,
    no_record_message,
    place_legend,
    run_caption,
)
from tilebook.course.widgets_dot import DotExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
GPU = tilebook.is_gpu()
HERE = SimpleNamespace(caption=lambda: f"this page's run, triton {triton.__version__}")

# %%
# One tile, one tl.dot
# --------------------
# ``C = A @ B`` with ``A`` of shape ``(M, K)`` and ``B`` of shape ``(K, N)``,
# each one tile, so that one program does all of it.  It loads ``A`` and ``B``
# with lesson 04's broadcast offsets (both row-major: the rows of ``A`` are
# ``K`` elements apart, those of ``B`` ``N``) and hands them to ``tl.dot``,
# which returns the ``(M, N)`` product in :term:`registers <register>`.
#
# ``a_ptr``, ``b_ptr``, ``c_ptr``
#     The first elements of ``A``, ``B`` and the output ``C``.
# ``M``, ``N``, ``K``: ``tl.constexpr``
#     The tile's sizes: ``tl.arange`` needs them at compile time, and powers
#     of two.
# ``PRECISION``, ``OUT_DTYPE``: ``tl.constexpr``
#     Two options of ``tl.dot``, with its own defaults: how float32 inputs use
#     the tensor cores, and the dtype of the result.  The next sections are
#     about them.


@triton.jit
def tile_dot_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    PRECISION: tl.constexpr = "tf32",  # "tf32", "tf32x3" or "ieee"
    OUT_DTYPE: tl.constexpr = tl.float32,  # tl.float32 or tl.float16
):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])  # (M, K)
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])  # (K, N)
    c = tl.dot(a, b, input_precision=PRECISION, out_dtype=OUT_DTYPE)  # (M, N)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)


def tile_dot(a, b):
    """A @ B in float32 for contiguous tiles whose sizes are powers of two."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=torch.float32)
    tile_dot_kernel[(1,)](a, b, c, M=m, N=n, K=k)
    return c


# %%
# Is it right?
# ------------
# Against float64 of the same inputs, for a few shapes; bf16 on a GPU only (the
# interpreter gets bf16 wrong).  float32 inputs come later: they hold a
# surprise.

CASES = tilebook.pick(
    gpu=[(64, 64, 64), (16, 32, 128)], cpu=[(16, 16, 16), (32, 16, 64)]
)
report = CorrectnessReport("tile_dot vs float64")
for dtype in [torch.float16] + ([torch.bfloat16] if GPU else []):
    for m, n, k in CASES if dtype == torch.float16 else CASES[:1]:
        a = torch.randn(m, k, device=DEVICE, dtype=dtype)
        b = torch.randn(k, n, device=DEVICE, dtype=dtype)
        report.check(f"{m}x{n}x{k} {dtype}", tile_dot(a, b), a.double() @ b.double())
report.assert_ok()

# %%
# What tl.dot takes
# -----------------
# - **Shapes.** ``a`` is ``(M, K)``, ``b`` is ``(K, N)``, the result ``(M, N)``;
#   with a leading batch dimension both are 3-D and the result is a batch of
#   products.  ``K`` has a floor that the compiler enforces (below).
# - **dtypes.** Both inputs share one: fp16, bf16, float32, fp8 or int8.
# - ``out_dtype=``: the result's, float32 unless asked (int32 for int8);
#   ``tl.float16`` is allowed, ``tl.bfloat16`` refused.
# - ``acc=``: ``tl.dot(a, b, acc)`` returns ``acc + a @ b``, how several
#   products add up in one accumulator (below, and lesson 09).  ``out_dtype``
#   must then be ``acc``'s dtype (Triton 3.8 and later take it from ``acc``).
# - ``input_precision=``: how float32 inputs use the tensor cores, ``"tf32"``
#   (the default), ``"tf32x3"`` or ``"ieee"``; other dtypes ignore it.
#
# What it becomes
# ---------------
# Lesson 03 compiled kernels ahead of time for GPUs the machine does not have.
# One :func:`~tilebook.course.aot.compile_many` call compiles ``tile_dot_kernel`` for
# the compile targets Turing (``sm_75``), Ampere (``sm_80``) and Hopper
# (``sm_90``), for each kind of input on Hopper, and there
# for a few tiles and warp counts.  A
# setting is named ``inputs -> accumulator``; the table shows the :term:`SASS`
# instruction the dot became, how many times it appears in the SASS
# (the code each warp runs: a program runs it once per warp), and the
# registers a thread needs, with the bytes ``ptxas`` had to :term:`spill`
# where they ran out.

CHOICES = {  # inputs -> accumulator: (Triton type, input_precision, out_dtype)
    "fp16 -> fp32": ("fp16", "tf32", "fp32"),
    "bf16 -> fp32": ("bf16", "tf32", "fp32"),
    "fp32 tf32 -> fp32": ("fp32", "tf32", "fp32"),
    "fp32 tf32x3 -> fp32": ("fp32", "tf32x3", "fp32"),
    "fp32 ieee -> fp32": ("fp32", "ieee", "fp32"),
    "fp8 e4m3 -> fp32": ("fp8e4nv", "tf32", "fp32"),
    "fp8 e5m2 -> fp32": ("fp8e5", "tf32", "fp32"),
    "fp16 -> fp16": ("fp16", "tf32", "fp16"),
    "bf16 -> bf16": ("bf16", "tf32", "bf16"),  # not a tl.dot option: see below
}
SHAPES = [
    (64, 64, 32, 4),
    (128, 128, 64, 8),
    (64, 64, 32, 2),
    (32, 64, 32, 4),
    (64, 64, 8, 4),
]
TILES = {f"{m}x{n}x{k}, {w} warps": (m, n, k, w) for m, n, k, w in SHAPES}
TILE = "{}x{}x{}, {} warps".format(*experiment.TILE, experiment.WARPS)  # the timed one
TL = {"fp16": tl.float16, "bf16": tl.bfloat16, "fp32": tl.float32}
TL.update(fp8e4nv=tl.float8e4nv, fp8e5=tl.float8e5)


def job(arch, inputs, tile):
    dtype, precision, out = CHOICES[inputs]
    m, n, k, warps = TILES[tile]
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{out}"}
    consts = {"M": m, "N": n, "K": k, "PRECISION": precision, "OUT_DTYPE": TL[out]}
    return {"arch": arch, "num_warps": warps, "signature": sig, "constexprs": consts}


def label(setting):
    return "sm_{} {}, {}".format(*setting)


SETTINGS = [(90, i, TILE) for i in list(CHOICES)[:8]]
SETTINGS += [(80, "fp16 -> fp32", TILE), (75, "fp16 -> fp32", TILE)]
SETTINGS += [(90, "fp16 -> fp32", t) for t in list(TILES)[2:4]]  # fewer warps, rows
compiled = compile_many({label(s): job(*s) for s in SETTINGS}, kernel=tile_dot_kernel)


def dot_ops(k):
    """The dot's instructions in one compiled kernel, most frequent first."""
    found = re.findall(r"\b(?:HGMMA|QGMMA|HMMA|FFMA|HFMA2)\.?[\w.]*", k.stage("sass"))
    return Counter(op for op in found if not op.endswith(".MMA")).most_common()


ops = {s: dot_ops(compiled[label(s)]) for s in SETTINGS}
count = {s: sum(n for _, n in ops[s]) for s in SETTINGS}
kernels = {s: compiled[label(s)] for s in SETTINGS}
experiment.compiled_table(SETTINGS, ops, kernels)

# %%
# Read it by what changes from row to row.
#
# - **The target.** On ``sm_90`` the dot is Hopper's :term:`wgmma`, ``HGMMA``:
#   one instruction for a :term:`warpgroup` of :datasheet:`hopper.warpgroup`
#   and a slice of 64 rows of the tile (``HGMMA.64x64x16`` multiplies
#   ``64 x 16`` by ``16 x 64``).  On ``sm_80`` it is Ampere's :term:`mma`,
#   ``HMMA``, one warp at a time on a much smaller piece (``HMMA.16816`` is
#   ``M = 16, N = 8, K = 16``), so a program runs many more of them.  On
#   ``sm_75`` this Triton leaves Turing's tensor cores unused: even fp16
#   becomes a loop of ``FFMA``, one multiply-add per instruction.
# - **The dtypes.** float32 inputs with ``"ieee"`` never touch the tensor
#   cores.  With the default, ``"tf32"``, they do (``.TF32``), and
#   ``"tf32x3"`` runs the tf32 product three times over (why, below).  fp8 has
#   its own Hopper instruction, ``QGMMA``.  ``fp16 -> fp16`` ends in ``.F16``:
#   the tensor core adds into an fp16 accumulator.
# - **The tile and the warps.** wgmma needs whole warpgroups and 64 rows of
#   the tile for each.  The same fp16 tile on two warps, or a tile of 32 rows
#   on four, gets Ampere's ``HMMA`` on Hopper.
#
# Two settings do not compile at all: ``K = 8``, below the smallest ``K`` that
# Triton's NVIDIA backend accepts, and fp8 e4m3 below ``sm_89``.  The lines of
# the compiler's messages that give the reason:

REFUSED = [(90, "fp16 -> fp32", list(TILES)[-1]), (80, "fp8 e4m3 -> fp32", TILE)]
try:
    compile_many(
        {label(s): job(*s) for s in REFUSED}, kernel=tile_dot_kernel, workers=1
    )
    refusals = ""
except AotError as exc:
    refusals = str(exc)
reasons = [ln for ln in refusals.splitlines() if "K >=" in ln or "not supported" in ln]
for line in dict.fromkeys(r.strip() for r in reasons):
    print(textwrap.fill(line, 88, subsequent_indent="  "))

# %%
# All of that fits in a few lines: what ``tl.dot`` becomes for a target, a
# choice of dtypes and a tile.  The rule is checked against every compile on
# this page, and the widget at the end uses it for the settings not compiled
# here.  The smallest ``K`` comes from Triton's NVIDIA backend itself.


def smallest_k(dtype):
    t = tl.block_type(TL[dtype], [64, 64])
    return min_dot_size(GPUTarget("cuda", 90, 32))(t, t)[2]


def lowering(arch, inputs, tile):
    """The instruction family tl.dot becomes, or why it does not compile."""
    dtype, precision, _ = CHOICES[inputs]
    m, _, k, warps = TILES[tile]
    if dtype == "fp8e4nv" and arch < 89:
        return "refused: Triton supports fp8 e4m3 from sm_89 on"
    if k < smallest_k(dtype):
        return f"refused: K = {k} is below the smallest K, {smallest_k(dtype)}"
    if arch < 80 or precision == "ieee":
        return "FMA"
    if arch >= 90 and warps % 4 == 0 and m % 64 == 0:
        return "QGMMA" if dtype.startswith("fp8") else "HGMMA"
    return "HMMA"


said = experiment.rules_claims(SETTINGS, REFUSED, lowering, reasons, ops, kernels, TILE)
Claims("05 tl.dot", HERE).check_all(said)

# %%
# Accumulating: why float32
# -------------------------
# A tensor core multiplies pieces of ``K = 16`` (the last digits of
# ``HMMA.16816`` and ``HGMMA.64x64x16``) and adds each piece into the
# accumulator.  A long ``K`` is a chain of such additions, and the
# accumulator's dtype rounds the running sum after every one.  fp16 keeps 11
# significant bits and bf16 8: once the sum is large next to what a step
# adds, each rounding loses a noticeable part of the step.  float32 keeps 24.
# Hence the rule: **16-bit inputs, float32 accumulator, round once when
# storing**, which is what ``tl.dot`` does by default.
#
# The kernel below spells the chain out: it walks ``K`` in steps of ``STEP``
# and ``tl.dot(a, b, acc)`` adds each step into ``acc`` in ``acc``'s dtype,
# ``ACC``.  (The loop has the shape of lesson 09's, which adds what makes it
# fast.)  ``tl.dot`` refuses a bf16 accumulator, so for bf16 the kernel rounds
# the sum by hand after each step, as a kernel that keeps its sum in bf16
# does.  With ``STEP = 16`` this is the tensor core's order of additions.  The
# interpreter's ``tl.dot`` (NumPy) rounds only once per call, so spelling the
# chain out makes it show on a CPU too.


@triton.jit
def chain_kernel(
    a_ptr, b_ptr, c_ptr, K, M: tl.constexpr, STEP: tl.constexpr, ACC: tl.constexpr
):
    rm = tl.arange(0, M)  # a square M x M output tile
    rk = tl.arange(0, STEP)
    acc = tl.zeros((M, M), dtype=ACC)
    for k in range(0, K, STEP):  # K is a multiple of STEP
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * M + rm[None, :])
        if acc.dtype == tl.bfloat16:  # no bf16 accumulator in tl.dot: round by hand
            acc = tl.dot(a, b, acc.to(tl.float32)).to(tl.bfloat16)
        else:
            acc = tl.dot(a, b, acc, out_dtype=ACC)  # acc + a @ b, in ACC
    tl.store(c_ptr + rm[:, None] * M + rm[None, :], acc.to(c_ptr.dtype.element_ty))


# %%
# The yardstick for an error is what rounding the exact product to the output's
# dtype costs: no kernel that stores fp16 does better.  A setting is **wrong**
# when its error is more than ``WRONG`` times that.  Random inputs, one program;
# bf16 on a GPU only.

WRONG = 2.0
STEP = 16
KS = [16, 64, 256, 1024, 4096]
MN = tilebook.pick(gpu=64, cpu=16)
PAIRS = [("fp16", "fp32"), ("fp16", "fp16")]
PAIRS += [("bf16", "fp32"), ("bf16", "bf16")] if GPU else []
gen = torch.Generator().manual_seed(0)


def rel(x, exact):
    return ((x.double() - exact).norm() / exact.norm()).item()


def chain(inputs, acc, k):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[inputs]
    a = torch.randn(MN, k, generator=gen).to(DEVICE, dtype)
    b = torch.randn(k, MN, generator=gen).to(DEVICE, dtype)
    c = torch.empty(MN, MN, device=DEVICE, dtype=dtype)
    chain_kernel[(1,)](a, b, c, k, M=MN, STEP=STEP, ACC=TL[acc])
    exact = a.double() @ b.double()
    err, floor = rel(c, exact), rel(exact.to(dtype), exact)
    return {"pair": f"{inputs} -> {acc}", "K": k, "err": err, "ratio": err / floor}


acc_rows = [chain(i, a, k) for i, a in PAIRS for k in KS]
experiment.errors_table(acc_rows, MN)

# %%
# The same, drawn: a colour for each setting, solid lines and filled dots for
# fp16 inputs, dashed lines and open squares for bf16, so that lines that fall
# on each other stay visible.

STYLE = {
    "fp16": {"marker": "o", "linestyle": "-"},
    "bf16": {
        "marker": "s",
        "linestyle": "--",
        "markerfacecolor": "none",
        "markersize": 9,
    },
}
by = {(r["pair"], r["K"]): r["ratio"] for r in acc_rows}
settings = list(dict.fromkeys(r["pair"] for r in acc_rows))
with house_style():
    fig, ax = plt.subplots()
    for pair in settings:
        ratios = [by[pair, k] for k in KS]
        ax.plot(KS, ratios, label=pair, **STYLE[pair.split(" ->")[0]])
    ax.axhline(WRONG, color="0.4", linestyle=":", linewidth=1.2, label="wrong above")
    ax.set(xscale="log", yscale="log", xlabel="K", ylabel="error / rounding")
    ax.set_title("The accumulator's dtype over a long K")
    place_legend(ax)
    caption_figure(fig, run_caption())
experiment.say_overlap(acc_rows, KS)

# %%
# With a float32 accumulator every error is the rounding of the exact product,
# whatever ``K``; with a 16-bit one it grows with ``K`` until it is wrong (a
# GPU adds bf16 to the table; the interpreter gets bf16 wrong).  A test on a
# short ``K`` passes a kernel that is wrong on a long one.  Checked on the
# table's ratios:

Claims("05 tl.dot", HERE).check_all(experiment.grows_claims(acc_rows, PAIRS, KS, WRONG))

# %%
# float32 inputs, tf32, and what each path costs
# ----------------------------------------------
# A float32 input does not fit a tensor core.  ``"tf32"``, the default, keeps
# 10 of its 23 bits of mantissa, so a float32 ``tl.dot`` on a GPU is as
# accurate as its inputs cut to 11 significant bits: the surprise promised
# above, and why lesson 09 checks its float32 products loosely.  ``"tf32x3"``
# splits each input into a tf32 part and a tf32 remainder and adds three
# products (part times part, part times remainder, remainder times part),
# which recovers nearly all of float32 for three times the tensor-core work.
# ``"ieee"`` computes in float32 on the ordinary units: the ``FFMA`` loop.
#
# One measurement gives each path's accuracy and speed.  To time the dot and
# not the memory, the kernel below loads its tile once and chains ``repeat``
# dots into its accumulator, ``acc = tl.dot(a, b, acc)``; all programs
# multiply the same tile and each writes its own.


@triton.jit(do_not_specialize=["repeat"])  # repeat=1 and repeat=64: one binary
def repeat_dot_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    repeat,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = tl.zeros((M, N), dtype=tl.float32)
    for _ in range(repeat):
        acc = tl.dot(a, b, acc, input_precision=PRECISION)  # acc + a @ b
    c = c_ptr + tl.program_id(0) * M * N
    tl.store(c + rm[:, None] * N + rn[None, :], acc)


# %%
# :func:`tilebook.course.experiments.dot.paths` sends the same float32 data
# through each path (converted to the path's dtype first) on the timed tile of
# the table above, launching ``repeat_dot_kernel`` on a few programs per :term:`SM`;
# ``err`` is the error against float64 of the float32 data, and the dot's own
# error compares with float64 of the converted inputs.  Each launch is timed
# by ``timed``, Triton's ``do_bench`` (warm up, then repeat, then the median
# time in ms), the paths in interleaved rounds; fp8 only where the GPU has fp8
# tensor cores.  On a CPU the page shows the record of a GPU run.


def timed(launch):
    return triton.testing.do_bench(launch, warmup=10, rep=40, return_mode="median")


def measure_paths():
    return experiment.paths(kernel=repeat_dot_kernel, timer=timed)


paths = record_or_measure(
    "lesson05_paths",
    "tl.dot: error and rate of each path, one tile on chip",
    measure_paths,
)
if paths is None:
    print(textwrap.fill(no_record_message("lesson05_paths"), 88))
rows = {r["path"]: r for r in paths.rows} if paths else {}
vs = experiment.against_loop(rows)
err = {p: r["err"] for p, r in rows.items()}
# The instruction of each path, for the architecture of the GPU that timed it
TIMED = round(10 * float(paths.provenance.get("capability", 9.0))) if paths else 90
missing = [(TIMED, f"{p} -> fp32", TILE) for p in rows]
missing = [s for s in missing if s not in ops]
if missing:  # not timed on Hopper: compile its own architecture too
    compiled.update(
        compile_many({label(s): job(*s) for s in missing}, kernel=tile_dot_kernel)
    )
    ops.update({s: dot_ops(compiled[label(s)]) for s in missing})
experiment.paths_table(paths, ops, TIMED, TILE)

# %%
# What the table says, checked on its data (a CPU without the record has
# nothing to check them on).  For scale, the datasheet's peaks of the GPU this
# page speaks for, :build-gpu:`name`: :datasheet:`gpu.bf16_dense` for bf16,
# :datasheet:`gpu.tf32_dense` for tf32, :datasheet:`gpu.fp32` without tensor
# cores.  One tile chained on itself reaches only part of a peak; the ratios
# between paths on the same tile are the point.

Claims("05 tl.dot", paths).check_all(experiment.paths_claims(paths))

# %%

experiment.say_tf32x3(paths)

# %%
# fp8 on Hopper.  e4m3 keeps 3 bits of mantissa and 4 of exponent, e5m2 2 and
# 5 (more range, for gradients).  ``QGMMA`` takes twice the ``K`` of a 16-bit
# wgmma per instruction, hence a floor of 32 on ``K``, and the datasheet
# doubles the rate, :datasheet:`gpu.fp8_dense`.  The price is in the inputs,
# which keep only a few bits each.  On ``sm_90`` Triton also lets the tensor
# core add fp8 products with fewer bits than float32, unless ``tl.dot``'s
# ``max_num_imprecise_acc`` asks for a true float32 sum every so many steps:
# the dot's own error in the table includes that.
#
# The tl.dot explorer
# -------------------
# Every setting of target, dtypes and tile: the instruction (compiled on this
# page, or given by the rule that every compile here obeys), the accumulator,
# the error to expect and, for the timed tile on the GPU that timed it, the
# measured rate.
# Settings that do not compile or lose accuracy are marked *wrong*, the FMA
# loop *slow*.

HEADLINES = {"HGMMA": "wgmma: HGMMA", "QGMMA": "wgmma for fp8: QGMMA"}
HEADLINES.update(HMMA="mma: HMMA", FMA="a loop of fused multiply-adds: no tensor cores")
ACCUMULATORS = {
    "fp32": "float32, the default",
    "fp16": "fp16 (out_dtype=tl.float16), added by the tensor core",
    "bf16": "float32 in each tl.dot, rounded to bf16 after it (tl.dot refuses bf16)",
}


def explore(arch, inputs, tile):
    how, s, out = lowering(arch, inputs, tile), (arch, inputs, tile), inputs[-4:]
    r = {
        "target": f"sm_{arch}",
        "inputs": inputs,
        "tile": tile,
        "acc": ACCUMULATORS[out],
    }
    if how.startswith("refused"):
        return {**r, "headline": "does not compile", "wrong": how[len("refused: ") :]}
    r["headline"] = HEADLINES[how]
    r["compiled"] = "not compiled on this page; by the rule"
    if s in ops:
        k = compiled[label(s)]
        r["compiled"] = f"on this page: {count[s]} {ops[s][0][0]}, "
        r["compiled"] += (
            f"{k.registers} registers, {k.spill_stores_bytes} bytes spilled"
        )
    if (inputs, KS[-1]) in by:
        r["error"] = f"{by[inputs, KS[-1]]:.1f} times the rounding at K = {KS[-1]}"
        if by[inputs, KS[-1]] > WRONG:
            r["wrong"] = f"the accumulator loses accuracy: {r['error']}"
    elif out == "bf16":
        r["wrong"] = "a bf16 sum keeps fewer bits than an fp16 one (bf16 needs a GPU)"
    path = inputs.split(" ->")[0]
    if path in rows:
        e = f"{err[path]:.1e} against float64 of the float32 data (timed tile)"
        r["error"] = f"{r['error']}; {e}" if "error" in r else e
        if arch == TIMED and tile == TILE:
            r["rate"] = f"{rows[path]['tflops']:,.0f} TFLOP/s"
            if how != "FMA":
                r["rate"] += f", {vs[path].ratio:.1f} times the FMA loop"
    r.setdefault("rate", f"measured for the timed tile on sm_{TIMED} only")
    if how == "FMA":
        r["slow"] = "every product is a separate instruction on the ordinary units"
    elif how == "HMMA" and arch >= 90:
        r["note"] = "Ampere's mma on Hopper: wgmma needs warpgroups of 64 rows"
    return r


explored = [explore(a, i, t) for a in (90, 80, 75) for i in CHOICES for t in TILES]
DotExplorer(explored, **experiment.explorer_setup(CHOICES, TILES, paths))

# %%
# Where this leads
# ----------------
# One program, one tile, one ``tl.dot``: lesson 08 puts a grid of such programs
# over a large output, each with the whole ``K`` in its tile, and lesson 09
# walks ``K`` in steps with a float32 accumulator, the loop of ``chain_kernel``
# made fast.  Both end in the package, :func:`tilebook.linear_act` and
# :func:`tilebook.matmul`, whose tiles are chosen so that Hopper (``sm_90``)
# runs wgmma.
#
# Try this
# --------
#
# 1. Compute ``A @ B.T`` from a stored ``(N, K)`` matrix ``B`` by changing only
#    the offsets of ``b`` in ``tile_dot_kernel`` (lesson 04).  Check it:
#
#    .. code-block:: python
#
#       from tilebook.course.exercises import check
#
#       def abt(a, b, out):
#           (m, k), n = a.shape, b.shape[0]
#           abt_kernel[(1,)](a, b, out, M=m, N=n, K=k)
#
#       a = torch.randn(32, 64, dtype=torch.float16, device=DEVICE)
#       b = torch.randn(16, 64, dtype=torch.float16, device=DEVICE)
#       print(check(abt, lambda a, b: a @ b.T, [(a, b)], block=(32, 16),
#                   out_dtype=torch.float32))
#
#    .. dropdown:: Solution
#
#       ``b = tl.load(b_ptr + rn[None, :] * K + rk[:, None])``: element
#       ``(k, n)`` of ``B.T`` is element ``(n, k)`` of the stored ``B``, whose
#       rows are ``K`` apart.  ``tl.dot`` needs no transposed copy.
#
# 2. Write ``C = A @ B + C0`` with one ``tl.dot`` and ``acc=``, ``C0`` in
#    float32, and check it with ``check(fn, lambda a, b, c0: a @ b + c0,
#    [(a, b, c0)], block=(32, 16), out_dtype=torch.float32)``.
#
#    .. dropdown:: Solution
#
#       Load ``c0`` as the output is stored, then ``c = tl.dot(a, b, c0)``.
#       ``acc`` must have the result's dtype: a float16 ``c0`` needs
#       ``out_dtype=tl.float16``, and then the sum is rounded to fp16.
#
# 3. Compile ``tile_dot_kernel`` for ``sm_90`` with the ``64x64x32`` fp16 tile
#    on eight warps instead of four.  Still wgmma?  What changed?
#
#    .. dropdown:: Solution
#
#       Still ``HGMMA``: eight warps are two warpgroups, and with only 64 rows
#       each takes half of the columns (``HGMMA.64x32x16``).  The rule holds:
#       whole warpgroups, and ``M`` a multiple of 64.
#
# 4. Run ``chain`` with ``STEP = 64`` on a CPU.  Why does the fp16 accumulator
#    look better, and would a GPU agree?
#
#    .. dropdown:: Solution
#
#       The interpreter rounds once per ``tl.dot``: four times fewer roundings.
#       A GPU would not agree: its tensor core still adds pieces of ``K = 16``,
#       each rounded to fp16, whatever the step of the loop.
