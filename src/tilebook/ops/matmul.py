"""Matrix products with a fused epilogue, ``act(a @ b + bias)``: :func:`matmul`,
:func:`fused_matmul` (and through it :func:`tilebook.linear_act`), their autograd and
``torch.library`` operators.

The kernels live in two modules: the portable pointer kernel and the tuning rules in
:mod:`tilebook.ops.matmul_kernels`, the Hopper kernel (TMA loads, wgmma, a persistent
grid) in :mod:`tilebook.ops.matmul_hopper`; their public names are importable from
here too.  On a Hopper GPU aligned 16-bit operands take the Hopper kernel, large
unaligned ones take it through aligned copies, everything else the pointer kernel.
Which one a call takes, and how it launches again, is planned once per kind of call
(:mod:`tilebook.ops.matmul_plan`).

Autograd (:class:`ProductFunction`): ``dA = dZ @ B^T`` and ``dB = A^T @ dZ`` from the
same kernels, reading the transposed views in place, and ``dbias = dZ.sum(0)``
(accumulated in float32), where ``dZ = dY * act'(Z)`` for the pre-activation
``Z = a @ b + bias``, which the fused forward never writes to memory.  Two designs:
store ``Z`` (an unfused forward, and an extra ``(M, N)`` tensor held until the
backward), or recompute ``Z`` in the backward with one more product.  We recompute:
the forward stays fused and saves nothing beyond its inputs (which autograd keeps
for ``F.linear`` too), at the price of a third product in the backward (forward and
backward go from 3 products to 4).  Two activations need no ``Z``: ``"none"``
(``dZ = dY``) and ``"relu"``, whose derivative reads the saved output (``Y > 0``
exactly where ``Z > 0``, PyTorch's own rule); the others take
:func:`~tilebook.ops.matmul_kernels.act_grad_kernel`.
"""

from __future__ import annotations

import torch

from .. import runtime
from .._launch import PLANS, call_key, launch, plain
from ..validation import check_same_dtype_device, check_tensor
from . import library, matmul_hopper, matmul_kernels
from .epilogue import ACTIVATIONS, epilogue
from .matmul_hopper import (
    GPU_TMA_CONFIGS,
    INTERPRETER_TMA_CONFIGS,
    STAGE_MIN_MACS,
    TMA_CONFIGS,
    TMA_DTYPES,
    matmul_tma_kernel,
    tma_layout,
    tma_supported,
)
from .matmul_kernels import (
    ACT_GRAD_BLOCK,
    GPU_PTR_CONFIGS,
    INTERPRETER_PTR_CONFIGS,
    PTR_CONFIGS,
    act_grad_kernel,
    compile_ahead,
    matmul_kernel,
    prune_configs,
    set_autotune,
    smem_budget_for,
    tile_coords,
)
from .matmul_plan import Product, f32_dot, make_plan, picked_configs, planned
from .precision import autocasting, lower

__all__ = [
    "ACTIVATIONS",
    "GPU_PTR_CONFIGS",
    "GPU_TMA_CONFIGS",
    "INTERPRETER_PTR_CONFIGS",
    "INTERPRETER_TMA_CONFIGS",
    "PTR_CONFIGS",
    "STAGE_MIN_MACS",
    "TMA_CONFIGS",
    "Product",
    "ProductFunction",
    "compile_ahead",
    "compile_jobs",
    "epilogue",
    "f32_dot",
    "fused_matmul",
    "matmul",
    "matmul_kernel",
    "matmul_tma_kernel",
    "picked_configs",
    "prune_configs",
    "set_autotune",
    "smem_budget_for",
    "tile_coords",
    "tma_layout",
    "tma_supported",
    "traced_product",
]

MM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
IMPLS = ("auto", "tma", "pointer")
# Read by tests of other modules (tests/test_devices.py, tests/test_lesson_09.py).
_tma_supported, _fits = tma_supported, matmul_kernels.fits
_F32 = torch.float32
_tf32_allowed = torch._C._get_cublas_allow_tf32  # torch.backends.cuda.matmul.allow_tf32

# --------------------------------------------------------------------------- autograd


