"""
06. Reductions and the online softmax: from a tile to one number
================================================================

A *reduction* makes one value of many: a row's sum, its maximum, where the
maximum is.  Inside a program Triton has a primitive for each, and the
compiler spreads the work over the threads.  Across programs there is none:
programs cannot wait for each other, so a sum over many ends with atomics or
a second pass.  We take the primitives, follow one ``tl.sum`` into compiled
code, sum across programs both ways, and end with the reduction lessons 10
and 12 are built on: the online softmax, a maximum and a sum in one walk.

.. rubric:: You will learn

- ``tl.sum``, ``tl.max``, ``tl.argmax``, ``tl.cumsum``, and ``tl.reduce`` with a
  combine function of your own; why masked lanes load the neutral element;
- how a tile reduction lowers: adds inside each thread, butterfly shuffles
  inside a :term:`warp`, :term:`shared memory` and a barrier across warps,
  counted in the :term:`PTX`;
- why softmax subtracts the maximum;
- sums across programs with ``tl.atomic_add``, ``tl.atomic_max`` and a lock on
  ``tl.atomic_cas``, against per-program partial sums: what contention costs,
  and why an atomic float sum is not repeatable bit for bit;
- the online softmax recurrence (Milakov and Gimelshein, 2018), its error
  against the two-pass softmax, and why it makes flash attention possible.

The online softmax is the first walk of ``softmax_fwd_online_kernel`` in
:mod:`tilebook.ops.softmax`, behind :func:`tilebook.softmax`; lesson 12
carries it into :func:`tilebook.flash_attention`.
"""

# %%
# Setting up
# ----------
# The tables, sentences and claims this page makes of its compiles, records and
# computations are made in :mod:`tilebook.course.experiments.reductions`
# (``experiment`` below).

import tilebook

import warnings

import torch
import triton
import triton.language as tl

import tilebook.ops.softmax as sm
from tilebook.course.aot import compile_many
from tilebook.course.bench import record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.experiments import reductions as experiment
from tilebook.course.widgets_softmax import OnlineSoftmaxStepper

print(tilebook.banner())
DEVICE = tilebook.device()
# numpy, which runs the interpreter, warns where -inf meets -inf in the padding.
warnings.filterwarnings("ignore", "invalid value", RuntimeWarning)


# %%
# Reducing a tile
# ---------------
# A program loads its row as one tile and reduces it along ``axis=0``: each
# reduction returns a scalar (``tl.cumsum`` a tile of running sums).  Rows of
# the float32 ``x`` start ``stride`` elements apart (a slice ``x[:, 4:]``
# works); ``sum_ptr``, ``max_ptr`` and ``argmax_ptr`` (``int32``) take one
# number a row, ``cumsum_ptr`` a contiguous ``rows x n_cols`` tensor.
# ``BLOCK`` is ``n_cols`` rounded up to a power of two, as ``tl.arange`` needs.
#
# The padding lanes past ``n_cols`` take part in every reduction, so they must
# hold the *neutral element* of each: ``0`` for a sum (``other=0.0``), ``-inf``
# for a maximum (``tl.where`` swaps it in).  A padding of zeros would win the
# maximum of a row of negative numbers.


