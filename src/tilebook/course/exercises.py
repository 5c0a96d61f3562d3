"""Exercise checks: run a reader's kernel against a reference and say what is wrong.

A lesson's "try this" asks the reader to write or change a kernel, then gives
the one line that checks it::

    from tilebook.course.exercises import check_elementwise

    def my_add(x, y, out):                      # the reader's launcher
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)

    print(check_elementwise(my_add, torch.add, block=1024))

It runs on whatever machine the reader has (Triton's interpreter on a CPU, or a
GPU), on awkward sizes (one element, a prime, an exact multiple of a block and
one past it, several blocks and a bit), and instead of "mismatch" it says
*what* is wrong: which elements, which program owned them (from ``block``), the
elements nobody wrote, the writes past the end of the output (a missing mask),
writes into an input, NaNs, a wrong shape or dtype, and an exception with a
hint.  :func:`check` is the general form: any arguments, any output shape,
2-D tiles (``block=(BLOCK_M, BLOCK_N)``).

The contract
    ``fn(*args, out=out)``: when the reader's function has a parameter called
    ``out``, the checker allocates the output and passes it; the function
    writes its result there (what it returns is ignored, unless it is a
    different tensor, which is reported).  A function without ``out`` is
    called as ``fn(*args)`` and its returned tensor is checked; then the
    checks that need the checker's own output (elements never written, writes
    outside the output) cannot run, and the verdict says so.

    ``reference(*args)`` gets the same arguments with every floating tensor in
    float64, and returns the right answer (any tensor).  The output's dtype is
    the reference's for integer results, else that of the first floating
    tensor argument (``out_dtype=`` overrides).

How it sees what it sees
    Every tensor argument and the output live inside one larger allocation,
    with guard regions before and after them.  The output and the guards are
    filled with a *poison* bit pattern (a NaN with a payload no arithmetic
    produces, for floats), so an element that still holds it afterwards was
    never written, and a guard that changed was written by a store without a
    mask.  The guard after each tensor is ``GUARD`` elements long, as long as
    the largest block Triton allows (``tl.arange`` has at most 2**20
    elements), so a last program without a mask stays inside the allocation.
    Under the interpreter (which does no bounds checks at all) the check also
    runs in a forked child process, so that even a grid far too large cannot
    corrupt the reader's session: a crash is reported as such.  On a GPU the
    guards are the protection; a grid many times too large with no mask can
    still write past them.

    Loads without a mask are seen only through what they cause: a read past the
    end reads poison (NaN), which a store then shows.

:class:`Verdict` prints as a short report (and renders as a list in a notebook
or on a lesson page); :meth:`Verdict.assert_ok` raises :class:`ExerciseError`
with the same report.
"""

from __future__ import annotations

import contextlib
import faulthandler
import html
import inspect
import io
import math
import os
import pickle
import select
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import runtime
from . import display
from .check import default_tolerance

__all__ = [
    "GUARD",
    "SIZES",
    "ExerciseError",
    "Finding",
    "Verdict",
    "check",
    "check_elementwise",
]

#: Default lengths for :func:`check_elementwise`: one element, a prime, an exact
#: multiple of the usual blocks, one past it, and several blocks plus a tail.
SIZES: tuple[int, ...] = (1, 97, 1024, 1025, 4097)
#: Guard elements after each tensor: the largest block Triton allows, so that an
#: unmasked last program stays inside the allocation.
GUARD = 2**20
_FRONT = 4096  # guard elements before each tensor (keeps 16-byte alignment)
_SHOWN = 4  # ranges listed in a message before "..."
_CHILD_TIMEOUT_S = 600.0

