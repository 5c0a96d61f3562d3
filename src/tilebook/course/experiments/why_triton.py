"""The measurements of lesson 01 (why Triton): an eager chain against one fused kernel.

* :func:`traffic` counts, operator by operator, the bytes that a PyTorch
  function reads and writes (it runs the function under a dispatch mode that
  sees every operator, so the count is what ran, not what we assume); any
  machine.
* :func:`least_traffic`: the bytes any implementation must move, each input
  read once and the output written once.
* :func:`fusion` (GPU): eager PyTorch, a fused Triton kernel and
  ``torch.compile`` of the same function over vector lengths, timed in
  interleaved rounds; rows carry the counted traffic beside the time.
* :func:`grid_waste` (GPU): the same fused kernel launched with the grid it
  needs and with one program per element (the "one thread per element" habit
  carried over from CUDA), at one length.
* :func:`inductor_code` (GPU): the Triton source that ``torch.compile``
  (Inductor) writes for a function, as text.

The implementations are the lesson's (it passes them in); what is timed, how it
is checked and how bytes are counted is defined here once.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..bench import compare
from ..check import default_tolerance

__all__ = [
    "DTYPE",
    "EXPONENTS",
    "WASTE_N",
    "fusion",
    "grid_waste",
    "inductor_code",
    "kernel_text",
    "kernels_in",
    "least_traffic",
    "traffic",
]

#: The dtype of every timed vector.
DTYPE = torch.float32
#: Lengths of the timed vectors, as powers of two: from launch-bound to HBM-bound.
EXPONENTS = (16, 20, 24, 26)
#: Length at which :func:`grid_waste` compares the two grids.
WASTE_N = 2**20


def _tensors(tree: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    flat, _ = tree_flatten(tree)
    seen, out = set(), []
    for t in flat:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def traffic(fn: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
    """Run ``fn(*args)`` and return one row per PyTorch operator it ran.

    Each row: ``op`` (the ATen operator), ``reads`` (bytes of its tensor
    arguments, each counted once) and ``writes`` (bytes of its outputs).  On a
    GPU each operator is one kernel launch, which reads its inputs from memory
    and writes its output back.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    rows: list[dict[str, Any]] = []

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            rows.append(
                {
                    "op": func.name().removeprefix("aten::"),
                    "reads": sum(_nbytes(t) for t in _tensors((args, kwargs))),
                    "writes": sum(_nbytes(t) for t in _tensors(out)),
                }
            )
            return out

    with _Count():
        fn(*args)
    return rows


def least_traffic(*tensors: torch.Tensor) -> int:
    """Bytes of ``tensors`` (the inputs and the output), each moved once."""
    return sum(_nbytes(t) for t in tensors)


