"""Reductions across programs: the measurements of lesson 06, defined once.

A sum over more elements than one program holds ends with one number made
from every program's partial result.  Lesson 06 does that two ways and
measures both here:

* **atomics**: each program adds its partial sum into a float in memory with
  ``tl.atomic_add``; spread over ``slots`` addresses (program ``pid`` adds
  into ``pid % slots``) and finished by a small sum, the same kernel shows
  what *contention* costs: how many programs queue on one address;
* **per-program partial sums**: each program stores its partial sum, and the
  same kernel runs again on the partials until one number is left (the way
  lesson 11 sums the weight gradient).

The lesson passes its own launchers, so what is timed is the kernels the
page shows.  Two measurements:

* :func:`contention`: the atomic sum for each number of addresses, the
  partial sums and ``torch.sum``, timed in interleaved rounds;
* :func:`repeatability`: each way run many times on the same input, and how
  many different results (bit patterns) came back.  Floating-point addition
  is not associative: the order in which atomics land changes the rounding.

Both check every result against a float64 sum first.  GPU only, like every
module of :mod:`tilebook.course.experiments`: on a CPU, Triton's interpreter runs the
programs one after another in a fixed order, so there is no contention to
time and no order to vary.

Below them, what lesson 06 says of its compiles, records and computations, on any
machine: the tables (``*_table``), the claims (``*_claims``, for
:meth:`tilebook.course.claims.Claims.check_all`) and the sentences (``say_*``), so that
the lesson shows each in one line.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..bench import compare
from ..claims import all_faster, speedup
from ..prose import say
from ..tables import table

__all__ = [
    "BLOCK",
    "DTYPE",
    "REPEAT_BLOCK",
    "REPEAT_N",
    "RUNS",
    "SLOTS",
    "TOLERANCE",
    "N",
    "accuracy_caption",
    "accuracy_claims",
    "accuracy_table",
    "aot_caption",
    "contention",
    "contention_claims",
    "contention_table",
    "distinct",
    "inputs",
    "lowering_claims",
    "no_record",
    "programs",
    "ptx_table",
    "repeat_claims",
    "repeat_table",
    "repeatability",
    "say_adds",
    "say_orders",
    "say_rescale_cost",
    "say_warps",
    "stepper_claims",
]

#: The dtype summed; the partial sums and the atomics are float32 too.
DTYPE = torch.float32
#: Elements summed by :func:`contention`: 64 MiB of float32 and a ragged end,
#: more than the L2 cache holds, so that reading them is a trip to HBM.
N = 2**24 + 7
#: Elements each program sums in :func:`contention`: a small block, so that
#: many programs end in an atomic and contention has something to show.
BLOCK = 256
#: Addresses the atomics are spread over: from all programs on one address to
#: a few programs on each.
SLOTS = (1, 16, 256, 4096)
#: Elements and block of :func:`repeatability` in lesson 06: thousands of
#: programs, each ending in one atomic.
REPEAT_N = 2**22 + 7
REPEAT_BLOCK = 1024
#: Runs of each way in :func:`repeatability`.
RUNS = 20
#: Largest relative error of a float32 sum of :func:`inputs` accepted as right
#: by :func:`repeatability`: the rounding of thousands of atomic adds stays far
#: below it, and a program left out (or added twice) is far above it.
TOLERANCE = 1e-4

SumFn = Callable[[], torch.Tensor]


def programs(n: int, block: int) -> int:
    """Programs that sum ``n`` elements, ``block`` each: ``cdiv(n, block)``."""
    if n < 1 or block < 1:
        raise ValueError(f"programs(): n and block must be positive, got {n}, {block}")
    return -(-n // block)


def distinct(values: Sequence[float]) -> int:
    """How many different float32 bit patterns ``values`` hold."""
    t = torch.tensor(list(values), dtype=torch.float32)
    return len(set(t.view(torch.int32).tolist()))


def inputs(
    n: int, *, device: str | torch.device = "cuda", seed: int = 0, exact: bool = False
) -> torch.Tensor:
    """``n`` float32 numbers in ``[0, 1)``: positive, so a relative error is meaningful.

    With ``exact``, each is 0 or 0.5: every partial sum and the total (below
    ``2**23`` for ``n`` up to ``2**25``) is a multiple of 0.5 that float32 holds
    exactly, so the sum is the same in any order and a check can ask for it
    exactly.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    if exact:
        if n > 2**25:
            raise ValueError(f"inputs(exact=True) holds its sums exactly up to 2**25, not {n}")
        bits = torch.randint(0, 2, (n,), device=device, generator=gen)
        return bits.to(DTYPE) * 0.5
    return torch.rand(n, device=device, dtype=DTYPE, generator=gen)


