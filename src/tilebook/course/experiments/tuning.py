"""What lesson 13 (autotune, pipelining, pitfalls) reads from its runs, said once here.

The lesson runs its kernels (the autotuned sum with and without hooks, the stale key,
the compiled warps x stages grid, the five pitfalls) and passes what they gave to
these functions, which make the tables, check the claims and build the sentences the
page shows::

    tuning.hooks_said(hook_rows, configs=2, runs=7)  # the sentence
    tuning.check_hooks(Claims("13 autotune", tuning.HERE), hook_rows, runs=7)

Each ``check_*`` and ``read_*`` function checks its claims on the data it is given
(a claim the data contradict stops the build) and the ``*_said`` functions return
:class:`~tilebook.course.prose.Prose`.  Unlike the measurements of the other modules
here, these run in either mode: they read what the page computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..prose import say
from ..tables import table

__all__ = [
    "HERE",
    "RESULT",
    "accumulator_said",
    "check_grid",
    "check_hooks",
    "check_pitfalls",
    "check_speed",
    "hooks_said",
    "hooks_table",
    "mask_said",
    "offsets_table",
    "printed_said",
    "spill_said",
    "stale_table",
]

#: Where the page's own results come from, for a table's caption and the claims' box.
HERE = "this page's run"
#: The columns of a result against its expected value (rows of the lesson's ``outcome``).
RESULT = {"result": ("got", "{:.2f}"), "expected": ("want", "{:.2f}"), "": "verdict"}


def hooks_table(rows: Sequence[Mapping[str, Any]]):
    """The autotuned sum for each start of ``out`` and each hook."""
    return table(rows, {"out before": "start", "hook": "hook", **RESULT}, caption=HERE)


def hooks_said(rows: Sequence[Mapping[str, Any]], configs: int, runs: int):
    """What the unhooked run from zero (``rows[0]``) gave: ``configs`` configurations
    run three times each plus the launch, ``runs`` additions of the sum."""
    return say(
        "{configs} configurations run three times each, plus the real launch, make "
        "{runs} additions of the sum: the unhooked result is {over:.2f} times it.",
        configs=configs,
        runs=runs,
        over=rows[0]["got"] / rows[0]["want"],
    )


def check_hooks(claims: Any, rows: Sequence[Mapping[str, Any]], runs: int):
    """Check ``claims`` on the hooks' rows (``start``, ``hook``, ``got``, ``want``,
    ``verdict``; the unhooked run from zero first): without a hook the sum is added
    once per run, ``runs`` in all; ``reset_to_zero`` is right from zero only;
    ``restore_value`` is right from both.  Returns ``claims``."""
    ok = {(r["start"], r["hook"]): r["verdict"] == "right" for r in rows}
    claims.check(
        "without a hook, tuning adds into out", round(rows[0]["got"] / rows[0]["want"]) == runs
    )
    claims.check(
        "reset_to_zero is right from zero and wrong on a running total",
        ok[0, "reset_to_zero"] and not ok[100, "reset_to_zero"],
    )
    return claims.check(
        "restore_value is right in both", all(ok[t, "restore_value"] for t in (0, 100))
    )


def stale_table(rows: Sequence[Mapping[str, Any]]):
    """The whole-``x`` sum for each key and length, with the block it used."""
    return table(rows, {"key": "key", "n": "n", "BLOCK used": "block", **RESULT}, caption=HERE)


def check_grid(
    claims: Any,
    facts: Mapping[tuple[int, int], Mapping[str, Any]],
    per_stage: int,
    needed: int | None,
    limit: int,
):
    """Check ``claims`` on the compiled grid: ``facts`` maps ``(warps, stages)`` to a
    row of :func:`~tilebook.course.aot.instruction_table`; ``per_stage`` is the bytes
    of one stage's tiles; ``needed`` what the compiler said the deeper pipeline
    needs (None if it compiled); ``limit`` the shared memory one program may have."""
    fewest = min(w for w, _ in facts)
    claims.check(
        "shared memory is one stage's tiles of A and B times the stages",
        all(f["shared_bytes"] == s * per_stage for (_, s), f in facts.items()),
    )
    claims.check(
        "the deeper pipeline needs more shared memory than one program may have",
        needed is not None and needed > limit,
    )
    claims.check(
        "only the fewer-warp settings spill",
        all((f["spill_bytes"] > 0) == (w == fewest) for (w, _), f in facts.items()),
    )
    claims.check(
        "one stage copies through registers, more stages copy asynchronously",
        all(
            (f["LDGSTS"] > 0) == (s > 1) and (f["LDG"] > 0) == (s == 1)
            for (_, s), f in facts.items()
        ),
    )
    return claims


def spill_said(
    fewest: Any, most: Any, tile: Mapping[str, int], warps: Sequence[int], deep: int,
    needed: int | None, limit: int,
):  # fmt: skip
    """Registers and spills at the fewest and the most ``warps`` (the compiled kernels
    ``fewest`` and ``most``), and the shared memory ``deep`` stages would need."""
    from ..datasheet import fact

    per_thread = tile["BLOCK_M"] * tile["BLOCK_N"] // fact("cuda.warp_size").value
    return say(
        "At {few} warps a thread holds {acc} accumulator values and the compiler "
        "spills {spill} bytes; at {many} it uses {regs} registers, no spill.  "
        "{deep} stages would need {need:.0f} KiB against {limit:.0f}.",
        few=min(warps),
        acc=per_thread // min(warps),
        spill=fewest.spill_stores_bytes,
        many=max(warps),
        regs=most.registers,
        deep=deep,
        need=needed / 1024 if needed else float("nan"),
        limit=limit / 1024,
    )


def check_speed(claims: Any, timed: Any, warps: Sequence[int], stages: Sequence[int]):
    """Check ``claims`` on the timed grid (``timed``, a record or None): the most warps
    at the deepest pipeline beat no pipeline, and beat the fewest warps there."""
    from ..claims import speedup

    best = (max(warps), max(stages))
    for text, other in [
        ("the deepest pipeline that fits beats no pipeline", (max(warps), min(stages))),
        ("more warps beat the spilling setting at that depth", (min(warps), max(stages))),
    ]:
        found = None
        if timed is not None:
            found = speedup(*(timed.one(warps=w, stages=s) for w, s in (best, other)))
        claims.check(text, bool(found and found.faster), found.evidence() if found else "")
    return claims


def accumulator_said(n: int, errors: Mapping[str, float]):
    """The relative errors of the fp16 (``e16``) and float32 (``e32``) running sums."""
    return say(
        "Over {n} fp16 values the fp16 accumulator is off by {e16:.1e} of the sum, "
        "the float32 one by {e32:.1e}.",
        n=n,
        **errors,
    )


def mask_said(sums: Mapping[str, float], want: float):
    """The sums without (``bad``) and with (``good``) the mask, against ``want``."""
    return say(
        "Without the mask the sum is {bad:.4g}, with it {good:.4g} (float64: {want:.4g}).",
        want=want,
        **sums,
    )


def offsets_table(first_row: int, narrow: Sequence[int], wide: Sequence[int], row_len: int):
    """Each row's offset computed in int32 (``narrow``) and in int64 (``wide``)."""
    rows = [
        {"row": first_row + i, "i32": a, "i64": b}
        for i, (a, b) in enumerate(zip(narrow, wide, strict=True))
    ]
    columns = {"row": "row", "int32 offset": "i32", "int64 offset": "i64"}
    return table(rows, columns, caption=f"rows of ROW_LEN = {row_len}, {HERE}")


