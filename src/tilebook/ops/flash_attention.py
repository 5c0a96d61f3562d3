"""Flash attention, forward and backward: ``softmax(q @ k^T * scale + mask) @ v`` in tiles,
with autograd and its ``torch.library`` operators.

The parts, each in its module:

* :mod:`tilebook.ops.attention_masks`: which keys each query sees (causal bottom-right,
  windows, documents) and which tiles a program visits;
* :mod:`tilebook.ops.attention_fwd`: the Triton forward, the online softmax in base 2,
  saving each row's log-sum-exp; on Hopper (sm_90) the forward without documents is
  :mod:`tilebook.ops.attention_hopper`'s Gluon kernel (FlashAttention-3's schedule);
* :mod:`tilebook.ops.attention_bwd`: the backward's three kernels (``rowsum(dO * O)``,
  dK/dV per key tile, dQ per query tile), which recompute the probabilities;
* :mod:`tilebook.ops.attention_configs`: the tiles, tuned ahead and committed;
* :mod:`tilebook.ops.attention_launch`: the plans of a call's launches and the
  launchers.

Here: the checks, the autograd function, the operators ``torch.compile`` traces,
:func:`flash_attention` itself, and the kernels' compile jobs.  A query that sees no
key gets an output of 0 and zero gradients.  That is some 550 lines, past the 500 the
op modules aim at: the checks of every argument (masks, windows, documents, GQA) take
about 70, the operators with their fake (shape-only) versions 80, and the public
function's docstring, which documents them all, 60.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from .. import runtime
from .._launch import PLANS, call_key, plain
from ..validation import check_same_dtype_device, check_tensor
from . import attention_bwd, attention_fwd, library
from .attention_bwd import (  # noqa: F401  (lesson 12's test)
    PREPROCESS_BLOCK,
    _bwd_dkdv_kernel,
    _bwd_dq_kernel,
    _bwd_preprocess_kernel,
)
from .attention_configs import CONFIGS, HEAD_DIMS, KernelConfig, configs_for, pick_configs
from .attention_fwd import _fwd_kernel  # noqa: F401  (the kernel lesson 12 compiles, here)
from .attention_launch import (
    FwdPlan,
    attention_backward,
    attention_forward,
    backward_of,
    forward,
    launch_dkdv,
    launch_dq,
    launch_preprocess,
    ready,
    tma_ready,
)
from .attention_masks import Mask, document_ranges, mask_for
from .precision import autocasting, lower

__all__ = [
    "CONFIGS",
    "HEAD_DIMS",
    "FlashAttentionFunction",
    "KernelConfig",
    "attention_backward",
    "attention_forward",
    "compile_ahead",
    "compile_jobs",
    "document_ranges",
    "flash_attention",
    "launch_dkdv",
    "launch_dq",
    "launch_preprocess",
    "pick_configs",
]

# Former names, where the benchmarks reach them.
_Mask, _mask_for = Mask, mask_for
_GPU_DTYPES = (torch.float16, torch.bfloat16)
# float32 runs under the interpreter only: on a GPU it would need TF32 dots and
# twice the shared memory of the tuned tiles.
_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


# --------------------------------------------------------------------------- autograd


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd for :func:`flash_attention`; the inputs arrive checked.

    ``plan`` is the call's :class:`~tilebook.ops.attention_launch.FwdPlan` (q, k and v
    arrive as it reads them), plumbing that gets no gradient.  Inside ``torch.compile``
    it is the mask's ``(left, right, band)`` and the forward and backward call the
    opaque operators below, which Dynamo puts in the graph.
    """

    @staticmethod
    def forward(ctx, q, k, v, document_ids, scale, plan):
        """``o`` (B, H, Nq, D); keeps q, k, v, o, the row statistics and the plan."""
        if _compiling():
            o, lse = flash_attention_op(q, k, v, document_ids, scale, *plan)
        else:
            o, lse = forward(plan, q, k, v, document_ids, scale)
        ctx.save_for_backward(q, k, v, o, lse, document_ids)
        ctx.plan, ctx.scale = plan, scale
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        """``(dq, dk, dv)``: dK and dV summed over the query heads of a group."""
        q, k, v, o, lse, document_ids = ctx.saved_tensors
        if _compiling():
            grads = flash_attention_backward_op(do, q, k, v, o, lse, document_ids, ctx.scale,
                                                *ctx.plan)  # fmt: skip
        else:
            grads = backward_of(ctx.plan, do, q, k, v, o, lse, document_ids, ctx.scale)
        return (*grads, None, None, None)


