"""
01. Why Triton: tiles, not threads
==================================

A GPU is fast when three things happen together: neighbouring threads read
neighbouring addresses (:term:`coalesced` access), data fetched from memory is
used many times from fast on-chip storage (:term:`registers <register>` and
:term:`shared memory`), and more work is in flight than the memory can answer
at once, so that waiting hides behind working.  In CUDA C++ all three are the
programmer's job, thread by thread.  Triton asks for less: you write what one
:term:`program` does to one :term:`tile` of the data, with whole-array
operations, and the compiler decides how the tile is spread over threads, how
wide each load is, what goes through shared memory and which tensor-core
instructions to use.

This lesson starts with the plainest reason to write a kernel at all: a chain
of PyTorch operations moves far more bytes than the work needs, and one fused
kernel does not.  We count the bytes, write the kernel, check it, time it, read
the Triton that ``torch.compile`` writes for the same function, and place
Triton among the other ways to program a GPU.

.. rubric:: You will learn

- why a chain of elementwise PyTorch operations is slow, counted in bytes;
- what a Triton kernel looks like: one program, one tile, loads and a store;
- how to check a kernel against PyTorch, and your own kernels with
  :func:`tilebook.course.exercises.check_elementwise`;
- that ``torch.compile`` writes Triton too, and what it wrote here;
- where Triton sits between PyTorch, ``torch.compile``, CUDA C++/CUTLASS and
  libraries, and where it falls short.

Lesson 02 explains programs and grids in full; lesson 07 builds the package's
first kernel, :func:`tilebook.vector_add`, in the same shape as the one here.
"""

# %%
# Setting up
# ----------
# Importing :mod:`tilebook` first decides whether this script runs on a CUDA
# GPU or on the CPU through Triton's interpreter; the banner says which.  What
# the page says of its measurements (tables, sentences, claims checked against
# the data) is made from the data by :mod:`tilebook.course.experiments.why_triton`
# (``experiment`` below).

import textwrap

import tilebook

import torch
import triton
import triton.language as tl

from tilebook.course.aot import compile_kernel
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.exercises import check_elementwise
from tilebook.course.experiments import why_triton as experiment
from tilebook.course.plots import plot_record
from tilebook.course.widgets_grid import ThreadsVsTilesExplorer

print(tilebook.banner())
DEVICE = tilebook.device()

# %%
# A chain of small operations
# ---------------------------
# The gate of a SwiGLU layer (the feed-forward block of LLaMA and many models
# since) multiplies ``x * sigmoid(x)`` by a second projection ``y``.  In
# PyTorch it is one line:


def swiglu_eager(x, y):
    return x * torch.sigmoid(x) * y


# %%
# On a GPU, each PyTorch operator is a kernel of its own: it reads its inputs
# from :term:`HBM`, the GPU's main memory, and writes its result back there.
# :func:`tilebook.course.experiments.why_triton.traffic` runs the line under a
# dispatch mode that sees every operator and counts the bytes of its tensor
# arguments and results:

x = torch.randn(4096, device=DEVICE)
y = torch.randn(4096, device=DEVICE)
ops = experiment.traffic(swiglu_eager, x, y)
experiment.traffic_table(ops, x)

# %%

least = experiment.least_traffic(x, y, x)  # read x and y once, write one result
experiment.say_traffic(ops, least, x.numel())

# %%
# There is far too little arithmetic per byte here (a sigmoid and two
# multiplications per element) to keep a GPU busy with anything but moving
# bytes, so the bytes should decide the time; the measurement below checks
# that.  The cure is one kernel for the whole chain, which keeps the
# intermediate values in registers.
#
# One kernel for the whole chain
# ------------------------------
# A Triton kernel is a Python function under ``@triton.jit``.  It does not run
# as Python: Triton compiles it for the GPU.  Many copies of it, the
# *programs*, run at once; each owns one tile of ``BLOCK`` consecutive
# elements.
#
# ``x_ptr``, ``y_ptr``, ``out_ptr``
#     Tensors arrive as pointers to their first element.
# ``n``
#     How many elements there are; the last tile usually runs past the end.
# ``BLOCK: tl.constexpr``
#     Elements per program, a constant fixed when the kernel is compiled.
#
# ``tl.program_id(axis=0)`` says which tile this program owns, ``offsets`` are
# the positions of its elements, and ``mask`` switches off the positions past
# the end.  The loads bring the whole tile into registers at once; the sigmoid
# and the products happen there; one store writes the result.  Nothing in
# between touches memory.


