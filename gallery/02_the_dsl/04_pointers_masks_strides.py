"""
04. Pointers, masks and strides: how a tile finds its data
==========================================================

A Triton kernel never holds a tensor.  It receives the address of the first
element and computes the address of every element it touches, a whole tile of
them at a time.  This lesson is about that arithmetic: the mask that keeps a
tile inside its tensor, the strides that let one kernel read any view of a
tensor, the order of the addresses, which decides how much of what memory
delivers is used, and the Hopper way of handing the whole computation to a
copy engine.

.. rubric:: You will learn

- what ``tl.load`` and ``tl.store`` do with ``mask`` and ``other``, and what a
  missing mask does (shown without touching memory the lesson does not own);
- pointer arithmetic: a pointer plus a tensor of offsets is a tensor of
  pointers, counted in elements;
- 2-D tiles from broadcast offsets times strides, and why the same kernel then
  works on transposed and sliced views;
- what :term:`coalesced` and uncoalesced reads cost, counted in sectors and
  measured;
- how Triton learns which axis is contiguous, read from the compiled code;
- tensor descriptors, the Hopper way to name a tile, replacing block pointers.

The lesson's kernels live in :mod:`tilebook.course.experiments.memory_access`
(:func:`tilebook.course.experiments.memory_access.scale_2d`); the exercises' checker
is :func:`tilebook.course.exercises.check`.
"""

# %%
# Setting up
# ----------
# Importing :mod:`tilebook` first decides whether kernels run on a CUDA GPU or
# through Triton's interpreter on the CPU (lesson 01).

import tilebook

import itertools
import warnings

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tilebook.course.aot import compile_many
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims, all_faster, speedup
from tilebook.course.experiments import memory_access as experiment
from tilebook.course.plots import plot_record
from tilebook.course.prose import say
from tilebook.course.tables import table
from tilebook.course.widgets_memory import CoalescingExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
NO_RECORD = say(
    "No GPU measurement of this is committed yet: run the lesson on a CUDA GPU."
)

# %%
# A load, a mask and ``other``
# ----------------------------
# ``tl.load(pointers, mask=..., other=...)`` takes a *tensor of pointers*,
# one per element of the tile, and returns a tensor of the same shape.  Where
# ``mask`` is False the lane touches no memory and its value is ``other``.
# ``tl.store(pointers, value, mask=...)`` writes only where the mask is True.
# This kernel loads one block of ``BLOCK`` elements from a tensor of ``n``,
# with or without a mask (a ``constexpr``: each value compiles its own
# kernel), and stores the whole block.


@triton.jit
def load_block_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    if MASKED:
        x = tl.load(x_ptr + offsets, mask=offsets < n, other=-1.0)
    else:
        x = tl.load(x_ptr + offsets)
    tl.store(out_ptr + offsets, x)


# %%
# What lies past the end
# ~~~~~~~~~~~~~~~~~~~~~~
# Triton's interpreter checks no bounds: a read past the end of a tensor reads
# whatever the process holds there, a write past it corrupts it.  So the lesson
# keeps every access inside memory it owns: ``x`` and a ``neighbour`` poisoned
# with ``-999`` are two views of *one* allocation, side by side, as PyTorch's
# allocator often places two tensors; the block is longer than ``x``.

BLOCK, n = 8, 5
memory = torch.cat([torch.arange(1.0, n + 1), torch.full((BLOCK,), -999.0)]).to(DEVICE)
x, neighbour = memory[:n], memory[n:]
out = torch.zeros(BLOCK, device=DEVICE)
print("x:                    ", x.tolist())
load_block_kernel[(1,)](x, out, n, BLOCK=BLOCK, MASKED=True)
print("masked, other=-1:     ", out.tolist())
load_block_kernel[(1,)](x, out, n, BLOCK=BLOCK, MASKED=False)
print("no mask:              ", out.tolist())

# %%
# With the mask, the lanes past the end hold ``other``.  Without it they hold
# the neighbour's poison: no error, no warning, a wrong answer.  On a
# GPU the same read lands in another tensor, or in memory that is not mapped,
# and then the kernel dies with an illegal address (and takes the CUDA context
# with it).  Stores are worse, and this kernel's store has no mask whatever
# ``MASKED`` says.  Give it an output of ``n`` elements with a tensor after it:

