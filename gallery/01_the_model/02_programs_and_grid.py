"""
02. Programs and the grid: how a kernel is cut into pieces
==========================================================

Lesson 01's kernel ran as many copies at once, each on its own tile.  This
lesson looks at that machinery.  A launch names a *grid*: how many
:term:`programs <program>` to start, along one, two or three axes.  Each
program asks ``tl.program_id`` which one it is and works out from that which
part of the data it owns.  And before any of it runs, ``@triton.jit`` has
compiled the function for the types and constants of the call, and keeps the
binary for the next call that looks the same.

We make programs visible by having each one write its own id over the
elements it owns, and draw what they wrote.  Then we count, from Triton's own
cache, how many binaries a set of calls creates, and measure what the first
call costs.

.. rubric:: You will learn

- what ``@triton.jit`` does: parse the function, compile it on the first call,
  specialise on dtypes, constants and divisibility by 16, cache the binary;
- what ``tl.constexpr`` controls;
- grids of one, two and three axes, ``triton.cdiv``, and a grid that is a
  function of the meta-parameters;
- ``tl.program_id``, ``tl.num_programs``, and the order programs start in,
  observed with an atomic counter;
- how many binaries a set of calls creates, and what a first call costs.

The package's :func:`tilebook.vector_add` launches with a grid function like
the one here; :func:`tilebook.course.exercises.check` checks kernels of any shape.
"""

# %%
# Setting up
# ----------
# What the page says of its measurements (tables, sentences, claims checked
# against the data) is made from the data by
# :mod:`tilebook.course.experiments.programs` (``experiment`` below).

import tilebook

import torch
import triton
import triton.language as tl
from triton.errors import TritonError

from tilebook.course.aot import compile_many
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.experiments import programs as experiment
from tilebook.course.widgets_grid import GridExplorer, ownership_figure

print(tilebook.banner())
DEVICE = tilebook.device()


# %%
# Programs that sign their work
# -----------------------------
# This kernel stores nothing but its own program id, over the elements it
# owns.
#
# ``out_ptr``
#     Where to write: an ``int32`` vector, filled with ``-1`` beforehand, so
#     that an element no program wrote stays ``-1``.
# ``n``
#     The vector's length.
# ``BLOCK: tl.constexpr``
#     Elements per program.
#
# ``tl.program_id(axis=0)`` is this program's index along the grid's first
# axis: ``0, 1, 2, ...``.  Program ``pid`` owns elements ``pid * BLOCK`` to
# ``pid * BLOCK + BLOCK - 1``, and the mask drops those past ``n``.


@triton.jit
def stamp_kernel(out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, pid, mask=offsets < n)


# %%
# The grid is a tuple in square brackets: ``(triton.cdiv(n, BLOCK),)`` starts
# ``n / BLOCK`` programs, rounded up, along one axis.

n, BLOCK = 1000, 128
owner = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
stamp_kernel[(triton.cdiv(n, BLOCK),)](owner, n, BLOCK=BLOCK)
fig = ownership_figure(owner, title=f"n = {n}, BLOCK = {BLOCK}: who wrote each element")

# %%
# Every element carries the id of the program that owns it; the last program
# owns a shorter run, the ragged end.  The same map, checked against the
# arithmetic (element ``i`` belongs to program ``i // BLOCK``), at awkward
# lengths, and again with a *grid function*: instead of a tuple, the launch
# takes a function of the meta-parameters (the ``constexpr`` arguments of the
# call), so the grid follows ``BLOCK`` wherever it is chosen.  Autotuning
# (lesson 07) needs exactly that.


def stamp(n, block, grid=None):
    out = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
    grid = grid or (lambda meta: (triton.cdiv(n, meta["BLOCK"]),))
    stamp_kernel[grid](out, n, BLOCK=block)
    return out


report = CorrectnessReport("program ids vs i // BLOCK")
for length in (1, 97, 1000, 1024, 4097):
    for block in (64, 1024):
        want = torch.arange(length, device=DEVICE) // block
        report.check(f"n={length} BLOCK={block}", stamp(length, block), want, tol=0)
