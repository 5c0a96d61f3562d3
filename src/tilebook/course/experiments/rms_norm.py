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

Below them, what lesson 11 says of its records, on any machine: the tables
(``*_table``), the claims (``*_claims``, for
:meth:`tilebook.course.claims.Claims.check_all`), the sentences (``say_*``) and
its explorer's settings, so that the lesson shows each in one line.
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
    "accumulate_claims",
    "additions_claims",
    "additions_table",
    "against_torch",
    "cost",
    "explorer_setup",
    "grid_claims",
    "grid_table",
    "inputs",
    "kernels",
    "naive",
    "ops",
    "rate",
    "reference",
    "rel_err",
    "rounding_err",
    "say_accumulate",
    "say_autograd",
    "say_grid",
    "say_long_rows",
    "say_per_thread",
    "steps_table",
    "traffic",
    "verdict",
    "versus",
    "versus_claims",
    "versus_table",
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


# What lesson 11 says of these measurements: its tables, claims and sentences, made
# from the records it shows (live on a GPU, committed on a CPU).  ``hidden`` is the
# lesson's three row lengths, short, middle and long.


def rate(r: Mapping[str, Any]) -> str:
    """A timed row's GB/s at the median time, and at the p80 and p20 times."""
    f = r["gbps"] * r["median_ms"]
    return f"{r['gbps']:,.0f} ({f / r['p80_ms']:,.0f}-{f / r['p20_ms']:,.0f})"


def verdict(c: Any) -> str:
    """A :class:`~tilebook.course.claims.Comparison` in a word: faster, slower or level."""
    return "faster" if c.faster else "slower" if c.slower else "level"


def _to_tol(e: float, tol: float) -> str:
    return f"largest error {e:.1e} against tolerance {tol:.1e}"


def _largest_error(record: Any) -> float:
    return max(r[k] for r in record.rows for k in ("err_y", "err_dx", "err_dw"))


def say_per_thread(per: Mapping[int, float], warps_for: Callable[[int], int]) -> Any:
    """Where a thread holds the same number of a row's values (``per``: ``BLOCK_N`` to
    values a thread, under the launcher's ``warps_for``), and what it holds outside."""
    from ..prose import say

    steady = max(per.values(), key=list(per.values()).count)
    flat = [b for b, v in per.items() if v == steady]
    return say(
        "So a thread holds {steady:g} of the row's values only from {lo} to {hi} columns "
        "(``BLOCK_N``): enough for 16-byte loads, few enough for registers.  Below {lo} "
        "one warp takes the row, and a thread holds fewer, down to {p0:g} at {b0}, where "
        "threads hold copies of each other's values.  Above {hi} the warps stop at {w}, "
        "and a thread holds more: {p1:g} at {b1}, where the lesson's kernels fall apart "
        "(below).",
        steady=steady,
        lo=flat[0],
        hi=flat[-1],
        b0=min(per),
        p0=per[min(per)],
        w=warps_for(max(per)),
        p1=per[max(per)],
        b1=max(per),
    )


def grid_table(grid: Any) -> Any:
    """The backward's speed on each grid of a lesson-11 grid record."""
    from ..tables import table

    columns = {"grid": "impl", "programs": "programs", "GB/s (spread)": rate}
    return table(grid.rows, columns, caption=f"{ELEMENTS:,} values a tensor; {grid.caption()}")


def _grids(grid: Any) -> tuple[dict[str, Any], Any]:
    """The fastest grid's row, and its speed against one program per row."""
    from ..claims import speedup

    best = max(grid.rows, key=lambda r: r["gbps"])
    return best, speedup(best, grid.one(impl="one per row"))


def grid_claims(grid: Any) -> dict[str, Any]:
    """The claim of the grid record, for ``check_all``."""
    return {"A grid sized from the SMs beats one per row": _grids(grid)[1]}


def say_grid(grid: Any, choice: Mapping[str, Any]) -> Any:
    """How the grid sized from the SMs, and the package's ``choice`` of it, compare."""
    from ..claims import speedup
    from ..prose import say

    best, c = _grids(grid)
    cmp = speedup(choice, best)
    return say(
        "Sized from the SM count, the grid runs {r:.2f} times as fast as one program per "
        "row, which pays for its partial buffer.  The package's rule, {warps} warps on "
        "each SM, gives {choice} at this width: {v}.",
        r=c.ratio,
        warps=op.BWD_WARPS_PER_SM,
        choice=choice["impl"],
        v="the fastest grid measured"
        if choice["impl"] == best["impl"]
        else f"{verdict(cmp)} against the fastest, {best['impl']} ({cmp.ratio:.2f})",
    )


def steps_table(steps: Any) -> Any:
    """Each kernel's speed in a lesson-11 steps record (lesson against package)."""
    from ..tables import table

    columns = {"pass": "pass", "H": "hidden", "kernel": "impl", "GB/s (spread)": rate}
    return table(steps.rows, columns, caption=steps.caption())


