"""RMSNorm benchmark: tilebook's kernels against PyTorch, eager and compiled (GPU only).

Run from the repository root::

    PYTHONPATH=src python benchmarks/rms_norm.py            # full run, prints a table
    PYTHONPATH=src python benchmarks/rms_norm.py --quick    # 16384x4096 only
    PYTHONPATH=src python benchmarks/rms_norm.py --tune     # sweep launch configs first

Throughput is *effective* bandwidth: the bytes an ideal implementation must move,
the same count for every implementation, divided by the time.  Forward: read x
and w, write y.  Backward: read x, dy, w and rstd, write dx and dw.  At 16384x1024
a pass moves only ~64 MB (~25 us), so there the Python and launch overheads of each
implementation start to show.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import tilebook
import tilebook.ops.rms_norm as op
from tilebook.bench import copy_bandwidth, measure, provenance

EPS = 1e-6
DTYPE = torch.bfloat16
N_ROWS = 16384
#: The shapes of the speed targets: every implementation, forward and backward.
MAIN_HIDDEN = (4096, 8192)
#: Extra hidden sizes for the lesson's plot of bandwidth against row length.
SWEEP_HIDDEN = (1024, 2048, 16384)

#: Which implementation each kernel's ratio is taken against.
BASELINE = {"rms_norm_fwd": "torch.compile", "rms_norm_bwd": "torch"}


def naive(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The textbook formula in fp32, cast back once: what torch.compile gets to fuse."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def _torch_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def _tilebook_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return op.rms_norm(x, w, EPS)


def _allow_recompiles() -> None:
    # One compiled graph per shape and per requires_grad setting: more than the
    # default cache limit, past which dynamo silently falls back to eager.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))


def _bytes(n_rows: int, n_cols: int, elem: int) -> tuple[int, int]:
    fwd = 2 * n_rows * n_cols * elem + n_cols * elem
    bwd = 3 * n_rows * n_cols * elem + n_rows * 4 + 2 * n_cols * elem
    return fwd, bwd


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def check_correctness(n_rows: int, n_cols: int, dtype: torch.dtype = DTYPE) -> dict[str, float]:
    """Max error of y, dx and dw relative to the largest reference value (float64 reference)."""
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n_cols, device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
    y = op.rms_norm(x, w, EPS)
    dx, dw = torch.autograd.grad(y, (x, w), dy)

    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = F.rms_norm(x64, (n_cols,), w64, EPS)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    errs = {"y": _rel_err(y, y64), "dx": _rel_err(dx, dx64), "dw": _rel_err(dw, dw64)}
    # bf16 keeps 8 significant bits (relative step 2**-8 = 0.004).
    bad = {k: v for k, v in errs.items() if v > 1e-2}
    if bad:
        raise AssertionError(f"rms_norm {n_rows}x{n_cols} {dtype}: errors too large: {bad}")
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
    """Forward and backward of every implementation at one shape."""
    fwd_bytes, bwd_bytes = _bytes(n_rows, n_cols, torch.finfo(DTYPE).bits // 8)
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=DTYPE)
    w = (1 + 0.1 * torch.randn(n_cols, device="cuda")).to(DTYPE)
    dy = torch.randn_like(x)
    rows = []
    for impl, fn in impls.items():
        m = measure(lambda fn=fn: fn(x, w), bytes_moved=fwd_bytes)
        rows.append(_row("rms_norm_fwd", n_rows, n_cols, impl, m))
    for impl, fn in impls.items():
        if impl == "eager":  # the naive formula's autograd is not a baseline anyone uses
            continue
        xg = x.detach().requires_grad_()
        wg = w.detach().requires_grad_()
        y = fn(xg, wg)
        m = measure(
            lambda y=y, xg=xg, wg=wg: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True),
            bytes_moved=bwd_bytes,
        )
        rows.append(_row("rms_norm_bwd", n_rows, n_cols, impl, m))
        del y
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Check correctness, then measure; one row per (kernel, shape, impl).  GPU only."""
    if not tilebook.is_gpu():
        raise RuntimeError("benchmarks/rms_norm.py needs a CUDA GPU")
    _allow_recompiles()
    compiled = torch.compile(naive, dynamic=False)
    impls = {
        "tilebook": _tilebook_rms_norm,
        "torch": _torch_rms_norm,
        "torch.compile": compiled,
        "eager": naive,
    }
    hidden = MAIN_HIDDEN[:1] if quick else MAIN_HIDDEN + SWEEP_HIDDEN
    rows: list[dict[str, Any]] = []
    for n_cols in hidden:
        errs = check_correctness(N_ROWS, n_cols)
        print(f"# {N_ROWS}x{n_cols} correct vs float64: " + ", ".join(
            f"{k} {v:.1e}" for k, v in errs.items()), flush=True)  # fmt: skip
        # The extra sizes only feed a plot: tilebook against the two baselines.
        use = impls if n_cols in MAIN_HIDDEN else {
            k: impls[k] for k in ("tilebook", "torch", "torch.compile")}  # fmt: skip
        rows += bench_shape(N_ROWS, n_cols, use)
    return rows