def _act_grad(dy: torch.Tensor, t: torch.Tensor, activation: str, run=None) -> torch.Tensor:
    """``dY * act'(Z)`` for 2-D ``dy`` and ``t`` (Z, or Y for relu) of one shape and dtype;
    ``run(kernel, grid, *args, **meta)`` launches (default: :func:`tilebook._launch.launch`)."""
    dy, t = dy.contiguous(), t.contiguous()  # dY may be an expanded (stride-0) tensor
    dz = torch.empty_like(t, memory_format=torch.contiguous_format)
    n = dz.numel()
    if n:
        grid = (matmul_kernels.cdiv(n, ACT_GRAD_BLOCK),)
        meta = {"ACTIVATION": activation, "BLOCK": ACT_GRAD_BLOCK, "num_warps": 4}
        (run or launch)(act_grad_kernel, grid, dy, t, dz, n, **meta)
    return dz


class ProductFunction(torch.autograd.Function):
    """Autograd for ``act(a @ b + bias)`` (see the module docstring): of
    :func:`fused_matmul` and :func:`matmul`, and with ``linear`` of
    :func:`tilebook.linear_act` (``a`` is then ``x``, ``b`` the weight).  ``plan`` is
    the call's :class:`Product` (plumbing, no gradient); inside ``torch.compile`` the
    forward and backward call the operators instead (:func:`traced_product`)."""

    @staticmethod
    def forward(ctx, a, b, bias, activation: str, impl: str, linear: bool, plan):
        """``act(a @ b + bias)``, keeping what the backward reads."""
        y = _traced(a, b, bias, activation, impl, linear) if _compiling() else plan(a, b, bias)
        need_a, need_b = ctx.needs_input_grad[:2]
        again = activation not in ("none", "relu")  # the backward recomputes Z
        ctx.activation, ctx.impl, ctx.linear = activation, impl, linear
        ctx.save_for_backward(
            a if need_b or again else None,
            b if need_a or again else None,
            bias if again else None,
            y if activation == "relu" else None,
        )
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        """The gradients of ``a``, ``b`` and ``bias`` that were asked for."""
        a, b, bias, y = ctx.saved_tensors
        need_a, need_b, need_bias = ctx.needs_input_grad[:3]
        product, act_grad = (traced_product, act_grad_op) if _compiling() else (planned, _act_grad)
        linear, activation, n = ctx.linear, ctx.activation, dy.shape[-1]
        # The product's own 2-D operands: A (M, K), B (K, N), dZ (M, N).
        a2 = a.reshape(-1, a.shape[-1]) if linear and a is not None else a
        b2 = b.t() if linear and b is not None else b
        dz = dy.reshape(-1, n) if linear else dy
        if activation == "relu":
            dz = act_grad(dz, y.reshape(-1, n) if linear else y, "relu")
        elif activation != "none":  # recompute the pre-activation: see the module docstring
            dz = act_grad(dz, product(a2, b2, bias, "none", ctx.impl), activation)
        da = db = dbias = None
        if need_a:
            da = product(dz, b2.t(), None, "none", "auto")
            if linear:
                da = da.reshape(*dy.shape[:-1], da.shape[-1])
        if need_b:  # the weight's gradient is dB^T, computed as dZ^T @ A
            left, right = (dz.t(), a2) if linear else (a2.t(), dz)
            db = product(left, right, None, "none", "auto")
        if need_bias:
            dbias = dz.sum(0, dtype=torch.float32).to(dz.dtype)
        return da, db, dbias, None, None, None, None


_grad_enabled = torch.is_grad_enabled


# --------------------------------------------------------------------------- torch.library
# Inside torch.compile the products are operators.  The pointer kernel is traced
# (Inductor sees it and autotunes it over the same pruned configurations); the
# Hopper kernel takes host-side tensor descriptors, which PyTorch's tracer cannot
# record, so where eager calls would take it the operator is opaque and runs the
# eager path (plans included).  ProductFunction's backward calls them too.


