"""Host (Python) time per call of each op on a GPU, against its PyTorch counterpart.

A kernel whose launch costs more host time than its GPU work runs host-bound: the
GPU idles between launches and every GB/s figure drops.  Tiny inputs make the GPU
work negligible, so wall time per call of many back-to-back calls is host time.

    PYTHONPATH=src python benchmarks/host_overhead.py [--profile OP]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import tilebook


def _host_us(fn: Callable[[], object], n: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


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
    a = torch.randn(64, 64, device=dev, dtype=bf)
    lin = torch.randn(64, 1024, device=dev, dtype=bf)
    v = torch.randn(4096, device=dev)

    def grad(y):
        return lambda: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True, allow_unused=True)

    return {
        "vector_add": (lambda: tilebook.vector_add(v, v), lambda: torch.add(v, v)),
        "rms_norm fwd": (lambda: tilebook.rms_norm(x, w), lambda: F.rms_norm(x, (1024,), w)),
        "rms_norm bwd": (grad(y_tb), grad(y_t)),
        "softmax fwd": (lambda: tilebook.softmax(x), lambda: torch.softmax(x, -1)),
        "softmax bwd": (
            lambda: torch.autograd.grad(s_tb, xg, dy, retain_graph=True),
            lambda: torch.autograd.grad(s_t, xg, dy, retain_graph=True),
        ),
        "matmul": (lambda: tilebook.matmul(a, a), lambda: a @ a),
        "linear_act": (
            lambda: tilebook.linear_act(x, lin, None, "gelu"),
            lambda: F.gelu(F.linear(x, lin)),
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--profile", default="", help="cProfile this op's tilebook call")
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
    print(f"{'op':<14} {'tilebook us':>12} {'torch us':>9}")
    for name, (ours, theirs) in all_cases.items():
        print(f"{name:<14} {_host_us(ours):12.1f} {_host_us(theirs):9.1f}")


if __name__ == "__main__":
    main()
