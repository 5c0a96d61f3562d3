"""vector_add measurements shared by lesson 07 and ``benchmarks/vector_add.py``.

Two measurements, each defined once here:

* :func:`sizes`: :func:`tilebook.vector_add` against ``torch.add`` over vector
  lengths (the lesson plots them against the copy bandwidth; the benchmark
  holds tilebook to its target ratio), and at the smallest lengths each call's
  time split into host time and GPU time (:func:`host_and_gpu`);
* :func:`explain_gap`: which of the two parts accounts for the time by which
  one implementation trails the other under ``do_bench``;
* :func:`read_split`: the claims and sentences that a :func:`sizes` record's host
  and GPU times support (lesson 07);
* :func:`launch_settings`: :func:`tilebook.vector_add` at one length over a
  grid of ``BLOCK_SIZE`` and ``num_warps`` (the lesson's widget; the benchmark
  keeps the package's configuration honest).

Each function checks what it times against a float64 reference first, then
times the implementations in interleaved rounds (:func:`tilebook.course.bench.compare`)
so that their spread includes the drift of the GPU's clocks.  GB/s count the
bytes that must move: both inputs read once and the output written once,
``3 * n`` elements.  The measurements are GPU only, like every module of
:mod:`tilebook.course.experiments`.

Below them, what lesson 07 says of its records, on any machine: the tables
(``*_table``), the claims (``*_claims``, for
:meth:`tilebook.course.claims.Claims.check_all`), the sentences (``say_*``) and
its explorer's settings (:func:`explorer`), so that the lesson shows each in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from ...ops.vector_add import vector_add
from ..bench import compare, host_us
from ..check import default_tolerance

__all__ = [
    "BLOCKS",
    "DTYPE",
    "EXPLAINS",
    "EXPONENTS",
    "GAP",
    "GRAPH_MS",
    "HOST_CALLS",
    "IMPLS",
    "LAUNCH_N",
    "OVERLAP",
    "SAYS",
    "SPLIT_EXPONENTS",
    "WARPS",
    "Gap",
    "compiled_table",
    "elements_per_thread",
    "explain_gap",
    "explorer",
    "host_and_gpu",
    "launch_claims",
    "launch_settings",
    "read_split",
    "say_sizes",
    "setting",
    "sizes",
    "sizes_claims",
    "sizes_table",
    "slow_note",
    "span",
    "split_table",
    "traffic",
]

#: The dtype every measurement uses.
DTYPE = torch.float32
#: Vector lengths of the lesson's size sweep, as powers of two: from far below
#: what fills the GPU to three 1 GiB tensors.
EXPONENTS = tuple(range(12, 29, 2))
#: Where :func:`sizes` also splits a call's time into host and GPU time: the
#: lengths below three 256 MiB tensors, where tilebook may trail torch.add.
SPLIT_EXPONENTS = tuple(e for e in EXPONENTS if e < 26)
#: Calls per round of the host timing: far fewer than CUDA's launch queue holds, so
#: that the host never waits for the GPU while it is timed.
HOST_CALLS = 200
#: Milliseconds of calls that the CUDA graph of the GPU timing holds.
GRAPH_MS = 5.0
#: The share of ``do_bench``'s gap that a part (GPU or host time) must account
#: for to explain it: at least half, so that the larger part is always named.
EXPLAINS = 0.5
#: Length of the launch-setting sweep: three 256 MiB tensors, far beyond the L2
#: cache, so that the figures measure HBM.
LAUNCH_N = 2**26
#: The grid of the launch-setting sweep: the smallest block, the package's, and
#: the largest, each from one warp (many elements per thread) to sixteen (few).
#: Every setting is a compile, so the grid is as small as the lesson's story.
BLOCKS = (128, 4096, 16384)
WARPS = (1, 2, 8, 16)
_WARP_SIZE = 32  # threads in a warp on every CUDA GPU


def traffic(n: int, dtype: torch.dtype = DTYPE) -> int:
    """Bytes that ``x + y`` must move for ``n`` elements: two reads and one write."""
    return 3 * n * torch.empty((), dtype=dtype).element_size()


def elements_per_thread(block: int, warps: int) -> float:
    """Elements of a ``block``-element program that each of its threads owns."""
    return block / (_WARP_SIZE * warps)


def setting(block: int, warps: int) -> str:
    """The label of one launch setting, ``"4096/8"``."""
    return f"{block}/{warps}"


def _inputs(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    return a, b, torch.empty_like(a)


def _check(name: str, fn, out: torch.Tensor, ref: torch.Tensor) -> None:
    """Run ``fn`` on a poisoned ``out`` and raise unless it matches ``ref``."""
    out.fill_(float("nan"))  # an element the kernel fails to write stays NaN
    fn()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    tol = default_tolerance(out.dtype)
    if not err <= tol:  # NaN fails too
        raise AssertionError(f"vector_add {name}: relative error {err:.2e} > {tol:.0e}")


def _launcher(a, b, out, block: int, warps: int):
    return lambda: vector_add(a, b, out=out, block_size=block, num_warps=warps)


def _quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Median, 20th and 80th percentile, as :func:`tilebook.course.bench.measure_interleaved`
    takes them over its rounds."""
    q = torch.quantile(
        torch.tensor(values, dtype=torch.float64),
        torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64),
    )
    return tuple(float(v) for v in q)


