"""
10. softmax: one row a program, long rows online
================================================

Softmax turns a row of scores into probabilities: subtract the row's largest
entry, exponentiate, divide by the sum.  It closes every classifier and sits in
every attention layer.  With a handful of operations per element, its speed is
set by traffic to :term:`HBM`: at best it reads each input and writes each
output once.  This lesson starts from the smallest kernel that does that, one
program per row, measures where it falls short and refines it into the
package's kernels, against ``torch.softmax`` and ``torch.compile``.

.. rubric:: You will learn

- how one program finds a row's maximum, exponentials and sum in
  :term:`registers <register>`, and why subtracting the maximum makes it safe;
- where several rows a program and more :term:`warps <warp>` pay, and where
  they buy nothing, from a measurement and from the compiled kernels;
- how the online softmax walks a row too long for registers, and where that
  beats a single pass;
- the backward pass ``dx = y * (dy - sum(y * dy))`` as a row kernel;
- how to size a persistent grid from :term:`occupancy`, and let a measurement
  say whether it, or an eviction hint, pays.

The finished kernels are :func:`tilebook.softmax` (any dimension of any tensor,
with autograd); their source, launchers and tuned configurations are in
:mod:`tilebook.ops.softmax`.
"""

import tilebook  # first: it picks the GPU or Triton's interpreter

import warnings
from dataclasses import replace

import torch
import triton
import triton.language as tl

import tilebook.ops.softmax as sm
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.experiments import softmax as xp
from tilebook.course.plots import plot_record
from tilebook.course.widgets import SweepExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
# numpy (the interpreter) warns at an all -inf row's -inf - -inf: NaN, as in torch.
warnings.filterwarnings("ignore", "(invalid value|divide by zero)", RuntimeWarning)

# %%
# What a softmax has to move
# --------------------------
# For a row :math:`x_1, \dots, x_n`,
#
# .. math::
#
#    y_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}}, \qquad m = \max_j x_j .
#
# Subtracting the maximum changes nothing mathematically (it cancels) but keeps
# every exponent at or below zero: without it a logit of 100 overflows even
# float32 and the row turns into NaN.  As separate PyTorch operations (``max``,
# subtract, ``exp``, ``sum``, divide) the row makes several round trips through
# HBM; a fused kernel reads ``x`` once and writes ``y`` once,
# ``2 * n * element_size`` bytes per row: the bytes every GB/s below counts.
#
# The smallest kernel: one row, one program
# -----------------------------------------
# One program loads a whole row into registers, reduces it twice and stores it.
#
# ``x_ptr``, ``y_ptr``
#     The input and the output, of any float type; the arithmetic is float32.
# ``n_cols``, ``stride_x``, ``stride_y``
#     The row length, and the elements from one row's start to the next (rows
#     may lie anywhere: ``x[:, 7:]`` needs no copy; along a row, stride 1).
# ``BLOCK_N: tl.constexpr``
#     ``n_cols`` rounded up to a power of two, as ``tl.arange`` needs.  The
#     padding loads ``-inf``: it cannot raise the maximum, and its exponential
#     is 0.  A row that is all ``-inf`` gives ``-inf - -inf``, NaN, as
#     ``torch.softmax`` does.
#
# The grid has one program per row, on Triton's default number of warps.


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


ROW_WARPS = 4  # Triton's default


def softmax_rows(x: torch.Tensor, kernel=softmax_row_kernel, *args) -> torch.Tensor:
    """Softmax of each row of the 2-D ``x`` by ``kernel`` (``args``: after strides)."""
    assert x.stride(1) == 1, "the kernel steps along a row with stride 1"
    y = torch.empty_like(x)
    block_n = triton.next_power_of_2(x.shape[1])
    sizes = (x.shape[1], x.stride(0), y.stride(0), *args)
    kernel[(x.shape[0],)](x, y, *sizes, BLOCK_N=block_n, num_warps=ROW_WARPS)
    return y


