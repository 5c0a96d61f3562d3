"""Row normalisation: what :mod:`~tilebook.ops.rms_norm` and
:mod:`~tilebook.ops.layer_norm` share.

Both ops normalise each row of ``x`` viewed as ``(rows, H)``, with kernels laid out
alike; their math differs, and each op module holds its own kernels.

* Forward: one launch.  A program loads whole rows into registers (several short
  rows at once), reduces them to the row's statistics and writes ``y``: ``x`` is
  read from memory once.  The statistics (fp32, per row) are kept for the backward.
* Backward: ``dx`` row by row, and sums over *all* rows (``dweight``, ``dbias``).
  Instead of atomics or locks, a persistent grid (a few programs per SM) walks the
  rows; each program keeps its rows' share of the sums in fp32 registers and writes
  it once, as one row of a ``(programs, ..., H)`` buffer, which
  :func:`~tilebook.ops.partials.sum_partials_kernel` adds up in a fixed order (so
  the sums are deterministic) and casts.
* **Long rows** (past an op's ``FWD_CHUNKED_THRESHOLD`` / ``BWD_CHUNKED_THRESHOLD``)
  no longer fit in registers without spilling, so they take chunked kernels whose
  registers scale with a chunk, not with ``H``.  Forward: a persistent program walks
  a row twice, once for the statistics, then backwards (newest chunk first, the
  likeliest still in L2) to write ``y``.  Backward, in two kernels: a dot kernel
  gives each (row, chunk) a program and writes the chunk's partial row sums; the
  chunked kernel splits ``H`` across programs, each owning one column chunk and a
  share of the rows, adds up its rows' partial sums, writes ``dx`` and keeps its
  columns' share of the sums over rows in registers.

Everything around the kernels is here, once:

* the kernels' shared pieces of Triton (:func:`columns`, :func:`row_tile`,
  :func:`row_sums`, :func:`walk_row`);
* the launch configuration rules and their checks;
* the arguments' checks;
* the plans: what one call launches, decided once per call key
  (:func:`tilebook._launch.call_key`) and kept in :data:`tilebook._launch.PLANS`, and
  the runners that allocate a plan's outputs and start its
  :class:`~tilebook._launch.Step` objects (eagerly, or through
  :func:`tilebook.ops.library.launch` inside ``torch.compile``);
* what the ops' ``autograd.Function`` does inside ``torch.compile`` (call the ops'
  ``torch.library`` operators: :func:`traced_forward`, :func:`traced_backward`), the
  operators themselves (:func:`define_ops`) and their compile jobs (:func:`compile_jobs`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._launch import Step, plain_grad, sm_count
from ..validation import check_same_device, check_tensor
from . import library
from .partials import SUM_BLOCK_C, SUM_BLOCK_P, sum_partials_grid, sum_partials_kernel

__all__ = ["BWD_WARPS_PER_SM", "MAX_HIDDEN", "bwd_rule", "fwd_rule"]

#: Largest hidden size.  Rows up to the ops' thresholds live in one program's
#: registers; longer ones are walked in chunks, which bounds neither registers nor
#: the partial buffers by ``H``.  The limit only keeps the launch sizes sane.
MAX_HIDDEN = 1 << 20
#: Resident warps per SM that the persistent backward grids aim for.
BWD_WARPS_PER_SM = 16


# --------------------------------------------------------------------------- kernels' pieces


@triton.jit
def columns(first, n_cols, BLOCK_N: tl.constexpr):
    """Columns ``first`` to ``first + BLOCK_N - 1``, and which of them exist."""
    cols = first + tl.arange(0, BLOCK_N)
    return cols, cols < n_cols


@triton.jit
def row_tile(first, ROWS: tl.constexpr, n_rows, col_ok):
    """Rows ``first`` to ``first + ROWS - 1`` against the columns ``col_ok``: the rows,
    which of them exist, the tile's mask, and the rows as int64 offsets (``n_rows *
    stride`` passes 2**31 for large activations)."""
    rows = first + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    return rows, row_ok, row_ok[:, None] & col_ok[None, :], rows.to(tl.int64)[:, None]


@triton.jit
def row_sums(ptr, rows, row_ok, n_parts, PARTS: tl.constexpr):
    """Each row's sum of its chunks' partial sums ``ptr[row, :n_parts]`` (``PARTS``: a
    power of two >= ``n_parts``), always added in the same order, so that every column
    chunk of a row gets the same sum."""
    parts = tl.arange(0, PARTS)
    mask = row_ok[:, None] & (parts < n_parts)[None, :]
    return tl.sum(tl.load(ptr + rows[:, None] * n_parts + parts[None, :], mask=mask, other=0.0), 1)


@triton.jit
def walk_row(i, x_ptr, y_ptr, x_row_stride, y_row_stride):
    """Step ``i`` of a persistent program's walk over rows (the chunked forwards): the
    row, and where its ``x`` and ``y`` start."""
    row = tl.program_id(0) + i * tl.num_programs(0)
    row64 = row.to(tl.int64)
    return row, x_ptr + row64 * x_row_stride, y_ptr + row64 * y_row_stride


# --------------------------------------------------------------------------- configuration
# The rules come from sweeps on an H100 (bf16, 16384 rows, hidden sizes 1024 to 16384;
# ``benchmarks/rms_norm.py --tune``, ``benchmarks/layer_norm.py --tune``).  Every
# choice within a few percent of the best was kept only if it followed a simple rule.


def pow2(n: int) -> int:
    """The next power of two >= ``n``."""
    # int(): traced with a symbolic size (torch.compile's dynamic shapes), Triton's
    # bit-twiddling would build a symbolic expression that takes minutes to simplify;
    # a block size is a constant of the kernel anyway, so the size is specialised.
    return triton.next_power_of_2(int(n))


def is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def warps(tile: int, block_n: int) -> int:
    """About 16 values per thread: 16-byte loads, and no spills.  Past 16 warps the
    block-wide reductions cost more than they save, except where rows are so long
    that 16 warps would hold too many values per thread."""
    return min(32 if block_n > 16384 else 16, max(1, tile // 512))


def fwd_rule(n_cols: int) -> tuple[int, int, int]:
    """``(BLOCK_N, rows per program, num_warps)`` of a whole-row forward: short rows are
    grouped until a program moves about 4096 elements, enough bytes in flight per
    program to keep the memory system busy."""
    block_n = pow2(n_cols)
    rows = min(16, max(1, 4096 // block_n))
    return block_n, rows, warps(rows * block_n, block_n)


def bwd_rule(n_cols: int) -> tuple[int, int, int, int]:
    """``(BLOCK_N, rows per loop step, num_warps, programs per SM)`` of a whole-row
    backward: rows grouped half as far as forward (the accumulators take registers
    too), and a persistent grid of :data:`BWD_WARPS_PER_SM` warps per SM."""
    block_n = pow2(n_cols)
    rows = min(8, max(1, 2048 // block_n))
    w = warps(rows * block_n, block_n)
    return block_n, rows, w, max(1, BWD_WARPS_PER_SM // w)


def grid_size(x: torch.Tensor, n_blocks: int, programs_per_sm: int) -> int:
    """Programs of a persistent grid: ``programs_per_sm`` per SM, no more than blocks."""
    # Under the interpreter a handful of programs is enough to exercise the
    # partial-sum path without making the (serial) interpreter slow.
    sms = sm_count(x.device) if x.is_cuda else 4
    return max(1, min(n_blocks, sms * programs_per_sm))


def check_config(op: str, rows: int, num_warps: int) -> None:
    if not is_pow2(rows):
        raise ValueError(f"{op}: rows per program must be a power of two, got {rows}")
    if num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"{op}: num_warps must be a power of two up to 32, got {num_warps}")


def check_chunk(op: str, chunk: int) -> None:
    if not is_pow2(chunk):
        raise ValueError(f"{op}: the chunk width must be a power of two, got {chunk}")


def row_fwd_plan(op: str, x, kernel, block_n: int, rows: int, num_warps: int, flags: dict):
    """``(kernel, grid, constexprs and options)`` of a whole-row forward on a 2-D ``x``:
    ``rows`` rows per program, unmasked (``EVEN``) where every program's tile is full."""
    n_rows, n_cols = x.shape
    check_config(op, rows, num_warps)
    even = bool(n_cols == block_n and n_rows % rows == 0)  # a plain bool for symbolic sizes
    meta = {"BLOCK_N": block_n, "ROWS": rows, **flags, "EVEN": even, "num_warps": num_warps}
    return kernel, (triton.cdiv(n_rows, rows),), meta