@triton.jit
def row_reduce_kernel(
    x_ptr, sum_ptr, max_ptr, argmax_ptr, cumsum_ptr, n_cols, stride, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    tl.store(sum_ptr + row, tl.sum(x, axis=0))
    x_max = tl.where(mask, x, -float("inf"))  # the padding must never win
    tl.store(max_ptr + row, tl.max(x_max, axis=0))
    tl.store(argmax_ptr + row, tl.argmax(x_max, axis=0))
    tl.store(cumsum_ptr + row * n_cols + cols, tl.cumsum(x, axis=0), mask=mask)


def row_reduce(x: torch.Tensor):
    (rows, cols), block = x.shape, triton.next_power_of_2(x.shape[1])
    sums, maxs, cums = x.new_empty(rows), x.new_empty(rows), x.new_empty(rows, cols)
    args = x.new_empty(rows, dtype=torch.int32)
    row_reduce_kernel[(rows,)](
        x, sums, maxs, args, cums, cols, x.stride(0), BLOCK=block
    )
    return sums, maxs, args, cums


# %%
# Your own combine: ``tl.reduce``
# -------------------------------
# ``tl.sum`` and ``tl.max`` are ``tl.reduce`` with a fixed *combine function*,
# two values in, one out.  ``tl.reduce(values, axis, combine)`` takes any
# ``@triton.jit`` combine, over several tiles at once if it combines tuples.
# The compiler applies it in whatever tree it likes (within a thread, across
# threads, across warps), so it must be *associative*.
#
# A useful one: ``log(sum(exp(x)))``, a softmax's normaliser.  Keep for a
# group of values the pair :math:`(m, s)`, its maximum and the sum of
# :math:`e^{x - m}` over it; two groups merge at the larger maximum:
#
# .. math::
#
#    (m_1, s_1) \oplus (m_2, s_2) = \bigl(m,\; s_1 e^{m_1 - m} + s_2 e^{m_2 - m}\bigr),
#    \qquad m = \max(m_1, m_2),
#
# One value ``x`` is the group :math:`(x, 1)`, a padding lane
# :math:`(-\infty, 0)`; two of those would make :math:`e^{-\infty + \infty}`,
# NaN, so the combine shifts by 0 when both are empty.  Remember this
# operator: it is the whole of the online softmax at the end of the lesson.


@triton.jit
def lse_combine(m1, s1, m2, s2):
    m = tl.maximum(m1, m2)
    shift = tl.where(m == -float("inf"), 0.0, m)  # two empty groups: no NaN
    return m, s1 * tl.exp(m1 - shift) + s2 * tl.exp(m2 - shift)


@triton.jit
def row_lse_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = x_ptr + tl.program_id(0) * stride
    x = tl.load(x_row + cols, mask=mask, other=-float("inf"))
    ones = tl.where(mask, 1.0, 0.0)  # each value is the group (x, 1)
    m, s = tl.reduce((x, ones), 0, lse_combine)
    tl.store(out_ptr + tl.program_id(0), m + tl.log(s))


def row_lse(x: torch.Tensor) -> torch.Tensor:
    out, block = x.new_empty(x.shape[0]), triton.next_power_of_2(x.shape[1])
    row_lse_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=block)
    return out


# %%
# Is it right?  Against PyTorch in float64, on a row length that is not a power
# of two, a slice, and rows of negative numbers (where a zero padding would win
# the maximum).  The argmax must match exactly.

report = CorrectnessReport("tile reductions vs float64")
for cols, shift in ((7, 0.0), (1000, 0.0), (1000, -50.0)):
    x = torch.randn(3, cols + 4, device=DEVICE) + shift
    for name, xv in (("", x[:, :cols].contiguous()), (" slice", x[:, 4:])):
        s, m, a, c = row_reduce(xv)
        x64 = xv.double()
        case = f"n={cols}{' negative' if shift else ''}{name}"
        report.check(f"tl.sum {case}", s, x64.sum(1))
        report.check(f"tl.max {case}", m, x64.amax(1), tol=0)
        report.check(f"tl.argmax {case}", a, x64.argmax(1).int(), tol=0)
        report.check(f"tl.cumsum {case}", c, x64.cumsum(1))
        report.check(f"tl.reduce lse {case}", row_lse(xv), x64.logsumexp(1))
report.assert_ok()

# %%
# Why subtract the maximum?  :math:`e^{x}` passes the largest float32 for
# :math:`x` just under 89, so exponentiating raw scores turns a row of large
# ones into ``inf / inf``, NaN.  With :math:`x - m` every exponent is at most
# 0, and :math:`\log \sum e^{x} = m + \log \sum e^{x - m}` loses nothing.  The
# combine above only ever exponentiates a difference to a maximum:

