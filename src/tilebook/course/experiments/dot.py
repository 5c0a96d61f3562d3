"""tl.dot measurements of lesson 05: what each kind of input costs in accuracy and speed.

One measurement, defined once here: :func:`paths` multiplies the same tile by
``tl.dot`` along each path the hardware offers, all with a float32
accumulator:

* float32 inputs with ``input_precision="ieee"``: a loop of fused multiply-adds
  (``FFMA``), no tensor cores;
* float32 inputs through the tensor cores as tf32 (the default) or as
  ``tf32x3`` (three tf32 products that recover most of float32's precision);
* float16 and bfloat16 inputs;
* on a GPU with fp8 tensor cores (compute capability 8.9 and up), fp8 e4m3 and
  e5m2 inputs.

For each path it reports two errors and a rate.  ``err`` is the relative
error (Frobenius norm) of one tile's product against float64 of the float32
data the inputs were made from: what choosing that path costs.  ``err_dot``
compares with float64 of the inputs as converted, so it shows the dot's own
arithmetic (tf32 rounding inside the tensor core; for 16-bit inputs only the
float32 accumulation).  The rate comes from :data:`repeat_dot_kernel`, which
loads its tile once and repeats the dot ``repeat`` times into its accumulator:
the operands stay on chip, so memory does not set the time, the instruction
does.  Every program multiplies the same tile (it stays in the L2 cache) and
writes its own output tile.  The paths are timed in interleaved rounds
(:func:`tilebook.course.bench.compare`).  GPU only, like every module of
:mod:`tilebook.course.experiments`.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ..bench import compare

__all__ = [
    "PATHS",
    "REPEAT",
    "TILE",
    "WARPS",
    "WAVES",
    "available_paths",
    "paths",
    "repeat_dot_kernel",
]

#: The paths, in the order a table shows them: name -> (input dtype, input_precision).
#: ``input_precision`` only matters for float32 inputs; the others pass the default.
PATHS: dict[str, tuple[torch.dtype, str]] = {
    "fp32 ieee": (torch.float32, "ieee"),
    "fp32 tf32x3": (torch.float32, "tf32x3"),
    "fp32 tf32": (torch.float32, "tf32"),
    "fp16": (torch.float16, "tf32"),
    "bf16": (torch.bfloat16, "tf32"),
    "fp8 e4m3": (torch.float8_e4m3fn, "tf32"),
    "fp8 e5m2": (torch.float8_e5m2, "tf32"),
}
#: The tile ``(M, N, K)`` every path multiplies: one Hopper warpgroup's wgmma tile.
TILE = (64, 64, 32)
#: Warps per program: one warpgroup.
WARPS = 4
#: Dots each program chains into its accumulator when timed.
REPEAT = 64
#: Programs launched per SM when timed.
WAVES = 8

# A dot's relative error against float64 of its converted inputs that a correct
# kernel stays under, by input precision (tf32 keeps 10 bits of mantissa; Hopper
# adds fp8 products with fewer bits than float32): the check before timing.
_DOT_TOL = {"ieee": 1e-5, "tf32x3": 1e-4, "tf32": 5e-3, "fp16": 1e-4, "bf16": 1e-4, "fp8": 5e-3}


@triton.jit(do_not_specialize=["repeat"])  # repeat=1 and repeat=64: one binary
def repeat_dot_kernel(
    a_ptr,  # (M, K), row-major: one tile, shared by every program
    b_ptr,  # (K, N), row-major
    c_ptr,  # (programs, M, N) float32: one output tile per program
    repeat,  # dots to chain into the accumulator
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    PRECISION: tl.constexpr,  # input_precision for float32 inputs
):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = tl.zeros((M, N), dtype=tl.float32)
    for _ in range(repeat):
        acc = tl.dot(a, b, acc, input_precision=PRECISION)  # acc + a @ b
    c = c_ptr + tl.program_id(0) * M * N
    tl.store(c + rm[:, None] * N + rn[None, :], acc)


def available_paths(capability: tuple[int, int] | None = None) -> list[str]:
    """The names in :data:`PATHS` that a GPU of compute ``capability`` runs.

    fp8 e4m3 needs 8.9 or newer in Triton; without a capability, the current GPU's.
    """
    if capability is None:
        capability = torch.cuda.get_device_capability()
    return [p for p in PATHS if not p.startswith("fp8") or tuple(capability) >= (8, 9)]


def _tol(path: str) -> float:
    dtype, precision = PATHS[path]
    if dtype == torch.float32:
        return _DOT_TOL[precision]
    return _DOT_TOL[path.split()[0]]


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def paths(
    names: list[str] | None = None,
    *,
    tile: tuple[int, int, int] = TILE,
    num_warps: int = WARPS,
    repeat: int = REPEAT,
    waves: int = WAVES,
    kernel: Any = None,
    seed: int = 0,
    **timing: Any,
) -> list[dict[str, Any]]:
    """Each path of :data:`PATHS`: its errors on one tile and its measured rate.

    Parameters
    ----------
    names
        Paths to run (default: :func:`available_paths` of this GPU).
    tile, num_warps
        ``(M, N, K)`` of the tile and the warps of each program.
    repeat, waves
        Dots chained per program, and programs launched per SM, when timed.
    kernel
        A kernel with the signature of :data:`repeat_dot_kernel` (default: that one;
        lesson 05 passes its own copy).
    timing
        Keywords for :func:`tilebook.course.bench.compare` (``rounds``, ``warmup``, ``rep``).

    Returns
    -------
    list of dict
        One row per path: ``path``, ``dtype``, ``precision``, ``M``, ``N``,
        ``K``, ``num_warps``, ``repeat``, ``programs``, ``err``, ``err_dot``
        and the timing fields of :func:`tilebook.course.bench.compare` (``impl`` is the
        path; ``tflops`` counts ``2 * M * N * K`` per dot).
    """
    names = available_paths() if names is None else list(names)
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        raise ValueError(f"unknown paths {unknown}; the paths are {list(PATHS)}")
    if repeat < 1 or waves < 1:
        raise ValueError(f"repeat and waves must be positive, got {repeat} and {waves}")
    kernel = repeat_dot_kernel if kernel is None else kernel
    m, n, k = tile
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a32 = torch.randn(m, k, device="cuda", generator=gen)
    b32 = torch.randn(k, n, device="cuda", generator=gen)
    exact = a32.double() @ b32.double()
    programs = waves * torch.cuda.get_device_properties(0).multi_processor_count
    c = torch.empty(programs, m, n, device="cuda")
    launches: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    for name in names:
        dtype, precision = PATHS[name]
        a, b = a32.to(dtype), b32.to(dtype)

        def run(grid, reps, a=a, b=b, precision=precision):
            kernel[grid](a, b, c, reps, M=m, N=n, K=k, PRECISION=precision, num_warps=num_warps)

        c.fill_(float("nan"))
        run((1,), 1)  # compiles here, never inside the timing
        one = c[0].clone()
        exact_in = a.float().double() @ b.float().double()  # fp8: via float32
        err_dot = _rel(one, exact_in)
        if not err_dot <= _tol(name):  # NaN fails too
            raise AssertionError(f"tl.dot {name}: relative error {err_dot:.2e} > {_tol(name):.0e}")
        c.fill_(float("nan"))
        run((programs,), repeat)
        chained = _rel(c, (repeat * exact_in).expand(programs, m, n))
        if not chained <= 4 * _tol(name):
            raise AssertionError(f"tl.dot {name}, {repeat} dots chained: error {chained:.2e}")
        info[name] = {
            "path": name,
            "dtype": str(dtype).removeprefix("torch."),
            "precision": precision if dtype == torch.float32 else "",
            "err": _rel(one, exact),
            "err_dot": err_dot,
        }
        launches[name] = lambda run=run: run((programs,), repeat)
    flops = 2 * m * n * k * repeat * programs
    timed = compare(launches, flops=flops, **timing)
    fields = {"M": m, "N": n, "K": k, "num_warps": num_warps, "repeat": repeat}
    return [{**info[r["impl"]], **fields, "programs": programs, **r} for r in timed]
