"""
07. vector_add: your first complete kernel
==========================================

Adding two vectors is the "hello world" of GPU programming, and it is also a
complete lesson in what limits a memory-bound kernel.  We write the kernel,
launch it over a grid, handle the ragged tail with a mask, give it one
autotuning configuration, check it against PyTorch, time it with
``triton.testing.do_bench`` and read the result against the fastest thing the
memory system can do at all: a plain copy.

.. rubric:: You will learn

- what ``@triton.jit``, ``tl.program_id``, ``tl.arange``, ``tl.load`` and
  ``tl.store`` do in a kernel that owns one block of elements;
- how a grid of programs covers ``n`` elements, and why the last program needs a mask;
- how to attach a launch configuration with ``triton.autotune``;
- how to check a kernel against a float64 reference and time it properly;
- how to read GB/s against the copy bandwidth, and which launch settings waste it.

The finished kernel lives in the package as :func:`tilebook.vector_add`
(source: :mod:`tilebook.ops.vector_add`).
"""

# %%
# Setting up
# ----------
# Importing :mod:`tilebook` first matters: it decides whether this script runs
# on a CUDA GPU or on the CPU through Triton's interpreter, and that decision
# has to be made before Triton itself is imported.  The banner says which.
# :func:`tilebook.pick` then gives each problem size twice, once for the GPU and
# once for the interpreter, which executes every program one after another in
# Python and so needs sizes a few thousand times smaller.

import tilebook  # noqa: I001  (chooses GPU or interpreter before triton loads)

import torch
import triton
import triton.language as tl

from tilebook.aot import compile_kernel
from tilebook.bench import measure, record_or_measure
from tilebook.check import CorrectnessReport
from tilebook.plots import plot_record
from tilebook.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()

# %%
# The kernel
# ----------
# A Triton kernel is a Python function decorated with ``@triton.jit``.  It is
# never run as Python on a GPU: on its first call Triton parses it, compiles it
# for the types and constants of that call and caches the binary.  Every
# *program* (the Triton word for one instance of the kernel, scheduled on one
# streaming multiprocessor) executes the whole body on a *block* of data.
#
# The arguments:
#
# ``x_ptr``, ``y_ptr``, ``out_ptr``
#     Tensors arrive as pointers to their first element.  Triton reads the
#     element type from the tensor, so ``x_ptr + 3`` points three *elements*
#     further, not three bytes.
# ``n_elements``
#     How many elements there are.  The grid has to cover all of them, so the
#     last program usually owns a block that runs past the end.
# ``BLOCK_SIZE: tl.constexpr``
#     Elements per program.  ``tl.constexpr`` makes it a compile-time constant:
#     ``tl.arange`` needs one, and each value compiles its own binary.  Triton
#     blocks have power-of-two lengths.
# ``INT64_OFFSETS: tl.constexpr``
#     Offsets are 32-bit by default; a tensor of more than ``2**31 - 1``
#     elements would overflow them, so the launcher switches to 64-bit offsets
#     for those, and only those.
#
# Inside, ``tl.program_id(0)`` says which block this program owns,
# ``tl.arange(0, BLOCK_SIZE)`` is the vector ``0, 1, …, BLOCK_SIZE - 1``, and the
# mask ``offsets < n_elements`` switches off the lanes past the end: a masked
# lane neither reads nor writes memory.


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
# Launching it
# ------------
# A launch names the grid in square brackets: how many programs to start.  We
# need ``ceil(n / BLOCK_SIZE)`` of them, which ``triton.cdiv`` computes.
# ``num_warps`` is a launch option, not a kernel argument: how many warps of 32
# threads each program gets.  Triton spreads the block over those threads; it
# decides on its own how many elements each thread handles and whether it can
# load them 16 bytes at a time.


def add(x: torch.Tensor, y: torch.Tensor, block_size: int = 1024, num_warps: int = 4):
    out = torch.empty_like(x)
    n = out.numel()
    grid = (triton.cdiv(n, block_size),)
    add_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, INT64_OFFSETS=False, num_warps=num_warps)
    return out


n_small = 1000  # not a multiple of any block size: the last program is ragged
x = torch.rand(n_small, device=DEVICE)
y = torch.rand(n_small, device=DEVICE)
print("max |add(x, y) - (x + y)| =", (add(x, y) - (x + y)).abs().max().item())
print("programs launched with BLOCK_SIZE=256:", triton.cdiv(n_small, 256))

# %%
# One autotuning configuration
# ----------------------------
# ``triton.autotune`` takes a list of :class:`triton.Config` objects (values for
# the ``constexpr`` arguments plus launch options) and, on the first call for
# each value of ``key``, times them all and keeps the fastest.  With one config
# there is nothing to time: it simply attaches the launch settings to the
# kernel, so the launcher no longer passes them and the grid becomes a function
# of the chosen ``BLOCK_SIZE``.  This is how :func:`tilebook.vector_add` is
# built; its one config comes from the top of the sweep further down, where
# a dozen settings measured on an H100 lie within a couple of percent of each
# other.

