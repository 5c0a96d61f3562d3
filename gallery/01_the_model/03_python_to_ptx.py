"""
03. From Python to PTX: what the compiler makes of a kernel
===========================================================

A ``@triton.jit`` function never runs as Python on a GPU.  On its first call
Triton passes it down a chain of compilers, and every link of the chain leaves
a text you can read.  Reading them is how you learn what a kernel really does:
whether its loads are wide, which instruction a ``tl.dot`` became, how many
:term:`registers <register>` and how much :term:`shared memory` one program
holds.  This lesson compiles lesson 02's ``scale_kernel`` for Ampere
(``sm_80``, an A100's) and Hopper (``sm_90``, an H100's or H200's) on whatever
machine builds this page, no GPU needed, reads every stage, follows one
``tl.load`` down to the instruction that reads memory, and names the compiler
passes that did the work.

.. rubric:: You will learn

- the stages: Python AST, Triton IR (TTIR), TritonGPU IR with layouts (TTGIR),
  LLVM IR, :term:`PTX`, the cubin that ``ptxas`` assembles, and its
  :term:`SASS`;
- how to compile a kernel for a GPU you do not have, and which lines of every
  stage came from one line of Python (:func:`tilebook.course.aot.compile_kernel`);
- where :term:`coalescing <coalesced>`, layout conversion, tensor-core
  selection and pipelining happen, read from the passes that ran;
- how a masked ``tl.load`` becomes a predicated 16-byte load, and what keeps a
  load narrow;
- where the registers and the shared memory of a program are recorded;
- Triton's cache, and the settings of ``triton.knobs`` that move, bypass or
  dump it.

The tools used here are :mod:`tilebook.course.aot` (every stage and its source lines)
and :mod:`tilebook.course.passes` (the passes); kernels written for the exercises are
checked by :func:`tilebook.course.exercises.check_elementwise`.
"""

# %%
# Setting up
# ----------
# What the page says of its compiles (tables, sentences, claims checked against
# the builds) is made from the builds by :mod:`tilebook.course.experiments.stages`.

import tilebook

import re
import textwrap

import torch
import triton
import triton.language as tl

from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.exercises import check_elementwise
from tilebook.course.experiments import stages
from tilebook.course.passes import compile_with_passes
from tilebook.course.widgets_stages import StageViewer

print(tilebook.banner())
DEVICE = tilebook.device()

# %%
# The kernel
# ----------
# Lesson 02's kernel, unchanged: each :term:`program` scales ``BLOCK``
# consecutive elements by ``alpha``, under a mask for the ragged end.


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x, mask=mask)


def scale(x, alpha=2.0, block=1024, warps=4):
    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, block),)](
        x, out, n, alpha, BLOCK=block, num_warps=warps
    )
    return out


report = CorrectnessReport("scale_kernel vs float64 reference")
for n in (1, 97, 4100, tilebook.pick(gpu=2**24 + 5, cpu=2**14 + 5)):
    x = torch.randn(n, device=DEVICE)
    report.check(f"n={n}", scale(x), 2.0 * x.double())
report.assert_ok()

# %%
# The stages
# ----------
# Between the call and the GPU, the kernel goes through these, in order:
#
# 1. **Python AST.**  Triton reads the function's source and parses it with
#    Python's ``ast`` module; its code generator walks the tree and writes
#    Triton IR, evaluating ``constexpr`` values as it goes.
# 2. **TTIR** (Triton IR, an MLIR dialect): operations on whole blocks, such as
#    one ``tt.load`` of ``BLOCK`` pointers under a mask.  No threads, no
#    target yet.
# 3. **TTGIR** (TritonGPU IR): every tensor now carries a *layout* that says
#    which thread of which :term:`warp` holds which element.  The passes that
#    decide how fast the kernel runs work here.
# 4. **LLVM IR**: the program of *one thread*, each block operation unrolled
#    into the elements that thread holds; LLVM's optimiser runs on it.
# 5. **PTX**, NVIDIA's virtual instruction set, written by LLVM's back end.
# 6. **cubin**: ``ptxas``, NVIDIA's assembler, turns the PTX into machine code
#    for one GPU generation, choosing registers and the order of instructions;
#    ``nvdisasm`` prints that code as **SASS**.
#
# Triton does all of this for the GPU it is told to target, whether or not the
# machine has one.  :func:`tilebook.course.passes.compile_with_passes` asks it ahead
# of time with its pass-by-pass dump on, and returns every stage (a
# :class:`tilebook.course.aot.CompiledKernel`) and the passes that ran.  A compile
# needs what a launch would find: the argument types, the ``constexpr``
# values, and which integers and pointers are divisible by 16 (lesson 02).  We
# compile the kernel as a launch with ``n = 8192`` sees it, for both GPUs;
# then, for ``sm_90``, with a length that is not a multiple of 16, with a view
# ``x[1:]`` that starts one element into its storage, and with the mask
# deleted; and a kernel with a loop and a ``tl.dot``, read further down.


