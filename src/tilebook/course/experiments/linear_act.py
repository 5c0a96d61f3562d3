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

Lesson 08's reading of its record (its table, claims, sentences and widget) is here
too, each a function the lesson calls in one line: :func:`fusion_table`,
:func:`read_fusion`, :func:`fusion_knobs`, :func:`read_depth`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .. import bench

__all__ = [
    "CHECK_ROWS",
    "COUNT_COLUMNS",
    "ERF",
    "SHOWN_ACTIVATIONS",
    "TORCH_ACT",
    "WAYS",
    "against_fastest",
    "computes",
    "fusion_knobs",
    "fusion_table",
    "gelu_cost_said",
    "headline",
    "layer",
    "layer_versus",
    "read_depth",
    "read_fusion",
    "reference",
    "rel_err",
    "tile_said",
    "traffic",
    "traffic_said",
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


# ----------------------------------------------------------------- lesson 08's reading
# What lesson 08 says of its fusion record (:func:`layer_versus` rows, ``sweep`` "act"
# at one layer, "K" across inner dimensions): its tables, claims, sentences and widget,
# each made here once so that the lesson shows them in one line.

#: The way that names lesson 08's first kernel, the erf GELU, in its record.
ERF = "fused, erf GELU"
#: The lesson's ways, in the widget's order.
WAYS = ["fused", "unfused, Triton pass", "unfused, PyTorch"]
#: The activations as the lesson's table and widget show them (the erf GELU apart).
SHOWN_ACTIVATIONS = ["none", "relu", "gelu", "gelu (erf)", "gelu_tanh", "silu"]
#: Columns of the table of epilogue instruction counts (rows from the lesson's
#: ``epilogue_counts``: ``activation``, ``SASS``, ``per``, ``MUFU``, ``registers``,
#: ``spilled``).
COUNT_COLUMNS: dict[str, Any] = {
    "activation": "activation",
    "SASS from that line": "SASS",
    "per value": ("per", "{:.1f}"),
    "MUFU": "MUFU",
    "registers": "registers",
    "bytes spilled": "spilled",
}


def traffic_said(layer: tuple[int, int, int], elem: int = 2):
    """The sentence that counts the bytes of ``layer`` (``(M, N, K)``) fused and unfused
    (:func:`traffic`), and the product's operations per byte against the balance of
    the GPU this page speaks for (its datasheet's bf16 peak over its bandwidth)."""
    from ..datasheet import build_fact
    from ..prose import say

    m, n, k = layer
    fused, unfused = (traffic(m, n, k, elem, passes=p) for p in (0, 2))
    peak, bandwidth = build_fact("bf16_dense"), build_fact("memory_bandwidth")
    return say(
        "For {layer[0]} tokens through a {layer[2]}-to-{layer[1]} layer in bf16, a "
        "fused kernel moves {fused:.0f} MiB and the unfused pair {unfused:.0f} MiB.  "
        "The product does {ops:.0f} floating-point operations per byte it must move, "
        "where the tensor cores of the {gpu} can do {balance:.0f} in the time its memory "
        "moves one.",
        layer=layer,
        fused=fused / 2**20,
        unfused=unfused / 2**20,
        ops=2 * m * n * k / fused,
        gpu=peak.gpu,
        balance=peak.si / bandwidth.si,
    )


def tile_said(tile: tuple[int, int], per_thread: int, max_k: int):
    """What a program of ``tile`` holds: ``per_thread`` float32 values a thread, and the
    shared memory of its two bf16 input tiles at ``K`` = ``max_k``."""
    from ..prose import say

    return say(
        "On a GPU a program holds a {tile} tile: {per} float32 values a thread.  At "
        "``K`` = {k} its two bf16 input tiles take {kib:.0f} KiB of shared memory.",
        tile="{} x {}".format(*tile),
        per=per_thread,
        k=max_k,
        kib=(tile[0] + tile[1]) * max_k * 2 / 1024,
    )


def gelu_cost_said(counts: Mapping[str, Mapping[str, Any]]):
    """The erf GELU's instructions a value, against SiLU's (``counts`` by activation)."""
    from ..prose import say

    return say(
        "The erf GELU costs {gelu:.1f} instructions a value, {ratio:.1f} times SiLU's.",
        gelu=counts["gelu"]["per"],
        ratio=counts["gelu"]["per"] / counts["silu"]["per"],
    )


def headline(record: Any) -> list[dict[str, Any]]:
    """The rows of ``record``'s sweep over activations, the first kernel's erf GELU
    shown as activation ``"gelu (erf)"`` of way ``"fused"``."""
    if record is None:
        return []
    return [
        {**r, "activation": "gelu (erf)", "impl": "fused"} if r["impl"] == ERF else r
        for r in record.select(sweep="act")
    ]


def fusion_table(record: Any):
    """The activations at the lesson's layer: bytes each way moves, its time, the time
    those bytes would take at the copy bandwidth measured in the same run, GB/s."""
    from ..tables import table

    if record is None:
        return "No committed GPU record of this sweep yet: nothing to show."
    copy_gbps = record.provenance["copy_gbps"]
    columns = {
        "activation": "activation",
        "way": "impl",
        "MiB moved": lambda r: f"{r['bytes'] / 2**20:.0f}",
        "time (µs)": lambda r: f"{r['median_ms'] * 1e3:.1f}",
        "at copy (µs)": lambda r: f"{r['bytes'] / (copy_gbps * 1e3):.1f}",
        "GB/s": ("gbps", "{:,.0f}"),
    }
    return table(headline(record), columns, caption=record.caption())


def _verdict(c: Any) -> str:
    return "faster than" if c.faster else "slower than" if c.slower else "tied with"


def read_fusion(record: Any, claims: Any):
    """Check ``claims`` (a :class:`~tilebook.course.claims.Claims` on ``record``) that
    the fused kernel beats both unfused ways for every activation, and return the
    paragraph that holds the prediction (times follow bytes) against the record."""
    from ..claims import speedup
    from ..prose import say

    if record is None:
        return say("There is no record to compare the prediction with.")
    by = {(r["activation"], r["impl"]): r for r in headline(record)}
    what = {
        "unfused, Triton pass": "the same kernel plus a Triton pass",
        "unfused, PyTorch": "cuBLAS plus PyTorch's pass",
    }
    for act in ("relu", "gelu", "gelu_tanh", "silu"):
        for way, said in what.items():
            s = speedup(by[act, "fused"], by[act, way])
            claims.check(f"{act}: fused beats {said}", s.faster, s.evidence("fused", way))
    pair, one, gelu = by["relu", "unfused, Triton pass"], by["relu", "fused"], by["gelu", "fused"]
    s1, s2 = speedup(gelu, by["gelu (erf)", "fused"]), speedup(gelu, by["none", "fused"])
    copy_gbps = record.provenance["copy_gbps"]
    return say(
        "With ReLU the unfused pair takes {ratio:.1f} times as long as the fused "
        "kernel, where the bytes alone predict {bytes:.1f}: the fused kernel moves "
        "its bytes at {frac:.0%} of the copy bandwidth, the pair at {pair:.0%}.  "
        "Fused, the fitted GELU is {v1} the erf form ({e1}) and {v2} no activation "
        "at all ({e2}).",
        ratio=pair["median_ms"] / one["median_ms"],
        bytes=pair["bytes"] / one["bytes"],
        frac=one["gbps"] / copy_gbps,
        pair=pair["gbps"] / copy_gbps,
        v1=_verdict(s1),
        e1=s1.evidence("fitted", "erf"),
        v2=_verdict(s2),
        e2=s2.evidence("GELU", "none"),
    )


def computes(row: Mapping[str, Any]) -> str:
    """What a row of :func:`headline` computes: its activation, the erf GELU as GELU."""
    return "gelu" if row["activation"] == "gelu (erf)" else row["activation"]


def against_fastest(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each row's time over that of the fastest row computing the same thing
    (:func:`computes`): F.linear alone, the fastest of all, judges only ``none``."""
    fastest: dict[str, float] = {}
    for r in rows:
        c = computes(r)
        fastest[c] = min(fastest.get(c, r["median_ms"]), r["median_ms"])
    return [r["median_ms"] / fastest[computes(r)] for r in rows]


def _why(r: Mapping[str, Any]) -> str:
    if r["activation"] == "gelu (erf)":
        return "the first kernel's erf GELU: one store of Y, more instructions a value"
    if r["impl"] == "fused" and r["activation"] == "none":
        return "the product and bias of F.linear, by this lesson's one-block kernel"
    if r["impl"] == "fused":
        return "one store of Y; the activation runs in registers"
    if r["activation"] == "none":
        return "F.linear alone: cuBLAS adds the bias in its own epilogue"
    return "Y goes to memory, comes back and goes again: two extra trips"


def fusion_knobs(record: Any, *, slow: float) -> dict[str, Any] | None:
    """The arguments of lesson 08's :class:`~tilebook.course.widgets.SweepExplorer`
    (None without a record): pick an activation and a way; the readout is the way's
    time over the fastest way computing the same (:func:`against_fastest`, lower is
    better), a way below ``slow`` of that one's speed flagged slow."""
    if record is None:
        return None
    rows = headline(record)
    knob_rows = [
        dict(
            r,
            vs=v,
            why=_why(r),
            moved=f"{r['median_ms'] * 1e3:.1f} µs, {r['bytes'] / 2**20:.0f} MiB moved",
        )
        for r, v in zip(rows, against_fastest(rows), strict=True)
    ]
    return {
        "rows": knob_rows,
        "knobs": ["activation", "impl"],
        "metric": "vs",
        "unit": "× the fastest way's time",
        "better": "lower",
        "slow_fraction": slow,
        "labels": {"impl": "way"},
        "order": {"activation": SHOWN_ACTIVATIONS, "impl": WAYS},
        "title": "linear + activation, bf16: each way against the fastest way to compute the same",
        "caption": record.caption(),
        "initial": {"activation": "gelu", "impl": "unfused, PyTorch"},
        "note": "why",
        "extra": "moved",
    }


def read_depth(record: Any, claims: Any, sweep_k: Sequence[int], k: int):
    """Check ``claims`` about the sweep over ``K`` (``sweep_k``) of ``record``: fusion
    is worth less at the largest ``K``; whether it wins there; where ``F.linear``
    alone is faster than the fused kernel.  Returns the paragraph that says so, with
    the headline's two ways at ``K`` = ``k`` and no activation."""
    from ..claims import speedup
    from ..prose import say

    if record is None:
        return say("There is no record to read.")
    sweep_k = list(sweep_k)
    depth = {(r["K"], r["impl"]): r for r in record.select(sweep="K")}
    worth = {x: speedup(depth[x, "fused"], depth[x, "unfused, PyTorch"]) for x in sweep_k}
    floor = {x: speedup(depth[x, "F.linear alone"], depth[x, "fused"]) for x in sweep_k}
    lo, hi = worth[sweep_k[0]], worth[sweep_k[-1]]
    ends = f"{lo.evidence('fused', 'the pair')} and {hi.evidence('fused', 'the pair')}"
    claims.check(
        "fusion is worth less at the largest K than at the smallest", lo.ratio > hi.ratio, ends
    )
    outcome = "wins" if hi.faster else "loses" if hi.slower else "neither wins nor loses"
    claims.check(
        f"At the largest K fusion {outcome}: the fused kernel is {_verdict(hi)} the pair",
        {"wins": hi.faster, "loses": hi.slower}.get(outcome, hi.tied),
        hi.evidence("fused", "the pair"),
    )
    ahead = [x for x in sweep_k if floor[x].faster]
    listed = f"K = {', '.join(map(str, ahead))}"
    where = "every K" if ahead == sweep_k else listed if ahead else "no K"
    claims.check(
        "F.linear alone, with no activation, is faster than the fused kernel at " + where,
        all(floor[x].faster == (x in ahead) for x in sweep_k),
        "; ".join(f"K={x}: " + floor[x].evidence("F.linear", "fused") for x in sweep_k),
    )
    # The same computation on both sides: the headline's layer with no activation.
    by = {(r["activation"], r["impl"]): r for r in headline(record)}
    bare = speedup(by["none", "unfused, PyTorch"], by["none", "fused"])
    times = ""
    if ahead:
        ratios = [floor[x].ratio for x in ahead]
        times = f", {min(ratios):.1f} to {max(ratios):.1f} times its speed"
    so = ""
    if bare.faster:
        so = (
            ": cuBLAS computes the product faster than this one-block kernel, and "
            "fusion wins only where the pair's two extra trips of ``Y`` cost more "
            "than that"
        )
    return say(
        "At the largest ``K`` the fused kernel runs {r:.2f} times the speed of the "
        "unfused pair: fusion {outcome} there.  ``F.linear`` alone, the product and "
        "the bias without the activation, is faster than the fused kernel at {where}"
        "{times}.  With no activation on either side (the table above, ``K`` = {k}), "
        "``F.linear`` is {v} the kernel ({e}){so}.",
        r=hi.ratio,
        outcome=outcome,
        where=where,
        times=times,
        k=k,
        v=_verdict(bare),
        e=bare.evidence("F.linear", "the kernel"),
        so=so,
    )