tuned_add_kernel = triton.autotune(configs=[tilebook.ops.vector_add.DEFAULT_CONFIG], key=[])(
    add_kernel
)


def add_tuned(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    tuned_add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](
        x, y, out, n, INT64_OFFSETS=False
    )
    return out


print("tilebook's config:", tilebook.ops.vector_add.DEFAULT_CONFIG)
print("max |add_tuned - (x + y)| =", (add_tuned(x, y) - (x + y)).abs().max().item())

# %%
# Is it right?
# ------------
# We compare against the sum computed in float64 from the same inputs and
# report the largest absolute error and the norm-wise relative error.  The
# sizes are the awkward ones: a single element, a prime, one past a power of
# two, and a large size.  :class:`tilebook.check.CorrectnessReport` raises if any
# case misses its tolerance, so a wrong kernel stops the build of this page.
# (bfloat16 is checked only on a GPU: the interpreter computes bf16 wrongly.)

N = tilebook.pick(gpu=2**24 + 7, cpu=2**14 + 7)
dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if tilebook.is_gpu() else [])
report = CorrectnessReport("vector_add vs float64 reference")
for dtype in dtypes:
    for n in (1, 97, 4097, N):
        a = torch.randn(n, device=DEVICE, dtype=dtype)
        b = torch.randn(n, device=DEVICE, dtype=dtype)
        ref = a.double() + b.double()
        report.check(f"lesson kernel n={n}", add(a, b), ref)
        report.check(f"tilebook.vector_add n={n}", tilebook.vector_add(a, b), ref)
# A strided view: the package copies it to a contiguous layout first.
a = torch.randn(2 * N, device=DEVICE)[::2]
b = torch.randn(N, device=DEVICE)
report.check("strided x (every 2nd)", tilebook.vector_add(a, b), a.double() + b.double())
report.assert_ok()

# %%
# How fast can it be?
# -------------------
# Vector addition does one add per 12 bytes of float32 traffic (two 4-byte
# reads, one 4-byte write), far too little arithmetic to keep the GPU's units
# busy: its speed is set by memory bandwidth.  So we report GB/s, counting the
# bytes that *must* move, ``3 * n * 4``, and we hold it against two references
# measured in the same run: ``torch.add`` (PyTorch's own element-wise kernel)
# and a device-to-device copy of 1 GiB, which reads and writes every byte once
# and is as close to the memory system's ceiling as ordinary code gets.
#
# On a GPU the sweep below runs live with ``do_bench`` (median of many timed
# runs, with the 20th and 80th percentiles kept as spread) and is saved as a
# JSON record with its provenance.  On a CPU there is nothing meaningful to
# time, so :func:`tilebook.bench.record_or_measure` returns the record that was
# committed from a GPU run instead, and the plot says where it was measured.


def size_sweep():
    rows = []
    for exp in range(12, 29):
        n = 2**exp
        a = torch.rand(n, device="cuda")
        b = torch.rand(n, device="cuda")
        out = torch.empty_like(a)
        nbytes = 3 * n * a.element_size()
        impls = {
            "tilebook": lambda a=a, b=b, out=out: tilebook.vector_add(a, b, out=out),
            "torch.add": lambda a=a, b=b, out=out: torch.add(a, b, out=out),
        }
        for impl, fn in impls.items():
            m = measure(fn, bytes_moved=nbytes)
            rows.append({"n": n, "log2n": exp, "impl": impl, "dtype": "float32", **m.as_row()})
        del a, b, out
    return rows


sizes = record_or_measure("vector_add_sizes", "vector_add, float32: GB/s by size", size_sweep)
fig = plot_record(
    sizes,
    x="n",
    y="gbps",
    series="impl",
    logx=True,
    xlabel="elements (float32)",
    ylabel="GB/s (bytes read + written)",
    ceiling=sizes.provenance.get("copy_gbps") if sizes else None,
    ceiling_label="1 GiB device copy",
    name="vector_add_sizes",
)

# %%
# The numbers behind the plot, for the sizes large enough to fill the GPU:

if sizes is not None:
    print(sizes.caption())
    copy = sizes.provenance.get("copy_gbps")
    print(f"{'n':>10} {'tilebook GB/s':>14} {'torch.add GB/s':>15} {'ratio':>6} {'of copy':>8}")
    for exp in range(20, 29):
        (ours,) = sizes.select(log2n=exp, impl="tilebook")
        (theirs,) = sizes.select(log2n=exp, impl="torch.add")
        print(
            f"{'2^' + str(exp):>10} {ours['gbps']:14.0f} {theirs['gbps']:15.0f} "
            f"{ours['gbps'] / theirs['gbps']:6.3f} {ours['gbps'] / copy:8.1%}"
        )
else:
    print("No committed GPU record of this benchmark yet: nothing to show.")

