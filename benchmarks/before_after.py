"""The ops of two source trees side by side: GPU time and host time, in interleaved rounds.

A refactor of the ops must keep their speed.  Two versions of ``tilebook`` cannot share
one process, so each round starts child processes per tree (``PYTHONPATH=<tree>/src``, one per op)
and the trees alternate, ``A B`` then ``B A``: a drift of the GPU's clocks or of the
host's load falls on both.  Each child measures, for every op and shape:

- the GPU time of the forward and of the backward through a replayed CUDA graph
  (``triton.testing.do_bench_cudagraph``): what the kernels cost, without the host;
- the host time of one eager call on a small input, forward and forward plus backward
  (:func:`host_overhead._host_us`: the fastest block of back-to-back calls).

The table gives each tree's median over the rounds and the ratio ``B / A`` (time: below
1 is faster).

    python benchmarks/before_after.py OLD_TREE NEW_TREE [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Rows of 2**26 bf16 elements each (128 MiB a tensor), cut at these row lengths.
ELEMENTS = 1 << 26
ROW_OPS = {"rms_norm": (1024, 4096, 16384), "layer_norm": (1024, 4096, 16384),
           "softmax": (1024, 4096), "dropout": (4096,)}  # fmt: skip


def graph_us(fn, calls: int = 20, replays: int = 15) -> float:
    """GPU microseconds per call of ``fn``: ``calls`` calls captured in one CUDA graph,
    the graph replayed ``replays`` times, the median replay over ``calls``.

    This is ``triton.testing.do_bench_cudagraph``'s method, with one difference that
    backward passes need: the graph is captured on the *current* stream, not on a
    stream of its own.  Autograd runs a backward on the stream its forward ran on; a
    forward recorded outside the capture on another stream sends the backward's
    kernels to that stream, which invalidates the capture ("operation failed due to a
    previous error during capture", and the process is unusable after it:
    ``benchmarks/capture_probe.py`` found it on an H100, 2026-12-07).  So the caller
    runs the forward and this capture on one stream (:func:`_child` does)."""
    import torch

    stream = torch.cuda.current_stream()
    if stream == torch.cuda.default_stream():
        raise RuntimeError("graph_us: run on a side stream (capture cannot use the default)")
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def _child(ops: str) -> None:
    """Measure the ops named in ``ops`` (comma-separated keys of ROW_OPS, ``"other"``
    for vector_add and matmul, ``"liger"`` for Liger-Kernel's host times) in this
    process and print the figures as JSON."""
    only = set(ops.split(","))
    import torch
    import torch.nn.functional as F

    import tilebook

    sys.path.insert(0, str(HERE))
    from host_overhead import _host_us

    bf, dev = torch.bfloat16, "cuda"

    def gpu_us(fn) -> float | None:
        for _ in range(3):  # first calls (compiling, planning) outside the capture
            fn()
        torch.cuda.synchronize()
        try:
            return graph_us(fn)
        except Exception as exc:  # noqa: BLE001
            print(f"  (no graph: {exc!r:.400})", file=sys.stderr)
            return None

    def op_call(name, x, w, b):
        if name == "rms_norm":
            return lambda: tilebook.rms_norm(x, w)
        if name == "layer_norm":
            return lambda: tilebook.layer_norm(x, w, b)
        if name == "softmax":
            return lambda: tilebook.softmax(x)
        return lambda: tilebook.dropout(x, 0.1, seed=1)

    out = {}
    side = torch.cuda.Stream()  # every forward and every capture on this one stream
    with torch.cuda.stream(side):
        _graph_figures(only, out, gpu_us, op_call)
    torch.cuda.synchronize()
    # Host time of one eager call on a small input (16 x 1024 bf16).
    x = torch.randn(16, 1024, device=dev, dtype=bf)
    w, b = torch.randn(1024, device=dev, dtype=bf), torch.randn(1024, device=dev, dtype=bf)
    dy = torch.randn_like(x)
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))

    def step(op, *ins):
        return lambda: torch.autograd.grad(op(*ins), ins, dy)

    small = {
        "rms_norm": (lambda: tilebook.rms_norm(x, w), step(tilebook.rms_norm, xs, ws),
                     lambda: F.rms_norm(x, (1024,), w),
                     step(lambda t, u: F.rms_norm(t, (1024,), u), xs, ws)),
        "layer_norm": (lambda: tilebook.layer_norm(x, w, b), step(tilebook.layer_norm, xs, ws, bs),
                       lambda: F.layer_norm(x, (1024,), w, b),
                       step(lambda t, u, c: F.layer_norm(t, (1024,), u, c), xs, ws, bs)),
        "softmax": (lambda: tilebook.softmax(x), step(tilebook.softmax, xs),
                    lambda: torch.softmax(x, -1), step(lambda t: torch.softmax(t, -1), xs)),
        "dropout": (lambda: tilebook.dropout(x, 0.1, seed=1),
                    step(lambda t: tilebook.dropout(t, 0.1, seed=1), xs),
                    lambda: F.dropout(x, 0.1), step(lambda t: F.dropout(t, 0.1), xs)),
    }  # fmt: skip
    s = torch.randn(4096, device=dev)
    for name, (fwd, fb, tfwd, tfb) in small.items():
        if name not in only:
            continue
        out[f"host {name} fwd"] = _host_us(fwd)
        out[f"host {name} fwd+bwd"] = _host_us(fb)
        out[f"host torch {name} fwd"] = _host_us(tfwd)
        out[f"host torch {name} fwd+bwd"] = _host_us(tfb)
    liger = _liger() if "liger" in only else {}
    for name, lfwd in liger.items():
        ins = (xs, ws, bs)[: {"softmax": 1, "rms_norm": 2}.get(name, 3)]
        out[f"host liger {name} fwd"] = _host_us(lambda lfwd=lfwd: lfwd(x, w, b))
        out[f"host liger {name} fwd+bwd"] = _host_us(step(lfwd, *ins))
    if "other" in only:
        out["host vector_add"] = _host_us(lambda: tilebook.vector_add(s, s))
        out["host torch.add"] = _host_us(lambda: torch.add(s, s))
    print(json.dumps({"banner": tilebook.banner(), "file": tilebook.__file__, "us": out}))


def _graph_figures(only, out, gpu_us, op_call) -> None:
    """GPU time of each op's forward and backward, and of vector_add and matmul, into
    ``out`` (run on a side stream: see :func:`graph_us`)."""
    import torch

    import tilebook

    bf, dev = torch.bfloat16, "cuda"
    for name, hiddens in ROW_OPS.items():
        if name not in only:
            continue
        for n in hiddens:
            rows = ELEMENTS // n
            x = torch.randn(rows, n, device=dev, dtype=bf)
            w = (1 + 0.1 * torch.randn(n, device=dev)).to(bf)
            b = (0.1 * torch.randn(n, device=dev)).to(bf)
            out[f"{name} fwd {rows}x{n}"] = gpu_us(op_call(name, x, w, b))
            xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
            y = op_call(name, xg, wg, bg)()
            dy = torch.randn_like(y)
            ins = [t for t in (xg, wg, bg) if name in ("rms_norm", "layer_norm") or t is xg]
            ins = ins[:2] if name == "rms_norm" else ins

            def bwd(y=y, ins=ins, dy=dy):
                return torch.autograd.grad(y, ins, dy, retain_graph=True)

            out[f"{name} bwd {rows}x{n}"] = gpu_us(bwd)
            del x, w, b, xg, wg, bg, y, dy
            torch.cuda.empty_cache()
    if "other" in only:
        v = torch.randn(ELEMENTS, device=dev)
        out[f"vector_add {ELEMENTS}"] = gpu_us(lambda: tilebook.vector_add(v, v))
        m = torch.randn(2048, 2048, device=dev, dtype=bf)
        out["matmul 2048^3"] = gpu_us(lambda: tilebook.matmul(m, m))


def _liger() -> dict:
    """Liger-Kernel's forward per op, where its wheel is importable (its own API)."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except ImportError:
        return {}
    return {
        "rms_norm": lambda x, w, b=None: LigerRMSNormFunction.apply(x, w, 1e-6),
        "layer_norm": lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, 1e-5),
        "softmax": lambda x, *_: LigerSoftmaxFunction.apply(x),
    }