report.assert_ok()

# %%
# What ``@triton.jit`` did
# ------------------------
# The decorator does not run the function.  It reads its source and its
# arguments, and turns it into a kernel object; the launch ``kernel[grid](...)``
# then compiles it, the first time, for the argument types and constants of
# that call.

experiment.say_kernel_kind(stamp_kernel)

# %%
# ``tl.constexpr`` marks an argument whose *value* is part of the compiled
# program: ``BLOCK`` fixes the length of ``tl.arange``, so the shape of every
# tensor in the kernel, and with it how the tile is spread over threads and
# their :term:`registers <register>`.  Shapes must be known when the kernel is compiled, so an
# argument that sets one must be a ``constexpr``.  Without the annotation:


@triton.jit
def stamp_no_constexpr(out_ptr, n, BLOCK):
    offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, 0, mask=offsets < n)


try:
    stamp_no_constexpr[(1,)](owner, n, BLOCK)
except TritonError as exc:  # a compile error on a GPU, an interpreter error on a CPU
    lines = str(exc).strip().splitlines()
    # Triton's reason comes last, after the kernel's source (whose name has
    # "constexpr" in it too).
    reasons = [ln for ln in lines if "constexpr" in ln and "def " not in ln]
    why = (reasons or lines)[-1]
    print(type(exc).__name__, "->", why)

# %%
# Each distinct value of a ``constexpr`` compiles its own binary.  That is the
# price of making it a constant; the reward is code specialised for it.
#
# Grids of two and three axes
# ---------------------------
# A matrix is cut into ``BLOCK_M x BLOCK_N`` tiles, one program per tile, on a
# grid of two axes: ``tl.program_id(0)`` picks the row of tiles and
# ``tl.program_id(1)`` the column.  A third axis usually counts something
# independent, such as the matrices of a batch.  ``tl.num_programs(axis)`` is
# the grid's size along an axis.  This kernel stores, over its tile, its
# program's *linear index*, the number CUDA gives a program of the grid: the
# axis 0 index counts fastest, then axis 1, then axis 2.  (Whether programs
# also start in that order is for the GPU to say: we ask it further down.)
#
# ``rows[:, None]`` and ``cols[None, :]`` turn two vectors of positions into a
# ``BLOCK_M x BLOCK_N`` tile of positions (lesson 04 explains this
# broadcasting and the strides); ``stride_m`` is the distance between two
# rows in memory, ``stride_b`` between two matrices.


@triton.jit
def stamp_tiles_kernel(
    out_ptr, M, N, stride_b, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    pid_b = tl.program_id(axis=2)
    order = pid_m + tl.num_programs(0) * (pid_n + tl.num_programs(1) * pid_b)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32) + order
    ptrs = out_ptr + pid_b * stride_b + rows[:, None] * stride_m + cols[None, :]
    tl.store(ptrs, tile, mask=(rows[:, None] < M) & (cols[None, :] < N))


def stamp_tiles(M, N, block_m, block_n, grid, batch=1):
    out = torch.full((batch, M, N), -1, dtype=torch.int32, device=DEVICE)
    stamp_tiles_kernel[grid](
        out, M, N, out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n
    )
    return out


M, N, BM, BN = 40, 72, 16, 16
grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
tiles = stamp_tiles(M, N, BM, BN, grid)[0]
fig = ownership_figure(
    tiles, tile=(BM, BN), title=f"{M} x {N} matrix, {BM} x {BN} tiles, grid {grid}"
)

# %%
# Each tile shows its program's linear index.  Numbered down the columns, not
# along the rows: axis 0 counts fastest, and here axis 0 counts rows of tiles.
#
# With a third axis of two, the same kernel stamps two matrices, the second
# numbered after every program of the first:

batched = stamp_tiles(M, N, BM, BN, (*grid, 2), batch=2)
for b in range(2):
    low, high = batched[b].min().item(), batched[b].max().item()
    print(f"matrix {b}: programs {low} to {high}")

