"""Softmax measurements shared by lesson 10 and ``benchmarks/softmax.py``.

Every function here checks what it times against a float64 reference (norm-wise
relative error within :func:`tilebook.course.check.default_tolerance` of the dtype)
before timing it, and times the implementations it compares in interleaved
rounds (:func:`tilebook.course.bench.compare`), so that their spread includes the
drift of the GPU's clocks.  Rows carry ``kernel`` (``"forward"`` or
``"backward"``), ``n`` (columns), ``rows``, ``shape``, ``dtype``, ``impl`` and
the timing fields of :meth:`tilebook.course.bench.Measurement.as_row`; GB/s count each
input read once and each output written once.

The baselines are ``torch.softmax`` (PyTorch's fused CUDA kernel), the same call
through ``torch.compile`` (Inductor writes a Triton kernel for each shape) and,
for the backward, ``torch.ops.aten._softmax_backward_data``, the kernel autograd
calls.  GPU only, like every module of :mod:`tilebook.course.experiments`.

Below them, what lesson 10 says of its records, on any machine: the comparisons
(:func:`vs`, :func:`verdicts`), the tables (``*_table``), the claims (``*_claims``,
for :meth:`tilebook.course.claims.Claims.check_all`), the sentences (``say_*``) and
its explorer's settings, so that the lesson shows each in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import triton

from ...ops import softmax as sm
from ..bench import compare
from ..check import default_tolerance
from ..claims import speedup
from ..prose import say
from ..tables import table

__all__ = [
    "DTYPE",
    "ELEMENTS",
    "backward",
    "backward_claims",
    "backward_table",
    "binaries_table",
    "binary",
    "check",
    "compiled",
    "explorer_setup",
    "forward",
    "inputs",
    "launch_claims",
    "launches",
    "launches_table",
    "online_claims",
    "programs",
    "resources",
    "say_backward",
    "say_forward",
    "say_launch",
    "say_launches",
    "shapes",
    "sm_limits",
    "spill_claims",
    "torch_backward",
    "verdicts",
    "versus_claims",
    "vs",
]

#: The dtype every measurement uses.
DTYPE = torch.bfloat16
#: Elements per tensor: 256 MiB of bfloat16, five times an H100's L2 cache, so
#: that the figures measure HBM and not the cache.
ELEMENTS = 2**27

Extra = Callable[[torch.Tensor], Mapping[str, Callable[[], Any]]]


def shapes(widths: Sequence[int], elements: int = ELEMENTS) -> list[tuple[int, int]]:
    """``(rows, n)`` for each row length ``n``, holding ``elements`` values in all."""
    return [(max(1, elements // n), n) for n in widths]


def inputs(m: int, n: int, dtype: torch.dtype = DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (scaled by 4, so that rows have a real spread of probabilities) and ``dy``."""
    x = (torch.randn(m, n, device="cuda") * 4).to(dtype)
    dy = torch.randn(m, n, device="cuda").to(dtype)
    return x, dy


def check(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    """Raise unless ``||out - ref|| / ||ref||`` is within the tolerance of ``out``'s dtype.

    Norm-wise, as :mod:`tilebook.course.check` measures: element-wise tests fail correct
    bfloat16 results (torch's own too) wherever an entry cancels to nearly zero.
    """
    err = ((out.double() - ref).norm() / ref.norm()).item()
    tol = default_tolerance(out.dtype)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.2e} > {tol:.0e} vs float64")


