"""
14. autograd, profiling, and when not to write Triton
=====================================================

A kernel becomes useful to a model when autograd can differentiate through it,
when ``torch.compile`` can keep it inside one graph, and when you can show
where its time goes.  This lesson does all three for a small op, SwiGLU's gate
``silu(a) * b`` (lesson 08's activation, written here with ``tl.exp``, on lesson
07's elementwise kernel), and then
turns to the harder question: when *not* to write Triton at all.  The answer is
read from the course's own measurements.

.. rubric:: You will learn

- to wrap a forward and a backward kernel in a ``torch.autograd.Function`` and
  prove its gradient with ``torch.autograd.gradcheck`` in float64;
- to declare the op to PyTorch with ``torch.library`` (``triton_op`` and ``wrap_triton``
  on a GPU, ``custom_op`` with ``register_fake`` under the interpreter) and
  ``register_autograd``, so that ``torch.compile(fullgraph=True)`` traces it;
- to count graph breaks with ``torch._dynamo.explain``;
- the profilers: ``do_bench`` and ``do_bench_cudagraph``, ``torch.profiler``,
  Triton's proton, Nsight Compute, and the IR dumps;
- a decision tree between Triton, CUDA C++, ``torch.compile`` and a library,
  each branch backed by a measurement from lessons 07-11 or the package's
  benchmarks.

The package's ops follow the same pattern: :func:`tilebook.rms_norm` is a
``torch.autograd.Function`` around lesson 11's kernels
(:mod:`tilebook.ops.rms_norm`).
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` first: it picks the GPU or Triton's interpreter.

import tilebook

from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile, record_function

from tilebook.course.aot import compile_kernel
from tilebook.course.bench import load_record, record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims
from tilebook.course.experiments import decision, profiling
from tilebook.course.plots import plot_record
from tilebook.course.tables import table
from tilebook.course.widgets_decision import DecisionTree

print(tilebook.banner())
DEVICE, GPU = tilebook.device(), tilebook.is_gpu()
BLOCK = 1024

# %%
# The op and its derivative
# -------------------------
# With :math:`\sigma(a) = 1 / (1 + e^{-a})`, the gate is
# :math:`y = a\,\sigma(a)\,b`.  Its two partial derivatives, times the incoming
# gradient :math:`dy`:
#
# .. math::
#
#    da = dy\; b\; \sigma(a)\,\big(1 + a\,(1 - \sigma(a))\big), \qquad
#    db = dy\; a\,\sigma(a).
#
# The backward needs ``a`` and ``b`` again, not ``y``: recomputing
# :math:`\sigma(a)` costs a few instructions, storing it a tensor of traffic.
#
# The kernels
# -----------
# Lesson 07's shape: a :term:`program` per ``BLOCK`` elements, a mask for the
# tail.  One new argument, ``ACC: tl.constexpr``, the type the arithmetic runs
# in: fp32 for 16- and 32-bit data, float64 for float64 data.  A gradient check
# needs the second (finite differences in fp32 drown in rounding), and the same
# kernel serves both.


@triton.jit
def swiglu_fwd_kernel(A, B, Y, n, BLOCK: tl.constexpr, ACC: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(ACC)
    b = tl.load(B + offs, mask=mask, other=0.0).to(ACC)
    s = 1.0 / (1.0 + tl.exp(-a))
    tl.store(Y + offs, (a * s * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(A, B, DY, DA, DB, n, BLOCK: tl.constexpr, ACC: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(ACC)
    b = tl.load(B + offs, mask=mask, other=0.0).to(ACC)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(ACC)
    s = 1.0 / (1.0 + tl.exp(-a))
    da = dy * b * s * (1.0 + a * (1.0 - s))
    tl.store(DA + offs, da.to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dy * a * s).to(DB.dtype.element_ty), mask=mask)


def acc_type(t):
    return tl.float64 if t.dtype == torch.float64 else tl.float32


def swiglu_fwd(a, b):
    assert a.shape == b.shape and a.is_contiguous() and b.is_contiguous()
    y, n = torch.empty_like(a), a.numel()
    grid = (triton.cdiv(n, BLOCK),)
    swiglu_fwd_kernel[grid](a, b, y, n, BLOCK=BLOCK, ACC=acc_type(a))
    return y


def swiglu_bwd(a, b, dy, kernel=swiglu_bwd_kernel):
    da, db, n = torch.empty_like(a), torch.empty_like(b), a.numel()
    grid = (triton.cdiv(n, BLOCK),)
    kernel[grid](a, b, dy.contiguous(), da, db, n, BLOCK=BLOCK, ACC=acc_type(a))
    return da, db


# %%
# The autograd Function
# ---------------------
# ``forward`` runs the kernel and keeps what ``backward`` will need with
# ``ctx.save_for_backward`` (autograd then checks that nobody modified those
# tensors in between).  ``backward`` receives one gradient per output and
# returns one per input, ``None`` for inputs that need none.


class SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return swiglu_fwd(a, b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        return swiglu_bwd(a, b, dy)


def reference(a, b, dy):
    """y, da, db from PyTorch's autograd of the formula, in float64."""
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    y = F.silu(a64) * b64
    return (y.detach(), *torch.autograd.grad(y, (a64, b64), dy.double()))


