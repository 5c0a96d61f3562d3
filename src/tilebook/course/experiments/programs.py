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

Below them, what the lesson says of these measurements, made from the data of its
build: the tables (``*_table``), the claims (``*_claims``, for
:meth:`tilebook.course.claims.Claims.check_all`), the sentences (``say_*``) and
the grid explorer's settings, so that the lesson shows each in one line.

Under the interpreter nothing is compiled: a kernel there is an
``InterpretedFunction`` with no binaries (:func:`binaries` returns None).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "EXPLORER",
    "NUMBERINGS",
    "SURE",
    "binaries",
    "cache_keys",
    "check_explorer",
    "first_call_claims",
    "first_calls",
    "first_calls_table",
    "fresh_cache_dir",
    "load_widths_table",
    "no_record",
    "say_binaries",
    "say_first_calls",
    "say_kernel_kind",
    "say_start_order",
    "specialisation_claims",
    "specialisations",
    "specialisations_table",
    "start_order",
    "start_order_claims",
    "start_order_table",
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


# What lesson 02 says of these measurements: its tables, claims and sentences, made
# from the data of the build (a record may be None: no GPU has measured it yet).


def no_record() -> Any:
    """The sentence a page shows where a GPU record is missing."""
    from ..prose import say

    return say("No GPU record of this is committed yet: run the lesson on a GPU.")


def say_kernel_kind(kernel: Any) -> Any:
    """What ``@triton.jit`` made of ``kernel``: its class and its arguments."""
    from ..prose import say

    kind = type(kernel).__name__
    return say(
        "Here ``{name}`` is {article} ``{kind}`` with arguments {args}.  On a "
        "GPU it is a ``JITFunction``, which compiles; under the interpreter that runs this "
        "page on a CPU, an ``InterpretedFunction``, which compiles nothing and runs "
        "each program in turn as NumPy.",
        name=kernel.__name__,
        article="an" if kind[0] in "AEIOU" else "a",
        kind=kind,
        args=", ".join(f"``{a}``" for a in kernel.arg_names),
    )


#: How many standard deviations of a random order a fraction of pairs in order
#: must clear to be called an order (a random order gets beyond six about once in
#: a billion).
SURE = 6


def start_order_table(order: Any) -> Any:
    """The table of a :func:`start_order` record, or :func:`no_record`."""
    from ..tables import table

    if not order:
        return no_record()
    columns = {
        "numbering": "numbering",
        "programs": "programs",
        "pairs in order": ("in_order", "{:.3f}"),
        "random order": lambda r: f"0.5 ± {r['chance_sd']:.3f}",
        "ticket = number": "same_place",
        "median |ticket - number|": ("median_shift", "{:,.0f}"),
    }
    return table(order.rows, columns, caption=order.caption())


def start_order_claims(order: Any) -> dict[str, Any]:
    """The claims a :func:`start_order` record supports, for :meth:`Claims.check_all`."""
    if not order:
        return {"Programs start mostly in the order of their linear index": False}
    fit = {r["numbering"]: r for r in order.rows}
    first, other = fit["axis 0 fastest"], fit["axis 1 fastest"]
    margin = SURE * first["chance_sd"]
    return {
        "Programs start mostly in the order of their linear index, beyond chance": (
            first["in_order"] > 0.5 + margin,
            f"{first['in_order']:.3f} of pairs in order; chance stays below {0.5 + margin:.3f}",
        ),
        "The linear index fits the start order better than its transpose": (
            first["in_order"] > other["in_order"] + margin,
            f"{first['in_order']:.3f} against {other['in_order']:.3f}",
        ),
    }