# A NaN with a payload that no arithmetic produces (hardware NaNs are 0x7FC00000
# and friends), or 0xA5 bytes for integers: an element still holding it was not
# written.
_POISON = {
    torch.float64: 0x7FF4A5A5A5A5A5A5,
    torch.float32: 0x7FA5A5A5,
    torch.float16: 0x7DA5,
    torch.bfloat16: 0x7FA5,
}
# The guards around *inputs* hold another payload: a store without a mask that copies
# an input's guard into the output's guard must change the output's guard bits.
_POISON_INPUT = {
    torch.float64: 0x7FF45A5A5A5A5A5A,
    torch.float32: 0x7FA55A5A,
    torch.float16: 0x7D5A,
    torch.bfloat16: 0x7F5A,
}
_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


class ExerciseError(AssertionError):
    """A reader's kernel failed its exercise check (the message says how)."""


@dataclass(frozen=True)
class Finding:
    """One thing wrong in one case.

    ``kind`` is one of ``raised``, ``crashed``, ``returned``, ``shape``,
    ``dtype``, ``outside`` (writes before or past the output), ``input``
    (writes into an argument), ``unwritten``, ``nan`` and ``wrong``;
    ``message`` says what and where, ``hint`` the likely cause.
    """

    kind: str
    message: str
    hint: str = ""
    count: int = 0

    def __str__(self) -> str:
        return self.message + (f" {self.hint}" if self.hint else "")


@dataclass
class _Case:
    label: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


class Verdict:
    """What :func:`check` found, case by case.

    ``ok`` is True when every case passed; ``findings`` lists every
    :class:`Finding` with its case; ``str()`` is the report.
    """

    def __init__(self, name: str, cases: list[_Case], what: str) -> None:
        self.name = name
        self.cases = cases
        self.what = what
        display.register(self)

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases)

    @property
    def findings(self) -> list[tuple[str, Finding]]:
        return [(c.label, f) for c in self.cases for f in c.findings]

    def kinds(self) -> set[str]:
        """The kinds of finding, over all cases (``{"outside", "unwritten"}``)."""
        return {f.kind for _, f in self.findings}

    def _head(self) -> str:
        bad = [c for c in self.cases if not c.ok]
        if not bad:
            return f"{self.name}: right in all {len(self.cases)} cases ({self.what})"
        return f"{self.name}: WRONG in {len(bad)} of {len(self.cases)} cases ({self.what})"

    def __str__(self) -> str:
        lines = [self._head()]
        hints: set[str] = set()
        for c in self.cases:
            if c.ok:
                continue
            lines.append(f"  {c.label}:")
            for f in c.findings:  # a hint once, at its first finding
                text = f.message if f.hint in hints else str(f)
                hints.add(f.hint)
                lines.append(f"    - {text}")
        notes = dict.fromkeys(n for c in self.cases for n in c.notes)
        lines += [f"  note: {n}" for n in notes]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        items = []
        for c in self.cases:
            for f in c.findings:
                hint = f' <span class="tb-evidence">{html.escape(f.hint)}</span>' if f.hint else ""
                items.append(
                    f'<li class="tb-claim-bad">{html.escape(c.label)}: '
                    f"{html.escape(f.message)}{hint}</li>"
                )
        for n in dict.fromkeys(n for c in self.cases for n in c.notes):
            items.append(f'<li class="tb-claim-none">note: {html.escape(n)}</li>')
        mark = "&#10003;" if self.ok else "&#10007;"
        body = f"<ul>{''.join(items)}</ul>" if items else ""
        return (
            f'<div class="tb-claims tb-exercise{"" if self.ok else " tb-claims-failed"}" '
            f'data-tilebook-exercise="{int(self.ok)}">'
            f'<p class="tb-claims-head">{mark} {html.escape(self._head())}</p>{body}</div>'
        )

    def assert_ok(self) -> Verdict:
        """Raise :class:`ExerciseError` with the report unless every case passed."""
        if not self.ok:
            raise ExerciseError(str(self))
        return self


# ----------------------------------------------------------------------------- checks