# --------------------------------------------------------------------------- checks

_OP = "flash_attention"


def _check_int_or_none(value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{_OP}: {what} must be an int or None, got {type(value).__name__}")


def _check_args(q, k, v, causal, sm_scale, window, document_ids) -> None:
    """Every check of flash_attention's arguments; raises TypeError or ValueError."""
    dtypes = _GPU_DTYPES if runtime.is_gpu() else _CPU_DTYPES
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, _OP, dtypes=dtypes, ndim=4)
    check_same_dtype_device(q, k, ("q", "k"), _OP)
    check_same_dtype_device(q, v, ("q", "v"), _OP)
    B, H, _, D = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"{_OP}: k and v must have the same shape (B, Hkv, Nk, D), got {tuple(k.shape)} "
            f"and {tuple(v.shape)}"
        )
    if k.shape[0] != B:
        raise ValueError(f"{_OP}: q has batch {B} but k and v have batch {k.shape[0]}")
    if k.shape[3] != D:
        raise ValueError(f"{_OP}: q has head dim {D} but k and v have head dim {k.shape[3]}")
    hkv = k.shape[1]
    if hkv == 0 or H % hkv:
        raise ValueError(
            f"{_OP}: the query heads ({H}) must be a multiple of the key/value heads ({hkv}) "
            "(grouped-query attention)"
        )
    if D not in HEAD_DIMS:
        raise ValueError(
            f"{_OP}: head dim {D} is not supported; supported: multiples of 8 up to "
            f"{HEAD_DIMS[-1]} (those other than {', '.join(map(str, HEAD_DIMS))} are "
            "zero-padded to the next of these)"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"{_OP}: causal must be a bool, got {type(causal).__name__}")
    if sm_scale is not None:
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
            raise TypeError(f"{_OP}: scale must be a float or None, got {type(sm_scale).__name__}")
        if not (math.isfinite(sm_scale) and sm_scale > 0):
            raise ValueError(f"{_OP}: scale must be a finite positive number, got {sm_scale}")
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError(f"{_OP}: window must be a (left, right) pair or None, got {window!r}")
        _check_int_or_none(window[0], "window's left bound")
        _check_int_or_none(window[1], "window's right bound")
    if document_ids is not None:
        check_tensor(document_ids, "document_ids", _OP, dtypes=_DOC_DTYPES, ndim=2)
        if document_ids.device != q.device:
            raise ValueError(
                f"{_OP}: document_ids is on {document_ids.device} but q is on {q.device}"
            )
        nq, nk = q.shape[2], k.shape[2]
        if nq != nk:
            raise ValueError(
                f"{_OP}: document_ids needs as many queries as keys, got Nq={nq} and Nk={nk}"
            )
        if tuple(document_ids.shape) != (B, nq):
            raise ValueError(
                f"{_OP}: document_ids must have shape (B, N) = ({B}, {nq}), got "
                f"{tuple(document_ids.shape)}"
            )


_DOC_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


# --------------------------------------------------------------------------- torch.library
# Every kernel here reads through host-side tensor descriptors, which PyTorch's
# tracer cannot record (tilebook.ops.library): inside torch.compile the forward and
# the backward are opaque operators around the eager launchers, which
# FlashAttentionFunction calls (no register_autograd: one autograd path).


