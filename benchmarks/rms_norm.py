"""RMSNorm benchmark: tilebook's kernels against PyTorch, eager and compiled (GPU only).

Run from the repository root::

    PYTHONPATH=src python benchmarks/rms_norm.py             # full run, prints tables
    PYTHONPATH=src python benchmarks/rms_norm.py --quick     # 16384x4096 only
    PYTHONPATH=src python benchmarks/rms_norm.py --tune      # sweep launch configs first
    PYTHONPATH=src python benchmarks/rms_norm.py --sizes     # only the table by hidden size
    PYTHONPATH=src python benchmarks/rms_norm.py --tune-long # sweep the chunked kernels

The full run ends with a short table by hidden size (2**26 elements per tensor,
4096 to 65536 columns): rows longer than 16384 (forward: 32768) take the chunked
kernels.

The comparison with PyTorch is the measurement lesson 11 shows, defined once in
:func:`tilebook.course.experiments.rms_norm.versus` (here with more rounds and the
target shapes): every implementation's errors against float64 are in each row,
and tilebook's must be within bf16 tolerance.

Throughput is *effective* bandwidth: the bytes an ideal implementation must move,
the same count for every implementation, divided by the time.  Forward: read x
and w, write y.  Backward: read x, dy, w and rstd, write dx and dw.  At 16384x1024
a pass moves only ~64 MB (~25 us), so there the Python and launch overheads of each
implementation start to show.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from typing import Any

import torch

import tilebook
import tilebook.ops.rms_norm as op
from tilebook.course.bench import benchmark_header, measure
from tilebook.course.check import default_tolerance
from tilebook.course.experiments import rms_norm as exp

EPS = exp.EPS
DTYPE = exp.DTYPE
N_ROWS = 16384
#: The shapes of the speed targets: every implementation, forward and backward.
MAIN_HIDDEN = (4096, 8192)
#: Extra hidden sizes for the lesson's plot of bandwidth against row length.
SWEEP_HIDDEN = (1024, 2048, 16384)

#: The table by hidden size: tensors of SIZES_ELEMENTS, cut into rows of each length.
SIZES_HIDDEN = (4096, 8192, 16384, 32768, 65536)
SIZES_ELEMENTS = exp.ELEMENTS

#: Which implementation each kernel's ratio is taken against.
BASELINE = {"rms_norm_fwd": "torch.compile", "rms_norm_bwd": "torch"}
#: Interleaved rounds and do_bench milliseconds: more than the lesson's defaults.
TIMING = {"rounds": 5, "warmup": 25, "rep": 100}


def _allow_recompiles() -> None:
    # One compiled graph per shape and per requires_grad setting: more than the
    # default cache limit, past which dynamo silently falls back to eager.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))


def _ops() -> dict[str, Any]:
    """The experiment's ops under this benchmark's record names (``torch`` is F.rms_norm)."""
    ops = exp.ops()
    return {
        "tilebook": ops["tilebook"],
        "torch": ops["F.rms_norm"],
        "torch.compile": ops["torch.compile"],
    }


def _checked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Raise unless tilebook's y, dx and dw are within bf16 tolerance of float64."""
    tol = default_tolerance(DTYPE)
    for r in rows:
        errs = {k: r[k] for k in ("err_y", "err_dx", "err_dw")}
        if r["impl"] == "tilebook" and max(errs.values()) > tol:
            raise AssertionError(f"rms_norm {r['rows']}x{r['hidden']}: errors too large: {errs}")
    return rows


