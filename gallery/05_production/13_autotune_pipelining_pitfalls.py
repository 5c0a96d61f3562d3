"""
13. Autotune, pipelining and pitfalls: tuning a kernel, and what goes wrong
===========================================================================

Lesson 09 timed its matmul's tiles itself and wrapped the kernel in
``triton.autotune`` at one small size only, where the package's pruner leaves a
single configuration: the autotuner timed nothing there.  Here it times for
real.  Production adds the autotuner's hooks and cache, the launch options that
set how the compiler schedules the work (``num_warps``, ``num_stages``), and
mistakes that make a kernel slow or, worse, quietly wrong.  This lesson makes
each happen, fixes it, reads pipelining in code compiled for Hopper (``sm_90``)
on any machine, and ends with debugging tools.

.. rubric:: You will learn

- what ``triton.autotune`` does with ``configs``, ``key``,
  ``prune_configs_by``, ``reset_to_zero`` and ``restore_value``, what
  ``TRITON_PRINT_AUTOTUNING`` prints, and when its cache hands back a stale
  choice;
- what ``num_warps`` and ``num_stages`` change in a matmul:
  :term:`registers <register>`, :term:`spills <spill>`, :term:`shared memory`
  and the copies that software pipelining overlaps, read from an ahead-of-time
  compile;
- five pitfalls, each made to happen and then fixed: spills, a low-precision
  accumulator, a missing mask, a stale autotune cache and 32-bit
  offsets past :math:`2^{31}` elements;
- how to debug a kernel: ``print`` and ``pdb`` in the interpreter,
  ``tl.static_print``, ``tl.device_print``, ``tl.device_assert`` and
  ``compute-sanitizer``.

The package's matmul, which autotunes this way, is :func:`tilebook.matmul`.
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` first, to pick the GPU or the interpreter before Triton loads.

import tilebook  # chooses GPU or interpreter before triton loads

import contextlib
import io
import os
import re
import textwrap
import time

import torch
import triton
import triton.language as tl

from tilebook.course.aot import AotError, compile_many, instruction_table
from tilebook.course.bench import compare, record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.datasheet import fact
from tilebook.course.experiments import matmul as experiment
from tilebook.course.experiments import tuning
from tilebook.course.plots import plot_record
from tilebook.course.widgets_pipeline import PipelineExplorer

print(tilebook.banner())
DEVICE = tilebook.device()
torch.manual_seed(0)
GPU = tilebook.is_gpu()

# %%
# The kernel to tune
# ------------------
# Lesson 09's kernel, in its shortest form: one program per ``BLOCK_M x
# BLOCK_N`` tile of ``C``, a loop over ``K`` with a float32 accumulator, masks
# for ragged edges.  The operands are row-major, so only the distance between
# rows is passed (``stride_am``, ``stride_bk``, ``stride_cm``).


@triton.jit
def matmul_kernel(
    a_ptr,  # (M, K), row-major
    b_ptr,  # (K, N), row-major
    c_ptr,  # (M, N), row-major
    M,
    N,
    K,
    stride_am,
    stride_bk,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    offs_m = (pid // num_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m[:, None] < M, offs_n[None, :] < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_ok & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok & n_ok)


def matmul(a, b, cfg):
    """C = A @ B for row-major A and B, with one triton.Config."""
    if not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError("matmul: a and b must be contiguous (row-major)")
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    kw = cfg.kwargs
    grid = (triton.cdiv(M, kw["BLOCK_M"]) * triton.cdiv(N, kw["BLOCK_N"]),)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    strides = (a.stride(0), b.stride(0), c.stride(0))
    matmul_kernel[grid](a, b, c, M, N, K, *strides, **kw, **opts)
    return c


# %%
# The tile this lesson studies is 128 x 256 x 64 in bf16, a common choice for
# Hopper (``sm_90``).  The interpreter checks the same kernel with small tiles,
# in float32 and float16 (it gets bf16 wrong); a GPU checks the big tile in
# bf16.

TILE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
CHECK = tilebook.pick(
    gpu=[(300, 520, 1000, BF16, TILE)],
    cpu=[(37, 53, 70, t, dict.fromkeys(TILE, 32)) for t in (FP32, FP16)],
)
report = CorrectnessReport("matmul vs float64")
for m, n, k, dtype, tile in CHECK:
    a, b = experiment.operands(m, n, k, dtype, DEVICE)
    cfg = triton.Config(tile, num_warps=8, num_stages=3)
    report.check(f"{m}x{n}x{k}", matmul(a, b, cfg), a.double() @ b.double())
report.assert_ok()

# %%
# triton.autotune: configs, key and the hooks
# -------------------------------------------
# ``triton.autotune`` wraps a kernel with a list of :class:`triton.Config`.
# On the first call for each value of the ``key`` arguments (and of the
# tensors' dtypes, which Triton adds) it times every configuration with
# ``do_bench``, keeps the fastest and launches it; later calls with the same
# key launch it at once.
#
# Trying a configuration means *running the kernel*, several times: harmless
# for ``C = A @ B``, which overwrites ``C``, wrong for a kernel that adds into
# its output, like this one (each block's sum, by atomic add, lesson 06):


@triton.jit
def sum_into_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASKED:
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    else:  # the pitfall below: lanes past n read whatever lies there
        x = tl.load(x_ptr + offs)
    tl.atomic_add(out_ptr, tl.sum(x))


def three_runs(fn, quantiles):
    """do_bench for the autotuner: three runs everywhere, as [median, low, high]."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        if GPU:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return [times[1], times[0], times[2]]