def chunked_fwd_plan(op: str, x, kernel, chunk: int, per_warp: int, flags: dict, rows=None,
                     num_warps=None, block_n=None, per_sm=None):  # fmt: skip
    """``(kernel, grid, constexprs and options)`` of a chunked forward on a 2-D ``x``:
    chunks of at most ``chunk`` columns, one warp per ``per_warp`` of them, one program
    per SM (``per_sm``) walking rows; the keywords override the rule."""
    if rows is not None:
        raise ValueError(f"{op}: the chunked forward takes one row at a time")
    n_rows, n_cols = x.shape
    default = min(chunk, pow2(n_cols))
    block_n = block_n or default
    num_warps = num_warps or max(1, min(32, default // per_warp))
    check_config(op, 1, num_warps)
    check_chunk(op, block_n)
    n_progs = grid_size(x, n_rows, per_sm or 1)
    return kernel, (n_progs,), {"BLOCK_N": block_n, **flags, "num_warps": num_warps}


# --------------------------------------------------------------------------- checks


#: Inputs whose weight and bias may also be float32 (mixed precision: the parameters
#: of a model kept in float32, its activations in 16 bits), as torch's norms take them.
_HALF = (torch.float16, torch.bfloat16)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_args(op: str, x: object, eps: object, optional: bool = True, **params: object) -> float:
    """Every check of a norm's arguments (``params``: its weight and bias, None where
    absent and ``optional``); returns ``eps`` as a float."""
    check_tensor(x, "x", op, min_ndim=1)
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    # Comparisons, not math.isfinite: torch.compile traces them when eps is symbolic.
    if not 0 < eps < math.inf:
        raise ValueError(f"{op}: eps must be a positive finite number, got {eps!r}")
    n_cols = x.shape[-1]
    if n_cols == 0:
        raise ValueError(f"{op}: the last dimension of x must not be empty, got {tuple(x.shape)}")
    for name, t in params.items():
        if t is None and optional:
            continue
        check_tensor(t, name, op, ndim=1)
        if t.shape[0] != n_cols:
            raise ValueError(
                f"{op}: {name} must have shape ({n_cols},) to match the last dimension of x "
                f"{tuple(x.shape)}, got {tuple(t.shape)}"
            )
        if t.dtype != x.dtype and not (t.dtype == torch.float32 and x.dtype in _HALF):
            raise TypeError(
                f"{op}: {name} must have the dtype of x ({_dtype_name(x.dtype)})"
                + (", or float32" if x.dtype in _HALF else "")
                + f", got {_dtype_name(t.dtype)}"
            )
    given = [t for t in params.values() if t is not None]
    if len({t.dtype for t in given}) > 1:  # their gradients' sums share one buffer dtype
        raise TypeError(
            f"{op}: "
            + " and ".join(params)
            + " must share a dtype, got "
            + " and ".join(_dtype_name(t.dtype) for t in given)
        )
    check_same_device(op, x=x, **params)
    if n_cols > MAX_HIDDEN:
        raise ValueError(
            f"{op}: the last dimension of x is {n_cols}, but {op} supports at most {MAX_HIDDEN}"
        )
    return eps


def as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as ``(rows, n_cols)`` with unit column stride, copying only when needed.

    ``reshape`` keeps a view whenever the leading dimensions collapse into one row
    stride (slices along the batch, for instance); otherwise it copies.  A stride
    other than 1 along a row (a transpose, or the stride-0 ``dy`` that
    ``y.sum().backward()`` produces) needs a copy too.
    """
    rows = t.reshape(-1, n_cols)
    if rows.stride(-1) != 1 and n_cols > 1:
        rows = rows.contiguous()
    return rows


# --------------------------------------------------------------------------- forward


class FwdPlan:
    """What a forward call launches, fixed by its call key: the launch, ``x``'s shape,
    dtype and device, whether ``x`` is passed as it is (``direct``: its rows are evenly
    strided) and its row stride, the statistics' shape (None: none written), and the
    backward plan, made by the first backward (see :func:`backward_of`)."""

    __slots__ = ("bwd", "contiguous", "device", "direct", "dtype", "n_cols", "n_rows", "shape",
                 "stats", "step", "x_stride")  # fmt: skip

    def __init__(self, launch, x, x2, stats, direct: bool):
        self.step = Step(*launch) if launch is not None else None
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        self.n_rows, self.n_cols = x2.shape
        self.direct, self.x_stride = direct, x2.stride(0)
        self.contiguous = direct and x.is_contiguous()
        self.stats, self.bwd = stats, None


def plan(x: torch.Tensor, fwd_plan, stats: int, *args) -> FwdPlan:
    """The forward plan of a call on ``x`` (any shape and strides): ``fwd_plan(rows,
    *args)`` gives the launch for ``x`` as rows; the kernel keeps ``stats`` fp32
    statistics per row (none where the launch's ``STORE_RSTD`` is False)."""
    x2 = as_rows(x, x.shape[-1])
    launch = fwd_plan(x2, *args) if x2.numel() else None
    n_rows = x2.shape[0]
    if launch is not None and not launch[2].get("STORE_RSTD", True):
        shape = None
    else:
        shape = (n_rows,) if stats == 1 else (stats, n_rows)
    direct = x2 is x or x2.data_ptr() == x.data_ptr()  # a view of x, not a copy
    return FwdPlan(launch, x, x2, shape, direct)


_empty_like = torch.empty_like


def forward(plan: FwdPlan, x, params: tuple, eps: float, via=None) -> tuple:
    """``(y shaped like x, statistics or None, x as the kernel read it)``: ``params``
    are the kernel's parameter pointers, between ``x`` and ``y`` in its signature."""
    x2 = x if plan.direct else as_rows(x, plan.n_cols)
    if plan.contiguous:  # empty_like: a third of torch.empty's host time
        y = _empty_like(x)
    else:
        y = torch.empty(plan.shape, dtype=plan.dtype, device=plan.device)
    stats = None
    if plan.stats is not None:
        stats = torch.empty(plan.stats, dtype=torch.float32, device=plan.device)
    step = plan.step
    if step is not None:
        n_cols = plan.n_cols
        args = (x2, *params, y, x2 if stats is None else stats, plan.n_rows, n_cols,
                plan.x_stride, n_cols, eps)  # fmt: skip
        if via is not None:
            step.via(via, *args)
        elif (y.data_ptr() | (0 if stats is None else stats.data_ptr())) & 15:
            step.anew(*args)  # not the specialisation the plan launched: launch() keys it
        else:
            step(*args) or step.anew(*args)
    return y, stats, x2


# --------------------------------------------------------------------------- backward


class BwdPlan:
    """What a backward launches, fixed by sizes and settings: its steps (the dot kernel
    of the chunked kernels first, then the kernel that writes ``dx`` and the partial
    sums, then their sum), the buffers' shapes, which sums are wanted (``needs``), how
    many the kernels keep (``sums``: 1 or 2), ``dx``'s shape and the row strides of
    ``dy``, ``x`` and ``dx``."""

    __slots__ = ("dots", "n_chunks", "n_cols", "n_rows", "needs", "partial", "shape", "steps",
                 "strides", "sums")  # fmt: skip

    def __init__(self, x, shape, strides, steps, partial, dots, needs, sums):
        self.n_rows, self.n_cols = x.shape
        self.shape, self.strides, self.steps = shape, strides, steps
        self.partial, self.dots, self.needs, self.sums = partial, dots, needs, sums
        self.n_chunks = dots[-1] if dots else 0


def bwd_plan(op: str, x, kernels: tuple, rule, *, sums: int, needs: tuple, flags: dict,
             settings: tuple, chunked: bool, chunk: int, col_splits=None, shape=None,
             strides=None) -> BwdPlan:  # fmt: skip
    """The backward of a norm on a 2-D ``x``: ``kernels`` are its whole-row, dot and
    chunked kernels, ``rule(n_cols)`` gives the whole-row kernel's
    ``(BLOCK_N, rows, num_warps, programs per SM)``; the kernels keep ``sums`` sums
    over rows (1 or 2), of which ``needs`` says which the last step adds up; ``flags``
    are constexprs the kernels take; ``settings`` overrides rows, warps, programs per
    SM and (chunked) the chunk; ``col_splits`` (None: no splits) shares rows among
    programs of the whole-row kernel.  ``shape`` and ``strides`` are those of dx and of (dy, x, dx)' rows."""
    whole, dot, chunked_kernel = kernels
    n_rows, n_cols = x.shape
    rows, num_warps, per_sm = settings[:3]
    steps, dots = [], None
    if chunked:
        if col_splits not in (None, 1):
            raise ValueError(f"{op}: the chunked backward splits columns by chunk")
        block_n, def_rows, def_warps, def_per_sm = rule(min(chunk, pow2(n_cols)))
        block_n = settings[3] or block_n
        rows, num_warps = rows or def_rows, num_warps or def_warps
        check_config(op, rows, num_warps)
        check_chunk(op, block_n)
        n_chunks = triton.cdiv(n_cols, block_n)
        # 1. Each (row, chunk): its partial row sums, into a (sums, n_rows, n_chunks) buffer.
        dots = (2, n_rows, n_chunks) if sums == 2 else (n_rows, n_chunks)
        dot_meta = {"BLOCK_N": block_n, **{k: v for k, v in flags.items() if k == "HAS_W"},
                    "num_warps": warps(block_n, block_n)}  # fmt: skip
        steps.append(Step(dot, (n_rows * n_chunks,), dot_meta))
        # 2. dx, and the sums per (split, column chunk): the persistent grid of the
        #    whole-row backward, spread over the column chunks.
        n_progs = grid_size(x, n_rows * n_chunks, per_sm or def_per_sm)
        n_parts = max(1, min(triton.cdiv(n_rows, rows), n_progs // n_chunks))
        meta = {"BLOCK_N": block_n, "ROWS": rows, "DOTS": pow2(n_chunks), **flags,
                "num_warps": num_warps}  # fmt: skip
        steps.append(Step(chunked_kernel, (n_chunks, n_parts), meta))
    else:
        block_n, def_rows, def_warps, def_per_sm = rule(n_cols)
        rows, num_warps = rows or def_rows, num_warps or def_warps
        check_config(op, rows, num_warps)
        n_progs = grid_size(x, triton.cdiv(n_rows, rows), per_sm or def_per_sm)
        meta = {"BLOCK_N": block_n, "ROWS": rows, **flags, "num_warps": num_warps}
        if col_splits is None:
            n_parts, grid = n_progs, (n_progs,)
        else:
            if not is_pow2(col_splits) or col_splits > block_n:
                raise ValueError(
                    f"{op}: col_splits must be a power of two up to {block_n}, got {col_splits}"
                )
            n_parts = max(1, n_progs // col_splits)
            grid, meta = (col_splits, n_parts), {**meta, "COL_SPLITS": col_splits}
        steps.append(Step(whole, grid, meta))
    # 3. The sums: the partial rows added up and cast, in one launch.
    if any(needs):
        sum_meta = {"BLOCK_P": SUM_BLOCK_P, "BLOCK_C": SUM_BLOCK_C, "NEED_A": needs[0],
                    "NEED_B": needs[1], "num_warps": 4}  # fmt: skip
        steps.append(Step(sum_partials_kernel, sum_partials_grid(n_cols), sum_meta))
        partial = (n_parts, 2, n_cols) if sums == 2 else (n_parts, n_cols)
    else:
        partial = (1,)  # never read: one element keeps the signature
    strides = strides or (n_cols, x.stride(0), n_cols)
    return BwdPlan(x, shape or x.shape, strides, steps, partial, dots, needs, sums)


def backward(plan: BwdPlan, dy, x, w, stats, dtype, via=None, like=None) -> tuple:
    """``(dx, sum A or None, sum B or None)`` of ``plan`` for ``dy`` and ``x`` with the
    plan's row strides, in ``dtype``; ``w`` None: the kernels read no weight.  ``like``:
    a contiguous tensor of dx's shape and dtype (allocating like it is quicker)."""
    dev = x.device
    dx = torch.empty(plan.shape, dtype=dtype, device=dev) if like is None else _empty_like(like)
    n_rows, n_cols = plan.n_rows, plan.n_cols
    need_a, need_b = plan.needs
    if w is not None:  # the sums take the weight's dtype: x's, or float32 (mixed precision)
        a = _empty_like(w) if need_a else None
        b = _empty_like(w) if need_b else None
    else:
        a = torch.empty(n_cols, dtype=dtype, device=dev) if need_a else None
        b = torch.empty(n_cols, dtype=dtype, device=dev) if need_b else None
    if dx.numel() == 0:
        return dx, None if a is None else a.zero_(), None if b is None else b.zero_()
    partial = torch.empty(plan.partial, dtype=torch.float32, device=dev)
    w = x if w is None else w  # an absent weight is never read (HAS_W False)
    steps, strides = plan.steps, plan.strides
    dots = None
    if plan.dots:
        dots = torch.empty(plan.dots, dtype=torch.float32, device=dev)
        if plan.sums == 2:
            dot_args = (dy, x, w, stats, dots, n_rows, n_cols, *strides[:2])
        else:
            dot_args = (dy, x, w, dots, n_cols, *strides[:2])
        args = [dot_args, (dy, x, w, stats, dots, dx, partial, n_rows, n_cols, plan.n_chunks,
                           *strides)]  # fmt: skip
    else:
        args = [(dy, x, w, stats, dx, partial, n_rows, n_cols, *strides)]
    if len(steps) > len(args):
        # An absent sum is never written (NEED_A / NEED_B False): x keeps the signature.
        args.append((partial, x if a is None else a, x if b is None else b, plan.partial[0],
                     n_cols, plan.sums * n_cols))  # fmt: skip
    # Fresh buffers are 16-byte aligned (PyTorch's CUDA allocator rounds blocks to 512
    # bytes), as the plan's first launches had them; should one not be, launch() keys it.
    fresh = (t for t in (dx, a, b, partial, dots) if t is not None)
    aligned = via is None and not any(t.data_ptr() & 15 for t in fresh)
    for step, step_args in zip(steps, args):  # noqa: B905
        if aligned:
            step(*step_args) or step.anew(*step_args)
        elif via is not None:
            step.via(via, *step_args)
        else:
            step.anew(*step_args)
    return dx, a, b


def backward_of(fwd: FwdPlan, make, dy, x, w, stats, needs) -> tuple:
    """The backward of a forward planned as ``fwd`` (``x`` and ``stats`` as it
    returned them): ``make(x2, w, needs, shape, strides)`` plans it.  A plain, contiguous,
    aligned ``dy`` takes the plan the forward's keeps (its strides are then fixed);
    another one is made rows and planned afresh.  ``dx`` comes back shaped like ``dy``."""
    n_cols, dtype = fwd.n_cols, fwd.dtype
    if plain_grad(dy, dtype):  # dy has y's shape, which is x's
        plan = fwd.bwd
        if plan is None or plan.needs != needs:
            strides = (n_cols, fwd.x_stride, n_cols)
            plan = fwd.bwd = make(as_rows(x, n_cols), w, needs, fwd.shape, strides)
        return backward(plan, dy, x, w, stats, dtype, like=dy)
    x2, dy2 = as_rows(x, n_cols), as_rows(dy, n_cols)
    plan = make(x2, w, needs, x2.shape, (dy2.stride(0), x2.stride(0), n_cols))
    dx, a, b = backward(plan, dy2, x2, w, stats, dtype)
    return dx.view(dy.shape), a, b


# --------------------------------------------------------------------------- torch.compile
# Inside torch.compile an op's autograd.Function calls its torch.library operators
# (forward and backward) instead of planning and launching: Dynamo traces the Function
# and puts the operators in the graph.  Only tensors and Python scalars go on ctx.


def traced_forward(ctx, op, x: torch.Tensor, weight, *rest) -> torch.Tensor:
    """``y`` of ``op(x as rows, weight, *rest)``, an operator that returns ``(y,
    statistics)``; saves the rows, the weight and the statistics for the backward."""
    x2 = as_rows(x, x.shape[-1])
    y, stats = op(x2, weight, *rest)
    ctx.save_for_backward(x2, weight, stats)
    return y.view(x.shape)


def traced_backward(op, dy: torch.Tensor, x2, *rest) -> tuple:
    """``op(dy as rows, x2, *rest)``, a backward operator whose first output is ``dx``,
    with ``dx`` shaped like ``dy``."""
    dx, *sums = op(as_rows(dy, x2.shape[1]), x2, *rest)
    return dx.view(dy.shape), *sums


def define_ops(name: str, forward, backward, kernels: tuple) -> tuple:
    """The operators ``tilebook::<name>`` and ``tilebook::<name>_backward`` of a norm's
    operator bodies (:func:`tilebook.ops.library.define`), which may launch ``kernels``."""
    return (library.define(name, forward, kernels=kernels),
            library.define(f"{name}_backward", backward, kernels=kernels))  # fmt: skip


def norm_compile_jobs(arch: int, dtype, fwd, bwd, stats: int, sizes: tuple) -> dict[str, dict]:
    """The jobs of :func:`tilebook.course.aot.compile_many` for a norm's operator bodies
    ``fwd(x, w)`` and ``bwd(x, w, statistics)`` on meta tensors of ``dtype`` (None: the
    arch's default), at ``sizes``: ``(rows, columns, forward?, backward?)``."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    jobs = {}
    for n_rows, n_cols, with_fwd, with_bwd in sizes:
        x = targets.meta_tensor(n_rows, n_cols, dtype=dt)
        w = targets.meta_tensor(n_cols, dtype=dt)
        s = targets.meta_tensor(*((n_rows,) if stats == 1 else (stats, n_rows)))
        where = f"{n_rows}x{n_cols}"
        if with_fwd:
            jobs |= targets.recorded(lambda x=x, w=w: fwd(x, w), arch, where)
        if with_bwd:
            jobs |= targets.recorded(lambda x=x, w=w, s=s: bwd(x, w, s), arch, where)
    return jobs