def _additions(steps: Any, hidden: Sequence[int]) -> list[tuple[str, int, str, str, Any]]:
    """``(pass, width, kernel, what it adds over the other, Comparison)`` per step of
    the package over the lesson that a steps record measures; which additions are at
    work at each width comes from the package's launch rules."""
    from ..claims import speedup

    short, mid, long_h = hidden
    _, rows_f, warps_f = op.fwd_config(short)
    _, rows_b, warps_b, _ = op.bwd_config(short)
    readings = [  # pass, width, the kernel, against, what it adds
        ("forward", short, "hint only", "lesson", "the eviction hint"),
        ("forward", short, "package", "hint only", f"{rows_f} rows, {warps_f} warps"),
        ("forward", mid, "package", "lesson", "the eviction hint"),
        ("forward", long_h, "package", "lesson", "the chunked kernel"),
        ("backward", short, "package", "lesson", f"{rows_b} rows a step, {warps_b} warps"),
        ("backward", mid, "package", "lesson", "its kernel on the lesson's launch"),
        ("backward", long_h, "package", "lesson", "the chunked kernels"),
    ]
    return [
        (p, h, a, adds, speedup(*(steps.one(hidden=h, impl=k, **{"pass": p}) for k in (a, b))))
        for p, h, a, b, adds in readings
    ]


def additions_table(steps: Any, hidden: Sequence[int]) -> Any:
    """What each of the package's additions buys, as a ratio of speeds with its spread."""
    from ..tables import Table

    cells = [
        [p, h, adds, f"{c.ratio:.2f} ({c.low:.2f}-{c.high:.2f})", verdict(c)]
        for p, h, _, adds, c in _additions(steps, hidden)
    ]
    return Table(["pass", "H", "adds", "speed ratio (spread)", "verdict"], cells)


def additions_claims(steps: Any, hidden: Sequence[int], tol: float) -> dict[str, Any]:
    """The claims of a steps record, for ``check_all``: the chunked kernels beat the
    lesson's and are the largest step, and every kernel is right to ``tol``."""
    long_h = hidden[-1]
    found = _additions(steps, hidden)
    claims: dict[str, Any] = {
        f"The chunked {p} beats the lesson's": c for p, h, _, _, c in found if h == long_h
    }
    chunked = min(c.ratio for _, h, _, _, c in found if h == long_h)
    rest = [c.ratio for _, h, _, _, c in found if h != long_h]
    worst = _largest_error(steps)
    claims["The chunked kernels are the largest step"] = chunked > max(rest)
    claims["Every kernel timed is right to tolerance"] = (worst <= tol, _to_tol(worst, tol))
    return claims


def say_long_rows(h: int, threads: int, need: int, most: float) -> Any:
    """Why whole-row kernels fail at ``h`` columns: ``need`` values a thread of
    ``threads`` against the ``most`` registers each may use."""
    from ..prose import say

    return say(
        "At {h} columns a program has {t} threads, so each may use at most {b:.0f} "
        "registers; the backward needs {v} values a thread (shares of ``x``, ``dy``, "
        "``w`` and ``dw``), the forward half as many.  The package hands rows longer "
        "than {fc} columns (forward) and {bc} (backward) to chunked kernels.",
        fc=op.FWD_CHUNKED_THRESHOLD,
        bc=op.BWD_CHUNKED_THRESHOLD,
        h=h,
        t=threads,
        b=most,
        v=need,
    )


def against_torch(vs: Any, r: Mapping[str, Any]) -> Any:
    """A tilebook row of a :func:`versus` record against ``F.rms_norm``'s at its size."""
    from ..claims import speedup

    return speedup(r, vs.one(hidden=r["hidden"], impl="F.rms_norm", **{"pass": r["pass"]}))


def versus_table(vs: Any) -> Any:
    """tilebook's speed in a :func:`versus` record, and its ratio to ``F.rms_norm``'s."""
    from ..tables import table

    columns: dict[str, Any] = {"pass": "pass", "H": "hidden", "tilebook GB/s": rate}
    columns["vs F.rms_norm"] = lambda r: (
        f"{against_torch(vs, r).ratio:.2f} ({verdict(against_torch(vs, r))})"
    )
    return table(vs.rows, columns, where={"impl": "tilebook"}, caption=vs.caption())


def versus_claims(vs: Any, hidden: Sequence[int], tol: float) -> dict[str, Any]:
    """The claims of a :func:`versus` record, for ``check_all``."""
    claims: dict[str, Any] = {
        f"tilebook's forward beats F.rms_norm's at {h}": against_torch(
            vs, vs.one(impl="tilebook", hidden=h, **{"pass": "forward"})
        )
        for h in hidden
    }
    worst = _largest_error(vs)
    claims["Both compute the same, to bf16 tolerance"] = (worst <= tol, _to_tol(worst, tol))
    return claims