def _check(name: str, got: torch.Tensor, want: float, tol: float = TOLERANCE) -> float:
    value = float(got)
    err = abs(value - want) / max(abs(want), 1e-30)
    if not err <= tol:  # NaN fails too
        raise AssertionError(f"{name}: {value!r} against {want!r}, relative error {err:.2e}")
    return err


def contention(
    atomic_sum: Callable[[torch.Tensor, int, int], torch.Tensor],
    partial_sums: Callable[[torch.Tensor, int], torch.Tensor],
    *,
    n: int = N,
    block: int = BLOCK,
    slots: Sequence[int] = SLOTS,
    **timing: Any,
) -> list[dict[str, Any]]:
    """Time the atomic sum on each number of addresses against partial sums and torch.

    ``atomic_sum(x, block, slots)`` and ``partial_sums(x, block)`` return the
    sum of ``x`` as a one-element tensor (each allocates what it needs, which
    is timed with it).  One row per way: ``impl`` (``"atomic_add"``,
    ``"partial sums"`` or ``"torch.sum"``), ``slots`` (addresses; 0 where no
    atomic is used), ``programs``, ``per_address`` (programs adding into each
    address; 0 where none), ``n``, ``block`` and the timing fields, GB/s
    counting the ``4 * n`` bytes read.  The input is ``inputs(n, exact=True)``,
    so every way must return the exact sum.  ``timing`` goes to
    :func:`tilebook.course.bench.compare`.
    """
    x = inputs(n, exact=True)
    want = x.double().sum().item()
    p = programs(n, block)
    fns: dict[str, SumFn] = {}
    info: dict[str, dict[str, Any]] = {}
    for s in slots:
        name = f"atomic_add into {s}"
        fns[name] = lambda s=s: atomic_sum(x, block, s)
        info[name] = {"impl": "atomic_add", "slots": s, "per_address": math.ceil(p / s)}
    fns["partial sums"] = lambda: partial_sums(x, block)
    info["partial sums"] = {"impl": "partial sums", "slots": 0, "per_address": 0}
    fns["torch.sum"] = lambda: x.sum()
    info["torch.sum"] = {"impl": "torch.sum", "slots": 0, "per_address": 0}
    for name, fn in fns.items():  # compiles happen here, never inside the timing
        _check(name, fn(), want, tol=0.0)
    rows = []
    for r in compare(fns, bytes_moved=4 * n, **timing):
        label = r.pop("impl")
        rows.append({**info[label], "label": label, "programs": p, "n": n, "block": block, **r})
    return rows