# %%
# Is it right?
# ------------
# Two checks.  The table compares forward and backward with the float64
# autograd of the formula, at ragged sizes and in each type (bfloat16 only on
# a GPU).  Then ``gradcheck``: it perturbs each input element in float64,
# estimates the derivative by finite differences and compares it with what
# ``backward`` returns.  It knows nothing of our derivation, so it catches a
# wrong formula as well as a wrong kernel.

types = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
report = CorrectnessReport("swiglu vs float64 autograd")
for n, dtype in [
    (1, torch.float32),
    (3001, torch.float32),
    *((2049, t) for t in types),
]:
    g = torch.Generator().manual_seed(n)
    a, b, dy = (torch.randn(n, generator=g).to(DEVICE, dtype) for _ in range(3))
    want = reference(a, b, dy)
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = SwiGLU.apply(ag, bg)
    got = (y, *torch.autograd.grad(y, (ag, bg), dy))
    for name, o, r in zip(("y", "da", "db"), got, want, strict=True):
        report.check(f"{name}, n={n}", o, r)
report.assert_ok()


def grad_ok(fn):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2))
    a, b = (t.to(DEVICE).requires_grad_() for t in (a, b))
    return torch.autograd.gradcheck(fn, (a, b), raise_exception=False)


passed = grad_ok(SwiGLU.apply)
assert passed
print("gradcheck of SwiGLU in float64:", passed)

# %%
# A gradient check earns its keep when the backward is wrong.  Here is the
# kernel with the term through :math:`\sigma` forgotten, the line most often
# got wrong when deriving by hand (the changed line ends in ``# wrong``):


@triton.jit
def swiglu_bwd_wrong(A, B, DY, DA, DB, n, BLOCK: tl.constexpr, ACC: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(ACC)
    b = tl.load(B + offs, mask=mask, other=0.0).to(ACC)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(ACC)
    s = 1.0 / (1.0 + tl.exp(-a))
    da = dy * b * s  # wrong
    tl.store(DA + offs, da.to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dy * a * s).to(DB.dtype.element_ty), mask=mask)


class SwiGLUWrong(SwiGLU):
    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        return swiglu_bwd(a, b, dy, kernel=swiglu_bwd_wrong)


caught = not grad_ok(SwiGLUWrong.apply)
assert caught
print("gradcheck catches the forgotten term:", caught)

# %%
# The same op for torch.compile
# -----------------------------
# ``torch.compile`` starts with Dynamo, which runs the Python of a model
# symbolically and records the tensor operations it meets in a graph.  Where it
# meets code it cannot follow (a data pointer read on the host, a cache lookup,
# an interpreted kernel) it *breaks* the graph: it compiles what it has, runs
# the rest in plain Python, and starts a new graph after it.  Each break costs
# host time and hides the op from the compiler.  ``fullgraph=True`` turns a
# break into an error.
#
# ``torch.library`` declares an op to PyTorch: a name, a schema from the type
# hints, and what it does.  Dynamo then puts a call to it in the graph without
# looking inside.  Two kinds:
#
# - ``torch.library.triton_op``: the body allocates outputs and launches through
#   ``wrap_triton(kernel)[grid](...)``.  Compiler passes can *see* that launch,
#   and Inductor launches the Triton kernel from its own generated code.  It
#   needs a real ``JITFunction``, so a GPU (or a compile-only process).
# - ``torch.library.custom_op``: an opaque body.  ``register_fake`` says what
#   the outputs look like (shape, dtype, device) without computing them, so the
#   compiler can plan around it.  This is what works under the interpreter,
#   where kernels are not ``JITFunction`` objects.
#
# Either way ``register_autograd`` gives the op a backward made of registered
# ops, so the backward graph traces too.

