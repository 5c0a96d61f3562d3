"""Measure every tilebook kernel against its baselines on a GPU (``nox -s bench``).

Each benchmark module in this folder has ``run(quick) -> rows``; this script
runs them, saves each as a record ``bench_<module>`` (with provenance and the
copy bandwidth measured in the same process) and prints one table:
kernel, shape, ours, baseline, ratio.

    python benchmarks/run_all.py [--quick] [--only softmax,rms_norm]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

import tilebook
from tilebook.course import bench

HERE = Path(__file__).parent
MODULES = [
    "vector_add",
    "linear_act",
    "matmul",
    "softmax",
    "rms_norm",
    "flash_attention",
    "layer_norm",
    "dropout",
]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"tilebook_bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rate(row: dict[str, Any]) -> tuple[float, str]:
    if row.get("tflops") is not None:
        return row["tflops"], "TFLOP/s"
    return row["gbps"], "GB/s"


def summarise(rows: list[dict[str, Any]], baseline: dict[str, list[str]]) -> list[tuple]:
    """(kernel, shape, dtype, ours, unit, baseline name, baseline rate, ratio) per point."""
    out = []
    keys = dict.fromkeys((r["kernel"], r["shape"], r.get("dtype", "")) for r in rows)
    for kernel, shape, dtype in keys:
        group = [
            r
            for r in rows
            if (r["kernel"], r["shape"], r.get("dtype", "")) == (kernel, shape, dtype)
        ]
        ours = [r for r in group if r["impl"] == "tilebook"]
        if not ours:
            continue
        allowed = baseline.get(kernel)
        if isinstance(allowed, str):
            allowed = [allowed]
        others = [
            r
            for r in group
            if r["impl"] != "tilebook" and (allowed is None or r["impl"] in allowed)
        ]
        if not others:
            continue
        best = max(others, key=lambda r: _rate(r)[0])
        rate, unit = _rate(ours[0])
        # The ratio of times is the ratio of rates: both count the same bytes or FLOPs.
        ratio = best["median_ms"] / ours[0]["median_ms"]
        out.append((kernel, shape, dtype, rate, unit, best["impl"], _rate(best)[0], ratio))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--only", default="", help="comma-separated module names")
    args = parser.parse_args(argv)
    if not tilebook.is_gpu():
        print(
            "nox -s bench needs a CUDA GPU: there is nothing to measure on a CPU.", file=sys.stderr
        )
        return 2
    print(tilebook.banner(), flush=True)
    names = [n for n in args.only.split(",") if n] or MODULES
    table: list[tuple] = []
    failed = []
    for name in names:
        print(f"== {name}", flush=True)
        try:
            module = _load(name)
            rows = module.run(quick=args.quick)
        except Exception:  # noqa: BLE001  (measure the other kernels; report at the end)
            traceback.print_exc()
            failed.append(name)
            continue
        print(f"   saved {bench.save_benchmark(name, rows)}", flush=True)
        table += summarise(rows, getattr(module, "BASELINE", {}))

    print()
    print(f"{'kernel':<16} {'shape':<20} {'dtype':<9} {'ours':>9} {'baseline':>22} {'ratio':>6}")
    for kernel, shape, dtype, rate, unit, bname, brate, ratio in table:
        print(
            f"{kernel:<16} {shape:<20} {dtype:<9} {rate:9.0f} {bname + ' ' + format(brate, '.0f'):>22} "
            f"{ratio:6.3f}  {unit}"
        )
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
