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

Below them, what lesson 01 says of its data, on any machine: the tables
(``*_table``), the claims (``*_claims``, for
:meth:`tilebook.course.claims.Claims.check_all`), the sentences (``say_*``) and the
threads-vs-tiles explorer's settings (:func:`explorer`), so that the lesson shows
each in one line.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..bench import compare
from ..check import default_tolerance

__all__ = [
    "DTYPE",
    "EXPLORER_BLOCKS",
    "EXPLORER_N",
    "EXPLORER_SIZES",
    "EXPONENTS",
    "IMPLS",
    "WASTE_N",
    "WAYS",
    "check_explorer",
    "explorer",
    "fusion",
    "fusion_claims",
    "fusion_table",
    "grid_waste",
    "inductor_claims",
    "inductor_code",
    "kernel_text",
    "kernels_in",
    "least_traffic",
    "say_loads",
    "say_traffic",
    "say_versus_compile",
    "traffic",
    "traffic_table",
    "waste_claims",
    "ways_table",
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


# What lesson 01 says of these measurements: its tables, claims (for
# :meth:`tilebook.course.claims.Claims.check_all`), sentences and its widget's
# settings, made from the data of the build, so that the lesson shows each in one line.

#: The three implementations of :func:`fusion`, in the order the page lists them.
IMPLS = ("eager", "Triton", "torch.compile")


def traffic_table(ops: Sequence[dict[str, Any]], x: torch.Tensor) -> Any:
    """The table of :func:`traffic`'s rows for a chain run on vectors like ``x``."""
    from ..tables import table

    columns = {"operator": "op", "bytes read": ("reads", "{:,}"), "written": ("writes", "{:,}")}
    caption = f"float32 vectors of {x.numel():,} elements; counted on this machine"
    return table(ops, columns, caption=caption)


def say_traffic(ops: Sequence[dict[str, Any]], least: int, n: int) -> Any:
    """What :func:`traffic`'s rows say against the ``least`` bytes, for ``n`` elements."""
    from ..prose import say

    moved = sum(r["reads"] + r["writes"] for r in ops)
    return say(
        "One line, {k} kernels.  Together they move {moved:,} bytes, {per:.0f} per "
        "element, because each intermediate result is written to memory by one "
        "kernel and read back by the next.  The least any implementation must move "
        "is {least_per:.0f} bytes per element: read ``x`` and ``y`` once, write the "
        "result once.  Eager PyTorch moves {ratio:.2f} times that.",
        k=len(ops),
        moved=moved,
        per=moved / n,
        least_per=least / n,
        ratio=moved / least,
    )


def say_loads(sass: Any, wide: int, block: int, warps: int) -> Any:
    """What the compiled kernel (``sass``, a :class:`~tilebook.course.aot.CompiledKernel`)
    does with a tile of ``block`` elements on ``warps`` warps, ``wide`` of its loads
    16 bytes wide."""
    from ..datasheet import fact
    from ..prose import say

    threads = warps * int(fact("cuda.warp_size").value)
    return say(
        "Triton spread each tile of {block:,} elements over the program's {threads} "
        "threads, {per} elements per thread, and loads them in 16-byte pieces, four "
        "floats at a time (``LDG.E.128``, {wide} of them in the SASS), in {regs} "
        "registers per thread.  None of that is in the kernel's source: it is the "
        "compiler's choice, and it changes with ``BLOCK``, ``num_warps`` and the dtype.",
        block=block,
        threads=threads,
        per=block // threads,
        wide=wide,
        regs=sass.registers,
    )


def _by_length(fusion: Any) -> dict[int, dict[str, dict[str, Any]]]:
    """A :func:`fusion` record's rows by ``log2n``, then by implementation."""
    return {e: {i: fusion.one(log2n=e, impl=i) for i in IMPLS} for e in fusion.values("log2n")}


def fusion_table(fusion: Any) -> Any:
    """A :func:`fusion` record as a table: times, the fused kernel's speed-up over
    eager PyTorch, and how many more bytes eager moves."""
    from ..claims import speedup
    from ..tables import table

    columns = {
        "n": lambda r: f"2^{r['e']}",
        **{f"{i} µs": lambda r, i=i: f"{1e3 * r[i]['median_ms']:.1f}" for i in IMPLS},
        "Triton vs eager": lambda r: f"{speedup(r['Triton'], r['eager']).ratio:.2f}x",
        "eager's bytes": lambda r: f"{r['eager']['traffic'] / r['Triton']['traffic']:.2f}x",
    }
    rows = [{"e": e, **r} for e, r in _by_length(fusion).items()]
    return table(rows, columns, caption=fusion.caption())


def fusion_claims(fusion: Any, near: float) -> dict[str, Any]:
    """The claims a :func:`fusion` record supports; *close* means within ``near``."""
    from ..claims import speedup, within

    at = _by_length(fusion)
    copy = fusion.provenance["copy_gbps"]
    big, small = at[max(at)], at[min(at)].values()
    vs_eager = speedup(big["Triton"], big["eager"])
    bytes_ratio = big["eager"]["traffic"] / big["Triton"]["traffic"]
    return {
        "At the largest length the fused kernel is faster than eager PyTorch": vs_eager,
        "There, its speed-up over eager is close to the ratio of bytes moved": (
            within(vs_eager.ratio, bytes_ratio, near),
            f"{vs_eager.ratio:.2f}x faster, {bytes_ratio:.2f}x fewer bytes",
        ),
        "There, the fused kernel's useful bandwidth is close to the copy's": (
            big["Triton"]["gbps"] >= (1 - near) * copy,
            f"{big['Triton']['gbps'] / copy:.0%} of the copy",
        ),
        "At the smallest length all three are far below the copy line (under half)": (
            all(r["gbps"] < copy / 2 for r in small),
            ", ".join(f"{r['impl']} {r['gbps'] / copy:.0%}" for r in small),
        ),
    }


def say_versus_compile(fusion: Any) -> Any:
    """The fused kernel against ``torch.compile``'s at the largest length of ``fusion``."""
    from ..claims import speedup
    from ..prose import say

    at = _by_length(fusion)
    vs = speedup(at[max(at)]["Triton"], at[max(at)]["torch.compile"])
    return say(
        "At 2^{e} elements our kernel {standing} ``torch.compile``'s ({ev}).",
        e=max(at),
        standing=vs.standing,
        ev=vs.evidence("ours", "torch.compile's"),
    )


def inductor_claims(inductor: Any) -> dict[str, Any]:
    """The claims an :func:`inductor_code` record supports: one kernel, shaped like ours."""
    src = inductor.rows[0]["source"]
    loads, stores = src.count("tl.load("), src.count("tl.store(")
    return {
        "torch.compile wrote a single Triton kernel for the whole chain": (
            len(inductor.rows) == 1,
            ", ".join(r["kernel"] for r in inductor.rows),
        ),
        "Like ours, it loads the two inputs once each and stores once, under a mask": (
            (loads, stores) == (2, 1) and "xmask" in src,
            f"{loads} loads, {stores} store",
        ),
    }


#: The five common ways to get work onto an NVIDIA GPU: what you write, what a tool
#: decides for you, and when to reach for each (lesson 01's table).
WAYS = [
    {
        "way": "PyTorch, eager",
        "you write": "tensor operations",
        "decided for you": "everything; one kernel per operator",
        "reach for it": "first, always; until a profile says otherwise",
    },
    {
        "way": "torch.compile",
        "you write": "the same Python",
        "decided for you": "fusion and tiling (Inductor writes Triton)",
        "reach for it": "chains of operators, whole models",
    },
    {
        "way": "Triton",
        "you write": "one program per tile, array operations",
        "decided for you": "threads, vector width, shared memory, tensor-core code",
        "reach for it": "a fusion or algorithm the compiler does not find",
    },
    {
        "way": "CUDA C++, CUTLASS, CuTe",
        "you write": "each thread, warp and copy",
        "decided for you": "little: you schedule it",
        "reach for it": "the last part of peak, new hardware features",
    },
    {
        "way": "libraries",
        "you write": "a call: cuBLAS, cuDNN, FlashAttention",
        "decided for you": "all of it, tuned by the vendor",
        "reach for it": "standard operations with a fast library kernel",
    },
]


def ways_table() -> Any:
    """:data:`WAYS` as a table."""
    from ..tables import table

    return table(WAYS, {k: k for k in WAYS[0]})


def _waste_rows(waste: Any) -> tuple[dict[str, Any], Any]:
    """A :func:`grid_waste` record's row of one program per element, and what it costs
    against the grid the data needs."""
    from ..claims import speedup

    per_element = waste.one(grid="n")
    return per_element, speedup(waste.one(grid="cdiv(n, BLOCK)"), per_element)


def waste_claims(waste: Any) -> dict[str, Any]:
    """The claim a :func:`grid_waste` record supports."""
    return {"One program per element is slower than the grid the data needs": _waste_rows(waste)[1]}


#: The sizes and blocks of lesson 01's :class:`~tilebook.course.widgets_grid.ThreadsVsTilesExplorer`,
#: and the size at which its floor grid is checked against the exercise checker.
EXPLORER_SIZES = [1, 97, 1000, 1024, 1025, 4097, 10_000, 100_000]
EXPLORER_BLOCKS = [128, 256, 512, 1024, 2048, 4096]
EXPLORER_N = 4097


def explorer(waste: Any, block: int, warps: int) -> dict[str, Any]:
    """The settings of lesson 01's threads-vs-tiles explorer for a kernel of ``block``
    elements on ``warps`` warps; its note on the ``N`` rule from a :func:`grid_waste`
    record."""
    per_element, cost = _waste_rows(waste)
    return {
        "sizes": EXPLORER_SIZES,
        "blocks": EXPLORER_BLOCKS,
        "num_warps": warps,
        "notes": {
            "N": f"Measured at N = {per_element['n']:,} on {waste.provenance['gpu']}: "
            f"{cost.ratio:.0f}x the time of cdiv(N, BLOCK) programs."
        },
        "caption": waste.caption(),
        "initial": {"n": EXPLORER_N, "block": block, "grid": "cdiv(N, BLOCK)"},
    }


def check_explorer(broken: Any, block: int) -> None:
    """Raise unless the explorer's floor grid (``N // BLOCK``, blocks of ``block``) leaves
    unowned, at :data:`EXPLORER_N` elements, exactly the elements that the exercise
    checker found unwritten: ``broken``, its verdict on a launcher with that grid."""
    from ..widgets_grid import ThreadsVsTilesExplorer

    programs = ThreadsVsTilesExplorer.programs(EXPLORER_N, block, "N // BLOCK")
    missed = EXPLORER_N - min(EXPLORER_N, programs * block)
    seen = [f.count for label, f in broken.findings if label == f"n={EXPLORER_N}"]
    if seen != [missed]:
        raise AssertionError(
            f"the widget and the checker disagree: the widget leaves {missed} elements "
            f"unowned at n={EXPLORER_N}, the checker found {seen} unwritten"
        )
