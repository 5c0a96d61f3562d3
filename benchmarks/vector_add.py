"""vector_add on a GPU against torch.add, float32, 2^20 to 2^28 elements.

PYTHONPATH=src python benchmarks/vector_add.py
"""

from __future__ import annotations

from typing import Any

import torch

import tilebook
from tilebook.bench import measure_interleaved
from tilebook.check import CorrectnessReport

#: Which implementation each kernel's ratio is taken against.
BASELINE = {"vector_add": ["torch.add"]}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Check, then measure tilebook.vector_add and torch.add; one row per (size, impl)."""
    report = CorrectnessReport("vector_add on the GPU vs float64")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.randn(2**20 + 3, device="cuda", dtype=dtype)
        b = torch.randn_like(a)
        report.check(f"n=2^20+3 {dtype}", tilebook.vector_add(a, b), a.double() + b.double())
    report.assert_ok()

    rows = []
    for exp in (24, 26, 28) if quick else range(20, 29):
        n = 2**exp
        a = torch.rand(n, device="cuda")
        b = torch.rand(n, device="cuda")
        out = torch.empty_like(a)
        impls = {
            "tilebook": lambda a=a, b=b, out=out: tilebook.vector_add(a, b, out=out),
            "torch.add": lambda a=a, b=b, out=out: torch.add(a, b, out=out),
        }
        # Interleaved: both run within a percent of the copy ceiling.
        for impl, m in measure_interleaved(impls, bytes_moved=3 * n * 4).items():
            rows.append(
                {
                    "kernel": "vector_add",
                    "shape": f"2^{exp}",
                    "n": n,
                    "dtype": "float32",
                    "impl": impl,
                    **m.as_row(),
                }
            )
        del a, b, out
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"{r['shape']:>6} {r['impl']:>10} {r['gbps']:8.0f} GB/s")