out_memory = torch.zeros(n + BLOCK, device=DEVICE)
out, after_out = out_memory[:n], out_memory[n:]
load_block_kernel[(1,)](x, out, n, BLOCK=BLOCK, MASKED=True)
print("the tensor after out: ", after_out.tolist())
print("elements overwritten: ", int((after_out != 0).sum()))

# %%
# The rule: every lane that may fall outside the tensor needs a mask on its
# loads and on its stores.  ``other`` matters when the masked values flow into
# something (a sum needs ``0``, a maximum ``-inf``).  The exercises' checker,
# :func:`tilebook.course.exercises.check`, keeps a kernel's tensors in guarded,
# poisoned buffers: a missing mask shows as a finding, not as corruption.
#
# Pointer arithmetic and strides
# ------------------------------
# A tensor argument arrives as a pointer to its first element, typed with its
# dtype: ``x_ptr + 3`` is three *elements* further, whatever their size, and
# ``x_ptr + offsets`` is a tensor of pointers.  A view is the same memory with
# a different first element and different strides: ``base[2::5]`` starts two
# elements into ``base`` and takes every fifth.  Its pointer is ``base``'s plus
# two elements, and the kernel must be told the stride, which it multiplies
# into the offsets:


@triton.jit
def strided_copy_kernel(x_ptr, out_ptr, n, stride, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = tl.load(x_ptr + offsets * stride, mask=mask)
    tl.store(out_ptr + offsets, x, mask=mask)


def strided_copy(x, block_size=1024):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(x.numel(), block_size),)
    strided_copy_kernel[grid](x, out, x.numel(), x.stride(0), BLOCK_SIZE=block_size)
    return out


base = torch.arange(24.0, device=DEVICE)
view = base[2::5]
print("view:", view.tolist(), " stride:", view.stride(0))
print("its pointer is", view.data_ptr() - base.data_ptr(), "bytes past base's")
print("copied:", strided_copy(view).tolist())

# %%
# Checked against float64 on lengths that are not multiples of the block.
# ``@triton.jit`` compiles one kernel for a stride of one, one for multiples
# of 16 and one for the rest (lesson 02); these strides and lengths compile
# the three that the measurement below runs.

copy_report = CorrectnessReport("strided copy vs float64")
for stride in (1, 2, 16):
    for length in (1040, 4112):
        src = torch.randn(length * stride, device=DEVICE)[::stride]
        copy_report.check(
            f"n={length} stride={stride}", strided_copy(src), src.double()
        )
copy_report.assert_ok()

# %%
# Coalesced and uncoalesced reads
# -------------------------------
# The threads of a :term:`warp` execute a load together, each lane with its
# own address.  Memory does not deliver single elements: from :term:`HBM`
# through the :term:`L2` cache to an :term:`SM` it moves 32-byte *sectors*, and
# a warp's load costs the sectors its addresses fall in.  When neighbouring
# lanes read neighbouring elements the load is :term:`coalesced`: a warp
# reading float32 fills whole sectors, and every byte delivered is used.  At a
# stride of two elements only every other element of each sector is wanted;
# from a stride of eight float32 elements on, each sits in a sector of its own.
# :func:`tilebook.course.experiments.memory_access.warp_access` counts the sectors
# of one warp's load, and
# :func:`~tilebook.course.experiments.memory_access.predicted_ratio` what that
# predicts for the strided copy, which reads at the stride and writes contiguously.
#
# :func:`tilebook.course.experiments.memory_access.strides` measures it: the kernel
# above copies ``experiment.STRIDE_N`` float32 elements read at
# each stride, all strides in interleaved rounds.  GB/s count the bytes the
# copy needs, one read and one write each: what the stride wastes shows.
# ``timed`` is one round's timing of one launch: Triton's ``do_bench`` runs it
# until warm, then repeats it and returns the median time in milliseconds.


