"""Matrix multiplication against cuBLAS: lesson 09 and ``benchmarks/matmul.py``.

::

    rows = versus_cublas([(4096, 4096, 4096), (4095, 4097, 4093)])

Each product is checked against float64 (on its first rows) before
:func:`tilebook.matmul` and ``torch.matmul`` are timed in interleaved rounds.

Below it, what lesson 09 says of its records, on any machine: the tables
(``*_table``), the claims (``*_claims``, for
:meth:`tilebook.course.claims.Claims.check_all`), the sentences (``say_*``) and its
explorer's settings, so that the lesson shows each in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .. import bench
from ..claims import speedup
from ..prose import say
from ..tables import table

__all__ = [
    "CHECK_ROWS",
    "layer_claims",
    "operands",
    "order_claims",
    "order_explorer",
    "say_balance",
    "say_layer",
    "say_order",
    "say_other_paths",
    "say_pruned",
    "say_tuned",
    "sizes_claims",
    "sizes_table",
    "verdict",
    "versus_cublas",
]

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


# What lesson 09 says of its records.  A record may be None (no GPU has measured
# it yet): the tables and sentences then say so, and the claims are not checked.

RAGGED, SQUARE = "4095x4097x4093", "4096x4096x4096"


def verdict(s: Any) -> str:
    """A comparison's verdict for a sentence: faster than, slower than, tied with."""
    return "faster than" if s.faster else "slower than" if s.slower else "tied with"


def say_balance(tile_flops_per_byte: float) -> Any:
    """A tile's operations per loaded byte against the build GPU's balance point."""
    from ..datasheet import build_fact

    peak, bandwidth = build_fact("bf16_dense"), build_fact("memory_bandwidth")
    return say(
        "A 128 x 256 tile does {tile:.0f} operations per bf16 byte it loads; the {gpu} "
        "does {balance:.0f} in the time its memory delivers one byte.",
        tile=tile_flops_per_byte,
        gpu=peak.gpu,
        balance=peak.si / bandwidth.si,
    )


def order_explorer(sweep: Any, tiles: Sequence[str], orders: Sequence[str]) -> dict[str, Any]:
    """The order sweep's :class:`~tilebook.course.widgets.SweepExplorer` settings, but
    its rows."""
    return {
        "knobs": ["tile", "order"],
        "metric": "tflops",
        "unit": "TFLOP/s",
        "labels": {"tile": "BLOCK_M x BLOCK_N"},
        "order": {"tile": list(tiles), "order": list(orders)},
        "title": "matmul 8192 cubed, bf16: tile shape and program order",
        "caption": sweep.caption(),
        "initial": {"tile": "128x256", "order": "grouped"},
        "extra": "model",
        "note": "why",
    }


def order_claims(sweep: Any, tiles: Sequence[str], orders: Sequence[str]) -> dict[str, Any]:
    """That the 64x64 tiles are the slowest in each order, on the sweep."""
    by = {(r["tile"], r["order"]): r for r in sweep.rows} if sweep else {}
    return {
        f"{order}: the 64x64 tiles are the slowest": lambda order=order: (
            min(tiles, key=lambda t: by[t, order]["tflops"]) == "64x64"
        )
        for order in orders
    }


def say_order(sweep: Any, tiles: Sequence[str]) -> Any:
    """What grouping does for each tile, on the sweep."""
    if sweep is None:
        return say("There is no record to read.")
    by = {(r["tile"], r["order"]): r for r in sweep.rows}
    found = []
    for tile in tiles:
        s = speedup(by[tile, "grouped"], by[tile, "row-major"])
        found.append(
            f"{tile}, grouped is {verdict(s)} row-major ({s.evidence('grouped', 'row-major')})"
        )
    return say("With {found}.", found="; with ".join(found))


def say_pruned() -> Any:
    """How many configurations the package's pruner leaves at three sizes."""
    from ...ops import matmul as mm

    tried = {
        name: len(mm.prune_configs(mm.GPU_PTR_CONFIGS, n, n, n, elem))
        for name, n, elem in [("big16", 8192, 2), ("big32", 8192, 4), ("small", 512, 2)]
    }
    return say(
        "Of the package's {total} pointer-kernel configurations it tries {big16} at 8192 "
        "cubed in bf16, {big32} in float32 and {small} at 512 cubed.",
        total=len(mm.GPU_PTR_CONFIGS),
        **tried,
    )


