"""The plans of :mod:`tilebook.ops.matmul`'s products: what one kind of call launches.

A product of a few thousand rows a side can take about as long on the GPU as a Python
call through the autotuner and Triton's JIT takes on the host (``benchmarks/host_overhead.py``
measures both).  So each kind of call is planned once (:class:`Product`, kept in
:data:`tilebook._launch.PLANS` under the call's key, :func:`tilebook._launch.call_key`):
the plan picks the kernel (the Hopper one of :mod:`tilebook.ops.matmul_hopper` where
the operands allow it, else the pointer one of :mod:`tilebook.ops.matmul_kernels`);
its first call autotunes (or finds the pick that Triton's autotuner keeps), the second
launches the pick through :func:`tilebook._launch.launch`, and later ones start the
compiled kernel directly.
"""

from __future__ import annotations

import torch

from .. import runtime
from .._launch import PLANS, Step, call_key, device_guard, ensure_cuda_context, plain
from . import matmul_hopper, matmul_kernels
from .matmul_hopper import STAGE_MIN_MACS, TMA_DTYPES, tma_layout, tma_supported

__all__ = ["Product", "f32_dot", "make_plan", "picked_configs", "planned"]

_OP = "fused_matmul"
_F32 = torch.float32
_tf32_allowed = torch._C._get_cublas_allow_tf32  # torch.backends.cuda.matmul.allow_tf32
_GPU = runtime.is_gpu()


def f32_dot(dtype: torch.dtype) -> str:
    """How the pointer kernel multiplies ``dtype`` operands on the tensor cores: float32
    as TF32 only where ``torch.backends.cuda.matmul.allow_tf32`` allows it, as
    ``torch.matmul`` does (off by default); else in full float32 ("ieee")."""
    return "ieee" if dtype is _F32 and not _tf32_allowed() else "tf32"


# --------------------------------------------------------------------------- plans


class Product:
    """The plan of one kind of product call, fixed by its call key: which kernel
    (``kind``: ``"tma"``, ``"pointer"``, None when the output is empty), its flags, the
    output's shape, which operands go through aligned copies (``stage``), and once the
    first call has autotuned, its :class:`~tilebook._launch.Step` and the builder of
    its runtime arguments.

    ``plan(a, b, bias)`` returns ``act(a @ b + bias)`` in a new tensor.  For a
    ``linear`` plan (:func:`tilebook.linear_act`) ``a`` is ``x`` (its rows as the
    product's A) and ``b`` the weight (the product's B transposed).
    """

    __slots__ = ("args", "dtype", "fast", "flags", "kind", "linear", "mnk", "shape", "stage",
                 "step")  # fmt: skip

    def __init__(self, kind, shape, mnk, dtype, flags, stage=None, linear=False):
        self.kind, self.shape, self.mnk, self.dtype = kind, shape, mnk, dtype
        self.flags, self.stage, self.linear = flags, stage, linear
        self.step = self.fast = self.args = None

    def __call__(self, a, b, bias):
        c = a.new_empty(self.shape)
        step = self.fast
        if step is None:  # the first call, a staged plan, or nothing to launch
            if self.kind is not None:
                self._slow(a, b, c, bias)
            return c
        if c.is_cuda:  # a thread's first CUDA work may be this launch (a backward's)
            ensure_cuda_context(c.device)
        args = self.args(a, b, c, bias)
        if c.data_ptr() & 15:
            step.anew(*args)  # not the specialisation the plan launched: launch() keys it
        else:
            step(*args) or step.anew(*args)
        return c

    def _slow(self, a, b, c, bias) -> None:
        if self.linear:  # the product's own 2-D operands
            a, b, c = a.reshape(-1, a.shape[-1]), b.t(), c.view(-1, c.shape[-1])
        if c.is_cuda:
            ensure_cuda_context(c.device)
        if self.stage is None:
            return self._launch(a, b, c, bias)
        copy_a, copy_b, pad_c = self.stage
        out = matmul_hopper.aligned_empty(c) if pad_c else c
        a = matmul_hopper.aligned_copy(a) if copy_a else a
        b = matmul_hopper.aligned_copy(b) if copy_b else b
        self._launch(a, b, out, bias)
        if pad_c:
            c.copy_(out)

    def _launch(self, a, b, c, bias) -> None:
        if self.step is None:  # autotune (Triton keeps the pick per autotuning key)
            tune = matmul_hopper.tune if self.kind == "tma" else matmul_kernels.tune
            with device_guard(c):
                kernel, grid, meta, self.args = tune(a, b, c, bias, self.flags)
            self.step = Step(kernel, grid, meta)
            if self.stage is None:
                self.fast = self.step
            return
        args = self.args(a, b, c, bias)
        self.step(*args) or self.step.anew(*args)