def check_pitfalls(
    claims: Any, errors: Mapping[str, float], said_acc: Any, sums: Mapping[str, float],
    said_mask: Any, first_row: int, narrow: Sequence[int], wide: Sequence[int],
    stale: Mapping[str, Any],
) -> list[Any]:  # fmt: skip
    """Check ``claims`` that each pitfall's broken side is wrong: the fp16 sum
    (``errors["e16"]``) is off by more than fp16's epsilon, the unmasked sum
    (``sums["bad"]``) is wrong, the int32 offsets (``narrow``) wrap, the stale block
    gives a wrong sum (``stale``: its ``outcome`` row).  Returns the
    :class:`~tilebook.course.widgets_pipeline.Pitfall` of each, for the widget."""
    import torch

    from ..widgets_pipeline import Pitfall

    wrap = narrow.index(min(narrow))  # the first row whose int32 offset wrapped
    offset = f"row {first_row + wrap} starts at {narrow[wrap]}, not {wide[wrap]}"
    got = f"at n = {stale['n']} the sum is {stale['got']:.2f}, not {stale['want']:.2f}"
    eps = torch.finfo(torch.float16).eps
    claims.check("the fp16 sum is off", errors["e16"] > eps, said_acc)
    claims.check("the unmasked sum is wrong", sums["bad"] > 2 * sums["good"], said_mask)
    claims.check("int32 offsets wrap past 2^31 elements", narrow[wrap] < 0, offset)
    claims.check("the stale BLOCK gives a wrong sum", stale["verdict"] == "wrong", got)
    return [
        Pitfall("fp16 accumulator", str(said_acc), "accumulate in float32"),
        Pitfall("no mask", str(said_mask), "mask the lanes past the end"),
        Pitfall("int32 offsets", f"past 2^31 elements, {offset}", "multiply in int64"),
        Pitfall("n left out of the key", f"BLOCK is stale: {got}", "put n in the key"),
    ]


def printed_said(gpu: bool):
    """Where a kernel's ``print`` went: C stdout on a GPU, above under the interpreter."""
    return say(
        "On a GPU it is a ``tl.device_print`` to C stdout: run the script to see it."
        if gpu
        else "Under the interpreter the print is Python's: its line is above."
    )