def timed(launch):
    return triton.testing.do_bench(launch, warmup=10, rep=40, return_mode="median")


def measure_strides():
    return experiment.strides(kernel=strided_copy_kernel, timer=timed)


sweep = record_or_measure(
    "lesson04_strides", "strided copy, float32: GB/s by stride", measure_strides
)
fig = plot_record(
    sweep,
    x="stride",
    y="gbps",
    series="dtype",
    logx=True,
    xlabel="stride of the reads (elements)",
    ylabel="GB/s (bytes the copy needs)",
    ceiling=sweep.provenance["copy_gbps"] if sweep else None,
    ceiling_label="device-to-device copy",
    name="lesson04_strides",
)

# %%
# The model beside the measurement (one warp loading one float32 per lane; the
# rates as a share of the rate at stride one).  It counts sectors only; a read
# that scatters also touches more DRAM rows and pages, so it can measure under.

experiment.sector_table(sweep)

# %%
# What the table says, checked on its data.  The strides up to one element per
# sector are those where the predicted rate still falls; past them the model
# counts the same sectors per element.  No kernel moves bytes much faster than
# the device's own copy, so the sectors a stride fetches bound its rate.

SLACK = 0.1  # a kernel may beat the copy by this much, no more
F32 = torch.float32.itemsize
by_stride = {r["stride"]: r for r in sweep.rows} if sweep else {}
within_sector = [s for s in experiment.STRIDES if s * F32 <= experiment.SECTOR_BYTES]
rates = {s: r["gbps"] for s, r in by_stride.items()}
above = {  # the rate over what the sectors allow at the copy's rate
    s: g / experiment.predicted_ratio(s, F32) / sweep.provenance["copy_gbps"]
    for s, g in rates.items()
}


def slower(pairs):  # (a, b) strides: is a's copy faster than b's, beyond the spread?
    return all_faster(
        {
            (f"stride {a}", f"stride {b}"): speedup(by_stride[a], by_stride[b])
            for a, b in pairs
        }
    )


STRIDE_CLAIMS = {
    "Every stride above one copies more slowly than stride one": lambda: slower(
        (1, s) for s in rates if s > 1
    ),
    "Up to one element per sector, every doubling of the stride slows it": lambda: (
        slower(itertools.pairwise(within_sector))
    ),
    "No stride copies faster than its sectors allow at the copy's rate": lambda: (
        max(above.values()) <= 1 + SLACK,
        "sectors and writes moved at "
        + ", ".join(f"{v:.0%} (stride {s})" for s, v in above.items())
        + " of the copy's rate",
    ),
}
Claims("04 pointers, masks and strides", sweep).check_all(STRIDE_CLAIMS)

# %%
# Turning the knobs
# ~~~~~~~~~~~~~~~~~
# One square per sector of one warp's load, filled with the share the program
# asked for.  The knobs: stride, dtype, elements per thread, and the mask (the
# tensor ends inside the warp's tile).  Reads past the end are flagged
# *wrong*, using less than ``SLOW`` of what is fetched *slow*; for float32,
# each stride also shows the rate measured above.

SLOW = 0.75
CoalescingExplorer(sweep, slow_below=SLOW)

# %%
# 2-D tiles from strides
# ----------------------
# A matrix tile is addressed the same way, with two vectors of offsets.
# ``rows[:, None]`` is a column (shape ``BLOCK_M x 1``) and ``cols[None, :]``
# a row (``1 x BLOCK_N``); any arithmetic between them *broadcasts* to the
# whole tile, ``BLOCK_M x BLOCK_N``.  Element ``(i, j)`` of a tensor with
# strides ``(stride_m, stride_n)`` is at ``i * stride_m + j * stride_n``, and
# a transposed or sliced view is only other strides and another first element.
# :func:`tilebook.course.experiments.memory_access.view_inputs` makes three views of
# one shape; the offsets of their top-left corners:

SHAPE = tilebook.pick(gpu=(1040, 3088), cpu=(40, 72))
views = experiment.view_inputs(*SHAPE)
for name, v in views.items():
    sm, sn = v.stride()
    print(f"{name}: strides {v.stride()}, first element at {v.storage_offset()}")
    print(torch.arange(3)[:, None] * sm + torch.arange(4)[None, :] * sn)