def torch_backward(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """PyTorch's softmax backward kernel, the one autograd calls."""
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


def compiled(fn: Callable) -> Callable:
    """``fn`` through ``torch.compile`` for static shapes, compiled afresh.

    The reset keeps one shape's compile from counting against the next one's
    recompile limit.
    """
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def _fields(kernel: str, m: int, n: int, x: torch.Tensor) -> dict[str, Any]:
    return {
        "kernel": kernel,
        "n": n,
        "rows": m,
        "shape": f"{m}x{n}",
        "dtype": str(x.dtype).removeprefix("torch."),
        "tensor_mib": x.numel() * x.element_size() / 2**20,
    }


def _time(kernel, m, n, x, impls, ref, passes, timing) -> list[dict[str, Any]]:
    for name, fn in impls.items():  # compiles happen here, never inside the timing
        # Free a NaN-filled block of the output's size first: the caching allocator
        # hands it to fn's output, so a kernel that writes nothing cannot pass on
        # the memory of the implementation checked before it.
        torch.full_like(ref, float("nan"), dtype=x.dtype)
        check(f"softmax {kernel} {name} {m}x{n}", fn(), ref)
    nbytes = passes * x.numel() * x.element_size()
    return compare(impls, bytes_moved=nbytes, **_fields(kernel, m, n, x), **timing)


def forward(
    shapes: Sequence[tuple[int, int]],
    *,
    extra: Extra | None = None,
    with_compile: bool = True,
    **timing: Any,
) -> list[dict[str, Any]]:
    """Time the forward: ``tilebook``, ``torch``, ``torch.compile`` and ``extra``.

    ``extra(x)`` returns more implementations to time on the input ``x``, by
    name (none where it has nothing for this shape).  ``timing`` goes to
    :func:`tilebook.course.bench.compare` (rounds, warmup, rep).
    """
    rows: list[dict[str, Any]] = []
    for m, n in shapes:
        x, _ = inputs(m, n)
        ref = torch.softmax(x.double(), -1)
        impls: dict[str, Callable[[], Any]] = {
            "tilebook": lambda x=x: sm.softmax(x, -1),
            "torch": lambda x=x: torch.softmax(x, -1),
        }
        if with_compile:
            fn = compiled(lambda t: torch.softmax(t, -1))
            impls["torch.compile"] = lambda x=x, fn=fn: fn(x)
        impls |= extra(x) if extra is not None else {}
        rows += _time("forward", m, n, x, impls, ref, 2, timing)
        del x, ref, impls
        torch.cuda.empty_cache()
    return rows


def backward(
    shapes: Sequence[tuple[int, int]], *, with_compile: bool = True, **timing: Any
) -> list[dict[str, Any]]:
    """Time the backward from a saved ``y`` and an incoming ``dy``: ``dx`` of each."""
    rows: list[dict[str, Any]] = []
    for m, n in shapes:
        x, dy = inputs(m, n)
        y = torch.softmax(x, -1)
        y64, dy64 = y.double(), dy.double()
        # The exact gradient for the rounded y every implementation is given.
        ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
        del x, y64, dy64
        impls: dict[str, Callable[[], Any]] = {
            "tilebook": lambda y=y, dy=dy: sm.launch_softmax_backward(y, dy, torch.empty_like(y)),
            "torch": lambda y=y, dy=dy: torch_backward(dy, y),
        }
        if with_compile:
            fn = compiled(torch_backward)
            impls["torch.compile"] = lambda y=y, dy=dy, fn=fn: fn(dy, y)
        rows += _time("backward", m, n, y, impls, ref, 3, timing)
        del y, dy, ref, impls
        torch.cuda.empty_cache()
    return rows


def programs(m: int, cfg: sm.SoftmaxConfig, sms: int) -> int:
    """How many programs the package launches for ``m`` rows under ``cfg`` on ``sms`` SMs."""
    tiles = m if cfg.online else triton.cdiv(m, cfg.block_m)
    return tiles if cfg.ctas_per_sm is None else max(1, min(tiles, cfg.ctas_per_sm * sms))


def launches(
    shape: tuple[int, int], configs: Mapping[str, sm.SoftmaxConfig], **timing: Any
) -> list[dict[str, Any]]:
    """Time the package's forward under several launch configurations of one shape.

    Each row also holds its configuration and ``programs``, the size of its grid.
    """
    m, n = shape
    x, _ = inputs(m, n)
    ref = torch.softmax(x.double(), -1)
    impls = {
        name: lambda cfg=cfg, x=x: sm.launch_softmax_forward(x, torch.empty_like(x), cfg)
        for name, cfg in configs.items()
    }
    rows = _time("forward", m, n, x, impls, ref, 2, timing)
    sms = sm_limits()["sms"]
    for r in rows:
        cfg = configs[r["impl"]]
        r.update(
            block_m=cfg.block_m,
            block_n=cfg.block_n,
            num_warps=cfg.num_warps,
            online=cfg.online,
            ctas_per_sm=cfg.ctas_per_sm,
            evict=cfg.evict,
            programs=programs(m, cfg, sms),
        )
    del x, ref, impls
    torch.cuda.empty_cache()
    return rows


def sm_limits() -> dict[str, int]:
    """What one SM of this GPU holds: threads, 32-bit registers, shared memory, programs.

    Programs: at most 32 resident on any SM since Volta.
    """
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "sms": p.multi_processor_count,
        "sm_threads": p.max_threads_per_multi_processor,
        # Older torch builds do not report it; it is the same on every CUDA GPU.
        "sm_registers": getattr(p, "regs_per_multiprocessor", 0) or 65536,
        "sm_shared": p.shared_memory_per_multiprocessor,
        "sm_programs": getattr(p, "max_blocks_per_multi_processor", 32),
    }


