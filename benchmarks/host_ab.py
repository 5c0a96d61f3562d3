"""Host time per eager call of two trees of tilebook in ONE process, in interleaved
rounds, beside torch and Liger-Kernel.

Host time on a shared machine drifts by half again between processes (torch's own
calls did, 2026-12-07), so two trees timed in two children can differ by more than
any change between them.  Here the tree before is loaded beside the tree after as a
package of another name: its ``src/tilebook`` is copied to ``tilebook_a`` with every
``tilebook`` identifier renamed (its ``torch.library`` namespace too, so the two
register apart).  Each round times every implementation of a case back to back, in
an order that rotates from round to round.

    PYTHONPATH=src python benchmarks/host_ab.py BEFORE_TREE [--rounds 7]

Small inputs (16 x 1024 bf16; 4096 fp32 for vector_add) without synchronisation,
forward and forward plus backward (``torch.autograd.grad``).  The table gives the
median over rounds of each round's fastest block, in microseconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def load_renamed(tree: Path, name: str = "tilebook_a"):
    """Import ``tree/src/tilebook`` as the package ``name``."""
    out = Path(tempfile.mkdtemp()) / name
    shutil.copytree(tree / "src" / "tilebook", out, ignore=shutil.ignore_patterns("course"))
    word = re.compile(r"\btilebook\b")
    for f in out.rglob("*.py"):
        f.write_text(word.sub(name, f.read_text()))
    sys.path.insert(0, str(out.parent))
    return importlib.import_module(name)


def cases(impls: dict) -> dict[str, dict]:
    """case -> {implementation: call}; ``impls``: name -> tilebook-like module."""
    import torch
    import torch.nn.functional as F

    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(16, 1024, device=dev, dtype=bf)
    w, b = torch.randn(1024, device=dev, dtype=bf), torch.randn(1024, device=dev, dtype=bf)
    dy = torch.randn_like(x)
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    v = torch.randn(4096, device=dev)

    def step(op, *ins):
        return lambda: torch.autograd.grad(op(*ins), ins, dy)

    out = {}
    for name, tb in impls.items():
        c = {
            "rms_norm fwd": lambda tb=tb: tb.rms_norm(x, w),
            "rms_norm fwd+bwd": step(lambda t, u, tb=tb: tb.rms_norm(t, u), xs, ws),
            "layer_norm fwd": lambda tb=tb: tb.layer_norm(x, w, b),
            "layer_norm fwd+bwd": step(lambda t, u, c, tb=tb: tb.layer_norm(t, u, c), xs, ws, bs),
            "softmax fwd": lambda tb=tb: tb.softmax(x),
            "softmax fwd+bwd": step(lambda t, tb=tb: tb.softmax(t), xs),
            "dropout fwd": lambda tb=tb: tb.dropout(x, 0.1, seed=1),
            "dropout fwd+bwd": step(lambda t, tb=tb: tb.dropout(t, 0.1, seed=1), xs),
            "vector_add": lambda tb=tb: tb.vector_add(v, v),
        }
        for case, fn in c.items():
            out.setdefault(case, {})[name] = fn
    torch_ops = {
        "rms_norm fwd": lambda: F.rms_norm(x, (1024,), w),
        "rms_norm fwd+bwd": step(lambda t, u: F.rms_norm(t, (1024,), u), xs, ws),
        "layer_norm fwd": lambda: F.layer_norm(x, (1024,), w, b),
        "layer_norm fwd+bwd": step(lambda t, u, c: F.layer_norm(t, (1024,), u, c), xs, ws, bs),
        "softmax fwd": lambda: torch.softmax(x, -1),
        "softmax fwd+bwd": step(lambda t: torch.softmax(t, -1), xs),
        "dropout fwd": lambda: F.dropout(x, 0.1),
        "dropout fwd+bwd": step(lambda t: F.dropout(t, 0.1), xs),
        "vector_add": lambda: torch.add(v, v),
    }
    for case, fn in torch_ops.items():
        out[case]["torch"] = fn
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except ImportError:
        return out
    rms = lambda t, u: LigerRMSNormFunction.apply(t, u, 1e-6)
    ln = lambda t, u, c: LigerLayerNormFunction.apply(t, u, c, 1e-5)
    sm = LigerSoftmaxFunction.apply
    out["rms_norm fwd"]["liger"] = lambda: rms(x, w)
    out["rms_norm fwd+bwd"]["liger"] = step(rms, xs, ws)
    out["layer_norm fwd"]["liger"] = lambda: ln(x, w, b)
    out["layer_norm fwd+bwd"]["liger"] = step(ln, xs, ws, bs)
    out["softmax fwd"]["liger"] = lambda: sm(x)
    out["softmax fwd+bwd"]["liger"] = step(sm, xs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="the tree before (its src/ holds tilebook)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    from host_overhead import _host_us

    import tilebook

    old = load_renamed(args.before)
    print(f"{tilebook.banner()}\na = {args.before} ({old.__file__}), b = {tilebook.__file__}")
    table = cases({"a": old, "b": tilebook})
    got: dict[str, dict[str, list[float]]] = {c: {k: [] for k in v} for c, v in table.items()}
    for r in range(args.rounds):
        for case, impls in table.items():
            names = list(impls)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                got[case][name].append(_host_us(impls[name], blocks=3))
    med = {c: {k: statistics.median(v) for k, v in d.items()} for c, d in got.items()}
    cols = ("a", "b", "torch", "liger")
    print(f"\nhost µs per eager call, median of {args.rounds} interleaved rounds")
    print(
        f"{'case':<20}"
        + "".join(f"{c:>8}" for c in cols)
        + f"{'b/a':>7}{'b/torch':>8}{'b/liger':>8}"
    )
    for case, m in med.items():
        cells = "".join(f"{m[c]:8.1f}" if c in m else f"{'-':>8}" for c in cols)
        ratios = "".join(f"{m['b'] / m[c]:{w}.2f}" if c in m else f"{'-':>{w}}"
                         for c, w in (("a", 7), ("torch", 8), ("liger", 8)))  # fmt: skip
        print(f"{case:<20}{cells}{ratios}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": got, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
