"""Flash-attention measurements shared by lesson 12 and ``benchmarks/flash_attention.py``.

:func:`versus` times :func:`tilebook.flash_attention` against PyTorch's
``scaled_dot_product_attention`` on its cuDNN and flash backends and against
FlexAttention (``torch.compile(flex_attention)``, its block mask built once,
outside the timing), forward and backward (through ``torch.autograd.grad``, as
training calls it), causal or not, at one shape.  :func:`lengths` runs it over
sequence lengths at a fixed number of tokens (the batch shrinks as ``N``
grows); :func:`masked` times the masks SDPA cannot express, a causal sliding
window and causal document masks, against FlexAttention with the same mask.

What is counted.  FLOPs are ``4 * B * H * Nq * Nk * D`` for the forward (two
products of ``2 * Nq * Nk * D``), half that when causal, and the backward 2.5
times the forward (its five products); window and document rows count the
(query, key) pairs their mask lets through, exactly.  Rows carry ``kernel``
(``"forward"`` or ``"backward"``), ``mask`` (``"full"``, ``"causal"``,
``"window"`` or ``"documents"``), ``n``, ``batch``, ``heads``, ``d``,
``shape``, ``dtype``, ``impl`` and the timing fields of
:meth:`tilebook.course.bench.Measurement.as_row` with ``flops`` and ``tflops``.

What is checked, before anything is timed.  The cuDNN output against float64
on sampled query rows; every other output against cuDNN's; every gradient
against cuDNN's (norm-wise relative error within :data:`TOL`).  For windows and
documents, tilebook's output and gradients against FlexAttention's with the
same mask.  The implementations of one row are timed in interleaved rounds
(:func:`tilebook.course.bench.compare`).  GPU only, like every module of
:mod:`tilebook.course.experiments`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ...ops import flash_attention as fa
from ..bench import Record, compare, host_us
from ..claims import speedup

__all__ = [
    "DTYPE",
    "IMPLS",
    "TARGETS",
    "TOL",
    "WINDOW",
    "against",
    "block_mask",
    "causal_mod",
    "check",
    "documents",
    "flex",
    "flops",
    "host_us",
    "inputs",
    "lengths",
    "masked",
    "reference_rows",
    "sdpa",
    "shapes",
    "targets",
    "verdict_rows",
    "verdicts",
    "versus",
    "visible_pairs",
]

#: The dtype every measurement uses.
DTYPE = torch.bfloat16
#: The implementations :func:`versus` knows, in the order rows come out.
IMPLS = ("tilebook", "sdpa_cudnn", "sdpa_flash", "flex")
#: Norm-wise relative error allowed against the reference (bfloat16 storage).
TOL = 2e-2
#: The sliding window of :func:`masked`: a query sees itself and the keys before it.
WINDOW = 1024
#: The speed targets of the package (issue 9), at D=128, H=16, B=4, N=4096, bf16:
#: ``(kernel, baseline) -> least ratio`` of the baseline's time to tilebook's.
TARGETS = {
    ("forward", "sdpa_cudnn"): 0.90,
    ("forward", "flex"): 1.15,
    ("backward", "sdpa_cudnn"): 0.75,
    ("backward", "flex"): 1.0,
}

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


def flops(batch: int, heads: int, nq: int, nk: int, d: int, causal: bool) -> int:
    """FLOPs of the forward: two products of ``2 * Nq * Nk * D`` per head, half if causal."""
    f = 4 * batch * heads * nq * nk * d
    return f // 2 if causal else f


def shapes(lengths: Sequence[int], tokens: int) -> list[tuple[int, int]]:
    """``(batch, n)`` for each sequence length: ``tokens`` tokens in all (batch at least 1)."""
    return [(max(1, tokens // n), n) for n in lengths]


def inputs(batch: int, heads: int, n: int, d: int, seed: int = 0):
    """``q, k, v`` (``(B, H, N, D)``, requiring gradients) and an incoming gradient ``do``."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def draw():
        return torch.randn(batch, heads, n, d, device="cuda", dtype=DTYPE, generator=g)

    q, k, v = (draw().requires_grad_() for _ in range(3))
    return q, k, v, draw()