# %%
# Small sizes are slow for every implementation: a launch costs a few
# microseconds whatever it does, and 4096 elements take far less than that to
# move.  From about a million elements on, the kernel is limited by memory
# bandwidth alone, and both Triton and PyTorch sit close to the copy line.
#
# Turning the knobs
# -----------------
# ``BLOCK_SIZE`` and ``num_warps`` decide how much work each thread gets.  With
# ``BLOCK_SIZE / (32 * num_warps)`` elements per thread: too few and each
# program does so little that scheduling overhead dominates and too few bytes
# are in flight; too many and the values no longer fit in registers, so the
# compiler spills them to (slow) local memory.  The widget below holds a sweep
# over both knobs on a 2**26-element float32 vector, measured on a GPU.  Move
# the sliders, or click a cell: some settings run at a fraction of the best.

SWEEP_N = 2**26
BLOCKS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
WARPS = [1, 2, 4, 8, 16]


def config_sweep():
    a = torch.rand(SWEEP_N, device="cuda")
    b = torch.rand(SWEEP_N, device="cuda")
    out = torch.empty_like(a)
    rows = []
    for block in BLOCKS:
        for warps in WARPS:
            m = measure(
                lambda block=block, warps=warps: tilebook.vector_add(
                    a, b, out=out, block_size=block, num_warps=warps
                ),
                bytes_moved=3 * SWEEP_N * 4,
            )
            per_thread = block / (32 * warps)
            rows.append(
                {
                    "BLOCK_SIZE": block,
                    "num_warps": warps,
                    "elements_per_thread": per_thread,
                    "detail": f"{per_thread:g} elements per thread",
                    **m.as_row(),
                }
            )
    return rows


sweep = record_or_measure(
    "vector_add_sweep", "vector_add, float32, 2^26 elements: GB/s by launch setting", config_sweep
)
if sweep is not None:
    widget = SweepExplorer(
        sweep.rows,
        knobs=["BLOCK_SIZE", "num_warps"],
        metric="gbps",
        unit="GB/s",
        title="vector_add: BLOCK_SIZE and num_warps against measured bandwidth",
        caption=sweep.caption(),
        initial={"BLOCK_SIZE": 1024, "num_warps": 4},
        ceiling=sweep.provenance.get("copy_gbps"),
        ceiling_label="the 1 GiB copy",
        slow_hint="too little work per thread, or so much that it spills out of registers.",
        extra="detail",
    )
else:
    widget = "No committed GPU record of the launch-setting sweep yet: nothing to show."
widget

# %%
# Why is the slow corner slow?  Read the compiled kernel
# ------------------------------------------------------
# Guessing is cheap, reading is better.  :func:`tilebook.aot.compile_kernel`
# compiles a kernel for an H100 (``sm_90``) without needing one, and reports
# what ``ptxas`` allocated.  Compare the tuned setting with 16384 elements on
# a single warp (512 per thread):

signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"}
for block, warps in [(1024, 4), (4096, 8), (16384, 1)]:
    k = compile_kernel(
        "tilebook.ops.vector_add:add_kernel",
        signature,
        {"BLOCK_SIZE": block, "INT64_OFFSETS": False},
        num_warps=warps,
        divisible_by_16=list(signature),
    )
    print(
        f"BLOCK_SIZE={block:5d} num_warps={warps:2d}: {k.registers} registers/thread, "
        f"{k.spill_stores_bytes} bytes spilled, {k.count(r'LDG.E.128')} 16-byte loads (LDG.E.128)"
    )

# %%
# Every setting loads 16 bytes per instruction, which is what coalesced,
# vectorised access looks like in SASS.  Only the single-warp, 16384-element
# program runs out of the 255 registers a thread may have and spills; the
# others differ in how much work is in flight per multiprocessor, which only a
# measurement can tell you.
#
# Try this
# --------
#
# 1. Write ``axpy``: ``out = alpha * x + y`` with ``alpha`` a Python float
#    passed as an ordinary (non-constexpr) argument.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK_SIZE: tl.constexpr):
#              offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
#              m = offs < n
#              x = tl.load(x_ptr + offs, mask=m)
#              y = tl.load(y_ptr + offs, mask=m)
#              tl.store(out_ptr + offs, alpha * x + y, mask=m)
#
#       Scalars become kernel arguments of type ``fp32``; Triton specialises on
#       a value of 1 for integers but not for floats, so any ``alpha`` reuses
#       one binary.
#
# 2. Launch ``add`` with ``block_size=1000``.  What happens, and why?
#
#    .. dropdown:: Solution
#
#       Compilation fails: ``tl.arange`` needs a power-of-two length.
#       :func:`tilebook.vector_add` checks this up front and raises a
#       ``ValueError`` instead.
#
# 3. In the widget, find the slowest setting with ``BLOCK_SIZE=128``.  How
#    many elements does each thread own there, and what does that say about
#    the bytes each multiprocessor has in flight?
#
#    .. dropdown:: Solution
#
#       With 16 warps, 128 elements are spread over 512 threads: most threads
#       own nothing at all (Triton replicates the block), every program moves
#       only 1.5 KiB, and the multiprocessors spend their time starting and
#       retiring programs instead of keeping loads in flight.
#
# 4. Time ``add`` on float16 inputs.  Does GB/s change?  Does time?
#
#    .. dropdown:: Solution
#
#       GB/s stays about the same (the kernel is bandwidth-bound whatever the
#       type) while the time halves, because half as many bytes move.