def _op_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    document_ids: torch.Tensor | None,
    sm_scale: float,
    left: int,
    right: int,
    band: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` for checked inputs and the mask ``Mask(left, right, band)``."""
    B, H, Nq, D = q.shape
    if k.shape[2] == 0 or q.numel() == 0:
        o = torch.zeros((B, H, Nq, D), dtype=q.dtype, device=q.device)
        return o, torch.full((B, H, Nq), float("inf"), device=q.device)
    configs = pick_configs(D, q.dtype, band or document_ids is not None, q.device)
    doc = document_ids.contiguous() if document_ids is not None else None
    return attention_forward(
        ready(q), ready(k), ready(v), sm_scale=sm_scale, mask=Mask(left, right, band),
        document_ids=doc, config=configs["fwd"],
    )  # fmt: skip


def _op_forward_fake(q, k, v, document_ids, sm_scale, left, right, band):
    B, H, Nq, D = q.shape
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    return o, torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)


def _op_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    document_ids: torch.Tensor | None,
    sm_scale: float,
    left: int,
    right: int,
    band: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` from the forward operator's inputs and outputs."""
    if k.shape[2] == 0 or q.numel() == 0:
        return _op_backward_fake(do, q, k, v, o, lse, document_ids, sm_scale, left, right,
                                 band, zeros=True)  # fmt: skip
    configs = pick_configs(q.shape[3], q.dtype, band or document_ids is not None, q.device)
    doc = document_ids.contiguous() if document_ids is not None else None
    return attention_backward(
        do, ready(q), ready(k), ready(v), o, lse, sm_scale=sm_scale,
        mask=Mask(left, right, band), document_ids=doc, configs=configs,
    )  # fmt: skip