def say_start_order(here: Sequence[dict[str, Any]], order: Any) -> Any:
    """What the order of this run (``here``, :func:`start_order` rows) and of the
    record shown (``order``) say: the interpreter's fixed order against a GPU's."""
    from ...runtime import is_interpreter
    from ..prose import say

    exact = [r["numbering"] for r in here if r["same_place"] == r["programs"]]
    if is_interpreter():
        gpu = "No GPU has recorded its order yet."
        if order:
            best = max(order.rows, key=lambda r: r["in_order"])
            gpu = "The record above, of {}, has them start mostly {}{}.".format(
                order.provenance.get("gpu", "a GPU"),
                f"in the order of ``{best['numbering']}``",
                "" if exact == [best["numbering"]] else ": not the interpreter's order",
            )
        return say(
            "Under the interpreter, which ran this page, the {n} programs took their "
            "tickets {how}: it runs one program at a time, in loops over the axes.  "
            "{gpu}  A kernel must not depend on the order its programs run in.",
            n=here[0]["programs"],
            how=f"exactly in the order of ``{exact[0]}``" if exact else "in no fixed order",
            gpu=gpu,
        )
    linear = {r["numbering"]: r for r in order.rows}["axis 0 fastest"]
    return say(
        "Of the {n:,} programs, {same:,} took exactly the ticket of their linear "
        "index, and half took one within {shift:,.0f} of it: programs that start "
        "together race for the counter.",
        n=linear["programs"],
        same=linear["same_place"],
        shift=linear["median_shift"],
    )


#: The grid rules of lesson 02's explorer, and the sizes its arithmetic is checked at.
GRID_RULES = ("cdiv", "floor", "swapped axes")
EXPLORER_CHECKS = ((40, 64, 16, 16), (100, 24, 32, 8))


#: The settings of lesson 02's :class:`~tilebook.course.widgets_grid.GridExplorer`.
EXPLORER = {
    "sizes": [8, 16, 24, 40, 64, 100],
    "tiles": [8, 16, 32],
    "caption": "computed from the grid rule; checked against stamp_tiles_kernel",
    "initial": {"m": 40, "n": 64, "block_m": 16, "block_n": 16, "grid": "cdiv"},
}


def check_explorer(stamp_tiles: Callable[..., torch.Tensor]) -> Any:
    """The explorer's owners against a kernel's own output, per tile, for each rule.

    ``stamp_tiles(m, n, block_m, block_n, grid)`` launches lesson 02's
    ``stamp_tiles_kernel`` and returns the ``(1, m, n)`` map it wrote.  Returns a
    :class:`~tilebook.course.check.CorrectnessReport` (call ``assert_ok``).
    """
    from ..check import CorrectnessReport
    from ..widgets_grid import GridExplorer

    agree = CorrectnessReport("grid explorer vs the kernel's own output, per tile")
    for rule in GRID_RULES:
        for m, n, bm, bn in EXPLORER_CHECKS:
            g = GridExplorer.grid(m, n, bm, bn, rule)
            got = stamp_tiles(m, n, bm, bn, g)[0, ::bm, ::bn]  # each tile's corner
            want = torch.tensor(GridExplorer.owners(m, n, bm, bn, rule), device=got.device)
            agree.check(f"{rule} {m}x{n} / {bm}x{bn}", got, want, tol=0)
    return agree


def specialisations_table(spec: Any) -> Any:
    """The table of a :func:`specialisations` record, or :func:`no_record`."""
    from ..tables import table

    if not spec:
        return no_record()
    columns = {
        "#": "step",
        "call (what changed)": "call",
        "binaries": "binaries",
        "compiled?": lambda r: "new binary" if r["new"] else "reused",
    }
    return table(spec.rows, columns, caption=spec.caption())


def specialisation_claims(spec: Any, new: Mapping[str, bool], held: int | None) -> dict:
    """The claims of a :func:`specialisations` record: which calls compiled (``new``:
    ``{label: compiles}``), and that the cache holds the binaries the table counts
    (``held``: what the kernel holds now, None under the interpreter)."""
    claims: dict[str, Any] = {}
    for label, compiled in new.items():
        verb = "compiles a new binary" if compiled else "reuses a binary"

        def check(label=label, compiled=compiled):
            got = bool(spec.one(call=label)["new"])
            return got == compiled, f"new binaries: {int(got)}"

        claims[f"{label}: {verb}"] = check

    def cache():
        last, added = spec.rows[-1]["binaries"], sum(r["new"] for r in spec.rows)
        where = "" if held is None else f", this process's cache: {held}"
        return last == added and held in (
            None,
            last,
        ), f"last row: {last}, new binaries: {added}{where}"

    claims["After the calls the cache holds one binary per new binary of the table"] = cache
    return claims


