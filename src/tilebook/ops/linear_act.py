"""A linear layer and its activation in one kernel: ``act(x @ weight.T + bias)``.

Unfused, PyTorch writes the ``(M, N)`` product to memory and an element-wise
kernel reads it back to apply the activation.  Here the bias and the activation
run on the float32 accumulator in registers, and the output is stored once: the
matmul kernels of :mod:`tilebook.ops.matmul` with their epilogue switched on.
``weight`` is read in place as ``weight.T`` (a transposed view, no copy).

What fusion saves is the element-wise pass: lesson 08 counts its bytes, and
``benchmarks/linear_act.py`` measures it against the unfused pair (the record
``bench_linear_act``).  The activation itself runs while the tensor cores wait, so
it has to be cheap.  The GELU is computed without libdevice's ``erf`` (about 30
instructions an element) from a fitted ``exp2`` form (11, see
:func:`tilebook.ops.epilogue.activation`), within 6e-7 of the erf form.  (Triton
3.6's warp specialisation on Hopper, which would overlap the epilogue with the next
tile's MMAs, compiled but ran no faster here.)

Autograd: when grad mode is on and ``x``, ``weight`` or ``bias`` requires grad, the
call goes through :class:`LinearActFunction`; otherwise (inference, ``torch.no_grad``)
it takes the same cached direct launch as before, after one cheap test.

The backward needs ``act'(Z)`` for the pre-activation ``Z = x @ W.T + b``, which the
fused forward never writes to memory.  Two designs: store ``Z`` (forward as an
unfused GEMM plus an element-wise activation pass, giving up the fusion this op
exists for, and holding an extra ``(M, N)`` tensor until the backward), or recompute
``Z`` in the backward with one more GEMM (``fused_matmul(..., "none")``).  We
recompute: the forward stays fused and saves nothing beyond ``x``, ``weight`` and
``bias`` (which autograd keeps for ``F.linear`` too), at the price of a third GEMM in
the backward (forward + backward go from 3 GEMMs to 4).  Two activations need no
``Z``: ``"none"`` (``dZ = dY``) and ``"relu"``, whose derivative reads the saved output
(``Y > 0`` exactly where ``Z > 0``, the rule PyTorch's own ReLU backward uses).  Then
``dZ = dY * act'(Z)`` (:func:`act_grad_kernel`, float32 arithmetic), ``dX = dZ @ W``,
``dW = dZ.T @ X`` and ``db = dZ.sum(0)`` (accumulated in float32).
"""

# Development measurements (H100, bf16): the element-wise pass that fusion saves took
# about 45 us for an 8192 x 4096 output, some 10% of the product; the exp2 GELU took
# bias + GELU at 8192 x 4096 -> 4096 from 0.99x the unfused pair to about 1.05x.

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import device_guard
from ..validation import check_tensor
from . import library
from .matmul import (
    _IMPLS,
    ACTIVATIONS,
    MM_DTYPES,
    _call_key,
    _check_activation,
    _check_pair,
    _is_operand,
    _remember,
    _run,
    _run_cached,
    fused_matmul,
    fused_matmul_eager_op,
    fused_matmul_op,
    matmul,
    traced_product,
)
from .precision import autocasting, lower

__all__ = ["ACTIVATIONS", "LinearActFunction", "act_grad_kernel", "compile_jobs", "linear_act"]

_OP = "linear_act"
_grad_enabled = torch.is_grad_enabled


# --------------------------------------------------------------------------- backward


