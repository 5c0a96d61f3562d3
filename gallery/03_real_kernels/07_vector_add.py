"""
07. vector_add: your first complete kernel
==========================================

Adding two vectors is the smallest kernel worth writing, and a complete one: a
kernel, a grid of programs that covers any length, a mask for the ragged end,
a launch setting, a check against PyTorch, and a measurement read against the
practical ceiling of the memory, a plain copy.  We write the smallest
correct kernel first, measure it, and then add the two things the package's
kernel has on top: a launch setting chosen from a measured sweep, and 64-bit
offsets for vectors of more than ``2**31`` elements.

.. rubric:: You will learn

- what ``@triton.jit``, ``tl.program_id``, ``tl.arange``, ``tl.load`` and
  ``tl.store`` do in a kernel that owns one block of elements;
- how a grid covers ``n`` elements, and why the last program needs a mask;
- how to check a kernel against a float64 reference;
- how to time it with ``do_bench`` and read GB/s against the copy bandwidth,
  and how to tell a call's host time from its GPU time;
- which launch settings are slow, and how the compiled code shows why;
- how one ``triton.autotune`` configuration and 64-bit offsets make the
  teaching kernel into the package's.

The finished kernel is :func:`tilebook.vector_add` (source:
:mod:`tilebook.ops.vector_add`).
"""

# %%
# Setting up
# ----------
# Importing :mod:`tilebook` first matters: it decides whether this script runs
# on a CUDA GPU or on the CPU through Triton's interpreter, and that decision
# has to be made before Triton itself is imported.  The banner says which.
# What the page says of its measurements (tables, sentences, claims checked
# against the data) is made from the data by
# :mod:`tilebook.course.experiments.vector_add` (``experiment`` below).

import tilebook

import torch
import triton
import triton.language as tl

from tilebook.course.aot import compile_many
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.experiments import vector_add as experiment
from tilebook.ops.vector_add import DEFAULT_CONFIG
from tilebook.course.plots import plot_record
from tilebook.course.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()

# %%
# The kernel
# ----------
# A Triton kernel is a Python function decorated with ``@triton.jit``.  It never
# runs as Python on a GPU: on its first call Triton compiles it for the types and
# constants of that call and caches the binary.  Each :term:`program` (one
# instance of the kernel, run on one :term:`SM`) executes the whole body on
# one *block* of the data.
#
# ``x_ptr``, ``y_ptr``, ``out_ptr``
#     Tensors arrive as pointers to their first element.  Triton knows the
#     element type, so ``x_ptr + 3`` points three *elements* further.
# ``n_elements``
#     How many elements there are.  The last program usually owns a block that
#     runs past the end.
# ``BLOCK_SIZE: tl.constexpr``
#     Elements per program.  ``tl.constexpr`` makes it a compile-time constant:
#     ``tl.arange`` needs one (of a power-of-two length), and each value
#     compiles its own binary.
#
# ``tl.program_id(0)`` says which block this program owns, ``tl.arange(0,
# BLOCK_SIZE)`` is the vector ``0, 1, ..., BLOCK_SIZE - 1``, and the mask
# ``offsets < n_elements`` switches off the lanes past the end: a masked lane
# neither reads nor writes memory.


@triton.jit
def plain_add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


# %%
# Launching it
# ------------
# A launch names the grid in square brackets: how many programs to start.  We
# need ``cdiv(n, BLOCK_SIZE)`` of them, the division rounded up.  ``num_warps``
# is a launch option, not a kernel argument: how many :term:`warps <warp>` of
# :datasheet:`cuda.warp_size` each program gets.  Triton spreads the block over
# those threads and decides on its own how many neighbouring elements each
# thread handles.


def add(x, y, block_size=1024, num_warps=4):
    out = torch.empty_like(x)
    n = out.numel()
    grid = (triton.cdiv(n, block_size),)
    plain_add_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, num_warps=num_warps)
    return out


