"""The epilogue of tilebook's matmul kernels: bias and activation on the accumulator.

A matmul kernel ends with its output tile in registers, as a float32
accumulator.  :func:`epilogue` adds the bias and applies the activation there,
before the single store, so that ``act(x @ w.T + b)`` costs no memory traffic
beyond the product's own (lesson 08 counts what the unfused version moves).
Both are ``@triton.jit`` helpers: a kernel that calls them has them inlined,
and ``ACTIVATION`` being a ``tl.constexpr`` string, each activation compiles
into a binary that holds only its own arithmetic.

The erf GELU is computed without ``erf``.  For ``a = |x|``, the normal tail
``Phi(-a)`` is ``2**P(a)`` with ``P`` a degree-7 polynomial fitted offline to
``log2 Phi(-a)`` on ``[0, 5.5]`` (past that the tail is below float32's reach),
and ``x * Phi(x) = max(x, 0) - a * Phi(-a)`` for either sign of ``x``.  One
``exp2`` and a handful of multiply-adds against libdevice ``erf``'s polynomial
pair; within 6e-7 of the erf form everywhere (6e-6 relatively), far below what
a 16-bit output resolves.  ``tests/test_linear_act.py`` holds it to that.

The tanh GELU and SiLU are ``x * sigmoid(.)``: an exponential and a reciprocal,
two special-function (MUFU) instructions a value.  On a GPU they take one instead:
``x * sigmoid(v) = x/2 + x/2 * tanh(v/2)``, with PTX's ``tanh.approx.f32``
(sm_75 on) issued through ``tl.inline_asm_elementwise``.  Its error is about 1e-4
relatively, below what a float16 output resolves (``tests/test_linear_act.py``
holds both to 2e-4 on a GPU).  What that gains against the unfused pair is
measured by ``benchmarks/linear_act.py`` (the record ``bench_linear_act``).  The
interpreter runs no assembly: there, :data:`HW_TANH` is false and the sigmoid form
runs.

Used by :mod:`tilebook.ops.matmul` (both kernels) and so by
:func:`tilebook.linear_act` and :func:`tilebook.matmul`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import runtime

__all__ = ["ACTIVATIONS", "HW_TANH", "activation", "epilogue", "tanh_approx"]

# Development measurement of tanh.approx (H100): SiLU at 4096 x 4096 -> 11008 went from
# 1.05x to 1.11x the unfused pair, the tanh GELU at 8192 x 4096 -> 4096 from 1.01x to
# 1.04x.

#: The values of ``ACTIVATION``.  ``"gelu"`` is the erf form, ``"gelu_tanh"`` the
#: tanh approximation, as in ``torch.nn.functional.gelu``.
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")

#: Whether kernels compile with :func:`tanh_approx`, as they do everywhere but under
#: the interpreter (ahead-of-time compiles included, so that they show what a GPU runs).
HW_TANH = tl.constexpr(not runtime.is_interpreter())


@triton.jit
def tanh_approx(x):
    """``tanh(x)`` in one special-function instruction, PTX's ``tanh.approx.f32`` (sm_75
    on), for float32 ``x``; about 1e-4 relative error.  Not under the interpreter, which
    runs no assembly: kernels call it where :data:`HW_TANH` is true."""
    return tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def activation(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        # x * Phi(x) = max(x, 0) - a * Phi(-a) with a = |x| (clamped: +inf stays inf),
        # and Phi(-a) = 2^P(a), P a degree-7 fit of log2 Phi(-a) on [0, 5.5].
        t = tl.minimum(tl.abs(x), 5.5)
        p = -1.7934344214154407e-06 * t + 6.090377428336069e-05
        p = p * t - 0.0009260259685106575
        p = p * t + 0.00849374569952488
        p = p * t - 0.053937822580337524
        p = p * t - 0.4584805369377136
        p = p * t - 1.1512467861175537
        p = p * t - 0.9999954700469971
        x = tl.maximum(x, 0.0) - t * tl.exp2(p)
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * x * (1 + tanh(u)), or x * sigmoid(2u) where there is no tanh_approx
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = 0.5 * x + 0.5 * x * tanh_approx(u) if HW_TANH else x * tl.sigmoid(2.0 * u)
    elif ACTIVATION == "silu":
        # x * sigmoid(x) == x/2 + x/2 * tanh(x/2): one MUFU instruction, not two
        x = 0.5 * x + 0.5 * x * tanh_approx(0.5 * x) if HW_TANH else x * tl.sigmoid(x)
    return x


@triton.jit
def epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    # Runs on the float32 accumulator while it is still in registers.
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    return activation(acc, ACTIVATION)