@triton.jit
def scale_kernel_no_mask(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    tl.store(out_ptr + offsets, alpha * x)


@triton.jit
def tile_dot_kernel(
    a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rows[:, None] * K + (k + ks)[None, :])
        b = tl.load(b_ptr + (k + ks)[:, None] * BN + cols[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * BN + cols[None, :], acc)


BLOCK, WARPS, TILE = 1024, 4, {"BM": 64, "BN": 64, "BK": 32}
SIG = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32"}
SCALE = {"kernel": scale_kernel, "signature": SIG, "constexprs": {"BLOCK": BLOCK}}
NO_MASK = {**SCALE, "kernel": scale_kernel_no_mask}
ALIGNED = ["x_ptr", "out_ptr", "n"]  # divisible by 16, as with n = 8192
DOT_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
DOT = {"kernel": tile_dot_kernel, "signature": DOT_SIG, "constexprs": TILE}
builds = compile_with_passes(
    {
        "sm_90": {**SCALE, "arch": 90, "divisible_by_16": ALIGNED},
        "sm_80": {**SCALE, "arch": 80, "divisible_by_16": ALIGNED},
        "sm_90, n=4100": {**SCALE, "arch": 90, "divisible_by_16": ["x_ptr", "out_ptr"]},
        "sm_90, x[1:]": {**SCALE, "arch": 90, "divisible_by_16": ["out_ptr", "n"]},
        "sm_90, no mask": {**NO_MASK, "arch": 90, "divisible_by_16": ALIGNED},
        "dot sm_80": {**DOT, "arch": 80, "divisible_by_16": list(DOT_SIG)},
        "dot sm_90": {**DOT, "arch": 90, "divisible_by_16": list(DOT_SIG)},
    },
    num_warps=WARPS,
    num_stages=3,
)
k90, k80 = builds["sm_90"].kernel, builds["sm_80"].kernel
COMPILED = builds["sm_90"].caption()

# %%
# Every stage, one after another
# ------------------------------
# The front end's output (stage 1's text, which Triton keeps in its cache as
# the ``.source`` file) is long: the code generator writes every operation as
# it meets it, 32-bit overflow checks included, whose results nothing uses.
# The first passes (inlining, canonicalisation, common subexpressions) fold it
# down to the TTIR below, printed without its location records and wrapped.


WRAP = textwrap.TextWrapper(86, initial_indent="  ", subsequent_indent="      ")


def show(lines):
    """Print lines of a stage, without MLIR location records, wrapped at 88."""
    for line in lines:
        text = re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", line).strip()
        if text and not text.startswith("#loc"):
            print(WRAP.fill(text))


ttir, front = k90.stage("ttir").splitlines(), builds["sm_90"].front_end.splitlines()
print(f"front end: {len(front)} lines; TTIR: {len(ttir)} lines")
show(ttir)

# %%
# ``tt.load`` takes ``BLOCK`` pointers and the mask as one operation; nothing
# says which thread loads what, and nothing names a GPU: the TTIR is the same
# text for both targets.  TTGIR is where the target and the threads appear:
# the module names the GPU and the number of :term:`warps <warp>`, and a
# layout, ``#blocked``, is attached to every tensor.

for label, k in (("sm_80", k80), ("sm_90", k90)):
    print(label)
    show(
        line
        for line in k.stage("ttgir").splitlines()
        if line.startswith(("#blocked", "module")) or "tt.load" in line
    )

# %%
# ``sizePerThread = [4]``: each thread holds four consecutive elements, the
# 32 threads of a warp hold neighbouring groups of four, and the warps follow
# one another; a block of ``BLOCK`` elements takes as many such rounds as it
# needs.  That is what makes the accesses of a warp :term:`coalesced`:
# neighbouring threads touch neighbouring bytes.  Three passes made this
# layout, and the pass log shows them at work on the ``sm_90`` build:
# ``convert-triton-to-tritongpu`` gave every tensor one element per thread,
# ``tritongpu-coalesce`` gave the load and the store the layout their
# addresses call for, with ``convert_layout`` operations between the two, and
# ``tritongpu-remove-layout-conversions`` moved the whole kernel to it.

log = builds["sm_90"].passes
SNAPSHOTS = [
    ("before tritongpu-coalesce", log.before("tritongpu-coalesce")),
    ("after tritongpu-coalesce", log.after("tritongpu-coalesce")),
    (
        "after remove-layout-conversions",
        log.after("tritongpu-remove-layout-conversions"),
    ),
]

for when, text in SNAPSHOTS:
    converts = text.count("ttg.convert_layout")
    print(f"{when:<32} sizePerThread {stages.layouts(text)}, {converts} convert_layout")

# %%
# Following one ``tl.load``
# -------------------------
# Every stage carries source locations (``loc`` records in the MLIR stages,
# ``!dbg`` in LLVM IR, ``.loc`` in PTX, line tables in the cubin), so
# :meth:`~tilebook.course.aot.CompiledKernel.lines_for` can list the lines of any
# stage that came from one line of Python.  Stage by stage for ``sm_90``: how
# many lines came from the ``tl.load`` line, the first load among them, and
# the comparison that came from the mask line.

LOAD, MASK = "tl.load(x_ptr", "mask = offsets < n"
OPS = {
    "ttir": "tt.load",
    "ttgir": "tt.load",
    "llir": "ld.global",
    "ptx": "ld.global",
    "sass": "LDG",
}
COMPARE = {"llir": "icmp", "ptx": "setp", "sass": "ISETP"}
for stage, op in OPS.items():
    came = k90.lines_for(LOAD, stage)
    loads = [line.text for line in came if op in line.text]
    print(f"{stage}: {len(came)} lines from the load line, {len(loads)} of them loads")
    show(loads[:1])
    if stage in COMPARE:
        show(
            [s.text for s in k90.lines_for(MASK, stage) if COMPARE[stage] in s.text][:1]
        )

# %%

stages.say_loads(builds["sm_90"], BLOCK, LOAD, MASK)

# %%
# Triton writes loads and stores into the LLVM IR as inline PTX assembly
# (``asm sideeffect "... ld.global.v4.b32 ..."``), which LLVM passes through
# untouched.  With Triton 3.8 and 3.9 (not 3.6) the PTX also has a ``.loc``
# before each line of that assembly, numbered on from the load's own line, so
# that the lines after a load seem to claim part of it (the viewer shows them
# when the page was built with those versions); :mod:`tilebook.course.aot` counts only
# the first.
#
# What keeps a load narrow
# ------------------------
# The three ``sm_90`` variants against the kernel as compiled above, with the
# layout of each build's load:

VARIANTS = ["sm_90", "sm_80", "sm_90, n=4100", "sm_90, x[1:]", "sm_90, no mask"]
stages.loads_table(
    builds, VARIANTS, f"{COMPILED} (sm_80 for its row); counts per thread"
)

# %%
# Every build has the same layout.  The layout says which elements a thread
# holds, not how it reads them: that is decided one step later, when TTGIR is
# lowered to LLVM IR, and a group of four becomes one 16-byte load only if two
# things are known at compile time:
#
# - the address of its first element is a multiple of 16 bytes, which holds
#   when the pointer is divisible by 16.  ``x[1:]`` starts four bytes into
#   its storage, so its loads are split; its stores are not, since ``out`` is
#   aligned;
# - its four mask bits are equal, which the compiler knows when ``n`` is
#   divisible by 16: then no group straddles the end.  With ``n=4100`` each element gets its
#   own load and its own predicate.
#
# Without a mask there is nothing to split: the loads are wide, and the last
# program reads and writes past the end of the vectors.  The exercise checker
# of :mod:`tilebook.course.exercises` runs such a kernel on awkward lengths, inside
# guard regions, and says what went wrong:


def scale_no_mask(x, out):
    n = x.numel()
    scale_kernel_no_mask[(triton.cdiv(n, BLOCK),)](x, out, n, 2.0, BLOCK=BLOCK)


verdict = check_elementwise(scale_no_mask, lambda x: 2.0 * x, inputs=1, block=BLOCK)
verdict

# %%

said = stages.width_claims(builds, VARIANTS, SNAPSHOTS, verdict, BLOCK)
Claims("03 Python to PTX", COMPILED).check_all(said)

# %%
# A loop and a ``tl.dot``: layouts, tensor cores, pipelining
# -----------------------------------------------------------
# An elementwise kernel needs one layout decision.  Most passes of TTGIR are
# for kernels like ``tile_dot_kernel`` above: one program multiplies a
# ``BM x K`` tile of A by a ``K x BN`` tile of B, ``BK`` columns at a time.
# Lesson 04 explains its 2-D offsets, lesson 05 ``tl.dot``, lesson 09 the
# loop; here we only read what the compiler made of it.  First, that it is
# right:

M_, N_, K_ = TILE["BM"], TILE["BN"], 4 * TILE["BK"]
a = torch.randn(M_, K_, device=DEVICE, dtype=torch.float16)
b = torch.randn(K_, N_, device=DEVICE, dtype=torch.float16)
c = torch.empty(M_, N_, device=DEVICE, dtype=torch.float32)
tile_dot_kernel[(1,)](a, b, c, K_, **TILE)
dot_report = CorrectnessReport("tile_dot_kernel vs float64 reference")
dot_report.check(f"{M_}x{K_} @ {K_}x{N_}", c, a.double() @ b.double())
dot_report.assert_ok()

# %%
# :class:`~tilebook.course.passes.PassLog` compares the module before each pass with
# the module after it.  These are the passes that shape ``tile_dot_kernel``
# on its way to TTGIR, and whether each changed it on each target:

dot80, dot90 = builds["dot sm_80"], builds["dot sm_90"]
stages.passes_table(dot80, dot90)

# %%

stages.say_other_passes(dot80, dot90)

# %%
# ``tritongpu-accelerate-matmul`` is where ``tl.dot`` meets the tensor cores:
# :term:`mma` instructions, each the work of one warp, for ``sm_80``, and
# :term:`wgmma` for ``sm_90``, one instruction for a :term:`warpgroup` of four
# warps, which here reads both operands from shared memory.  The layout it defined,
# and the operation that stands for ``tl.dot`` afterwards, on each target:

for t in (dot80, dot90):
    print(f"sm_{t.kernel.arch}")
    for line in t.passes.diff("tritongpu-accelerate-matmul", width=86):
        if line.startswith("+") and re.search(r"nvidia_mma|tt\.dot |_dot ", line):
            print(" ", line)

# %%

stages.say_mma(dot80, dot90)

# %%
# ``tritongpu-pipeline`` rewrote the loop so that the loads of later
# iterations are in flight while the current one multiplies: each ``tl.load``
# became an asynchronous copy from global into shared memory
# (``ttg.async_copy_global_to_local``; ``cp.async`` in PTX, ``LDGSTS`` in SASS)
# into one of several buffers that ``ttg.local_alloc`` sets aside up front.
# The shared memory that Triton records for the kernel is those buffers:


for t in (dot80, dot90):
    shapes, total = stages.shared_buffers(t)
    ldgsts = t.kernel.instructions("LDGSTS")["LDGSTS"]
    print(f"sm_{t.kernel.arch}: local_alloc {shapes}, {total:,} bytes in all")
    print(f"       metadata: shared = {t.kernel.shared_bytes:,}; {ldgsts} LDGSTS")

# %%

acc = TILE["BM"] * TILE["BN"] // (32 * WARPS)
Claims("03 Python to PTX", COMPILED).check_all(stages.dot_claims(dot80, dot90, acc))

# %%
# Registers are ``ptxas``'s decision, not Triton's: it reports them, and the
# bytes it had to :term:`spill` where they ran out, as it assembles
# (``ptxas -v``), and :mod:`tilebook.course.aot` reads that report (on a
# GPU, a launched kernel's ``compiled.n_regs`` says the same).  Shared memory
# is Triton's own decision, recorded in the kernel's metadata as ``shared``,
# in bytes per program.  Both limit how many programs fit on one :term:`SM`
# at a time, its :term:`occupancy`.
#
# The stage viewer
# ----------------
# Every build above, every stage in full.  Pick a line of the Python source:
# the lines of each stage that came from it light up, and each stage's button
# counts them.  Under each stage: its job, and the passes that changed this
# build on the way to it.  Flagged: the build that computes a wrong answer,
# and the two that pay for a missing hint with narrow loads.

StageViewer(builds, line=LOAD, **stages.viewer_setup(builds, COMPILED))

# %%
# The cache and the knobs
# -----------------------
# Triton keeps every compile on disk, in a directory named by a hash of the
# kernel's source, its specialisation, the options and the compiler's own
# version; the next process that needs the same binary loads it from there
# (lesson 02 timed that).  The entry of the ``sm_90`` build holds every stage up to
# the binary (SASS is not kept: it is read back from the ``.cubin``):
# ``.source`` is the front end's TTIR, ``.json`` the metadata (``shared``,
# ``num_warps``, the target), and ``__grp__`` lists the others.

for name, size in builds["sm_90"].cache_files.items():
    print(f"  {name:<28} {size:>8,} bytes")

# %%
# The settings that change what Triton does live in ``triton.knobs``, one
# attribute per environment variable.  These concern the cache and the
# stages.  Set one in the environment before Python starts, or in code
# (``triton.knobs.compilation.always_compile = True``; ``scope()`` restores
# the old values afterwards).  The variable names below are read from the
# knobs of the Triton that built this page.

stages.knobs_table()

# %%
# The pass-by-pass dump is not among them.  ``MLIR_ENABLE_DUMP=1`` (the module
# before every MLIR pass, on stderr) and ``MLIR_DUMP_PATH`` (a file instead)
# are read by Triton's C++ code, which opens that file once per process: that
# is why :mod:`tilebook.course.passes` compiles in processes of its own.  A kernel
# found in the cache is not compiled again and dumps nothing, so pair them with
# ``TRITON_ALWAYS_COMPILE=1``:
#
# .. code-block:: bash
#
#    MLIR_ENABLE_DUMP=1 MLIR_DUMP_PATH=passes.txt TRITON_ALWAYS_COMPILE=1 python my.py
#    TRITON_KERNEL_DUMP=1 TRITON_DUMP_DIR=stages TRITON_ALWAYS_COMPILE=1 python my.py

Claims("03 Python to PTX", COMPILED).check_all(stages.knob_claims(builds["sm_90"]))

# %%
# Try this
# --------
#
# 1. Compile ``scale_kernel`` for ``"*fp16"`` pointers on ``sm_90`` with
#    :func:`tilebook.course.aot.compile_kernel`.  How many elements does one 16-byte
#    load carry now, and how many loads does a thread make?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from tilebook.course.aot import compile_kernel
#
#          sig = {"x_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32", "alpha": "fp32"}
#          k = compile_kernel(scale_kernel, sig, {"BLOCK": 1024}, arch=90,
#                             divisible_by_16=["x_ptr", "out_ptr", "n"])
#          print(k.count(r"LDG\.E\.128"), k.count(r"LDG\.E(?!\.128)"))
#
#       Eight halves make 16 bytes, and ``coalesce`` gives each thread eight
#       (``sizePerThread = [8]`` in the TTGIR): a thread that owns eight
#       elements loads them with one ``LDG.E.128``.
#
# 2. Write two variants of ``scale_kernel``, one with the mask on the store
#    only and one with it on the load only, and check each with
#    :func:`tilebook.course.exercises.check_elementwise` as the lesson checked
#    ``scale_kernel_no_mask``.  Which passes?
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          def my_scale(x, out):  # launches the variant under test
#              n = x.numel()
#              my_kernel[(triton.cdiv(n, 1024),)](x, out, n, 2.0, BLOCK=1024)
#
#          print(check_elementwise(my_scale, lambda x: 2.0 * x, inputs=1, block=1024))
#
#       The mask on the load alone fails: the store writes past the end of
#       ``out``.  The mask on the store alone passes, yet its load still reads
#       past the end of ``x``: values it never stores, which no check of the
#       output can see.  Both masks belong in the kernel.
#
# 3. Compile ``tile_dot_kernel`` for ``sm_90`` with ``num_stages=1`` through
#    :func:`tilebook.course.passes.compile_with_passes`.  Which passes no longer
#    change it?  What happens to the ``LDGSTS`` instructions and to
#    ``shared_bytes``?
#
#    .. dropdown:: Solution
#
#       ``tritongpu-assign-latencies`` and ``tritongpu-schedule-loops`` change
#       nothing: with one stage there is nothing to schedule ahead, and no load
#       becomes an asynchronous copy.  ``LDGSTS`` is gone; the tiles travel
#       through registers (``LDG``, then ``STS``) into shared memory, where
#       ``wgmma`` reads them, so ``shared_bytes`` is not zero.
#       ``passes.diff("tritongpu-pipeline")`` shows what that pass still did.