def _op_pointer(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``activation(a @ b + bias)`` by the pointer kernel, for checked 2-D operands."""
    M, K = a.shape
    N = b.shape[1]
    c = a.new_empty((M, N))
    if M == 0 or N == 0:
        return c
    int64 = matmul_kernels.needs_int64(a, b, M, N)
    flags = {"HAS_BIAS": bias is not None, "ACTIVATION": activation, "INT64": int64,
             "F32_DOT": f32_dot(a.dtype)}  # fmt: skip
    bias = a if bias is None else bias.contiguous()
    args = matmul_kernels.ptr_args(M, N, K, a.stride(), b.stride(), c.stride())(a, b, c, bias)
    library.launch(matmul_kernels.ptr_autotuned, matmul_kernels.ptr_grid(M, N), *args, **flags)
    return c


def _op_eager(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str, impl: str
) -> torch.Tensor:
    """``activation(a @ b + bias)`` as an eager call with no autograd computes it."""
    return planned(a, b, bias, activation, impl)


def _op_eager_fake(a, b, bias, activation, impl):
    return a.new_empty((a.shape[0], b.shape[1]))


def _op_act_grad(dy: torch.Tensor, t: torch.Tensor, activation: str) -> torch.Tensor:
    """``dY * act'(Z)`` (``t`` is Z, or Y for ``"relu"``)."""
    return _act_grad(dy, t, activation, run=library.launch)


fused_matmul_op = library.define("fused_matmul", _op_pointer, kernels=(matmul_kernel,))
fused_matmul_eager_op = library.define_opaque("fused_matmul_eager", _op_eager, fake=_op_eager_fake)
act_grad_op = library.define("act_grad", _op_act_grad, kernels=(act_grad_kernel,))


def traced_product(a, b, bias, activation: str, impl: str) -> torch.Tensor:
    """The operator a traced ``fused_matmul(a, b, bias, activation, impl=impl)`` calls
    (checked operands): the pointer kernel's, unless an eager call could take the
    Hopper kernel, whose opaque operator then decides at run time as eager does."""
    if impl == "pointer" or (impl == "auto" and not _tma_possible(a.device, a.dtype)):
        return fused_matmul_op(a, b, bias, activation)
    return fused_matmul_eager_op(a, b, bias, activation, impl)


def _traced(a, b, bias, activation, impl, linear) -> torch.Tensor:
    if linear:  # a is x (..., K), b the weight (N, K)
        y = traced_product(a.reshape(-1, a.shape[-1]), b.t(), bias, activation, impl)
        return y.reshape(*a.shape[:-1], b.shape[0])
    return traced_product(a, b, bias, activation, impl)


def _assume_constant_result(fn):
    """Mark ``fn`` as :func:`torch.compiler.assume_constant_result` does: Dynamo calls it
    while tracing and keeps its result as a constant, instead of tracing into it.

    The public decorator imports ``torch._dynamo`` first, about 2 s that every
    ``import tilebook`` paid, only to set this attribute, which Dynamo reads when it
    meets the function (``tests/test_import_cost.py`` checks the two stay alike).
    """
    fn._dynamo_marked_constant = True
    return fn


# Traced code must not step into tma_supported (functools.cache, CUDA queries): the
# answer is fixed for a device and dtype, so the trace takes it as a constant.
@_assume_constant_result
def _tma_possible(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether an ``impl="auto"`` call on ``device`` with ``dtype`` may take the Hopper kernel."""
    return runtime.is_gpu() and dtype in TMA_DTYPES and tma_supported(device)


def compiled(a, b, bias, activation: str, impl: str, linear: bool = False) -> torch.Tensor:
    """A checked product inside torch.compile: through :class:`ProductFunction` when a
    gradient is wanted (Dynamo traces its forward and backward), else the operator."""
    if _grad_enabled() and (a.requires_grad or b.requires_grad
                            or (bias is not None and bias.requires_grad)):  # fmt: skip
        return ProductFunction.apply(a, b, bias, activation, impl, linear, None)
    return _traced(a, b, bias, activation, impl, linear)


_compiling = torch.compiler.is_compiling


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The kernels a product launches on ``sm_<arch>``, as jobs of
    :func:`tilebook.course.aot.compile_many`, with the ``linear_act`` epilogue (bias and
    GELU): the pointer kernel in the first configuration that :func:`prune_configs`
    keeps for a large product there (what :func:`set_autotune` off launches), and on
    Hopper the TMA kernel likewise; and the GELU's derivative for the backward.  Below
    sm_90 there is no TMA job: the package never launches that kernel there."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    name, elem, big, jobs = targets.dtype_name(dt), dt.itemsize, 8192, {}
    budget = smem_budget_for(arch)
    if dt in TMA_DTYPES and matmul_hopper.tma_target(arch):
        cfg = prune_configs(GPU_TMA_CONFIGS, big, big, big, elem, budget=budget)[0]
        job = matmul_kernels.ahead_job("tma", cfg, name, False, True, "gelu", True, arch)
        jobs["matmul_tma_kernel bias+gelu"] = job
    cfg = prune_configs(GPU_PTR_CONFIGS, big, big, big, elem, budget=budget)[0]
    job = matmul_kernels.ahead_job("pointer", cfg, name, False, False, "gelu", True, arch)
    jobs["matmul_kernel bias+gelu"] = job
    t = targets.meta_tensor(8192, 4096, dtype=dt)
    return jobs | targets.recorded(lambda: _op_act_grad(t, t, "gelu"), arch, "8192x4096")


# --------------------------------------------------------------------------- public API


_DEVICE_TYPE = runtime.device().type
_MM_DTYPE_SET = frozenset(MM_DTYPES)
_Tensor = torch.Tensor


def is_operand(t: object, ndim: int = 2) -> bool:
    """check_tensor's conditions in one cheap expression: launch latency is host time."""
    return (isinstance(t, torch.Tensor) and t.layout is torch.strided and t.dtype in _MM_DTYPE_SET
            and t.device.type == _DEVICE_TYPE and t.dim() == ndim)  # fmt: skip


def check_activation(activation: object, op: str) -> str:
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(
            f"{op}: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}"
        )
    return activation


def check_impl(impl: object, op: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"{op}: impl must be 'auto', 'tma' or 'pointer', got {impl!r}")


def _check_operands(a, b, bias, activation, impl, op) -> None:
    """Every check of fused_matmul's arguments; raises TypeError or ValueError."""
    if not (is_operand(a) and is_operand(b)):  # the slow checks say what is wrong
        check_tensor(a, "a", op, dtypes=MM_DTYPES, ndim=2)
        check_tensor(b, "b", op, dtypes=MM_DTYPES, ndim=2)
    check_same_dtype_device(a, b, ("a", "b"), op)
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: inner dimensions differ: a is {tuple(a.shape)} and b is {tuple(b.shape)} "
            f"(a.shape[1] must equal b.shape[0])"
        )
    if bias is not None:
        check_tensor(bias, "bias", op, dtypes=MM_DTYPES, ndim=1)
        check_same_dtype_device(a, bias, ("a", "bias"), op)
        if bias.shape[0] != b.shape[1]:
            raise ValueError(f"{op}: bias must have shape ({b.shape[1]},), got {tuple(bias.shape)}")
    check_activation(activation, op)
    check_impl(impl, op)


def _product(a, b, bias, activation, impl, op) -> torch.Tensor:
    """:func:`fused_matmul` outside torch.compile."""
    key = None
    if plain(a) and plain(b) and (bias is None or plain(bias)):
        # A repeat call: its key fixes everything the checks and the plan looked at.
        key = call_key(a, b, bias, make_plan, activation, impl, a.dtype is _F32 and _tf32_allowed())
        try:
            plan = PLANS.get(key)
        except TypeError:  # an unhashable activation or impl: the checks say what is wrong
            plan = key = None
        if plan is not None:
            if _grad_enabled() and (a.requires_grad or b.requires_grad
                            or (bias is not None and bias.requires_grad)):  # fmt: skip
                return ProductFunction.apply(a, b, bias, activation, impl, False, plan)
            return plan(a, b, bias)
    _check_operands(a, b, bias, activation, impl, op)
    given = bias
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()  # the kernels read the bias with unit stride
    plan = make_plan(a, b, bias, activation, impl, op, (a.shape[0], b.shape[1]))
    if key is not None and bias is given:
        PLANS.remember(key, plan)
    if _grad_enabled() and (a.requires_grad or b.requires_grad
                            or (bias is not None and bias.requires_grad)):  # fmt: skip
        return ProductFunction.apply(a, b, bias, activation, impl, False, plan)
    return plan(a, b, bias)


def fused_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    *,
    impl: str = "auto",
    op: str = "fused_matmul",
) -> torch.Tensor:
    """Return ``activation(a @ b + bias)`` from one kernel: the engine behind
    :func:`matmul` and :func:`tilebook.linear_act`.

    Parameters
    ----------
    a, b
        2-D tensors ``(M, K)`` and ``(K, N)`` of one dtype (float16, bfloat16, or
        float32, which follows ``torch.backends.cuda.matmul.allow_tf32`` as in
        :func:`matmul`).  Any strides; transposed views are read in place.
    bias
        Optional ``(N,)`` tensor of the same dtype, added to every row.
    activation
        One of :data:`ACTIVATIONS`; ``"gelu"`` is the erf form, ``"gelu_tanh"`` the
        tanh approximation, as in ``torch.nn.functional.gelu``.
    impl
        ``"auto"`` takes the TMA kernel on a Hopper GPU when the operands allow it,
        else the pointer kernel; ``"tma"`` or ``"pointer"`` forces one (lessons and
        tests compare them; ``"tma"`` also runs under the interpreter).
    op
        The name that error messages start with.

    Notes
    -----
    Differentiable with respect to ``a``, ``b`` and ``bias`` (:class:`ProductFunction`).
    Inside ``torch.compile`` the call is an operator (:func:`traced_product`).
    """
    if _compiling():
        _check_operands(a, b, bias, activation, impl, op)
        return compiled(a, b, bias, activation, impl)
    return _product(a, b, bias, activation, impl, op)