def load_widths_table(builds: Mapping[str, Any], arch: int = 90) -> Any:
    """Wide and narrow loads, and registers, of each ahead-of-time build of a kernel."""
    from ..tables import table

    return table(
        [{"build": name, "k": k} for name, k in builds.items()],
        {
            "specialisation": "build",
            "16-byte loads": lambda r: r["k"].count(r"LDG\.E\.128"),
            "4-byte loads": lambda r: r["k"].count(r"LDG\.E(?!\.\d)"),
            "registers": lambda r: r["k"].registers,
        },
        caption=f"scale_kernel compiled for sm_{arch} ahead of time",
    )


def first_calls_table(first: Any) -> Any:
    """The table of a :func:`first_calls` record, or :func:`no_record`."""
    from ..tables import table

    if not first:
        return no_record()
    columns = {
        "call": "call",
        "median ms": ("median_ms", "{:.3f}"),
        "p20-p80 ms": lambda r: f"{r['p20_ms']:.3f}-{r['p80_ms']:.3f}",
        "samples": "samples",
    }
    return table(first.rows, columns, caption=first.caption())


def first_call_claims(first: Any) -> dict[str, Any]:
    """The claims of a :func:`first_calls` record: each temperature of the cache is
    faster than the one before, beyond the spread."""
    from ..claims import speedup

    def row(call):
        return first.one(call=call)

    def faster(a, b, a_says, b_says):
        def check():
            c = speedup(row(a), row(b))
            return c.faster, c.evidence(a_says, b_says)

        return check

    return {
        "Loading a binary from the disk cache is faster than compiling it": faster(
            "disk cache", "compile", "the disk cache", "compiling"
        ),
        "A later call, with the binary in memory, is faster still": faster(
            "later call", "disk cache", "a later call", "the disk cache"
        ),
    }


def say_first_calls(first: Any) -> Any:
    """What a :func:`first_calls` record says a first call costs, or :func:`no_record`."""
    from ..prose import say

    if not first:
        return no_record()
    # three significant digits each, and the quotient of the figures as printed,
    # so that a reader who divides them gets the sentence's count
    c, d, l_us = (
        float(f"{v:.3g}")
        for v in (
            first.one(call="compile")["median_ms"],
            first.one(call="disk cache")["median_ms"],
            1e3 * first.one(call="later call")["median_ms"],
        )
    )
    return say(
        "Compiling took {c:,g} ms, loading from disk {d:,g} ms, and a later "
        "call {l:,g} µs: the first call of each specialisation costs about "
        "{x:,.0f} later calls.  Warm up a kernel before you time it (``do_bench`` "
        "does), and expect a pause wherever a program meets a new specialisation.",
        c=c,
        d=d,
        l=l_us,
        x=float(f"{1e3 * c / l_us:.3g}"),
    )


def say_binaries(kernel: Any, first: Any, held: int | None) -> Any:
    """What ``kernel`` holds after the page's calls (``held`` after the table's,
    before :func:`first_calls`), and, under the interpreter, why it holds nothing."""
    from ...runtime import is_interpreter
    from ..prose import say

    if is_interpreter():
        assert binaries(kernel) is None  # no cache to ask
        return say(
            "This page ran under the interpreter, where ``{name}`` is an "
            "``{kind}`` with no cache of binaries at all: nothing is compiled, and "
            "the first call costs what every call costs.  The figures above {where}.",
            name=kernel.__name__,
            kind=type(kernel).__name__,
            where="are the GPU record" if first else "await a run on a GPU",
        )
    count = binaries(kernel)
    return say(
        "The calls of the table left ``{name}`` holding {held} binaries, as its "
        "last row says.  To make a call compile, ``first_calls`` empties that cache "
        "before each of its {rounds} rounds, so the kernel now holds {count} {noun}: "
        "{what}.",
        name=kernel.__name__,
        held=held,
        rounds=first.one(call="compile")["samples"] if first else 0,
        count=count,
        noun="binary" if count == 1 else "binaries",
        what="the timed call's alone" if count == 1 else "those of the timed calls",
    )
