"""A linear layer and its activation, fused against unfused: lessons 08 and 09, benchmarks.

Every measurement here builds one layer ``act(x @ w.T + b)`` of ``M`` tokens,
``K`` inputs and ``N`` outputs, checks each implementation against float64
(on the first rows, enough to catch a wrong tile), then times them against
each other in interleaved rounds (:func:`tilebook.course.bench.compare`)::

    rows = layer_versus(16384, 4096, 128, "gelu",
                        {"fused": my_fused, "unfused, PyTorch": unfused_torch},
                        passes={"unfused, PyTorch": 2})

Lesson 08 passes its own kernels; lesson 09 and ``benchmarks/linear_act.py``
call :func:`versus_torch`, which times :func:`tilebook.linear_act` against
``act(F.linear(...))`` and ``F.linear`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .. import bench

__all__ = [
    "CHECK_ROWS",
    "TORCH_ACT",
    "layer",
    "layer_versus",
    "reference",
    "rel_err",
    "traffic",
    "unfused_torch",
    "versus_torch",
]

#: ``torch.nn.functional`` form of each activation of :data:`tilebook.ops.epilogue.ACTIVATIONS`.
TORCH_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}
#: Rows of the output checked against float64: enough to meet every column tile.
CHECK_ROWS = 1024

Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, str], torch.Tensor]


def layer(m: int, n: int, k: int, dtype=torch.bfloat16, device="cuda", bias: bool = True):
    """``(x, w, b)``: ``m`` tokens of ``k`` features, an ``(n, k)`` weight scaled by
    ``k**-0.5`` (outputs of unit size) and a bias (None without ``bias``)."""
    x = torch.randn(m, k, device=device).to(dtype)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
    b = torch.randn(n, device=device).to(dtype) if bias else None
    return x, w, b


def reference(x, w, b, activation: str) -> torch.Tensor:
    """``act(x @ w.T + b)`` in float64."""
    b64 = None if b is None else b.double()
    return TORCH_ACT[activation](F.linear(x.double(), w.double(), b64))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error in float64."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def unfused_torch(x, w, b, activation: str) -> torch.Tensor:
    """What a model runs without a fused kernel: ``F.linear`` (cuBLAS), then the activation."""
    return TORCH_ACT[activation](F.linear(x, w, b))


def traffic(m: int, n: int, k: int, elem: int, passes: int = 0) -> int:
    """Bytes that must move: ``x``, ``w`` and ``b`` read once, ``y`` written once, plus
    ``passes`` more trips of the ``(m, n)`` output through memory (an unfused
    activation reads ``y`` back and writes it again: two)."""
    return (m * k + n * k + n + m * n) * elem + passes * m * n * elem


def layer_versus(
    m: int,
    n: int,
    k: int,
    activation: str,
    impls: Mapping[str, Impl],
    *,
    passes: Mapping[str, int] | None = None,
    computes: Mapping[str, str] | None = None,
    dtype=torch.bfloat16,
    tol: float = 1e-2,
    rounds: int = 3,
    warmup: float = 10,
    rep: float = 40,
    **fields: Any,
) -> list[dict[str, Any]]:
    """Check, then time, ``impls`` (each ``fn(x, w, b, activation)``) on one layer.

    ``passes`` counts the extra trips of the output through memory that each
    implementation makes (for the bytes column); ``computes`` names an
    implementation that computes another activation than ``activation`` (such as
    ``F.linear`` alone, ``"none"``).  Raises AssertionError naming the
    implementation when one misses ``tol``.  One row per implementation, with
    ``M``, ``N``, ``K``, ``activation``, ``impl``, ``bytes``, ``rel_err`` and the
    timing; TFLOP/s count the product's ``2MNK``.
    """
    passes, computes = dict(passes or {}), dict(computes or {})
    x, w, b = layer(m, n, k, dtype)
    head = x[:CHECK_ROWS]
    errs = {}
    refs: dict[str, torch.Tensor] = {}
    for name, fn in impls.items():
        act = computes.get(name, activation)
        if act not in refs:
            refs[act] = reference(head, w, b, act)
        errs[name] = rel_err(fn(x, w, b, activation)[:CHECK_ROWS], refs[act])
        if not errs[name] < tol:  # also catches NaN
            raise AssertionError(
                f"{name}, {activation}, {m}x{k} -> {n}: relative error {errs[name]:.3g} "
                f"(tolerance {tol})"
            )
    del refs
    elem = x.element_size()
    rows = bench.compare(
        {name: (lambda fn=fn: fn(x, w, b, activation)) for name, fn in impls.items()},
        rounds=rounds,
        bytes_moved={name: traffic(m, n, k, elem, passes.get(name, 0)) for name in impls},
        flops=2 * m * n * k,
        warmup=warmup,
        rep=rep,
        M=m,
        N=n,
        K=k,
        activation=activation,
        dtype=str(dtype).removeprefix("torch."),
        **fields,
    )
    for row in rows:
        row["rel_err"] = errs[row["impl"]]
    return rows


def versus_torch(
    shapes: Iterable[tuple[int, int, int, str]],
    *,
    rounds: int = 3,
    warmup: float = 10,
    rep: float = 40,
) -> list[dict[str, Any]]:
    """:func:`tilebook.linear_act` against ``act(F.linear(...))`` and ``F.linear`` alone.

    ``shapes`` holds ``(M, N, K, activation)``.  Rows carry ``kernel``
    (``"linear+gelu"``), ``shape`` (``"MxNxK"``) and ``impl``: ``"tilebook"``,
    ``"unfused"`` and ``"F.linear"`` (the product and bias without the
    activation: the floor a fused layer has to reach).
    """
    import tilebook

    rows: list[dict[str, Any]] = []
    for m, n, k, act in shapes:
        impls = {
            "tilebook": tilebook.linear_act,
            "unfused": unfused_torch,
            "F.linear": lambda x, w, b, act: F.linear(x, w, b),
        }
        rows += layer_versus(
            m,
            n,
            k,
            act,
            impls,
            passes={"unfused": 0 if act == "none" else 2},
            computes={"F.linear": "none"},
            rounds=rounds,
            warmup=warmup,
            rep=rep,
            kernel=f"linear+{act}",
            shape=f"{m}x{n}x{k}",
        )
        torch.cuda.empty_cache()
    return rows
