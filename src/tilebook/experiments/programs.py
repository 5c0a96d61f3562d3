"""The measurements of lesson 02 (programs and the grid): binaries and first calls.

* :func:`binaries` asks a ``@triton.jit`` kernel how many compiled binaries
  its in-memory cache holds, on every device (Triton's own cache, not a count
  we keep);
* :func:`specialisations` (GPU) runs a list of calls and records, after each,
  how many binaries exist, whether the call added one, and the key Triton
  filed it under;
* :func:`first_calls` (GPU) times a call that compiles (a fresh cache
  directory and an empty in-memory cache), one that finds its binary in the
  on-disk cache, and later calls that find it in memory.

Under the interpreter nothing is compiled: a kernel there is an
``InterpretedFunction`` with no binaries (:func:`binaries` returns None).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["binaries", "cache_keys", "first_calls", "fresh_cache_dir", "specialisations"]


def cache_keys(kernel: Any) -> list[str] | None:
    """The keys of ``kernel``'s compiled binaries, over every device; None if it has none.

    Triton keeps, per device, a tuple whose first item maps a key (the
    argument types, their specialisations and the launch options) to a
    compiled binary: ``kernel.device_caches[device][0]`` in Triton 3.x.
    """
    caches = getattr(kernel, "device_caches", None)
    if caches is None:  # the interpreter, or not a kernel
        return None
    keys = []
    for per_device in caches.values():
        table = per_device[0] if isinstance(per_device, tuple) else None
        if not isinstance(table, dict):
            raise TypeError(
                "this Triton keeps its compiled kernels in an unknown layout "
                f"({type(per_device).__name__}); tilebook reads device_caches[device][0]"
            )
        keys += [str(k) for k in table]
    return keys


def binaries(kernel: Any) -> int | None:
    """How many compiled binaries ``kernel`` holds in memory (None under the interpreter)."""
    keys = cache_keys(kernel)
    return None if keys is None else len(keys)


def _specialisation(key: str) -> str:
    """The argument part of a cache key: ``[('*fp32', 'D'), ('i32', ''), ...]``."""
    m = re.match(r"\s*(\[.*?\])\s*(?:\{|$)", key, re.S)
    return m.group(1) if m else key[:200]


def specialisations(
    kernel: Any, calls: Sequence[tuple[str, Callable[[], Any]]]
) -> list[dict[str, Any]]:
    """Run each ``(label, call)`` in order; after each, ask ``kernel`` what it compiled.

    Rows: ``step``, ``call`` (the label), ``binaries`` (in the cache after
    the call), ``new`` (binaries the call added: 0 or 1), ``key`` (the
    specialisation part of the new binary's key, or empty) and ``options``
    (the rest of that key: ``num_warps`` and the other launch options).
    GPU only: the interpreter compiles nothing.
    """
    if cache_keys(kernel) is None:
        raise RuntimeError("specialisations() needs a compiled kernel (GPU mode)")
    before = set(cache_keys(kernel))
    rows = []
    for step, (label, call) in enumerate(calls, 1):
        call()
        torch.cuda.synchronize()
        keys = cache_keys(kernel)
        new = [k for k in keys if k not in before]
        before = set(keys)
        spec = _specialisation(new[0]) if new else ""
        rows.append(
            {
                "step": step,
                "call": label,
                "binaries": len(keys),
                "new": len(new),
                "key": spec,
                "options": new[0][len(spec) :].strip()[:400] if new else "",
            }
        )
    return rows


@contextlib.contextmanager
def fresh_cache_dir() -> Iterator[str]:
    """Point Triton's on-disk cache at a new empty directory for the duration."""
    old = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="tilebook-cache-") as tmp:
        os.environ["TRITON_CACHE_DIR"] = tmp
        try:
            yield tmp
        finally:
            if old is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old


def _ms(call: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _row(label: str, times: list[float]) -> dict[str, Any]:
    q = torch.quantile(
        torch.tensor(times, dtype=torch.float64),
        torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64),
    )
    med, p20, p80 = (float(v) for v in q)
    return {"call": label, "median_ms": med, "p20_ms": p20, "p80_ms": p80, "samples": len(times)}


def first_calls(
    kernel: Any, call: Callable[[], Any], *, repeats: int = 3, later: int = 20
) -> list[dict[str, Any]]:
    """Wall time of ``call()`` (launching ``kernel``) at three temperatures of the cache.

    ``"compile"``: Triton's on-disk cache is a fresh directory and the
    kernel's in-memory cache is emptied, so the call compiles.
    ``"disk cache"``: the in-memory cache is emptied again, so the call
    finds its binary on disk and loads it.  ``"later call"``: the binary is in
    memory.  ``repeats`` rounds of the first two, ``later`` calls of the last;
    each row has the median and the 20th/80th percentiles of its samples.
    """
    if cache_keys(kernel) is None:
        raise RuntimeError("first_calls() needs a compiled kernel (GPU mode)")
    compile_ms, disk_ms = [], []
    for _ in range(repeats):
        with fresh_cache_dir():
            kernel.device_caches.clear()
            compile_ms.append(_ms(call))
            kernel.device_caches.clear()
            disk_ms.append(_ms(call))
    later_ms = [_ms(call) for _ in range(later)]
    return [
        _row("compile", compile_ms),
        _row("disk cache", disk_ms),
        _row("later call", later_ms),
    ]
