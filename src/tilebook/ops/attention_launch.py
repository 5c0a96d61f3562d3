"""Launching flash attention: the plans of its calls, and its launchers.

A call's launches are fixed by what its call key holds (shapes, strides, dtypes,
devices, alignment, the mask): which forward (the Triton kernel of
:mod:`tilebook.ops.attention_fwd`, or on Hopper the Gluon one of
:mod:`tilebook.ops.attention_hopper`), its grid and constexprs, the tensor
descriptors' shapes, strides and blocks, and the kernels' integer arguments.
:class:`FwdPlan` holds them, and the :class:`BwdPlan` of its first backward;
:func:`tilebook.ops.flash_attention.flash_attention` keeps plans in
:data:`tilebook._launch.PLANS`, as every op does, so a repeat call only allocates its
outputs, builds the descriptors and starts the kernels again
(:class:`tilebook._launch.Step`).  The launchers below (:func:`attention_forward`,
:func:`attention_backward` and one per backward kernel) plan afresh on every call.

Tiles move through tensor descriptors (TMA on Hopper): any strides whose rows are
16-byte aligned are read in place (:func:`tma_ready`); other inputs are copied first.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types

import torch
import triton
from triton.runtime.errors import OutOfResources

from .._launch import Step, ensure_cuda_context, plain_grad
from .attention_bwd import (
    PREPROCESS_BLOCK,
    _bwd_dkdv_kernel,
    _bwd_dq_kernel,
    _bwd_preprocess_kernel,
)
from .attention_configs import KernelConfig
from .attention_fwd import LOG2E, _fwd_kernel
from .attention_masks import Mask, document_ranges

try:  # host-side tensor descriptors arrived in Triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

__all__ = [
    "BwdPlan",
    "FwdPlan",
    "attention_backward",
    "attention_forward",
    "backward",
    "backward_of",
    "descriptor",
    "forward",
    "launch_dkdv",
    "launch_dq",
    "launch_preprocess",
    "layout",
    "ready",
    "tma_ready",
    "views",
]


def _lazy_module(name: str) -> types.ModuleType:
    """``name``, executed on its first attribute access (importlib's LazyLoader)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)  # as an import would
    return module


# The Gluon forward imports triton.experimental.gluon, about 0.1 s that every
# ``import tilebook`` paid: it is loaded by the first call that asks whether it applies.
attention_hopper = _lazy_module(f"{__package__}.attention_hopper")

# --------------------------------------------------------------------------- descriptors


def layout(shape, strides, rows: int) -> tuple[list, list, list]:
    """A descriptor's shape, strides and block for a 4-D tensor of this shape and
    strides (batch, heads, rows, D) read in tiles of ``rows`` rows."""
    shape, strides = list(shape), list(strides)
    # A dimension of size 1 is never stepped along: give it a stride TMA accepts.
    for i in (2, 1, 0):
        if shape[i] == 1:
            strides[i] = strides[i + 1] * shape[i + 1]
    return shape, strides, [1, 1, rows, shape[3]]


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A descriptor of the 4-D ``t`` giving ``rows x D`` tiles."""
    return TensorDescriptor(t, *layout(t.shape, t.stride(), rows))


def views(shapes_strides) -> tuple:
    """``(shape, strides)`` of each 4-D tensor as a descriptor takes them (see
    :func:`layout`): what the Gluon forward's ``layouts`` are."""
    return tuple(layout(shape, strides, 1)[:2] for shape, strides in shapes_strides)


def tma_ready(t: torch.Tensor) -> bool:
    """Whether a tensor descriptor can read ``t`` in place: unit stride along D, the
    other strides (of dimensions longer than 1) positive multiples of 16 bytes, and a
    16-byte aligned start."""
    if t.data_ptr() % 16 or t.stride(3) != 1:
        return False
    step = 16 // t.element_size()
    return all(
        size == 1 or (s > 0 and s % step == 0)
        for size, s in zip(t.shape[:3], t.stride()[:3], strict=False)
    )


def ready(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy of it where a descriptor cannot read it in place."""
    return t if tma_ready(t) else t.clone(memory_format=torch.contiguous_format)


def _dense(shape) -> tuple:
    """The strides of a contiguous tensor of the 4-D ``shape``."""
    _, h, n, d = shape
    return (h * n * d, n * d, d, 1)


class _Tiled(Step):
    """A plan's launch of a tiled kernel.  Where its tiles' pipeline does not fit in the
    GPU's shared memory (a smaller GPU, or the document mask's extra buffers), the
    launch drops a stage and tries again, and the step keeps the depth that fitted."""

    __slots__ = ()

    def anew(self, *args) -> bool:
        while True:
            try:
                return super().anew(*args)
            except OutOfResources:
                stages = self.meta["num_stages"]
                if stages <= 1:
                    raise
                self.meta = {**self.meta, "num_stages": stages - 1}


def _tiled(kernel, grid: tuple, config: KernelConfig, D: int, mask: Mask, documents: bool):
    meta = {"HEAD_DIM": D, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
            "BAND": mask.band, "DOC": documents, "num_warps": config.num_warps,
            "num_stages": config.num_stages}  # fmt: skip
    return _Tiled(kernel, grid, meta)


def _start(step: Step, fast: bool, args: tuple) -> None:
    """Start ``step``'s kept kernel; or launch it through :func:`tilebook._launch.launch`
    (on the GPU of its first tensor argument) where it has none yet or ``fast`` is False
    (a fresh output off the plan's 16-byte alignment)."""
    if not (fast and step(*args)):
        step.anew(*args)


# --------------------------------------------------------------------------- forward


class FwdPlan:
    """What a forward launches, for q, k and v laid out as the kernels read them
    (:func:`ready`): its step (None: every query sees no key, nothing to launch), the
    descriptors' layouts and integer arguments; ``direct``: the caller's tensors are
    read in place; ``scale``: the default one; ``bwd``: the backward's plan, made by
    the first backward with a plain ``dO`` (:func:`backward_of`)."""

    __slots__ = ("bwd", "configs", "direct", "documents", "gluon", "ints", "layouts",
                 "lse_shape", "mask", "o_shape", "only_gluon", "scale", "step")  # fmt: skip

    def __init__(self, q, k, v, mask: Mask, configs: dict, documents: bool, gluon=None):
        B, H, Nq, D = q.shape
        self.o_shape, self.lse_shape = (B, H, Nq, D), (B, H, Nq)
        self.mask, self.configs, self.documents = mask, configs, documents
        self.scale, self.direct, self.bwd = 1.0 / math.sqrt(D), True, None
        self.step, self.gluon, self.only_gluon = None, False, bool(gluon)
        if k.shape[2] == 0 or q.numel() == 0:
            return
        if gluon is not False and attention_hopper.usable(q, k, documents):
            self.gluon = True
            self.layouts = views(((q.shape, q.stride()), (k.shape, k.stride()),
                                  (v.shape, v.stride()), (self.o_shape, _dense(q.shape))))  # fmt: skip
            self.step = Step(attention_hopper._fwd_kernel, attention_hopper.grid(q),
                             attention_hopper.meta(mask.band))  # fmt: skip
        else:
            self.triton(q, k, v)

    def triton(self, q, k, v) -> None:
        """Take the Triton forward with ``configs["fwd"]``'s tiles."""
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        config, mask = self.configs["fwd"], self.mask
        bm, bn = config.block_m, config.block_n
        num_m = triton.cdiv(Nq, bm)
        self.gluon = False
        self.layouts = (layout(q.shape, q.stride(), bm), layout(k.shape, k.stride(), bn),
                        layout(v.shape, v.stride(), bn), layout(q.shape, _dense(q.shape), bm))  # fmt: skip
        self.ints = (H, H // Hkv, Nq, Nk, mask.left, mask.right, num_m)
        self.step = _tiled(_fwd_kernel, (num_m * B * H,), config, D, mask, self.documents)


_empty, _f32, _inf = torch.empty, torch.float32, math.inf


def forward(plan: FwdPlan, q, k, v, doc, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of ``plan`` for ``q``, ``k``, ``v`` as the kernels read them and the
    contiguous ``doc`` (or None)."""
    dev = q.device
    step = plan.step
    if step is None:  # every query sees no key: output 0, log-sum-exp +inf
        o = torch.zeros(plan.o_shape, dtype=q.dtype, device=dev)
        return o, torch.full(plan.lse_shape, _inf, device=dev)
    o = _empty(plan.o_shape, dtype=q.dtype, device=dev)
    lse = _empty(plan.lse_shape, dtype=_f32, device=dev)
    fast = not (o.data_ptr() | lse.data_ptr()) & 15
    if dev.type == "cuda":
        ensure_cuda_context(dev)
    if plan.gluon:
        mask = plan.mask
        args = attention_hopper.arguments(q, k, v, o, lse, plan.layouts, scale, mask.left,
                                          mask.right)  # fmt: skip
        if (fast and step(*args)) or _gluon_anew(plan, q, k, v, o, lse, scale):
            return o, lse
        step = plan.step  # Gluon failed here: the plan took the Triton forward
    lq, lk, lv, lo = plan.layouts
    desc = TensorDescriptor
    rng = document_ranges(doc, plan.configs["fwd"].block_m) if doc is not None else lse
    args = (desc(q, *lq), desc(k, *lk), desc(v, *lv), desc(o, *lo), lse,
            lse if doc is None else doc, rng, scale * LOG2E, *plan.ints)  # fmt: skip
    _start(step, fast, args)
    return o, lse


def _gluon_anew(plan: FwdPlan, q, k, v, o, lse, scale: float) -> bool:
    """The Gluon forward launched through :func:`attention_hopper.forward`, which says
    once when Gluon fails on this Triton; then False, and the plan takes the Triton
    forward (asked for Gluon alone: the error)."""
    step, mask = plan.step, plan.mask
    try:
        attention_hopper.forward(lambda kernel, grid, *args, **meta: step.anew(*args), q, k, v,
                                 o, lse, plan.layouts, scale, mask.left, mask.right,
                                 mask.band)  # fmt: skip
    except RuntimeError:
        if plan.only_gluon:
            raise
        plan.triton(q, k, v)
        return False
    return True


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float,
    mask: Mask,
    document_ids: torch.Tensor | None,
    config: KernelConfig,
    gluon: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel on checked, descriptor-ready inputs.

    Returns ``O`` (B, H, Nq, D) in q's dtype and the base-2 log-sum-exp of the scaled
    scores (B, H, Nq) in float32 (``+inf`` for rows that see no key).

    ``gluon``: None takes the Gluon forward of :mod:`tilebook.ops.attention_hopper`
    where it applies (an sm_90 GPU, no documents, D of 64 or 128) and the Triton
    kernel with ``config`` elsewhere; False always the Triton kernel (``config``'s
    tiles are then what runs); True the Gluon forward, or :class:`ValueError` where
    it does not apply.
    """
    documents = document_ids is not None
    if gluon and not attention_hopper.usable(q, k, documents):
        raise ValueError(
            "the Gluon forward needs an sm_90 GPU, float16 or bfloat16, a head dimension "
            f"in {attention_hopper.HEAD_DIMS}, no document_ids and a Triton with Gluon"
        )
    plan = FwdPlan(q, k, v, mask, {"fwd": config}, documents, gluon)
    return forward(plan, q, k, v, document_ids, sm_scale)


# --------------------------------------------------------------------------- backward


def _dkdv(q, k, v, do, dk_strides, dv_strides, mask: Mask, config: KernelConfig,
          documents: bool) -> tuple:  # fmt: skip
    """The dK/dV kernel's step, descriptor layouts (q, k, v, do, dk, dv) and integers."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    bm, bn = config.block_m, config.block_n
    num_n = triton.cdiv(Nk, bn)
    layouts = (layout(q.shape, q.stride(), bm), layout(k.shape, k.stride(), bn),
               layout(v.shape, v.stride(), bn), layout(do.shape, do.stride(), bm),
               layout(k.shape, dk_strides, bn), layout(v.shape, dv_strides, bn))  # fmt: skip
    ints = (Hkv, H // Hkv, Nq, Nk, mask.left, mask.right, num_n)
    return _tiled(_bwd_dkdv_kernel, (num_n * B * Hkv,), config, D, mask, documents), layouts, ints


def _dq(q, k, v, do, dq_strides, mask: Mask, config: KernelConfig, documents: bool) -> tuple:
    """The dQ kernel's step, descriptor layouts (q, k, v, do, dq) and integers."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    bm, bn = config.block_m, config.block_n
    num_m = triton.cdiv(Nq, bm)
    layouts = (layout(q.shape, q.stride(), bm), layout(k.shape, k.stride(), bn),
               layout(v.shape, v.stride(), bn), layout(do.shape, do.stride(), bm),
               layout(q.shape, dq_strides, bm))  # fmt: skip
    ints = (H, H // Hkv, Nq, Nk, mask.left, mask.right, num_m)
    return _tiled(_bwd_dq_kernel, (num_m * B * H,), config, D, mask, documents), layouts, ints


def _preprocess(o, do) -> tuple:
    """The rowsum(dO * O) kernel's step and integers."""
    B, H, Nq, D = o.shape
    grid = (triton.cdiv(Nq, PREPROCESS_BLOCK), B * H)
    step = Step(_bwd_preprocess_kernel, grid, {"HEAD_DIM": D, "BLOCK_M": PREPROCESS_BLOCK})
    return step, (H, Nq, *o.stride()[:3], *do.stride()[:3])


class BwdPlan:
    """What a backward launches: the preprocess, dK/dV and dQ kernels' steps, each with
    its descriptors' layouts and integer arguments, for dO, q, k, v and o laid out as
    when it was made; ``documents``: whether document ids come."""

    __slots__ = ("dkdv", "documents", "dq", "pre")

    def __init__(self, q, k, v, o, do, mask: Mask, configs: dict, documents: bool):
        self.documents = documents
        self.pre = _preprocess(o, do)
        self.dkdv = _dkdv(q, k, v, do, _dense(k.shape), _dense(v.shape), mask, configs["dkdv"],
                          documents)  # fmt: skip
        self.dq = _dq(q, k, v, do, _dense(q.shape), mask, configs["dq"], documents)


def _run_pre(launch, fast: bool, o, do, delta) -> None:
    step, ints = launch
    _start(step, fast, (o, do, delta, *ints))


def _run_dkdv(launch, fast: bool, q, k, v, do, lse, delta, dk, dv, doc, scale) -> None:
    step, (a, b, c, d, e, f), ints = launch
    desc = TensorDescriptor
    rng = document_ranges(doc, step.meta["BLOCK_N"]) if doc is not None else lse
    args = (desc(q, *a), desc(k, *b), desc(v, *c), desc(do, *d), desc(dk, *e), desc(dv, *f),
            lse, delta, lse if doc is None else doc, rng, scale, scale * LOG2E, *ints)  # fmt: skip
    _start(step, fast, args)


def _run_dq(launch, fast: bool, q, k, v, do, lse, delta, dq, doc, scale) -> None:
    step, (a, b, c, d, e), ints = launch
    desc = TensorDescriptor
    rng = document_ranges(doc, step.meta["BLOCK_M"]) if doc is not None else lse
    args = (desc(q, *a), desc(k, *b), desc(v, *c), desc(do, *d), desc(dq, *e), lse, delta,
            lse if doc is None else doc, rng, scale, scale * LOG2E, *ints)  # fmt: skip
    _start(step, fast, args)


def backward(plan: BwdPlan, do, q, k, v, o, lse, doc, scale: float) -> tuple:
    """``(dq, dk, dv)`` of ``plan`` (laid out as these tensors are) from the forward's
    ``o`` and ``lse``."""
    dev = q.device
    delta = _empty(lse.shape, dtype=_f32, device=dev)
    dq = _empty(q.shape, dtype=q.dtype, device=dev)
    dk = _empty(k.shape, dtype=k.dtype, device=dev)
    dv = _empty(v.shape, dtype=v.dtype, device=dev)
    # Fresh buffers are 16-byte aligned (the CUDA allocator rounds blocks to 512 bytes),
    # as the plan's first launches had them; should one not be, launch() keys it.
    fast = not (delta.data_ptr() | dq.data_ptr() | dk.data_ptr() | dv.data_ptr()) & 15
    if dev.type == "cuda":
        ensure_cuda_context(dev)
    _run_pre(plan.pre, fast, o, do, delta)
    _run_dkdv(plan.dkdv, fast, q, k, v, do, lse, delta, dk, dv, doc, scale)
    _run_dq(plan.dq, fast, q, k, v, do, lse, delta, dq, doc, scale)
    return dq, dk, dv


def backward_of(fwd: FwdPlan, do, q, k, v, o, lse, doc, scale: float) -> tuple:
    """``(dq, dk, dv)`` after a forward planned as ``fwd`` (``q``, ``k``, ``v`` as it
    read them, ``o`` and ``lse`` as it returned them).  A plain, contiguous, aligned
    ``dO`` takes the backward plan ``fwd`` keeps (made by the first one); another one is
    made readable and planned afresh."""
    if fwd.step is None:  # no key seen: zero gradients
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if plain_grad(do, q.dtype):
        plan = fwd.bwd
        if plan is None:
            plan = fwd.bwd = BwdPlan(q, k, v, o, do, fwd.mask, fwd.configs, fwd.documents)
    else:
        do = ready(do)
        plan = BwdPlan(q, k, v, o, do, fwd.mask, fwd.configs, fwd.documents)
    return backward(plan, do, q, k, v, o, lse, doc, scale)


def attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    *,
    sm_scale: float,
    mask: Mask,
    document_ids: torch.Tensor | None,
    configs: dict[str, KernelConfig],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` from the forward's ``o`` and ``lse``: the rowsum(dO*O)
    preprocess, then the dK/dV kernel and the dQ kernel."""
    do = ready(do)
    plan = BwdPlan(q, k, v, o, do, mask, configs, document_ids is not None)
    return backward(plan, do, q, k, v, o, lse, document_ids, sm_scale)


def launch_preprocess(o: torch.Tensor, do: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``delta[b, h, i] = sum_d dO * O`` into the float32 ``delta`` (B, H, Nq)."""
    _run_pre(_preprocess(o, do), False, o, do, delta)
    return delta


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, *, sm_scale, mask, document_ids, config):
    """dK and dV into ``dk`` and ``dv`` (B, Hkv, Nk, D), summed over grouped query heads."""
    if q.is_cuda:
        ensure_cuda_context(q.device)
    launch = _dkdv(q, k, v, do, dk.stride(), dv.stride(), mask, config, document_ids is not None)
    _run_dkdv(launch, False, q, k, v, do, lse, delta, dk, dv, document_ids, sm_scale)
    return dk, dv


def launch_dq(q, k, v, do, lse, delta, dq, *, sm_scale, mask, document_ids, config):
    """dQ into ``dq`` (B, H, Nq, D)."""
    if q.is_cuda:
        ensure_cuda_context(q.device)
    launch = _dq(q, k, v, do, dq.stride(), mask, config, document_ids is not None)
    _run_dq(launch, False, q, k, v, do, lse, delta, dq, document_ids, sm_scale)
    return dq