SUM_CONFIGS = [triton.Config({"BLOCK": b}) for b in (64, 256)]


def tuned_sum(**hooks):
    """A fresh autotuned sum_into_kernel (an empty cache), with the given hooks."""
    tuner = triton.autotune(SUM_CONFIGS, key=["n"], do_bench=three_runs, **hooks)
    return tuner(sum_into_kernel)


N_SUM = 1000
sum_grid = lambda meta: (triton.cdiv(N_SUM, meta["BLOCK"]),)  # a grid from the config
x = torch.rand(N_SUM, device=DEVICE)


def outcome(got, want, **fields):
    """A table row: what a kernel gave, what it should have, and the verdict."""
    ok = abs(got - want) <= 1e-5 * abs(want)
    return {**fields, "got": got, "want": want, "verdict": "right" if ok else "wrong"}


# %%
# Three wrappers, each called on ``out`` at zero and on ``out`` holding a
# running total: no hook, ``reset_to_zero=["out_ptr"]`` (zero ``out`` before
# every trial and the real run) and ``restore_value=["out_ptr"]`` (copy ``out``
# before every trial and put it back after).

HOOKS = {"none": {}} | {h: {h: ["out_ptr"]} for h in ("reset_to_zero", "restore_value")}
hook_rows = []
for start in (0.0, 100.0):
    for hook, kwargs in HOOKS.items():
        out = torch.full((1,), start, device=DEVICE)
        tuned_sum(**kwargs)[sum_grid](x, out, N_SUM, MASKED=True)
        want = start + x.double().sum().item()
        hook_rows.append(outcome(out.item(), want, start=start, hook=hook))
tuning.hooks_table(hook_rows)

# %%
# Without a hook, every trial run adds the sum once more:

runs = len(SUM_CONFIGS) * 3 + 1
tuning.hooks_said(hook_rows, len(SUM_CONFIGS), runs)

# %%
# ``reset_to_zero`` is right for an output that starts at zero and loses a
# running total; ``restore_value`` keeps whatever ``out`` held, at the cost of
# a copy per trial.  Both act only while the autotuner tunes
# (:func:`~tilebook.course.experiments.tuning.check_hooks` checks each on the table).

hooks_checked = Claims("13 autotune", tuning.HERE)
tuning.check_hooks(hooks_checked, hook_rows, runs)

# %%
# **TRITON_PRINT_AUTOTUNING.**  With it set, the autotuner prints each
# configuration it tries and the one it keeps, under its key.  A second call
# with the same key finds it in ``kernel.cache`` and tunes nothing:

os.environ["TRITON_PRINT_AUTOTUNING"] = "1"
printed = io.StringIO()
kernel = tuned_sum(reset_to_zero=["out_ptr"])
with contextlib.redirect_stdout(printed):
    for _ in range(2):
        kernel[sum_grid](x, torch.zeros(1, device=DEVICE), N_SUM, MASKED=True)
del os.environ["TRITON_PRINT_AUTOTUNING"]
for line in printed.getvalue().splitlines():
    print(textwrap.fill(line, 88, subsequent_indent="    "))