def say_autograd(vs: Any, steps: Any, mid: int, hidden: Sequence[int]) -> Any:
    """The package's backward through autograd against its launcher alone at ``mid``
    columns, and against ``F.rms_norm``'s backward at each width."""
    from ..claims import speedup
    from ..prose import say

    pick = {"hidden": mid, "pass": "backward"}
    c = speedup(vs.one(impl="tilebook", **pick), steps.one(impl="package", **pick))
    vs_torch = {
        h: against_torch(vs, vs.one(impl="tilebook", **pick | {"hidden": h})) for h in hidden
    }
    return say(
        "At {mid} columns the package's backward through autograd runs at {r:.2f} times "
        "the speed of its launcher alone (spread {lo:.2f} to {hi:.2f}: {v}).  Against "
        "``F.rms_norm``'s backward it is {w}.",
        mid=mid,
        r=c.ratio,
        lo=c.low,
        hi=c.high,
        v=verdict(c),
        w="; ".join(f"{verdict(v)} at {h}" for h, v in vs_torch.items()),
    )


def cost(r: Mapping[str, Any]) -> dict[str, float]:
    """Each output's error over what rounding the exact answer to the dtype costs."""
    return {k: r[f"err_{k}"] / r[f"floor_{k}"] for k in ("y", "dx", "dw")}


def explorer_setup(accuracy: Any, impls: Sequence[str]) -> dict[str, Any]:
    """The settings of lesson 11's :class:`~tilebook.course.widgets.SweepExplorer` of
    an accumulate record but its rows: speed by width and accumulator (``impls``)."""
    return {
        "knobs": ["hidden", "impl"],
        "metric": "gbps",
        "unit": "GB/s",
        "labels": {"hidden": "hidden size", "impl": "accumulate in"},
        "order": {"impl": list(impls)},
        "title": "rms_norm training step: row length and accumulator",
        "caption": accuracy.caption(),
        "ceiling": accuracy.provenance["copy_gbps"],
        "wrong": "wrong",
        "note": "note",
        "extra": "extra",
    }


def _accumulated(accuracy: Any, hidden: Sequence[int]) -> tuple[dict, dict]:
    """Per (width, accumulator): the worst :func:`cost`; per width: how much less
    accurate ``dw`` is with bf16 sums than with fp32 ones."""
    by = {(r["hidden"], r["impl"]): r for r in accuracy.rows}
    worst = {key: max(cost(r).values()) for key, r in by.items()}
    ratio = {h: by[h, "bf16"]["err_dw"] / by[h, "fp32"]["err_dw"] for h in hidden}
    return worst, ratio


def accumulate_claims(
    accuracy: Any, hidden: Sequence[int], chain: Mapping[int, float], wrong: float, tol: float
) -> dict[str, Any]:
    """The claims of an accumulate record, for ``check_all``; ``chain``: rows a
    program adds at each width; ``wrong``: the cost past which a result is wrong."""
    worst, ratio = _accumulated(accuracy, hidden)
    most, least = max(chain, key=chain.get), min(chain, key=chain.get)
    largest = _largest_error(accuracy)
    return {
        "bf16 sums are wrong at every width, fp32 sums at none": all(
            worst[h, "bf16"] > wrong >= worst[h, "fp32"] for h in hidden
        ),
        "Every error is below bf16's tolerance": (largest <= tol, _to_tol(largest, tol)),
        "dw suffers least where programs add the fewest rows": (
            ratio[most] > ratio[least] == min(ratio.values())
        ),
    }


def say_accumulate(accuracy: Any, hidden: Sequence[int], tol: float) -> Any:
    """What accumulating in bf16 costs in accuracy and buys in speed, and the trap."""
    from ..claims import speedup
    from ..prose import say

    _, mid, long_h = hidden
    worst, ratio = _accumulated(accuracy, hidden)
    by = {(r["hidden"], r["impl"]): r for r in accuracy.rows}
    speed = {h: verdict(speedup(by[h, "bf16"], by[h, "fp32"])) for h in (mid, long_h)}
    return say(
        "With fp32 sums every output is within {f:.2f} times the error of rounding the "
        "exact answer.  With bf16 sums ``dw`` is {lo:.1f} to {hi:.1f} times less accurate "
        "than with fp32, least where each program adds the fewest rows.  In speed the "
        "bf16 version is {v} at {mid} columns, and {v2} at {h} where the kernels spill.  "
        "That is the trap: every one of these errors is below tilebook's bf16 tolerance, "
        "{tol:.1e}, so a test that checks only a tolerance passes the kernel.  Compare "
        "against float64 *and* against what rounding costs.",
        f=max(worst[h, "fp32"] for h in hidden),
        lo=min(ratio.values()),
        hi=max(ratio.values()),
        mid=mid,
        h=long_h,
        tol=tol,
        v=speed[mid],
        v2=speed[long_h],
    )
