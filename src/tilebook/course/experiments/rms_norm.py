"""RMSNorm measurements, shared by lesson 11 and ``benchmarks/rms_norm.py``.

Two measurements, each checking what it times: every row carries the norm-wise
relative error of ``y``, ``dx`` and ``dweight`` against a float64 reference
computed from the same inputs, so that a fast wrong answer is seen as wrong.

* :func:`kernels` times *launchers* against each other at one hidden size:
  ``forward(x, w) -> (y, rstd)`` and ``backward(dy, x, w, rstd) -> (dx, dweight)``,
  as a forward pass, a backward pass or a whole training step.  Each row also
  carries what rounding the exact result to the input's dtype costs
  (``floor_y``, ``floor_dx``, ``floor_dw``): no kernel can do better than that.
* :func:`versus` times differentiable *ops* ``op(x, w) -> y`` (tilebook,
  PyTorch's ``F.rms_norm``, ``torch.compile``) over hidden sizes, the backward
  through ``torch.autograd.grad`` as training calls it.

By default every tensor of a sweep holds :data:`ELEMENTS` numbers, cut into rows
of the hidden size, so that only the row length changes from point to point.
Throughput counts the bytes that must move (:func:`traffic`), the same for every
implementation.  GPU only: call these from
:func:`tilebook.course.bench.record_or_measure`'s sweep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from ...ops import rms_norm as op
from .. import bench

__all__ = [
    "DTYPE",
    "ELEMENTS",
    "EPS",
    "inputs",
    "kernels",
    "naive",
    "ops",
    "reference",
    "rel_err",
    "rounding_err",
    "traffic",
    "versus",
]

EPS = 1e-6
DTYPE = torch.bfloat16
#: Numbers per tensor in a sweep: 128 MiB of bf16, far more than the L2 cache holds.
ELEMENTS = 2**26

Forward = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Backward = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def traffic(n_rows: int, n_cols: int, elem: int = 2) -> tuple[int, int]:
    """Bytes that must move, ``(forward, backward)``, for ``elem``-byte elements.

    Forward: read ``x`` and ``w``, write ``y``.  Backward: read ``x``, ``dy``, ``w``
    and the fp32 ``rstd``, write ``dx`` and ``dweight``.
    """
    fwd = 2 * n_rows * n_cols * elem + n_cols * elem
    bwd = 3 * n_rows * n_cols * elem + 4 * n_rows + 2 * n_cols * elem
    return fwd, bwd


def inputs(
    n_rows: int,
    n_cols: int,
    dtype: torch.dtype = DTYPE,
    *,
    device: torch.device | str = "cuda",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x``, ``w`` (near 1, as a trained scale is) and ``dy``, the same for a given seed."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n_rows, n_cols, device=device, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(n_cols, device=device, generator=gen)).to(dtype)
    dy = torch.randn(n_rows, n_cols, device=device, generator=gen).to(dtype)
    return x, w, dy


def reference(
    x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y``, ``dx`` and ``dweight`` in float64, by autograd through the formula."""
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    return y64.detach(), dx64, dw64


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||``, the measure
    :class:`tilebook.course.check.CorrectnessReport` uses."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def rounding_err(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The error of the exact result rounded once to ``dtype``: the best any kernel can do."""
    return rel_err(ref.to(dtype), ref)