def _op_backward_fake(do, q, k, v, o, lse, document_ids, sm_scale, left, right, band, *,
                      zeros=False):  # fmt: skip
    new = torch.zeros if zeros else torch.empty
    return tuple(new(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


flash_attention_op = library.define_opaque("flash_attention", _op_forward, fake=_op_forward_fake)
flash_attention_backward_op = library.define_opaque(
    "flash_attention_backward", _op_backward, fake=_op_backward_fake
)


def _compiled(q, k, v, causal, sm_scale, window, document_ids) -> torch.Tensor:
    """:func:`flash_attention` inside torch.compile: the checks, then the autograd
    Function, whose forward and backward call the operators."""
    _check_args(q, k, v, causal, sm_scale, window, document_ids)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[3])
    mask = mask_for(causal, window, q.shape[2], k.shape[2])
    return FlashAttentionFunction.apply(q, k, v, document_ids, scale,
                                        (mask.left, mask.right, mask.band))  # fmt: skip


_WARNED_SM_SCALE = False


def _renamed_scale(scale: float | None, deprecated: dict[str, Any]) -> float | None:
    """``scale`` given as the former keyword ``sm_scale=`` (a FutureWarning, once)."""
    global _WARNED_SM_SCALE
    unknown = sorted(set(deprecated) - {"sm_scale"})
    if unknown:
        raise TypeError(f"{_OP}() got an unexpected keyword argument {unknown[0]!r}")
    if scale is not None:
        raise TypeError(f"{_OP}: give scale= (or the former sm_scale=), not both")
    if not _WARNED_SM_SCALE:
        _WARNED_SM_SCALE = True
        warnings.warn(
            f"{_OP}: sm_scale= is now scale= (as in scaled_dot_product_attention); "
            "sm_scale= will be removed in the next release",
            FutureWarning,
            stacklevel=3,
        )
    return deprecated["sm_scale"]


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    document_ids: torch.Tensor | None = None,
    **deprecated: Any,
) -> torch.Tensor:
    """Scaled dot-product attention by Triton kernels, with autograd.

    ``softmax(q @ k^T * scale + mask) @ v`` without materialising the scores.

    Parameters
    ----------
    q
        ``(B, H, Nq, D)`` queries; float16 or bfloat16 on a GPU (float32 too under the
        interpreter).  ``D`` is a multiple of 8 up to 256, as FlashAttention takes;
        the kernels have tiles for 32, 64, 128 and 256, and another ``D`` (80, 96,
        ...) runs padded with zeros to the next of these: exact, at that size's cost.
    k, v
        ``(B, Hkv, Nk, D)`` keys and values of q's dtype and device, with ``H`` a
        multiple of ``Hkv``: grouped-query (and, with ``Hkv = 1``, multi-query)
        attention.  Query head ``h`` uses key/value head ``h // (H // Hkv)``.  Any
        ``Nq`` and ``Nk``, equal or not.
    causal
        Query ``i`` sees key ``j`` when ``j <= i + Nk - Nq`` (bottom-right aligned, as
        in FlashAttention; the usual causal mask when ``Nq == Nk``).
    scale
        The scale of the scores, a positive number; ``1 / sqrt(D)`` by default (as
        in :func:`torch.nn.functional.scaled_dot_product_attention`).  The former
        name ``sm_scale=`` still works for one release, with a ``FutureWarning``.
    window
        ``(left, right)``: query ``i`` sees keys ``j`` with
        ``i' - left <= j <= i' + right``, where ``i' = i + Nk - Nq``; either bound may
        be None (unbounded).  Combines with ``causal``.
    document_ids
        ``(B, N)`` integer tensor (``Nq == Nk == N``): a query sees only keys of its
        own document (packed sequences).  Combines with ``causal`` and ``window``.
        Sorted ids (each document contiguous) let whole tiles be skipped; other ids
        are masked element by element over the whole sequence.

    Returns
    -------
    torch.Tensor
        ``(B, H, Nq, D)`` in q's dtype (a new contiguous tensor).  A query that sees
        no key gets 0, and zero gradients.

    Notes
    -----
    Under ``torch.autocast``, ``q``, ``k`` and ``v`` are cast to the autocast dtype
    first, as ``scaled_dot_product_attention``'s are.
    Tiles whose keys are all masked are skipped, so the time falls with the visible
    area.  Inputs are read in place when their last dimension is contiguous and
    their other strides and start are 16-byte aligned (any layout of B, H and N,
    such as ``(B, N, H, D).transpose(1, 2)``); other inputs are copied first.
    Gradients flow to q, k and v; for grouped heads, dK and dV sum over the query
    heads sharing a key/value head.

    Inside ``torch.compile`` the call is the operator
    ``torch.ops.tilebook.flash_attention`` (opaque: see :mod:`tilebook.ops.library`).

    Examples
    --------
    >>> o = tilebook.flash_attention(q, k, v, causal=True)   # doctest: +SKIP
    """
    sm_scale = scale if not deprecated else _renamed_scale(scale, deprecated)
    if autocasting(q):
        q, k, v = lower(q, k, v)  # as scaled_dot_product_attention under autocast
    if isinstance(q, torch.Tensor) and q.ndim == 4 and q.shape[3] not in HEAD_DIMS:
        padded = _padded_head_dim(q, k, v, causal, sm_scale, window, document_ids)
        if padded is not None:
            return padded
    if _compiling():
        return _compiled(q, k, v, causal, sm_scale, window, document_ids)
    key = None
    if (
        (causal is True or causal is False)
        and (sm_scale is None or (type(sm_scale) is float and 0.0 < sm_scale < math.inf))
        and plain(q)
        and plain(k)
        and plain(v)
    ):
        # A repeat call: its key fixes everything the checks and the plan looked at but
        # the scale (a runtime argument of the kernels).
        if window is None and document_ids is None:
            key = call_key(q, k, v, FwdPlan, causal)
        else:
            key = _masked_key(q, k, v, causal, window, document_ids)
        plan = PLANS.get(key)
        if plan is not None:
            scale = plan.scale if sm_scale is None else sm_scale
            if not plan.direct:
                q, k, v = ready(q), ready(k), ready(v)
            if document_ids is not None:
                document_ids = document_ids.contiguous()
            if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return FlashAttentionFunction.apply(q, k, v, document_ids, scale, plan)
            return forward(plan, q, k, v, document_ids, scale)[0]
    _check_args(q, k, v, causal, sm_scale, window, document_ids)
    D = q.shape[3]
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(D)
    mask = mask_for(causal, window, q.shape[2], k.shape[2])
    configs = pick_configs(D, q.dtype, mask.band or document_ids is not None, q.device)
    doc = document_ids.contiguous() if document_ids is not None else None
    direct = tma_ready(q) and tma_ready(k) and tma_ready(v)
    if not direct:  # copied first, and so on every call of this key
        q, k, v = ready(q), ready(k), ready(v)
    plan = FwdPlan(q, k, v, mask, configs, doc is not None)
    plan.direct = direct
    if key is not None:
        PLANS.remember(key, plan)
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttentionFunction.apply(q, k, v, doc, scale, plan)
    # Nothing for autograd to record: no Function (and its host time) around it.
    return forward(plan, q, k, v, doc, scale)[0]