print("kernel.cache:", {k: v.kwargs for k, v in kernel.cache.items()})

# %%
# That cache lives as long as the process.  ``cache_results=True`` (or
# ``TRITON_CACHE_AUTOTUNING=1``) also writes the timings to Triton's cache
# directory for the next process (not in the interpreter).
#
# prune_configs_by, and a stale cache
# -----------------------------------
# ``prune_configs_by={"early_config_prune": f}`` lets ``f(configs, named_args,
# **kwargs)`` drop configurations before any runs: those that cannot work for
# these arguments, or cost more to time than they save.  When one is left,
# nothing is timed.  This kernel sums ``x`` in one program, so its block must
# cover all of ``x``; the pruner keeps the smallest block that does.


@triton.jit
def whole_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)  # one program: right only when BLOCK >= n
    tl.store(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0)))


def smallest_cover(configs, named_args, **kwargs):
    covering = [c for c in configs if c.kwargs["BLOCK"] >= named_args["n"]]
    return [min(covering, key=lambda c: c.kwargs["BLOCK"])]


WHOLE_CONFIGS = [triton.Config({"BLOCK": b}) for b in (128, 512, 2048)]


def whole_sum(key):
    prune = {"early_config_prune": smallest_cover}
    tuner = triton.autotune(
        WHOLE_CONFIGS, key=key, prune_configs_by=prune, do_bench=three_runs
    )
    return tuner(whole_sum_kernel)


# %%
# The ``key`` decides when the choice is made again.  Leave ``n`` out of it and
# the block chosen for the first call is reused for every later one, including
# a longer ``x`` that it no longer covers: a *stale* choice, and a wrong sum.

stale_rows = []
for key in ([], ["n"]):
    kernel = whole_sum(key)
    for n in (100, 1000):
        out = torch.zeros(1, device=DEVICE)
        kernel[(1,)](x, out, n)
        block = kernel.best_config.kwargs["BLOCK"]
        want = x[:n].double().sum().item()
        stale_rows.append(outcome(out.item(), want, key=str(key), n=n, block=block))
tuning.stale_table(stale_rows)

# %%
# Every argument that changes which configurations are valid, or fastest,
# belongs in the key; so with caches of your own.
#
# num_warps x num_stages, compiled
# --------------------------------
# Two launch options shape the compiled matmul.  ``num_warps`` is how many
# :term:`warps <warp>` run one program: the accumulator is spread over their
# threads, so fewer warps mean more :term:`registers <register>` per thread.
# ``num_stages`` is the depth of the *software pipeline*: ``s`` stages keep
# ``s - 1`` future ``K`` steps' tiles in flight into :term:`shared memory`
# while the tensor cores work on the current one; each costs a tile of ``A``
# and of ``B`` there.
#
# :func:`tilebook.course.aot.compile_many` compiles the grid for Hopper (``sm_90``)
# on any machine, with a debugging kernel for the end of the page.  ``LDGSTS``
# is an asynchronous copy into shared memory (``cp.async`` in :term:`PTX`),
# ``DEPBAR`` the wait for one, ``LDG`` and ``STS`` a load into registers and a
# store from them, ``HGMMA`` a :term:`wgmma`.


@triton.jit
def debug_kernel(x_ptr, n, BLOCK: tl.constexpr):
    tl.static_print("compiling debug_kernel with BLOCK =", BLOCK)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.device_print("x", x)
    tl.device_assert(x >= 0, "x must not be negative")


WARPS, STAGES = (4, 8), (1, 4)
SIG = {p: "*bf16" for p in ("a_ptr", "b_ptr", "c_ptr")}
SIG.update({p: "i32" for p in ("M", "N", "K", "stride_am", "stride_bk", "stride_cm")})
mm_job = {"kernel": matmul_kernel, "signature": SIG, "constexprs": TILE}
mm_job["divisible_by_16"] = list(SIG)
grid_labels = {(w, s): f"w{w} s{s}" for w in WARPS for s in STAGES}
jobs = {
    lb: {**mm_job, "num_warps": w, "num_stages": s}
    for (w, s), lb in grid_labels.items()
}
dbg_job = {"kernel": debug_kernel, "signature": {"x_ptr": "*fp32", "n": "i32"}}
dbg_job["constexprs"] = {"BLOCK": 128}
jobs["assert, debug"] = {**dbg_job, "options": {"debug": True}}
jobs["assert"] = dbg_job
with contextlib.redirect_stdout(io.StringIO()):  # static_print, compiled twice
    compiled = compile_many(jobs, arch=90)