def repeatability(
    sums: Mapping[str, SumFn],
    x: torch.Tensor,
    *,
    reference: Mapping[str, float] | None = None,
    runs: int = RUNS,
) -> list[dict[str, Any]]:
    """Run each of ``sums`` ``runs`` times on the same input; count the results.

    ``sums`` maps a name to a function of no arguments that returns a
    one-element tensor computed from ``x``; ``reference`` gives each name's
    exact answer (default: the float64 sum of ``x``).  One row per name:
    ``impl``, ``runs``, ``distinct`` (different bit patterns among the
    results), ``lowest`` and ``highest`` result, ``spread`` (their difference
    relative to the reference) and ``rel_err`` (the worst result's).
    """
    if not isinstance(runs, int) or runs < 2:
        raise ValueError(f"repeatability(): runs must be an int >= 2, got {runs!r}")
    total = x.double().sum().item()
    rows = []
    for name, fn in sums.items():
        want = float((reference or {}).get(name, total))
        got = []
        for _ in range(runs):
            got.append(float(fn()))
            _check(name, torch.tensor(got[-1]), want)
        lo, hi = min(got), max(got)
        rows.append(
            {
                "impl": name,
                "runs": runs,
                "distinct": distinct(got),
                "lowest": lo,
                "highest": hi,
                "spread": (hi - lo) / abs(want),
                "rel_err": max(abs(v - want) for v in got) / abs(want),
                "n": x.numel(),
            }
        )
    return rows


# What lesson 06 says.  ``counts`` holds a row per ``num_warps`` of the PTX
# instructions a block sum compiled to; ``ksum`` is one of those compiles and
# ``listing`` the PTX lines Triton credits to the kernel's ``tl.sum`` line.


def no_record() -> Any:
    return say("No GPU record of this is committed yet: run the lesson on a GPU.")


def aot_caption(block: int) -> str:
    import triton

    return f"BLOCK={block}, compiled for sm_90 by Triton {triton.__version__}"


def ptx_table(counts: Sequence[Mapping[str, Any]], block: int) -> Any:
    """The PTX instructions of a block sum, one row per ``num_warps``."""
    ops = [k for k in counts[0] if k not in ("warps", "per_thread")]
    columns = {"num_warps": "warps", "elements a thread": "per_thread"}
    return table(counts, columns | {op: op for op in ops}, caption=aot_caption(block))


def _adds(ksum: Any, listing: Sequence[Any]) -> tuple[set, set, dict, dict]:
    """The PTX's float adds, those listed, those credited to Triton's own files, and
    the PTX's line index."""
    ptx = ksum.stage("ptx").splitlines()
    adds = {n for n, ln in enumerate(ptx, 1) if re.search(r"\badd\.f32", ln)}
    listed = adds & {ln.number for ln in listing}
    index = ksum.line_index("ptx")
    library = {
        loc: adds.intersection(numbers)
        for loc, numbers in index.items()
        if loc[0] != ksum.kernel_file and adds.intersection(numbers)
    }
    return adds, listed, library, index


def say_adds(ksum: Any, listing: Sequence[Any]) -> Any:
    """Where the PTX's float adds come from: the listed lines, or Triton's combine."""
    adds, listed, library, index = _adds(ksum, listing)
    # the combine function: the location holding the most adds, the most specific
    combine = max(library, key=lambda c: (len(library[c]), -len(index[c]))) if library else None
    combine_src = dict(ksum.sources.get(combine[0], [])).get(combine[1], "?") if combine else ""
    share = "All" if listed == adds else "None" if not listed else f"{len(listed)}"
    held = len(library[combine]) if combine else 0
    them = "them" if held == len(adds) else f"{held} of them"
    caller = "as well" if listed else "not"
    why = (  # where the adds the listing misses are credited
        f": the PTX credits {them} to ``{combine_src.strip()}`` (line {combine[1]} of "
        f"Triton's {os.path.basename(combine[0])}), the combine function ``tl.sum`` adds "
        f"with, and {caller} to the kernel's line that called ``tl.sum``"
        if combine
        else ""
    )
    return say(
        "{s} of the {n} float adds of the PTX {v} among the lines listed{why}.",
        s=share,
        n=len(adds),
        v="is" if share == "None" else "are",
        why=why,
    )


