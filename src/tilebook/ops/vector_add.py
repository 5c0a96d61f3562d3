"""Element-wise addition: the first kernel of the course (lesson 07).

One program owns ``BLOCK_SIZE`` consecutive elements; the last program masks off
the elements past the end.  The op is memory-bound (3 streams of bytes, one add
per element), so the target is the copy bandwidth of the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import device_guard
from ..validation import check_same_shape, check_tensor
from . import library

__all__ = ["DEFAULT_CONFIG", "VectorAddFunction", "add_kernel", "compile_jobs", "vector_add"]

# Picked from lesson 07's launch sweep (the record lesson07_launch): 16-byte loads per
# thread and enough bytes in flight per SM to cover HBM latency.
DEFAULT_CONFIG = triton.Config({"BLOCK_SIZE": 4096}, num_warps=8)

_INT32_LIMIT = 2**31


@triton.jit
def add_kernel(
    x_ptr,  # pointer to the first element of x
    y_ptr,  # pointer to the first element of y
    out_ptr,  # pointer to the first element of the output
    n_elements,  # how many elements in all
    BLOCK_SIZE: tl.constexpr,  # elements per program; a power of two
    INT64_OFFSETS: tl.constexpr,  # True when offsets may pass 2**31 - 1
):
    pid = tl.program_id(axis=0)
    if INT64_OFFSETS:
        pid = pid.to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


_tuned_add_kernel = triton.autotune(configs=[DEFAULT_CONFIG], key=[])(add_kernel)


def launch_add(
    x: torch.Tensor,
    y: torch.Tensor,
    out: torch.Tensor,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Launch :func:`add_kernel` on contiguous, checked tensors; pick a config or use the tuned one."""
    n = out.numel()
    if n == 0:
        return out
    int64 = n + max(block_size or 0, DEFAULT_CONFIG.kwargs["BLOCK_SIZE"]) >= _INT32_LIMIT
    if block_size is None and num_warps is None:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
        with device_guard(out):
            _tuned_add_kernel[grid](x, y, out, n, INT64_OFFSETS=int64)
        return out
    block_size, num_warps = _config(block_size, num_warps)
    grid = (triton.cdiv(n, block_size),)
    with device_guard(out):
        add_kernel[grid](
            x, y, out, n, BLOCK_SIZE=block_size, INT64_OFFSETS=int64, num_warps=num_warps
        )
    return out


def _config(block_size: int | None, num_warps: int | None) -> tuple[int, int]:
    """``(BLOCK_SIZE, num_warps)``: the given ones, checked, or the tuned defaults."""
    block_size = block_size or DEFAULT_CONFIG.kwargs["BLOCK_SIZE"]
    num_warps = num_warps or DEFAULT_CONFIG.num_warps
    if block_size <= 0 or block_size & (block_size - 1):
        raise ValueError(f"vector_add: block_size must be a power of two, got {block_size}")
    if num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"vector_add: num_warps must be a power of two up to 32, got {num_warps}")
    return block_size, num_warps


class VectorAddFunction(torch.autograd.Function):
    """d(x + y)/dx = d(x + y)/dy = 1: the gradient passes through to both inputs."""

    @staticmethod
    def forward(ctx, x, y, block_size, num_warps):
        if _compiling():  # the operator, which torch.compile puts in its graph
            return vector_add_op(x, y, block_size, num_warps)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        return launch_add(x, y, out, block_size=block_size, num_warps=num_warps)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad, None, None


# --------------------------------------------------------------------------- torch.library


def _op_forward(
    x: torch.Tensor, y: torch.Tensor, block_size: int | None, num_warps: int | None
) -> torch.Tensor:
    """``x + y`` for contiguous tensors of one shape, dtype and device."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    n = out.numel()
    if n == 0:
        return out
    block, warps = _config(block_size, num_warps)
    int64 = bool(n + max(block, DEFAULT_CONFIG.kwargs["BLOCK_SIZE"]) >= _INT32_LIMIT)
    library.launch(
        add_kernel, (triton.cdiv(n, block),),
        x, y, out, n, BLOCK_SIZE=block, INT64_OFFSETS=int64, num_warps=warps,
    )  # fmt: skip
    return out


# The operator carries no gradient of its own: VectorAddFunction is the one autograd path.
vector_add_op = library.define("vector_add", _op_forward, kernels=(add_kernel,))


def _compiled(x, y, out, block_size, num_warps) -> torch.Tensor:
    """:func:`vector_add` inside torch.compile: the checks, then the operator."""
    _check_args(x, y)
    if block_size is not None or num_warps is not None:
        _config(block_size, num_warps)  # bad settings fail here, not in the kernel
    if out is not None:
        _check_out(x, y, out)
    x, y = x.contiguous(), y.contiguous()
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):
        return VectorAddFunction.apply(x, y, block_size, num_warps)
    z = vector_add_op(x, y, block_size, num_warps)
    return z if out is None else out.copy_(z)


def _check_args(x: object, y: object) -> None:
    check_tensor(x, "x", "vector_add")
    check_tensor(y, "y", "vector_add")
    check_same_shape(x, y, ("x", "y"), "vector_add")


def _check_out(x: torch.Tensor, y: torch.Tensor, out: object) -> None:
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):
        raise RuntimeError("vector_add: out= cannot be used when an input requires grad")
    check_tensor(out, "out", "vector_add")
    check_same_shape(x, out, ("x", "out"), "vector_add")
    if not out.is_contiguous():
        raise ValueError("vector_add: out must be contiguous")


_compiling = torch.compiler.is_compiling


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """:func:`add_kernel` with its default configuration, as a job of
    :func:`tilebook.course.aot.compile_many` for ``sm_<arch>`` (see :mod:`tilebook.ops.targets`)."""
    from . import targets

    x = targets.meta_tensor(1 << 24, dtype=dtype or targets.default_dtype(arch))
    return targets.recorded(lambda: _op_forward(x, x, None, None), arch, "2^24")


def vector_add(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    block_size: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Return ``x + y`` computed by a Triton kernel.

    Parameters
    ----------
    x, y
        Tensors of the same shape and dtype (float16, bfloat16 or float32) on
        tilebook's device (CUDA in GPU mode, CPU under the interpreter).  Any
        strides are accepted; non-contiguous inputs are first copied to a
        contiguous layout.  No broadcasting.
    out
        Optional contiguous output tensor of the same shape, dtype and device.
    block_size, num_warps
        Override the tuned launch configuration (lesson 07 sweeps these).

    Notes
    -----
    Differentiable: gradients flow to ``x`` and ``y`` (not through ``out=``, which,
    as in PyTorch, cannot be used when an input requires grad).  Inside
    ``torch.compile`` the call is the operator ``torch.ops.tilebook.vector_add``.

    Examples
    --------
    >>> z = tilebook.vector_add(x, y)   # doctest: +SKIP
    """
    if _compiling():
        return _compiled(x, y, out, block_size, num_warps)
    _check_args(x, y)
    x = x.contiguous()
    y = y.contiguous()
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):
        if out is not None:
            raise RuntimeError("vector_add: out= cannot be used when an input requires grad")
        return VectorAddFunction.apply(x, y, block_size, num_warps)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        check_tensor(out, "out", "vector_add")
        check_same_shape(x, out, ("x", "out"), "vector_add")
        if not out.is_contiguous():
            raise ValueError("vector_add: out must be contiguous")
    return launch_add(x, y, out, block_size=block_size, num_warps=num_warps)