grid = {lb: compiled[lb] for lb in grid_labels.values()}
counts = instruction_table(grid, ["LDGSTS", "DEPBAR", "LDG", "STS", "HGMMA"])
print(counts)
DEEP = max(STAGES) + 1  # one more stage than fits: the compiler refuses it, says why
try:
    compile_many([{**mm_job, "num_warps": max(WARPS), "num_stages": DEEP}], arch=90)
    refusal = ""
except AotError as exc:
    refusal = str(exc)
needs = re.search(r"needs (\d+) bytes", refusal)
needed = int(needs.group(1)) if needs else None  # bytes of shared memory
print(textwrap.fill(refusal.splitlines()[-1], 88) if refusal else "compiled")

# %%
# What the grid says, and the rules it is checked against:

per_stage = (TILE["BLOCK_M"] + TILE["BLOCK_N"]) * TILE["BLOCK_K"] * 2  # bf16
limit = int(fact("sm90.smem_per_block").si)  # the compile target sm_90
facts = {ws: counts[lb] for ws, lb in grid_labels.items()}
built = Claims("13 autotune", f"compiled for sm_90, triton {triton.__version__}")
tuning.check_grid(built, facts, per_stage, needed, limit)
built

# %%
# Shared memory grows by a tile of each operand per stage, whatever the warps.
# With one stage each ``K`` step loads into registers (``LDG``), stores to
# shared memory (``STS``) and waits; with more, ``LDGSTS`` copies straight in
# and ``DEPBAR`` waits for the oldest stage only.  Fewer warps give each thread
# more of the accumulator: past the register limit the compiler *spills* the
# rest to local memory, which lives in :term:`HBM` (cached).

fewest = compiled[grid_labels[min(WARPS), max(STAGES)]]
most = compiled[grid_labels[max(WARPS), max(STAGES)]]
tuning.spill_said(fewest, most, TILE, WARPS, DEEP, needed, limit)

# %%
# The grid, measured
# ------------------
# What the pipeline buys is a time, and only a GPU has one: the sweep runs the
# grid's settings on one large square matmul in bf16 (the plot's title gives its
# size), each checked against float64 on a block of rows, timed against each
# other in interleaved rounds.

SIZE = 4096
TITLE = f"matmul {SIZE} cubed, bf16"


def pipelining_sweep():
    a, b = experiment.operands(SIZE, SIZE, SIZE)
    ref = a[:256].double() @ b.double()
    fns = {}
    for w in WARPS:
        for s in STAGES:
            cfg = triton.Config(TILE, num_warps=w, num_stages=s)
            err = (matmul(a, b, cfg)[:256].double() - ref).norm() / ref.norm()
            assert err < 1e-2, (w, s, err.item())
            fns[w, s] = lambda cfg=cfg: matmul(a, b, cfg)
    rows = compare({f"w{w} s{s}": f for (w, s), f in fns.items()}, flops=2 * SIZE**3)
    for row, (w, s) in zip(rows, fns, strict=True):
        row.update(warps=w, stages=s)
    return rows


timed = record_or_measure(
    "lesson13_pipelining", f"{TITLE}: warps x stages", pipelining_sweep
)
figure = plot_record(
    timed,
    x="stages",
    y="tflops",
    series="warps",
    title=f"{TITLE}, 128 x 256 x 64 tiles",
    xlabel="num_stages",
    ylabel="TFLOP/s",
    legend_title="num_warps",  # the lines
    name="lesson13_pipelining",
)
if figure is not None:  # the axis shows only the measured depths
    figure.axes[0].set_xticks(sorted({r["stages"] for r in timed.rows}))

# %%
speed = Claims("13 autotune", timed)
tuning.check_speed(speed, timed, WARPS, STAGES)
speed

# %%
# Five pitfalls
# -------------
# Two happened above: spills (fixed by more warps or a smaller tile) and a
# stale autotune choice (fixed by the key).  Three more.
#
# A low-precision accumulator
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A long sum in a 16-bit accumulator goes wrong once the spacing between the
# totals it can hold nears what each step adds: every addition rounds.  Lesson
# 05 measured it for ``tl.dot``, each piece of ``K`` added into an fp16 (or, on
# a GPU, bf16) accumulator; here it is a plain running sum, one ``+=`` a step,
# in fp16 (``ACC`` is the accumulator's dtype):


