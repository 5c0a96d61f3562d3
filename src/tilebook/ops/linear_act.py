"""A linear layer and its activation in one kernel: ``act(x @ weight.T + bias)``.

Unfused, PyTorch writes the ``(M, N)`` product to memory and an element-wise
kernel reads it back to apply the activation.  Here the bias and the activation
run on the float32 accumulator in registers, and the output is stored once: the
matmul kernels of :mod:`tilebook.ops.matmul` with their epilogue switched on.
``weight`` is read in place as ``weight.T`` (a transposed view, no copy), and the
batch dimensions of ``x`` are the rows of one product.

What fusion saves is the element-wise pass: lesson 08 counts its bytes, and
``benchmarks/linear_act.py`` measures it against the unfused pair (the record
``bench_linear_act``).  The activation itself runs while the tensor cores wait, so
it has to be cheap.  The GELU is computed without libdevice's ``erf`` (about 30
instructions an element) from a fitted ``exp2`` form (11, see
:func:`tilebook.ops.epilogue.activation`), within 6e-7 of the erf form.  (Triton
3.6's warp specialisation on Hopper, which would overlap the epilogue with the next
tile's MMAs, compiled but ran no faster here.)

The launches, plans, autograd and operators are :mod:`tilebook.ops.matmul`'s: a call
is planned once per call key, and its backward (:class:`~tilebook.ops.matmul.ProductFunction`)
recomputes the pre-activation with one more product rather than storing it.
"""

# Development measurements (H100, bf16): the element-wise pass that fusion saves took
# about 45 us for an 8192 x 4096 output, some 10% of the product; the exp2 GELU took
# bias + GELU at 8192 x 4096 -> 4096 from 0.99x the unfused pair to about 1.05x.

from __future__ import annotations

import torch

from .._launch import PLANS, call_key, plain
from ..validation import check_same_dtype_device, check_tensor
from .matmul import (
    ACTIVATIONS,
    MM_DTYPES,
    ProductFunction,
    check_activation,
    check_impl,
    compiled,
    is_operand,
)
from .matmul_plan import make_plan
from .precision import autocasting, lower

__all__ = ["ACTIVATIONS", "linear_act"]

_OP = "linear_act"
_F32 = torch.float32
_tf32_allowed = torch._C._get_cublas_allow_tf32
_grad_enabled = torch.is_grad_enabled
_compiling = torch.compiler.is_compiling


def _check_args(x, weight, bias, activation, impl) -> str:
    """Every check of :func:`linear_act`'s arguments; returns the activation."""
    # The cheap test first; the full checks run only to say what is wrong.
    if not (isinstance(x, torch.Tensor) and x.dim() >= 1 and is_operand(x, x.dim())):
        check_tensor(x, "x", _OP, dtypes=MM_DTYPES, min_ndim=1)
    if not is_operand(weight):
        check_tensor(weight, "weight", _OP, dtypes=MM_DTYPES, ndim=2)
    check_same_dtype_device(x, weight, ("x", "weight"), _OP)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{_OP}: x has {x.shape[-1]} features in its last dimension but weight "
            f"{tuple(weight.shape)} expects {weight.shape[1]} (weight is (out, in))"
        )
    if bias is not None:
        check_tensor(bias, "bias", _OP, dtypes=MM_DTYPES, ndim=1)
        check_same_dtype_device(x, bias, ("x", "bias"), _OP)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"{_OP}: bias must have shape ({weight.shape[0]},) to match weight "
                f"{tuple(weight.shape)}, got {tuple(bias.shape)}"
            )
    activation = check_activation(activation, _OP)
    check_impl(impl, _OP)
    return activation


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
    TF32 on a GPU where ``torch.backends.cuda.matmul.allow_tf32`` allows it).  The
    result has shape ``(..., N)`` and the input dtype.

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
    ``bias`` (the backward recomputes the pre-activation with one extra product:
    :class:`tilebook.ops.matmul.ProductFunction`).
    Inside ``torch.compile`` the call is an operator of ``torch.ops.tilebook``
    (:func:`tilebook.ops.matmul.traced_product`), its backward too.

    Examples
    --------
    >>> y = tilebook.linear_act(x, layer.weight, layer.bias, "gelu")   # doctest: +SKIP
    """
    if autocasting(x):
        x, weight, bias = lower(x, weight, bias)  # as F.linear under autocast
    if _compiling():
        activation = _check_args(x, weight, bias, activation, impl)
        return compiled(x, weight, bias, activation, impl, linear=True)
    key = None
    if plain(x) and plain(weight) and (bias is None or plain(bias)):
        # A repeat call: its key fixes everything the checks and the plan looked at.
        key = call_key(x, weight, bias, linear_act, activation, impl,
                       x.dtype is _F32 and _tf32_allowed())  # fmt: skip
        try:
            plan = PLANS.get(key)
        except TypeError:  # an unhashable activation or impl: the checks say what is wrong
            plan = key = None
        if plan is not None:
            if _grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):  # fmt: skip
                return ProductFunction.apply(x, weight, bias, activation, impl, True, plan)
            return plan(x, weight, bias)
    activation = _check_args(x, weight, bias, activation, impl)
    lead, n_out = x.shape[:-1], weight.shape[0]
    x2 = x.reshape(-1, x.shape[-1])  # a view whenever the batch dimensions allow one
    given = bias
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()  # the kernels read the bias with unit stride
    # A view of x: the plan reads x itself (it has x2's data pointer and strides);
    # a copy is passed as it is, and its plan is not kept (x would not be the copy).
    direct = x2.data_ptr() == x.data_ptr()
    held, shape = (x, (*lead, n_out)) if direct else (x2, (x2.shape[0], n_out))
    plan = make_plan(x2, weight.t(), bias, activation, impl, _OP, shape, linear=True)
    if key is not None and direct and bias is given:
        PLANS.remember(key, plan)
    if _grad_enabled() and (x.requires_grad or weight.requires_grad
                            or (bias is not None and bias.requires_grad)):  # fmt: skip
        y = ProductFunction.apply(held, weight, bias, activation, impl, True, plan)
    else:
        y = plan(held, weight, bias)
    return y if direct else y.reshape(*lead, n_out)
