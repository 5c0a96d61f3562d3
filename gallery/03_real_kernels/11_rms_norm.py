"""
11. rms_norm: one pass forward, a lock-free backward
====================================================

Every block of a Llama-style transformer normalises its activations with
RMSNorm: each row of ``x`` (one token's hidden vector) is divided by its root
mean square and multiplied by a learned scale ``w``.  There is almost no
arithmetic in it, so its cost is memory traffic, and written as a chain of
PyTorch operations it reads and writes the activations several times over.  A
kernel can do it in one read and one write.

The backward pass is the more interesting half: the gradient of ``w`` is a sum
over *every* row of the batch.  We do it without atomics and without locks, and
the answer comes out the same, bit for bit, on every run.

.. rubric:: You will learn

- to compute a row's statistic and apply it in the same program, so that the row
  is read from memory once, and what to keep for the backward pass;
- to derive the backward of a normalisation and write it as a kernel;
- to sum the weight gradient over all rows with per-program fp32 partial sums:
  no atomics, no locks, the same bits on every run;
- which of the package's refinements (a grid sized from the :term:`SM` count,
  several rows per program, an eviction hint, chunked kernels for long rows) a
  measurement supports on this GPU, and which buy nothing;
- what accumulating in bf16 costs, and why the weight gradient pays the most.

The finished op is :func:`tilebook.rms_norm` (kernels, launchers and its
``torch.autograd.Function``: :mod:`tilebook.ops.rms_norm`).
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` is imported first, so that it can choose between the GPU and
# Triton's interpreter before Triton loads.  The measurements of this page are
# defined once, for the lesson and for ``benchmarks/rms_norm.py``, in
# :mod:`tilebook.course.experiments.rms_norm` (``exp`` below), with the tables,
# sentences and claims the page makes of them.

import tilebook

from functools import partial

import torch
import triton
import triton.language as tl

from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport, default_tolerance
from tilebook.course.claims import Claims
from tilebook.course.datasheet import fact
from tilebook.course.experiments import rms_norm as exp
from tilebook.ops import rms_norm as package
from tilebook.course.plots import plot_record
from tilebook.course.widgets import SweepExplorer

print(tilebook.banner())
DEVICE, EPS, GPU = tilebook.device(), exp.EPS, tilebook.is_gpu()
# The interpreter has no SMs: four are enough to exercise the partial sums.
SM_COUNT = torch.cuda.get_device_properties(0).multi_processor_count if GPU else 4
HIDDEN = (1024, 8192, 65536)  # the row lengths measured on a GPU

# %%
# What RMSNorm computes
# ---------------------
# For one row :math:`x` of :math:`H` numbers and the weight :math:`w`:
#
# .. math::
#
#    \mathrm{rstd} = \Big(\frac{1}{H}\sum_{j} x_j^2 + \varepsilon\Big)^{-1/2},
#    \qquad y_j = x_j \,\mathrm{rstd}\, w_j .
#
# One statistic per row, and no mean to subtract (that is LayerNorm).  Written
# in PyTorch, in fp32 as it should be, every operation is a kernel of its own
# that reads its input from memory and writes its result back:
#
# .. code-block:: python
#
#    xf = x.float()                              # read x, write xf
#    ms = xf.pow(2).mean(-1, keepdim=True)       # read xf, write xf**2, read it
#    y = (xf * torch.rsqrt(ms + eps) * w.float()).to(x.dtype)  # three more
#
# Counted per element for bf16 data, that chain moves about ten times the bytes
# that one read of ``x`` and one write of ``y`` need: the case for a kernel.
#
# The forward kernel
# ------------------
# The smallest kernel that does it: one :term:`program` per row, holding the whole row
# as one block.  It loads the row, squares and sums it in fp32, turns the sum into
# ``rstd``, scales the *same* values and stores ``y``.  Nothing is written between the
# reduction and the scaling, so ``x`` crosses the memory bus once.  The price: the
# whole row must fit in one program's :term:`registers <register>`.  The arguments:
#
# ``X``, ``Y``, ``stride``
#     Pointers to the input and output rows, ``stride`` elements apart, unit stride within.
# ``W``
#     The weight, ``n_cols`` values shared by every row.
# ``RSTD``
#     One fp32 per row, kept for the backward pass so that it need not reduce
#     the row again: four bytes a row, against ``2 * H`` for the row itself.
# ``n_cols``, ``eps``
#     The hidden size ``H``, and what keeps an all-zero row from dividing by 0.
# ``BLOCK_N: tl.constexpr``
#     ``n_cols`` rounded up to a power of two (``tl.arange`` needs one); the mask
#     ``cols < n_cols`` switches the padding off, and masked lanes load 0, which
#     adds nothing to the sum of squares.
#
# Whatever the input type, the arithmetic is fp32; ``y`` is cast back to the
# output's element type only for the store.


@triton.jit
def fwd_kernel(X, W, Y, RSTD, n_cols, stride, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


# %%
# The launcher gives each row its program.  The number of :term:`warps <warp>`
# grows with ``BLOCK_N`` (``warps_for``), from one warp to the most a program
# may have; how many of the row's values a thread then holds follows below.


def warps_for(block_n: int) -> int:
    return min(32, max(1, block_n // 512))


def forward(x, w, eps=EPS):
    """``y`` and the fp32 ``rstd`` of each row of a contiguous 2-D ``x``."""
    n_rows, n_cols = x.shape
    y, rstd = torch.empty_like(x), x.new_empty(n_rows, dtype=torch.float32)
    block = triton.next_power_of_2(n_cols)
    args = (x, w, y, rstd, n_cols, x.stride(0), eps)
    fwd_kernel[(n_rows,)](*args, BLOCK_N=block, num_warps=warps_for(block))
    return y, rstd


for h in (7, 1000, *HIDDEN):
    block = triton.next_power_of_2(h)
    warps = warps_for(block)
    per = block / (32 * warps)
    print(f"H={h}: BLOCK_N={block}, num_warps={warps}, {per:g} a thread")

# %%

PER = {2**k: 2**k / (32 * warps_for(2**k)) for k in range(3, 17)}  # BLOCK_N: values
exp.say_per_thread(PER, warps_for)

# %%
# The backward pass, on paper
# ---------------------------
# Write :math:`\hat{x}_j = x_j\,\mathrm{rstd}` for the normalised row and
# :math:`g_j = dy_j\, w_j` for the incoming gradient after the scale.  The weight
# gradient collects :math:`dy_j\, \hat{x}_j` from every row.  The input gradient
# has a direct part, :math:`\mathrm{rstd}\; g_j`, and a part through ``rstd``,
# which depends on every element of its row (:math:`\partial\, \mathrm{rstd} /
# \partial x_k = -\mathrm{rstd}^3 x_k / H`).  Put together, per row:
#
# .. math::
#
#    c = \frac{1}{H}\sum_k g_k \hat{x}_k, \qquad
#    dx_j = \mathrm{rstd}\,\big(g_j - \hat{x}_j\, c\big), \qquad
#    dw_j = \sum_{\text{rows}} dy_j\, \hat{x}_j .
#
# With ``rstd`` saved, a row's ``dx`` needs one reduction, ``c``.  The hard part
# is ``dw``: a sum over all rows, so across programs.  The usual ways:
#
# - ``tl.atomic_add`` into ``H`` fp32 numbers: every program hammers the same
#   addresses, and the order of the additions, so the rounding, so the result,
#   changes from run to run;
# - a buffer guarded by a lock (``tl.atomic_cas`` spinning on a flag): programs
#   queue behind each other, and the order still varies;
# - **per-program partial sums**: launch a fixed number of programs, let each
#   walk many rows and keep its share of ``dw`` in fp32 registers, then write it
#   once, as one row of a ``(programs, H)`` buffer.  A plain ``sum(dim=0)`` over
#   that small buffer finishes the job, in a fixed order.
#
# The backward kernel
# -------------------
# The third way.  Program ``pid`` takes the rows ``pid``, ``pid + programs``,
# ``pid + 2 * programs`` and so on (``tl.num_programs(0)`` is the grid size), so
# that at any moment the grid works on neighbouring rows.  ``DY``, ``X`` and
# ``DX`` (the gradient it writes) share one ``stride``; ``DW_PART`` points to the
# ``(programs, n_cols)`` fp32 buffer, whose row ``pid`` receives program
# ``pid``'s share; ``n_rows`` bounds the loop.


@triton.jit
def bwd_kernel(
    DY, X, W, RSTD, DX, DW_PART, n_rows, n_cols, stride, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)  # this program's share of dw
    for row in range(pid, n_rows, tl.num_programs(0)):
        offs = row * stride + cols
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        x_hat = x * rstd
        g = dy * w
        c = tl.sum(g * x_hat, axis=0) / n_cols
        tl.store(DX + offs, ((g - x_hat * c) * rstd).to(DX.dtype.element_ty), mask=mask)
        dw += dy * x_hat
    tl.store(DW_PART + pid * n_cols + cols, dw, mask=mask)


def backward(dy, x, w, rstd, programs, kernel=bwd_kernel):
    """``dx`` and ``dw`` for contiguous 2-D ``dy`` and ``x``, on ``programs``."""
    assert dy.stride() == x.stride() and x.stride(1) == 1
    n_rows, n_cols = x.shape
    programs = min(programs, n_rows)
    dx = torch.empty_like(x)
    dw_part = x.new_empty(programs, n_cols, dtype=torch.float32)
    block = triton.next_power_of_2(n_cols)
    args = (dy, x, w, rstd, dx, dw_part, n_rows, n_cols, x.stride(0))
    kernel[(programs,)](*args, BLOCK_N=block, num_warps=warps_for(block))
    # The last step of the sum over rows: (programs, H) to H, in a fixed order.
    return dx, dw_part.sum(dim=0).to(w.dtype)


# %%
# Is it right?
# ------------
# The reference does not use our derivation: autograd differentiates the formula
# in float64, from the same rounded inputs
# (:func:`~tilebook.course.experiments.rms_norm.reference`).  The shapes are ragged
# (rows of 7 and 1000), and every backward runs on two grids, one program per
# row and three programs with long chains of rows: the grid changes the order of
# the additions, never the answer.  The package's op is checked alongside,
# bfloat16 on a GPU only (the interpreter computes it wrongly).  A relative
# error past ``tol`` (:func:`~tilebook.course.check.default_tolerance`, which the table
# rounds to one digit) stops the build.

BIG = tilebook.pick(gpu=(4096, 8192, torch.bfloat16), cpu=(64, 2048, torch.float32))
report = CorrectnessReport("rms_norm vs float64")
for n_rows, n_cols, dtype in [(37, 7, torch.float32), (9, 1000, torch.float16), BIG]:
    x, w, dy = exp.inputs(n_rows, n_cols, dtype, device=DEVICE)
    y64, dx64, dw64 = exp.reference(x, w, dy)
    y, rstd = forward(x, w)
    report.check("lesson y", y, y64)
    for programs in (n_rows, 3):
        dx, dw = backward(dy, x, w, rstd, programs)
        report.check(f"lesson dx, grid {programs}", dx, dx64)
        report.check(f"lesson dw, grid {programs}", dw, dw64)
xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
y = tilebook.rms_norm(xg, wg, eps=EPS)
dx, dw = torch.autograd.grad(y, (xg, wg), dy)
for name, got, want in [("y", y, y64), ("dx", dx, dx64), ("dw", dw, dw64)]:
    report.check(f"tilebook.rms_norm {name}", got, want)
report.assert_ok()

# %%
# Every partial sum is added in the same order on every run, so ``dw`` does not
# change from one run to the next, not even in its last bit:

dws = [backward(dy, x, w, rstd, programs=3 * SM_COUNT)[1] for _ in range(3)]
same = all(torch.equal(dws[0], d) for d in dws)
assert same
print("dw identical, bit for bit, over three runs:", same)

# %%
# How many programs?
# ------------------
# Any grid gives the right answer; a measurement says which is fast.  Too few
# programs leave SMs idle.  Too many make the partial buffer large: with one
# program per row it holds ``n_rows * H`` fp32 values, twice the bytes of a
# bf16 ``x``, written once and read back by the final sum.  In between, a grid
# sized from the SM count: a few programs on each, each looping over many rows.
# Here is the backward at ``H = GRID_H`` on tensors (their size in the caption)
# far larger than the :term:`L2` cache of any GPU in the datasheet, timed in
# interleaved rounds by :func:`~tilebook.course.experiments.rms_norm.kernels`:

GRID_H = 8192


def timed(launch):  # one round's timing of one launch: do_bench's median, in ms
    return triton.testing.do_bench(launch, warmup=10, rep=40, return_mode="median")


def grid_sweep():
    grids = {"one per row": exp.ELEMENTS // GRID_H}
    grids |= {f"{k} per SM": k * SM_COUNT for k in (1, 2, 4)}
    pairs = {g: (forward, partial(backward, programs=p)) for g, p in grids.items()}
    rows = exp.kernels(pairs, GRID_H, passes=["backward"], timer=timed)
    return [{**r, "programs": grids[r["impl"]]} for r in rows]


grid = record_or_measure("lesson11_grid", "rms_norm backward by grid", grid_sweep)
exp.grid_table(grid)

# %%
# The slow end is plain.  The rest is read with the spread, where a gap inside
# it is no gap.  From here on the lesson sizes its grid as the package does: a
# fixed number of warps on each SM (below), so many small programs for short
# rows and few large ones for long rows.


def grid_for(n_cols: int, sms: int = SM_COUNT) -> int:
    per_sm = package.BWD_WARPS_PER_SM // warps_for(triton.next_power_of_2(n_cols))
    return sms * max(1, per_sm)


Claims("11 rms_norm", grid).check_all(exp.grid_claims(grid))

# %%
sms = grid.provenance["sm_count"]  # of the GPU that measured, read anywhere
choice = grid.one(impl=f"{grid_for(GRID_H, sms) // sms} per SM")
exp.say_grid(grid, choice)

# %%
# What the package adds, measured
# -------------------------------
# The lesson's kernels are correct, and short; each of the package's additions
# has to earn its place, and the measurement says which do on this GPU.  The experiment below times the lesson's launchers
# against :func:`~tilebook.ops.rms_norm.launch_rms_norm_fwd` and
# :func:`~tilebook.ops.rms_norm.launch_rms_norm_bwd` at the three row lengths of
# ``HIDDEN``.  The package's forward groups short rows several to a program and,
# on tensors far larger than L2 (as here), hints ``evict_last`` on its loads (if
# lines must leave L2, these go last); where it groups rows, it also runs one row a
# program with the lesson's warps, to tell the hint from the grouping ("hint only").
# Every variant is checked against float64 before it is timed.


def package_fwd(**options):
    return lambda x, w: package.launch_rms_norm_fwd(x, w, EPS, **options)


def lesson_bwd(dy, x, w, rstd, kernel=bwd_kernel):
    return backward(dy, x, w, rstd, grid_for(x.shape[1]), kernel)


def steps_sweep():
    rows = []
    for h in HIDDEN:
        fwds = {"lesson": forward, "package": package_fwd()}
        block, grouped, _ = package.fwd_config(h)
        if grouped > 1 and h <= package.FWD_CHUNKED_THRESHOLD:
            one_row = {"rows_per_program": 1, "num_warps": warps_for(block)}
            fwds["hint only"] = package_fwd(**one_row)
        pairs = {k: (f, lesson_bwd) for k, f in fwds.items()}
        rows += exp.kernels(pairs, h, passes=["forward"], timer=timed)
        bwds = {"lesson": lesson_bwd, "package": package.launch_rms_norm_bwd}
        pairs = {k: (forward, b) for k, b in bwds.items()}
        rows += exp.kernels(pairs, h, passes=["backward"], timer=timed)
    return rows


steps = record_or_measure("lesson11_steps", "rms_norm: lesson vs package", steps_sweep)
exp.steps_table(steps)

# %%
# What each addition buys, as a ratio of speeds with its spread.  Which
# additions are at work at each width comes from the package's launch rules
# (:func:`~tilebook.ops.rms_norm.fwd_config`,
# :func:`~tilebook.ops.rms_norm.bwd_config` and the chunking thresholds):

(short, mid, long_h), tol = HIDDEN, default_tolerance(exp.DTYPE)
exp.additions_table(steps, HIDDEN)

# %%
Claims("11 rms_norm", steps).check_all(exp.additions_claims(steps, HIDDEN, tol))

# %%
# Where the package's launch is slower than the lesson's, its configuration
# comes from a tuning run on one GPU, which ``benchmarks/rms_norm.py --tune``
# repeats on another.
#
# **Long rows.**  The chunked kernels are the large step.  Why the lesson's
# kernels fall apart at long rows is arithmetic on the launch configuration.  An SM has
# :datasheet:`cuda.registers_per_sm`, shared by the threads of its programs, and a
# thread may use at most :datasheet:`cuda.max_registers`.  When a thread needs more
# values than it has registers, the compiler has to :term:`spill` the rest to local
# memory, off-chip, and every row pays that traffic on top of its own.


def per_thread(h):
    """(values a thread of the backward holds, registers a thread may use)."""
    block = triton.next_power_of_2(h)
    threads = 32 * warps_for(block)
    regs = fact("cuda.registers_per_sm").value // threads
    return 4 * block // threads, min(fact("cuda.max_registers").value, regs)


need, most = per_thread(long_h)
exp.say_long_rows(long_h, 32 * warps_for(long_h), need, most)

# %%
# A chunked kernel's registers scale with a chunk, not with ``H``.  The
# package's chunked forward (:func:`~tilebook.ops.rms_norm.rms_norm_fwd_chunked_kernel`)
# walks each row twice, for the sum of squares and then, newest chunk first, to
# write ``y``, which then mostly comes from L2.  Its chunked backward writes each
# row chunk's ``sum(dy * w * x)`` (:func:`~tilebook.ops.rms_norm.rms_norm_bwd_dot_kernel`),
# then gives each program a column chunk and a share of the rows, keeping that
# chunk's ``dw`` share in registers, as ours does
# (:func:`~tilebook.ops.rms_norm.rms_norm_bwd_chunked_kernel`).  The whole-row kernels,
# :func:`~tilebook.ops.rms_norm.rms_norm_fwd_kernel` and
# :func:`~tilebook.ops.rms_norm.rms_norm_bwd_kernel`, are the lesson's plus the
# table, 64-bit offsets and a kernel that sums the partials in place of two torch
# calls (:func:`~tilebook.ops.partials.sum_partials_kernel`).
#
# How the package compares
# ------------------------
# Now :func:`tilebook.rms_norm` through its autograd function, as training calls
# it, against PyTorch's own ``F.rms_norm``, forward and backward
# (:func:`~tilebook.course.experiments.rms_norm.versus`).  ``benchmarks/rms_norm.py``
# adds the formula compiled by ``torch.compile``, whose compiles, one per width
# and pass, this page's time budget cannot pay.  The bands are the p20-p80
# spread over interleaved rounds.


def measure_versus():
    return exp.versus(exp.ops(False), HIDDEN, timer=timed)


vs = record_or_measure("lesson11_versus", "rms_norm vs PyTorch", measure_versus)
style = {"x": "hidden", "y": "gbps", "series": "impl", "logx": True}
style |= {"ceiling": vs.provenance["copy_gbps"], "ylabel": "GB/s that must move"}
plot_record(vs, where={"pass": "forward"}, title="forward, bf16", **style)

# %%
plot_record(vs, where={"pass": "backward"}, title="backward (autograd), bf16", **style)

# %%
# The same data as speed ratios, above 1 where tilebook is faster.  Where the
# table says level, the gap is inside the spread of this build, and which side
# it falls on can change from run to run.


exp.versus_table(vs)

# %%
Claims("11 rms_norm", vs).check_all(exp.versus_claims(vs, HIDDEN, tol))

# %%
# The backward through autograd includes the host's work around the kernels:
# the autograd engine, ``RMSNormFunction.backward`` and the launches.  The
# launcher alone, in the table of refinements, includes none of it, and
# do_bench leaves the GPU idle between calls, where host time shows:

exp.say_autograd(vs, steps, mid, HIDDEN)

# %%
# Accumulating in bf16
# --------------------
# Every sum above is accumulated in fp32, even for bf16 data.  That is not automatic:
# ``tl.sum`` adds in the type it is given, so a kernel that forgets the
# ``.to(tl.float32)`` adds bf16 numbers in bf16, which keeps eight significant bits.
# How much that costs depends less on how many numbers are added than on *how long a
# chain of additions* is: once a running sum is a few hundred times larger than what
# is added to it, bf16 rounds the addition away.  Inside one row, each thread adds a
# handful of values and a tree combines the threads: short chains.  A program's share
# of ``dw`` is one long chain, one addition per row it walks.  Here is the backward
# with the upcast forgotten in both of its sums (the changed lines end in ``# bf16``):


@triton.jit
def bwd_kernel_bf16(
    DY, X, W, RSTD, DX, DW_PART, n_rows, n_cols, stride, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.bfloat16)  # bf16
    for row in range(pid, n_rows, tl.num_programs(0)):
        offs = row * stride + cols
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        x_hat = x * rstd
        g = dy * w
        c = tl.sum((g * x_hat).to(tl.bfloat16), axis=0).to(tl.float32) / n_cols  # bf16
        tl.store(DX + offs, ((g - x_hat * c) * rstd).to(DX.dtype.element_ty), mask=mask)
        dw += (dy * x_hat).to(tl.bfloat16)  # bf16
    tl.store(DW_PART + pid * n_cols + cols, dw.to(tl.float32), mask=mask)  # bf16


# %%
# On a GPU (the interpreter's bf16 arithmetic cannot be trusted) the experiment
# runs a training step, the lesson's forward and then each backward, at each
# width, and measures its speed and the errors of ``y``, ``dx`` and ``dw``
# against float64.  The yardstick for an error is what rounding the exact answer
# to bf16 costs, which no kernel can beat; a setting whose error is more than
# ``WRONG`` times that adds error of its own, and the widget marks it wrong.
# Rows too long for registers are marked as well, with the arithmetic above.

WRONG = 2.0
PAIRS = {
    "fp32": (forward, lesson_bwd),
    "bf16": (forward, partial(lesson_bwd, kernel=bwd_kernel_bf16)),
}


def accumulate_sweep():
    return [
        r for h in HIDDEN for r in exp.kernels(PAIRS, h, passes=["step"], timer=timed)
    ]


accuracy = record_or_measure(
    "lesson11_accumulate", "rms_norm: accumulate in", accumulate_sweep
)
sms = accuracy.provenance["sm_count"]


def explain(r):
    c, k = max((v, k) for k, v in exp.cost(r).items())
    need, most = per_thread(r["hidden"])
    chain = exp.ELEMENTS // r["hidden"] / grid_for(r["hidden"], sms)  # rows a program
    errs = ", ".join(f"{k} {r['err_' + k]:.1e}" for k in ("y", "dx", "dw"))
    out = {**r, "wrong": "", "note": ""}
    out["extra"] = f"errors {errs}; {chain:.0f} rows a program"
    if c > WRONG:
        out["wrong"] = f"{k} error {c:.1f} times that of rounding the exact answer"
    if need > most:
        out["note"] = f"{need} values a thread, at most {most:.0f} registers: spills"
    return out


SweepExplorer(
    [explain(r) for r in accuracy.rows], **exp.explorer_setup(accuracy, PAIRS)
)

# %%
chain = {h: exp.ELEMENTS // h / grid_for(h, sms) for h in HIDDEN}  # rows a program adds
said = exp.accumulate_claims(accuracy, HIDDEN, chain, WRONG, tol)
Claims("11 rms_norm", accuracy).check_all(said)

# %%
exp.say_accumulate(accuracy, HIDDEN, tol)

# %%
# Try this
# --------
#
# Each exercise that asks for a kernel ends with the line that checks it
# (``from tilebook.course.exercises import check``;
# ``cases = [exp.inputs(37, 1000, torch.float32, device=DEVICE)]``, each
# ``(x, w, dy)``).
#
# 1. Pre-norm transformers add the residual first, ``h = x + r``, keep ``h`` and
#    normalise it.  Fuse the addition into ``fwd_kernel`` (``h`` to ``out[0]``,
#    ``y`` to ``out[1]``).  How many bytes per element does it move in bf16, against
#    an addition followed by :func:`tilebook.rms_norm`?  ``check(add_norm, lambda x,
#    w, r: torch.stack([x + r, exp.reference(x + r, w, r)[0]]), cases)``.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def add_norm_kernel(X, R, W, H, Y, RSTD, n_cols, stride, eps,
#                              BLOCK_N: tl.constexpr):
#              row = tl.program_id(0)
#              cols = tl.arange(0, BLOCK_N)
#              mask = cols < n_cols
#              offs = row * stride + cols
#              x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
#              h = (x + tl.load(R + offs, mask=mask, other=0.0)).to(H.dtype.element_ty)
#              tl.store(H + offs, h, mask=mask)
#              x = h.to(tl.float32)
#              w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
#              rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
#              tl.store(RSTD + row, rstd)
#              tl.store(Y + offs, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)
#
#          def add_norm(x, w, r, out):  # *out: out[0] (h) and out[1] (y)
#              (rows, cols), rstd = x.shape, x.new_empty(len(x), dtype=torch.float32)
#              add_norm_kernel[(rows,)](x, r, w, *out, rstd, cols, x.stride(0), EPS,
#                                       BLOCK_N=triton.next_power_of_2(cols))
#
#       The fused kernel reads two tensors and writes two: eight bytes an
#       element.  Unfused, the addition reads two and writes one, and the norm
#       reads that one back and writes ``y``: ten.  A fifth less traffic.
#
# 2. Replace the partial buffer by ``tl.atomic_add(DW_PART + cols, dw,
#    mask=mask)`` into its row 0, zeroed (``x.new_zeros`` in ``backward``), and
#    rerun the bit-for-bit check on a GPU.  What changes?  ``check(lambda x, w,
#    dy: backward(dy, x, w, forward(x, w)[1], 4)[1], lambda x, w, dy:
#    exp.reference(x, w, dy)[2], cases)``.
#
#    .. dropdown:: Solution
#
#       ``dw`` is still right (the check passes) but changes in its last bits
#       from run to run: floating-point addition is not associative, and the
#       order in which the programs' adds land depends on which program
#       finishes first.  With a grid sized from the SMs there is one add per
#       program and column, so expect the speed to change little; what the
#       partial buffer buys is reproducibility.
#
# 3. In the widget, bf16 sums cost ``dw`` least at the longest width.  Why, and
#    what would make it worse there?
#
#    .. dropdown:: Solution
#
#       The error grows with each program's chain of additions, one per row it
#       walks.  The tensors hold the same number of elements at every width, so
#       long rows mean few rows, and few rows per program.  A smaller grid
#       (``backward(..., programs=SM_COUNT // 4)``) or a larger batch makes the
#       chains, and the error, longer.
