"""Linear layer + activation on a GPU: tilebook.linear_act against PyTorch, bf16.

Baselines, measured in the same run: ``F.gelu(F.linear(x, w, b))`` (what a model
runs unfused: cuBLAS with its bias epilogue, then an element-wise kernel) and
``F.linear`` alone (the matmul without the activation: the floor a fused kernel
has to match).  Each implementation is checked against float64 first; FLOPs
counted: 2*M*N*K (the activation's few per element are not counted).

    PYTHONPATH=src python benchmarks/linear_act.py
"""

from __future__ import annotations

import argparse
import json
import sys

import tilebook
from tilebook.course.experiments import linear_act as experiment

# run_all.py's ratio: against the unfused pair, the thing a fused kernel replaces.
BASELINE = {f"linear+{act}": ["unfused"] for act in experiment.TORCH_ACT}
# (M, N, K, activation): the headline transformer-MLP shape with every activation,
# then a SwiGLU-sized one, then a ragged batch (3 x 1001 tokens, 4095 outputs: rows
# not 16-byte aligned, so the output goes through a padded buffer).
SHAPES = [
    (8192, 4096, 4096, "gelu"),
    (8192, 4096, 4096, "gelu_tanh"),
    (8192, 4096, 4096, "silu"),
    (8192, 4096, 4096, "relu"),
    (4096, 11008, 4096, "silu"),
    (3003, 4095, 4096, "gelu"),
]
QUICK_SHAPES = SHAPES[:1]


def run(quick: bool = False) -> list[dict]:
    """Check, then time, linear_act against the unfused PyTorch pair and F.linear alone
    (the measurement lesson 09 shows, with more rounds)."""
    if not tilebook.is_gpu():
        raise RuntimeError("benchmarks/linear_act.py needs a CUDA GPU")
    shapes = QUICK_SHAPES if quick else SHAPES
    # Interleaved rounds: the three are within a few percent of one another, about as
    # much as the GPU's clocks drift over a run.
    return experiment.versus_torch(shapes, rounds=5, warmup=25, rep=100)


def table(rows: list[dict]) -> str:
    """One line per activation and shape: TFLOP/s, and each baseline's time / tilebook's."""
    impls = ("tilebook", "unfused", "F.linear")
    out = [
        f"{'kernel':<16} {'shape':>16} "
        + " ".join(f"{i:>9}" for i in impls)
        + f" {'x unfused':>9} {'x linear':>9}  (TFLOP/s; ratio = baseline time / tilebook time)"
    ]
    for kernel, shape in dict.fromkeys((r["kernel"], r["shape"]) for r in rows):
        by = {r["impl"]: r for r in rows if r["kernel"] == kernel and r["shape"] == shape}
        cells = " ".join(f"{by[i]['tflops']:9.0f}" for i in impls)
        ours = by["tilebook"]["median_ms"]
        ratios = " ".join(f"{by[i]['median_ms'] / ours:9.2f}" for i in impls[1:])
        out.append(f"{kernel:<16} {shape:>16} {cells} {ratios}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the headline shape only")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    print(tilebook.banner(), flush=True)
    rows = run(quick=args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