def check_elementwise(
    fn: Callable[..., Any],
    reference: Callable[..., torch.Tensor],
    *,
    inputs: int = 2,
    sizes: Iterable[int] = SIZES,
    dtype: torch.dtype = torch.float32,
    block: int | None = None,
    tol: float | None = None,
    name: str | None = None,
) -> Verdict:
    """Check an elementwise kernel's launcher on vectors of awkward lengths.

    ``fn(x, y, ..., out=out)`` (``inputs`` random tensors of ``dtype`` and the
    output, see the module's contract) against ``reference(x, y, ...)``,
    computed in float64, for each length in ``sizes``.  ``block`` is the
    number of elements one program owns: with it, the report names the
    programs that owned the elements it complains about.  ``tol`` is the
    relative error allowed per element (default: tilebook's tolerance for
    ``dtype``).
    """
    if not isinstance(inputs, int) or isinstance(inputs, bool) or inputs < 1:
        raise ValueError(f"check_elementwise(): inputs must be a positive int, got {inputs!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"check_elementwise(): dtype must be a floating torch.dtype, got {dtype!r}")
    sizes = list(sizes)
    if not sizes or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes
    ):
        raise ValueError(f"check_elementwise(): sizes must be positive ints, got {sizes!r}")
    dev = runtime.device()
    gen = torch.Generator().manual_seed(0)
    cases = {}
    for n in sizes:
        args = tuple(
            torch.randn(n, generator=gen).to(dtype=dtype, device=dev) for _ in range(inputs)
        )
        cases[f"n={n}"] = args
    return check(fn, reference, cases, block=block, tol=tol, name=name)


def check(
    fn: Callable[..., Any],
    reference: Callable[..., torch.Tensor],
    cases: Mapping[str, Sequence[Any]] | Iterable[Sequence[Any]],
    *,
    block: int | Sequence[int] | None = None,
    tol: float | None = None,
    out_dtype: torch.dtype | None = None,
    name: str | None = None,
) -> Verdict:
    """Check ``fn`` against ``reference`` on each case (a tuple of arguments).

    ``cases`` is a list of argument tuples, or a dict ``{label: arguments}``.
    Tensors among the arguments keep their shape, strides and dtype (a
    transposed view stays transposed); other arguments pass as they are.
    ``block`` is an ``int`` (elements per program, counted over the output
    in memory order) or one tile size per output dimension, ``(BLOCK_M,
    BLOCK_N)``.  Without ``block``, a 2-D output's findings name its rows
    (a row-wise kernel's programs), and an output of three or more
    dimensions is read as a stack of results, ``out[0]``, ``out[1]``, ... (a
    kernel that writes two tensors checks both through one ``out``):
    findings name the slice.  ``tol`` is the relative error allowed per
    element (integers must match exactly).  See the module's docstring for
    the contract and for what is checked.
    """
    _check_callable(fn, "fn", kernel_hint=True)
    _check_callable(reference, "reference")
    if isinstance(cases, Mapping):
        named = [(str(k), tuple(v)) for k, v in cases.items()]
    else:
        named = [(None, tuple(v)) for v in cases]
    if not named:
        raise ValueError("check(): give at least one case")
    for label, args in named:
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type != runtime.device().type:
                raise ValueError(
                    f"check(): case {label or args!r} has a tensor on {a.device}; tilebook runs "
                    f"on {runtime.device().type} here"
                )
    block = _check_block(block)
    if tol is not None and not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"check(): tol must be a number >= 0, got {tol!r}")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"check(): out_dtype must be a torch.dtype, got {out_dtype!r}")
    labels = [label or _label(args) for label, args in named]
    name = name or f"check({getattr(fn, '__name__', type(fn).__name__)})"
    jobs = [(lbl, args) for lbl, (_, args) in zip(labels, named, strict=True)]

    def run_all(emit):
        for lbl, args in jobs:
            emit(_run_case(fn, reference, lbl, args, block, tol, out_dtype))

    if runtime.is_interpreter() and hasattr(os, "fork"):
        results = _in_child(run_all, labels)
    else:
        results = []
        run_all(results.append)
    what = _describe(named, block)
    return Verdict(name, results, what)


