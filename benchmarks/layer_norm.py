"""LayerNorm benchmark: tilebook's kernels against F.layer_norm and torch.compile (GPU only).

Run from the repository root::

    PYTHONPATH=src python benchmarks/layer_norm.py            # the table
    PYTHONPATH=src python benchmarks/layer_norm.py --quick    # 16384x4096 only
    PYTHONPATH=src python benchmarks/layer_norm.py --tune     # sweep launch configs first
    PYTHONPATH=src python benchmarks/layer_norm.py --tune --apply  # ...and use the winners

Every shape holds 2**26 bf16 elements (128 MiB per tensor), cut into rows of 1024
to 16384.  Throughput is *effective* bandwidth: the bytes an ideal implementation
must move, the same count for every implementation, divided by the time.  Forward:
read x, write y.  Backward: read x and dy, write dx (the parameters, their
gradients and the per-row statistics are under 0.1% of it and not counted).
Implementations are timed in interleaved rounds (``measure_interleaved``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import triton

import tilebook
import tilebook.ops.layer_norm as op
from tilebook._launch import PLANS
from tilebook.course.bench import (
    benchmark_header,
    measure,
    measure_interleaved,
    save_benchmark,
)

EPS = 1e-5
DTYPE = torch.bfloat16
ELEMENTS = 2**26
#: The widths of the speed targets.
HIDDEN = (1024, 2048, 4096, 8192, 16384)

#: The ratio of each kernel is taken against the best of these.
BASELINE = {
    "layer_norm_fwd": ["torch", "torch.compile"],
    "layer_norm_bwd": ["torch", "torch.compile"],
}


def _torch_layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _tilebook_layer_norm(x, w, b):
    return op.layer_norm(x, w, b, EPS)


def _allow_recompiles() -> None:
    # One compiled graph per shape and per requires_grad setting: more than the
    # default cache limit, past which dynamo silently falls back to eager.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))


def _bytes(n_rows: int, n_cols: int, elem: int) -> tuple[int, int]:
    return 2 * n_rows * n_cols * elem, 3 * n_rows * n_cols * elem


def _inputs(n_rows, n_cols, dtype=DTYPE):
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
    w = (1 + 0.1 * torch.randn(n_cols, device="cuda")).to(dtype)
    b = (0.1 * torch.randn(n_cols, device="cuda")).to(dtype)
    return x, w, b


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def check_correctness(n_rows: int, n_cols: int, dtype: torch.dtype = DTYPE) -> dict[str, float]:
    """Max error of y, dx, dw and db relative to the largest reference value (float64)."""
    x, w, b = (t.requires_grad_() for t in _inputs(n_rows, n_cols, dtype))
    dy = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
    y = op.layer_norm(x, w, b, EPS)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    ref = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y64 = F.layer_norm(ref[0], (n_cols,), ref[1], ref[2], EPS)
    grads64 = torch.autograd.grad(y64, ref, dy.double())
    errs = {"y": _rel_err(y, y64)}
    errs |= {
        k: _rel_err(g, g64) for k, g, g64 in zip(("dx", "dw", "db"), grads, grads64, strict=True)
    }
    # bf16 keeps 8 significant bits (relative step 2**-8 = 0.004).
    bad = {k: v for k, v in errs.items() if not v <= 1e-2}
    if bad:
        raise AssertionError(f"layer_norm {n_rows}x{n_cols} {dtype}: errors too large: {bad}")
    return errs


def _row(kernel: str, n_rows: int, n_cols: int, impl: str, m) -> dict[str, Any]:
    return {
        "kernel": kernel,
        "shape": f"{n_rows}x{n_cols}",
        "dtype": str(DTYPE).removeprefix("torch."),
        "impl": impl,
        **m.as_row(),
    }


def bench_shape(n_rows: int, n_cols: int, impls: dict[str, Callable]) -> list[dict[str, Any]]:
    """Forward (no autograd) and backward (autograd.grad) of every implementation."""
    fwd_bytes, bwd_bytes = _bytes(n_rows, n_cols, torch.finfo(DTYPE).bits // 8)
    x, w, b = _inputs(n_rows, n_cols)
    dy = torch.randn_like(x)
    rows = []
    fwd = {impl: (lambda fn=fn: fn(x, w, b)) for impl, fn in impls.items()}
    for impl, m in measure_interleaved(fwd, bytes_moved=fwd_bytes).items():
        rows.append(_row("layer_norm_fwd", n_rows, n_cols, impl, m))
    bwd = {}
    for impl, fn in impls.items():
        xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
        y = fn(xg, wg, bg)
        bwd[impl] = lambda y=y, ts=(xg, wg, bg): torch.autograd.grad(y, ts, dy, retain_graph=True)
    for impl, m in measure_interleaved(bwd, bytes_moved=bwd_bytes).items():
        rows.append(_row("layer_norm_bwd", n_rows, n_cols, impl, m))
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Check correctness, then measure; one row per (kernel, shape, impl).  GPU only."""
    if not tilebook.is_gpu():
        raise RuntimeError("benchmarks/layer_norm.py needs a CUDA GPU")
    _allow_recompiles()
    impls = {
        "tilebook": _tilebook_layer_norm,
        "torch": _torch_layer_norm,
        "torch.compile": torch.compile(_torch_layer_norm, dynamic=False),
    }
    rows: list[dict[str, Any]] = []
    for n_cols in (4096,) if quick else HIDDEN:
        n_rows = ELEMENTS // n_cols
        errs = check_correctness(n_rows, n_cols)
        print(f"# {n_rows}x{n_cols} correct vs float64: " + ", ".join(
            f"{k} {v:.1e}" for k, v in errs.items()), flush=True)  # fmt: skip
        rows += bench_shape(n_rows, n_cols, impls)
    return rows