# %%
# The maps above come from the kernel's ``tl.program_id`` and
# ``tl.num_programs``; the arithmetic must agree.  A tile's program is
# ``pid_m + pid_n * grid_0`` (plus whole matrices for the batch).

check = CorrectnessReport("linear index vs pid_m + pid_n * grid_0")
for m_, n_, bm, bn in ((40, 72, 16, 16), (7, 100, 8, 32), (64, 64, 32, 16)):
    g = (triton.cdiv(m_, bm), triton.cdiv(n_, bn))
    got = stamp_tiles(m_, n_, bm, bn, (*g, 2), batch=2)
    pm = torch.arange(m_, device=DEVICE)[:, None] // bm
    pn = torch.arange(n_, device=DEVICE)[None, :] // bn
    want = torch.stack([pm + pn * g[0] + b * g[0] * g[1] for b in range(2)])
    check.check(f"{m_}x{n_} tiles {bm}x{bn}", got, want, tol=0)
check.assert_ok()

# %%
# The order programs start in
# ---------------------------
# The linear index is a number; the order in which programs *start* is the
# GPU's business, and nothing above observed it.  To see it, each program
# takes a ticket as it starts.  ``tl.atomic_add(ptr, value)`` adds ``value``
# to the number at ``ptr`` in one indivisible step and returns the number it
# found there: with a counter at zero, the first program to get there gets 0,
# the next 1, and no two get the same.  Each program stores its ticket at its
# place in a ``grid_0 x grid_1`` matrix.  (Lesson 06 sums with atomics.)


@triton.jit
def ticket_kernel(counter_ptr, tickets_ptr):
    ticket = tl.atomic_add(counter_ptr, 1)  # the first thing a program does
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    tl.store(tickets_ptr + pid_m * tl.num_programs(1) + pid_n, ticket)


def tickets(grid_0, grid_1):
    counter = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = torch.full((grid_0, grid_1), -1, dtype=torch.int32, device=DEVICE)
    ticket_kernel[(grid_0, grid_1)](counter, out)
    return out


# %%
# :func:`tilebook.course.experiments.programs.start_order` checks that every program
# took one ticket, then compares the tickets with two numberings of the grid:
# the linear index (axis 0 fastest) and its transpose (axis 1 fastest).  Its
# measure is the fraction of all pairs of programs whose tickets come in the
# order of their numbers: 1 when the programs start exactly in that order,
# near one half when the order has nothing to do with it (with the spread of
# a random order beside it).  A GPU starts many programs at once, so their
# tickets are shuffled among those that start together; a grid of many times
# more programs than fit on the GPU at once shows the order beyond that.

GRID = tilebook.pick(gpu=(128, 128), cpu=(8, 8))
here = experiment.start_order(tickets(*GRID))
order = record_or_measure(
    "lesson02_start_order",
    "ticket_kernel: the order in which a grid's programs took their tickets",
    lambda: here,
)
experiment.start_order_table(order)

# %%
# A fraction of pairs beyond six standard deviations of a random order's is
# not chance (a random order gets there about once in a billion).

Claims("02 the grid", order).check_all(experiment.start_order_claims(order))

# %%

experiment.say_start_order(here, order)

# %%
# Lesson 09 turns this order into a tool (programs that start together share
# what the :term:`L2` cache holds).
#
# Turning the knobs
# -----------------
# The grid explorer cuts a matrix into tiles for any sizes, and numbers each
# tile by the linear index of the program that owns it; "programs started"
# shows only the first programs, taking the linear index as the start order
# (a GPU need not follow it exactly: see above).  Two grid rules are wrong:
# rounding the division down (``M // BLOCK_M``) drops the ragged last row or
# column of tiles, and a grid whose axes are swapped against the kernel's
# (``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))`` for a kernel that reads axis 0 as
# rows) leaves some tiles unowned and starts programs outside the matrix.  The explorer's arithmetic is
# checked against the kernel itself: for each of the three rules at the sizes
# below, the map ``stamp_tiles_kernel`` writes is the explorer's.

explorer = GridExplorer(**experiment.EXPLORER)
experiment.check_explorer(stamp_tiles).assert_ok()
explorer