@triton.jit
def act_grad_kernel(
    dy_ptr,  # dY, contiguous
    t_ptr,  # Z (the pre-activation), or Y for "relu"; contiguous
    dz_ptr,  # dZ = dY * act'(Z), contiguous
    n_elements,
    ACTIVATION: tl.constexpr,  # "relu", "gelu", "gelu_tanh" or "silu"
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(axis=0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(t_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == "relu":
        dz = tl.where(z > 0.0, dy, 0.0)
    elif ACTIVATION == "gelu":
        # d/dz z * Phi(z) = Phi(z) + z * phi(z)
        cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * z * z)
        dz = dy * (cdf + z * pdf)
    elif ACTIVATION == "gelu_tanh":
        # 0.5 z (1 + tanh(u)) == z * s with s = sigmoid(2u), u = c (z + a z^3):
        # derivative s + z * 2 s (1 - s) * c (1 + 3 a z^2).  No tanh (libdevice).
        z2 = z * z
        s = tl.sigmoid(1.5957691216057308 * (z + 0.044715 * z2 * z))
        dz = dy * (s + 1.5957691216057308 * z * s * (1.0 - s) * (1.0 + 0.134145 * z2))
    else:  # "silu": d/dz z * sigmoid(z) = s (1 + z (1 - s))
        s = tl.sigmoid(z)
        dz = dy * (s * (1.0 + z * (1.0 - s)))
    tl.store(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask=mask)


_ACT_GRAD_BLOCK = 1024


def _act_grad(dy: torch.Tensor, t: torch.Tensor, activation: str, run=None) -> torch.Tensor:
    """``dY * act'(Z)`` for 2-D ``dy`` and ``t`` (Z, or Y for relu) of one shape and dtype;
    ``run(kernel, grid, *args, **meta)`` launches (default: Triton's JIT)."""
    dy, t = dy.contiguous(), t.contiguous()  # dY may be an expanded (stride-0) tensor
    dz = torch.empty_like(t, memory_format=torch.contiguous_format)
    n = dz.numel()
    if n:
        grid = (triton.cdiv(n, _ACT_GRAD_BLOCK),)
        meta = {"ACTIVATION": activation, "BLOCK": _ACT_GRAD_BLOCK, "num_warps": 4}
        if run is None:
            with device_guard(dz):
                act_grad_kernel[grid](dy, t, dz, n, **meta)
        else:
            run(act_grad_kernel, grid, dy, t, dz, n, **meta)
    return dz


class LinearActFunction(torch.autograd.Function):
    """Autograd for :func:`linear_act`; see the module docstring for the design."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation, impl):
        # Autograd runs forward with grad off already; no_grad makes sure linear_act
        # takes its no-grad path (checks, cached launch) rather than coming back here.
        with torch.no_grad():
            y = linear_act(x, weight, bias, activation, impl=impl)
        ctx.activation, ctx.impl = activation, impl
        ctx.save_for_backward(x, weight, bias, y if activation == "relu" else None)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, bias, y = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        n_out, k = weight.shape
        x2 = x.reshape(-1, k)
        dz = dy.reshape(-1, n_out)
        if ctx.activation == "relu":
            dz = _act_grad(dz, y.reshape(-1, n_out), "relu")
        elif ctx.activation != "none":
            z = fused_matmul(x2, weight.t(), bias, "none", impl=ctx.impl, op=_OP)
            dz = _act_grad(dz, z, ctx.activation)
        dx = fused_matmul(dz, weight, op=_OP).reshape(x.shape) if need_x else None
        dw = matmul(dz.t(), x2) if need_w else None
        db = dz.sum(0, dtype=torch.float32).to(bias.dtype) if need_b else None
        return dx, dw, db, None, None


# --------------------------------------------------------------------------- torch.library
# The backward of tilebook.ops.matmul's two operators, as LinearActFunction computes
# it, from operators: AOTAutograd traces it into the compiled backward graph.


def _op_act_grad(dy: torch.Tensor, t: torch.Tensor, activation: str) -> torch.Tensor:
    """``dY * act'(Z)`` (``t`` is Z, or Y for ``"relu"``)."""
    return _act_grad(dy, t, activation, run=library.launch)


act_grad_op = library.define("act_grad", _op_act_grad, kernels=(act_grad_kernel,))


def _product_setup(ctx, inputs, output) -> None:
    a, b, bias, activation = inputs[:4]
    ctx.activation = activation
    ctx.impl = inputs[4] if len(inputs) > 4 else "pointer"
    ctx.save_for_backward(a, b, bias, output if activation == "relu" else None)


def _product_grad(ctx, dc):
    a, b, bias, y = ctx.saved_tensors
    need_a, need_b, need_bias = ctx.needs_input_grad[:3]
    if ctx.activation == "none":
        dz = dc
    elif ctx.activation == "relu":
        dz = act_grad_op(dc, y, "relu")
    else:  # recompute the pre-activation: see the module docstring
        dz = act_grad_op(dc, traced_product(a, b, bias, "none", ctx.impl), ctx.activation)
    da = traced_product(dz, b.t(), None, "none", "auto") if need_a else None
    db = traced_product(a.t(), dz, None, "none", "auto") if need_b else None
    dbias = dz.sum(0, dtype=torch.float32).to(dz.dtype) if need_bias else None
    return (da, db, dbias, None) + ((None,) if len(ctx.needs_input_grad) > 4 else ())


fused_matmul_op.register_autograd(_product_grad, setup_context=_product_setup)
fused_matmul_eager_op.register_autograd(_product_grad, setup_context=_product_setup)


def _compiled(x, weight, bias, activation, impl) -> torch.Tensor:
    """:func:`linear_act` inside torch.compile: the checks, then an operator."""
    activation = _check_args(x, weight, bias, activation, impl)
    lead, n_out = x.shape[:-1], weight.shape[0]
    y = traced_product(x.reshape(-1, x.shape[-1]), weight.t(), bias, activation, impl)
    return y.reshape(*lead, n_out)


def _check_args(x, weight, bias, activation, impl) -> str:
    """Every check of :func:`linear_act`'s arguments; returns the activation."""
    # The cheap test first; the full checks run only to say what is wrong.
    if not (isinstance(x, torch.Tensor) and x.dim() >= 1 and _is_operand(x, x.dim())):
        check_tensor(x, "x", _OP, dtypes=MM_DTYPES, min_ndim=1)
    if not _is_operand(weight):
        check_tensor(weight, "weight", _OP, dtypes=MM_DTYPES, ndim=2)
    _check_pair(x, weight, ("x", "weight"), _OP)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{_OP}: x has {x.shape[-1]} features in its last dimension but weight "
            f"{tuple(weight.shape)} expects {weight.shape[1]} (weight is (out, in))"
        )
    if bias is not None:
        check_tensor(bias, "bias", _OP, dtypes=MM_DTYPES, ndim=1)
        _check_pair(x, bias, ("x", "bias"), _OP)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"{_OP}: bias must have shape ({weight.shape[0]},) to match weight "
                f"{tuple(weight.shape)}, got {tuple(bias.shape)}"
            )
    activation = _check_activation(activation, _OP)
    if impl not in _IMPLS:
        raise ValueError(f"{_OP}: impl must be 'auto', 'tma' or 'pointer', got {impl!r}")
    return activation