# ---------------------------------------------------------------------------
# Launch-config sweep (launchers only, no autograd)
# ---------------------------------------------------------------------------

#: Forward (rows per program, num_warps) by padded width; the first is the default.
FWD_CANDIDATES = {
    1024: [(1, 4), (2, 4), (4, 8), (4, 4), (8, 16)],
    2048: [(2, 8), (1, 4), (4, 16)],
    4096: [(1, 8), (1, 4), (1, 16)],
    8192: [(1, 16), (1, 8), (1, 32)],
    16384: [(1, 16), (1, 32)],
}
#: Backward (rows per step, num_warps, programs per SM, column splits), or
#: "chunked"; the first is the default.  Each fits its programs on an SM at once.
BWD_CANDIDATES = {
    1024: [(2, 4, 4, 1), (1, 4, 4, 1), (4, 8, 2, 1), (8, 16, 1, 1)],
    2048: [(2, 8, 2, 1), (1, 4, 4, 1), (1, 8, 2, 1)],
    4096: [(1, 8, 2, 1), (1, 16, 1, 1), (1, 8, 2, 2)],
    8192: [(1, 16, 1, 1), (1, 32, 1, 1), (1, 16, 1, 2)],
    16384: ["chunked", (1, 16, 1, 2), (1, 32, 1, 2), (1, 16, 1, 4)],
}


def _bwd_kwargs(cfg) -> dict[str, Any]:
    if cfg == "chunked":
        return {"chunked": True}
    keys = ("rows_per_program", "num_warps", "programs_per_sm", "col_splits")
    return {"chunked": False, **dict(zip(keys, cfg, strict=True))}


