"""vector_add measurements shared by lesson 07 and ``benchmarks/vector_add.py``.

Two measurements, each defined once here:

* :func:`sizes`: :func:`tilebook.vector_add` against ``torch.add`` over vector
  lengths (the lesson plots them against the copy bandwidth; the benchmark
  holds tilebook to its target ratio);
* :func:`launch_settings`: :func:`tilebook.vector_add` at one length over a
  grid of ``BLOCK_SIZE`` and ``num_warps`` (the lesson's widget; the benchmark
  keeps the package's configuration honest).

Each function checks what it times against a float64 reference first, then
times the implementations in interleaved rounds (:func:`tilebook.bench.compare`)
so that their spread includes the drift of the GPU's clocks.  GB/s count the
bytes that must move: both inputs read once and the output written once,
``3 * n`` elements.  GPU only, like every module of :mod:`tilebook.experiments`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import triton

from ..bench import compare
from ..check import default_tolerance
from ..ops.vector_add import vector_add

__all__ = [
    "BLOCKS",
    "DTYPE",
    "EXPONENTS",
    "LAUNCH_N",
    "WARPS",
    "elements_per_thread",
    "launch_settings",
    "setting",
    "sizes",
    "traffic",
]

#: The dtype every measurement uses.
DTYPE = torch.float32
#: Vector lengths of the lesson's size sweep, as powers of two: from far below
#: what fills the GPU to three 1 GiB tensors.
EXPONENTS = tuple(range(12, 29, 2))
#: Length of the launch-setting sweep: three 256 MiB tensors, far beyond the L2
#: cache, so that the figures measure HBM.
LAUNCH_N = 2**26
#: The grid of the launch-setting sweep: the smallest block, the package's, and
#: the largest, each from one warp (many elements per thread) to sixteen (few).
#: Every setting is a compile, so the grid is as small as the lesson's story.
BLOCKS = (128, 4096, 16384)
WARPS = (1, 2, 8, 16)
_WARP_SIZE = 32  # threads in a warp on every CUDA GPU


def traffic(n: int, dtype: torch.dtype = DTYPE) -> int:
    """Bytes that ``x + y`` must move for ``n`` elements: two reads and one write."""
    return 3 * n * torch.empty((), dtype=dtype).element_size()


def elements_per_thread(block: int, warps: int) -> float:
    """Elements of a ``block``-element program that each of its threads owns."""
    return block / (_WARP_SIZE * warps)


def setting(block: int, warps: int) -> str:
    """The label of one launch setting, ``"4096/8"``."""
    return f"{block}/{warps}"


def _inputs(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    return a, b, torch.empty_like(a)


def _check(name: str, fn, out: torch.Tensor, ref: torch.Tensor) -> None:
    """Run ``fn`` on a poisoned ``out`` and raise unless it matches ``ref``."""
    out.fill_(float("nan"))  # an element the kernel fails to write stays NaN
    fn()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    tol = default_tolerance(out.dtype)
    if not err <= tol:  # NaN fails too
        raise AssertionError(f"vector_add {name}: relative error {err:.2e} > {tol:.0e}")


def _launcher(a, b, out, block: int, warps: int):
    return lambda: vector_add(a, b, out=out, block_size=block, num_warps=warps)


def sizes(
    exponents: Iterable[int] = EXPONENTS, *, dtype: torch.dtype = DTYPE, **timing: Any
) -> list[dict[str, Any]]:
    """``tilebook`` against ``torch.add`` at ``n = 2**e`` for each exponent ``e``.

    One row per (size, implementation): ``n``, ``log2n``, ``dtype``, ``impl`` and
    the timing fields.  ``timing`` goes to :func:`tilebook.bench.compare`
    (``rounds``, ``warmup``, ``rep``).
    """
    rows = []
    for e in exponents:
        n = 2**e
        a, b, out = _inputs(n, dtype)
        impls = {
            "tilebook": lambda a=a, b=b, out=out: vector_add(a, b, out=out),
            "torch.add": lambda a=a, b=b, out=out: torch.add(a, b, out=out),
        }
        ref = a.double() + b.double()
        for name, fn in impls.items():  # compiles happen here, never inside the timing
            _check(f"{name} n=2^{e}", fn, out, ref)
        del ref
        dt = str(dtype).removeprefix("torch.")
        rows += compare(impls, bytes_moved=traffic(n, dtype), n=n, log2n=e, dtype=dt, **timing)
        del a, b, out
    return rows


def launch_settings(
    n: int = LAUNCH_N,
    *,
    blocks: Sequence[int] = BLOCKS,
    warps: Sequence[int] = WARPS,
    dtype: torch.dtype = DTYPE,
    **timing: Any,
) -> list[dict[str, Any]]:
    """``tilebook.vector_add`` at ``n`` elements for every ``BLOCK_SIZE`` x ``num_warps``.

    All settings are timed in the same interleaved rounds.  One row per setting:
    ``BLOCK_SIZE``, ``num_warps``, ``setting`` (``"4096/8"``),
    ``elements_per_thread``, ``programs`` (the grid), ``n``, ``dtype`` and the
    timing fields.
    """
    a, b, out = _inputs(n, dtype)
    ref = a.double() + b.double()
    impls = {}
    for bk in blocks:
        for w in warps:
            fn = _launcher(a, b, out, bk, w)
            _check(setting(bk, w), fn, out, ref)
            impls[setting(bk, w)] = fn
    del ref
    timed = {r["impl"]: r for r in compare(impls, bytes_moved=traffic(n, dtype), **timing)}
    rows = []
    for bk in blocks:
        for w in warps:
            r = dict(timed[setting(bk, w)])
            del r["impl"]
            rows.append(
                {
                    "BLOCK_SIZE": bk,
                    "num_warps": w,
                    "setting": setting(bk, w),
                    "elements_per_thread": elements_per_thread(bk, w),
                    "programs": triton.cdiv(n, bk),
                    "n": n,
                    "dtype": str(dtype).removeprefix("torch."),
                    **r,
                }
            )
    return rows
