"""The measurements of lesson 02 (programs and the grid): binaries and first calls.

* :func:`binaries` asks a ``@triton.jit`` kernel how many compiled binaries
  its in-memory cache holds, on every device (Triton's own cache, not a count
  we keep);
* :func:`specialisations` (GPU) runs a list of calls and records, after each,
  how many binaries exist, whether the call added one, and the key Triton
  filed it under;
* :func:`first_calls` (GPU) times a call that compiles (a fresh cache
  directory and an empty in-memory cache), one that finds its binary in the
  on-disk cache, and later calls that find it in memory;
* :func:`start_order` compares the order in which the programs of a 2-D grid
  took tickets from one atomic counter with two ways of numbering the grid.

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

__all__ = [
    "NUMBERINGS",
    "binaries",
    "cache_keys",
    "first_calls",
    "fresh_cache_dir",
    "specialisations",
    "start_order",
]


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


#: Two ways to number the programs of a grid ``(g0, g1)``, as functions of the
#: index tensors ``(m, n, g0, g1)``: CUDA's (axis 0 counts fastest) and its transpose.
NUMBERINGS: dict[str, Callable[..., torch.Tensor]] = {
    "axis 0 fastest": lambda m, n, g0, g1: m + g0 * n,
    "axis 1 fastest": lambda m, n, g0, g1: n + g1 * m,
}


def _pairs_in_order(seq: torch.Tensor, chunk: int = 2048) -> float:
    """The fraction of pairs ``i < j`` with ``seq[i] < seq[j]`` (1 for a sorted sequence)."""
    s = seq.flatten().to(torch.int64).cpu()
    n = s.numel()
    if n < 2:
        return 1.0
    index = torch.arange(n)
    in_order = 0
    for start in range(0, n, chunk):  # a block of rows of the n x n comparison at a time
        block, rows = s[start : start + chunk, None], index[start : start + chunk, None]
        later = (index[None, start:] > rows) & (s[None, start:] > block)
        in_order += int(later.sum())
    return in_order / (n * (n - 1) / 2)


def start_order(tickets: torch.Tensor) -> list[dict[str, Any]]:
    """Compare the tickets a 2-D grid's programs took with each of :data:`NUMBERINGS`.

    ``tickets[m, n]`` is what program ``(m, n)`` got from ``tl.atomic_add(counter,
    1)`` on a counter that started at zero: how many programs reached the atomic
    before it, its place in the order the programs ran.  The tickets must be
    ``0, 1, ..., g0 * g1 - 1`` in some order (the atomic gives each value once);
    anything else raises :class:`ValueError`.

    One row per numbering: ``numbering``, ``grid`` (``"g0 x g1"``), ``programs``,
    ``in_order`` (the fraction of pairs of programs whose tickets come in the
    order of their numbers: 1 when the tickets are the numbering, about one half
    when unrelated to it), ``chance_sd`` (the standard deviation of ``in_order``
    over random orders of as many programs: Kendall's), ``same_place``
    (programs whose ticket is their number) and ``median_shift`` (the median of
    ``|ticket - number|``, in programs).
    """
    if not isinstance(tickets, torch.Tensor) or tickets.dim() != 2:
        raise ValueError("start_order() takes the (g0, g1) tensor of the grid's tickets")
    if tickets.dtype.is_floating_point or tickets.dtype.is_complex:
        raise ValueError(f"tickets are counts: an integer tensor, not {tickets.dtype}")
    t = tickets.to(torch.int64).cpu()
    g0, g1 = t.shape
    count = g0 * g1
    if not torch.equal(torch.sort(t.flatten()).values, torch.arange(count)):
        raise ValueError(
            f"the tickets of {count} programs are not 0 to {count - 1}, each once: "
            "a program that took no ticket, or two that took the same"
        )
    m = torch.arange(g0)[:, None].expand(g0, g1)
    n = torch.arange(g1)[None, :].expand(g0, g1)
    sd = ((2 * count + 5) / (18 * count * (count - 1))) ** 0.5 if count > 1 else 0.0
    rows = []
    for name, number in NUMBERINGS.items():
        num = number(m, n, g0, g1).flatten()
        by_number = torch.empty(count, dtype=torch.int64)
        by_number[num] = t.flatten()  # the tickets, listed in the order of the numbers
        rows.append(
            {
                "numbering": name,
                "grid": f"{g0} x {g1}",
                "programs": count,
                "in_order": _pairs_in_order(by_number),
                "chance_sd": sd,
                "same_place": int((by_number == torch.arange(count)).sum()),
                "median_shift": float((by_number - torch.arange(count)).abs().double().median()),
            }
        )
    return rows