def sdpa(backend: str) -> Attention:
    """``F.scaled_dot_product_attention`` on one backend (``"CUDNN_ATTENTION"``, ...)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, backend)

    def fn(q, k, v, causal):
        with sdpa_kernel(chosen):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


_FLEX: dict[str, Callable] = {}


def flex() -> Callable:
    """``torch.compile(flex_attention)`` for static shapes, made once per process."""
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        # One compiled graph per shape and mask: past the default limit of 8, Dynamo
        # would silently fall back to eager flex_attention (materialised scores).
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        # The backward is timed repeatedly on one graph (retain_graph=True), which a
        # compiled backward that donates its buffers refuses.
        torch._functorch.config.donated_buffer = False
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def causal_mod(b, h, q_idx, kv_idx):
    """FlexAttention's causal ``mask_mod``: a query sees itself and the keys before it."""
    return q_idx >= kv_idx


def block_mask(mask_mod: Callable, batch: int | None, n: int, *, compiled: bool = False):
    """FlexAttention's block mask of ``mask_mod`` over ``n`` queries and keys.

    ``compiled`` builds it in compiled chunks: without it a ``B x N x N`` boolean
    tensor is materialised (a gigabyte for a batch of four at ``N = 16384``).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if compiled:
            try:
                return create_block_mask(mask_mod, batch, None, n, n, device="cuda", _compile=True)
            except TypeError:  # a torch without _compile
                pass
        return create_block_mask(mask_mod, batch, None, n, n, device="cuda")


def documents(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    """Sorted document ids ``(batch, n)``: documents of 256 to 4096 tokens, packed."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        sizes = torch.randint(256, 4097, (n // 256 + 1,), generator=g)
        rows.append(torch.repeat_interleave(torch.arange(len(sizes)), sizes)[:n])
    return torch.stack(rows).to(dtype=torch.int32)