def say_warps(w: int, e: int, warp: int) -> Any:
    """How ``w`` warps of ``warp`` threads sum a block, ``e`` elements a thread."""
    return say(
        "On {w} warps each thread holds {e} of the block's elements and adds them in "
        "its registers ({a} adds).  Then each warp combines its threads' sums in {lw} "
        "butterfly steps: a thread adds the value of the lane {hops} places away, so "
        "after the last step every lane holds the warp's sum.  Warps cannot read each "
        "other's registers: each writes its sum to shared memory, ``bar.sync`` waits "
        "until all are there, and the {w} sums are combined in {lx} more shuffles.",
        w=w,
        e=e,
        a=e - 1,
        lw=int(math.log2(warp)),
        hops=", ".join(str(warp >> k) for k in range(1, int(math.log2(warp)))) + " or 1",
        lx=int(math.log2(w)),
    )


def lowering_claims(
    counts: Sequence[Mapping[str, Any]], ksum: Any, listing: Sequence[Any], warp: int
) -> dict[str, Any]:
    """The claims of how a ``tl.sum`` lowers, on the PTX counts of the table; ``ksum``
    is the compile of ``counts[1]``."""
    adds, listed, library, _ = _adds(ksum, listing)
    seen = lambda op: ", ".join(f"num_warps={r['warps']}: {r[op]}" for r in counts)
    uses = [(r["warps"] > 1) == (r["bar.sync"] > 0) == (r["st.shared"] > 0) for r in counts]
    credited = ", ".join(f"{len(v)} in {os.path.basename(f)}:{n}" for (f, n), v in library.items())
    w = counts[1]["warps"]
    return {  # claim: (holds, evidence), on the PTX counts of the table
        "A tl.sum takes log2(32) shuffles in a warp plus log2(num_warps) across warps": (
            all(r["shfl.sync.bfly"] == math.log2(warp * r["warps"]) for r in counts),
            seen("shfl.sync.bfly"),
        ),
        "Every float add is one in a thread's registers or one after a shuffle": (
            all(r["add.f32"] == r["per_thread"] - 1 + r["shfl.sync.bfly"] for r in counts),
            seen("add.f32"),
        ),
        "Every float add of the PTX is the tl.sum line's or its combine function's": (
            len(adds) == counts[1]["add.f32"] and adds <= listed | set().union(*library.values()),
            f"num_warps={w}: {len(adds)} adds, {len(listed)} listed, {credited}",
        ),
        "One warp needs no shared memory and no barrier; more warps need both": (
            all(uses),
            seen("bar.sync"),
        ),
    }


def repeat_table(repeat: Any) -> Any:
    """How many different results each way gave over its runs."""
    if not repeat:
        return no_record()
    columns = {"way": "impl", "runs": "runs", "different results": "distinct"}
    columns |= {"spread": ("spread", "{:.1e}"), "worst error": ("rel_err", "{:.1e}")}
    return table(repeat.rows, columns, caption=repeat.caption())


def repeat_claims(repeat: Any) -> dict[str, Any]:
    """Which ways give the same bits from run to run, on the table's counts."""
    got = {r["impl"]: r["distinct"] for r in (repeat.rows if repeat else [])}
    return {  # claim: (holds, evidence)
        f"{way}: {'the same' if same else 'different'} bits from run to run": (
            got.get(way) is not None and (got.get(way) == 1) == same,
            f"{got.get(way)} different results",
        )
        for way, same in (("partial sums", 1), ("atomic_max", 1), ("atomic_add, one address", 0))
    }


def say_orders(parts: torch.Tensor, results: set[float]) -> Any:
    """What adding the same ``parts`` in several orders gave: ``results``."""
    return say(
        "Eight orders of the same {p:,} partial sums gave {d} different float32 "
        "result(s), from {lo:.9g} to {hi:.9g} (exact: {ex:.9g}).  A test that compares "
        "two runs with ``==`` fails whenever the order changes a last bit.",
        p=len(parts),
        d=len(results),
        lo=min(results),
        hi=max(results),
        ex=parts.double().sum().item(),
    )