x = torch.rand(3000, device=DEVICE)  # not a multiple of the block: a ragged end
y = torch.rand(3000, device=DEVICE)
print("programs launched:", triton.cdiv(x.numel(), 1024))
print("max |add(x, y) - (x + y)| =", (add(x, y) - (x + y)).abs().max().item())

# %%
# Is it right?
# ------------
# We compare with the sum computed in float64 from the same inputs: the largest
# absolute error and the norm-wise relative error.  The sizes are the awkward
# ones: three elements, a prime, one past a power of two, and a large odd size.
# :class:`tilebook.course.check.CorrectnessReport` raises when a case misses its
# tolerance, so a wrong kernel stops the build of this page.  (bfloat16 is
# checked on a GPU only: the interpreter computes it wrongly.)

N = tilebook.pick(gpu=2**24 + 7, cpu=2**14 + 7)
dtypes = [torch.float32, torch.float16]
dtypes += [torch.bfloat16] if tilebook.is_gpu() else []
report = CorrectnessReport("vector_add vs float64 reference")
for dtype in dtypes:
    for n in (3, 97, 4097, N):
        a = torch.randn(n, device=DEVICE, dtype=dtype)
        b = torch.randn(n, device=DEVICE, dtype=dtype)
        report.check(f"n={n}", add(a, b), a.double() + b.double())
report.assert_ok()

# %%
# How fast can it be?
# -------------------
# Vector addition does one add for every three elements it moves (two read,
# one written): far too little arithmetic to keep the GPU busy, so memory
# bandwidth sets its speed.  We count the bytes that *must* move, ``3 * n``
# elements, and divide by the time: GB/s.  The ceiling is not the memory
# (:term:`HBM`) bandwidth of the datasheet (:datasheet:`gpu.memory_bandwidth` for
# the GPU this page speaks for) but a device-to-device copy of a large buffer
# measured in the same run, which reads and writes every byte once.  It is the practical ceiling, not
# a hard one: the copy is timed once, on its own buffers and apart from the
# kernels, so a kernel that moves each byte once can end up within a few
# percent of it on either side (the claims below bound how far above).
#
# :mod:`tilebook.course.experiments.vector_add` times :func:`tilebook.vector_add` (the
# kernel above, launched with the package's setting: where that comes from is
# the next section) against ``torch.add`` with ``time_ms`` below, one call of
# ``triton.testing.do_bench``, which empties the :term:`L2` cache before each
# call and reports the median of many calls.  The two run in interleaved
# rounds, so the p20-p80 :term:`spread` includes the drift of the GPU's
# clocks.  On a CPU,
# :func:`tilebook.course.bench.record_or_measure` shows the record committed from a GPU
# run instead, and the plot says where it was measured.


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


sizes = record_or_measure(
    "lesson07_sizes",
    "vector_add, float32: GB/s by size",
    lambda: experiment.sizes(timer=time_ms),
)
copy = sizes.provenance["copy_gbps"]
fig = plot_record(
    sizes,
    x="n",
    y="gbps",
    series="impl",
    logx=True,
    xlabel="elements (float32)",
    ylabel="GB/s (bytes read + written)",
    ceiling=copy,
    ceiling_label="device-to-device copy",
)

# %%
# The same data as a table.  The last column compares tilebook with torch.add:
# "ahead" or "behind" where the ratio of their times stays on one side of 1
# across the spread of the rounds and differs from 1 by more than the noise floor
# (``tilebook.course.claims.MIN_NOISE``); "tie" otherwise.

experiment.sizes_table(sizes)

# %%
# What the data say, checked on the data above.  *Close to the copy line*
# means at least ``NEAR_COPY`` of the copy's rate, and *a few percent* above it
# at most ``ABOVE_COPY``; the smallest sizes are the first three of the sweep.

NEAR_COPY = 0.9
ABOVE_COPY = 0.05
said = experiment.sizes_claims(sizes, NEAR_COPY, ABOVE_COPY)
Claims("07 vector_add", sizes).check_all(said)

# %%

experiment.say_sizes(sizes, NEAR_COPY)