def visible_pairs(n: int, window: int | None = None, docs: torch.Tensor | None = None) -> int:
    """(query, key) pairs a causal mask lets through, with a window of ``window`` keys
    (the query's own included) or document ids ``docs`` (summed over its rows)."""
    if window is not None:
        w = min(window, n)
        return w * (w + 1) // 2 + (n - w) * w
    if docs is None:
        return n * (n + 1) // 2
    total = 0
    for row in docs.cpu():
        _, counts = torch.unique_consecutive(row, return_counts=True)
        total += int((counts * (counts + 1) // 2).sum())
    return total


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> None:
    """Raise unless ``||out - ref|| / ||ref||`` is at most ``tol``."""
    err = _rel(out, ref)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.2e} > {tol:.0e} against the reference")


def reference_rows(q, k, v, causal: bool, rows: torch.Tensor) -> torch.Tensor:
    """Attention in float64 for the query positions ``rows`` only (``Nq == Nk``)."""
    qs = q[:, :, rows].double()
    s = qs @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        keys = torch.arange(k.shape[2], device=q.device)
        s = s.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


def _grads(o: torch.Tensor, inputs, do: torch.Tensor):
    return torch.autograd.grad(o, inputs, do, retain_graph=True)


def versus(
    d: int,
    causal: bool,
    *,
    n: int,
    batch: int,
    heads: int,
    impls: Sequence[str] = IMPLS,
    extra: Mapping[str, Attention] | None = None,
    host: bool = False,
    **timing: Any,
) -> list[dict[str, Any]]:
    """Check, then time, the forward and the backward of ``impls`` at one shape.

    ``extra`` maps more names to ``fn(q, k, v, causal)``: forward-only
    implementations (a lesson's kernel), checked and timed with the forward.
    ``host`` adds tilebook's host time per forward call (``host_us``).
    ``timing`` goes to :func:`tilebook.course.bench.compare` (rounds, warmup, rep).
    """
    unknown = set(impls) - set(IMPLS)
    if unknown or "sdpa_cudnn" not in impls:
        raise ValueError(f"impls must include sdpa_cudnn (the reference) and be among {IMPLS}")
    q, k, v, do = inputs(batch, heads, n, d)
    mask = "causal" if causal else "full"
    fields = {
        "mask": mask,
        "n": n,
        "batch": batch,
        "heads": heads,
        "d": d,
        "shape": f"{batch}x{heads}x{n}x{d}",
        "dtype": str(DTYPE).removeprefix("torch."),
    }
    bm = block_mask(causal_mod, None, n) if causal and "flex" in impls else None
    known: dict[str, Callable[[], torch.Tensor]] = {
        "tilebook": lambda: fa.flash_attention(q, k, v, causal=causal),
        "sdpa_cudnn": lambda: sdpa("CUDNN_ATTENTION")(q, k, v, causal),
        "sdpa_flash": lambda: sdpa("FLASH_ATTENTION")(q, k, v, causal),
        "flex": lambda: flex()(q, k, v, block_mask=bm),
    }
    fwd = {name: known[name] for name in IMPLS if name in impls}
    fwd |= {name: (lambda fn=fn: fn(q, k, v, causal)) for name, fn in (extra or {}).items()}
    # Compiles happen here, outside the timing.
    outs = {name: fn() for name, fn in fwd.items()}
    ref = outs["sdpa_cudnn"]
    rows_at = torch.linspace(0, n - 1, min(n, 64), device=q.device).long()
    check(f"forward sdpa_cudnn {mask} vs float64", ref[:, :, rows_at],
          reference_rows(q, k, v, causal, rows_at))  # fmt: skip
    for name, out in outs.items():
        check(f"forward {name} {mask} {fields['shape']}", out, ref)
    total = flops(batch, heads, n, n, d, causal)
    rows = compare(fwd, flops=total, kernel="forward", **fields, **timing)
    if host and "tilebook" in fwd:
        for r in rows:
            if r["impl"] == "tilebook":
                r["host_us"] = host_us(fwd["tilebook"])
    want = _grads(ref, (q, k, v), do)
    bwd = {}
    for name in [i for i in IMPLS if i in impls]:
        got = _grads(outs[name], (q, k, v), do)
        for g, r, what in zip(got, want, "qkv", strict=True):
            check(f"backward d{what} {name} {mask} {fields['shape']}", g, r)
        bwd[name] = lambda o=outs[name]: _grads(o, (q, k, v), do)
    rows += compare(bwd, flops=int(2.5 * total), kernel="backward", **fields, **timing)
    return rows


def lengths(
    seq_lengths: Sequence[int],
    *,
    d: int = 128,
    heads: int = 16,
    tokens: int = 65536,
    masks: Sequence[bool] = (False, True),
    impls: Sequence[str] = IMPLS,
    flex_at: Sequence[int] | None = None,
    flex_masks: Sequence[bool] | None = None,
    extra: Mapping[str, Attention] | None = None,
    **timing: Any,
) -> list[dict[str, Any]]:
    """:func:`versus` over sequence lengths, ``tokens`` tokens at each (see :func:`shapes`).

    ``flex_at`` limits FlexAttention to those lengths and ``flex_masks`` to those
    masks (``True`` for causal): each new shape and mask is a new ``torch.compile``
    of its forward and its backward, the costliest step of a cold run.  None times
    it wherever ``impls`` names it.
    """
    rows: list[dict[str, Any]] = []
    for batch, n in shapes(seq_lengths, tokens):
        for causal in masks:
            flex_here = (flex_at is None or n in flex_at) and (
                flex_masks is None or causal in flex_masks
            )
            use = [i for i in impls if i != "flex" or flex_here]
            rows += versus(d, causal, n=n, batch=batch, heads=heads, impls=use, extra=extra,
                           **timing)  # fmt: skip
            torch.cuda.empty_cache()  # the inputs and graphs of this shape are gone now
    return rows


def masked(
    kind: str, *, d: int = 128, heads: int = 16, n: int = 16384, batch: int = 4, **timing: Any
) -> list[dict[str, Any]]:
    """A causal sliding window of :data:`WINDOW` keys (``kind="window"``) or causal
    documents (``"documents"``): tilebook against FlexAttention with the same mask.

    tilebook's full causal attention at the same shape is timed too
    (``impl="tilebook_causal"``, counting the causal FLOPs): its time over the
    masked one shows what skipping tiles saves.
    """
    if kind not in ("window", "documents"):
        raise ValueError(f"kind must be 'window' or 'documents', got {kind!r}")
    q, k, v, do = inputs(batch, heads, n, d)
    if kind == "window":
        kw: dict[str, Any] = {"causal": True, "window": (WINDOW - 1, None)}

        def mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)

        bm = block_mask(mod, None, n, compiled=True)
        pairs = visible_pairs(n, window=WINDOW) * batch
    else:
        docs = documents(batch, n).to(q.device)
        kw = {"causal": True, "document_ids": docs}

        def mod(b, h, q_idx, kv_idx):
            return (docs[b, q_idx] == docs[b, kv_idx]) & (q_idx >= kv_idx)

        bm = block_mask(mod, batch, n, compiled=True)
        pairs = visible_pairs(n, docs=docs)
    fields = {
        "mask": kind,
        "n": n,
        "batch": batch,
        "heads": heads,
        "d": d,
        "shape": f"{batch}x{heads}x{n}x{d}",
        "dtype": str(DTYPE).removeprefix("torch."),
    }
    fwd = {
        "tilebook": lambda: fa.flash_attention(q, k, v, **kw),
        "flex": lambda: flex()(q, k, v, block_mask=bm),
        "tilebook_causal": lambda: fa.flash_attention(q, k, v, causal=True),
    }
    outs = {name: fn() for name, fn in fwd.items()}
    check(f"forward {kind} tilebook vs flex", outs["tilebook"], outs["flex"])
    count = {"tilebook": 4 * heads * d * pairs, "flex": 4 * heads * d * pairs}
    count["tilebook_causal"] = flops(batch, heads, n, n, d, True)
    rows = compare(fwd, flops=count, kernel="forward", **fields, **timing)
    got = _grads(outs["tilebook"], (q, k, v), do)
    want = _grads(outs["flex"], (q, k, v), do)
    for g, r, what in zip(got, want, "qkv", strict=True):
        check(f"backward d{what} {kind} tilebook vs flex", g, r)
    bwd = {name: (lambda o=o: _grads(o, (q, k, v), do)) for name, o in outs.items()}
    bcount = {name: int(2.5 * f) for name, f in count.items()}
    rows += compare(bwd, flops=bcount, kernel="backward", **fields, **timing)
    return rows