_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


def _batched(a, b) -> torch.Tensor | None:
    """``a @ b`` for operands that are not both 2-D, by 2-D products; None for two
    2-D tensors (of a tensor subclass: the 2-D path checks them)."""
    if not (isinstance(a, _Tensor) and isinstance(b, _Tensor)):
        check_tensor(a, "a", "matmul", dtypes=MM_DTYPES)
        check_tensor(b, "b", "matmul", dtypes=MM_DTYPES)
    if a.dim() == 2 and b.dim() == 2:
        return None
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(
            f"matmul: both operands need at least one dimension, got shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)} (use * for a scalar)"
        )
    if a.dim() == 1:  # a row vector, removed from the result
        return matmul(a.unsqueeze(0), b).squeeze(-2)
    if b.dim() == 1:  # a column vector
        return matmul(a, b.unsqueeze(-1)).squeeze(-1)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: inner dimensions differ: a is {tuple(a.shape)} and b is "
            f"{tuple(b.shape)} (a.shape[-1] must equal b.shape[-2])"
        )
    if b.dim() == 2:  # every matrix of a times one b: one product, rows stacked
        lead = a.shape[:-1]
        return matmul(a.reshape(-1, a.shape[-1]), b).reshape(*lead, b.shape[-1])
    try:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"matmul: the batch dimensions of a {tuple(a.shape)} and b {tuple(b.shape)} "
            "do not broadcast"
        ) from None
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    out = torch.stack([matmul(x, y) for x, y in zip(a3.unbind(0), b3.unbind(0), strict=True)])
    return out.reshape(*batch, a.shape[-2], b.shape[-1])


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return ``a @ b`` computed by Triton kernels, with ``torch.matmul``'s shapes.

    ``a`` is (..., M, K) and ``b`` is (..., K, N); leading dimensions broadcast, and a
    1-D operand is a vector (its dimension is added for the product and removed from
    the result), as in :func:`torch.matmul`.  A batch whose ``b`` is 2-D is one
    product of (batch x M, K) by (K, N); a batched ``b`` is a product per matrix.

    float16 and bfloat16 accumulate in float32 and return the input dtype.  float32
    follows ``torch.backends.cuda.matmul.allow_tf32`` as ``torch.matmul`` does: off
    (PyTorch's default), the products are in full float32; on, the tensor cores take
    the operands as TF32 (about 1e-3 relative error), much faster.  Any M, N, K and
    any strides (transposed views included).  On a Hopper GPU aligned 16-bit operands
    take the persistent TMA kernel, everything else the pointer kernel.  Under
    ``torch.autocast`` both operands are cast to the autocast dtype first, as
    ``torch.matmul``'s are (:mod:`tilebook.ops.precision`).

    Differentiable: ``dA = dC @ B^T`` and ``dB = A^T @ dC`` come from the same kernels
    (:class:`ProductFunction`).  Inside ``torch.compile`` the call is an operator of
    ``torch.ops.tilebook`` (:func:`traced_product`).

    Examples
    --------
    >>> c = tilebook.matmul(a, b)   # doctest: +SKIP
    """
    if autocasting(a):  # as torch.matmul: both operands in the autocast dtype
        a, b = lower(a, b)
    if not (type(a) in _PLAIN and type(b) in _PLAIN and a.dim() == 2 and b.dim() == 2):
        batched = _batched(a, b)
        if batched is not None:
            return batched
    if _compiling():
        _check_operands(a, b, None, "none", "auto", "matmul")
        return compiled(a, b, None, "none", "auto")
    return _product(a, b, None, "none", "auto", "matmul")