# %%
# The kernel takes the strides of its input and of its output, so it reads any
# of these views and writes any layout.  ``mask`` combines a row mask and a
# column mask: a tile on the bottom or right edge keeps its lanes inside.


@triton.jit
def scale_2d_kernel(
    x_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_om,
    stride_on,
    alpha,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(
        x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask
    )
    out = out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, x * alpha, mask=mask)


def scale_2d(x, alpha, kernel=scale_2d_kernel, block_m=64, block_n=64):
    M, N = x.shape
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    strides = (*x.stride(), *out.stride())
    kernel[grid](x, out, M, N, *strides, alpha, BLOCK_M=block_m, BLOCK_N=block_n)
    return out


ALPHA = 2.5
report = CorrectnessReport("scale_2d vs float64")
for name, v in views.items():
    report.check(name, scale_2d(v, ALPHA), ALPHA * v.double())
for dtype in [torch.float16] + ([torch.bfloat16] if tilebook.is_gpu() else []):
    v = views["contiguous"].to(dtype)
    report.check("contiguous", scale_2d(v, ALPHA), ALPHA * v.double())
report.assert_ok()

# %%
# The shapes are ragged (neither is a multiple of the tile); bfloat16 is
# checked on a GPU only, since the interpreter computes it wrongly.
#
# Right on every view, but fast?  In the transposed view, neighbours in a row
# are ``M`` elements apart: read along rows, the stride sweep's worst case.
# :func:`tilebook.course.experiments.memory_access.views` times the kernel and
# ``torch.mul`` on each view of a float32 ``experiment.VIEW_SHAPE`` matrix,
# all in one set of interleaved rounds.

measured = record_or_measure(
    "lesson04_views",
    "scale_2d, float32: GB/s by view",
    lambda: experiment.views(kernel=scale_2d_kernel, timer=timed),
)


experiment.views_table(measured) if measured else NO_RECORD

# %%
# Checked on the data above.  *Keeps its speed* means at least ``KEEPS`` of
# the contiguous view's rate.

KEEPS = 0.5
kernel = (
    {r["view"]: r["gbps"] for r in measured.select(impl="kernel")} if measured else {}
)
frac = {v: g / kernel["contiguous"] for v, g in kernel.items()}
worst = within_sector[-1]  # the copy that reads one element per sector
of_copy = rates[worst] / rates[1] if rates else 0.0
speeds = ", ".join(f"{v}: {f:.0%} of contiguous" for v, f in frac.items())
beyond = f"the copy at stride {worst}: {of_copy:.0%} of stride one"
KEPT = {
    "On the transposed view the kernel keeps its speed": lambda: (
        frac["transposed"] >= KEEPS,
        speeds,
    )
}
if rates:
    KEPT[
        "On the transposed view it beats the copy that reads one element per sector"
    ] = lambda: (frac["transposed"] > of_copy, beyond)
Claims("04 pointers, masks and strides", measured).check_all(KEPT)

# %%
# Tensor descriptors and block pointers
# -------------------------------------
# Triton's way to say "this tile of this strided tensor" is the *tensor
# descriptor*, made on the host (``TensorDescriptor``, as in lesson 09) or in
# the kernel (``tl.make_tensor_descriptor``, exercise 5); its
# ``load([row, col])`` returns the tile, zeros where it leaves the tensor.
# On Hopper a descriptor is what the :term:`TMA` copy engine reads.  Older
# code uses a *block pointer* (``tl.make_block_ptr``: base, shape, strides,
# the tile's offsets and shape in one value, ``boundary_check`` for the
# mask).  Triton 3.8 deprecated block pointers and 3.9 removed them; the
# lesson defines, runs and compiles its block pointer kernel only where
# :func:`tilebook.has_block_pointers` says this Triton has them.  Without
# them the checks and the compiled code below have no block pointer row.