def contention_table(cont: Any) -> Any:
    """Each way's time and rate, and each against the partial sums."""
    if not cont:
        return no_record()
    n, block = cont.rows[0]["n"], cont.rows[0]["block"]
    size = f"{n:,} numbers, {block:,} a program: {programs(n, block):,} programs"
    ref = cont.one(impl="partial sums")

    def against(r: Mapping[str, Any]) -> str:
        vs = speedup(r, ref)
        said = "faster than" if vs.faster else "slower than" if vs.slower else "level with"
        return f"{said} ({vs.ratio:.2f})"

    columns = {"way": "impl", "addresses": lambda r: r["slots"] or ""}
    columns |= {"programs each": lambda r: f"{r['per_address']:,}" if r["slots"] else ""}
    columns |= {"µs": lambda r: f"{1e3 * r['median_ms']:.1f}", "GB/s": ("gbps", "{:,.0f}")}
    columns |= {"against partial sums": lambda r: "" if r is ref else against(r)}
    return table(cont.rows, columns, caption=f"{size}; {cont.caption()}")


def contention_claims(cont: Any) -> dict[str, Any]:
    """That spreading the atomics pays up to a knee, on the table's times."""
    spread = sorted(cont.select(impl="atomic_add"), key=lambda r: r["slots"]) if cont else []
    pairs = {
        (str(b["slots"]), str(a["slots"])): speedup(b, a) for a, b in itertools.pairwise(spread)
    }
    gains = list(pairs.values())
    knee = spread[-2]["slots"] if cont else 0
    wider = f"Each wider spread pays up to {knee:,} addresses; the step past that gains less "
    return {
        wider + "than the one before it, if anything": lambda: (
            all_faster(dict(list(pairs.items())[:-1]))[0]
            and len(gains) > 1
            and gains[-1].high < gains[-2].low,  # the two spreads apart
            "; ".join(c.evidence(a, b) for (a, b), c in pairs.items()),
        )
    }


#: eps: below the relative error a float32 check tolerates.
MOST = 64


def accuracy_caption(rows: int, block: int) -> str:
    return f"float32, {rows} rows each, blocks of {block}; computed in this build"


def accuracy_table(accuracy: Sequence[Mapping[str, Any]], rows: int, block: int) -> Any:
    """The two-pass and online sums' errors, in eps, for each kind and length of row."""
    columns = {"row": "kind", "length": "n", "blocks": "blocks"}
    columns |= {f"{k} error (eps)": (k, "{:.2f}") for k in ("two-pass", "online")}
    return table(accuracy, columns, caption=accuracy_caption(rows, block))


def accuracy_claims(accuracy: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    worst = max(max(r["two-pass"], r["online"]) for r in accuracy)
    return {
        f"Both stay within {MOST} eps of the exact sum, inside a float32 check": (
            worst < MOST,
            f"largest error {worst:.2f} eps",
        )
    }


def say_rescale_cost(accuracy: Sequence[Mapping[str, Any]]) -> Any:
    """What the online sum's rescaling costs in accuracy, from the table."""
    gap = max(r["online"] - r["two-pass"] for r in accuracy)
    return say(
        "At most, the online error exceeds the two-pass error by {gap:.2f} eps: {what}.",
        gap=max(gap, 0.0),
        what="rescaling costs next to nothing"
        if gap < 2
        else "the rounding of each rescale's exponential adds to its error",
    )


def stepper_claims(settings: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The claims of the online softmax stepper, on every one of its ``settings``."""
    skip = [r for r in settings if r["knobs"]["rescale"] == "skip"]
    return {  # claim: (holds, evidence), on every setting of the stepper
        "With the rescale, every row and block length gives the true softmax": (
            all(r["verdict"] == "ok" for r in settings if r["knobs"]["rescale"] == "on"),
            f"{len(settings) // 2} settings",
        ),
        "Skipping it is wrong exactly where the maximum grows after the first block": (
            all((r["verdict"] == "wrong") == (r["rescales"] > 0) for r in skip),
            ", ".join(f"{r['knobs']['row']}/{r['knobs']['block']}: {r['verdict']}" for r in skip),
        ),
    }