def _run(tree: Path, ops: str) -> dict:
    """One child's figures; a child that fails reports its error and gives none."""
    # The tree's src goes first; what was on the path (Liger-Kernel's wheel) stays.
    path = os.pathsep.join(p for p in (str(tree / "src"), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run([sys.executable, __file__, "--child", ops], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode:
        print(f"{tree} {ops}: child failed\n{proc.stderr[-1500:]}", file=sys.stderr)
        return {"us": {}, "banner": "", "file": ""}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measure(tree: Path, liger: bool) -> tuple[dict, str]:
    """Every op of one tree: in one child, or one child per op where that fails (a
    failed capture can leave a process unusable)."""
    ops = [*ROW_OPS, "other"]
    res = _run(tree, ",".join(ops + ["liger"] * liger))
    if not res["us"]:
        parts = [_run(tree, op) for op in ops + ["liger"] * liger]
        res = {"us": {k: v for p in parts for k, v in p["us"].items()},
               "banner": next((p["banner"] for p in parts if p["banner"]), "")}  # fmt: skip
    return res["us"], res["banner"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="the tree before (its src/ holds tilebook)")
    p.add_argument("b", type=Path, help="the tree after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    got: dict[str, list[dict]] = {"a": [], "b": []}
    banner = ""
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            figures, banner = _measure(getattr(args, side), liger=side == "b")
            got[side].append(figures)
            print(f"round {r + 1} {side}: {len(figures)} figures", file=sys.stderr, flush=True)
    keys = list(dict.fromkeys(k for runs in got.values() for run in runs for k in run))

    def median(side, k):
        vals = [v for run in got[side] if (v := run.get(k)) is not None]
        return statistics.median(vals) if vals else None

    med = {s: {k: median(s, k) for k in keys} for s in got}
    print(f"{banner}\nrounds: {args.rounds}; a = {args.a}, b = {args.b}")
    print(f"{'measure (µs)':<40}{'a':>10}{'b':>10}{'b / a':>8}")
    for k in keys:
        a, b = med["a"][k], med["b"][k]
        ratio = f"{b / a:8.3f}" if a and b else f"{'-':>8}"
        fa, fb = (f"{v:10.1f}" if v is not None else f"{'-':>10}" for v in (a, b))
        print(f"{k:<40}{fa}{fb}{ratio}")
    print(f"\nhost µs per eager call (b): {'op':<22}{'tilebook':>9}{'torch':>8}{'liger':>8}"
          f"{'/ torch':>8}{'/ liger':>8}")  # fmt: skip
    b = med["b"]
    for op in ROW_OPS:
        for part in ("fwd", "fwd+bwd"):
            ours, torch_, liger = (b.get(f"host {w}{op} {part}") for w in ("", "torch ", "liger "))
            if ours is None:
                continue
            cells = [f"{v:8.1f}" if v else f"{'-':>8}" for v in (torch_, liger)]
            ratios = [f"{ours / v:8.2f}" if v else f"{'-':>8}" for v in (torch_, liger)]
            print(f"{'':27}{op + ' ' + part:<22}{ours:9.1f}{''.join(cells)}{''.join(ratios)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": got, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2])
    else:
        sys.exit(main())
