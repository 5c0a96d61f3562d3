"""The online softmax stepper of lesson 06: the running maximum and sum, block by block.

:class:`OnlineSoftmaxStepper` walks a short row of scores in blocks, as the
online softmax does (Milakov and Gimelshein, 2018).  After each block it shows
the running maximum ``m``, the running sum ``s`` of ``exp(x - m)``, and the
factor ``exp(m_old - m_new)`` that rescales what was summed against the old
maximum whenever a block raises it.  After the last block the probabilities
``exp(x_i - m) / s`` stand beside the true softmax.  The setting "skip the
rescale" leaves the factor out: wherever the maximum grows after the first
block the result is wrong, and the widget says by how much.

Every number it shows is computed here in Python, in float64, for every
setting of the knobs (:meth:`OnlineSoftmaxStepper.steps`), so that a test can
check it; the JavaScript only draws the setting the knobs select.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .widgets import Widget, asset

__all__ = ["ROWS", "OnlineSoftmaxStepper", "online_steps"]

#: The rows the stepper offers, in the order shown: one whose maximum keeps
#: growing (every block rescales), one whose maximum comes first (no block
#: rescales, so leaving the rescale out goes unnoticed), and one whose maximum
#: arrives in the last block.
ROWS: dict[str, tuple[float, ...]] = {
    name: tuple(float(v) for v in values.split())
    for name, values in {
        "rising": "-1.2 0.4 -0.3 0.9 0.2 1.6 1.1 2.3 1.8 2.9 2.2 3.4 3.0 4.1 3.5 4.6",
        "max first": "4.0 1.2 -0.5 2.1 0.3 1.8 -1.1 2.6 0.7 3.1 -0.2 1.5 2.4 0.1 3.3 1.0",
        "spike last": "0.3 -0.8 0.5 0.1 -0.4 0.9 0.2 -0.6 0.4 0.0 -0.3 0.7 -0.1 0.6 6.0 0.2",
    }.items()
}

#: Below this largest error in a probability, a result counts as right.
RIGHT = 1e-12


def online_steps(row: Sequence[float], block: int, rescale: bool = True) -> dict[str, Any]:
    """The online softmax of ``row`` in blocks of ``block``, every step recorded.

    Returns ``{"steps": [...], "p": [...], "true": [...], "sum_p": ...,
    "max_err": ..., "rescales": ...}``.  Step ``k`` (from 0, before any block)
    holds the block just read (``lo``, ``hi``: its first and one-past-last
    index), its maximum ``block_max``, the maximum before and after
    (``m_old``, ``m``), the rescale factor ``exp(m_old - m)`` (``None`` at the
    first block, where nothing was summed yet), the block's own
    ``sum(exp(x - m))`` (``added``) and the running sum ``s``.  With
    ``rescale=False`` the old sum is carried over unscaled.  Infinite maxima
    are ``None`` (JSON has no infinity).
    """
    xs = [float(v) for v in row]
    if not xs:
        raise ValueError("online_steps(): the row is empty")
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ValueError(f"online_steps(): block must be a positive int, got {block!r}")
    m, s = -math.inf, 0.0
    before = dict.fromkeys(("block_max", "m_old", "m", "factor"))  # nothing read yet
    steps: list[dict[str, Any]] = [{"k": 0, "lo": 0, "hi": 0, **before, "added": 0.0, "s": 0.0}]
    rescales = 0
    for k, lo in enumerate(range(0, len(xs), block), start=1):
        chunk = xs[lo : lo + block]
        m_old, m = m, max(m, max(chunk))
        factor = None if m_old == -math.inf else math.exp(m_old - m)
        if factor is not None and factor != 1.0:
            rescales += 1
        added = sum(math.exp(v - m) for v in chunk)
        kept = s if (factor is None or not rescale) else s * factor
        s = kept + added
        steps.append(
            {
                "k": k,
                "lo": lo,
                "hi": lo + len(chunk),
                "block_max": max(chunk),
                "m_old": None if m_old == -math.inf else m_old,
                "m": m,
                "factor": factor,
                "added": added,
                "s": s,
            }
        )
    p = [math.exp(v - m) / s for v in xs]
    top = max(xs)
    z = sum(math.exp(v - top) for v in xs)
    true = [math.exp(v - top) / z for v in xs]
    return {
        "steps": steps,
        "p": p,
        "true": true,
        "sum_p": sum(p),
        "max_err": max(abs(a - b) for a, b in zip(p, true, strict=True)),
        "rescales": rescales,
    }


def _note(name: str, block: int, rescale: bool, out: dict[str, Any]) -> tuple[str, str]:
    """The verdict ("ok" or "wrong") and the note of one setting."""
    nb = len(out["steps"]) - 1
    grew = out["rescales"]
    if rescale:
        if grew:
            return "ok", (
                f"The maximum grew in {grew} of the {nb - 1} blocks after the first; each "
                "time the sum so far was multiplied by exp(m_old - m_new), so every term "
                "ends up measured against the final maximum."
            )
        return "ok", (
            "The first block holds the maximum: every later factor is exp(0) = 1, "
            "and the rescale changes nothing."
        )
    if out["max_err"] > RIGHT:
        return "wrong", (
            f"The maximum grew in {grew} of the {nb - 1} blocks after the first, and each "
            "time the terms summed before were left measured against a smaller maximum: "
            f"too large by exp(m_new - m_old).  The sum is too large, so the "
            f"probabilities sum to {out['sum_p']:.3f} instead of 1."
        )
    return "ok", (
        "Right by luck: the first block holds the maximum, so no factor was ever "
        "needed.  A test on rows like this one cannot catch the missing rescale."
    )


class OnlineSoftmaxStepper(Widget):
    """Step through the online softmax of a short row, block by block.

    Parameters
    ----------
    rows
        ``{name: values}``: the rows offered, in order (default :data:`ROWS`).
    blocks
        Block lengths offered, in order.
    initial
        Starting value of each knob: ``row``, ``block``, ``rescale`` (``"on"``
        or ``"skip"``) and ``step`` (0 is before the first block).
    title
        The widget's heading.
    """

    kind = "online-softmax"
    scripts = ("online-softmax.js",)

    def __init__(
        self,
        rows: Mapping[str, Sequence[float]] | None = None,
        *,
        blocks: Sequence[int] = (2, 4, 8),
        initial: Mapping[str, Any] | None = None,
        title: str = "Online softmax, block by block",
    ) -> None:
        rows = dict(ROWS if rows is None else rows)
        if not rows:
            raise ValueError("OnlineSoftmaxStepper needs at least one row")
        for name, values in rows.items():
            if not isinstance(name, str) or not values:
                raise ValueError(f"row {name!r} must be a named, non-empty sequence of numbers")
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                raise ValueError(f"row {name!r} must hold finite numbers")
        blocks = list(blocks)
        if not blocks or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in blocks
        ):
            raise ValueError(f"blocks must be positive ints, got {blocks}")
        self.rows = {k: [float(v) for v in vals] for k, vals in rows.items()}
        self.blocks = blocks
        self.title = title
        self.initial = {
            "row": next(iter(self.rows)),
            "block": blocks[len(blocks) // 2],
            "rescale": "on",
            "step": 0,
            **dict(initial or {}),
        }
        if self.initial["row"] not in self.rows:
            raise ValueError(f"initial row {self.initial['row']!r} is not one of {list(self.rows)}")
        if self.initial["block"] not in blocks:
            raise ValueError(f"initial block {self.initial['block']!r} is not one of {blocks}")
        if self.initial["rescale"] not in ("on", "skip"):
            raise ValueError("initial rescale must be 'on' or 'skip'")
        step = self.initial["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"initial step must be an int >= 0, got {step!r}")

    def steps(self, row: str, block: int, rescale: str) -> dict[str, Any]:
        """One setting: :func:`online_steps` plus its ``verdict`` and ``note``."""
        if rescale not in ("on", "skip"):
            raise ValueError(f"rescale must be 'on' or 'skip', got {rescale!r}")
        out = online_steps(self.rows[row], block, rescale == "on")
        out["verdict"], out["note"] = _note(row, block, rescale == "on", out)
        out["knobs"] = {"row": row, "block": block, "rescale": rescale}
        return out

    def settings(self) -> list[dict[str, Any]]:
        """Every setting of the knobs, as :meth:`steps` computes it."""
        return [self.steps(r, b, s) for r in self.rows for b in self.blocks for s in ("on", "skip")]

    def data(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "blocks": self.blocks,
            "initial": self.initial,
            "settings": self.settings(),
            "css": asset("online-softmax.css"),
        }