@triton.jit
def swiglu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, x * tl.sigmoid(x) * y, mask=mask)


# %%
# The launcher starts ``cdiv(n, BLOCK)`` programs (``n / BLOCK`` rounded up,
# so that every element has an owner) by naming the grid in square brackets.
# ``num_warps`` says how many :term:`warps <warp>` of
# :datasheet:`cuda.warp_size` each program gets.  Inputs of half precision
# are computed in float32 (the ``.to`` above) and stored back in the output's
# own type.

BLOCK = 1024
WARPS = 4


def swiglu(x, y, out):
    n = out.numel()
    grid = (triton.cdiv(n, BLOCK),)
    swiglu_kernel[grid](x, y, out, n, BLOCK=BLOCK, num_warps=WARPS)
    return out


# %%
# Is it right?
# ------------
# We compare with the same function computed in float64 from the same
# inputs, on awkward lengths: three elements, a prime, one past a multiple of
# the block, and a large odd length.  :class:`tilebook.course.check.CorrectnessReport`
# raises when a case misses its tolerance, so a wrong kernel stops the build of
# this page.  (bfloat16 is checked on a GPU only: the interpreter computes it
# wrongly.)

N = tilebook.pick(gpu=2**24 + 7, cpu=2**14 + 7)
dtypes = [torch.float32, torch.float16]
dtypes += [torch.bfloat16] if tilebook.is_gpu() else []
report = CorrectnessReport("swiglu vs float64 reference")
for dtype in dtypes:
    for n in (3, 97, 4097, N):
        a = torch.randn(n, device=DEVICE, dtype=dtype)
        b = torch.randn(n, device=DEVICE, dtype=dtype)
        out = swiglu(a, b, torch.empty_like(a))
        report.check(f"n={n}", out, swiglu_eager(a.double(), b.double()))
report.assert_ok()

# %%
# A report like this says *whether* a kernel is right.  When you write a kernel
# of your own in the exercises, you will also want to know *what* is wrong.
# :func:`tilebook.course.exercises.check_elementwise` runs a launcher that writes into
# ``out`` against a reference on five awkward lengths, on whatever machine you
# have, and names the elements, the programs that owned them, elements that
# nobody wrote and writes past the end of the output.  On our launcher:

check_elementwise(swiglu, swiglu_eager, block=BLOCK)

# %%
# And on a launcher with a common mistake, a grid of ``n // BLOCK`` programs
# (rounded down):