def _padded_head_dim(q, k, v, causal, sm_scale, window, document_ids) -> torch.Tensor | None:
    """Attention for a head dimension the kernels have no tiles for (a multiple of 8 up
    to 256, such as 80 or 96): q, k and v padded with zeros to the next of
    :data:`HEAD_DIMS`, the output cut back.  Zero columns add nothing to ``q @ k^T``
    and give zero output columns, so the result is exact; the cost is the padded
    dimension's work and the copies.  None where the shapes are not of that kind (the
    checks then name what is taken)."""
    D = q.shape[3]
    if not (
        D % 8 == 0
        and 0 < D < HEAD_DIMS[-1]
        and isinstance(k, torch.Tensor)
        and isinstance(v, torch.Tensor)
        and k.ndim == v.ndim == 4
        and k.shape[3] == v.shape[3] == D
    ):
        return None
    width = next(d for d in HEAD_DIMS if d > D)
    pad = (0, width - D)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
    out = flash_attention(q, k, v, causal=causal, scale=scale, window=window,
                          document_ids=document_ids)  # fmt: skip
    return out[..., :D].contiguous()


def _masked_key(q, k, v, causal: bool, window, document_ids) -> tuple | None:
    """The call key of a call with a window or documents, or None where they cannot be
    keyed as they are (a window that is not a pair of ints or None, a tensor subclass)."""
    if window is not None and not (
        type(window) is tuple
        and len(window) == 2
        and all(w is None or type(w) is int for w in window)
    ):
        return None
    docs = None
    if document_ids is not None:
        if not plain(document_ids):
            return None
        d = document_ids
        docs = (d.shape, d.stride(), d.dtype, d.device, d.data_ptr() & 15)
    return call_key(q, k, v, FwdPlan, causal, window, docs)


def compile_ahead(
    kernel: str,
    config: KernelConfig,
    head_dim: int = 128,
    dtype: str = "bf16",
    *,
    band: bool = False,
    documents: bool = False,
    arch: int = 90,
):
    """Compile ``"fwd"``, ``"dkdv"`` or ``"dq"`` for ``sm_<arch>`` without a GPU, as a launch
    with ``config`` would; returns a :class:`tilebook.course.aot.CompiledKernel` (SASS,
    registers, spills).  ``dtype`` is Triton's name ("bf16", "fp16")."""
    from ..course.aot import compile_kernel

    job = _ahead_job(kernel, config, head_dim, dtype, band, documents, arch)
    # kernel, signature and constexprs by position, as compile_kernel's callers pass them
    return compile_kernel(job.pop("kernel"), job.pop("signature"), job.pop("constexprs"), **job)