big = torch.tensor([[90.0, 91.0, 92.0, 88.5, 89.5, 90.5, 91.5]], device=DEVICE)
print("exp(x) / sum(exp(x)):", (torch.exp(big) / torch.exp(big).sum()).tolist())
print("lse:", row_lse(big).item(), "float64:", big.double().logsumexp(1).item())

# %%
# How a tile reduction becomes instructions
# -----------------------------------------
# A program is a number of warps of :datasheet:`cuda.warp_size`, and a
# tile is spread over all of them: each thread holds a few elements in its
# :term:`registers <register>`.  The smallest kernel with a ``tl.sum``: each
# program sums one block of a vector (it returns as the partial sums below).


@triton.jit
def block_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + pid, tl.sum(x, axis=0))


# %%
# :func:`tilebook.course.aot.compile_many` compiles it for Hopper (``sm_90``) on any
# machine, on three numbers of warps, and we count in the PTX: float adds, butterfly
# shuffles (``shfl.sync.bfly``: a thread swaps a register with the lane whose
# index differs in one bit), stores to and loads from shared memory, and
# barriers (``bar.sync``: each warp waits there for the others).

SUM_BLOCK, WARPS, WARP = 1024, (1, 4, 16), 32  # WARP: threads a warp, every GPU
sums = compile_many(
    {f"num_warps={w}": {"num_warps": w} for w in WARPS},
    kernel=block_sum_kernel,
    signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
    constexprs={"BLOCK": SUM_BLOCK},
    arch=90,
)
OPS = ("add.f32", "shfl.sync.bfly", "st.shared", "ld.shared", "bar.sync")
PTX = {op: r"\b" + op.replace(".", r"\.") for op in OPS}
counts = [
    {"warps": w, "per_thread": SUM_BLOCK // (WARP * w)}
    | {op: sums[f"num_warps={w}"].count(rx, "ptx") for op, rx in PTX.items()}
    for w in WARPS
]
experiment.ptx_table(counts, SUM_BLOCK)

# %%
# What the ``tl.sum`` line became, on the middle number of warps: the lines of
# PTX that the compiler credits to it and that the table counts.

w, e = counts[1]["warps"], counts[1]["per_thread"]
ksum = sums[f"num_warps={w}"]
listing = [
    ln for ln in ksum.lines_for("tl.sum(x", "ptx") if any(op in ln.text for op in PTX)
]
print(f"num_warps={w}, PTX lines of the tl.sum line:")
for line in listing:
    print(f"{line.number:>4}  {' '.join(line.text.split())[:80]}")

# %%
# ``tl.sum`` is a ``@triton.jit`` function of Triton's library, and adds with
# a combine function of its own; inlined into the kernel, its code may be
# credited to the line that called it, to the library's lines, or to both.
# Where this build's PTX credits the float adds:

experiment.say_adds(ksum, listing)

# %%
# Three levels, from the data above.

experiment.say_warps(w, e, WARP)

# %%
# Checked on every variant: one warp has no third level, and the most warps
# leave little for the first.

said = experiment.lowering_claims(counts, ksum, listing, WARP)
Claims("06 reductions", experiment.aot_caption(SUM_BLOCK)).check_all(said)

# %%
# More warps shorten the first level and lengthen the last; no lesson times
# that trade on its own (lesson 10 gives long rows more warps for another
# reason: so that a row's values fit in the registers).  Two reductions of one
# tile each pay the shuffles and barrier.
#
# Across programs
# ---------------
# Summing ``n`` numbers on ``cdiv(n, BLOCK)`` programs leaves a partial sum in
# each.  Programs cannot wait for each other (which run at the same time is
# up to the GPU), so there are two ways to finish.
#
# **Atomics.**  ``tl.atomic_add(ptr, value)`` adds ``value`` to the number at
# ``ptr`` in one indivisible step done in the :term:`L2` cache, and returns
# the old number.  Every program adds its partial sum into a zeroed float; the
# kernel below can also spread them over ``n_slots`` floats (program ``pid``
# adds into ``pid % n_slots``), summed at the end.  With one slot every program
# queues on one address: the *contention* measured below.  ``tl.atomic_max``
# does the same for a maximum.


@triton.jit
def atomic_sum_kernel(x_ptr, out_ptr, n, n_slots, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr + pid % n_slots, tl.sum(x, axis=0))


@triton.jit
def atomic_max_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=-float("inf"))
    tl.atomic_max(out_ptr, tl.max(x, axis=0))