def tune(hidden=HIDDEN) -> tuple[dict, dict]:
    """Time each candidate config; return the winners by padded width."""
    elem = torch.finfo(DTYPE).bits // 8
    best_fwd, best_bwd = {}, {}
    for n_cols in hidden:
        n_rows = ELEMENTS // n_cols
        width = triton.next_power_of_2(n_cols)
        fwd_bytes, bwd_bytes = _bytes(n_rows, n_cols, elem)
        x, w, b = _inputs(n_rows, n_cols)
        dy = torch.randn_like(x)
        _, stats = op.launch_layer_norm_fwd(x, w, b, EPS)
        fwd = []
        for rows, warps in FWD_CANDIDATES.get(width, []):
            fn = partial(
                op.launch_layer_norm_fwd, x, w, b, EPS, rows_per_program=rows, num_warps=warps
            )
            fwd.append((measure(fn, bytes_moved=fwd_bytes, warmup=5, rep=20).gbps, (rows, warps)))
        bwd = []
        for cfg in BWD_CANDIDATES.get(width, []):
            fn = partial(op.launch_layer_norm_bwd, dy, x, w, stats, **_bwd_kwargs(cfg))
            bwd.append((measure(fn, bytes_moved=bwd_bytes, warmup=5, rep=20).gbps, cfg))
        for name, res, best in (("fwd", fwd, best_fwd), ("bwd", bwd, best_bwd)):
            if not res:
                continue
            line = "; ".join(f"{g:.0f} {cfg}" for g, cfg in res)
            print(f"tune {name} H={n_cols} GB/s (default first): {line}", flush=True)
            best[width] = max(res, key=lambda r: r[0])[1]
        del x, dy, stats
    print(f"tune best fwd: {best_fwd}\ntune best bwd: {best_bwd}", flush=True)
    return best_fwd, best_bwd


def apply(best_fwd: dict, best_bwd: dict) -> None:
    """Make the launchers use the sweep's winners (for this process only)."""
    orig_fwd, orig_bwd = op._fwd_config, op._bwd_config

    def fwd_config(n_cols):
        block_n, rows, warps = orig_fwd(n_cols)
        return (block_n, *best_fwd[block_n]) if block_n in best_fwd else (block_n, rows, warps)

    def bwd_config(n_cols):
        cfg = orig_bwd(n_cols)
        won = best_bwd.get(cfg[0])
        return cfg if won is None or won == "chunked" else (cfg[0], *won)

    op._fwd_config, op._bwd_config = fwd_config, bwd_config
    if 16384 in best_bwd:
        op.BWD_CHUNKED_THRESHOLD = 8192 if best_bwd[16384] == "chunked" else 16384
    PLANS.clear()  # calls planned under the old rules are planned anew


def print_table(rows: list[dict[str, Any]]) -> None:
    by = {(r["kernel"], r["shape"], r["impl"]): r for r in rows}
    shapes = dict.fromkeys(r["shape"] for r in rows)
    impls = ("tilebook", "torch", "torch.compile")
    print(f"\nlayer_norm, bf16, {ELEMENTS} elements: GB/s (fwd: x + y; bwd: x + dy + dx)")
    print(f"{'pass':<5}{'shape':>12}" + "".join(f"{i:>15}" for i in impls)
          + f"{'us (ours)':>11}{'vs best':>9}")  # fmt: skip
    for kernel in ("layer_norm_fwd", "layer_norm_bwd"):
        for shape in shapes:
            got = [by.get((kernel, shape, i)) for i in impls]
            if got[0] is None:
                continue
            best = min(r["median_ms"] for r in got[1:] if r is not None)
            print(f"{kernel[-3:]:<5}{shape:>12}" + "".join(
                f"{r['gbps']:>15.0f}" if r else f"{'-':>15}" for r in got)
                + f"{got[0]['median_ms'] * 1e3:>11.1f}{best / got[0]['median_ms']:>9.3f}")  # fmt: skip
    print("(vs best: the faster baseline's time / tilebook's time; >= 1.0 meets the target)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16384x4096 only")
    parser.add_argument("--tune", action="store_true", help="sweep launch configs first")
    parser.add_argument("--apply", action="store_true", help="time the sweep's winners")
    parser.add_argument("--save", action="store_true", help="save the rows as bench_layer_norm")
    args = parser.parse_args(argv)
    if benchmark_header() is None:
        return 0
    if args.tune:
        best = tune((4096,) if args.quick else HIDDEN)
        if args.apply:
            apply(*best)
    rows = run(quick=args.quick)
    print_table(rows)
    if args.save:
        print(f"saved {save_benchmark('layer_norm', rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
