"""Matrix multiplication on a GPU: tilebook.matmul against cuBLAS (torch.matmul), bf16.

Each shape is checked against a float64 product on the GPU before it is timed;
FLOPs counted: 2*M*N*K.  Square sizes take the persistent TMA kernel on a Hopper
GPU; so does the odd ragged shape (rows not 16-byte aligned), through aligned copies.

    PYTHONPATH=src python benchmarks/matmul.py            # table, ratio vs cuBLAS
    PYTHONPATH=src python benchmarks/matmul.py --square   # 2048, 4096 and 8192 cubed only
    PYTHONPATH=src python benchmarks/matmul.py --sweep    # fixed configs behind the tables

Besides do_bench's figures the table shows host time: ``n`` calls back to back, timed
on the host before (``host``) and after (``wall``) a final synchronize.  When host
time per call exceeds the kernel's time the GPU waits for Python, and do_bench, which
times between CUDA events, counts the wait.  ``--square`` also prints what one launch
of the 2048-cubed product costs on the host by each route (full call, cached runner,
the JIT's ``kernel[grid](...)``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import tilebook
from tilebook._launch import PLANS, call_key
from tilebook.course.bench import measure
from tilebook.course.experiments import matmul as experiment
from tilebook.ops import matmul as mm
from tilebook.ops import matmul_hopper
from tilebook.ops.matmul_plan import make_plan

DTYPE = torch.bfloat16
# (M, N, K): square sizes, then ragged ones: aligned rows (TMA path), odd rows (staged).
SHAPES = [
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (3000, 5000, 2000),
    (4095, 4097, 4093),
]
QUICK_SHAPES = [(4096, 4096, 4096), (3000, 5000, 2000)]
SQUARE_SHAPES = SHAPES[:3]
BASELINE = {"matmul": ["cuBLAS"]}  # for run_all.py


def _shape(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN anywhere gives NaN."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def host_time(fn: Callable[[], Any], n: int = 200) -> tuple[float, float]:
    """(host, wall) microseconds per call of ``fn``, ``n`` calls back to back: host
    until the last call returns, wall until the GPU has finished them all."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def _bench_shape(m: int, n: int, k: int) -> list[dict]:
    # Checked against float64 and timed in interleaved rounds by the measurement lesson
    # 09 shows (more rounds here): the two are within a few percent, about as much as
    # the GPU's clocks drift under a long matmul load.
    rows = experiment.versus_cublas([(m, n, k)], dtype=DTYPE, rounds=5, warmup=25, rep=100)
    a, b = experiment.operands(m, n, k, DTYPE)
    fns = {"tilebook": lambda: mm.matmul(a, b), "cuBLAS": lambda: torch.matmul(a, b)}
    for row in rows:
        row["host_us"], row["wall_us"] = host_time(fns[row["impl"]])
    return rows


def run(quick: bool = False, square: bool = False) -> list[dict]:
    """Check, then time, tilebook.matmul and torch.matmul on a GPU."""
    if not tilebook.is_gpu():
        raise RuntimeError("benchmarks/matmul.py needs a CUDA GPU")
    rows: list[dict] = []
    for m, n, k in SQUARE_SHAPES if square else QUICK_SHAPES if quick else SHAPES:
        rows += _bench_shape(m, n, k)
        print(table(rows[-2:]).splitlines()[-1], flush=True)  # in case a later shape fails
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict]) -> str:
    """One line per shape: TFLOP/s of each implementation, baseline time / tilebook time,
    and host and wall microseconds per call of each (tilebook / cuBLAS)."""
    impls = ("tilebook", "cuBLAS")
    head = " ".join(f"{i:>10}" for i in impls)
    out = [
        f"{'kernel':<8} {'shape':>16} {head} {'ratio':>6} {'host us':>13} {'wall us':>13}  "
        + "(TFLOP/s; ratio = cuBLAS / tilebook time; us per call: tilebook/cuBLAS)"
    ]
    for kernel, shape in dict.fromkeys((r["kernel"], r["shape"]) for r in rows):
        by = {r["impl"]: r for r in rows if r["kernel"] == kernel and r["shape"] == shape}
        cells = " ".join(f"{by[i]['tflops']:10.0f}" for i in impls)
        ratio = by["cuBLAS"]["median_ms"] / by["tilebook"]["median_ms"]
        us = {
            f: "/".join(f"{by[i][f]:.1f}" for i in impls) if f in by["tilebook"] else "-"
            for f in ("host_us", "wall_us")
        }
        out.append(
            f"{kernel:<8} {shape:>16} {cells} {ratio:6.2f} {us['host_us']:>13} {us['wall_us']:>13}"
        )
    return "\n".join(out)


