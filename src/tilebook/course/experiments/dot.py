"""tl.dot measurements of lesson 05: what each kind of input costs in accuracy and speed.

One measurement, defined once here: :func:`paths` multiplies the same tile by
``tl.dot`` along each path the hardware offers, all with a float32
accumulator:

* float32 inputs with ``input_precision="ieee"``: a loop of fused multiply-adds
  (``FFMA``), no tensor cores;
* float32 inputs through the tensor cores as tf32 (the default) or as
  ``tf32x3`` (three tf32 products that recover most of float32's precision);
* float16 and bfloat16 inputs;
* on a GPU with fp8 tensor cores (compute capability 8.9 and up), fp8 e4m3 and
  e5m2 inputs.

For each path it reports two errors and a rate.  ``err`` is the relative
error (Frobenius norm) of one tile's product against float64 of the float32
data the inputs were made from: what choosing that path costs.  ``err_dot``
compares with float64 of the inputs as converted, so it shows the dot's own
arithmetic (tf32 rounding inside the tensor core; for 16-bit inputs only the
float32 accumulation).  The rate comes from :data:`repeat_dot_kernel`, which
loads its tile once and repeats the dot ``repeat`` times into its accumulator:
the operands stay on chip, so memory does not set the time, the instruction
does.  Every program multiplies the same tile (it stays in the L2 cache) and
writes its own output tile.  The paths are timed in interleaved rounds
(:func:`tilebook.course.bench.compare`).  GPU only, like every module of
:mod:`tilebook.course.experiments`.

Below it, what lesson 05 says of its compiles and measurements, on any machine: the
tables (``*_table``), the claims (``*_claims``, for
:meth:`tilebook.course.claims.Claims.check_all`), the sentences (``say_*``) and its
explorer's settings, so that the lesson shows each in one line.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from ..bench import compare
from ..claims import all_faster, speedup
from ..prose import say
from ..tables import table

__all__ = [
    "PATHS",
    "REPEAT",
    "TILE",
    "WARPS",
    "WAVES",
    "against_loop",
    "available_paths",
    "compiled_table",
    "errors_table",
    "explorer_setup",
    "grows_claims",
    "paths",
    "paths_claims",
    "paths_table",
    "repeat_dot_kernel",
    "rules_claims",
    "say_overlap",
    "say_tf32x3",
]

#: The paths, in the order a table shows them: name -> (input dtype, input_precision).
#: ``input_precision`` only matters for float32 inputs; the others pass the default.
PATHS: dict[str, tuple[torch.dtype, str]] = {
    "fp32 ieee": (torch.float32, "ieee"),
    "fp32 tf32x3": (torch.float32, "tf32x3"),
    "fp32 tf32": (torch.float32, "tf32"),
    "fp16": (torch.float16, "tf32"),
    "bf16": (torch.bfloat16, "tf32"),
    "fp8 e4m3": (torch.float8_e4m3fn, "tf32"),
    "fp8 e5m2": (torch.float8_e5m2, "tf32"),
}
#: The tile ``(M, N, K)`` every path multiplies: one Hopper warpgroup's wgmma tile.
TILE = (64, 64, 32)
#: Warps per program: one warpgroup.
WARPS = 4
#: Dots each program chains into its accumulator when timed.
REPEAT = 64
#: Programs launched per SM when timed.
WAVES = 8

# A dot's relative error against float64 of its converted inputs that a correct
# kernel stays under, by input precision (tf32 keeps 10 bits of mantissa; Hopper
# adds fp8 products with fewer bits than float32): the check before timing.
_DOT_TOL = {"ieee": 1e-5, "tf32x3": 1e-4, "tf32": 5e-3, "fp16": 1e-4, "bf16": 1e-4, "fp8": 5e-3}


@triton.jit(do_not_specialize=["repeat"])  # repeat=1 and repeat=64: one binary
def repeat_dot_kernel(
    a_ptr,  # (M, K), row-major: one tile, shared by every program
    b_ptr,  # (K, N), row-major
    c_ptr,  # (programs, M, N) float32: one output tile per program
    repeat,  # dots to chain into the accumulator
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    PRECISION: tl.constexpr,  # input_precision for float32 inputs
):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = tl.zeros((M, N), dtype=tl.float32)
    for _ in range(repeat):
        acc = tl.dot(a, b, acc, input_precision=PRECISION)  # acc + a @ b
    c = c_ptr + tl.program_id(0) * M * N
    tl.store(c + rm[:, None] * N + rn[None, :], acc)


def available_paths(capability: tuple[int, int] | None = None) -> list[str]:
    """The names in :data:`PATHS` that a GPU of compute ``capability`` runs.

    fp8 e4m3 needs 8.9 or newer in Triton; without a capability, the current GPU's.
    """
    if capability is None:
        capability = torch.cuda.get_device_capability()
    return [p for p in PATHS if not p.startswith("fp8") or tuple(capability) >= (8, 9)]


def _tol(path: str) -> float:
    dtype, precision = PATHS[path]
    if dtype == torch.float32:
        return _DOT_TOL[precision]
    return _DOT_TOL[path.split()[0]]


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def paths(
    names: list[str] | None = None,
    *,
    tile: tuple[int, int, int] = TILE,
    num_warps: int = WARPS,
    repeat: int = REPEAT,
    waves: int = WAVES,
    kernel: Any = None,
    seed: int = 0,
    **timing: Any,
) -> list[dict[str, Any]]:
    """Each path of :data:`PATHS`: its errors on one tile and its measured rate.

    Parameters
    ----------
    names
        Paths to run (default: :func:`available_paths` of this GPU).
    tile, num_warps
        ``(M, N, K)`` of the tile and the warps of each program.
    repeat, waves
        Dots chained per program, and programs launched per SM, when timed.
    kernel
        A kernel with the signature of :data:`repeat_dot_kernel` (default: that one;
        lesson 05 passes its own copy).
    timing
        Keywords for :func:`tilebook.course.bench.compare` (``rounds``, ``warmup``, ``rep``).

    Returns
    -------
    list of dict
        One row per path: ``path``, ``dtype``, ``precision``, ``M``, ``N``,
        ``K``, ``num_warps``, ``repeat``, ``programs``, ``err``, ``err_dot``
        and the timing fields of :func:`tilebook.course.bench.compare` (``impl`` is the
        path; ``tflops`` counts ``2 * M * N * K`` per dot).
    """
    names = available_paths() if names is None else list(names)
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        raise ValueError(f"unknown paths {unknown}; the paths are {list(PATHS)}")
    if repeat < 1 or waves < 1:
        raise ValueError(f"repeat and waves must be positive, got {repeat} and {waves}")
    kernel = repeat_dot_kernel if kernel is None else kernel
    m, n, k = tile
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a32 = torch.randn(m, k, device="cuda", generator=gen)
    b32 = torch.randn(k, n, device="cuda", generator=gen)
    exact = a32.double() @ b32.double()
    programs = waves * torch.cuda.get_device_properties(0).multi_processor_count
    c = torch.empty(programs, m, n, device="cuda")
    launches: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    for name in names:
        dtype, precision = PATHS[name]
        a, b = a32.to(dtype), b32.to(dtype)

        def run(grid, reps, a=a, b=b, precision=precision):
            kernel[grid](a, b, c, reps, M=m, N=n, K=k, PRECISION=precision, num_warps=num_warps)

        c.fill_(float("nan"))
        run((1,), 1)  # compiles here, never inside the timing
        one = c[0].clone()
        exact_in = a.float().double() @ b.float().double()  # fp8: via float32
        err_dot = _rel(one, exact_in)
        if not err_dot <= _tol(name):  # NaN fails too
            raise AssertionError(f"tl.dot {name}: relative error {err_dot:.2e} > {_tol(name):.0e}")
        c.fill_(float("nan"))
        run((programs,), repeat)
        chained = _rel(c, (repeat * exact_in).expand(programs, m, n))
        if not chained <= 4 * _tol(name):
            raise AssertionError(f"tl.dot {name}, {repeat} dots chained: error {chained:.2e}")
        info[name] = {
            "path": name,
            "dtype": str(dtype).removeprefix("torch."),
            "precision": precision if dtype == torch.float32 else "",
            "err": _rel(one, exact),
            "err_dot": err_dot,
        }
        launches[name] = lambda run=run: run((programs,), repeat)
    flops = 2 * m * n * k * repeat * programs
    timed = compare(launches, flops=flops, **timing)
    fields = {"M": m, "N": n, "K": k, "num_warps": num_warps, "repeat": repeat}
    return [{**info[r["impl"]], **fields, "programs": programs, **r} for r in timed]


# What lesson 05 says of its compiles and measurements.  A setting is
# ``(arch, "inputs -> accumulator", "tile, warps")``; ``ops`` maps a compiled setting to
# its dot instructions, most frequent first, and ``kernels`` to its compiled kernel.


def _family(op: str) -> str:
    return op.split(".")[0].replace("HFMA2", "FMA").replace("FFMA", "FMA")


def compiled_table(settings: Sequence[tuple], ops: Mapping, kernels: Mapping) -> Any:
    """The table of what ``tl.dot`` became in each compiled setting."""
    columns = {  # each a function of a setting's row
        "target": lambda r: f"sm_{r['s'][0]}",
        "inputs -> accumulator": lambda r: r["s"][1],
        "tile, warps": lambda r: r["s"][2],
        "instruction": lambda r: ops[r["s"]][0][0],
        "how many": lambda r: sum(n for _, n in ops[r["s"]]),
        "registers": lambda r: r["k"].registers,
        "spilled bytes": lambda r: r["k"].spill_stores_bytes,
    }
    rows = [{"s": s, "k": kernels[s]} for s in settings]
    return table(rows, columns, caption=f"compiled ahead of time by triton {triton.__version__}")


def rules_claims(
    settings: Sequence[tuple],
    refused: Sequence[tuple],
    lowering: Callable[..., str],
    reasons: Sequence[str],
    ops: Mapping,
    kernels: Mapping,
    tile: str,
) -> dict[str, Any]:
    """The claims that the lesson's rule ``lowering`` predicts the compiles."""
    family = {s: _family(ops[s][0][0]) for s in settings}
    count = {s: sum(n for _, n in ops[s]) for s in settings}
    sm75 = kernels[75, "fp16 -> fp32", tile]
    tf32, tf32x3 = ((90, f"fp32 {p} -> fp32", tile) for p in ("tf32", "tf32x3"))
    f16 = ops[90, "fp16 -> fp16", tile][0][0]
    return {  # claim: (holds, evidence), on the compiles
        "The rule gives the instruction family of every compile in the table": (
            all(lowering(*s) == family[s] for s in settings),
            f"{len(settings)} compiles",
        ),
        "Both settings the rule refuses fail to compile, and Triton names each reason": (
            all(lowering(*s).startswith("refused") for s in refused) and len(set(reasons)) > 1,
            "; ".join(lowering(*s) for s in refused),
        ),
        "On sm_75 fp16 inputs become fused multiply-adds, and the loop spills": (
            family[75, "fp16 -> fp32", tile] == "FMA" and sm75.spill_stores_bytes > 0,
            sm75.summary(),
        ),
        "tf32x3 runs three times the tensor-core instructions of tf32": (
            count[tf32x3] == 3 * count[tf32],
            f"{count[tf32x3]} against {count[tf32]}",
        ),
        "An fp16 accumulator is the instruction's own": (".F16" in f16, f16),
    }