# %%
# Host time or GPU time?
# ----------------------
# ``do_bench`` times a call between two CUDA events on the GPU.  If the host is
# still preparing a launch when the GPU gets to it, the GPU waits, and the wait
# is timed too.  So at the sizes short of the largest, where tilebook may
# trail, the experiment splits each call in two
# (:func:`~tilebook.course.experiments.vector_add.host_and_gpu`): its *host* time,
# from many calls issued back to back without waiting for the GPU, and its
# *GPU* time, from ``triton.testing.do_bench_cudagraph``, which records the
# calls once as a CUDA graph and replays them with no host work at all.  The
# do_bench times are in the table above.

experiment.split_table(sizes)

# %%
# What the split says, checked on the data above.  Where tilebook trails, its
# *gap* is the difference of the two do_bench medians.  A part of the call (the
# kernel alone on the GPU, or the host's work) *explains* the gap when
# tilebook's is longer by at least ``EXPLAINS`` of it at the *nearest ends* of
# the two p20-p80 spreads, the ends that make the difference smallest
# (:func:`~tilebook.course.experiments.vector_add.explain_gap`): a part that differs
# by much less than the gap cannot account for it.
# :func:`~tilebook.course.experiments.vector_add.read_split` checks these claims
# and says what the split shows.

EXPLAINS = experiment.EXPLAINS
split_claims = Claims("07 vector_add", sizes)
verdict = experiment.read_split(sizes, split_claims)
split_claims

# %%

verdict

# %%
# A program runs on one SM: with fewer programs than SMs, some SMs have nothing
# to do.  No launch setting makes a tiny vector fast, since the launch costs
# the same whatever the kernel does; a small addition is better fused into the
# kernel that produces its inputs (lesson 08 fuses an activation into a matrix
# product).
#
# Turning the knobs
# -----------------
# ``BLOCK_SIZE`` and ``num_warps`` decide how the work is cut: how many programs
# there are, and how many elements each thread owns, ``BLOCK_SIZE / (32 *
# num_warps)``.  :func:`tilebook.course.experiments.vector_add.launch_settings` times
# a grid of both on a vector of ``2**26`` float32 elements, all settings in the
# same interleaved rounds.  Move the sliders or click a cell: the settings
# flagged *slow* run below ``SLOW`` of the best one, and their notes say why.

SLOW = 0.9
sweep = record_or_measure(
    "lesson07_launch",
    "vector_add, float32, 2^26 elements: GB/s by launch setting",
    lambda: experiment.launch_settings(timer=time_ms),
)
best = max(r["gbps"] for r in sweep.rows)
slow = [r for r in sweep.rows if r["gbps"] < SLOW * best]
smallest = min(sweep.values("BLOCK_SIZE"))
block = DEFAULT_CONFIG.kwargs["BLOCK_SIZE"]
chosen = {"BLOCK_SIZE": block, "num_warps": DEFAULT_CONFIG.num_warps}

# %%
# Before explaining the slow settings, read what the compiler made of them.
# :func:`tilebook.course.aot.compile_many` compiles the package's kernel (the one
# timed) for Hopper (``sm_90``) on any machine: here at the package's setting, at the
# smallest block, at the setting with the least work per thread, and at every
# slow setting that neither of the last two explains.  ``ptxas`` reports the
# :term:`registers <register>` and :term:`spills <spill>` of each, and the
# :term:`SASS` shows how wide the loads are.

unexplained = [
    r for r in slow if r["BLOCK_SIZE"] != smallest and r["elements_per_thread"] >= 1
]
shown = [
    sweep.one(**chosen),
    sweep.one(BLOCK_SIZE=smallest, num_warps=1),
    min(sweep.rows, key=lambda r: r["elements_per_thread"]),
    *unexplained,
]
SIGNATURE = dict.fromkeys(("x_ptr", "y_ptr", "out_ptr"), "*fp32") | {
    "n_elements": "i32"
}
compiled = compile_many(
    {
        r["setting"]: {
            "constexprs": {"BLOCK_SIZE": r["BLOCK_SIZE"], "INT64_OFFSETS": False},
            "num_warps": r["num_warps"],
        }
        for r in shown
    },
    kernel="tilebook.ops.vector_add:add_kernel",
    signature=SIGNATURE,
    divisible_by_16=list(SIGNATURE),
)
experiment.compiled_table(shown, compiled, best)