def _check(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    err = ((got.double() - ref).norm() / ref.norm()).item()
    tol = default_tolerance(got.dtype)
    if not err <= tol:  # NaN fails too
        raise AssertionError(f"{name}: relative error {err:.2e} > {tol:.0e}")


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` through ``torch.compile``, one graph for every length (``dynamic=True``)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=True)


def fusion(
    eager: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    fused: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any],
    *,
    exponents: Iterable[int] = EXPONENTS,
    dtype: torch.dtype = DTYPE,
    **timing: Any,
) -> list[dict[str, Any]]:
    """Eager PyTorch, the fused kernel and ``torch.compile`` at ``n = 2**e``.

    ``eager(x, y)`` returns a new tensor; ``fused(x, y, out)`` writes ``out``.
    Each is checked against ``eager`` in float64 first, then all three are
    timed in the same interleaved rounds (:func:`tilebook.course.bench.compare`;
    ``timing`` goes there).  One row per (length, implementation): ``n``,
    ``log2n``, ``impl`` (``"eager"``, ``"Triton"``, ``"torch.compile"``),
    ``traffic`` (bytes moved: counted by :func:`traffic` for eager, the least
    possible for the two single kernels), ``kernels`` (launches; eager's
    counted), and the timing fields, whose ``gbps`` counts the *least* traffic
    for all three: the useful bytes per second.
    """
    compiled = _compiled(eager)
    rows = []
    for e in exponents:
        n = 2**e
        x = torch.randn(n, device="cuda", dtype=dtype)
        y = torch.randn(n, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        ref = eager(x.double(), y.double())
        out.fill_(float("nan"))
        fused(x, y, out)
        _check(f"Triton n=2^{e}", out, ref)
        _check(f"eager n=2^{e}", eager(x, y), ref)
        _check(f"torch.compile n=2^{e}", compiled(x, y), ref)
        del ref
        ops = traffic(eager, x, y)
        least = least_traffic(x, y, out)
        impls = {
            "eager": lambda x=x, y=y: eager(x, y),
            "Triton": lambda x=x, y=y, out=out: fused(x, y, out),
            "torch.compile": lambda x=x, y=y: compiled(x, y),
        }
        moved = {
            "eager": sum(r["reads"] + r["writes"] for r in ops),
            "Triton": least,
            "torch.compile": least,
        }
        launches = {"eager": len(ops), "Triton": 1, "torch.compile": None}
        for r in compare(impls, bytes_moved=least, n=n, log2n=e, **timing):
            rows.append({**r, "traffic": moved[r["impl"]], "kernels": launches[r["impl"]]})
        del x, y, out
    return rows


def grid_waste(
    launch: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], Any],
    block: int,
    *,
    n: int = WASTE_N,
    dtype: torch.dtype = DTYPE,
    eager: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    **timing: Any,
) -> list[dict[str, Any]]:
    """One kernel, two grids: ``cdiv(n, block)`` programs against ``n`` programs.

    ``launch(x, y, out, programs)`` launches the lesson's kernel (with its
    mask) on ``programs`` programs of ``block`` elements.  Both grids are
    checked against ``eager`` (if given) and timed in interleaved rounds.  Rows:
    ``grid`` (``"cdiv(n, BLOCK)"`` or ``"n"``), ``programs``, ``n``, ``block``
    and the timing fields.
    """
    x = torch.randn(n, device="cuda", dtype=dtype)
    y = torch.randn(n, device="cuda", dtype=dtype)
    out = torch.empty_like(x)
    grids = {"cdiv(n, BLOCK)": math.ceil(n / block), "n": n}
    if eager is not None:
        ref = eager(x.double(), y.double())
        for name, programs in grids.items():
            out.fill_(float("nan"))
            launch(x, y, out, programs)
            _check(f"grid {name}", out, ref)
    impls = {name: (lambda p=p: launch(x, y, out, p)) for name, p in grids.items()}
    rows = []
    for r in compare(impls, bytes_moved=least_traffic(x, y, out), n=n, block=block, **timing):
        name = r.pop("impl")
        rows.append({"grid": name, "programs": grids[name], **r})
    return rows


_KERNEL = re.compile(
    r"async_compile\.triton\(\s*['\"](?P<name>\w+)['\"]\s*,\s*(?:r)?'''(?P<src>.*?)'''", re.S
)


def kernels_in(code: str) -> list[tuple[str, str]]:
    """``(name, source)`` of every Triton kernel in a module that Inductor wrote."""
    return [(m["name"], m["src"].strip("\n")) for m in _KERNEL.finditer(code)]


def kernel_text(source: str, width: int = 88) -> str:
    """An Inductor kernel module from its ``@triton.jit`` line on, no line over ``width``.

    The part above (imports and Inductor's launcher decorator, with its long
    metadata lines) is cut; a longer line is broken with a ``\\`` at its end.
    """
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("@triton.jit")), 0)
    out = []
    for line in lines[start:]:
        while len(line) > width:
            cut = line.rfind(", ", 0, width - 1)
            cut = cut + 1 if cut > 0 else width - 2  # after a comma, else anywhere
            out.append(line[:cut] + " \\")
            line = "        " + line[cut:].lstrip()
        out.append(line)
    return "\n".join(out).rstrip()


def inductor_code(
    fn: Callable[..., Any], n: int = 2**20, *, dtype: torch.dtype = DTYPE
) -> list[dict[str, Any]]:
    """The Triton kernels that ``torch.compile`` writes for ``fn(x, y)``.

    Compiles ``fn`` (as :func:`fusion` does: ``dynamic=True``) with Inductor's
    caches off, so that the code is generated here, and returns one row per
    Triton kernel in the output code: ``kernel`` (its name), ``source`` (the
    module Inductor wrote for it) and ``calls`` (how many launches the wrapper
    makes in all).  Raises if the output holds no Triton kernel.
    """
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    patches = {"fx_graph_cache": False}
    if hasattr(config, "force_disable_caches"):
        patches["force_disable_caches"] = True
    x = torch.randn(n, device="cuda", dtype=dtype)
    y = torch.randn(n, device="cuda", dtype=dtype)
    with config.patch(patches), warnings.catch_warnings():
        # Turning the caches off is the point here; torch says it turns off
        # profile-guided recompilation too, which one compile never uses.
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        compiled = _compiled(fn)
        _, codes = run_and_get_code(compiled, x, y)
    found = [k for code in codes for k in kernels_in(code)]
    if not found:
        raise RuntimeError("torch.compile's output code holds no Triton kernel")
    calls = sum(len(re.findall(rf"\b{name}\.run\(", code)) for code in codes for name, _ in found)
    return [{"kernel": name, "source": src, "calls": calls} for name, src in found]
