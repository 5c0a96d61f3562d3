"""Correctness against a float64 PyTorch reference, printed as a table.

Every lesson checks its kernel before it times it.  :class:`CorrectnessReport`
collects one row per case and prints them; :meth:`CorrectnessReport.assert_ok`
raises when any row failed, so a wrong kernel breaks the docs build instead of
publishing a pretty plot of a wrong answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["CheckRow", "CorrectnessError", "CorrectnessReport", "default_tolerance"]

# Relative (norm-wise) error a correct kernel stays under, per output dtype.
# fp32 round-off on one operation is ~6e-8; these leave room for reductions.
_TOLERANCES = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def default_tolerance(dtype: torch.dtype) -> float:
    """The relative tolerance tilebook uses for outputs of ``dtype``."""
    try:
        return _TOLERANCES[dtype]
    except KeyError:
        raise ValueError(f"no default tolerance for dtype {dtype}; pass tol=") from None


class CorrectnessError(AssertionError):
    """A kernel's output disagreed with the reference beyond tolerance."""


@dataclass(frozen=True)
class CheckRow:
    case: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    rel: float
    tol: float
    ok: bool
    note: str = ""


def _compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, str]:
    """max |out - ref| and ||out - ref|| / ||ref|| over the finite entries.

    Non-finite entries must match exactly (NaN where the reference has NaN, the
    same infinity where it has one); a mismatch there is reported as an infinite
    error so that it always fails.
    """
    o = out.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    if o.shape != r.shape:
        raise CorrectnessError(
            f"shape mismatch: output {tuple(o.shape)} vs reference {tuple(r.shape)}"
        )
    finite = torch.isfinite(r)
    same_nan = torch.isnan(o) & torch.isnan(r)
    same_inf = torch.isinf(o) & torch.isinf(r) & (torch.sign(o) == torch.sign(r))
    bad_special = (~finite & ~(same_nan | same_inf)).sum().item() + (
        finite & ~torch.isfinite(o)
    ).sum().item()
    if bad_special:
        return math.inf, math.inf, f"{bad_special} non-finite mismatches"
    if not finite.any():
        return 0.0, 0.0, "all entries non-finite (matched)"
    diff = (o - r)[finite]
    max_abs = diff.abs().max().item()
    denom = r[finite].norm().item()
    rel = diff.norm().item() / denom if denom > 0 else diff.norm().item()
    return max_abs, rel, ""


@dataclass
class CorrectnessReport:
    """Rows of ``case | shape | dtype | max abs err | rel err | tol | verdict``."""

    title: str = "correctness vs float64 reference"
    rows: list[CheckRow] = field(default_factory=list)

    def check(
        self,
        case: str,
        out: torch.Tensor,
        ref: torch.Tensor,
        *,
        tol: float | None = None,
    ) -> CheckRow:
        """Compare ``out`` with ``ref`` (computed in float64) and add a row."""
        if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
            raise TypeError("check() takes two tensors: the kernel's output and the reference")
        tol = default_tolerance(out.dtype) if tol is None else float(tol)
        max_abs, rel, note = _compare(out, ref)
        ok = rel <= tol and math.isfinite(max_abs)
        row = CheckRow(
            case,
            tuple(out.shape),
            str(out.dtype).removeprefix("torch."),
            max_abs,
            rel,
            tol,
            ok,
            note,
        )
        self.rows.append(row)
        return row

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    def table(self) -> str:
        head = ("case", "shape", "dtype", "max abs err", "rel err", "tol", "verdict")
        body = [
            (
                r.case,
                "x".join(map(str, r.shape)) or "scalar",
                r.dtype,
                f"{r.max_abs:.2e}",
                f"{r.rel:.2e}",
                f"{r.tol:.0e}",
                ("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else ""),
            )
            for r in self.rows
        ]
        widths = [max(len(str(c)) for c in col) for col in zip(head, *body, strict=True)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [self.title, fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        lines += [fmt.format(*row) for row in body]
        return "\n".join(lines)

    def print(self) -> None:
        print(self.table())

    def assert_ok(self) -> None:
        """Print the table and raise :class:`CorrectnessError` if any case failed."""
        self.print()
        if not self.rows:
            raise CorrectnessError("no case was checked")
        failed = [r.case for r in self.rows if not r.ok]
        if failed:
            raise CorrectnessError(f"{len(failed)} case(s) failed: {', '.join(failed)}")