# %%
# A load of four neighbouring float32 values is one 16-byte instruction
# (``LDG.E.128``), the widest there is; a thread that owns fewer elements loads
# them in narrower pieces.  Three kinds of setting are slow, and each slow row
# of the widget says which kind it is:
#
# - **the smallest block**: so many programs, each with so little work, that
#   the cost is per program.  One warp or two make no difference there, and
#   the compiled code is as clean as the package's.
# - **more threads than elements**: threads load copies of each other's
#   elements, one element at a time.
# - **spills**: so many elements per thread that they do not fit in the
#   registers, and ``ptxas`` spills them to local memory, which lives in HBM.

SweepExplorer(**experiment.explorer(sweep, compiled, copy, SLOW, chosen))

# %%
# The claims of this section, checked on the sweep and the compiled code.
# *Among the best* means within ``NEAR_BEST`` of the fastest setting.

NEAR_BEST = 0.95
said = experiment.launch_claims(sweep, compiled, shown, SLOW, NEAR_BEST, chosen)
Claims("07 vector_add", sweep).check_all(said)

# %%
# What the package adds
# ---------------------
# Two things turn the teaching kernel into :func:`tilebook.vector_add`: offsets
# that stay correct past ``2**31`` elements, and the launch setting above.
#
# ``tl.program_id`` is a 32-bit integer, and so is ``pid * BLOCK_SIZE``.  A
# float32 vector of ``2**31`` elements fits on a large GPU, and there the last
# programs' offsets no longer fit in 32 bits.  The arithmetic of the last
# program for a vector a little past that size, with the package's block:

n_huge = 2**31 + 5
last = triton.cdiv(n_huge, block) - 1
print(f"last program: {last:,}")
for bits in (torch.int32, torch.int64):
    first = (torch.tensor(last, dtype=bits) * block).item()
    print(f"its first offset as {bits}: {first:,}")

# %%
# The 32-bit offset wraps around to a large negative number, which passes the
# mask ``offsets < n_elements``: the program would read and write memory
# *before* the tensors, silently.  The package's kernel computes ``pid`` in 64
# bits when the launcher asks for it with one more ``constexpr`` flag.  Being a
# ``constexpr``, the flag costs the usual sizes nothing: ``if INT64_OFFSETS``
# is decided at compile time, and the 32-bit binary holds no trace of it.  This
# is the package's kernel, in full (a test keeps the two the same):


@triton.jit
def add_kernel(
    x_ptr,  # pointer to the first element of x
    y_ptr,  # pointer to the first element of y
    out_ptr,  # pointer to the first element of the output
    n_elements,  # how many elements in all
    BLOCK_SIZE: tl.constexpr,  # elements per program; a power of two
    INT64_OFFSETS: tl.constexpr,  # True when offsets may pass 2**31 - 1
):
    pid = tl.program_id(axis=0)
    if INT64_OFFSETS:
        pid = pid.to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


# %%
# One autotuning configuration
# ----------------------------
# Outside the three kinds of slow setting, the grid is a plateau: any of its
# settings would do (the claims above).  The package takes one from it and
# attaches it with ``triton.autotune``.  Given a list of :class:`triton.Config` objects
# (values of ``constexpr`` arguments plus launch options), the autotuner times
# them all on the first call for each value of ``key`` and keeps the fastest.
# With one config there is nothing to time: the launcher no longer passes
# ``BLOCK_SIZE`` or ``num_warps``, and the grid becomes a function of the
# chosen ``BLOCK_SIZE``.  The launcher asks for 64-bit offsets exactly when the
# last program's offsets could pass ``2**31 - 1`` (exercise 3 asks why it adds
# ``BLOCK_SIZE``).  This is what :func:`tilebook.vector_add` runs, after
# checking its inputs.

