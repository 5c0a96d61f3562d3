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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..bench import compare

__all__ = [
    "BLOCK",
    "DTYPE",
    "REPEAT_BLOCK",
    "REPEAT_N",
    "RUNS",
    "SLOTS",
    "TOLERANCE",
    "N",
    "contention",
    "distinct",
    "inputs",
    "programs",
    "repeatability",
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
