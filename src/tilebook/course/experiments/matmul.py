"""Matrix multiplication against cuBLAS: lesson 09 and ``benchmarks/matmul.py``.

::

    rows = versus_cublas([(4096, 4096, 4096), (4095, 4097, 4093)])

Each product is checked against float64 (on its first rows) before
:func:`tilebook.matmul` and ``torch.matmul`` are timed in interleaved rounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .. import bench

__all__ = ["CHECK_ROWS", "operands", "versus_cublas"]

#: Rows of the product checked against float64: enough to meet every column tile.
CHECK_ROWS = 1024


def operands(m: int, n: int, k: int, dtype=torch.bfloat16, device="cuda"):
    """``(a, b)``: ``a`` is ``(m, k)``, ``b`` is ``(k, n)``, standard normal."""
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    return a, b


def _picked(m: int, n: int, k: int) -> str:
    from ...ops.matmul import picked_configs

    found = [p for p in picked_configs() if (p["M"], p["N"], p["K"]) == (m, n, k)]
    return f"{found[-1]['kernel']} {found[-1]['config']}" if found else "unknown"


def versus_cublas(
    shapes: Iterable[tuple[int, int, int]],
    *,
    dtype=torch.bfloat16,
    tol: float = 1e-2,
    rounds: int = 3,
    warmup: float = 10,
    rep: float = 40,
) -> list[dict[str, Any]]:
    """:func:`tilebook.matmul` against ``torch.matmul`` (cuBLAS) for each ``(M, N, K)``.

    Rows carry ``kernel`` (``"matmul"``), ``shape`` (``"MxNxK"``), ``size`` (the
    cube root of ``MNK``, for plotting), ``kind`` (``"square"`` or ``"ragged"``),
    ``impl`` (``"tilebook"`` or ``"cuBLAS"``), the timing and TFLOP/s; tilebook's
    rows add ``rel_err`` and ``config``, the configuration it ran
    (:func:`tilebook.ops.matmul.picked_configs`).  Raises AssertionError when a
    product misses ``tol``.
    """
    import tilebook

    rows: list[dict[str, Any]] = []
    for m, n, k in shapes:
        a, b = operands(m, n, k, dtype)
        ref = a[:CHECK_ROWS].double() @ b.double()
        err = ((tilebook.matmul(a, b)[:CHECK_ROWS].double() - ref).norm() / ref.norm()).item()
        if not err < tol:  # also catches NaN
            raise AssertionError(f"matmul {m}x{n}x{k}: relative error {err:.3g} (tol {tol})")
        del ref
        got = bench.compare(
            {
                "tilebook": lambda a=a, b=b: tilebook.matmul(a, b),
                "cuBLAS": lambda a=a, b=b: torch.matmul(a, b),
            },
            rounds=rounds,
            flops=2 * m * n * k,
            warmup=warmup,
            rep=rep,
            kernel="matmul",
            shape=f"{m}x{n}x{k}",
            size=round((m * n * k) ** (1 / 3)),
            kind="square" if m == n == k else "ragged",
            dtype=str(dtype).removeprefix("torch."),
        )
        for row in got:
            if row["impl"] == "tilebook":
                row.update(rel_err=err, config=_picked(m, n, k))
        rows += got
        del a, b
        torch.cuda.empty_cache()
    return rows