print(f"the package's config: BLOCK_SIZE={block}, num_warps={DEFAULT_CONFIG.num_warps}")
tuned_add_kernel = triton.autotune(configs=[DEFAULT_CONFIG], key=[])(add_kernel)


def vector_add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    int64 = n + DEFAULT_CONFIG.kwargs["BLOCK_SIZE"] >= 2**31
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
    tuned_add_kernel[grid](x, y, out, n, INT64_OFFSETS=int64)
    return out


final = CorrectnessReport("the final kernel vs float64 reference")
for n in (97, N):
    a, b = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    ref = a.double() + b.double()
    final.check(f"vector_add n={n}", vector_add(a, b), ref)
    out = torch.empty_like(a)
    grid = (triton.cdiv(n, 1024),)
    add_kernel[grid](a, b, out, n, BLOCK_SIZE=1024, INT64_OFFSETS=True)
    final.check(f"64-bit offsets n={n}", out, ref)
final.assert_ok()

# %%
# Try this
# --------
#
# Each exercise that asks for a kernel ends with the line that checks it
# (``from tilebook.course.exercises import check_elementwise``).
#
# 1. Write ``axpy``: ``out = alpha * x + y`` with ``alpha`` a Python float
#    passed as an ordinary (non-``constexpr``) argument.  Check it with
#    ``check_elementwise(axpy, lambda x, y: 2.5 * x + y, block=1024)``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
#              offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
#              m = offs < n
#              x = tl.load(x_ptr + offs, mask=m)
#              y = tl.load(y_ptr + offs, mask=m)
#              tl.store(out_ptr + offs, alpha * x + y, mask=m)
#
#          def axpy(x, y, out, alpha=2.5):
#              n = out.numel()
#              axpy_kernel[(triton.cdiv(n, 1024),)](x, y, out, alpha, n, BLOCK=1024)
#
#          print(check_elementwise(axpy, lambda x, y: 2.5 * x + y, block=1024))
#
#       A float becomes a kernel argument of type ``fp32``.  Triton specialises
#       integer arguments equal to one (and notes those divisible by 16) but
#       not floats, so every ``alpha`` reuses one binary.
#
# 2. Launch ``add`` with ``block_size=1000``.  What happens, and why?  Check
#    it with ``check_elementwise(lambda x, y: add(x, y, block_size=1000),
#    torch.add)``.
#
#    .. dropdown:: Solution
#
#       Compilation fails, and the checker says why: ``tl.arange`` needs a
#       power-of-two length.  :func:`tilebook.vector_add` checks this first
#       and raises a ``ValueError`` instead.
#
# 3. The launcher switches to 64-bit offsets when ``n + BLOCK_SIZE >= 2**31``,
#    not when ``n >= 2**31``.  Why add ``BLOCK_SIZE``?
#
#    .. dropdown:: Solution
#
#       The masked lanes compute their offsets too.  The last program's lanes
#       reach ``cdiv(n, BLOCK_SIZE) * BLOCK_SIZE - 1``, up to ``BLOCK_SIZE - 1``
#       past ``n``.  If those wrapped around to negative numbers they would
#       pass the mask ``offsets < n_elements`` and touch memory before the
#       tensor.
#
# 4. In the table of compiled code, the setting with the least work per
#    thread has no 16-byte loads.  How many elements must each thread own for
#    its loads to be 16 bytes wide, in float32 and in float16?  Which
#    ``BLOCK_SIZE`` gives that with ``num_warps=4``?
#
#    .. dropdown:: Solution
#
#       Four float32 or eight float16 values make 16 bytes, so
#       ``BLOCK_SIZE / (32 * num_warps)`` must be at least four (float32) or
#       eight (float16): with ``num_warps=4``, ``BLOCK_SIZE=512`` or
#       ``BLOCK_SIZE=1024``.  Check it with :func:`tilebook.course.aot.compile_many`
#       and the signature ``{"x_ptr": "*fp16", ...}``.