def launch_costs(size: int = 2048) -> str:
    """Host microseconds of one ``size``-cubed launch by each route (after warm-up)."""
    a = torch.randn(size, size, device="cuda", dtype=DTYPE)
    b = torch.randn(size, size, device="cuda", dtype=DTYPE)
    for _ in range(3):
        mm.matmul(a, b)
    c = torch.empty(size, size, device="cuda", dtype=DTYPE)
    # The plan the calls made (tilebook.ops.matmul_plan), under the key matmul gave it.
    plan = PLANS[call_key(a, b, None, make_plan, "none", "auto", False)]
    kernel = mm.matmul_tma_kernel if plan.kind == "tma" else mm.matmul_kernel
    step, jit_args = plan.step, plan.args(a, b, c, None)  # jit_args: the runtime arguments
    routes = {
        "tilebook.matmul (checks, output, launch)": lambda: mm.matmul(a, b),
        "its plan only (output, launch)": lambda: plan(a, b, None),
        f"JIT: {kernel.__name__}[grid](...)": lambda: kernel[step.grid](*jit_args, **step.meta),
        "torch.empty_like(c)": lambda: torch.empty_like(c),
        "torch.matmul": lambda: torch.matmul(a, b),
    }
    launcher = "compiled kernel" if plan.fast is not None else "tilebook._launch.launch"
    dtype = str(DTYPE).removeprefix("torch.")
    lines = [f"host us per call, {dtype} {size}^3 ({plan.kind} plan launches its {launcher}):"]
    for name, fn in routes.items():
        host, wall = host_time(fn, n=500)
        lines.append(f"  {name:<42} host {host:6.1f}  wall {wall:6.1f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------- the sweep
# Fixed configurations, launched directly (no autotuner), on the square sizes and on
# linear_act's headline shape.  This is where the config lists in ops/matmul_kernels.py
# and ops/matmul_hopper.py come from.


def _tma(bm, bn, bk, w, s, flat=True, persistent=True, ctas=1, maxnreg=None, group=8) -> dict:
    return {
        "kind": "tma",
        "bm": bm,
        "bn": bn,
        "bk": bk,
        "w": w,
        "s": s,
        "split": True,
        "flat": flat,
        "persistent": persistent,
        "ctas": ctas,
        "maxnreg": maxnreg,
        "group": group,
    }


def _ptr(bm, bn, bk, w, s, maxnreg=None, group=8) -> dict:
    return {
        "kind": "ptr",
        "bm": bm,
        "bn": bn,
        "bk": bk,
        "w": w,
        "s": s,
        "maxnreg": maxnreg,
        "group": group,
    }


# What was measured on an H100 (2026-11, triton 3.6) and is kept here to re-check:
# 128x256x64 tiles with 8 warps win; flattening helps with several tiles per program;
# 128x128 tiles with two or three programs per SM (maxnreg caps) lost everywhere.
CANDIDATES = [
    _tma(128, 256, 64, 8, 3),
    _tma(128, 256, 64, 8, 4),
    _tma(128, 256, 64, 8, 3, flat=False),
    _tma(128, 256, 64, 8, 4, flat=False),
    _tma(128, 256, 64, 8, 3, flat=False, persistent=False),
    _tma(128, 128, 32, 4, 4, ctas=2),
    _ptr(128, 256, 64, 8, 4),
    _ptr(128, 256, 64, 8, 3),
    _ptr(128, 128, 64, 8, 4),
]
# ("mm", M, N, K): a @ b, both row-major; ("linear:ACT", ...): act(x @ w.T + bias);
# ("linear0", ...): x @ w.T alone.  The linear rows show what each epilogue costs.
SWEEP_PROBLEMS = [
    ("mm", 2048, 2048, 2048),
    ("mm", 4096, 4096, 4096),
    ("mm", 8192, 8192, 8192),
    ("linear0", 8192, 4096, 4096),
    ("linear:none", 8192, 4096, 4096),
    ("linear:relu", 8192, 4096, 4096),
    ("linear:gelu", 8192, 4096, 4096),
    ("linear:gelu_tanh", 8192, 4096, 4096),
    ("linear:silu", 8192, 4096, 4096),
]
_REF_ACT = {
    "none": lambda t: t,
    "relu": torch.relu,
    "gelu": lambda t: torch.nn.functional.gelu(t),
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "silu": lambda t: torch.nn.functional.silu(t),
}


def _launch_fixed(v: dict, a, b, c, bias, act: str) -> None:
    """One launch of a fixed config (what the autotuner would do for that config)."""
    import triton  # here, not at the top: tilebook must pick the runtime before triton loads
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1]
    bias_arg = bias if bias is not None else c
    common = {
        "BLOCK_M": v["bm"],
        "BLOCK_N": v["bn"],
        "BLOCK_K": v["bk"],
        "GROUP_M": v["group"],
        "HAS_BIAS": bias is not None,
        "ACTIVATION": act,
        "num_warps": v["w"],
        "num_stages": v["s"],
        "maxnreg": v["maxnreg"],
    }
    if v["kind"] == "ptr":
        grid = (triton.cdiv(M, v["bm"]) * triton.cdiv(N, v["bn"]),)
        mm.matmul_kernel[grid](
            a,
            b,
            c,
            bias_arg,
            M,
            N,
            K,
            *a.stride(),
            *b.stride(),
            *c.stride(),
            EVEN_K=K % v["bk"] == 0,
            INT64=False,
            **common,
        )
        return
    a_t, b_t = mm.tma_layout(a), mm.tma_layout(b)
    bm, bn, bk = v["bm"], v["bn"], v["bk"]
    a_src = a.t() if a_t else a
    b_src = b.t() if b_t else b
    a_desc = TensorDescriptor(
        a_src, list(a_src.shape), list(a_src.stride()), [bk, bm] if a_t else [bm, bk]
    )
    b_desc = TensorDescriptor(
        b_src, list(b_src.shape), list(b_src.stride()), [bn, bk] if b_t else [bk, bn]
    )
    c_desc = TensorDescriptor(c, [M, N], list(c.stride()), [bm, bn // 2 if v["split"] else bn])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    n_prog = min(matmul_hopper.grid_sms(a.device) * v["ctas"], tiles) if v["persistent"] else tiles
    mm.matmul_tma_kernel[(n_prog,)](
        a_desc,
        b_desc,
        c_desc,
        bias_arg,
        M,
        N,
        K,
        A_T=a_t,
        B_T=b_t,
        CTAS_PER_SM=v["ctas"],
        SPLIT_N=v["split"],
        FLATTEN=v["flat"],
        **common,
    )


def _problem(kind: str, m: int, n: int, k: int):
    a = torch.randn(m, k, device="cuda", dtype=DTYPE)
    if kind == "mm":
        return a, torch.randn(k, n, device="cuda", dtype=DTYPE), None, "none"
    w = torch.randn(n, k, device="cuda", dtype=DTYPE) / k**0.5
    if kind == "linear0":
        return a, w.t(), None, "none"
    return a, w.t(), torch.randn(n, device="cuda", dtype=DTYPE), kind.split(":")[1]


def _precompile(i: int) -> tuple[int, list[str]]:
    # In a worker process: compiling fills Triton's on-disk cache for the timing process.
    v, out = CANDIDATES[i], []
    for kind, m, n, k in SWEEP_PROBLEMS:
        a, b, bias, act = _problem(kind, m, n, k)
        c = torch.empty(m, n, device="cuda", dtype=DTYPE)
        try:
            _launch_fixed(v, a, b, c, bias, act)
            torch.cuda.synchronize()
            out.append("ok")
        except Exception as exc:  # noqa: BLE001  (a config that does not fit is a result)
            out.append(f"{type(exc).__name__}: {str(exc)[:120]}")
    return i, out


def _describe(v: dict) -> str:
    s = f"{v['kind']} {v['bm']}x{v['bn']}x{v['bk']} w{v['w']} s{v['s']} g{v['group']}"
    if v["maxnreg"]:
        s += f" r{v['maxnreg']}"
    if v["kind"] == "tma":
        s += " flat" * v["flat"] + f" persist{v['ctas']}" * v["persistent"]
    return s


def _sweep_problem(kind: str, m: int, n: int, k: int, deadline: float) -> list[dict]:
    import torch.nn.functional as F

    a, b, bias, act = _problem(kind, m, n, k)
    c = torch.empty(m, n, device="cuda", dtype=DTYPE)
    shape, flops = _shape(m, n, k), 2 * m * n * k
    ref = a[:1024].double() @ b.double()  # the first 1024 rows are enough to catch a bad tile
    act_fn = _REF_ACT[act]
    if bias is not None:
        ref = act_fn(ref + bias.double())
    if kind == "mm":
        base = {"cuBLAS": lambda: torch.matmul(a, b)}
    elif kind == "linear0":
        base = {"F.linear": lambda: F.linear(a, b.t())}
    else:
        w = b.t()
        base = {
            "unfused": lambda: act_fn(F.linear(a, w, bias)),
            "F.linear": lambda: F.linear(a, w, bias),
        }
    rows, res = [], []
    for name, fn in base.items():
        t = measure(fn, warmup=50, rep=200)
        rows.append({"problem": kind, "shape": shape, "impl": name, **t.as_row()})
        res.append((t.median_ms, name, 0.0))
    for v in CANDIDATES:
        if time.time() > deadline:
            print("sweep: out of time", flush=True)
            break
        c.fill_(float("nan"))  # poison: an unwritten tile shows as NaN
        try:
            _launch_fixed(v, a, b, c, bias, act)
            err = float("nan") if torch.isnan(c).any() else rel_err(c[:1024], ref)
            t = measure(lambda v=v: _launch_fixed(v, a, b, c, bias, act), warmup=50, rep=200)
        except Exception as exc:  # noqa: BLE001  (report the config and go on)
            print(f"  {_describe(v)}: {type(exc).__name__} {str(exc)[:100]}", flush=True)
            continue
        name = _describe(v)
        rows.append({"problem": kind, "shape": shape, "impl": name, "rel_err": err, **t.as_row()})
        res.append((t.median_ms, name, err))
    print(f"{kind} {shape}", flush=True)
    for ms, name, err in sorted(res):
        print(f"  {name:<46} {flops / ms / 1e9:5.0f} TFLOP/s  err {err:.1e}", flush=True)
    return rows


def sweep(budget_s: float = 300.0) -> list[dict]:
    """Time every candidate on every sweep problem; print them best first."""
    deadline = time.time() + budget_s
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(12, len(CANDIDATES))) as pool:
        for i, res in pool.imap_unordered(_precompile, range(len(CANDIDATES))):
            if any(r != "ok" for r in res):
                print(f"precompile {_describe(CANDIDATES[i])}: {res}", flush=True)
    rows: list[dict] = []
    for kind, m, n, k in SWEEP_PROBLEMS:
        rows += _sweep_problem(kind, m, n, k, deadline)
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two shapes only")
    p.add_argument("--square", action="store_true", help="2048, 4096, 8192 cubed, launch costs")
    p.add_argument("--sweep", action="store_true", help="time fixed candidate configurations")
    p.add_argument("--budget", type=float, default=300.0, help="seconds the sweep may take")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    print(tilebook.banner(), flush=True)
    rows = sweep(args.budget) if args.sweep else run(quick=args.quick, square=args.square)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.square:
        try:
            print(launch_costs(), flush=True)
        except Exception as exc:  # noqa: BLE001  (the table below still matters)
            print(f"launch costs: {type(exc).__name__}: {exc}", flush=True)
    if not args.sweep:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