def _row(r: dict[str, Any]) -> dict[str, Any]:
    """An experiment row in this benchmark's record format."""
    return {
        "kernel": "rms_norm_fwd" if r["pass"] == "forward" else "rms_norm_bwd",
        "shape": f"{r['rows']}x{r['hidden']}",
        "dtype": str(DTYPE).removeprefix("torch."),
        "impl": r["impl"],
        **{k: r[k] for k in ("median_ms", "p20_ms", "p80_ms", "bytes", "gbps")},
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Check correctness, then measure; one row per (kernel, shape, impl).  GPU only."""
    if not tilebook.is_gpu():
        raise RuntimeError("benchmarks/rms_norm.py needs a CUDA GPU")
    _allow_recompiles()
    ops = _ops()
    hidden = MAIN_HIDDEN[:1] if quick else MAIN_HIDDEN + SWEEP_HIDDEN
    rows: list[dict[str, Any]] = []
    for n_cols in hidden:
        # The extra sizes only feed a plot: tilebook against the two baselines.  The
        # naive formula's autograd is not a baseline anyone uses: forward only.
        fwd_ops = {**ops, "eager": exp.naive} if n_cols in MAIN_HIDDEN else ops
        got = exp.versus(fwd_ops, [n_cols], passes=["forward"], n_rows=N_ROWS, **TIMING)
        got += exp.versus(ops, [n_cols], passes=["backward"], n_rows=N_ROWS, **TIMING)
        print(f"# {N_ROWS}x{n_cols} correct vs float64", flush=True)
        rows += [_row(r) for r in _checked(got)]
    return rows


def sizes_table() -> None:
    """tilebook, torch.compile and F.rms_norm by hidden size, 2**26 bf16 elements each."""
    ops = exp.ops()
    rows = _checked(exp.versus(ops, SIZES_HIDDEN, elements=SIZES_ELEMENTS, **TIMING))
    gbps = {(r["pass"], r["hidden"], r["impl"]): r["gbps"] for r in rows}
    dtype = str(DTYPE).removeprefix("torch.")
    print(f"\nrms_norm, {dtype}, {SIZES_ELEMENTS} elements per tensor: GB/s (bytes that must move)")
    print(f"{'pass':<5}{'H':>7}{'rows':>7}{'path':>9}" + "".join(f"{i:>15}" for i in ops)
          + "  tilebook/compile")  # fmt: skip
    for pass_, name, threshold in (
        ("forward", "fwd", op.FWD_CHUNKED_THRESHOLD),
        ("backward", "bwd", op.BWD_CHUNKED_THRESHOLD),
    ):
        for n_cols in SIZES_HIDDEN:
            got = [gbps[(pass_, n_cols, i)] for i in ops]
            path = "chunked" if n_cols > threshold else "rows"
            print(f"{name:<5}{n_cols:>7}{SIZES_ELEMENTS // n_cols:>7}{path:>9}"
                  + "".join(f"{g:>15.0f}" for g in got) + f"{got[0] / got[1]:>18.2f}")  # fmt: skip


#: Chunked configurations worth timing: forward (chunk, num_warps, programs per
#: SM; 64 per SM is one program per row), backward (chunk, rows, num_warps,
#: programs per SM).  The first of each is the default.
LONG_FWD = [(32768, 32, 1), (32768, 16, 1), (16384, 16, 2), (8192, 16, 4), (4096, 8, 64)]
LONG_BWD = [(4096, 1, 8, 2), (4096, 1, 8, 1), (8192, 1, 16, 1), (2048, 1, 4, 4)]


def _long_kwargs(direction: str, cfg: tuple | None) -> dict[str, Any]:
    if cfg is None:
        return {"chunked": False}
    if direction == "fwd":
        return {"chunked": True, "chunk": cfg[0], "num_warps": cfg[1], "programs_per_sm": cfg[2]}
    keys = ("chunk", "rows_per_program", "num_warps", "programs_per_sm")
    return {"chunked": True, **dict(zip(keys, cfg, strict=True))}


def _tune_long_shape(direction: str, n_cols: int, configs: list, deadline: float) -> None:
    n_rows = SIZES_ELEMENTS // n_cols
    fwd_bytes, bwd_bytes = exp.traffic(n_rows, n_cols, torch.finfo(DTYPE).bits // 8)
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=DTYPE)
    w = torch.randn(n_cols, device="cuda", dtype=DTYPE)
    dy = torch.randn_like(x)
    _, rstd = op.launch_rms_norm_fwd(x, w, EPS)
    res = []
    for cfg in [None, *configs]:
        if time.time() > deadline:
            print(f"tune-long: out of time, skipping the rest of {direction} H={n_cols}")
            break
        kw = _long_kwargs(direction, cfg)
        if direction == "fwd":
            fn, nbytes = partial(op.launch_rms_norm_fwd, x, w, EPS, **kw), fwd_bytes
        else:
            fn, nbytes = partial(op.launch_rms_norm_bwd, dy, x, w, rstd, **kw), bwd_bytes
        m = measure(fn, bytes_moved=nbytes, warmup=5, rep=20)
        res.append(f"{m.gbps:.0f} {'whole rows' if cfg is None else cfg}")
    print(f"tune-long {direction} H={n_cols} GB/s: " + "; ".join(res), flush=True)


def tune_long(budget_s: float = 45.0) -> None:
    """Time the whole-row kernels, then chunked configurations (the default first), at
    long rows: launchers only (no autograd), 2**26 bf16 elements; stops after ``budget_s``."""
    deadline = time.time() + budget_s
    for n_cols in (32768, 65536):
        _tune_long_shape("fwd", n_cols, LONG_FWD, deadline)
    for n_cols in (16384, 65536):
        _tune_long_shape("bwd", n_cols, LONG_BWD, deadline)


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
        fwd_bytes, bwd_bytes = exp.traffic(N_ROWS, n_cols, elem)
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
            ("fwd", fwd, op.fwd_config(n_cols)[1:]),
            ("bwd", bwd, op.bwd_config(n_cols)[1:]),
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
    parser.add_argument("--sizes", action="store_true", help="only the table by hidden size")
    parser.add_argument("--tune-long", action="store_true", help="sweep the chunked kernels")
    args = parser.parse_args(argv)
    if benchmark_header() is None:
        return 0
    if args.tune:
        tune()
    if args.tune_long:
        tune_long()
    if not args.sizes and not args.tune_long:
        print_table(run(quick=args.quick))
    if not args.quick:
        _allow_recompiles()
        sizes_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