def errors_table(acc_rows: Sequence[Mapping[str, Any]], mn: int) -> Any:
    """The table of the accumulator's error over ``K``, one row of ``chain`` each."""
    from ..plots import run_caption

    columns = {
        "inputs -> accumulator": "pair",
        "K": "K",
        "error vs float64": ("err", "{:.1e}"),
        "error / rounding the exact product": ("ratio", "{:.2f}"),
    }
    caption = f"one program, M = N = {mn}, relative error; {run_caption()}"
    return table(acc_rows, columns, caption=caption)


#: Lines whose ratios differ by less than this overlap on the log axis.
SAME = 0.1


def say_overlap(acc_rows: Sequence[Mapping[str, Any]], ks: Sequence[int]) -> Any:
    """Which lines of the accumulator plot lie on each other, or None."""
    printed = {(r["pair"], r["K"]): round(r["ratio"], 2) for r in acc_rows}  # as the table
    settings = list(dict.fromkeys(r["pair"] for r in acc_rows))
    apart = {  # from the printed ratios, so that a reader can check the sentence
        (p, q): max(abs(printed[p, k] / printed[q, k] - 1) for k in ks)
        for p, q in itertools.combinations(settings, 2)
    }
    overlap = {pq: d for pq, d in apart.items() if d < SAME}
    if not overlap:
        return None
    coinciding = [f"``{p}`` and ``{q}``" for p, q in overlap]
    return say(
        "On the plot the lines of {lines} lie on each other: at every ``K`` {their} "
        "ratios to the rounding differ by at most {d:.0%}.",
        lines=", and those of ".join(coinciding) + ("," if len(coinciding) > 1 else ""),
        their="their" if len(coinciding) == 1 else "each pair's",
        d=max(overlap.values()),
    )