def host_and_gpu(
    impls: dict[str, Callable[[], Any]], *, rounds: int = 3, calls: int = HOST_CALLS
) -> dict[str, dict[str, float]]:
    """Each call's host time and GPU time, in interleaved rounds, in microseconds.

    ``do_bench`` times a call between two CUDA events: the GPU's work, plus any
    time the GPU waits for the host to launch it.  This separates the two.

    * Host time: ``calls`` calls back to back with no synchronisation, timed
      with ``time.perf_counter``.  The launches queue up without blocking, so
      this is what one call costs the CPU (checks, Python, Triton's launcher).
    * GPU time: :func:`triton.testing.do_bench_cudagraph` captures the calls
      once in a CUDA graph and replays it: the host does nothing while it
      runs, so this is what one call costs the GPU, kernels back to back (the
      L2 cache is not emptied between them, as ``do_bench`` does).

    Returns, per name, ``host_us``, ``host_p20_us``, ``host_p80_us``, ``gpu_us``,
    ``gpu_p20_us`` and ``gpu_p80_us``: medians over the rounds, and their 20th and
    80th percentiles.
    """
    from triton.testing import do_bench_cudagraph

    host: dict[str, list[float]] = {name: [] for name in impls}
    gpu: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            host[name].append(host_us(fn, calls))
            med = do_bench_cudagraph(fn, rep=GRAPH_MS, quantiles=[0.5, 0.2, 0.8])[0]
            gpu[name].append(1e3 * float(med))
    out = {}
    for name in impls:
        h, g = _quantiles(host[name]), _quantiles(gpu[name])
        out[name] = {
            "host_us": h[0],
            "host_p20_us": h[1],
            "host_p80_us": h[2],
            "gpu_us": g[0],
            "gpu_p20_us": g[1],
            "gpu_p80_us": g[2],
        }
    return out


@dataclass(frozen=True)
class Gap:
    """Why one implementation trails another under ``do_bench``, in microseconds.

    ``gap_us`` is the difference of the two ``do_bench`` medians.  ``kernel_us``
    and ``host_us`` are the differences of the GPU times and of the host times
    (medians); ``kernel_low_us`` and ``host_low_us`` are the smallest differences
    the p20-p80 spreads allow (the trailing one's 20th percentile less the
    other's 80th).  A part *explains* the gap when even that smallest difference
    is at least ``share`` of it.
    """

    gap_us: float
    kernel_us: float
    kernel_low_us: float
    host_us: float
    host_low_us: float
    share: float = EXPLAINS

    @property
    def kernel(self) -> bool:
        """The kernel alone is longer by at least ``share`` of the gap, beyond the spreads."""
        return self.kernel_low_us >= self.share * self.gap_us

    @property
    def host(self) -> bool:
        """One call's host time is longer by at least ``share`` of the gap, beyond the spreads."""
        return self.host_low_us >= self.share * self.gap_us

    @property
    def kind(self) -> str:
        """``"kernel"``, ``"host"``, ``"both"`` or ``"neither"``: which part explains the gap."""
        if self.kernel and self.host:
            return "both"
        return "kernel" if self.kernel else "host" if self.host else "neither"