def binary(cfg: sm.SoftmaxConfig, n: int, dtype: torch.dtype = DTYPE):
    """The compiled forward kernel that the package launches for rows of ``n`` under ``cfg``.

    Compiled by a launch on one program over a small tensor that Triton
    specialises like the measured ones (row count and length divisible by 16,
    aligned pointers), so it is the very binary that the measurements time.
    """
    m = 16 * cfg.block_m
    x = torch.zeros(m, n, dtype=dtype, device="cuda")
    meta: dict[str, Any] = {
        "BLOCK_N": cfg.block_n,
        "NUM_STAGES": cfg.num_stages,
        "EVICT": cfg.evict,
        "INT64": False,
        "num_warps": cfg.num_warps,
    }
    if cfg.online:
        kernel = sm.softmax_fwd_online_kernel
    else:
        kernel = sm.softmax_fwd_kernel
        meta |= {"BLOCK_M": cfg.block_m, "EVEN_M": True, "EVEN_N": n == cfg.block_n}
    return kernel[(1,)](x, torch.empty_like(x), m, n, n, n, **meta)


def resources(compiled_kernel) -> dict[str, int]:
    """Registers and spills per thread, shared memory and warps of a launched kernel.

    ``compiled_kernel`` is what a Triton launch returns.  ``spills`` counts
    32-bit values a thread keeps in local memory because its registers ran out.
    """
    k = compiled_kernel  # launched, so loaded: Triton reads the resources then
    return {
        "registers": int(k.n_regs),
        "spills": int(k.n_spills),
        "shared_bytes": int(k.metadata.shared),
        "num_warps": int(k.metadata.num_warps),
    }


# What lesson 10 says of its records.  ``rec`` is a record of rows with ``kernel``,
# ``n`` and ``impl``; ``fwd`` the forward's, ``bwd`` the backward's.  Lesson 10
# names its own rows: ``one_row`` (its smallest kernel), ``online`` and ``single``
# (the package's two kernels, each run where the package runs the other).


def vs(rec: Any, n: int, a: str, b: str, kernel: str = "forward") -> Any:
    """How much faster ``a`` ran than ``b`` on rows of ``n`` (a Comparison)."""
    one = rec.one
    return speedup(one(kernel=kernel, n=n, impl=a), one(kernel=kernel, n=n, impl=b))