def _row(rec: Record, **where: Any) -> dict[str, Any] | None:
    found = rec.select(**where)
    return found[0] if len(found) == 1 else None


def verdicts(rec: Record, a: str, b: str, name: str = "", **where: Any) -> str:
    """How ``a`` ran against ``b`` (called ``name``) at each ``n`` of ``rec``, in words.

    ``"faster than cuDNN at 1024 and 4096; level with it at 16384"``, or without a
    name ``"faster at 1024 and 4096; level at 16384"``: faster or slower only
    beyond the p20-p80 spread (:func:`tilebook.course.claims.speedup`).
    """
    found: dict[str, list[str]] = {}
    for n in rec.values("n", impl=a, **where):
        ra, rb = _row(rec, impl=a, n=n, **where), _row(rec, impl=b, n=n, **where)
        if ra is None or rb is None:
            continue
        g = speedup(ra, rb)
        word = "faster" if g.faster else "slower" if g.slower else "level"
        found.setdefault(word, []).append(str(n))
    parts = []
    for word, ns in found.items():
        at = ", ".join(ns[:-1]) + " and " * (len(ns) > 1) + ns[-1]
        if name:
            word += " with" if word == "level" else " than"
            word += f" {'it' if parts else name}"
        parts.append(f"{word} at {at}")
    return "; ".join(parts) or "not timed"