def _part_us(row: Mapping[str, Any], key: str) -> tuple[float, float, float]:
    names = (f"{key}_us", f"{key}_p20_us", f"{key}_p80_us")
    missing = [n for n in names if n not in row]
    if missing:
        raise KeyError(
            f"explain_gap: a row needs the host and GPU times of host_and_gpu(); "
            f"missing {', '.join(missing)}"
        )
    med, p20, p80 = (float(row[n]) for n in names)
    if not 0 < p20 <= med <= p80:
        raise ValueError(
            f"explain_gap: inconsistent {key} times: p20 {p20}, median {med}, p80 {p80}"
        )
    return med, p20, p80


def explain_gap(
    slow: Mapping[str, Any], fast: Mapping[str, Any], *, share: float = EXPLAINS
) -> Gap:
    """Which part of a call explains why ``slow`` takes longer than ``fast`` under ``do_bench``.

    Both are rows of :func:`sizes` at a split size: the ``do_bench`` times
    (``median_ms``) and the times of :func:`host_and_gpu`.  The GPU time is what
    the kernels cost with the host taken out; the host time bounds how long the
    GPU can wait for a launch.  A part that differs by much less than the gap
    cannot account for it, whatever else is true, so each part is held against
    the gap itself (see :class:`Gap`).  Raises ``ValueError`` unless ``slow``'s
    median is the longer and ``0 < share <= 1``.
    """
    if not 0 < share <= 1:
        raise ValueError(f"explain_gap: share must be in (0, 1], got {share}")
    try:
        gap = 1e3 * (float(slow["median_ms"]) - float(fast["median_ms"]))
    except KeyError as exc:
        raise KeyError(f"explain_gap: a row needs do_bench's median_ms; missing {exc}") from None
    if not gap > 0:
        raise ValueError(
            f"explain_gap: the first row must be the slower under do_bench, "
            f"got {slow['median_ms']} against {fast['median_ms']} ms"
        )
    (k_slow, k_slow20, _), (k_fast, _, k_fast80) = (_part_us(r, "gpu") for r in (slow, fast))
    (h_slow, h_slow20, _), (h_fast, _, h_fast80) = (_part_us(r, "host") for r in (slow, fast))
    return Gap(
        gap_us=gap,
        kernel_us=k_slow - k_fast,
        kernel_low_us=k_slow20 - k_fast80,
        host_us=h_slow - h_fast,
        host_low_us=h_slow20 - h_fast80,
        share=share,
    )


def sizes(
    exponents: Iterable[int] = EXPONENTS,
    *,
    dtype: torch.dtype = DTYPE,
    split: Iterable[int] = SPLIT_EXPONENTS,
    **timing: Any,
) -> list[dict[str, Any]]:
    """``tilebook`` against ``torch.add`` at ``n = 2**e`` for each exponent ``e``.

    One row per (size, implementation): ``n``, ``log2n``, ``dtype``, ``impl`` and
    the timing fields.  ``timing`` goes to :func:`tilebook.course.bench.compare`
    (``rounds``, ``warmup``, ``rep``).  At the exponents in ``split`` the rows
    also hold the host and GPU times of :func:`host_and_gpu`, taken in as many
    rounds.
    """
    split = set(split)
    rows = []
    for e in exponents:
        n = 2**e
        a, b, out = _inputs(n, dtype)
        impls = {
            "tilebook": lambda a=a, b=b, out=out: vector_add(a, b, out=out),
            "torch.add": lambda a=a, b=b, out=out: torch.add(a, b, out=out),
        }
        ref = a.double() + b.double()
        for name, fn in impls.items():  # compiles happen here, never inside the timing
            _check(f"{name} n=2^{e}", fn, out, ref)
        del ref
        dt = str(dtype).removeprefix("torch.")
        timed = compare(impls, bytes_moved=traffic(n, dtype), n=n, log2n=e, dtype=dt, **timing)
        if e in split:
            parts = host_and_gpu(impls, rounds=timing.get("rounds", 3))
            timed = [r | parts[r["impl"]] for r in timed]
        rows += timed
        del a, b, out
    return rows


