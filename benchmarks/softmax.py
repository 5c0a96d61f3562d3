"""Softmax on a GPU: tilebook against torch.softmax and torch.compile, bf16, large tensors.

The measurements are lesson 10's, defined once in
:mod:`tilebook.course.experiments.softmax` (each implementation checked against float64
before it is timed, interleaved rounds, bytes counted once: the forward reads x
and writes y, the backward reads y and dy and writes dx); this benchmark runs
them with more rounds, at the shapes of its targets.  Every input is at least
256 MB so that the figures measure HBM, not L2.

    PYTHONPATH=src python benchmarks/softmax.py            # table, ratio vs best baseline
    PYTHONPATH=src python benchmarks/softmax.py --sweep    # time candidate configurations
    PYTHONPATH=src python benchmarks/softmax.py --tune     # sweep, use the winners, benchmark
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import tilebook
from tilebook.course.bench import copy_bandwidth, measure
from tilebook.course.experiments import softmax as experiment
from tilebook.ops import softmax as sm

TIMING = {"rounds": 5, "warmup": 25, "rep": 100}
# (rows, cols); 2**27 bf16 elements is 256 MB, the last shape is 512 MB.
SHAPES = [
    (524288, 256),
    (262144, 512),
    (131072, 1024),
    (65536, 2048),
    (32768, 4096),
    (16384, 8192),
    (8192, 16384),
    (8192, 32768),
]
QUICK_SHAPES = [(131072, 1024), (32768, 4096), (8192, 32768)]


def _shape(m: int, n: int) -> str:
    return f"{m}x{n}"


def run(quick: bool = False) -> list[dict]:
    """Check, then time, forward and backward of the three implementations on a GPU."""
    if not tilebook.is_gpu():
        raise RuntimeError("benchmarks/softmax.py needs a CUDA GPU")
    shapes = QUICK_SHAPES if quick else SHAPES
    rows = [{**r, "kernel": "softmax_fwd"} for r in experiment.forward(shapes, **TIMING)]
    rows += [{**r, "kernel": "softmax_bwd"} for r in experiment.backward(shapes, **TIMING)]
    return rows


def table(rows: list[dict]) -> str:
    """One line per kernel and shape: GB/s of each implementation, ratio vs the best baseline."""
    head = f"{'kernel':<12} {'shape':>12} {'tilebook':>9} {'torch':>9} {'compile':>9} {'ratio':>6}"
    out = [head + "  (GB/s; ratio = best baseline time / tilebook time)"]
    keys = dict.fromkeys((r["kernel"], r["shape"]) for r in rows)
    for kernel, shape in keys:
        by = {r["impl"]: r for r in rows if r["kernel"] == kernel and r["shape"] == shape}
        best = min(by[i]["median_ms"] for i in ("torch", "torch.compile") if i in by)
        ratio = best / by["tilebook"]["median_ms"]
        gb = [f"{by[i]['gbps']:9.0f}" if i in by else f"{'-':>9}" for i in
              ("tilebook", "torch", "torch.compile")]  # fmt: skip
        out.append(f"{kernel:<12} {shape:>12} {' '.join(gb)} {ratio:6.2f}")
    return "\n".join(out)


# ------------------------------------------------------------------------- the sweep


# Per row length: (rows per tile, num_warps) for the single-pass kernels (a third
# item "reload": the backward reads its rows again for dx), or
# ("online", chunk, num_warps, ctas_per_sm).  Each is timed with both L2 policies.
_FWD_CANDIDATES: dict[int, list[tuple]] = {
    256: [(64, 16), (64, 8), (32, 8), (32, 4), (16, 4), (16, 2), (8, 2)],
    512: [(16, 8), (32, 8), (8, 4), (16, 4), (8, 2), (4, 2)],
    1024: [(8, 8), (16, 8), (4, 4), (8, 4), (4, 2), (2, 2)],
    2048: [(4, 8), (8, 8), (2, 4)],
    4096: [(2, 16), (1, 4), (1, 8)],
    8192: [(1, 16), (1, 8), ("online", 4096, 8, None)],
    16384: [(1, 16), (1, 32), ("online", 4096, 8, None)],
    32768: [
        (1, 16),
        (1, 32),
        ("online", 8192, 8, 4),
        ("online", 8192, 16, None),
        ("online", 4096, 8, None),
    ],
}
_BWD_CANDIDATES: dict[int, list[tuple]] = {
    256: [(32, 16), (32, 8), (16, 8), (16, 4)],
    512: [(16, 16), (16, 8), (8, 4), (8, 8)],
    1024: [(8, 16), (8, 8), (4, 8)],
    2048: [(4, 16), (4, 8), (2, 8)],
    4096: [(2, 16), (1, 8), (2, 8), (4, 16)],
    8192: [(1, 32), (1, 16), (1, 8)],
    16384: [
        (1, 16),
        (1, 32),
        (1, 16, "reload"),
        ("online", 8192, 16, 2),
        ("online", 8192, 16, None),
        ("online", 4096, 8, None),
    ],
    32768: [
        (1, 8, "reload"),
        (1, 16, "reload"),
        (1, 32, "reload"),
        ("online", 8192, 16, 2),
        ("online", 8192, 16, None),
        ("online", 8192, 8, None),
        ("online", 4096, 8, None),
        ("online", 4096, 16, None),
        ("online", 4096, 4, None),
        ("online", 2048, 8, None),
        ("online", 2048, 4, None),
        ("online", 16384, 32, None),
    ],
}


def _candidates(n: int, backward: bool) -> list[sm.SoftmaxConfig]:
    """Configurations worth timing for rows of n elements (n a power of two)."""
    out = []
    for spec in (_BWD_CANDIDATES if backward else _FWD_CANDIDATES)[n]:
        for evict in ("", "evict_first", "evict_last"):
            if spec[0] == "online":
                _, chunk, warps, ctas = spec
                out.append(sm.SoftmaxConfig(1, chunk, warps, 1, True, ctas, evict))
            else:
                reload = spec[2:] == ("reload",)
                out.append(sm.SoftmaxConfig(spec[0], n, spec[1], evict=evict, reload=reload))
    return out


def _literal(cfg: sm.SoftmaxConfig) -> str:
    """The config as it is written in the tables of tilebook/ops/softmax.py."""
    extra = "".join(
        f", {k}={v!r}"
        for k, v in (
            ("online", cfg.online),
            ("ctas_per_sm", cfg.ctas_per_sm),
            ("evict", cfg.evict),
            ("reload", cfg.reload),
        )
        if v != sm.SoftmaxConfig.__dataclass_fields__[k].default
    )
    return f"_C({cfg.block_m}, {cfg.block_n}, {cfg.num_warps}{extra})"


def _sweep_width(n: int, deadline: float) -> tuple[list[dict], dict[str, sm.SoftmaxConfig]]:
    m = 2**27 // n
    shape = _shape(m, n)
    x, dy = experiment.inputs(m, n)
    nbytes = x.numel() * x.element_size()
    y_ref = torch.softmax(x, -1)
    dx_ref = experiment.torch_backward(dy, y_ref).float()
    comp_f = experiment.compiled(lambda t: torch.softmax(t, -1))
    comp_b = experiment.compiled(experiment.torch_backward)
    base = {
        ("fwd", "torch"): lambda: torch.softmax(x, -1),
        ("fwd", "torch.compile"): lambda: comp_f(x),
        ("bwd", "torch"): lambda: experiment.torch_backward(dy, y_ref),
        ("bwd", "torch.compile"): lambda: comp_b(dy, y_ref),
    }
    rows: list[dict] = []
    best_base: dict[str, float] = {}
    for (d, impl), fn in base.items():
        t = measure(fn, warmup=10, rep=40).median_ms
        best_base[d] = min(best_base.get(d, float("inf")), t)
        rows.append({"dir": d, "n": n, "impl": impl, "ms": t})
    best: dict[str, sm.SoftmaxConfig] = {}
    for d in ("fwd", "bwd"):
        timed = []
        out = torch.empty_like(x)
        for cfg in _candidates(n, backward=d == "bwd"):
            if time.time() > deadline:
                print(f"sweep: out of time, skipping the rest of {d} n={n}", flush=True)
                break
            if d == "fwd":
                fn = lambda cfg=cfg, out=out: sm.launch_softmax_forward(x, out, cfg)
                ok = (fn().float() - y_ref.float()).abs().max().item() < 1e-2
            else:
                fn = lambda cfg=cfg, out=out: sm.launch_softmax_backward(y_ref, dy, out, cfg)
                err = (fn().float() - dx_ref).abs().max().item()
                ok = err < 2e-2 * dx_ref.abs().max().item()
            t = measure(fn, warmup=10, rep=40).median_ms
            rows.append({"dir": d, "n": n, "impl": _literal(cfg), "ms": t, "ok": ok})
            if ok:
                timed.append((t, cfg, fn))
        # The front runners are often within noise: time them again, for longer.
        timed.sort(key=lambda r: r[0])
        final = sorted((measure(fn, rep=150).median_ms, cfg) for _, cfg, fn in timed[:3])
        moved = (2 if d == "fwd" else 3) * nbytes
        print(f"{d} {shape}: torch/compile best {best_base[d]:.4f} ms "
              f"{moved / best_base[d] / 1e6:.0f} GB/s", flush=True)  # fmt: skip
        for t, cfg in final:
            print(f"  {_literal(cfg):<58} {t:7.4f} ms {moved / t / 1e6:5.0f} GB/s "
                  f"x{best_base[d] / t:4.2f}", flush=True)  # fmt: skip
        if final:
            best[d] = final[0][1]
    return rows, best


def sweep(
    budget_s: float = 330.0, widths: list[int] | None = None
) -> tuple[list[dict], dict[tuple[str, int], sm.SoftmaxConfig]]:
    """Time every candidate configuration per row length; return the rows and the winners."""
    deadline = time.time() + budget_s
    rows: list[dict] = []
    best: dict[tuple[str, int], sm.SoftmaxConfig] = {}
    # The long rows first: they are the hard cases, and the budget may run out.
    for n in widths or [32768, 16384, 8192, 256, 4096, 1024, 2048, 512]:
        if time.time() > deadline:
            break
        width_rows, width_best = _sweep_width(n, deadline)
        rows += width_rows
        best.update({(d, n): cfg for d, cfg in width_best.items()})
        torch.cuda.empty_cache()
    return rows, best


def install(best: dict[tuple[str, int], sm.SoftmaxConfig]) -> str:
    """Put the sweep's winners in tilebook's tables; return them as source to paste there."""
    lines = []
    for d, table in (("fwd", sm._FWD_TABLE), ("bwd", sm._BWD_TABLE)):
        lines.append(f"_{d.upper()}_TABLE = {{")
        for n in sorted(table):
            if (d, n) in best:
                table[n] = best[d, n]
            lines.append(f"    {n}: {_literal(table[n])},")
        lines.append("}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="three shapes only")
    p.add_argument("--sweep", action="store_true", help="time candidate configurations")
    p.add_argument("--tune", action="store_true", help="sweep, use the winners, then benchmark")
    p.add_argument("--budget", type=float, default=330.0, help="seconds the sweep may take")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    print(tilebook.banner(), flush=True)
    swept: list[dict] = []
    rows: list[dict] = []
    if args.sweep or args.tune:
        swept, best = sweep(args.budget)
        print(install(best) if args.tune else "", flush=True)
    if not args.sweep:
        rows = run(quick=args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sweep": swept, "bench": rows}, f, indent=1)
    if not args.sweep:
        print(f"device copy ceiling: {copy_bandwidth().gbps:.0f} GB/s")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