def verdicts(rec: Any, a: str, b: str, name: str, kernel: str = "forward") -> str:
    """How ``a`` ran against ``b`` (called ``name``) at each row length, in words;
    each verdict says, from the same comparison, where it stands to the spread."""
    found: dict[tuple[str, str], list[str]] = {}
    for n in rec.values("n", kernel=kernel, impl=a):
        g = vs(rec, n, a, b, kernel)
        v = "faster than" if g.faster else "slower than" if g.slower else "level with"
        found.setdefault((v, "inside" if g.tied else "beyond"), []).append(str(n))
    parts = []
    for (v, spread), ns in found.items():
        at = ", ".join(ns[:-1]) + " and " * (len(ns) > 1) + ns[-1]
        who = "it" if parts else name
        parts.append(f"{v} {who} at {at} columns ({spread} the spread)")
    return "; ".join(parts)


def _word(c: Any) -> str:
    return "faster" if c.faster else "slower" if c.slower else "level"


def launch_claims(fwd: Any, short: int, fits: int, row_warps: int, one_row: str) -> dict:
    """Where one row a program falls short of the package's launch, and what that
    launch is there."""
    said = {}
    for n in (short, fits):
        g = vs(fwd, n, "tilebook", one_row)
        said[f"At {n} columns, one row a program is slower than tilebook"] = (
            g.faster,
            g.evidence("tilebook", one_row),
        )
    s, f = sm.pick_config(short), sm.pick_config(fits)
    said[f"There tilebook runs a tile of rows at {short} columns and more warps at {fits}"] = (
        s.block_m > 1 and f.block_m == 1 and f.num_warps > row_warps,
        f"{s.block_m} rows a program at {short}; {f.num_warps} warps at {fits}",
    )
    return said


def say_launch(fwd: Any, one_pass: Sequence[int], row_warps: int, one_row: str) -> Any:
    """The package's launch against one row a program, at each length kept in
    registers."""
    launch = {n: sm.pick_config(n) for n in one_pass}
    against = {n: vs(fwd, n, "tilebook", one_row) for n in one_pass}
    pays = [str(n) for n in one_pass if against[n].faster]
    return say(
        "Against the kernel above (one row a program on {w} warps), the package's launch "
        "runs {each}.  It pays at {pays}{rest}.",
        w=row_warps,
        each="; ".join(
            f"{launch[n].block_m} row{'s' * (launch[n].block_m > 1)} a program on "
            f"{launch[n].num_warps} warps at {n} "
            f"columns, {_word(against[n])} ({against[n].ratio:.2f} times the speed)"
            for n in one_pass
        ),
        pays=f"{' and '.join(pays)} columns" if pays else "no length",
        rest="".join(
            f"; at {n} it is {_word(against[n])}: the table's launch "
            f"{'loses' if against[n].slower else 'buys nothing'} there on this GPU"
            for n in one_pass
            if not against[n].faster
        ),
    )


def binaries_table(bins: Any) -> Any:
    """What the compiler made of each kernel, and how many programs fit on an SM."""
    columns = {"kernel": "impl", "columns": "n", "warps": "num_warps"}
    columns |= {"registers": "registers", "spilled": "spills", "shared": "shared_bytes"}
    columns |= {"per SM": "fit", "limited by": "limit"}
    note = "registers and spilled values a thread, shared bytes a program"
    return table(bins.rows, columns, caption=f"{note}; {bins.caption()}")


def spill_claims(bins: Any, one_row: str, single: str, fits: int, long: int) -> dict:
    """Which binaries spill, on the table of binaries."""
    said = {}
    for impl, n, what, spills in (
        (one_row, fits, "on Triton's default warps spills", True),
        ("tilebook", fits, "on the package's warps does not spill", False),
        (single, long, "spills even on the most warps a program may have", True),
    ):
        r = bins.one(impl=impl, n=n)
        said[f"A row of {n} {what}"] = (
            (r["spills"] > 0) == spills,
            f"{r['spills']} values a thread",
        )
    return said