def make_plan(a, b, bias, activation: str, impl: str, op: str, shape, linear=False) -> Product:
    """The plan of a product of checked 2-D operands (``bias`` contiguous or None)."""
    M, K = a.shape
    N = b.shape[1]
    flags = {"HAS_BIAS": bias is not None, "ACTIVATION": activation}
    if M == 0 or N == 0:
        return Product(None, shape, (M, N, K), a.dtype, flags)
    want_tma = impl == "tma" or (impl == "auto" and _GPU)
    tma_ok = want_tma and K > 0 and a.dtype in TMA_DTYPES and tma_supported(a.device)
    if impl == "tma" and not tma_ok:
        raise ValueError(
            f"{op}: impl='tma' needs 16-bit operands (float16 or bfloat16) and K > 0, on a "
            "Hopper GPU or under the interpreter"
        )
    if tma_ok:
        a_t, b_t = tma_layout(a), tma_layout(b)
        c_ok = N * a.element_size() % 16 == 0  # rows of the fresh, contiguous output
        if a_t is not None and b_t is not None and c_ok:
            flags |= {"A_T": a_t, "B_T": b_t}
            return Product("tma", shape, (M, N, K), a.dtype, flags, None, linear)
        if impl == "tma" or M * N * K >= STAGE_MIN_MACS:
            stage = (a_t is None, b_t is None, not c_ok)
            flags |= {"A_T": bool(a_t), "B_T": bool(b_t)}  # a copy is row-major
            return Product("tma", shape, (M, N, K), a.dtype, flags, stage, linear)
    flags |= {"INT64": matmul_kernels.needs_int64(a, b, M, N), "F32_DOT": f32_dot(a.dtype)}
    return Product("pointer", shape, (M, N, K), a.dtype, flags, None, linear)


def planned(a, b, bias, activation: str, impl: str) -> torch.Tensor:
    """``act(a @ b + bias)`` for checked 2-D operands, with no autograd: the backward's
    products and the Hopper operator's body."""
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    if not (plain(a) and plain(b) and (bias is None or plain(bias))):
        return make_plan(a, b, bias, activation, impl, _OP, (a.shape[0], b.shape[1]))(a, b, bias)
    key = call_key(a, b, bias, make_plan, activation, impl, a.dtype is _F32 and _tf32_allowed())
    plan = PLANS.get(key)
    if plan is None:
        plan = make_plan(a, b, bias, activation, impl, _OP, (a.shape[0], b.shape[1]))
        PLANS.remember(key, plan)
    return plan(a, b, bias)


def picked_configs() -> list[dict]:
    """What the autotuner picked for each kind of call planned so far, one dict per pick.

    Keys: ``kernel`` (``"tma"`` or ``"pointer"``), ``M``, ``N``, ``K``, ``dtype``,
    ``activation``, ``has_bias``, ``config`` (``"128x256x64 w8 s3"``: tile, warps,
    stages) and ``kwargs`` (every constant and launch option of the pick).
    """
    out, seen = [], set()
    for plan in list(PLANS.values()):
        if type(plan) is not Product or plan.step is None:
            continue
        kw = plan.step.meta
        M, N, K = plan.mnk
        tile = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']}"
        config = f"{tile} w{kw['num_warps']} s{kw['num_stages']}"
        pick = {"kernel": plan.kind, "M": M, "N": N, "K": K,
                "dtype": str(plan.dtype).removeprefix("torch."), "activation": kw["ACTIVATION"],
                "has_bias": kw["HAS_BIAS"], "config": config, "kwargs": dict(kw)}  # fmt: skip
        mark = repr(sorted(pick.items()))
        if mark not in seen:
            seen.add(mark)
            out.append(pick)
    return out
