"""Which calls break a CUDA-graph capture of tilebook's row ops, and where.

A capture that fails leaves the process unusable, so every case runs in a child
process of its own.  Each child warms the call up outside the capture, then
captures ``calls`` calls of it and replays the graph; where the capture fails, it
replays the same capture under a Python profiler that asks CUDA, after every Python
and C call, whether the capturing stream is still capturing: the first call after
which it is invalidated is the culprit, printed with the stack that made it.

    PYTHONPATH=src python benchmarks/capture_probe.py [CASE ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

CASES = {
    # name: (op, rows, cols, calls, keep outputs, capture mode)
    "torch rms 65536x1024 x20": ("F.rms_norm", 65536, 1024, 20, False, "global"),
    "tb add 2^26 x20": ("vector_add", 1 << 26, 1, 20, False, "global"),
    "tb rms 65536x1024 x1": ("rms_norm", 65536, 1024, 1, False, "global"),
    "tb rms 65536x1024 x2": ("rms_norm", 65536, 1024, 2, False, "global"),
    "tb rms 65536x1024 x20": ("rms_norm", 65536, 1024, 20, False, "global"),
    "tb rms 65536x1024 x20 keep": ("rms_norm", 65536, 1024, 20, True, "global"),
    "tb rms 65536x1024 x20 relaxed": ("rms_norm", 65536, 1024, 20, False, "relaxed"),
    "tb rms 4096x1024 x20": ("rms_norm", 4096, 1024, 20, False, "global"),
    "tb rms-jit 65536x1024 x20": ("rms_jit", 65536, 1024, 20, False, "global"),
    "tb softmax 65536x1024 x20": ("softmax", 65536, 1024, 20, False, "global"),
    "tb rms bwd 65536x1024 x20": ("rms_bwd", 65536, 1024, 20, False, "global"),
}


_IS_CAPTURING = None


def _status(stream_ptr: int) -> int:
    """cudaStreamIsCapturing: 0 none, 1 active, 2 invalidated (legal during capture)."""
    global _IS_CAPTURING
    if _IS_CAPTURING is None:
        try:
            import cupy

            _IS_CAPTURING = lambda p: int(cupy.cuda.runtime.streamIsCapturing(p))
        except Exception:  # noqa: BLE001
            import ctypes
            import glob

            import torch

            libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**",
                                          "libcudart.so*"), recursive=True)  # fmt: skip
            lib = ctypes.CDLL(libs[0])

            def _ctypes(p):
                st = ctypes.c_int(-1)
                lib.cudaStreamIsCapturing(ctypes.c_void_p(p), ctypes.byref(st))
                return st.value

            _IS_CAPTURING = _ctypes
    return _IS_CAPTURING(stream_ptr)


def _make(op: str, rows: int, cols: int):
    import torch
    import torch.nn.functional as F

    import tilebook

    bf = torch.bfloat16
    if op == "vector_add":
        v = torch.randn(rows, device="cuda")
        return lambda: tilebook.vector_add(v, v)
    x = torch.randn(rows, cols, device="cuda", dtype=bf)
    w = (1 + 0.1 * torch.randn(cols, device="cuda")).to(bf)
    if op == "F.rms_norm":
        return lambda: F.rms_norm(x, (cols,), w)
    if op == "rms_norm":
        return lambda: tilebook.rms_norm(x, w)
    if op == "softmax":
        return lambda: tilebook.softmax(x)
    if op == "rms_jit":
        from tilebook.ops.rms_norm import rms_norm_fwd_kernel

        def jit():
            y = torch.empty_like(x)
            rms_norm_fwd_kernel[(rows // 4,)](x, w, y, y, rows, cols, cols, cols, 1e-6,
                                              BLOCK_N=cols, ROWS=4, STORE_RSTD=False,
                                              X_EVICT="", EVEN=True, num_warps=4)  # fmt: skip
            return y

        return jit
    if op == "rms_bwd":
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = tilebook.rms_norm(xg, wg)
        dy = torch.randn_like(y)
        return lambda: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True)
    raise ValueError(op)


def _warm(name: str):
    """The case's call, run a few times outside any capture (compiles, plans), and the
    stream query loaded: ``(fn, calls, keep, mode)``."""
    import torch

    op, rows, cols, calls, keep, mode = CASES[name]
    fn = _make(op, rows, cols)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    _status(torch.cuda.current_stream().cuda_stream)  # load the query before any capture
    return fn, calls, keep, mode


def _child(name: str) -> None:
    import torch

    fn, calls, keep, mode = _warm(name)
    out = {"case": name}

    def capture():
        kept = []
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(torch.cuda.Stream()):
            fn()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, capture_error_mode=mode):
                ptr = torch.cuda.current_stream().cuda_stream
                try:
                    for _ in range(calls):
                        r = fn()
                        if keep:
                            kept.append(r)
                finally:
                    out["status after calls"] = _status(ptr)
            graph.replay()
            torch.cuda.synchronize()

    try:
        capture()
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001
        out["ok"] = False
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
    print(json.dumps(out), flush=True)


def _child_trace(name: str) -> None:
    """The failing capture again, traced (a fresh process: the first one is spoiled)."""
    import torch

    fn, calls, _keep, mode = _warm(name)
    first_bad: list[str] = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph, capture_error_mode=mode):
                ptr = torch.cuda.current_stream().cuda_stream
                print("status at start", _status(ptr), flush=True)

                def prof(frame, event, arg):
                    if first_bad or event not in ("return", "c_return", "c_exception", "call"):
                        return
                    if _status(ptr) != 1:
                        what = (getattr(arg, "__qualname__", repr(arg)) if event.startswith("c_")
                                else frame.f_code.co_name)  # fmt: skip
                        first_bad.append(f"{event} {what} at {frame.f_code.co_filename}:"
                                         f"{frame.f_lineno}\n"
                                         + "".join(traceback.format_stack(frame)[-10:]))  # fmt: skip

                sys.setprofile(prof)
                try:
                    for i in range(calls):
                        fn()
                        if first_bad:
                            first_bad.append(f"(in call {i})")
                            break
                finally:
                    sys.setprofile(None)
        except Exception as exc:  # noqa: BLE001
            print("capture failed:", f"{exc}"[:300], flush=True)
    print("FIRST INVALIDATING EVENT:\n" + ("\n".join(first_bad) or "none seen"), flush=True)


def main() -> int:
    names = sys.argv[1:] or list(CASES)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rows = []
    for name in names:
        p = subprocess.run([sys.executable, __file__, "--child", name], env=env, check=False,
                           capture_output=True, text=True, timeout=240)  # fmt: skip
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        res = json.loads(lines[-1]) if lines else {"case": name, "ok": False,
                                                   "error": p.stderr[-600:]}  # fmt: skip
        rows.append(res)
        print(json.dumps(res), flush=True)
        if not res["ok"]:
            t = subprocess.run([sys.executable, __file__, "--trace", name], env=env, check=False,
                               capture_output=True, text=True, timeout=240)  # fmt: skip
            print(f"--- trace of {name}\n{t.stdout[-3000:]}\n{t.stderr[-1500:]}", flush=True)
    print("\ncase                                  ok   status error")
    for r in rows:
        print(f"{r['case']:<38}{r['ok']!s:<5}{r.get('status after calls', '-')!s:>7} "
              f"{r.get('error', '')[:60]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2])
    elif sys.argv[1:2] == ["--trace"]:
        _child_trace(sys.argv[2])
    else:
        sys.exit(main())