def launch_settings(
    n: int = LAUNCH_N,
    *,
    blocks: Sequence[int] = BLOCKS,
    warps: Sequence[int] = WARPS,
    dtype: torch.dtype = DTYPE,
    **timing: Any,
) -> list[dict[str, Any]]:
    """``tilebook.vector_add`` at ``n`` elements for every ``BLOCK_SIZE`` x ``num_warps``.

    All settings are timed in the same interleaved rounds.  One row per setting:
    ``BLOCK_SIZE``, ``num_warps``, ``setting`` (``"4096/8"``),
    ``elements_per_thread``, ``programs`` (the grid), ``n``, ``dtype`` and the
    timing fields.
    """
    a, b, out = _inputs(n, dtype)
    ref = a.double() + b.double()
    impls = {}
    for bk in blocks:
        for w in warps:
            fn = _launcher(a, b, out, bk, w)
            _check(setting(bk, w), fn, out, ref)
            impls[setting(bk, w)] = fn
    del ref
    timed = {r["impl"]: r for r in compare(impls, bytes_moved=traffic(n, dtype), **timing)}
    rows = []
    for bk in blocks:
        for w in warps:
            r = dict(timed[setting(bk, w)])
            del r["impl"]
            rows.append(
                {
                    "BLOCK_SIZE": bk,
                    "num_warps": w,
                    "setting": setting(bk, w),
                    "elements_per_thread": elements_per_thread(bk, w),
                    "programs": triton.cdiv(n, bk),
                    "n": n,
                    "dtype": str(dtype).removeprefix("torch."),
                    **r,
                }
            )
    return rows


# Reading the split (lesson 07): the claims and the sentences that the host and GPU
# times of :func:`sizes` support.  They need both parts of every split row; the
# lesson states what they mean, and this is where they are checked and said.

#: What each kind of :class:`Gap` lets the lesson say, after :data:`GAP`.
SAYS = {
    "kernel": "the kernel can account for the gap; the host cannot.",
    "host": "the host can account for the gap (the GPU waiting for a launch that "
    "the host has not finished); the kernel cannot.",
    "both": "the kernel and the host could each account for the gap.",
    "neither": "neither is longer by {share:.0%} of the gap at the spreads' nearest "
    "ends, so neither explains it.  This split cannot see what do_bench adds "
    "around a lone kernel and a graph replay does not: an emptied L2 cache and a "
    "kernel's start.",
}
GAP = (
    "At {at}, tilebook's call takes {gap} µs longer than torch.add's under "
    "do_bench.  Subtracting torch.add's times from tilebook's leaves {kernel} µs "
    "for the kernels alone on the GPU and {host} µs for one call's host time.  So "
)
# Where the host's extra time is longer than the whole gap, the GPU did something
# else during part of it: in do_bench's loop, empty the L2 cache before each call.
OVERLAP = (
    "The host's extra time is longer than the gap itself: part of it passes while "
    "the GPU empties the L2 cache, which do_bench does before each call."
)