# %%
# What ``@triton.jit`` specialises on
# -----------------------------------
# A binary is compiled for one *specialisation* of the arguments, and Triton
# reuses it for every later call with the same one.  The specialisation holds
# each tensor's dtype, the value of each ``constexpr``, the launch options
# (``num_warps``, ...), and two facts about each integer and pointer: whether
# it is divisible by 16 (a pointer: aligned to 16 bytes), and whether an
# integer equals 1.  Floats are not specialised, nor is the data.
#
# To see it, we make a set of calls to one small kernel and, after each, ask
# the kernel's in-memory cache how many binaries it holds
# (:func:`tilebook.course.experiments.programs.specialisations`).  On a CPU the
# interpreter compiles nothing, so this page shows the record of a GPU run.


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x, mask=mask)


def scale(x, alpha=2.0, block=1024, warps=4):
    out = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, block),)
    scale_kernel[grid](x, out, n, alpha, BLOCK=block, num_warps=warps)
    return out


def vec(n, dtype=torch.float32):
    return torch.randn(n, device=DEVICE, dtype=dtype)


CALLS = [
    ("n=4096, float32", lambda: scale(vec(4096))),
    ("alpha=3.0 (a float)", lambda: scale(vec(4096), alpha=3.0)),
    ("new data, same sizes", lambda: scale(vec(4096))),
    ("n=8192 (divisible by 16)", lambda: scale(vec(8192))),
    ("n=4100 (not divisible by 16)", lambda: scale(vec(4100))),
    ("n=1", lambda: scale(vec(1))),
    ("float16", lambda: scale(vec(4096, torch.float16))),
    ("BLOCK=512 (a constexpr)", lambda: scale(vec(4096), block=512)),
    ("num_warps=8", lambda: scale(vec(4096), warps=8)),
    ("x misaligned by one element", lambda: scale(vec(4097)[1:])),
]
spec = record_or_measure(
    "lesson02_specialise",
    "scale_kernel: binaries in Triton's cache after each call",
    lambda: experiment.specialisations(scale_kernel, CALLS),
)
held = experiment.binaries(scale_kernel)  # after the table's calls (None: interpreter)
experiment.specialisations_table(spec)

# %%
# The key of each new binary, as Triton wrote it: one entry per argument, a
# type and a specialisation (``'D'``: divisible by 16), constants as
# ``('constexpr', value)``.  Options of the launch itself, such as
# ``num_warps``, are not arguments: they are not in this key, yet a new value
# compiles a binary of its own, whose row repeats an earlier key.

for r in spec.rows if spec else []:
    if r["new"]:
        print(f"{r['step']:>2} {r['key']}")

# %%
# The rule, checked on the table: which changes compiled a new binary.

NEW = {
    "n=4096, float32": True,
    "alpha=3.0 (a float)": False,
    "new data, same sizes": False,
    "n=8192 (divisible by 16)": False,
    "n=4100 (not divisible by 16)": True,
    "n=1": True,
    "float16": True,
    "BLOCK=512 (a constexpr)": True,
    "num_warps=8": True,
    "x misaligned by one element": True,
}
assert list(NEW) == [label for label, _ in CALLS]
said = experiment.specialisation_claims(spec, NEW, held)
Claims("02 the grid", spec).check_all(said) if spec else experiment.no_record()

# %%
# Divisibility by 16 is worth a binary because it changes the code.  A length
# divisible by 16 means a tile of 16 elements is either all inside the vector
# or all outside, so the mask is the same for each group of four floats and a
# thread may load them with one 16-byte instruction.  Without that knowledge
# every element needs its own load.  :func:`tilebook.course.aot.compile_many` compiles
# ``scale_kernel`` both ways for Hopper (``sm_90``):

SIG = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32"}
builds = compile_many(
    {
        "n divisible by 16": {"divisible_by_16": ["x_ptr", "out_ptr", "n"]},
        "n not divisible": {"divisible_by_16": ["x_ptr", "out_ptr"]},
    },
    kernel=scale_kernel,
    signature=SIG,
    constexprs={"BLOCK": 1024},
    arch=90,
)
experiment.load_widths_table(builds, arch=90)