def targets(rec: Record, n: int) -> list[dict[str, Any]]:
    """:data:`TARGETS` against the rows of ``rec`` at length ``n``, one row per
    (kernel, mask, baseline): ``ratio`` (the baseline's median time over tilebook's),
    ``low``/``high`` (the ratio across the p20-p80 spreads) and ``verdict``: ``met``
    when even ``low`` reaches the target, ``missed`` when even ``high`` falls short,
    ``inside the spread`` otherwise."""
    out = []
    for (kernel, baseline), target in TARGETS.items():
        for mask in ("full", "causal"):
            ours = _row(rec, kernel=kernel, mask=mask, n=n, impl="tilebook")
            theirs = _row(rec, kernel=kernel, mask=mask, n=n, impl=baseline)
            if ours is None or theirs is None:
                continue
            g = speedup(ours, theirs)
            verdict = (
                "met" if g.low >= target else "missed" if g.high < target else "inside the spread"
            )
            out.append(
                {"kernel": kernel, "mask": mask, "baseline": baseline, "target": target,
                 "ratio": g.ratio, "low": g.low, "high": g.high,
                 "spread": f"{g.low:.2f}-{g.high:.2f}", "verdict": verdict}
            )  # fmt: skip
    return out


def against(
    rec: Record, baseline: str, a: str = "tilebook", *, at: str | None = None
) -> list[dict[str, Any]]:
    """``a`` against ``baseline`` at every (kernel, shape) of ``rec`` where both were
    timed: ``ratio`` (the baseline's median time over ``a``'s), ``low``/``high`` across
    the p20-p80 spreads, and ``verdict`` (faster, slower or level, beyond the spread,
    :func:`tilebook.course.claims.speedup`).  Reads the package benchmark's record
    (``kernel`` like ``attn_fwd_window``) as well as a lesson's.

    At the shape ``at`` (``"4x16x4096x128"``, where :data:`TARGETS` are set), a row of
    a full or causal mask also gets its ``target`` and ``goal`` (``met``, ``missed`` or
    ``inside the spread``, as :func:`targets` judges); elsewhere both are empty."""
    out = []
    for kernel, shape in dict.fromkeys((r["kernel"], r.get("shape")) for r in rec.rows):
        ours = _row(rec, kernel=kernel, shape=shape, impl=a)
        theirs = _row(rec, kernel=kernel, shape=shape, impl=baseline)
        if ours is None or theirs is None:
            continue
        g = speedup(ours, theirs)
        verdict = "faster" if g.faster else "slower" if g.slower else "level"
        way = "forward" if "fwd" in kernel or kernel == "forward" else "backward"
        plain = ours.get("mask", "full") in ("full", "causal")
        target = TARGETS.get((way, baseline)) if shape == at and plain else None
        goal = "" if target is None else (
            "met" if g.low >= target else "missed" if g.high < target else "inside the spread"
        )  # fmt: skip
        out.append({"kernel": kernel, "shape": shape, "ratio": g.ratio, "low": g.low,
                    "high": g.high, "verdict": verdict, "target": target or "",
                    "goal": goal})  # fmt: skip
    return out


def verdict_rows(rec: Record, baselines: Mapping[str, str], a: str = "tilebook"):
    """One row per (kernel, mask) of ``rec``: ``case``, then for each baseline (by the
    name given in ``baselines``) :func:`verdicts` of ``a`` against it over ``n``."""
    rows = []
    for kernel, mask in dict.fromkeys((r["kernel"], r["mask"]) for r in rec.rows):
        row = {"case": f"{kernel}, {mask}"}
        for impl, name in baselines.items():
            row[name] = verdicts(rec, a, impl, kernel=kernel, mask=mask)
        rows.append(row)
    return rows