def naive(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The textbook formula in fp32, cast back once: what ``torch.compile`` gets to fuse."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def ops(compiled: bool = True) -> dict[str, Op]:
    """tilebook's op, PyTorch's and the compiled :func:`naive`, all with ``eps`` = :data:`EPS`.

    ``torch.compile`` specialises on shapes (``dynamic=False``), as a model with fixed
    sizes would: one compiled graph per hidden size and per pass, each compiled on
    first use, which takes seconds.  ``compiled=False`` leaves it out.
    """
    found: dict[str, Op] = {
        "tilebook": lambda x, w: op.rms_norm(x, w, EPS),
        "F.rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
    }
    if compiled:
        found["torch.compile"] = torch.compile(naive, dynamic=False)
    return found


def _errors(y, dx, dw, ref) -> dict[str, float]:
    y64, dx64, dw64 = ref
    return {"err_y": rel_err(y, y64), "err_dx": rel_err(dx, dx64), "err_dw": rel_err(dw, dw64)}


def kernels(
    variants: Mapping[str, tuple[Forward, Backward]],
    n_cols: int,
    *,
    passes: Sequence[str] = ("forward", "backward"),
    elements: int = ELEMENTS,
    dtype: torch.dtype = DTYPE,
    device: torch.device | str = "cuda",
    **compare: Any,
) -> list[dict[str, Any]]:
    """Time pairs of launchers against each other, in interleaved rounds, at one width.

    ``variants`` maps a name to ``(forward, backward)``.  ``passes`` are any of
    ``"forward"``, ``"backward"`` (from the variant's own ``rstd``) and ``"step"``
    (forward then backward).  One row per pass and variant: ``hidden``, ``rows``,
    ``pass``, ``impl``, the timing (:func:`tilebook.course.bench.compare`, which
    ``compare`` keywords tune), the errors ``err_*`` and the rounding floors
    ``floor_*``.
    """
    unknown = sorted(set(passes) - {"forward", "backward", "step"})
    if unknown:
        raise ValueError(f"kernels(): unknown passes {unknown}")
    n_rows = elements // n_cols
    x, w, dy = inputs(n_rows, n_cols, dtype, device=device)
    ref = reference(x, w, dy)
    floors = {
        f"floor_{k}": rounding_err(r, dtype) for k, r in zip(("y", "dx", "dw"), ref, strict=True)
    }
    errors: dict[str, dict[str, float]] = {}
    fns: dict[str, dict[str, Callable[[], Any]]] = {p: {} for p in passes}
    for name, (fwd, bwd) in variants.items():
        y, rstd = fwd(x, w)
        errors[name] = _errors(y, *bwd(dy, x, w, rstd), ref)
        fns.get("forward", {})[name] = partial(fwd, x, w)
        fns.get("backward", {})[name] = partial(bwd, dy, x, w, rstd)
        fns.get("step", {})[name] = lambda f=fwd, b=bwd: b(dy, x, w, f(x, w)[1])
        del y
    fwd_bytes, bwd_bytes = traffic(n_rows, n_cols, x.element_size())
    nbytes = {"forward": fwd_bytes, "backward": bwd_bytes, "step": fwd_bytes + bwd_bytes}
    rows = []
    for p in passes:
        timed = bench.compare(
            fns[p], bytes_moved=nbytes[p], hidden=n_cols, rows=n_rows, **{"pass": p}, **compare
        )
        rows += [{**r, **errors[r["impl"]], **floors} for r in timed]
    return rows


def versus(
    ops: Mapping[str, Op],
    hidden: Sequence[int],
    *,
    passes: Sequence[str] = ("forward", "backward"),
    elements: int = ELEMENTS,
    n_rows: int | None = None,
    dtype: torch.dtype = DTYPE,
    device: torch.device | str = "cuda",
    **compare: Any,
) -> list[dict[str, Any]]:
    """Time differentiable ops against each other at each hidden size.

    ``ops`` maps a name to ``op(x, w) -> y``.  The forward is a call on tensors
    that need no gradient; the backward is ``torch.autograd.grad`` through the
    op's graph, as in training.  Rows hold ``elements // H`` rows of ``H``
    (``n_rows`` fixes the row count instead).  One row per size, pass and op:
    ``hidden``, ``rows``, ``pass``, ``impl``, the timing and the errors ``err_*``.
    """
    unknown = sorted(set(passes) - {"forward", "backward"})
    if unknown:
        raise ValueError(f"versus(): unknown passes {unknown}")
    rows = []
    for n_cols in hidden:
        m = n_rows or elements // n_cols
        x, w, dy = inputs(m, n_cols, dtype, device=device)
        ref = reference(x, w, dy)
        errors, fwd, bwd = {}, {}, {}
        for name, fn in ops.items():
            xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
            fn(xg, wg)  # the graph of a training step after the first: the op has seen one
            y = fn(xg, wg)
            errors[name] = _errors(y, *torch.autograd.grad(y, (xg, wg), dy, retain_graph=True), ref)
            fwd[name] = partial(fn, x, w)
            bwd[name] = partial(torch.autograd.grad, y, (xg, wg), dy, retain_graph=True)
        fwd_bytes, bwd_bytes = traffic(m, n_cols, x.element_size())
        for p, fns, nbytes in (("forward", fwd, fwd_bytes), ("backward", bwd, bwd_bytes)):
            if p in passes:
                timed = bench.compare(
                    fns, bytes_moved=nbytes, hidden=n_cols, rows=m, **{"pass": p}, **compare
                )
                rows += [{**r, **errors[r["impl"]]} for r in timed]
        del x, w, dy, ref, fwd, bwd
    return rows