def grows_claims(
    acc_rows: Sequence[Mapping[str, Any]],
    pairs: Sequence[tuple[str, str]],
    ks: Sequence[int],
    wrong: float,
) -> dict[str, Any]:
    """The claims of the accumulator's error over ``K``."""
    by = {(r["pair"], r["K"]): r["ratio"] for r in acc_rows}
    worst32 = max(r["ratio"] for r in acc_rows if r["pair"].endswith("fp32"))
    grows = {  # claim: (holds, evidence)
        "With a float32 accumulator the error is the rounding of the exact product": (
            worst32 < 1.5,
            f"at most {worst32:.2f} times it, at every K",
        )
    }
    for p in (f"{i} -> {a}" for i, a in pairs[1::2]):
        lo, hi = by[p, ks[0]], by[p, ks[-1]]
        grows[f"{p}: the error grows with K and is wrong at the longest"] = (
            hi > lo and hi > wrong,
            f"{lo:.2f} times the rounding at K = {ks[0]}, {hi:.2f} at {ks[-1]}",
        )
    return grows


def against_loop(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each timed path's rate against the FMA loop's (``fp32 ieee``), with its spread."""
    return {p: speedup(r, rows["fp32 ieee"]) for p, r in rows.items()}


def paths_table(paths: Any, ops: Mapping, timed: int, tile: str) -> Any:
    """The table of the timed paths: instruction, errors, rate, against the loop."""
    rows = {r["path"]: r for r in paths.rows} if paths else {}
    vs = against_loop(rows)
    columns = {  # each a function of a path's row
        "path": "path",
        "instruction": lambda r: ops[timed, f"{r['path']} -> fp32", tile][0][0],
        "error vs float32 data": ("err", "{:.1e}"),
        "the dot's own error": ("err_dot", "{:.1e}"),
        "TFLOP/s": ("tflops", "{:,.0f}"),
        "times the FMA loop": lambda r: f"{vs[r['path']].ratio:.1f}",
    }
    return table(list(rows.values()), columns, caption=paths.caption() if paths else "no record")


def paths_claims(paths: Any) -> dict[str, Any]:
    """The claims of the timed paths; each read only when there is a record."""
    rows = {r["path"]: r for r in paths.rows} if paths else {}
    vs, err = against_loop(rows), {p: r["err"] for p, r in rows.items()}
    tc = [p for p in rows if p not in ("fp32 ieee", "fp32 tf32x3")]
    fp8 = [p for p in rows if p.startswith("fp8")]
    loop = {(p, "the loop"): vs[p] for p in tc}  # the errors are in the table
    checks = {  # claim: a function of (holds, evidence), read only with data
        "Every path of one tensor-core product per step beats the FMA loop": lambda: all_faster(
            loop
        ),
        "tf32's error is over a hundred times that of float32 on the FMA loop": lambda: (
            err["fp32 tf32"] > 100 * err["fp32 ieee"]
        ),
        "tf32x3 is more than ten times as accurate as tf32": lambda: (
            10 * err["fp32 tf32x3"] < err["fp32 tf32"]
        ),
        "16-bit inputs lose far more to the conversion than to the additions": lambda: all(
            rows[p]["err"] > 10 * rows[p]["err_dot"] for p in ("fp16", "bf16")
        ),
    }
    if fp8 or paths is None:
        checks["fp8 inputs cost the most accuracy of all paths"] = lambda: (
            min(err[p] for p in fp8) > max(e for p, e in err.items() if p not in fp8)
        )
    return checks


_VERDICTS = [("faster than", lambda c: c.faster), ("slower than", lambda c: c.slower)]
_VERDICTS.append(("tied with", lambda c: c.tied))


def say_tf32x3(paths: Any) -> Any:
    """What tf32x3 costs against the FMA loop, or that a GPU has yet to measure it."""
    if not paths:
        return say("The sentences that read this measurement appear once a GPU has made it.")
    rows = {r["path"]: r for r in paths.rows}
    x3 = against_loop(rows)["fp32 tf32x3"]
    return say(
        "tf32x3, three products per step plus the work of splitting its inputs, is {v} "
        "the FMA loop ({r:.1f} times its rate), with {e:.1f} times its error.",
        v=next(w for w, ok in _VERDICTS if ok(x3)),
        r=x3.ratio,
        e=rows["fp32 tf32x3"]["err"] / rows["fp32 ieee"]["err"],
    )


def explorer_setup(choices: Sequence[str], tiles: Sequence[str], paths: Any) -> dict[str, Any]:
    """The :class:`~tilebook.course.widgets_dot.DotExplorer`'s settings, but its rows."""
    return {
        "knobs": {
            "target": ["sm_90", "sm_80", "sm_75"],
            "inputs": list(choices),
            "tile": list(tiles),
        },
        "facts": {"compiled": "compiled", "acc": "accumulator", "error": "error", "rate": "rate"},
        "labels": {"inputs": "inputs -> accumulator", "tile": "tile, warps"},
        "caption": f"triton {triton.__version__}; rates: {paths.caption() if paths else '-'}",
    }