def say_tuned(config: str, c: torch.Tensor, exact: torch.Tensor) -> Any:
    """The configuration the autotuner ran, and how close its product ``c`` is."""
    return say(
        "The autotuner ran {cfg}; the product is within {err:.1e} of float64.",
        cfg=config,
        err=((c.double() - exact).norm() / exact.norm()).item(),
    )


def _against_cublas(sizes: Any, row: Mapping[str, Any]) -> dict[str, Any]:
    theirs = sizes.one(shape=row["shape"], impl="cuBLAS")
    s = speedup(row, theirs)
    vs_cublas = {"cublas": theirs["tflops"], "ratio": s.ratio, "low": s.low}
    return {**row, **vs_cublas, "high": s.high, "verdict": verdict(s).split()[0]}


def sizes_table(sizes: Any) -> Any:
    """tilebook against cuBLAS at each shape, with the speed ratio's spread."""
    if sizes is None:
        return "No committed GPU record of this comparison yet: nothing to show."
    return table(
        [_against_cublas(sizes, r) for r in sizes.select(impl="tilebook")],
        {
            "shape": "shape",
            "tilebook TFLOP/s": ("tflops", "{:.0f}"),
            "cuBLAS TFLOP/s": ("cublas", "{:.0f}"),
            "speed ratio": ("ratio", "{:.3f}x"),
            # a non-breaking hyphen: a range cut in two reads as two numbers
            "its spread": lambda r: f"{r['low']:.3f}\u2011{r['high']:.3f}x",
            "tilebook": "verdict",
            "config": "config",
        },
        caption=sizes.caption(),
    )


def _hopper(record: Any) -> bool:
    """Whether the record's runs took the Hopper paths (wgmma, TMA)."""
    return str(record.paths).startswith("9")


def sizes_claims(sizes: Any) -> dict[str, Any]:
    """The claims on the ragged shape: cuBLAS's, and tilebook's where the Hopper
    kernel and its copies ran."""
    one = lambda **kw: sizes.one(shape=RAGGED, **kw)

    def slow_cublas():
        rg, sq = one(impl="cuBLAS"), sizes.one(shape=SQUARE, impl="cuBLAS")
        return rg["tflops"] < 0.5 * sq[
            "tflops"
        ], f"{rg['tflops']:.0f} against {sq['tflops']:.0f} TFLOP/s"

    said = {"cuBLAS: the ragged shape, under half of 4096 cubed": slow_cublas}
    if sizes is not None and _hopper(sizes):
        s = speedup(one(impl="tilebook"), one(impl="cuBLAS"))
        said["tilebook, the copies included, is faster on it"] = (
            s.faster,
            s.evidence("tilebook", "cuBLAS"),
        )
    return said


def say_other_paths(sizes: Any) -> Any:
    """On a GPU other than Hopper, how the ragged shape went; None on Hopper."""
    if sizes is None or _hopper(sizes):
        return None
    s = speedup(sizes.one(shape=RAGGED, impl="tilebook"), sizes.one(shape=RAGGED, impl="cuBLAS"))
    return say(
        "These figures took the paths of compute capability {paths}, without the "
        "Hopper kernel and its copies: on the ragged shape tilebook ran {how} "
        "against cuBLAS ({ev}).",
        paths=sizes.paths,
        how="faster" if s.faster else "slower" if s.slower else "level",
        ev=s.evidence("tilebook", "cuBLAS"),
    )


def _layer(layer: Any) -> tuple[Any, Any]:
    fused, pair, alone = (layer.one(impl=i) for i in ("tilebook", "unfused", "F.linear"))
    return speedup(fused, pair), speedup(fused, alone)


def say_layer(layer: Any) -> Any:
    """The fused linear layer against the unfused pair and ``F.linear`` alone."""
    if layer is None:
        return say("There is no committed GPU record of this comparison yet.")
    s1, s2 = _layer(layer)
    return say(
        "For 8192 tokens through a 4096-to-4096 layer with GELU, tilebook.linear_act "
        "is {v1} the unfused pair ({e1}), and {v2} ``F.linear`` with no activation "
        "({e2}).",
        v1=verdict(s1),
        e1=s1.evidence("fused", "the pair"),
        v2=verdict(s2),
        e2=s2.evidence("fused", "F.linear"),
    )


def layer_claims(layer: Any) -> dict[str, Any]:
    """The claim on the fused layer, where wgmma ran on both sides; else none."""
    if layer is None or not _hopper(layer):  # elsewhere, the sentence says it
        return {}
    return {"the fused layer is not slower than the pair": not _layer(layer)[0].slower}