def span(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """``values`` as one figure, or as the range from the smallest to the largest."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo} to {hi}"


def _as_timed(row: Mapping[str, Any], key: str) -> dict[str, float]:
    """A row's host or GPU times (µs) as a timed row for ``speedup``: units cancel."""
    names = {"median_ms": "_us", "p20_ms": "_p20_us", "p80_ms": "_p80_us"}
    return {field: row[key + name] for field, name in names.items()}


def read_split(record: Any, claims: Any, *, small: int = 3) -> Any:
    """Check ``claims`` (a :class:`~tilebook.course.claims.Claims` on ``record``, a
    :func:`sizes` record) against its host and GPU times, and return the paragraphs
    (:class:`~tilebook.course.prose.Prose`) that say what they show.

    The claims: at the ``small`` smallest split sizes a graph replay takes the GPU
    less time than ``do_bench`` measures; at each size where tilebook trails
    torch.add beyond the spread, which part (:func:`explain_gap`) explains the gap.
    A record without the split (older than it) says so instead.
    """
    from ..claims import speedup
    from ..prose import say

    ex = record.values("log2n")
    named = {n: {e: record.one(log2n=e, impl=n) for e in ex} for n in ("tilebook", "torch.add")}
    ours, theirs = named.values()
    split = [e for e in ex if "gpu_us" in ours[e]]
    behind = [e for e in ex if speedup(ours[e], theirs[e]).slower]
    if not split:
        said = say(
            "The record shown ({cap}) holds no host or GPU times: it was measured "
            "before this page split them, and a GPU build of the page measures them.",
            cap=record.caption(),
        )
        if behind:
            said += say(
                "Without them, this record cannot say why torch.add is ahead at {sizes}.",
                sizes=", ".join(f"2^{e}" for e in behind),
            )
        return said
    host = {e: speedup(_as_timed(ours[e], "host"), _as_timed(theirs[e], "host")) for e in split}
    gaps = {e: explain_gap(ours[e], theirs[e]) for e in behind if e in split}
    why: dict[str, list[int]] = {}  # at each size where tilebook trails: which part explains
    for e, g in gaps.items():
        why.setdefault(g.kind, []).append(e)
    at = {kind: ", ".join(f"2^{e}" for e in es) for kind, es in why.items()}
    first = [(e, n, r) for e in ex[:small] if e in split for n, r in named.items()]
    claims.check(
        "At the smallest sizes a call replayed from a graph takes the GPU less time "
        "than do_bench measures, for both: do_bench adds a kernel's start and an "
        "emptied L2 cache",
        bool(first) and all(r[e]["gpu_p80_us"] < 1e3 * r[e]["p20_ms"] for e, _, r in first),
        "; ".join(f"{n} at 2^{e}: {r[e]['gpu_us']:.1f} µs" for e, n, r in first),
    )

    def differences(es, median, low):
        return "; ".join(
            f"2^{e}: {getattr(gaps[e], median):+.1f} µs ({getattr(gaps[e], low):+.1f} at "
            f"the nearest ends) of a gap of {gaps[e].gap_us:.1f} µs"
            for e in es
        )

    for kind, es in why.items():
        for name, median, parts in (
            ("kernel alone", "kernel_us", ("kernel", "both")),
            ("host time", "host_us", ("host", "both")),
        ):
            low = median.replace("_us", "_low_us")
            word = "at least" if kind in parts else "less than"
            claims.check(
                f"At {at[kind]}, tilebook's {name} is longer than torch.add's by {word} "
                f"{EXPLAINS:.0%} of the gap, at the spreads' nearest ends",
                all(
                    (getattr(gaps[e], low) >= EXPLAINS * gaps[e].gap_us) == (kind in parts)
                    for e in es
                ),
                differences(es, median, low),
            )

    t, a = ([r[e]["host_us"] for e in split] for r in (ours, theirs))
    verdict = say(
        "A call costs the host {t} µs in tilebook and {a} µs in torch.add (the "
        "medians); tilebook's is the longer, beyond the spread, at {n} of {m} sizes.  "
        "Its Python checks the inputs and goes through the autotuner and Triton's "
        "launcher; torch.add dispatches in C++.",
        t=span(t),
        a=span(a),
        n=sum(host[e].slower for e in split),
        m=len(split),
    )
    for kind, es in why.items():
        said = {
            "at": at[kind],
            "gap": span([gaps[e].gap_us for e in es]),
            "kernel": span([gaps[e].kernel_us for e in es], "{:+.1f}"),
            "host": span([gaps[e].host_us for e in es], "{:+.1f}"),
        }
        if kind == "neither":
            said["share"] = EXPLAINS
        verdict += say(GAP + SAYS[kind], **said)
        if kind in ("host", "both") and all(gaps[e].host_us > gaps[e].gap_us for e in es):
            verdict += say(OVERLAP)
    level = [e for e in split if e not in behind]  # where tilebook is not behind
    if why and level:
        extra = [ours[e]["host_us"] - theirs[e]["host_us"] for e in level]
        trailing = [g.host_us for g in gaps.values()]
        alike = min(extra) >= 0.8 * min(trailing) and max(extra) <= 1.25 * max(trailing)
        verdict += say(
            "Where tilebook is not behind ({at}) its host time is longer by {extra} µs, "
            "against {trail} µs where it trails{so}.",
            at=", ".join(f"2^{e}" for e in level),
            extra=span(extra, "{:+.1f}"),
            trail=span(trailing, "{:+.1f}"),
            so=": the extra host time is there at every size, so it does not decide "
            "alone which sizes trail"
            if alike
            else "",
        )
    return verdict


# What lesson 07 says of its two records besides the split: its tables, claims (for
# :meth:`tilebook.course.claims.Claims.check_all`), sentences and its explorer's
# settings, made from the data of the build, so that the lesson shows each in one line.

#: The two implementations of :func:`sizes`, in the order the page lists them.
IMPLS = ("tilebook", "torch.add")


def _by_size(record: Any) -> tuple[list[int], dict[int, dict[str, Any]], dict[int, Any]]:
    """A :func:`sizes` record's exponents, its rows by exponent then implementation,
    and tilebook against torch.add at each exponent."""
    from ..claims import speedup

    ex = record.values("log2n")
    at = {e: {i: record.one(log2n=e, impl=i) for i in IMPLS} for e in ex}
    return ex, at, {e: speedup(r["tilebook"], r["torch.add"]) for e, r in at.items()}


def sizes_table(record: Any) -> Any:
    """A :func:`sizes` record as a table: both times, tilebook's GB/s, both against the
    copy, and tilebook's verdict against torch.add ("ahead", "behind" or "tie")."""
    from ..tables import table

    _, at, vs = _by_size(record)
    copy = record.provenance["copy_gbps"]
    columns = {
        "n": lambda r: f"2^{r['e']}",
        **{f"{i} µs": lambda r, i=i: f"{1e3 * r[i]['median_ms']:.1f}" for i in IMPLS},
        "tilebook GB/s": lambda r: f"{r['tilebook']['gbps']:,.0f}",
        "of the copy (tilebook, torch.add)": lambda r: ", ".join(
            f"{r[i]['gbps'] / copy:.0%}" for i in IMPLS
        ),
        "": lambda r: vs[r["e"]].verdict,
    }
    return table([{"e": e, **r} for e, r in at.items()], columns, caption=record.caption())


def _from_size(record: Any, ok: Callable[[dict[str, Any]], bool]) -> int | None:
    """The smallest exponent from which ``ok(row)`` holds at every larger size."""
    ex = record.values("log2n")
    good = [e for e in ex if all(ok(r) for r in record.rows if r["log2n"] >= e)]
    return min(good, default=None)


def _reach(record: Any, near_copy: float) -> tuple[int | None, int | None]:
    """From which exponent both reach ``near_copy`` of the copy, and from which they tie."""
    _, _, vs = _by_size(record)
    copy = record.provenance["copy_gbps"]
    near = _from_size(record, lambda r: r["gbps"] >= near_copy * copy)
    return near, _from_size(record, lambda r: vs[r["log2n"]].tied)


def sizes_claims(record: Any, near_copy: float, above_copy: float) -> dict[str, Any]:
    """The claims a :func:`sizes` record supports: *close to the copy line* means at
    least ``near_copy`` of the copy's rate, *a few percent* above it at most
    ``above_copy``; the smallest sizes are the first three of the sweep."""
    ex, at, vs = _by_size(record)
    copy = record.provenance["copy_gbps"]
    near, tie = _reach(record, near_copy)
    t_torch = [at[e]["torch.add"]["median_ms"] for e in ex[:3]]
    grows = t_torch[-1] / t_torch[0]
    top = max(record.rows, key=lambda r: r["gbps"])
    return {
        "Both tilebook and torch.add come close to the copy line at the largest sizes": (
            near is not None,
            f"both from 2^{near} on",
        ),
        "Where both are close to the copy line, tilebook and torch.add tie": (
            near is not None and tie is not None and tie <= near,
            "; ".join(f"2^{e}: {vs[e].evidence('tilebook', 'torch.add')}" for e in ex[-3:]),
        ),
        f"No size of either runs more than {above_copy:.0%} faster than the copy": (
            top["gbps"] <= (1 + above_copy) * copy,
            f"the fastest: {top['impl']} at 2^{top['log2n']}, {top['gbps'] / copy:.0%}",
        ),
        "At the smallest sizes the time of torch.add hardly grows with the bytes": (
            grows < 2,
            f"{2 ** (ex[2] - ex[0])}x the bytes: {grows:.2f}x the time",
        ),
    }


def say_sizes(record: Any, near_copy: float) -> Any:
    """What a :func:`sizes` record says: from where both reach ``near_copy`` of the
    copy and tie, what the smallest sizes cost, and where torch.add is ahead."""
    from ..prose import say

    ex, at, vs = _by_size(record)
    near, tie = _reach(record, near_copy)
    t_torch = [at[e]["torch.add"]["median_ms"] for e in ex[:3]]
    behind = [f"2^{e}" for e in ex if vs[e].slower]
    return say(
        "Both reach {near:.0%} of the copy from 2^{e} elements on (three "
        "tensors of {mib:,.0f} MiB each), and from 2^{tie} on they tie at every size. "
        "At the smallest sizes torch.add takes {lo:.1f} to {hi:.1f} µs whatever the "
        "size: the cost of launching a kernel and waiting for its first bytes, which a "
        "small vector cannot hide.  {ahead}",
        near=near_copy,
        e=near,
        mib=2**near * 4 / 2**20,
        tie=tie,
        lo=1e3 * min(t_torch),
        hi=1e3 * max(t_torch),
        ahead=f"Below 2^{tie}, torch.add is ahead at {', '.join(behind)}." if behind else "",
    )


def split_table(record: Any) -> Any:
    """The host and GPU times of a :func:`sizes` record at its split sizes, as a
    table; None for a record without them."""
    from ..tables import table

    _, at, _ = _by_size(record)
    split = [{"e": e, **r} for e, r in at.items() if "gpu_us" in r["tilebook"]]
    if not split:
        return None
    columns = {"n": lambda r: f"2^{r['e']}"} | {
        f"{i}, {k} µs": lambda r, i=i, k=k: f"{r[i][k.lower() + '_us']:.1f}"
        for k in ("GPU", "host")
        for i in IMPLS
    }
    return table(split, columns, caption=f"medians over the rounds; {record.caption()}")


def compiled_table(
    shown: Sequence[dict[str, Any]], compiled: Mapping[str, Any], best: float
) -> Any:
    """The compiled code of the :func:`launch_settings` rows ``shown``: registers,
    spills and load widths (``compiled``: each setting's
    :class:`~tilebook.course.aot.CompiledKernel`), and each speed against the ``best``."""
    from ..tables import table

    columns = {
        "BLOCK_SIZE / num_warps": "setting",
        "elements per thread": ("elements_per_thread", "{:g}"),
        "registers": lambda r: compiled[r["setting"]].registers,
        "spilled bytes": lambda r: compiled[r["setting"]].spill_stores_bytes,
        "16-byte loads": lambda r: compiled[r["setting"]].count(r"LDG\.E\.128"),
        "narrower loads": lambda r: compiled[r["setting"]].count(r"LDG\.E(?!\.128)"),
        "of the best": lambda r: f"{r['gbps'] / best:.0%}",
    }
    caption = "compiled for sm_90 ahead of time; speeds from the sweep below"
    return table(shown, columns, caption=caption)


def _slow(record: Any, slow: float) -> tuple[float, list[dict[str, Any]], int]:
    """A :func:`launch_settings` record's best GB/s, its rows below ``slow`` of that,
    and its smallest block."""
    best = max(r["gbps"] for r in record.rows)
    slow_rows = [r for r in record.rows if r["gbps"] < slow * best]
    return best, slow_rows, min(record.values("BLOCK_SIZE"))


def slow_note(row: Mapping[str, Any], compiled: Mapping[str, Any], smallest: int) -> str:
    """Why a setting of :func:`launch_settings` is slow: which of the three kinds it is
    (the smallest block, more threads than elements, spills), from its row and, when
    it was compiled, its code; empty when it is of none."""
    k = compiled.get(row["setting"])
    parts = []
    if row["BLOCK_SIZE"] == smallest:
        parts.append(
            f"The smallest block, {row['programs']:,} programs: with one warp or "
            "two it runs at one speed, so its cost is per program."
        )
    if row["elements_per_thread"] < 1:
        parts.append(
            f"{_WARP_SIZE * row['num_warps']} threads for {row['BLOCK_SIZE']} elements: "
            "threads load copies of each other's elements."
        )
    if k is not None and k.spill_stores_bytes:
        parts.append(
            f"ptxas spills {k.spill_stores_bytes} bytes per thread at {k.registers} "
            f"registers: {row['elements_per_thread']:g} elements per thread do not fit."
        )
    return " ".join(parts)


def explorer(
    record: Any,
    compiled: Mapping[str, Any],
    copy: float,
    slow: float,
    initial: Mapping[str, int],
) -> dict[str, Any]:
    """The settings of lesson 07's :class:`~tilebook.course.widgets.SweepExplorer` over a
    :func:`launch_settings` record: each slow setting (below ``slow`` of the best) with
    its :func:`slow_note`, the ``copy`` as its ceiling, starting at ``initial``."""
    _, slow_rows, smallest = _slow(record, slow)
    rows = [
        {
            **r,
            "note": slow_note(r, compiled, smallest) if r in slow_rows else "",
            "detail": f"{r['elements_per_thread']:g} elements per thread, "
            f"{r['programs']:,} programs",
        }
        for r in record.rows
    ]
    return {
        "rows": rows,
        "knobs": ["BLOCK_SIZE", "num_warps"],
        "metric": "gbps",
        "unit": "GB/s",
        "title": "vector_add: BLOCK_SIZE and num_warps against measured bandwidth",
        "caption": record.caption(),
        "initial": dict(initial),
        "ceiling": copy,
        "ceiling_label": "the copy",
        "slow_fraction": slow,
        "note": "note",
        "extra": "detail",
    }


def launch_claims(
    record: Any,
    compiled: Mapping[str, Any],
    shown: Sequence[dict[str, Any]],
    slow: float,
    near_best: float,
    initial: Mapping[str, int],
) -> dict[str, Any]:
    """The claims a :func:`launch_settings` record and the compiled code of its rows
    ``shown`` support (``shown[1]``: the smallest block on one warp): *slow* means
    below ``slow`` of the best, *among the best* within ``near_best`` of it;
    ``initial`` is the package's setting."""
    from ..claims import speedup

    best, slow_rows, smallest = _slow(record, slow)
    pair = [record.one(BLOCK_SIZE=smallest, num_warps=w) for w in (1, 2)]
    per_program = speedup(*pair)
    spilled = [r for r in shown if compiled[r["setting"]].spill_stores_bytes]
    package = record.one(**initial)
    clean = compiled[shown[1]["setting"]]
    return {
        "At the smallest block one warp and two tie, and both are slow": (
            per_program.tied and all(r in slow_rows for r in pair),
            per_program.evidence("one warp", "two warps"),
        ),
        "Every setting that spills is slow": (
            bool(spilled) and all(r in slow_rows for r in spilled),
            ", ".join(f"{r['setting']}: {r['gbps'] / best:.0%} of the best" for r in spilled),
        ),
        "Every slow setting is of one of the three kinds": (
            all(slow_note(r, compiled, smallest) for r in slow_rows),
            f"{len(slow_rows)} slow settings of {len(record.rows)}",
        ),
        "At the smallest block the compiled code is clean: no spills, 16-byte loads only": (
            not clean.spill_stores_bytes and clean.count(r"LDG\.E(?!\.128)") == 0,
            clean.summary(),
        ),
        "The settings that are not slow form a plateau: all are among the best": (
            all(r["gbps"] >= near_best * best for r in record.rows if r not in slow_rows),
            f"{len(record.rows) - len(slow_rows)} settings",
        ),
        "The package's setting is among the best measured": (
            package["gbps"] >= near_best * best,
            f"{package['setting']}: {package['gbps'] / best:.0%} of the best",
        ),
    }