@triton.jit
def running_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ACC: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(ACC)
    tl.store(out_ptr, tl.sum(acc.to(tl.float32)))


def running_sum(v, acc):
    out = torch.zeros(1, device=v.device)
    running_sum_kernel[(1,)](v, out, v.numel(), BLOCK=32, ACC=acc)
    return out


long_x = (1 + torch.rand(2**16, device=DEVICE)).half()  # in [1, 2)
exact = long_x.double().sum()
totals = {
    f"e{b}": running_sum(long_x, a) for b, a in ((16, tl.float16), (32, tl.float32))
}
errors = {k: ((v.double() - exact).abs() / exact).item() for k, v in totals.items()}
said_acc = tuning.accumulator_said(long_x.numel(), errors)
said_acc

# %%
# A missing mask
# ~~~~~~~~~~~~~~
# ``sum_into_kernel`` with ``MASKED=False`` reads whole blocks.  As in lesson
# 04, ``x`` and a *poisoned* neighbour are two views of one allocation, so the
# read past the end stays inside memory the page owns and shows as a wrong
# answer instead of a crash:

n_short, poison = 100, 1e6
memory = torch.cat([torch.rand(n_short), torch.full((256,), poison)]).to(DEVICE)
short = memory[:n_short]
sums = {}
for masked in (False, True):
    out = torch.zeros(1, device=DEVICE)
    sum_into_kernel[(2,)](short, out, n_short, BLOCK=64, MASKED=masked)
    sums["good" if masked else "bad"] = out.item()
said_mask = tuning.mask_said(sums, short.double().sum().item())
said_mask

# %%
# On a GPU the read lands in another tensor, or in unmapped memory and kills
# the CUDA context; ``compute-sanitizer`` (below) finds both.
#
# 32-bit offsets past 2^31 elements
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``tl.program_id`` is an int32, and so is an integer argument below
# :math:`2^{31}`: ``row * row_len`` is computed in 32 bits and wraps around
# past :math:`2^{31} - 1`, on a tensor of :math:`2^{31}` elements or more.  A
# kernel that only computes the offsets shows it without allocating them:


@triton.jit
def offsets_kernel(out_ptr, first_row, row_len, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    row = first_row + pid
    if WIDE:
        row = row.to(tl.int64)  # the fix: widen before multiplying
    tl.store(out_ptr + pid, row * row_len)


ROW_LEN, FIRST_ROW, ROWS = 2**20, 2046, 4
offsets = {}
for wide in (False, True):
    offsets[wide] = torch.zeros(ROWS, dtype=torch.int64, device=DEVICE)
    offsets_kernel[(ROWS,)](offsets[wide], FIRST_ROW, ROW_LEN, WIDE=wide)
narrow, wide = offsets[False].tolist(), offsets[True].tolist()
tuning.offsets_table(FIRST_ROW, narrow, wide, ROW_LEN)

# %%
# Past :math:`2^{31}` the 32-bit offsets turn negative: a load there reads
# *before* the tensor.  The fix is a ``.to(tl.int64)`` before multiplying (the
# package's kernels take an ``INT64`` flag, set only for tensors that large).
#
# Every fix, checked
# ------------------
# The fixed side of each pitfall against float64, and the broken side, wrong:

fixes = CorrectnessReport("the fixes vs float64")
out = torch.zeros(1, device=DEVICE)
tuned_sum(reset_to_zero=["out_ptr"])[sum_grid](x, out, N_SUM, MASKED=True)
fixes.check("reset_to_zero", out, x.double().sum().reshape(1))
out = torch.zeros(1, device=DEVICE)
whole_sum(["n"])[(1,)](x, out, N_SUM)
fixes.check("key with n", out, x.double().sum().reshape(1))
fixes.check("fp32 accumulator", totals["e32"], exact.reshape(1))
fixes.check("mask", torch.tensor([sums["good"]]), short.double().sum().reshape(1))
rows_wide = torch.arange(FIRST_ROW, FIRST_ROW + ROWS, dtype=torch.float64) * ROW_LEN
fixes.check("int64 offsets", offsets[True].cpu().double(), rows_wide)
fixes.assert_ok()
stale = stale_rows[1]  # n left out of the key: the block tuned at n = 100, at 1000
broke = Claims("13 autotune", tuning.HERE)
pitfalls = tuning.check_pitfalls(
    broke, errors, said_acc, sums, said_mask, FIRST_ROW, narrow, wide, stale
)
broke

# %%
# The widget (:class:`tilebook.course.widgets_pipeline.PipelineExplorer`) holds the
# grid: measured rates with a record, else shared memory per program (lower is
# not faster).  Turn on a pitfall: the verdict says what it got wrong above and
# every cell turns wrong, since no ``num_warps`` or ``num_stages`` fixes that.

PipelineExplorer(
    {ws: compiled[lb] for ws, lb in grid_labels.items()},
    refused={(max(WARPS), DEEP): needed} if needed else {},
    record=timed,
    source=built.source,
    title="matmul, 128 x 256 x 64 bf16 tiles: warps x stages",
    pitfalls=pitfalls,
)

# %%
# Debugging a kernel
# ------------------
# **The interpreter.**  With ``TRITON_INTERPRET=1`` (this page on a CPU) a
# kernel is Python over NumPy arrays: ``print`` in it prints the values and
# ``breakpoint()`` stops in ``pdb``, program after program (compiled, a
# ``print`` becomes ``tl.device_print``; ``breakpoint()`` has no GPU form):


@triton.jit
def peek_kernel(x_ptr, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    print("peek_kernel loaded", x)


launched = peek_kernel[(1,)](torch.arange(4.0, device=DEVICE), BLOCK=4)
tuning.printed_said(GPU)

# %%
# **Compiled code** has three: ``tl.static_print`` prints once, at compile
# time, what is known then (constexprs, shapes); ``tl.device_print`` prints from
# every thread at run time; ``tl.device_assert(cond, msg)`` stops the kernel
# where ``cond`` is false, only in a debug build (``TRITON_DEBUG=1`` or
# ``@triton.jit(debug=True)``).  ``debug_kernel`` above uses all three (on a
# GPU only a compile-time line can show here, for the reason just given):

launched = debug_kernel[(1,)](torch.arange(4.0, device=DEVICE), 4, BLOCK=4)

# %%
# The compiled :term:`PTX` shows the assertion only in the debug build:

asserts = {k: compiled[k].count("__assertfail", "ptx") for k in jobs if "assert" in k}
print("PTX lines naming __assertfail:", asserts)
debugged = Claims("13 autotune", built.source)
debugged.check(
    "device_assert is compiled only in a debug build",
    asserts["assert"] == 0 < asserts["assert, debug"],
)
debugged

# %%
# **compute-sanitizer** checks every load and store of a program on a GPU
# against the allocations and reports the kernel, thread and address of a bad
# one; ``racecheck`` finds races on shared memory.  It is slow: use a small case.
#
# .. code-block:: bash
#
#    compute-sanitizer --tool memcheck python my_script.py
#    compute-sanitizer --tool racecheck python my_script.py
#
# With ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` each tensor is its own allocation,
# so reads into a neighbour inside PyTorch's cached blocks are caught too.
#
# Try this
# --------
#
# 1. Add ``(128, 128, 64)`` with four warps to the compiled grid.  Does it
#    spill?  How many stages fit?
#
#    .. dropdown:: Solution
#
#       Compile ``{**mm_job, "constexprs": {**TILE, "BLOCK_N": 128}}`` as above.
#       Half the tile holds half the accumulator per thread, so it does not
#       spill; a stage costs two thirds of the big tile's, so more of them fit.
#
# 2. Give ``tuned_sum`` a third configuration and predict the unhooked result
#    before you run it.
#
#    .. dropdown:: Solution
#
#       Three configurations run three times each, plus the real launch: the
#       sum is counted ten times over.  ``runs`` above is the formula.
#
# 3. With ``FIRST_ROW = 4094`` and ``ROW_LEN = 2**20``, what does the int32
#    column show, and why is it worse than a negative number?
#
#    .. dropdown:: Solution
#
#       Row 4096 starts at :math:`2^{32}`, which wraps to zero, a *valid*
#       offset: the load reads row 0 and not even compute-sanitizer can tell.