# ----------------------------------------------------------------------------- one case


def _run_case(fn, reference, label, args, block, tol, out_dtype) -> _Case:
    case = _Case(label)
    ref_args = tuple(
        a.detach().to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    )
    ref = reference(*ref_args)
    if not isinstance(ref, torch.Tensor):
        raise TypeError(f"check(): reference returned {type(ref).__name__}, not a tensor")
    dev = next((a.device for a in args if isinstance(a, torch.Tensor)), runtime.device())
    want_dtype = out_dtype or _out_dtype(args, ref)
    guarded = [_Guarded.of(a) if isinstance(a, torch.Tensor) else None for a in args]
    call_args = [g.view if g is not None else a for g, a in zip(guarded, args, strict=True)]
    takes_out = _takes_out(fn)
    out = _Guarded.empty(tuple(ref.shape), want_dtype, dev) if takes_out else None
    try:
        returned = fn(*call_args, out=out.view) if out is not None else fn(*call_args)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as exc:  # noqa: BLE001  (the reader's code: report whatever it raises)
        case.findings.append(_raised(exc, takes_out))
        return case

    for i, (g, a) in enumerate(zip(guarded, args, strict=True)):
        if g is not None:
            case.findings += g.input_findings(i, a)

    if out is not None:
        if isinstance(returned, torch.Tensor) and not _same_memory(returned, out.view):
            case.findings.append(
                Finding(
                    "returned",
                    "the function returned a new tensor and left out as it was;",
                    "write the result into out (the checker reads out).",
                )
            )
        result = out.view
        case.findings += out.outside_findings(block)
        unwritten = out.unwritten()
    else:
        case.notes.append(
            "the function takes no out parameter, so elements it never wrote and "
            "writes past the end cannot be seen; give it an out parameter for that"
        )
        if not isinstance(returned, torch.Tensor):
            case.findings.append(
                Finding(
                    "returned", f"the function returned {type(returned).__name__}, not a tensor"
                )
            )
            return case
        result = returned
        if tuple(result.shape) != tuple(ref.shape):
            case.findings.append(
                Finding(
                    "shape",
                    f"the result has shape {tuple(result.shape)}; expected {tuple(ref.shape)}",
                )
            )
            return case
        if result.dtype != want_dtype:
            case.findings.append(
                Finding(
                    "dtype",
                    f"the result is {_dt(result.dtype)}; expected {_dt(want_dtype)}",
                )
            )
        unwritten = torch.zeros(ref.shape, dtype=torch.bool)

    case.findings += _value_findings(result, ref, unwritten, block, tol)
    return case


def _value_findings(result, ref, unwritten, block, tol) -> list[Finding]:
    shape = tuple(ref.shape)
    found = []
    unwritten = unwritten.reshape(shape)
    if unwritten.any():
        found.append(_unwritten_finding(unwritten, block))
    got = result.detach().cpu()
    want = ref.detach().cpu()
    integer = not (got.is_floating_point() or want.is_floating_point())
    written = ~unwritten
    if integer:
        bad = (got.to(torch.int64) != want.to(torch.int64)) & written
        if bad.any():
            found.append(_wrong_finding(bad, got, want, block))
        return found
    g = got.to(torch.float64)
    w = want.to(torch.float64)
    nan = (torch.isnan(g) != torch.isnan(w)) | (torch.isinf(g) & ~torch.isinf(w))
    nan &= written
    if nan.any():
        where = _where(nan, block)
        found.append(
            Finding(
                "nan",
                f"{_count(nan)} NaN or infinite where the reference is finite{where}.",
                "A masked load without other= feeds garbage to lanes you then store? "
                "Or an overflow (compute in float32).",
                count=_count(nan),
            )
        )
    rtol = default_tolerance(result.dtype) if tol is None else float(tol)
    finite = torch.isfinite(w) & torch.isfinite(g) & written
    scale = w[finite].abs().pow(2).mean().sqrt().item() if finite.any() else 0.0
    err = (g - w).abs()
    bad = finite & (err > rtol * (w.abs() + scale))
    if bad.any():
        found.append(_wrong_finding(bad, g, w, block))
    return found