if GPU:
    from torch.library import triton_op, wrap_triton

    @triton_op("lesson14::swiglu", mutates_args=())
    def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y, n = torch.empty_like(a), a.numel()
        grid = (triton.cdiv(n, BLOCK),)
        launch = wrap_triton(swiglu_fwd_kernel)[grid]
        launch(a, b, y, n, BLOCK=BLOCK, ACC=acc_type(a))
        return y

    @triton_op("lesson14::swiglu_bwd", mutates_args=())
    def swiglu_grad(
        a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        da, db, n = torch.empty_like(a), torch.empty_like(b), a.numel()
        grid = (triton.cdiv(n, BLOCK),)
        launch = wrap_triton(swiglu_bwd_kernel)[grid]
        launch(a, b, dy, da, db, n, BLOCK=BLOCK, ACC=acc_type(a))
        return da, db

else:

    @torch.library.custom_op("lesson14::swiglu", mutates_args=())
    def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return swiglu_fwd(a.contiguous(), b.contiguous())

    @swiglu.register_fake
    def _(a, b):
        return torch.empty_like(a)

    @torch.library.custom_op("lesson14::swiglu_bwd", mutates_args=())
    def swiglu_grad(
        a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return swiglu_bwd(a.contiguous(), b.contiguous(), dy)

    @swiglu_grad.register_fake
    def _(a, b, dy):
        return torch.empty_like(a), torch.empty_like(b)


def setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def swiglu_backward(ctx, dy):
    a, b = ctx.saved_tensors
    return swiglu_grad(a, b, dy.contiguous())


swiglu.register_autograd(swiglu_backward, setup_context=setup_context)
passed = grad_ok(swiglu)
assert passed
print("gradcheck of torch.ops.lesson14.swiglu in float64:", passed)

# %%
# Now a small model around each version, compiled with ``fullgraph=True``.  On
# a GPU the backend is Inductor; under the interpreter ``aot_eager``, which
# traces forward and backward the same way and then runs the graphs eagerly.
# ``torch._dynamo.explain`` reports the graphs and breaks Dynamo found.

BACKEND = "inductor" if GPU else "aot_eager"


def block(gate):
    def step(a, b):
        return (gate(a, b) * 2.0).sum()

    return step


def inputs(*shapes):
    torch._dynamo.reset()
    return [torch.randn(s, device=DEVICE, requires_grad=True) for s in shapes]


def attempt(gate):
    """What fullgraph compilation of ``block(gate)`` does: traced, or refused why."""
    try:
        step = torch.compile(block(gate), backend=BACKEND, fullgraph=True)
        step(*inputs(64, 64)).backward()
    except torch._dynamo.exc.TorchDynamoException as e:
        return f"refused ({type(e).__name__})"
    return "traced"


explained = torch._dynamo.explain(block(swiglu))(*inputs(64, 64))
outcome = {
    "registered op": attempt(swiglu),
    "bare autograd.Function": attempt(SwiGLU.apply),
}
assert explained.graph_break_count == 0 and outcome["registered op"] == "traced"
profiling.fullgraph_table(outcome)

# %%
# Under the interpreter the bare Function cannot be traced at all: Dynamo walks
# into it, meets the interpreter's launch and gives up.  On a GPU Dynamo can
# capture a direct ``kernel[grid](...)`` launch of a ``JITFunction`` by itself,
# so there the bare Function may trace; everything else a launcher does on the
# host (reading data pointers, caching launches, as the package's ops do) still
# breaks it.  A registered op is a contract instead of a hope.  The package's
# ops are registered the same way, in the ``tilebook`` namespace
# (:mod:`tilebook.ops.library`), so a model calling :func:`tilebook.rms_norm`
# keeps one graph too:

package = torch._dynamo.explain(lambda x, w: tilebook.rms_norm(x, w).sum())
package = package(*inputs((8, 64), 64))
assert package.graph_break_count == 0
profiling.explain_said(explained, package, outcome["bare autograd.Function"])

# %%
# Profiling
# ---------
# **do_bench.**  ``triton.testing.do_bench`` runs a function many times between
# CUDA events, emptying the :term:`L2` cache before each run, and returns the
# median (or the quantiles asked for).  The speed comparisons of lessons 07-12
# come from it, in interleaved rounds (:func:`tilebook.course.bench.compare`).  It times
# what the GPU does *and* the gaps when the host is too slow to keep it fed: for
# a small tensor, the Python of a launch can take longer than the kernel.
# ``do_bench_cudagraph`` captures the function once in a CUDA graph and replays
# it, which removes the host from the measurement: the difference between the
# two is the host's share (lesson 07 split its small sizes this way).  On a GPU the lesson times the gate both ways, as a
# Function and as the PyTorch formula, at a small and a large size:

TIMERS = {"do_bench": triton.testing.do_bench}
TIMERS["do_bench_cudagraph"] = triton.testing.do_bench_cudagraph


def overhead_sweep():
    rows = []
    for log2n in (12, 24):
        a, b = (torch.randn(2**log2n, device=DEVICE) for _ in range(2))
        gates = {"SwiGLU.apply": SwiGLU.apply, "PyTorch": lambda a, b: F.silu(a) * b}
        for impl, gate in gates.items():
            run = partial(gate, a, b)
            run()  # compile before timing
            for timer, bench in TIMERS.items():
                med, p20, p80 = bench(run, quantiles=[0.5, 0.2, 0.8])
                row = {"impl": impl, "timer": timer, "log2n": log2n, "n": 2**log2n}
                rows.append(row | {"median_ms": med, "p20_ms": p20, "p80_ms": p80})
    return rows


overhead = record_or_measure("lesson14_overhead", "swiglu: host share", overhead_sweep)
style = {"x": "n", "y": "median_ms", "series": "impl", "logx": True}
style |= {"name": "lesson14_overhead", "ylabel": "ms"}
figure = plot_record(overhead, where={"timer": "do_bench"}, title="do_bench", **style)

# %%
where = {"timer": "do_bench_cudagraph"}
figure = plot_record(overhead, where=where, title="cudagraph", **style)

# %%
claims = Claims("14 autograd and profiling", overhead)
profiling.check_replay(claims, overhead, list(TIMERS))

# %%
# **torch.profiler** records what each operator and kernel launch did, with
# CPU and (on a GPU) CUDA times, and ``record_function`` names a region of your
# own.  It works under the interpreter too: then every "kernel" is Python on
# the CPU.  One forward and backward of the registered op, after a first one
# outside the profiler (which compiles the kernels for this size):

a, b = (torch.randn(4096, device=DEVICE, requires_grad=True) for _ in range(2))
block(swiglu)(a, b).backward()
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if GPU else [])
# one profiling cycle: acc_events=True changes nothing but silences torch 2.11's warning
profiler = profile(activities=acts, acc_events=True)
with profiler as prof, record_function("lesson14 step"):
    block(swiglu)(a, b).backward()
ENGINE = "autograd::engine::evaluate_function: "
TIME_FIELDS = ("device_time_total", "cuda_time_total")  # the second before torch 2.4
events = {}  # a GPU lists a region twice, host side and device side: keep the larger
for e in prof.key_averages():
    if "lesson14" in e.key or "swiglu" in e.key:
        device = next((getattr(e, f) for f in TIME_FIELDS if hasattr(e, f)), 0.0)
        now = {"calls": e.count, "cpu": e.cpu_time_total / 1e3, "cuda": device / 1e3}
        was = events.setdefault(e.key.removeprefix(ENGINE), now)
        was.update({k: max(was[k], v) for k, v in now.items()})
columns = {"event": "name", "calls": "calls", "CPU ms (total)": ("cpu", "{:.3f}")}
if GPU:
    columns["CUDA ms (total)"] = ("cuda", "{:.3f}")
table([{"name": k, **v} for k, v in events.items()], columns)

# %%
# The forward shows up as the autograd node PyTorch generated for the registered
# op, the backward as its ``Backward`` node; under the interpreter they are
# nearly all of the step.  On a GPU the table adds a column of CUDA time (and
# rows for the Triton kernels where the profiler names them), and
# ``prof.export_chrome_trace("trace.json")`` writes a timeline that
# ``chrome://tracing`` or Perfetto shows: gaps between kernels are host time.
#
# **Proton**, Triton's own profiler (``triton.profiler``, in Triton 3.6 too),
# is lighter than the torch profiler and knows Triton's kernels.  Scopes name
# regions, and a kernel's ``launch_metadata`` hook reports the FLOPs and bytes
# of each launch, so proton can show achieved rates per kernel:
#
# .. code-block:: python
#
#    import triton.profiler as proton
#
#    def traffic(grid, kernel, args):  # called at each launch
#        n, size = args["n"], args["A"].element_size()
#        return {"name": f"swiglu n={n}", "flops": 5 * n, "bytes": 3 * n * size}
#
#    @triton.jit(launch_metadata=traffic)
#    def swiglu_fwd_kernel(A, B, Y, n, BLOCK: tl.constexpr, ACC: tl.constexpr): ...
#
#    proton.start("swiglu", hook="triton")
#    with proton.scope("forward"):
#        swiglu(a, b)
#    proton.finalize()  # then: proton-viewer -m time/ms,gbyte/s swiglu.hatchet
#
# **Nsight Compute** reads a kernel's hardware counters.  Profile the one
# kernel you care about, a few launches of it:
#
# .. code-block:: bash
#
#    ncu --kernel-name regex:swiglu --launch-skip 3 --launch-count 1 \
#        --set full -o swiglu python train.py
#    ncu --import swiglu.ncu-rep --page details
#
# What to read: *Memory Throughput* against *DRAM* peak (a memory-bound
# kernel like this one should be near the copy ceiling); *Compute Throughput*
# (how busy the :term:`SMs <SM>` are); the *Memory Workload Analysis* (bytes
# moved between :term:`HBM`, L2 and the SMs, and whether loads are
# :term:`coalesced`); the :term:`occupancy` section (how many
# :term:`warps <warp>` each SM holds, and what limits it:
# :term:`registers <register>` or :term:`shared memory`); *Warp State
# Statistics* (why warps stall).  ``nsys profile python train.py`` gives the
# timeline of the whole program first, to find which kernel to look at.
#
# **IR dumps.**  ``TRITON_KERNEL_DUMP=1 TRITON_DUMP_DIR=dump`` writes every
# stage of each kernel compiled (TTIR, TTGIR, LLVM IR, :term:`PTX`,
# :term:`SASS`); ``MLIR_ENABLE_DUMP=1`` prints the IR after every MLIR pass
# (``MLIR_ENABLE_DUMP=swiglu_fwd_kernel`` for one kernel); ``TRITON_CACHE_DIR``
# is where compiled kernels land.  No GPU needed for any of it with
# :func:`tilebook.course.aot.compile_kernel` (lesson 03), which compiles for Hopper
# (``sm_90``) here too.  The exponential became ``ex2.approx`` in PTX, in fp32 for bf16
# data:

sig = {"A": "*bf16", "B": "*bf16", "Y": "*bf16", "n": "i32"}
fwd = compile_kernel(swiglu_fwd_kernel, sig, {"BLOCK": BLOCK, "ACC": tl.float32})
print(fwd.summary())
ex2 = [x.text.strip() for x in fwd.lines_for("tl.exp(-a))", "ptx") if "ex2" in x.text]
print(f"{len(ex2)} ex2 lines from tl.exp, the first:", ex2[0])

# %%
# When not to write Triton
# ------------------------
# Lessons 07 to 11 measured their kernels against PyTorch, cuBLAS and
# ``torch.compile``: together, a decision tree.  Under the tree, each record
# it reads is named with the GPU, date and commit that measured it: in a GPU
# build, the lessons' own records of this build, and the package benchmark's
# record committed for this GPU.  Each leaf compares the choice with the
# alternative from one record (:func:`~tilebook.course.claims.speedup`: a tie when
# the p20-p80 spreads overlap): *good* (faster), *level* or *slow*.
# cuBLAS is CUDA C++ and hand-written assembly: it stands in for CUDA C++ of
# your own (the course wrote none).  Attention against FlashAttention and
# cuDNN is lesson 12's comparison (its record ``lesson12_lengths``), not in
# this tree.

records = {name: load_record(name) for name in decision.RECORDS}
reading = decision.read(records)  # each leaf: two rows of one record, compared

# %%
# The tree: what the op is, then its size or shape, then the tool
# (:data:`~tilebook.course.experiments.decision.QUESTIONS`).

tree = DecisionTree(
    decision.QUESTIONS,
    reading.leaves,
    "op",
    title="Triton, CUDA C++, torch.compile or a library?",
    caption=f"Every leaf compares two rows of one record: {reading.sources}.",
)
tree

# %%
# What the tree says, checked against the same records: "not slower" where a
# tie is as good as a win (less code, same speed), "not faster" where it is as
# bad as a loss, and the square matmul not behind cuBLAS
# (:meth:`~tilebook.course.experiments.decision.Reading.check`).  The matmul
# leaves hold for the Hopper kernels (:term:`wgmma`, :term:`TMA` copies); a record that took other
# paths (another GPU, ``TILEBOOK_ARCH=80``) is said below, not claimed.

claims = Claims("14", reading.source)
note = reading.check(claims)  # None for a record of the Hopper paths
claims

# %%

note

# %%
# Read as advice:
#
# - **A library first** for what it covers: matrix multiplies, convolutions,
#   attention.  Lesson 09's matmul, a lesson of work, comes close to cuBLAS on
#   a friendly shape; it beats cuBLAS on a ragged one only by copying to aligned rows.
# - **Triton for fusion** the library cannot do: an activation in the matmul's
#   epilogue (lesson 08-09), a row op with its statistics in one pass (10-11),
#   a custom backward.  Each leaf of the tree is one shape; whether a fused
#   kernel wins changes with the shape (below), so measure at yours.
# - **torch.compile** for chains of elementwise and row ops: it writes Triton
#   itself.  Try it first; keep a kernel where a measurement at your sizes says
#   so (the rms_norm leaf is below).
# - **Gluon or CUDA C++** where Triton cannot express the schedule: warp-specialised
#   pipelines (lesson 12's Hopper forward is Gluon), cluster launches, hand-placed
#   instructions.  cuBLAS shows what that buys, at the cost of far more code.
# - **Nothing** for a single elementwise op: PyTorch already runs at the copy
#   ceiling, and on a tiny tensor (the launch is all the cost) Triton is no faster.


reading.sizes_said(load_record("lesson08_fusion"))

# %%
reading.rms_norm_said()

# %%
# Try this
# --------
#
# 1. Change ``swiglu_bwd`` to return ``da`` only.  What does autograd say?
#
#    .. dropdown:: Solution
#
#       An error: ``backward`` must return one gradient per input of
#       ``forward``, here two (``None`` for an input that needs none).
#
# 2. Keep ``y`` instead of recomputing ``sigmoid(a)``: what must ``forward``
#    save, and what does the backward then read per element?
#
#    .. dropdown:: Solution
#
#       Saving ``s = sigmoid(a)`` makes the forward write one more tensor and
#       the backward read one more (``a``, ``b``, ``s``, ``dy``): two more
#       trips per element for a kernel whose cost is its traffic, against one
#       exponential per element to recompute it.
#
# 3. Under the interpreter, run ``torch._dynamo.explain(block(SwiGLU.apply))``
#    (without ``fullgraph``).  What happens?
#
#    .. dropdown:: Solution
#
#       Dynamo follows the Function into the interpreter's launch and breaks
#       the graph where it reads a storage's data pointer (what
#       ``fullgraph=True`` refuses above), then resumes inside the
#       interpreter's own Python and fails there with an internal error.
#       ``explain(block(swiglu))`` finds one graph and no break.
#
# 4. In the widget, find the paths flagged slow.  What do they have in common?
#
#    .. dropdown:: Solution
#
#       Each is slower, beyond the spread, than another choice timed in the
#       same record: a general tool against a specialised one (the softmax of
#       PyTorch or torch.compile against the Triton kernel, cuBLAS against the
#       staged Triton matmul on a ragged shape), two passes against a fused one, or
#       a launch whose host cost exceeds the work.
