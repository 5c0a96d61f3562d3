"""Where an eager call's host time goes: per op call, the Python-level function calls
and the functions that take the most time, from cProfile, beside the unprofiled host
time.  Only public calls, so it runs against any tree (``PYTHONPATH=<tree>/src``);
``benchmarks/before_after.py`` says *whether* host time changed, this says *where*.

    PYTHONPATH=src python benchmarks/host_calls.py [--top 8] [CASE ...]

cProfile adds a fixed cost to every function it sees, so its seconds overstate small
functions; the call counts are exact and compare across trees.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

import tilebook

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_ab
from host_overhead import _host_us


def cases() -> dict:
    """host_ab's cases: tilebook's call of each, and torch's beside it."""
    out = {}
    for case, impls in host_ab.cases({"tilebook": tilebook}).items():
        out[case] = impls["tilebook"]
        out[f"torch {case}"] = impls["torch"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*")
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args(argv)
    print(tilebook.__file__)
    n = 400
    for name, fn in cases().items():
        if args.cases and name not in args.cases:
            continue
        host = _host_us(fn)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values()) / n
        print(f"\n== {name}: {host:.1f} us unprofiled, {calls:.0f} calls per op call")
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[: args.top]
        for (file, line, func), (_, nc, tt, _ct, _) in rows:
            where = f"{Path(file).name}:{line}" if line else "~"
            print(f"   {nc / n:5.1f} x {tt / nc * 1e6:6.2f} us  {func:<32.32} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