def atomic_sum(x: torch.Tensor, block: int, slots: int = 1) -> torch.Tensor:
    out = torch.zeros(slots, device=x.device, dtype=torch.float32)
    atomic_sum_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), slots, block)
    return out.sum()


def atomic_max(x: torch.Tensor, block: int) -> torch.Tensor:
    out = torch.full((1,), -float("inf"), device=x.device)
    atomic_max_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), block)
    return out[0]


# %%
# **A lock.**  Hardware atomics do a few operations on one number.  For more
# (adding a whole tile, say) a program takes a lock: ``tl.atomic_cas(lock, 0,
# 1)`` (compare and swap) writes 1 where it finds 0 and returns what it found,
# so one program at a time sees 0 and goes on while the others spin.  It
# updates the result with plain loads and stores and releases the lock with
# ``tl.atomic_xchg``.  Here it guards one float, to compare with the atomics.


@triton.jit
def locked_sum_kernel(x_ptr, out_ptr, lock_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    part = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
    while tl.atomic_cas(lock_ptr, 0, 1) == 1:
        pass
    tl.store(out_ptr, tl.load(out_ptr) + part)
    tl.atomic_xchg(lock_ptr, 0)


def locked_sum(x: torch.Tensor, block: int) -> torch.Tensor:
    out = torch.zeros(1, device=x.device)
    lock = torch.zeros(1, device=x.device, dtype=torch.int32)
    locked_sum_kernel[(triton.cdiv(x.numel(), block),)](x, out, lock, x.numel(), block)
    return out[0]


# %%
# **Per-program partial sums.**  Each program stores its partial sum in a slot
# of its own (``block_sum_kernel`` above), and the same kernel runs again on
# the partials until one number is left.  Nothing is shared, nothing waits;
# lesson 11 sums its weight gradient this way.


def partial_sums(x: torch.Tensor, block: int) -> torch.Tensor:
    while x.numel() > 1:
        out = torch.empty(triton.cdiv(x.numel(), block), device=x.device)
        block_sum_kernel[(out.numel(),)](x, out, x.numel(), BLOCK=block)
        x = out
    return x[0]


# The sizes are those of the measurements below (``tilebook.pick``), so that
# a GPU compiles each kernel once.
GPU_SIZES = (experiment.REPEAT_N, experiment.REPEAT_BLOCK)
N_SUM, B = tilebook.pick(gpu=GPU_SIZES, cpu=(10_007, 256))
v = experiment.inputs(N_SUM, device=DEVICE)
v64, p = v.double(), triton.cdiv(N_SUM, B)
report = CorrectnessReport(f"sums of {N_SUM:,} numbers on {p:,} programs vs float64")
report.check("atomic_add", atomic_sum(v, B), v64.sum())
report.check("atomic_add, spread over 16 slots", atomic_sum(v, B, 16), v64.sum())
report.check("atomic_max", atomic_max(v, B), v64.max(), tol=0)
report.check("lock", locked_sum(v, B), v64.sum())
report.check("partial sums", partial_sums(v, B), v64.sum())
report.assert_ok()

# %%
# Is an atomic sum repeatable?
# ----------------------------
# Floating-point addition rounds at every step, so it is not associative: the
# same numbers in another order can give another result, and atomics land in
# the order the programs finish.
# :func:`tilebook.course.experiments.reductions.repeatability` runs each way many
# times on one input and counts the different results (bit patterns).

WAYS = {
    "atomic_add, one address": lambda: atomic_sum(v, B),
    "lock (atomic_cas)": lambda: locked_sum(v, B),
    "partial sums": lambda: partial_sums(v, B),
    "atomic_max": lambda: atomic_max(v, B),
}
repeat = record_or_measure(
    "lesson06_repeat",
    "the same sum, run many times: how many different results",
    lambda: experiment.repeatability(WAYS, v, reference={"atomic_max": v.max()}),
)
experiment.repeat_table(repeat)

# %%

Claims("06 reductions", repeat).check_all(experiment.repeat_claims(repeat))

# %%
# A maximum is exact: in whatever order the candidates arrive, the largest
# wins.  The partial sums are added in a fixed order, set by program ids, not
# by timing.  On a CPU this page cannot show the atomics' disorder: Triton's
# interpreter runs the programs one after another, in order, every time.  The
# mechanism needs no GPU, only float32 and an order; ten to the eighth has no
# room for a 1 in float32 (its spacing there is 8):

big, one = torch.tensor(1e8), torch.tensor(1.0)
print("(1e8 + 1) - 1e8 =", ((big + one) - big).item())
print("(1e8 - 1e8) + 1 =", ((big - big) + one).item())
# Block sums of the vector above added one by one, as atomics would add them,
# in the programs' order and in shuffled orders, as a GPU's programs might end.
parts, gen = v.cpu()[: 2**13].view(-1, 64).sum(1), torch.Generator().manual_seed(0)
results = set()
shuffled = [torch.randperm(len(parts), generator=gen) for _ in range(7)]
for order in [torch.arange(len(parts)), *shuffled]:
    acc = torch.zeros((), dtype=torch.float32)
    for value in parts[order]:
        acc += value
    results.add(acc.item())
experiment.say_orders(parts, results)

# %%
# What contention costs
# ---------------------
# Atomics on one address cannot overlap: L2 applies them one at a time.
# :func:`tilebook.course.experiments.reductions.contention` sums ``experiment.N``
# float32 numbers, ``experiment.BLOCK`` a program so that many programs end in
# an atomic, and spreads the atomics over more and more addresses: the same
# atomics, fewer programs queueing on each.  Beside them, the partial sums and
# ``torch.sum``, in the same interleaved rounds.


def timed(launch):  # one round's timing: do_bench's median in ms
    return triton.testing.do_bench(launch, warmup=10, rep=40, return_mode="median")


def measure_contention():
    return experiment.contention(atomic_sum, partial_sums, timer=timed)


cont = record_or_measure(
    "lesson06_contention",
    "sum of float32 numbers: atomics on fewer or more addresses",
    measure_contention,
)

# %%
# The runs sum another number of numbers than the sums above (the table's
# caption says how many); the rows spread the atomics over more and more
# addresses, and compare each way with the partial sums (the speed ratio, above
# 1 where the way is faster).

experiment.contention_table(cont)

# %%

Claims("06 reductions", cont).check_all(experiment.contention_claims(cont))

# %%


# %%
# With one address all programs queue behind each other; spread over more,
# fewer queue on each.  The atomics are the same in every row: what costs is the
# queue on one address.  Atomics are the simple way where the last bits do not matter (integer sums
# are exact in any order).  A float sum that must repeat stores partials and
# reduces them in a fixed order, as lesson 11 does.
#
# The online softmax
# ------------------
# A softmax needs two reductions of its row, the maximum :math:`m` and
# :math:`s = \sum_i e^{x_i - m}`, before it writes :math:`y_i = e^{x_i - m} / s`.
# When the row does not fit in a tile the textbook walks it three times: for
# :math:`m`, for :math:`s`, to write.  The sum needs the maximum first, it
# seems.  It does not: keep :math:`(m, s)` for the part read so far, and
# merge each new block (maximum :math:`m_b`) with the combine above:
#
# .. math::
#
#    m' = \max(m, m_b), \qquad
#    s' = s\, e^{m - m'} + \sum_{i \in \text{block}} e^{x_i - m'} .
#
# When a block raises the maximum, :math:`e^{m - m'} < 1` *rescales* all that
# was summed to the new maximum; otherwise it is 1.  After the last block
# :math:`(m, s)` are the textbook's, from one walk (Milakov and Gimelshein,
# 2018, "Online normalizer calculation for softmax").  Both, as kernels that
# store each row's :math:`m` and :math:`s`:


@triton.jit
def two_pass_kernel(x_ptr, m_ptr, s_ptr, n_cols, stride, BLOCK: tl.constexpr):
    x_row = x_ptr + tl.program_id(0) * stride
    cols = tl.arange(0, BLOCK)
    m = tl.full([], -float("inf"), tl.float32)
    for start in tl.range(0, n_cols, BLOCK):  # first walk: the maximum
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf"))
        m = tl.maximum(m, tl.max(x, axis=0))
    s = tl.zeros([], tl.float32)
    for start in tl.range(0, n_cols, BLOCK):  # second walk: the sum
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf"))
        s += tl.sum(tl.exp(x - m), axis=0)
    tl.store(m_ptr + tl.program_id(0), m)
    tl.store(s_ptr + tl.program_id(0), s)


@triton.jit
def online_kernel(x_ptr, m_ptr, s_ptr, n_cols, stride, BLOCK: tl.constexpr):
    x_row = x_ptr + tl.program_id(0) * stride
    cols = tl.arange(0, BLOCK)
    m = tl.full([], -float("inf"), tl.float32)  # running maximum
    s = tl.zeros([], tl.float32)  # running sum of exp(x - m)
    for start in tl.range(0, n_cols, BLOCK):  # the only walk
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
        m = m_new
    tl.store(m_ptr + tl.program_id(0), m)
    tl.store(s_ptr + tl.program_id(0), s)


def row_stats(kernel, x: torch.Tensor, block: int):
    m, s = x.new_empty(x.shape[0]), x.new_empty(x.shape[0])
    kernel[(x.shape[0],)](x, m, s, x.shape[1], x.stride(0), BLOCK=block)
    return m, s


# %%
# ``shift`` is the combine's ``-inf`` guard.  How accurate is each?  A
# relative error in :math:`s` is the same relative error in every
# probability, and both find the same, exact :math:`m`; so each :math:`s` is
# compared with the float64 sum of :math:`e^{x - m}`, in units of float32's
# ``eps``.  Rows of random scores, and of scores rising along the row, whose
# maximum grows in almost every block: the online kernel rescales each time.

EPS = torch.finfo(torch.float32).eps
ROWS, LENGTHS, SBLOCK = tilebook.pick(
    gpu=(64, (10**4, 10**5), 1024), cpu=(4, (1000, 4000), 64)
)
accuracy, gen = [], torch.Generator().manual_seed(1)
for n in LENGTHS:
    noise = torch.randn(ROWS, n, generator=gen)
    rising = torch.linspace(0, 30, n) + noise
    for kind, x in (("random", (4 * noise).to(DEVICE)), ("rising", rising.to(DEVICE))):
        row = {"kind": kind, "n": n, "blocks": triton.cdiv(n, SBLOCK)}
        for name, kernel in (("two-pass", two_pass_kernel), ("online", online_kernel)):
            m, s = row_stats(kernel, x, SBLOCK)
            s64 = torch.exp(x.double() - m.double()[:, None]).sum(1)
            row[name] = ((s.double() - s64).abs() / s64).max().item() / EPS
        accuracy.append(row)
experiment.accuracy_table(accuracy, ROWS, SBLOCK)

# %%

ACC = experiment.accuracy_caption(ROWS, SBLOCK)
Claims("06 reductions", ACC).check_all(experiment.accuracy_claims(accuracy))

# %%

experiment.say_rescale_cost(accuracy)

# %%
# Why one walk matters
# --------------------
# One walk fewer saves a third of a long row's reads (lesson 10).  More: an
# attention output :math:`o = \sum_j y_j v_j` rescales the same way, as a
# running *output*:
#
# .. math::
#
#    o' = o\, e^{m - m'} + \sum_{j \in \text{block}} e^{x_j - m'} v_j ,
#    \qquad \text{and at the end} \quad o / s .
#
# Scores are used in the block that made them and never stored: nothing of
# size ``N x N`` reaches :term:`HBM`.  That is flash attention (lesson 12).
# As :math:`\oplus` is associative, a row's blocks may even be split among
# programs, their :math:`(m, s, o)` merged at the end.
#
# The package's kernel
# --------------------
# The first walk of ``softmax_fwd_online_kernel`` (:mod:`tilebook.ops.softmax`)
# is ``online_kernel``'s loop, line for line (a test checks it); its second
# walk writes :math:`e^{x_i - m} / s`.  Against it, on rows with ``-inf``:

x = torch.randn(9, 1000, generator=gen).to(DEVICE) * 4
x[1, ::3], x[2, :500] = -float("inf"), -float("inf")  # chunks of nothing but -inf
(m, s), want = row_stats(online_kernel, x, 128), x.double().softmax(-1)
cfg = sm.SoftmaxConfig(1, 128, 4, online=True)  # chunks of the same length
final = CorrectnessReport("online statistics vs the package's online kernel")
final.check("exp(x - m) / s", torch.exp(x - m[:, None]) / s[:, None], want)
final.check("package", sm.launch_softmax_forward(x, torch.empty_like(x), cfg), want)
final.assert_ok()

# %%
# Stepping through it
# -------------------
# The stepper walks a short row in blocks: after each, the running maximum
# (dashed), the running sum and the factor that rescaled it; after the last,
# the computed probabilities beside the true ones.  Set *rescale* to *skip*,
# as a forgotten line would: where the maximum grows after the first block
# the result is wrong; where the maximum comes first, nothing shows.

stepper = OnlineSoftmaxStepper(initial={"row": "spike last", "block": 4})
FLOAT64 = "every setting of the stepper, computed in float64"
Claims("06 reductions", FLOAT64).check_all(
    experiment.stepper_claims(stepper.settings())
)

# %%

stepper

# %%
# Try this
# --------
#
# 1. Write a kernel that stores each row's minimum, one program per row, and
#    check it with ``check(row_min, lambda x: x.amin(1), [(torch.randn(5, 7,
#    device=DEVICE),), (torch.randn(3, 1000, device=DEVICE),)])`` from
#    :mod:`tilebook.course.exercises`, where ``row_min(x, out)`` launches it.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          @triton.jit
#          def row_min_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
#              cols = tl.arange(0, BLOCK)
#              ptrs = x_ptr + tl.program_id(0) * stride + cols
#              x = tl.load(ptrs, mask=cols < n_cols, other=float("inf"))
#              tl.store(out_ptr + tl.program_id(0), tl.min(x, axis=0))
#
#       ``row_min`` launches it as ``row_lse`` launches its kernel.  The
#       padding is ``+inf``, the neutral element of a minimum: with
#       ``other=0.0`` a row of positive numbers would report 0.
#
# 2. Extend ``online_kernel`` into attention for one query: given the scores
#    ``x`` (rows) and values ``v`` (``n_cols x D``, ``D`` a power of two),
#    store ``softmax(x) @ v`` in one walk.  Check it with
#    ``check(attend, lambda x, v: torch.softmax(x, -1) @ v, [(torch.randn(3,
#    1000, device=DEVICE), torch.randn(1000, 16, device=DEVICE))])``.
#
#    .. dropdown:: Solution
#
#       Keep ``o = tl.zeros([D], tl.float32)`` beside ``m`` and ``s``; in the
#       loop load the block's values ``vb`` (``BLOCK x D``, ``other=0.0``),
#       then ``p = tl.exp(x - shift)``, ``alpha = tl.exp(m - shift)``,
#       ``s = s * alpha + tl.sum(p, axis=0)`` and
#       ``o = o * alpha + tl.sum(p[:, None] * vb, axis=0)``; store ``o / s``.
#       ``attend(x, v, out)`` launches one program per row.