def online_claims(fwd: Any, widths: Sequence[int], fits: int, online: str, single: str) -> dict:
    """Where the single pass beats the online kernel, and where the online wins:
    ``widths`` are the short, middle and long lengths."""
    short, mid, long = widths
    said = {}
    for n in (short, mid, fits):  # at fits the two can meet (on some GPUs they do)
        g = vs(fwd, n, "tilebook", online)
        word, holds = ("no slower", not g.slower) if n == fits else ("faster", g.faster)
        said[f"At {n} columns, the single pass is {word} than the online kernel"] = (
            holds,
            g.evidence("single pass", "online"),
        )
    g = vs(fwd, long, "tilebook", single)
    said[f"At {long} columns, the online kernel is faster than a single pass"] = (
        g.faster,
        g.evidence("online", "single pass"),
    )
    return said


def backward_table(bwd: Any) -> Any:
    columns = {"columns": "n", "implementation": "impl", "GB/s": ("gbps", "{:,.0f}")}
    return table(bwd.rows, columns, caption=bwd.caption())


def backward_claims(bwd: Any, widths: Sequence[int]) -> dict:
    said = {}
    for n in widths:
        g = vs(bwd, n, "tilebook", "torch", "backward")
        said[f"At {n} columns, tilebook's backward is faster than PyTorch's"] = (
            g.faster,
            g.evidence("tilebook", "torch"),
        )
    return said


def say_backward(bwd: Any) -> Any:
    v = verdicts(bwd, "tilebook", "torch.compile", "Inductor's", "backward")
    return say("tilebook's backward runs {v}.", v=v)


def launches_table(runs: Any) -> Any:
    columns = {"columns": "n", "launch": "impl", "programs": "programs"}
    columns |= {"evict": lambda r: r["evict"] or "none", "GB/s": ("gbps", "{:,.0f}")}
    return table(runs.rows, columns, caption=runs.caption())


def say_launches(runs: Any, persistent: str, no_hint: str, tile: str) -> Any:
    """The persistent grid and the launch without the eviction hint, against a
    program a tile (the package's choice)."""
    return say(
        "The persistent grid runs {p}.  Without the eviction hint the kernel runs {h}.",
        p=verdicts(runs, persistent, tile, "the package's choice (a program a tile)"),
        h=verdicts(runs, no_hint, tile, "the package's choice"),
    )


def versus_claims(fwd: Any, widths: Sequence[int], against_inductor: Sequence[int]) -> dict:
    """tilebook's forward against torch.softmax at every length, and against
    torch.compile's at ``against_inductor``."""
    g = {n: vs(fwd, n, "tilebook", "torch") for n in widths}
    ev = "; ".join(f"at {n}, {c.evidence('tilebook', 'torch')}" for n, c in g.items())
    said = {
        "tilebook's forward is faster than torch.softmax at every row length": (
            all(c.faster for c in g.values()),
            ev,
        )
    }
    for n in against_inductor:
        c = vs(fwd, n, "tilebook", "torch.compile")
        said[f"At {n} columns, tilebook's forward is faster than torch.compile's"] = (
            c.faster,
            c.evidence("tilebook", "torch.compile"),
        )
    return said


def say_forward(fwd: Any) -> Any:
    return say(
        "tilebook's forward runs {v}, and at its best it moves {best:.0%} of the copy bandwidth.",
        v=verdicts(fwd, "tilebook", "torch.compile", "Inductor's"),
        best=max(fwd.values("gbps", impl="tilebook")) / fwd.provenance["copy_gbps"],
    )


def explorer_setup(fwd: Any, impls: Sequence[str]) -> dict[str, Any]:
    """The forward explorer's :class:`~tilebook.course.widgets.SweepExplorer`
    settings, but its cells."""
    return {
        "knobs": ["impl", "n"],
        "metric": "gbps",
        "unit": "GB/s",
        "labels": {"n": "row length", "impl": "implementation"},
        "order": {"impl": list(impls)},
        "title": "softmax forward: row length and implementation against bandwidth",
        "caption": fwd.caption(),
        "ceiling": fwd.provenance["copy_gbps"],
        "ceiling_label": "the 1 GiB copy",
        "slow_fraction": 0.5,
        "note": "note",
    }