def swiglu_floor_grid(x, y, out):
    n = out.numel()
    swiglu_kernel[(n // BLOCK,)](x, y, out, n, BLOCK=BLOCK, num_warps=WARPS)


broken = check_elementwise(swiglu_floor_grid, swiglu_eager, block=BLOCK)
broken

# %%
# What the compiler did with the tile
# -----------------------------------
# We never said which thread handles which element, nor how wide a load is.
# :func:`tilebook.course.aot.compile_kernel` compiles the kernel ahead of time for
# Hopper, ``sm_90`` (on any machine, this one included) and reports what came out; lesson
# 03 walks through every stage.  We compile it as a launch with aligned
# tensors and a length divisible by 16 would (lesson 02 shows why that
# matters) and read the width of the loads in the machine code
# (:term:`SASS`).

SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
sass = compile_kernel(
    swiglu_kernel,
    SIGNATURE,
    {"BLOCK": BLOCK},
    arch=90,
    num_warps=WARPS,
    divisible_by_16=list(SIGNATURE),
)
wide = sass.count(r"LDG\.E\.128")
assert wide > 0, "expected 16-byte loads in the SASS"
experiment.say_loads(sass, wide, BLOCK, WARPS)

# %%
# Measured: bytes become time
# ---------------------------
# Each timing is one call of ``triton.testing.do_bench``: it runs the function
# many times, empties the :term:`L2` cache before each run, and returns the
# median time in milliseconds.
# :func:`tilebook.course.experiments.why_triton.fusion` checks the three ways
# to compute the gate against float64 (eager PyTorch, our kernel and
# ``torch.compile`` of ``swiglu_eager``), then times them with ``time_ms`` in
# interleaved rounds over vector lengths.  The plot shows *useful* bandwidth:
# the least traffic divided by the time, so that a method moving extra bytes
# shows as slow.  The dashed line is a plain copy of a large buffer measured in
# the same run, the fastest any kernel moves bytes.  On a CPU the plot shows
# the record of a GPU run, and its caption says where.


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def measure_fusion():
    return experiment.fusion(swiglu_eager, swiglu, timer=time_ms)


fusion = record_or_measure(
    "lesson01_fusion", "SwiGLU gate, float32: useful GB/s by length", measure_fusion
)
copy = fusion.provenance["copy_gbps"]
fig = plot_record(
    fusion,
    x="n",
    y="gbps",
    series="impl",
    logx=True,
    xlabel="elements (float32)",
    ylabel="GB/s (least traffic / time)",
    ceiling=copy,
    ceiling_label="device-to-device copy",
    order=["Triton", "torch.compile", "eager"],
    name="lesson01_fusion",
)

# %%
# The same rows as a table: times, and how much faster the fused kernel is
# than eager PyTorch beside how many more bytes eager moves.

experiment.fusion_table(fusion)

# %%
# What the data say, checked on the rows above.  *Close* means within
# ``NEAR`` of the ratio or of the copy.  A ratio of two timings comes with its
# :term:`spread` (p20-p80), and *faster* holds only beyond it.

NEAR = 0.2
said = experiment.fusion_claims(fusion, NEAR)
Claims("01 why Triton", fusion).check_all(said)

# %%
# The time follows the bytes.  ``torch.compile`` fuses the chain too:

experiment.say_versus_compile(fusion)

# %%
# Why the smallest lengths stay far below the copy line (the last check above,
# on a GPU's data): a few hundred kilobytes take less time to move than it
# takes to launch kernels and run the Python around them.
#
# What torch.compile writes
# -------------------------
# ``torch.compile`` traces a function into a graph, and its backend, Inductor,
# generates code for the graph: on a GPU, Triton kernels.  For
# ``swiglu_eager``, :func:`tilebook.course.experiments.why_triton.inductor_code`
# compiles it with Inductor's caches off and keeps the Triton source it wrote
# (on a GPU live; on a CPU the text recorded on a GPU, which the caption
# names).  Here is the kernel, from its ``@triton.jit`` on:

inductor = record_or_measure(
    "lesson01_inductor",
    "the Triton kernels torch.compile wrote for swiglu_eager",
    lambda: experiment.inductor_code(swiglu_eager),
)
print(textwrap.fill(inductor.caption(), 79))
for k in inductor.rows:
    print(experiment.kernel_text(k["source"]))

# %%
# The decorator above ``@triton.jit`` (cut here) is Inductor's own launcher,
# which picks ``XBLOCK`` when the kernel first runs.  The rest is the kernel we
# wrote, in other names: ``xoffset`` is ``pid * BLOCK``, ``xmask`` our mask,
# and the ``tmp`` values live in registers.

Claims("01 why Triton", inductor).check_all(experiment.inductor_claims(inductor))

# %%
# Where Triton sits
# -----------------
# There are five common ways to get work onto an NVIDIA GPU.  They differ in
# what you write and in what a tool decides for you:

experiment.ways_table()

# %%
# Triton gives up some control for a lot of brevity, and the control it gives
# up is sometimes the part that matters:
#
# - **Irregular, sparse access.**  A tile is a dense block.  Gathers through
#   data-dependent indices (sparse matrices, graph neighbours, embedding bags)
#   read scattered addresses that no tiling makes coalesced.
# - **Reductions over many axes.**  A program reduces along the axes of its own
#   tile.  Reducing over several dimensions of a large tensor, or across
#   programs, means reshaping, several kernels or atomics (lesson 06).
# - **Hand-scheduled Hopper pipelines.**  The fastest Hopper kernels give
#   different warps different jobs (some copy with :term:`TMA`, some run
#   :term:`wgmma`) and time them against each other by hand.  Triton chooses
#   such schedules itself, with a few knobs; CUTLASS and CuTe let you write
#   them.
# - **Harder debugging.**  A kernel is compiled through several languages
#   (lesson 03); an error can surface far from its cause, and a wrong index
#   reads garbage instead of raising.  The interpreter, which runs this page on
#   a CPU, is the best tool there is: it runs the kernel as NumPy.
# - **Compile time.**  Every new specialisation of a kernel is compiled on its
#   first call (lesson 02 measures it).
#
# Threads vs tiles
# ----------------
# In CUDA C++ the kernel above would be written for *one thread*, which finds
# its element from its block and thread indices, and launched with one thread
# per element.  In Triton the unit is the program, which owns ``BLOCK``
# elements; how those are split among its threads is the compiler's business.
# Either way the grid must cover the data.  A grid of one program per element,
# a habit carried over from CUDA, is correct with a mask but launches
# ``BLOCK`` times too many programs;
# :func:`tilebook.course.experiments.why_triton.grid_waste` times what that costs.


def swiglu_on(x, y, out, programs):
    swiglu_kernel[(programs,)](x, y, out, out.numel(), BLOCK=BLOCK, num_warps=WARPS)


def measure_waste():
    return experiment.grid_waste(swiglu_on, BLOCK, eager=swiglu_eager, timer=time_ms)


waste = record_or_measure(
    "lesson01_grid",
    "swiglu_kernel, float32: the grid it needs against one program per element",
    measure_waste,
)
Claims("01 why Triton", waste).check_all(experiment.waste_claims(waste))

# %%
# The widget cuts ``N`` elements into programs by three grid rules.
# ``cdiv(N, BLOCK)`` is right; ``N // BLOCK`` leaves the ragged end with no
# owner (drawn hatched, and exactly what the checker reported above);
# ``N`` launches programs that own nothing.

experiment.check_explorer(broken, BLOCK)
ThreadsVsTilesExplorer(**experiment.explorer(waste, BLOCK, WARPS))

# %%
# Try this
# --------
# Each exercise that asks for a kernel ends with the line that checks it.
#
# 1. Write the GeGLU gate with the sigmoid approximation of GELU,
#    ``x * sigmoid(1.702 * x) * y``, as one kernel.  Check it with
#    ``check_elementwise(geglu, lambda x, y: x * torch.sigmoid(1.702 * x) * y,
#    block=1024)``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def geglu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
#              offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
#              m = offs < n
#              x = tl.load(x_ptr + offs, mask=m).to(tl.float32)
#              y = tl.load(y_ptr + offs, mask=m).to(tl.float32)
#              tl.store(out_ptr + offs, x * tl.sigmoid(1.702 * x) * y, mask=m)
#
#          def geglu(x, y, out):
#              n = out.numel()
#              geglu_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
#
# 2. Add a residual: ``x * sigmoid(x) * y + z``.  Count eager's traffic with
#    ``experiment.traffic`` and compare it with the least traffic of three
#    inputs and one output.  Then write the kernel and check it with
#    ``check_elementwise(fn, lambda x, y, z: x * torch.sigmoid(x) * y + z,
#    inputs=3, block=1024)``.
#
#    .. dropdown:: Solution
#
#       Eager runs one more kernel, which reads the product and ``z`` and
#       writes the sum: four kernels, while the least traffic grows only by
#       ``z``.  The longer the chain, the more fusion saves.  The kernel
#       takes a fourth pointer and loads ``z`` like ``y``:
#
#       .. code-block:: python
#
#          z = tl.load(z_ptr + offs, mask=m).to(tl.float32)
#          tl.store(out_ptr + offs, x * tl.sigmoid(x) * y + z, mask=m)
#
# 3. Delete ``mask=mask`` from the store of ``swiglu_kernel`` (keep it on the
#    loads) and run ``check_elementwise(swiglu, swiglu_eager, block=1024)``.
#    Which lengths fail, and why not all of them?
#
#    .. dropdown:: Solution
#
#       The checker reports writes past the end of ``out`` by the last
#       program at every length that is not a multiple of ``BLOCK``: its
#       lanes past ``n`` store too.  At ``n=1024`` the last tile ends exactly
#       at ``n``, so nothing is written out of bounds, which is why a test on
#       round sizes alone never finds this bug.
#
# 4. Launch with one program per element, ``swiglu_on(x, y, out, n)``.  Does
#    the checker complain?  What do the widget and the measurement say?
#
#    .. dropdown:: Solution
#
#       The result is right (the mask switches off every program past the
#       last tile), so ``check_elementwise(lambda x, y, out: swiglu_on(x, y,
#       out, out.numel()), swiglu_eager)`` passes.  It is slow: the widget's
#       ``N`` rule shows how many programs own nothing, and the measurement
#       above what they cost.  A correct kernel is not yet a good one.