_compiling = torch.compiler.is_compiling


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """:func:`act_grad_kernel` (GELU) as a job of :func:`tilebook.course.aot.compile_many` for
    ``sm_<arch>``; the products are :func:`tilebook.ops.matmul.compile_jobs`'."""
    from . import targets

    t = targets.meta_tensor(8192, 4096, dtype=dtype or targets.default_dtype(arch))
    return targets.recorded(lambda: _op_act_grad(t, t, "gelu"), arch, "8192x4096")


# --------------------------------------------------------------------------- public API


def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "gelu",
    *,
    impl: str = "auto",
) -> torch.Tensor:
    """Return ``activation(torch.nn.functional.linear(x, weight, bias))`` from one kernel.

    All tensors share one dtype: float16 or bfloat16 (float32 also works, through
    TF32 on a GPU).  The result has shape ``(..., N)`` and the input dtype.

    Parameters
    ----------
    x
        Input ``(..., K)``: any number of leading batch dimensions (flattened into
        the M dimension of one matrix product).
    weight
        ``(N, K)``, as stored by ``torch.nn.Linear``.
    bias
        Optional ``(N,)``.
    activation
        ``"none"``, ``"relu"``, ``"gelu"`` (the erf form, as
        ``F.gelu(approximate="none")``, to within 6e-7 in float32 before the
        output is rounded), ``"gelu_tanh"`` (as ``F.gelu(approximate="tanh")``)
        or ``"silu"``.
    impl
        ``"auto"``, ``"tma"`` or ``"pointer"``; see :func:`tilebook.ops.matmul.fused_matmul`.

    Notes
    -----
    Under ``torch.autocast`` the three are cast to the autocast dtype first, as
    ``F.linear``'s are.  Differentiable with respect to ``x``, ``weight`` and
    ``bias`` (the backward recomputes the pre-activation with one extra GEMM; see
    the module docstring).
    Inside ``torch.compile`` the call is an operator of ``torch.ops.tilebook``
    (:func:`tilebook.ops.matmul.traced_product`), its backward too.

    Examples
    --------
    >>> y = tilebook.linear_act(x, layer.weight, layer.bias, "gelu")   # doctest: +SKIP
    """
    if autocasting(x):
        x, weight, bias = lower(x, weight, bias)  # as F.linear under autocast
    if _compiling():
        return _compiled(x, weight, bias, activation, impl)
    if _grad_enabled() and (
        getattr(x, "requires_grad", False)
        or getattr(weight, "requires_grad", False)
        or getattr(bias, "requires_grad", False)
    ):
        return LinearActFunction.apply(x, weight, bias, activation, impl)
    # A call like one seen before (same shapes, strides, dtypes, devices, alignment,
    # activation) launches straight away: it passed every check below then.
    key = _call_key(_OP, x, weight, bias, activation, impl)
    out = _run_cached(key, x, weight, bias)
    if out is not None:
        return out
    activation = _check_args(x, weight, bias, activation, impl)
    lead, n_out = x.shape[:-1], weight.shape[0]
    x2 = x.reshape(-1, x.shape[-1])  # a view whenever the batch dimensions allow one
    y, runner = _run(x2, weight.t(), bias, activation, impl, _OP)
    if x2.data_ptr() == x.data_ptr():  # a view: later calls may hand the runner x itself
        _remember(key, runner, (*lead, n_out))
    return y.reshape(*lead, n_out)