@triton.jit
def scale_descriptor_kernel(
    x_desc, out_desc, alpha, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    start = [tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N]
    out_desc.store(start, x_desc.load(start) * alpha)


def scale_descriptor(x, alpha, bm=64, bn=64):
    M, N = x.shape
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    x_desc = TensorDescriptor(x, [M, N], list(x.stride()), [bm, bn])
    out_desc = TensorDescriptor(out, [M, N], list(out.stride()), [bm, bn])
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    scale_descriptor_kernel[grid](x_desc, out_desc, alpha, BLOCK_M=bm, BLOCK_N=bn)
    return out


BLOCK_POINTERS = tilebook.has_block_pointers()
print(f"Triton {triton.__version__} has block pointers: {BLOCK_POINTERS}")
if BLOCK_POINTERS:
    warnings.filterwarnings("ignore", message="tl.make_block_ptr is deprecated")

    @triton.jit
    def scale_block_ptr_kernel(
        x_ptr,
        out_ptr,
        M,
        N,
        stride_xm,
        stride_xn,
        stride_om,
        stride_on,
        alpha,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        start = (tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N)
        x_tile = tl.make_block_ptr(
            x_ptr, (M, N), (stride_xm, stride_xn), start, (BLOCK_M, BLOCK_N), (1, 0)
        )
        o_tile = tl.make_block_ptr(
            out_ptr, (M, N), (stride_om, stride_on), start, (BLOCK_M, BLOCK_N), (1, 0)
        )
        x = tl.load(x_tile, boundary_check=(0, 1))
        tl.store(o_tile, x * alpha, boundary_check=(0, 1))

# %%
# Pointers take any view; the copy engine is stricter.  A descriptor needs a
# 16-byte aligned base, strides that are multiples of 16 bytes and a last
# stride of one element, and ``TensorDescriptor`` refuses anything else.  A
# transposed operand goes through a descriptor of the tensor it is the
# transpose of, its tile transposed after the load (lesson 09's ``A_T``); a
# misaligned slice stays with pointers.  Then both ways are checked where
# they run (the interpreter emulates the copy engine; a GPU needs Hopper):

for name, v in views.items():
    try:
        TensorDescriptor(v, list(v.shape), list(v.stride()), [64, 64])
        print(f"{name}: accepted")
    except AssertionError as refusal:
        print(f"{name}: refused ({refusal})")
ways = CorrectnessReport("descriptors and block pointers vs float64")
if tilebook.is_interpreter() or tilebook.is_hopper():
    v = views["contiguous"]
    ways.check("descriptor, contiguous", scale_descriptor(v, ALPHA), ALPHA * v.double())
for name, v in views.items() if BLOCK_POINTERS else []:
    out = scale_2d(v, ALPHA, scale_block_ptr_kernel)
    ways.check(f"block pointer, {name}", out, ALPHA * v.double())
if ways.rows:  # none on a GPU older than Hopper under a Triton without block pointers
    ways.assert_ok()

# %%
# What the compiler made of it
# ----------------------------
# Triton compiles from what a launch tells it (lesson 02): an integer equal to
# one becomes a constant, arguments divisible by 16 are marked so.
# ``stride_xn == 1`` says a row is contiguous, so a thread can take neighbours
# in one wide load.  :func:`tilebook.course.experiments.memory_access.specialization`
# says what a launch on each view of the measured size tells it (on meta
# tensors), :func:`tilebook.course.aot.compile_many` compiles each for Hopper
# (``sm_90``) on any machine, beside ``strides unknown`` (``do_not_specialize``), the
# block pointer and the descriptor.  Counts are :term:`SASS` instructions per thread.

big = experiment.view_inputs(*experiment.VIEW_SHAPE, device="meta")
big_out = torch.empty(experiment.VIEW_SHAPE, device="meta")
TILE = {"BLOCK_M": 64, "BLOCK_N": 64}
args = {name: experiment.scale_2d_args(v, big_out, ALPHA) for name, v in big.items()}
jobs = {
    name: {"kernel": scale_2d_kernel, **experiment.specialization(a, constexprs=TILE)}
    for name, a in args.items()
}
strides = ["stride_xm", "stride_xn", "stride_om", "stride_on"]
unknown = experiment.specialization(
    args["contiguous"], constexprs=TILE, do_not_specialize=strides
)
jobs["strides unknown"] = {"kernel": scale_2d_kernel, **unknown}
if BLOCK_POINTERS:
    jobs["block pointer"] = {**jobs["contiguous"], "kernel": scale_block_ptr_kernel}
desc = f"tensordesc<fp32[{TILE['BLOCK_M']}, {TILE['BLOCK_N']}]>"
jobs["descriptor"] = {
    "kernel": scale_descriptor_kernel,
    "signature": {"x_desc": desc, "out_desc": desc, "alpha": "fp32"},
    "constexprs": TILE,
}
compiled = compile_many(jobs, arch=90, num_warps=experiment.NUM_WARPS)
WIDE = "LDG.E.128"
ops = ("LDG", WIDE, "STG", "STG.E.128", "STS", "UTMALDG", "UTMASTG")
seen = {
    name: {**k.instructions(*ops), "shared": k.shared_bytes, "registers": k.registers}
    for name, k in compiled.items()
}
COLUMNS = {"kernel": "kernel", "loads": "LDG", "16-byte loads": WIDE, "stores": "STG"}
COLUMNS |= {"16-byte stores": "STG.E.128", "TMA loads": "UTMALDG"}
COLUMNS |= {"shared memory bytes": "shared", "registers": "registers"}
AOT = f"compiled ahead of time for sm_90 by Triton {triton.__version__}"
TILES = "float32, {BLOCK_M} x {BLOCK_N} tiles, ".format(**TILE)
table([{"kernel": name, **c} for name, c in seen.items()], COLUMNS, caption=TILES + AOT)

# %%
# Read the rows against what each launch tells the compiler:
#
# - **contiguous**: 16-byte loads and stores (``LDG.E.128``, ``STG.E.128``),
#   four neighbouring elements per instruction.
# - **transposed**: ``stride_xm == 1``, so *columns* are contiguous.  Loads
#   run down the columns, 16 bytes wide, stores along the rows, the tile
#   changing hands through :term:`shared memory` in between: both sides
#   coalesced, which is how the transposed view can keep its speed.
# - **column slice**: rows start one element past a 16-byte boundary, the
#   row stride is no multiple of 16: no 16-byte load can be proven aligned,
#   one element per load (the stores, to the contiguous output, stay wide).
# - **strides unknown**: nothing says which way is contiguous: every load and
#   store moves one element, and the addresses take more
#   :term:`registers <register>`.
# - **block pointer** (only under a Triton that has them): the compiler turns
#   it back into the pointer arithmetic of the contiguous kernel.
# - **descriptor**: no thread loads at all.  ``UTMALDG`` is one instruction for
#   the whole tile, issued by one thread; the copy engine fills shared memory
#   and ``UTMASTG`` writes the result back the same way.

c, t, s, u, d = (seen[k] for k in (*args, "strides unknown", "descriptor"))
b = seen.get("block pointer")
SAID = {  # each claim on the compiled code, checked on the table's counts
    "The contiguous view loads and stores 16 bytes at a time, without shared memory": (
        c[WIDE] == c["LDG"] > 0 and c["STG.E.128"] == c["STG"] and c["shared"] == 0
    ),
    "The transposed view loads 16 bytes at a time too, through shared memory": (
        t[WIDE] == t["LDG"] > 0 and t["shared"] > 0 and t["STS"] > 0
    ),
    "The column slice and the unknown strides get no 16-byte loads": (
        s[WIDE] == 0 and u[WIDE] == 0 and u["STG.E.128"] == 0
    ),
    "Unknown strides take more registers than the contiguous view": (
        u["registers"] > c["registers"]
    ),
}
if b:
    SAID["The block pointer compiles to the pointer kernel's loads and stores"] = (
        b["LDG"] == c["LDG"] and b[WIDE] == c[WIDE] and b["UTMALDG"] == 0
    )
SAID["The descriptor moves its tiles with the copy engine, no thread loads"] = (
    d["UTMALDG"] > 0 and d["UTMASTG"] > 0 and d["LDG"] == d["STG"] == 0
)
code = Claims("04 pointers, masks and strides", AOT).check_all(SAID)
code

# %%
# Whether the copy engine makes a kernel faster is a question for a
# measurement, not for the SASS: lesson 09 uses it in a matrix product, whose
# threads have better things to do than address arithmetic.
#
# Try this
# --------
#
# 1. Write ``flip``: ``out[i] = x[n - 1 - i]``.  Check it with
#    ``print(check_elementwise(my_flip, lambda x: x.flip(0), inputs=1,
#    block=1024))`` (``from tilebook.course.exercises import check_elementwise``).
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def flip_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
#              offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
#              mask = offs < n
#              x = tl.load(x_ptr + (n - 1 - offs), mask=mask)
#              tl.store(out_ptr + offs, x, mask=mask)
#
#          def my_flip(x, out):
#              n = x.numel()
#              flip_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
#
#       The masked lanes compute negative offsets, and the mask keeps them
#       from touching memory.  The reads stay coalesced: neighbouring lanes
#       read neighbouring addresses, in descending order.
#
# 2. Write a transpose, ``out = x.T``, for any strided ``x``.  Check it on a
#    transposed input too:
#
#    .. code-block:: python
#
#       from tilebook.course.exercises import check
#       cases = {"contiguous": (torch.randn(70, 45, device=DEVICE),),
#                "transposed": (torch.randn(45, 70, device=DEVICE).t(),)}
#       print(check(my_transpose, lambda x: x.t(), cases, block=(64, 64)))
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          def my_transpose(x, out):
#              M, N = x.shape
#              grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
#              som, son = out.stride()
#              scale_2d_kernel[grid](x, out, M, N, *x.stride(), son, som, 1.0,
#                                    BLOCK_M=64, BLOCK_N=64)
#
#       Element ``(i, j)`` of ``x`` goes to ``(j, i)`` of ``out``: give the
#       kernel the output's strides swapped.  Strides describe any layout,
#       so the transpose needs no kernel of its own.
#
# 3. Delete the ``rows[:, None] < M`` half of the mask in ``scale_2d_kernel``
#    and check it: ``check(my_scale, lambda x: ALPHA * x, cases, block=(64,
#    64))``, with shapes with and without a multiple of 64 rows.  What does
#    the checker report, and why only for some shapes?
#
#    .. dropdown:: Solution
#
#       The last row of tiles stores rows past the end of ``out``, and the
#       checker reports writes past the end.  When ``M`` is a multiple of 64
#       no tile crosses the bottom edge and the missing half is never needed,
#       which is why ragged sizes are the ones worth testing.  The guards
#       around each tensor keep the missing mask from corrupting your session.
#
# 4. In the explorer, find for each dtype the smallest stride at which every
#    element costs a whole sector.
#
#    .. dropdown:: Solution
#
#       A sector holds ``32 / itemsize`` elements: int8 at stride 32, float16
#       at 16, float32 at 8, float64 at 4.  From there on the efficiency stays
#       at ``itemsize / 32``.
#
# 5. Build the descriptors in the kernel, ``tl.make_tensor_descriptor(base,
#    shape, strides, tile)``.  Check it as in exercise 3, on shapes whose rows
#    are multiples of 16 bytes (the copy engine requires it).  On a GPU, Triton
#    needs memory for the descriptors: ``triton.set_allocator(lambda size,
#    align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def scale_tma_kernel(x_ptr, out_ptr, M, N, sxm, som, alpha,
#                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
#              x_desc = tl.make_tensor_descriptor(x_ptr, [M, N], [sxm, 1],
#                                                 [BLOCK_M, BLOCK_N])
#              o_desc = tl.make_tensor_descriptor(out_ptr, [M, N], [som, 1],
#                                                 [BLOCK_M, BLOCK_N])
#              start = [tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N]
#              o_desc.store(start, x_desc.load(start) * alpha)
#
#          def my_scale(x, out):
#              M, N = x.shape
#              grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
#              scale_tma_kernel[grid](x, out, M, N, x.stride(0), out.stride(0),
#                                     ALPHA, BLOCK_M=64, BLOCK_N=64)