def _wrong_finding(bad, got, want, block) -> Finding:
    flat = bad.reshape(-1).nonzero().flatten()
    first = flat[0].item()
    idx = _unravel(first, tuple(bad.shape))
    g = got.reshape(-1)[first].item()
    w = want.reshape(-1)[first].item()
    hint = ""
    tiles = _owner_set(bad, block)
    if (
        tiles is not None
        and len(tiles) == 1
        and _is_last(next(iter(tiles)), bad.shape, block)
        and _ragged(bad.shape, block)
    ):
        hint = "Only the last program's block, the ragged one, is wrong: check its mask and other=."
    return Finding(
        "wrong",
        f"{_count(bad)} wrong value(s){_where(bad, block)}; the first at {idx}: "
        f"got {g:.6g}, expected {w:.6g}.",
        hint,
        count=_count(bad),
    )


def _unwritten_finding(unwritten, block) -> Finding:
    n = unwritten.numel()
    count = _count(unwritten)
    flat = unwritten.reshape(-1)
    hint = ""
    if count == n and isinstance(block, int) and n < block:
        hint = (
            "Nothing was stored: did any program run?  A grid of n // BLOCK programs "
            "is empty when n < BLOCK; use triton.cdiv(n, BLOCK)."
        )
    elif count == n:
        hint = "Nothing was stored: does the kernel store into out (tl.store(out_ptr + ...))?"
    elif unwritten.dim() == 1 or isinstance(block, int):
        idx = flat.nonzero().flatten()
        start = idx[0].item()
        suffix = idx.numel() == n - start
        if suffix and isinstance(block, int) and start % block == 0:
            need = math.ceil(n / block)
            first = start // block
            who = f"Program {first}" if first == need - 1 else f"Programs {first} to {need - 1}"
            hint = (
                f"{who} never ran: the grid launched {first} where n needs {need}; "
                "use triton.cdiv(n, BLOCK)."
            )
        elif suffix:
            hint = f"Everything from element {start} on is missing: does the grid cover n?"
        elif isinstance(block, int):
            lanes = sorted({i % block for i in idx.tolist()})
            owners = {i // block for i in idx.tolist()}
            if len(owners) > 1 and len(lanes) < block:
                hint = (
                    f"Every program leaves lanes {_ranges(lanes)} of its block unwritten: "
                    "does the kernel step through the data by the block it declares?"
                )
    return Finding(
        "unwritten",
        f"{count} of {n} elements never written{_where(unwritten, block)}.",
        hint,
        count=count,
    )


def _raised(exc: BaseException, takes_out: bool) -> Finding:
    text = f"{type(exc).__name__}: {str(exc).strip()}".splitlines()
    msg = " ".join(line.strip() for line in text[:3])
    if len(msg) > 300:
        msg = msg[:297] + "..."
    low = str(exc).lower()
    hint = ""
    if "power of 2" in low or "power of two" in low:
        hint = "tl.arange needs a power-of-two length: make BLOCK a power of two."
    elif "constexpr" in low:
        hint = "Block sizes and shapes given to tl.arange must be tl.constexpr parameters."
    elif isinstance(exc, TypeError) and ("argument" in low) and takes_out:
        hint = (
            "The checker calls fn(*inputs, out=out): give the function the inputs and "
            "then a parameter called out."
        )
    elif isinstance(exc, TypeError) and ("argument" in low):
        hint = "The checker calls fn(*inputs); to pass the output, name a parameter out."
    return Finding("raised", f"the function raised {msg}", hint)


# ----------------------------------------------------------------------------- guards


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` (1-D, contiguous) as integers of the same width, to compare bit patterns."""
    return t.view(_BITS[t.element_size()])


def _poison_value(dtype: torch.dtype, role: str = "output") -> int:
    table, byte = (_POISON, b"\xa5") if role == "output" else (_POISON_INPUT, b"\x5a")
    if dtype in table:
        return table[dtype]
    size = torch.empty((), dtype=dtype).element_size()
    value = int.from_bytes(byte * size, "little", signed=(size > 1))
    return value


class _Guarded:
    """A tensor inside a larger poisoned buffer: ``_FRONT`` elements before, ``GUARD`` after."""

    def __init__(self, buf: torch.Tensor, view: torch.Tensor, span: int) -> None:
        self.buf = buf
        self.view = view
        self.span = span
        self.before = buf.clone()

    @classmethod
    def _buffer(
        cls, span: int, dtype: torch.dtype, device: torch.device, role: str = "output"
    ) -> torch.Tensor:
        buf = torch.empty(_FRONT + span + GUARD, dtype=dtype, device=device)
        _bits(buf).fill_(_poison_value(dtype, role))
        return buf

    @classmethod
    def empty(cls, shape: tuple[int, ...], dtype: torch.dtype, device) -> _Guarded:
        span = math.prod(shape)
        buf = cls._buffer(span, dtype, device)
        view = buf[_FRONT : _FRONT + span].view(shape)
        return cls(buf, view, span)

    @classmethod
    def of(cls, t: torch.Tensor) -> _Guarded:
        """A copy of ``t`` with the same shape and strides, inside a guarded buffer."""
        if any(s < 0 for s in t.stride()):
            raise ValueError("check(): tensors with negative strides are not supported")
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        span = span if t.numel() else 0
        buf = cls._buffer(span, t.dtype, t.device, role="input")
        view = torch.as_strided(buf, t.shape, t.stride(), _FRONT)
        with torch.no_grad():
            view.copy_(t)
        return cls(buf, view, span)

    def _changed(self) -> torch.Tensor:
        return _bits(self.buf) != _bits(self.before)

    def outside_findings(self, block) -> list[Finding]:
        changed = self._changed()
        front = changed[:_FRONT]
        back = changed[_FRONT + self.span :]
        found = []
        if front.any():
            k = _count(front)
            far = _FRONT - front.nonzero()[0].item()
            found.append(
                Finding(
                    "outside",
                    f"{k} element(s) written before the start of out (up to {far} before it).",
                    "Negative offsets: an int32 offset that overflowed, or a wrong program id?",
                    count=k,
                )
            )
        if back.any():
            pos = back.nonzero().flatten()
            k = pos.numel()
            reach = pos[-1].item() + 1
            hint = "A store without a mask: add mask=offsets < n to tl.store (and tl.load)."
            if isinstance(block, int) and reach >= block:
                hint = (
                    "Programs past the last one needed wrote too: the grid is larger "
                    "than triton.cdiv(n, BLOCK) and the stores have no mask."
                )
            elif isinstance(block, int):
                last = (self.span - 1) // block
                hint = (
                    f"The last program ({last}) stored its lanes past the end: "
                    "add mask=offsets < n to tl.store (and tl.load)."
                )
            found.append(
                Finding(
                    "outside",
                    f"{k} element(s) written past the end of out (up to {reach} past it).",
                    hint,
                    count=k,
                )
            )
        return found

    def unwritten(self) -> torch.Tensor:
        inside = _bits(self.buf)[_FRONT : _FRONT + self.span]
        return (inside == _poison_value(self.buf.dtype)).cpu().reshape(self.view.shape)

    def input_findings(self, i: int, original: torch.Tensor) -> list[Finding]:
        changed = self._changed()
        if not changed.any():
            return []
        k = _count(changed)
        inside = _count(changed[_FRONT : _FRONT + self.span])
        where = (
            "inside it" if inside == k else ("past its end" if inside == 0 else "in and around it")
        )
        return [
            Finding(
                "input",
                f"{k} element(s) of argument {i} were overwritten ({where}).",
                "A store into an input pointer? Inputs are read-only in these exercises.",
                count=k,
            )
        ]


# ----------------------------------------------------------------------------- describing


def _count(mask: torch.Tensor) -> int:
    return int(mask.sum().item())


def _unravel(flat: int, shape: tuple[int, ...]) -> Any:
    if len(shape) <= 1:
        return flat
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return tuple(reversed(idx))


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 7]`` -> ``"0-2, 7"`` (at most a few ranges, then ``...``)."""
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:_SHOWN]]
    return ", ".join(parts) + (", ..." if len(runs) > _SHOWN else "")


def _owner_set(mask: torch.Tensor, block) -> set | None:
    if block is None:
        return None
    idx = mask.reshape(-1).nonzero().flatten().tolist()
    if isinstance(block, int):
        return {i // block for i in idx}
    shape = tuple(mask.shape)
    if len(block) != len(shape):
        return None
    return {tuple(c // b for c, b in zip(_unravel(i, shape), block, strict=True)) for i in idx}


def _is_last(owner, shape, block) -> bool:
    if isinstance(block, int):
        return owner == (math.prod(shape) - 1) // block
    return all(o == (n - 1) // b for o, n, b in zip(owner, shape, block, strict=True))


def _ragged(shape, block) -> bool:
    """The last block is partly outside the data (and there is more than one block)."""
    if isinstance(block, int):
        n = math.prod(shape)
        return n > block and n % block != 0
    return (
        any(n % b for n, b in zip(shape, block, strict=True))
        and math.prod(math.ceil(n / b) for n, b in zip(shape, block, strict=True)) > 1
    )


def _where(mask: torch.Tensor, block) -> str:
    """``" (elements 3072-4096, owned by program 3 of 5)"``: where the flagged elements are."""
    shape = tuple(mask.shape)
    flat = mask.reshape(-1).nonzero().flatten().tolist()
    if len(shape) <= 1 or isinstance(block, int):
        text = f": element{'s' if len(flat) > 1 else ''} {_ranges(flat)}"
        if isinstance(block, int):
            owners = sorted({i // block for i in flat})
            total = math.ceil(math.prod(shape) / block)
            which = "program" if len(owners) == 1 else "programs"
            text += f", owned by {which} {_ranges(owners)} of {total} (block {block})"
        return text
    if block is not None and len(block) == len(shape):
        tiles = sorted(_owner_set(mask, block))
        grid = tuple(math.ceil(n / b) for n, b in zip(shape, block, strict=True))
        shown = ", ".join(str(t) for t in tiles[:_SHOWN]) + (", ..." if len(tiles) > _SHOWN else "")
        which = "tile" if len(tiles) == 1 else "tiles"
        return f", in {which} {shown} of a {' x '.join(map(str, grid))} grid of tiles"
    firsts = sorted({_unravel(i, shape)[0] for i in flat})
    if len(shape) > 2:  # a stack of results, out[0], out[1], ...: name the slices
        if len(firsts) == 1:
            return f" in out[{firsts[0]}]"
        return f" in out[i] for i in {_ranges(firsts)}"
    return f" in rows {_ranges(firsts)}"


def _label(args: Sequence[Any]) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            shape = "x".join(map(str, a.shape)) or "scalar"
            parts.append(f"{shape} {_dt(a.dtype)}" + ("" if a.is_contiguous() else " (strided)"))
        else:
            parts.append(repr(a))
    return ", ".join(parts)


def _describe(named, block) -> str:
    tensors = [a for _, args in named for a in args if isinstance(a, torch.Tensor)]
    dtypes = sorted({_dt(a.dtype) for a in tensors})
    text = ", ".join(dtypes) if dtypes else "no tensor arguments"
    if block is not None:
        text += f", block {block if isinstance(block, int) else tuple(block)}"
    mode = "interpreter" if runtime.is_interpreter() else runtime.get_runtime().mode
    return f"{text}; {mode}"


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ----------------------------------------------------------------------------- helpers


def _check_callable(obj: Any, what: str, kernel_hint: bool = False) -> None:
    if kernel_hint:
        from triton.runtime import KernelInterface

        if isinstance(obj, KernelInterface):
            raise TypeError(
                f"check(): {what} is a Triton kernel; pass a Python function that launches "
                "it, e.g. def fn(x, y, out): kernel[grid](x, y, out, x.numel(), BLOCK=1024)"
            )
    if not callable(obj):
        raise TypeError(f"check(): {what} must be callable, got {type(obj).__name__}")


def _check_block(block):
    if block is None:
        return None
    if isinstance(block, int) and not isinstance(block, bool):
        if block < 1:
            raise ValueError(f"check(): block must be >= 1, got {block}")
        return block
    if (
        isinstance(block, Sequence)
        and block
        and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)
    ):
        return tuple(block)
    raise ValueError(f"check(): block must be an int or a tuple of ints >= 1, got {block!r}")


def _takes_out(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "out" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _out_dtype(args, ref: torch.Tensor) -> torch.dtype:
    if not ref.is_floating_point():
        return ref.dtype
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a.dtype
    return torch.float32


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape


# ----------------------------------------------------------------------------- isolation


def _in_child(run_all, labels: list[str]) -> list[_Case]:
    """Run the cases in a forked child; a crash there is a finding, not a dead session."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12)
        pid = os.fork()
    if pid == 0:  # the child: run, send each case as it finishes, leave without cleanup
        code = 0
        try:
            os.close(read_fd)
            faulthandler.disable()  # a crash here is a finding; no traceback dump
            torch.set_num_threads(1)
            # NumPy's warnings about poison (NaN) read by an unmasked load: reported as
            # findings, not as noise.
            warnings.simplefilter("ignore", RuntimeWarning)
            with os.fdopen(write_fd, "wb") as pipe:

                def emit(case):
                    pickle.dump(("case", case), pipe)
                    pipe.flush()

                try:
                    run_all(emit)
                except BaseException as exc:  # noqa: BLE001  (the reference or the arguments failed)
                    pickle.dump(("error", "".join(traceback.format_exception(exc))), pipe)
                    pipe.flush()
                    code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
    os.close(write_fd)
    data = bytearray()
    deadline = time.monotonic() + _CHILD_TIMEOUT_S
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([pipe], [], [], left)
            if ready:
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    break
                data += chunk
    _, status = os.waitpid(pid, 0)
    results: list[_Case] = []
    error = None
    stream = io.BytesIO(bytes(data))
    while True:
        try:
            kind, value = pickle.load(stream)
        except EOFError:
            break
        except Exception:  # noqa: BLE001  (a truncated message: the child died writing it)
            break
        if kind == "case":
            results.append(value)
        else:
            error = value
    if error is not None:
        raise RuntimeError(f"check(): the check itself failed (not the kernel):\n{error}")
    if len(results) < len(labels):
        crashed = labels[len(results)]
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            how = "timed out and was stopped" if sig == "SIGKILL" else f"died ({sig})"
        else:
            how = f"exited with status {os.WEXITSTATUS(status)}"
        results.append(
            _Case(
                crashed,
                [
                    Finding(
                        "crashed",
                        f"the process running the kernel {how} in this case.",
                        "It wrote or read far outside its tensors: a grid much larger than "
                        "needed with no mask does that (the interpreter checks no bounds).",
                    )
                ],
            )
        )
        results += [
            _Case(lbl, [Finding("crashed", "not run: an earlier case crashed.")])
            for lbl in labels[len(results) :]
        ]
    return results