def _time_fwd(x, w, rows, warps, nbytes):
    fn = lambda: op.launch_rms_norm_fwd(x, w, EPS, rows_per_program=rows, num_warps=warps)
    return measure(fn, bytes_moved=nbytes, warmup=5, rep=20)


def _time_bwd(dy, x, w, rstd, rows, warps, per_sm, nbytes):
    fn = lambda: op.launch_rms_norm_bwd(
        dy, x, w, rstd, rows_per_program=rows, num_warps=warps, programs_per_sm=per_sm
    )
    return measure(fn, bytes_moved=nbytes, warmup=5, rep=20)


def tune(hidden=MAIN_HIDDEN + SWEEP_HIDDEN) -> None:
    """Sweep rows per program, warps and (backward) programs per SM; print the best."""
    elem = torch.finfo(DTYPE).bits // 8
    for n_cols in sorted(hidden):
        block_n = 1 << (n_cols - 1).bit_length()
        fwd_bytes, bwd_bytes = _bytes(N_ROWS, n_cols, elem)
        x = torch.randn(N_ROWS, n_cols, device="cuda", dtype=DTYPE)
        w = torch.randn(n_cols, device="cuda", dtype=DTYPE)
        dy = torch.randn_like(x)
        _, rstd = op.launch_rms_norm_fwd(x, w, EPS)
        fwd, bwd = [], []
        for rows in (1, 2, 4):
            for warps in (4, 8, 16, 32):
                # Values each thread holds per row block: too few wastes threads on
                # reductions, too many spills.
                per_thread = rows * block_n // (32 * warps)
                if 4 <= per_thread <= 64:
                    m = _time_fwd(x, w, rows, warps, fwd_bytes)
                    fwd.append((m.gbps, f"rows={rows} warps={warps}"))
                if 2 <= per_thread <= 32 and rows <= 2:
                    for per_sm in (1, 2, 4):
                        m = _time_bwd(dy, x, w, rstd, rows, warps, per_sm, bwd_bytes)
                        bwd.append((m.gbps, f"rows={rows} warps={warps} progs/SM={per_sm}"))
        for name, res, default in (
            ("fwd", fwd, op._fwd_config(n_cols)[1:]),
            ("bwd", bwd, op._bwd_config(n_cols)[1:]),
        ):
            res.sort(reverse=True)
            top = "; ".join(f"{g:.0f} GB/s {cfg}" for g, cfg in res[:4])
            print(f"tune {name} H={n_cols} (default {default}): {top}", flush=True)
        if n_cols in MAIN_HIDDEN:
            _autograd_cost(x, w, dy, rstd, bwd_bytes)


def _autograd_cost(x, w, dy, rstd, nbytes) -> None:
    """The backward through autograd against the bare launcher: what the glue costs.

    (No torch.profiler here: on an H100, after it had run, the Triton-launched
    implementations in the table that followed became launch-bound.)
    """
    xg = x.detach().requires_grad_()
    wg = w.detach().requires_grad_()
    y = op.rms_norm(xg, wg, EPS)
    launcher = measure(lambda: op.launch_rms_norm_bwd(dy, x, w, rstd), bytes_moved=nbytes)
    grad = lambda: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True)
    autograd = measure(grad, bytes_moved=nbytes)
    print(
        f"tune bwd H={x.shape[1]}: launcher {launcher.median_ms * 1e3:.1f} us "
        f"({launcher.gbps:.0f} GB/s), through autograd {autograd.median_ms * 1e3:.1f} us "
        f"({autograd.gbps:.0f} GB/s)",
        flush=True,
    )


def print_table(rows: list[dict[str, Any]]) -> None:
    base = {
        (r["kernel"], r["shape"]): r["median_ms"]
        for r in rows
        if BASELINE.get(r["kernel"]) == r["impl"]
    }
    print(f"{'kernel':<14}{'shape':<13}{'impl':<15}{'ms':>9}{'GB/s':>8}  vs baseline")
    for r in rows:
        ref = base.get((r["kernel"], r["shape"]))
        ratio = f"{ref / r['median_ms']:.2f}x" if ref else ""
        print(
            f"{r['kernel']:<14}{r['shape']:<13}{r['impl']:<15}"
            f"{r['median_ms']:>9.4f}{r['gbps']:>8.0f}  {ratio}"
        )
    print("(vs baseline: baseline time / this time; fwd baseline torch.compile, bwd torch)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16384x4096 only")
    parser.add_argument("--tune", action="store_true", help="sweep launch configs first")
    args = parser.parse_args(argv)
    print(tilebook.banner())
    if not tilebook.is_gpu():
        print("no GPU: nothing to measure (see the committed records instead)")
        return 0
    p = provenance()
    copy = copy_bandwidth().gbps
    print(f"# {p['gpu']}, {p['sm_count']} SMs, CUDA {p['cuda']}, copy {copy:.0f} GB/s", flush=True)
    if args.tune:
        tune()
    print_table(run(quick=args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