# %%
# The first call
# --------------
# A call that needs a new binary compiles it: Triton lowers the function
# through its stages (lesson 03) and ``ptxas`` turns the result into machine
# code.  The binary is also written to an on-disk cache
# (``~/.triton/cache``, or ``TRITON_CACHE_DIR``), so the next *process* that
# needs it loads it instead.  :func:`tilebook.course.experiments.programs.first_calls`
# times a call of ``scale`` that compiles (an empty cache directory), one
# that loads from the disk cache, and later calls, wall clock from the
# Python call to the end of the kernel: the median of each, and its
# :term:`spread` (p20-p80).

x0 = vec(4096)
first = record_or_measure(
    "lesson02_first_call",
    "scale(x) for 4,096 floats: the first call against later ones",
    lambda: experiment.first_calls(scale_kernel, lambda: scale(x0)),
)
experiment.first_calls_table(first)

# %%

said = experiment.first_call_claims(first)
Claims("02 the grid", first).check_all(said) if first else experiment.no_record()

# %%

experiment.say_first_calls(first)

# %%

experiment.say_binaries(scale_kernel, first, held)

# %%
# Try this
# --------
#
# 1. Make each program of ``stamp_kernel`` own *two* blocks: the grid shrinks
#    to ``cdiv(n, 2 * BLOCK)``, and the kernel loops over its two blocks.
#    Check it with ``check(fn, lambda n: torch.arange(n, dtype=torch.int32) //
#    256, [(1,), (97,), (1000,), (4097,)], block=256)`` from
#    :mod:`tilebook.course.exercises`, where ``fn(n, out)`` launches it with
#    ``BLOCK=128``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def stamp2_kernel(out_ptr, n, BLOCK: tl.constexpr):
#              pid = tl.program_id(axis=0)
#              for i in range(2):
#                  offsets = (2 * pid + i) * BLOCK + tl.arange(0, BLOCK)
#                  tl.store(out_ptr + offsets, pid, mask=offsets < n)
#
#          def fn(n, out):
#              stamp2_kernel[(triton.cdiv(n, 256),)](out, n, BLOCK=128)
#
#       With ``block=256`` the checker names the program that owns each
#       element it complains about; try the grid ``n // 256`` to see it.
#
# 2. Launch ``stamp_tiles_kernel`` on the grid ``(cdiv(N, BLOCK_N),
#    cdiv(M, BLOCK_M))``, axes swapped.  Which tiles are unowned?  Compare
#    with the explorer's "swapped axes".
#
#    .. dropdown:: Solution
#
#       Program ``(p0, p1)`` still writes tile row ``p0``, column ``p1``.
#       Tiles whose row index reaches ``cdiv(N, BLOCK_N)`` or whose column
#       index reaches ``cdiv(M, BLOCK_M)`` have no program; programs whose
#       ``p0`` is past the last tile row store nothing (their mask is all
#       false).  With a square matrix and square tiles the mistake is
#       invisible, which is why tests need rectangular shapes.
#
# 3. Without running it: how many binaries do calls of ``scale`` with
#    ``n = 64``, ``n = 1 << 20``, ``n = 1000`` and ``n = 1008`` create, all in
#    float32?  Check on a GPU with
#    ``experiment.binaries(scale_kernel)`` before and after.
#
#    .. dropdown:: Solution
#
#       Two: ``64``, ``1 << 20`` and ``1008`` are all divisible by 16 and
#       share one binary; ``1000`` is not, and gets another (``1000 / 16`` is
#       not whole).  The data and the exact length do not matter.
#
# 4. In ``stamp_tiles_kernel``, what do ``tl.num_programs(0)`` and
#    ``tl.num_programs(2)`` return for the grid ``(3, 5)``?
#
#    .. dropdown:: Solution
#
#       ``3`` and ``1``: a grid given with fewer than three axes has size one
#       along the others, and every program's ``tl.program_id(2)`` is ``0``.