# %%
# Is it right?  Against PyTorch in float64, with the awkward cases on purpose:
# a width that is not a power of two, a slice, scattered ``-inf`` entries
# (probability 0, what a causal mask makes), a row with one finite entry
# (probability 1) and a row that is all ``-inf``.  On a GPU the measurements
# below also check in bfloat16, at full size, every kernel they time.

ROWS, COLS = tilebook.pick(gpu=(1031, 1000), cpu=(37, 1000))
DTYPES = tilebook.pick(gpu=[torch.float32], cpu=[torch.float32, torch.float16])


def awkward(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(ROWS, COLS, device=DEVICE) * 4
    x[0] = -float("inf")  # NaN, as in torch
    x[1, ::3] = -float("inf")
    x[2, 1:] = -float("inf")  # one finite entry: probability 1
    x[3, -1] = 30.0  # the maximum in the last column
    return x.to(dtype)


report = CorrectnessReport("one row a program vs float64")
for dtype in DTYPES:
    x = awkward(dtype)
    report.check("one row a program", softmax_rows(x), torch.softmax(x.double(), -1))
    ref = torch.softmax(x[:, 7:].double(), -1)
    report.check("a slice x[:, 7:]", softmax_rows(x[:, 7:]), ref)
report.assert_ok()

# %%
# How fast is it?
# ---------------
# Each tensor holds ``2**27`` bfloat16 values, 256 MiB, several times the
# :term:`L2` cache of any GPU in the datasheet: the figures measure HBM, not
# the cache.  The contenders: :func:`tilebook.softmax` (the package's kernels,
# built in the rest of the lesson), ``torch.softmax`` (PyTorch's fused CUDA
# kernel) and the same call through ``torch.compile`` (Inductor writes a
# Triton kernel per shape).  Each is checked against float64 before it is
# timed, so no compile lands in a measurement, and they take turns in
# interleaved rounds (:func:`tilebook.course.bench.compare`), so each spread includes
# the GPU's clock drift.  Three rows more: the kernel above, and two
# deliberate mismatches that later sections explain.

WIDTHS = [256, 2048, 32768, 131072]
SHORT, MID, LONG = WIDTHS[0], WIDTHS[1], WIDTHS[-1]
FITS = sm.ONLINE_THRESHOLD  # the longest row the package keeps in registers
ONE_ROW, ONLINE, SINGLE = "one row a program", "online always", "single pass always"
IMPLS = ["tilebook", "torch", "torch.compile", ONE_ROW, ONLINE, SINGLE]
LONG_CFG = sm.pick_config(LONG)  # what the package runs on rows that do not fit


def single_cfg(n: int) -> sm.SoftmaxConfig:
    """The whole row in registers, on the most warps a program may have."""
    return sm.SoftmaxConfig(1, n, 32, evict="evict_last")


def lesson_rows(x: torch.Tensor) -> dict:
    """The lesson's rows of the measurement, each where tilebook runs something else."""
    n = x.shape[1]
    run = lambda cfg: lambda: sm.launch_softmax_forward(x, torch.empty_like(x), cfg)
    if n > FITS:  # one pass on rows that do not fit
        return {SINGLE: run(single_cfg(n))}
    online = replace(LONG_CFG, block_n=min(LONG_CFG.block_n, n))
    return {ONE_ROW: lambda: softmax_rows(x), ONLINE: run(online)}


fwd = record_or_measure(
    "lesson10_forward",
    "softmax forward, bfloat16, 256 MiB per tensor: GB/s by row length",
    lambda: xp.forward(xp.shapes(WIDTHS), extra=lesson_rows),
)
copy = fwd.provenance["copy_gbps"]
plot_record(
    fwd,
    x="n",
    y="gbps",
    series="impl",
    logx=True,
    order=IMPLS,
    title="softmax forward, bfloat16, 256 MiB per tensor",
    xlabel="row length (columns)",
    ylabel="GB/s (bytes read + written)",
    ceiling=copy,
    ceiling_label="1 GiB device copy",
)

# %%
# The widget at the end holds the numbers.  Where the smallest kernel falls
# short ("faster": beyond the p20-p80 spread of both timings):

ONE_PASS = [n for n in WIDTHS if n <= FITS]  # where both keep a row in registers
said = xp.launch_claims(fwd, SHORT, FITS, ROW_WARPS, ONE_ROW)
Claims("10 softmax", fwd).check_all(said)

# %%

xp.say_launch(fwd, ONE_PASS, ROW_WARPS, ONE_ROW)

# %%
# Where the package's launch pays, it cures one of two failures.  Short rows: a
# row of a few hundred bfloat16 values is a few hundred bytes, each thread
# loads a couple of values instead of a 16-byte vector, and an :term:`SM` holds
# only so many programs at once: too few bytes in flight to cover HBM's
# latency.  A *tile* of ``BLOCK_M`` rows a program gives each program more.
# Long rows fail the other way, spread over too few threads.  What the
# compiler made of the kernels (the binaries the measurements ran; on a CPU,
# the record of that run), and how many programs of each fit on an SM at
# once, out of its threads, registers and :term:`shared memory`:


def one_row_binary(n: int):
    x = torch.zeros(16, n, dtype=xp.DTYPE, device=DEVICE)
    y = torch.empty_like(x)
    return softmax_row_kernel[(1,)](x, y, n, n, n, BLOCK_N=n, num_warps=ROW_WARPS)


def binaries() -> list[dict]:
    cases = [
        (ONE_ROW, FITS, one_row_binary(FITS)),
        ("tilebook", FITS, xp.binary(sm.pick_config(FITS), FITS)),
        (SINGLE, LONG, xp.binary(single_cfg(LONG), LONG)),
        ("tilebook", MID, xp.binary(sm.pick_config(MID), MID)),
        ("tilebook", LONG, xp.binary(LONG_CFG, LONG)),
    ]
    limits = xp.sm_limits()
    return [{"impl": i, "n": n, **xp.resources(k), **limits} for i, n, k in cases]


def programs_per_sm(registers: int, shared: int, num_warps: int, sm: dict) -> tuple:
    """How many programs with these resources fit on one SM, and what limits them."""
    threads = 32 * num_warps
    registers = -(-registers // 8) * 8  # handed out in blocks of 8 a thread
    fits = {
        "threads": sm["sm_threads"] // threads,
        "registers": sm["sm_registers"] // (registers * threads),
        "shared memory": sm["sm_shared"] // (shared + 1024),  # 1 KiB CUDA keeps
        "program slots": sm["sm_programs"],
    }
    limit = min(fits, key=fits.get)
    return fits[limit], limit


bins = record_or_measure("lesson10_binaries", "softmax binaries", binaries)
for r in bins.rows:
    r["fit"], r["limit"] = programs_per_sm(
        r["registers"], r["shared_bytes"], r["num_warps"], r
    )
xp.binaries_table(bins)

# %%
# A thread may have :datasheet:`cuda.max_registers`, and an SM has
# :datasheet:`cuda.registers_per_sm` for all its threads.  Values that do not
# fit are :term:`spilled <spill>` to local memory, in HBM behind the caches.
# So the package gives long rows more warps, and short rows a tile of several
# (the widget's notes give its choice for every length; the backward its own):

Claims("10 softmax", bins).check_all(xp.spill_claims(bins, ONE_ROW, SINGLE, FITS, LONG))

# %%
# The package's kernel
# --------------------
# The package's single-pass kernel is the one above with a tile of rows and
# warps chosen per length (the measurement above says where that pays), plus
# three things the next sections use; here it is in full (a test checks that it
# is :mod:`tilebook.ops.softmax`'s, character for character).  ``BLOCK_M`` rows
# make a tile, reduced along ``axis=1``; ``EVEN_M`` and ``EVEN_N`` drop the
# masks where the tiles fit exactly; the loop over tiles runs once with a
# program per tile, and strides on a smaller, *persistent* grid
# (``NUM_STAGES`` prefetches the next tile); ``EVICT`` is the L2 policy of
# loads and stores (``""``, ``"evict_first"`` or ``"evict_last"``); ``INT64``
# widens row offsets for tensors past ``2**31`` elements.


@triton.jit
def softmax_fwd_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    stride_x,  # elements between consecutive rows of x
    stride_y,
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,  # n_cols padded to a power of two
    EVEN_M: tl.constexpr,  # n_rows % BLOCK_M == 0: no row mask
    EVEN_N: tl.constexpr,  # n_cols == BLOCK_N: no column mask
    NUM_STAGES: tl.constexpr,  # >1 lets the compiler prefetch the next tile
    EVICT: tl.constexpr,
    INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    num_tiles = tl.cdiv(n_rows, BLOCK_M)
    # With one program per tile this loop runs once; with a persistent grid each
    # program strides over the tiles.
    for tile in tl.range(pid, num_tiles, nprog, num_stages=NUM_STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        if EVEN_N:
            mask = (rows < n_rows)[:, None]
        else:
            mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        if INT64:
            rows = rows.to(tl.int64)
        x_ptrs = x_ptr + rows[:, None] * stride_x + cols[None, :]
        if EVEN_M and EVEN_N:  # no predicates at all on exact tiles
            x = tl.load(x_ptrs, eviction_policy=EVICT)
        else:
            x = tl.load(x_ptrs, mask=mask, other=-float("inf"), eviction_policy=EVICT)
        x = x.to(tl.float32)
        # An all -inf row gives -inf - -inf = NaN here, which is what torch returns.
        e = tl.exp(x - tl.max(x, axis=1)[:, None])
        y = (e * (1.0 / tl.sum(e, axis=1))[:, None]).to(y_ptr.dtype.element_ty)
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        if EVEN_M and EVEN_N:
            tl.store(y_ptrs, y, eviction_policy=EVICT)
        else:
            tl.store(y_ptrs, y, mask=mask, eviction_policy=EVICT)


def softmax_tiles(x: torch.Tensor, cfg: sm.SoftmaxConfig, n_programs: int = 0):
    """The kernel above under ``cfg``, on at most ``n_programs`` programs if given."""
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    tiles = triton.cdiv(n_rows, cfg.block_m)
    args = (x, y, n_rows, n_cols, x.stride(0), y.stride(0), cfg.block_m, cfg.block_n)
    consts = (n_rows % cfg.block_m == 0, n_cols == cfg.block_n, cfg.num_stages)
    grid = (min(tiles, n_programs or tiles),)
    softmax_fwd_kernel[grid](*args, *consts, cfg.evict, False, num_warps=cfg.num_warps)
    return y


# %%
# When the row does not fit: the online softmax
# ---------------------------------------------
# Past ``ONLINE_THRESHOLD`` columns even the most warps leave a thread more
# values than registers (the single pass on the longest rows spills, above),
# so a row is walked in chunks.  The textbook takes three walks (maximum, sum,
# output); the *online* softmax (Milakov and Gimelshein, 2018; lesson 06
# derives it) folds the first two into one, with a running maximum :math:`m`
# and a running sum :math:`s` of :math:`e^{x - m}`.  For each chunk :math:`c`
#
# .. math::
#
#    m' = \max\bigl(m, \max_{i \in c} x_i\bigr), \qquad
#    s' = s \, e^{m - m'} + \sum_{i \in c} e^{x_i - m'} ,
#
# rescaling what it summed so far whenever the maximum grows; a second walk
# writes :math:`y_i = e^{x_i - m} / s`.  ``BLOCK_N`` is now the chunk length.
# While everything seen is ``-inf`` the kernel shifts by 0 instead of ``m``:
# ``-inf - -inf`` is NaN, and one NaN would poison the rest of the sum.


@triton.jit
def softmax_online_kernel(
    x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr
):
    x_row = x_ptr + tl.program_id(0) * stride_x
    y_row = y_ptr + tl.program_id(0) * stride_y
    cols = tl.arange(0, BLOCK_N)
    m = tl.full([], -float("inf"), tl.float32)  # running maximum
    s = tl.zeros([], tl.float32)  # running sum of exp(x - m)
    for start in tl.range(0, n_cols, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf"))
        x = x.to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
        m = m_new
    shift = tl.where(m == -float("inf"), 0.0, m)  # an all -inf row: 0 / 0, NaN
    for start in tl.range(0, n_cols, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf"))
        y = tl.exp(x.to(tl.float32) - shift) / s
        tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=offs < n_cols)


def softmax_online(x: torch.Tensor, chunk: int) -> torch.Tensor:
    y = torch.empty_like(x)
    softmax_online_kernel[(len(x),)](x, y, x.shape[1], x.stride(0), y.stride(0), chunk)
    return y


# %%
# The package's version, ``softmax_fwd_online_kernel``, adds the persistent loop
# over rows and two touches for the second read: the first walk loads with
# ``evict_last``, asking L2 to keep the row, and the second walk runs
# *backwards*, from the chunks read last, the likeliest still in L2.  Does it
# pay?  The measured ``online always`` and ``single pass always`` rows say:

said = xp.online_claims(fwd, (SHORT, MID, LONG), FITS, ONLINE, SINGLE)
Claims("10 softmax", fwd).check_all(said)

# %%
# The backward pass
# -----------------
# With :math:`y = \mathrm{softmax}(x)`, an incoming gradient :math:`dy` and
# :math:`\partial y_j / \partial x_i = y_j (\delta_{ij} - y_i)`, the chain rule gives
#
# .. math::
#
#    dx_i = \sum_j dy_j \, y_j (\delta_{ij} - y_i)
#         = y_i \Bigl(dy_i - \sum_j y_j \, dy_j\Bigr) .
#
# It needs the saved ``y`` and ``dy``: a dot product per row and an
# element-wise expression, three tensors moved for the forward's two.  Its
# smallest kernel is the forward's with two loads and one ``tl.sum`` (masked
# lanes load 0).  The package's ``softmax_bwd_kernel`` takes tiles of rows;
# past the same ``ONLINE_THRESHOLD`` it goes online too, with no rescaling:
# one walk sums ``y * dy``, a second writes ``dx``.


@triton.jit
def softmax_bwd_row_kernel(
    y_ptr, dy_ptr, dx_ptr, n_cols, stride, BLOCK_N: tl.constexpr
):
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    offs = tl.program_id(0) * stride + cols  # y, dy and dx share one layout
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dx = y * (dy - tl.sum(y * dy, axis=0))
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def softmax_backward_rows(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    assert y.is_contiguous() and dy.is_contiguous()
    dx = torch.empty_like(y)
    block_n = triton.next_power_of_2(y.shape[1])
    grid = (y.shape[0],)
    softmax_bwd_row_kernel[grid](y, dy, dx, y.shape[1], y.stride(0), BLOCK_N=block_n)
    return dx


# %%
# All of it is right: the online kernels (on short rows, through a small
# chunk), the kernel above on a grid smaller than its tiles (each program
# loops), the backward kernels against the formula in float64, and autograd.

CHUNK, FEW = 128, 3  # chunk length; programs of the looping grid
SMALL_ONLINE = sm.SoftmaxConfig(1, CHUNK, 4, online=True)


def grad_ref(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    y64, dy64 = y.double(), dy.double()
    return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))


report = CorrectnessReport("softmax kernels vs float64")
for dtype in DTYPES:
    x = awkward(dtype)
    ref = torch.softmax(x.double(), -1)
    y = sm.launch_softmax_forward(x, torch.empty_like(x), SMALL_ONLINE)
    report.check("online (package)", y, ref)
    report.check("online (lesson)", softmax_online(x, CHUNK), ref)
    report.check("looping grid", softmax_tiles(x, sm.pick_config(COLS), FEW), ref)
    report.check("tilebook.softmax", tilebook.softmax(x), ref)
    y, dy = tilebook.softmax(x).nan_to_num(), torch.randn_like(x)
    report.check("backward (lesson)", softmax_backward_rows(y, dy), grad_ref(y, dy))
    dx = sm.launch_softmax_backward(y, dy, torch.empty_like(y))
    report.check("backward (package)", dx, grad_ref(y, dy))
    dx = sm.launch_softmax_backward(y, dy, torch.empty_like(y), SMALL_ONLINE)
    report.check("backward online (package)", dx, grad_ref(y, dy))
    xg = x[1:].detach().requires_grad_()  # leaving out the all -inf row
    tilebook.softmax(xg).backward(dy[1:])
    x64 = x[1:].double().requires_grad_()
    torch.softmax(x64, -1).backward(dy[1:].double())
    report.check("autograd", xg.grad, x64.grad)
report.assert_ok()

# %%
# How fast is the backward?  The package's against PyTorch's (which autograd
# calls) and Inductor's, on a short row and on the longest row the package
# keeps in registers, where its backward reads ``y`` and ``dy`` twice (for the
# sum, then for ``dx``), the second time from L2, as Inductor's kernel does:

bwd = record_or_measure(
    "lesson10_backward",
    "softmax backward, bfloat16, 256 MiB per tensor: GB/s by row length",
    lambda: xp.backward(xp.shapes([MID, FITS])),
)
xp.backward_table(bwd)

# %%

Claims("10 softmax", bwd).check_all(xp.backward_claims(bwd, (MID, FITS)))

# %%

xp.say_backward(bwd)

# %%
# A persistent grid sized from occupancy
# --------------------------------------
# So far every launch starts a program per tile, and an SM starts the next
# whenever a resident one finishes.  A *persistent* grid starts only as many
# programs as fit at once (the ``per SM`` column of the table of binaries, from
# ``programs_per_sm``), and each loops over tiles ``pid, pid + nprog, …``.  It
# saves starting and retiring programs, and risks losing to a scheduler that is
# good at short ones.  A :class:`~tilebook.ops.softmax.SoftmaxConfig` with
# ``ctas_per_sm`` makes the package's launcher start that many per SM.  Two
# lengths, each with a program a tile and a persistent grid, the shorter also
# without the eviction hint that the package's tables give it:

TILE, PERSISTENT, NO_HINT = "a program a tile", "persistent", "no eviction hint"


def launch_rows() -> list[dict]:
    rows = []
    for n in (MID, LONG):
        cfg, fit = sm.pick_config(n), bins.one(impl="tilebook", n=n)["fit"]
        configs = {TILE: cfg, PERSISTENT: replace(cfg, ctas_per_sm=fit)}
        if not cfg.online:
            configs[NO_HINT] = replace(cfg, evict="")
        rows += xp.launches(xp.shapes([n])[0], configs)
    return rows


runs = record_or_measure("lesson10_launches", "softmax forward launches", launch_rows)
xp.launches_table(runs)

# %%

xp.say_launches(runs, PERSISTENT, NO_HINT, TILE)

# %%
# The package measures nothing when called:
# :func:`~tilebook.ops.softmax.pick_config` looks the launch up by padded row
# width in the winners of ``benchmarks/softmax.py --tune``, tuned once on one
# GPU (rows kept in registers), and longer rows get one online configuration, a
# program a tile; wherever another launch runs *faster* on this page, its choice
# is behind on this GPU.  The method
# is the lesson, not the verdict: size the grid from the compiled kernel,
# measure both on each GPU and Triton.  The whole forward against PyTorch:

Claims("10 softmax", fwd).check_all(xp.versus_claims(fwd, WIDTHS, (MID, FITS)))

# %%

xp.say_forward(fwd)

# %%
# All of it at once
# -----------------
# The forward measurement: pick an implementation and a row length, or click a
# cell.  Orange cells run under half the best one's rate; notes say what ran.


def note(r: dict) -> str:
    n, impl = r["n"], r["impl"]
    if impl == ONE_ROW:
        spilled = [f", {r['spills']} spilled" for r in bins.select(impl=ONE_ROW, n=n)]
        per = n // (32 * ROW_WARPS)
        return f"one row on {ROW_WARPS} warps: {per} values a thread" + "".join(spilled)
    if impl == ONLINE:
        return "reads each row twice: for the maximum and sum, then to write"
    if impl == SINGLE:
        spills = bins.one(impl=SINGLE, n=n)["spills"]
        return f"one row in registers, {spills} values a thread spilled"
    if impl == "torch":
        return "PyTorch's CUDA kernel"
    if impl == "torch.compile":
        return "the Triton kernel Inductor wrote"
    c = sm.pick_config(n)
    what = "online, chunks of" if c.online else f"{c.block_m} rows of"
    return f"{what} {c.block_n} a program, on {c.num_warps} warps"


cells = [r | {"note": note(r)} for r in fwd.rows]
own = "the same launch as tilebook's at this length"  # so measured once, there
cells += [
    r | {"impl": SINGLE if r["n"] <= FITS else ONLINE, "note": own}
    for r in fwd.select(impl="tilebook")
]
SweepExplorer(cells, **xp.explorer_setup(fwd, IMPLS))

# %%
# Try this
# --------
#
# Each exercise that asks for a kernel ends with the line that checks it
# (``from tilebook.course.exercises import check``;
# ``cases = [(awkward(torch.float32),)]``).
#
# 1. Skip the rescale: in ``softmax_online_kernel``, replace
#    ``s = s * tl.exp(m - shift) + …`` by ``s = s + …``.  Which rows go wrong,
#    and which way?  ``check(lambda x: softmax_online(x, CHUNK), lambda x:
#    torch.softmax(x, -1), cases)`` says.
#
#    .. dropdown:: Solution
#
#       The checker names the rows whose maximum is not in the first chunk:
#       terms summed against a smaller maximum are too large by
#       :math:`e^{m_{final} - m_{then}}`, so the probabilities come out too
#       small.  Rows whose maximum comes first stay right: random data can
#       miss the bug.
#
# 2. Write ``log_softmax_kernel``.  Which lines of ``softmax_row_kernel``
#    change?  ``check(lambda x: softmax_rows(x, log_softmax_kernel), lambda x:
#    torch.log_softmax(x, -1), cases)``.
#
#    .. dropdown:: Solution
#
#       The two that compute ``e`` and ``y``: ``z = x - tl.max(x, axis=0)`` and
#       ``y = z - tl.log(tl.sum(tl.exp(z), axis=0))``.  An all ``-inf`` row
#       still gives NaN, like ``torch.log_softmax``; the backward becomes
#       ``dx = dy - exp(y) * sum(dy)``.
#
# 3. Add a temperature, ``softmax(x / T)``, in one pass: ``softmax_t_kernel``,
#    with an argument ``inv_t`` after the strides.  What changes in the
#    backward?  ``check(lambda x: softmax_rows(x, softmax_t_kernel, 0.5),
#    lambda x: torch.softmax(x * 0.5, -1), cases)``.
#
#    .. dropdown:: Solution
#
#       Multiply after the load, ``x = x.to(tl.float32) * inv_t``; the chain
#       rule adds ``inv_t = 1 / T`` to the backward,
#       ``dx = inv_t * y * (dy - sum(y * dy))``.  No extra byte moves.
#
# 4. In the widget, compare ``one row a program`` with ``tilebook`` on the
#    shortest rows and on the longest that fit.  What differs?
#
#    .. dropdown:: Solution
#
#       On short rows, the rows a program (the notes give ``BLOCK_M``); on the
#       longest, the warps: on the default ones a thread spills.