def _ahead_job(kernel, config, head_dim, dtype, band, documents, arch) -> dict:
    """:func:`compile_ahead`'s compile job (for :func:`tilebook.course.aot.compile_many`)."""
    bm, bn = config.block_m, config.block_n

    def desc(rows):
        return f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}]>"

    ints = ("Nq", "Nk", "left", "right")
    common = {"lse_ptr": "*fp32", "doc_ptr": "*i64", "rng_ptr": "*i32"}
    consts = {"HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn, "BAND": band, "DOC": documents}
    if kernel == "fwd":
        sig = {"q_desc": desc(bm), "k_desc": desc(bn), "v_desc": desc(bn), "o_desc": desc(bm),
               **common, "qk_scale": "fp32", "H": "i32", "G": "i32",
               **dict.fromkeys(ints, "i32"), "num_m": "i32"}  # fmt: skip
        name = "_fwd_kernel"
    elif kernel == "dkdv":
        sig = {"q_desc": desc(bm), "k_desc": desc(bn), "v_desc": desc(bn), "do_desc": desc(bm),
               "dk_desc": desc(bn), "dv_desc": desc(bn), "lse_ptr": "*fp32",
               "delta_ptr": "*fp32", "doc_ptr": "*i64", "rng_ptr": "*i32",
               "sm_scale": "fp32", "qk_scale": "fp32", "Hkv": "i32", "G": "i32",
               **dict.fromkeys(ints, "i32"), "num_n": "i32"}  # fmt: skip
        name = "_bwd_dkdv_kernel"
    elif kernel == "dq":
        sig = {"q_desc": desc(bm), "k_desc": desc(bn), "v_desc": desc(bn), "do_desc": desc(bm),
               "dq_desc": desc(bm), "lse_ptr": "*fp32", "delta_ptr": "*fp32",
               "doc_ptr": "*i64", "rng_ptr": "*i32", "sm_scale": "fp32", "qk_scale": "fp32",
               "H": "i32", "G": "i32", **dict.fromkeys(ints, "i32"), "num_m": "i32"}  # fmt: skip
        name = "_bwd_dq_kernel"
    else:
        raise ValueError(f"compile_ahead: kernel must be 'fwd', 'dkdv' or 'dq', got {kernel!r}")
    return {
        "kernel": f"{(attention_fwd if kernel == 'fwd' else attention_bwd).__name__}:{name}",
        "signature": sig,
        "constexprs": consts,
        "arch": arch,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The four kernels as jobs of :func:`tilebook.course.aot.compile_many` for ``sm_<arch>``,
    in the configurations :func:`pick_configs` takes there for a causal mask: head
    dim 128, and 64 below sm_80 (a T4's 64 KB of shared memory hold the D=128 tiles
    only after :func:`attention_forward` drops pipeline stages, which it does when
    the launch runs out of resources)."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    head_dim = 128 if arch >= 80 else 64
    configs = configs_for(arch, head_dim, targets.dtype_name(dt), True)
    where = f"D={head_dim} causal"
    jobs = {
        f"{name} {where}": _ahead_job(
            kind, configs[kind], head_dim, targets.dtype_name(dt), True, False, arch
        )
        for kind, name in (("fwd", "_fwd_kernel"), ("dkdv", "_bwd_dkdv_kernel"),
                           ("dq", "_bwd_dq_kernel"))
    }  # fmt: skip
    o = targets.meta_tensor(1, 16, 4096, head_dim, dtype=dt)
    delta = targets.meta_tensor(1, 16, 4096)
    args = (o, o, delta, 16, 4096, *o.stride()[:3], *o.stride()[:3])
    meta = {"HEAD_DIM": head_dim, "BLOCK_M": PREPROCESS_BLOCK}
    jobs[f"_bwd_preprocess_kernel D={head_dim}"] = targets.launch_job(
        _bwd_preprocess_kernel, args, meta, arch
    )
    return jobs
