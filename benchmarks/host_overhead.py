"""Host (Python) time per call of each op on a GPU, against its PyTorch counterpart,
beside the GPU time of the same call.

A kernel whose launch costs more host time than its GPU work runs host-bound: the
GPU idles between launches and every GB/s figure drops.  Tiny inputs make the GPU
work negligible, so wall time per call of many back-to-back calls is host time.
The kernel column is ``triton.testing.do_bench_cudagraph`` of the same call: the
GPU time alone, with the host taken out by replaying a captured CUDA graph.

    PYTHONPATH=src python benchmarks/host_overhead.py [--profile OP] [--routes] [--json PATH]

``--routes`` times the ways of launching softmax's forward kernel: Triton's JIT
(``kernel[grid](...)``), ``compiled[grid](...)`` on what ``kernel.warmup(...)``
returned, the ``compiled[grid]`` launcher kept between calls (what
:class:`tilebook._launch.Launched` does), and the public op.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import tilebook


def _host_us(fn: Callable[[], object], n: int = 100, blocks: int = 7) -> float:
    """The fastest of ``blocks`` blocks of ``n`` calls, per call: a busy host (another
    process, a clock change) only ever adds time, so the minimum is the op's cost."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(blocks):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def _kernel_us(fn: Callable[[], object]) -> float | None:
    """GPU microseconds per call from a replayed CUDA graph (None: not capturable)."""
    import triton

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3
    except Exception:  # noqa: BLE001  (an autograd call, say, that a graph cannot hold)
        return None


def cases() -> dict[str, tuple[Callable, Callable]]:
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(16, 1024, device=dev, dtype=bf)
    w = torch.randn(1024, device=dev, dtype=bf)
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    dy = torch.randn_like(x)
    y_tb = tilebook.rms_norm(xg, wg)
    y_t = F.rms_norm(xg, (1024,), wg)
    s_tb = tilebook.softmax(xg)
    s_t = torch.softmax(xg, -1)
    b = torch.randn(1024, device=dev, dtype=bf)
    bg = b.clone().requires_grad_()
    a = torch.randn(64, 64, device=dev, dtype=bf)
    lin = torch.randn(64, 1024, device=dev, dtype=bf)
    v = torch.randn(4096, device=dev)

    def grad(y):
        return lambda: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True, allow_unused=True)

    # Leaves of their own for the training steps: leaves that a kept graph (y_tb and
    # the rest above) also holds make autograd warn about, and synchronise on, streams.
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))

    def step(op, *ins):
        # A training step of the op alone: the forward records a graph, then its backward.
        return lambda: torch.autograd.grad(op(*ins), ins, dy)

    return {
        "vector_add": (lambda: tilebook.vector_add(v, v), lambda: torch.add(v, v)),
        "rms_norm fwd": (lambda: tilebook.rms_norm(x, w), lambda: F.rms_norm(x, (1024,), w)),
        "rms_norm bwd": (grad(y_tb), grad(y_t)),
        "softmax fwd": (lambda: tilebook.softmax(x), lambda: torch.softmax(x, -1)),
        "softmax bwd": (
            lambda: torch.autograd.grad(s_tb, xg, dy, retain_graph=True),
            lambda: torch.autograd.grad(s_t, xg, dy, retain_graph=True),
        ),
        # Training: the forward of an input that needs a gradient, and a whole step.
        "rms_norm fwd, grad on": (
            lambda: tilebook.rms_norm(xg, wg),
            lambda: F.rms_norm(xg, (1024,), wg),
        ),
        "rms_norm step": (
            step(tilebook.rms_norm, xs, ws),
            step(lambda t, u: F.rms_norm(t, (1024,), u), xs, ws),
        ),
        "softmax fwd, grad on": (lambda: tilebook.softmax(xg), lambda: torch.softmax(xg, -1)),
        "softmax step": (step(tilebook.softmax, xs), step(lambda t: torch.softmax(t, -1), xs)),
        "layer_norm fwd": (
            lambda: tilebook.layer_norm(x, w, b),
            lambda: F.layer_norm(x, (1024,), w, b),
        ),
        "layer_norm fwd, grad on": (
            lambda: tilebook.layer_norm(xg, wg, bg),
            lambda: F.layer_norm(xg, (1024,), wg, bg),
        ),
        "layer_norm step": (
            step(tilebook.layer_norm, xs, ws, bs),
            step(lambda t, u, c: F.layer_norm(t, (1024,), u, c), xs, ws, bs),
        ),
        "matmul": (lambda: tilebook.matmul(a, a), lambda: a @ a),
        "linear_act": (
            lambda: tilebook.linear_act(x, lin, None, "gelu"),
            lambda: F.gelu(F.linear(x, lin)),
        ),
    }


def routes() -> dict[str, Callable[[], object]]:
    """softmax's forward kernel on a 16 x 1024 bf16 input, launched each way."""
    from tilebook.ops import softmax as sm

    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    cfg = sm.pick_config(1024)
    meta = sm._meta(cfg, 16, 1024, x, y)
    grid = sm._grid(16, cfg, x.device)
    args = (x, y, 16, 1024, 1024, 1024)
    kernel = sm.softmax_fwd_kernel
    compiled = kernel.warmup(*args, grid=grid, **meta)
    names = kernel.arg_names[len(args) :]
    full = (*args, *(meta[n] for n in names))
    grid3 = (*grid, 1, 1)
    kept = compiled[grid3]
    out = {
        "JIT: kernel[grid](...)": lambda: kernel[grid](*args, **meta),
        "warmup + compiled[grid](...) per call": lambda: compiled[grid3](*full),
        "compiled[grid] kept between calls": lambda: kept(*full),
    }
    from tilebook import _launch

    launched = _launch.launch(kernel, grid, *args, **meta)  # None before issue 8
    if callable(launched):
        out["tilebook._launch.Launched"] = lambda: launched(*args)
    out["tilebook.softmax (checks, output, launch)"] = lambda: tilebook.softmax(x)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--profile", default="", help="cProfile this op's tilebook call")
    p.add_argument("--routes", action="store_true", help="time the launch routes too")
    p.add_argument("--json", default="", help="also write the results to this file")
    args = p.parse_args()
    print(tilebook.banner())
    all_cases = cases()
    if args.profile:
        fn = all_cases[args.profile][0]
        for _ in range(20):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    rows = []
    for name, (ours, theirs) in all_cases.items():
        row = {"op": name, "tilebook_host_us": _host_us(ours), "torch_host_us": _host_us(theirs)}
        row["tilebook_kernel_us"], row["torch_kernel_us"] = _kernel_us(ours), _kernel_us(theirs)
        rows.append(row)
    print(
        f"{'op':<24} {'tilebook host':>13} {'torch host':>10} {'tb kernel':>9} {'torch kernel':>12}"
    )
    for r in rows:
        kern = [
            f"{v:.1f}" if v is not None else "-"
            for v in (r["tilebook_kernel_us"], r["torch_kernel_us"])
        ]
        print(
            f"{r['op']:<24} {r['tilebook_host_us']:13.1f} {r['torch_host_us']:10.1f} "
            f"{kern[0]:>9} {kern[1]:>12}"
        )
    route_rows = {}
    if args.routes:
        print("\nsoftmax forward, 16 x 1024 bf16: host us per launch by route")
        for name, fn in routes().items():
            route_rows[name] = _host_us(fn)
            print(f"  {name:<44} {route_rows[name]:6.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"banner": tilebook.banner(), "ops": rows, "routes": route_rows}, f, indent=1)


if __name__ == "__main__":
    main()
