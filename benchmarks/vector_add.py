"""vector_add on a GPU against torch.add, float32, 2^20 to 2^28 elements.

The measurements are lesson 07's, defined once in
:mod:`tilebook.course.experiments.vector_add`; this benchmark runs them with more
rounds and at the sizes of its target (at least 0.95x torch.add from 2^24 on),
and, unless ``quick``, the launch-setting sweep that the package's
configuration was chosen from.

PYTHONPATH=src python benchmarks/vector_add.py
"""

from __future__ import annotations

from typing import Any

import torch

import tilebook
from tilebook.course.check import CorrectnessReport
from tilebook.course.experiments import vector_add as experiment

#: Which implementation each kernel's ratio is taken against.
BASELINE = {"vector_add": ["torch.add"]}
TIMING = {"rounds": 5, "warmup": 25, "rep": 100}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Check every dtype, then measure; one row per (size, impl) and per launch setting."""
    report = CorrectnessReport("vector_add on the GPU vs float64")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.randn(2**20 + 3, device="cuda", dtype=dtype)
        b = torch.randn_like(a)
        report.check(f"n=2^20+3 {dtype}", tilebook.vector_add(a, b), a.double() + b.double())
    report.assert_ok()

    exponents = (24, 26, 28) if quick else range(20, 29)
    rows = [
        {"kernel": "vector_add", "shape": f"2^{r['log2n']}", **r}
        for r in experiment.sizes(exponents, **TIMING)
    ]
    if not quick:
        # No baseline: the runner's table skips these rows; the record keeps them.
        rows += [
            {"kernel": "vector_add launch setting", "shape": r["setting"], "impl": "tilebook", **r}
            for r in experiment.launch_settings(rounds=3)
        ]
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"{r['kernel']:>26} {r['shape']:>9} {r['impl']:>10} {r['gbps']:8.0f} GB/s")
