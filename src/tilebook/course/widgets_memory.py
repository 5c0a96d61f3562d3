"""Widgets about memory access: the coalescing explorer of lesson 04.

:class:`CoalescingExplorer` shows the 32-byte sectors that one warp's load
touches for a stride, a dtype and the elements each thread owns, computed by
:func:`tilebook.course.experiments.memory_access.warp_access`, with the fraction of
the fetched bytes the program asked for.  The warp's tile runs past the end of
the tensor, so that switching the mask off shows the reads past the end (a
wrong setting); a stride that wastes most of each sector is flagged as slow.
Where a measured record of the stride sweep is given
(:func:`tilebook.course.experiments.memory_access.strides`), each stride of its dtype
also shows the measured rate beside the model's prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .bench import Record
from .experiments.memory_access import SECTOR_BYTES, WARP_SIZE, predicted_ratio, warp_access
from .widgets import Widget

__all__ = ["DTYPES", "CoalescingExplorer"]

#: The dtypes the explorer offers, by name: bytes per element.
DTYPES: dict[str, int] = {"int8": 1, "float16": 2, "float32": 4, "float64": 8}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class CoalescingExplorer(Widget):
    """The sectors one warp's load touches, for a stride, a dtype and a tile.

    Parameters
    ----------
    measured
        A record of :func:`tilebook.course.experiments.memory_access.strides` (live or
        committed), or None.  Rows of its dtype then show the measured rate of
        each stride, as a fraction of stride 1, beside the model's prediction.
    strides, dtypes, per_thread
        The knobs' values: strides in elements, dtype names (keys of
        :data:`DTYPES`), elements each thread owns (the warp's tile is
        ``32 * per_thread`` elements).
    tail
        Where the tensor ends, as a fraction of the warp's tile: the lanes past
        it are switched off by the mask, or read past the end without it.
    slow_below
        Settings whose fetched bytes are less than this fraction useful are
        flagged as slow.
    initial
        Starting value of each knob (``stride``, ``dtype``, ``per_thread``,
        ``mask``).
    """

    kind = "coalescing"
    scripts = ("coalescing.js",)
    styles = ("coalescing.css",)

    def __init__(
        self,
        measured: Record | None = None,
        *,
        strides: Sequence[int] = (1, 2, 4, 8, 16, 32),
        dtypes: Sequence[str] = tuple(DTYPES),
        per_thread: Sequence[int] = (1, 2, 4),
        tail: float = 0.75,
        slow_below: float = 0.75,
        initial: dict[str, Any] | None = None,
        title: str = "Coalescing: the sectors one warp's load touches",
    ) -> None:
        strides, per_thread, dtypes = list(strides), list(per_thread), list(dtypes)
        for name, values in (("strides", strides), ("per_thread", per_thread)):
            if not values or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values
            ):
                raise ValueError(f"CoalescingExplorer: {name} must be positive ints, got {values}")
        unknown = [d for d in dtypes if d not in DTYPES]
        if not dtypes or unknown:
            raise ValueError(
                f"CoalescingExplorer: unknown dtypes {unknown}; choose from {list(DTYPES)}"
            )
        if not 0 < tail < 1:
            raise ValueError(f"CoalescingExplorer: tail must be between 0 and 1, got {tail}")
        if not 0 < slow_below <= 1:
            raise ValueError(f"CoalescingExplorer: slow_below must be in (0, 1], got {slow_below}")
        if measured is not None and not isinstance(measured, Record):
            raise TypeError(
                f"CoalescingExplorer: measured must be a Record or None, got {type(measured)}"
            )
        self.measured = measured
        self.strides, self.dtypes, self.per_thread = strides, dtypes, per_thread
        self.tail, self.slow_below, self.title = tail, slow_below, title
        self.initial = {
            "stride": strides[0],
            "dtype": "float32" if "float32" in dtypes else dtypes[0],
            "per_thread": per_thread[-1],
            "mask": "on",
            **(initial or {}),
        }
        values = {
            "stride": strides,
            "dtype": dtypes,
            "per_thread": per_thread,
            "mask": ["on", "off"],
        }
        for k, v in self.initial.items():
            if k not in values or v not in values[k]:
                raise ValueError(
                    f"CoalescingExplorer: initial {k}={v!r} is not among the knob's values"
                )

    # ------------------------------------------------------------------ data

    def _measured_text(self, stride: int, dtype: str) -> str | None:
        rec = self.measured
        if rec is None:
            return None
        rows = {r["stride"]: r for r in rec.rows if r.get("dtype") == dtype}
        if stride not in rows or 1 not in rows:
            return None
        ratio = rows[stride]["gbps"] / rows[1]["gbps"]
        where = rec.provenance.get("gpu", "a GPU")
        return (
            f"Measured on {where}: lesson 04's copy at this stride runs at "
            f"{ratio:.0%} of its stride-one rate; the sector count predicts "
            f"{predicted_ratio(stride, DTYPES[dtype]):.0%}."
        )

    def row(self, stride: int, dtype: str, per_thread: int, mask: str) -> dict[str, Any]:
        """The data of one setting: the model's counts, the verdict and its note."""
        itemsize = DTYPES[dtype]
        elements = WARP_SIZE * per_thread
        valid = max(1, min(elements - 1, round(self.tail * elements)))
        a = warp_access(stride, itemsize, per_thread, valid=valid, masked=mask == "on")
        gap = stride * itemsize
        past = elements - valid  # elements, not lanes: a lane may hold several
        if a.past_end:
            verdict = "wrong"
            headline = (
                f"{_plural(a.past_end, 'element')} past the end of the tensor are read "
                f"({a.past_end * itemsize} bytes it does not own)."
            )
            note = (
                "Without the mask the lanes past the end load whatever lies there: "
                "another tensor's data, or memory that is not mapped at all, which "
                "stops the program with an illegal address."
            )
        elif a.efficiency < self.slow_below:
            verdict = "slow"
            headline = (
                f"only {a.useful_bytes} of the {a.fetched_bytes} bytes fetched were asked for."
            )
            if gap >= SECTOR_BYTES:
                note = (
                    f"Neighbouring elements are {gap} bytes apart, so each sits in a sector "
                    f"of its own: {SECTOR_BYTES - itemsize} of every {SECTOR_BYTES} bytes "
                    "fetched are thrown away."
                )
            else:
                note = (
                    f"Neighbouring elements are {gap} bytes apart: one element in {stride} of "
                    "each sector is asked for, and the memory moves the whole sector."
                )
        else:
            verdict = "ok"
            headline = (
                "Coalesced: neighbouring lanes read neighbouring addresses."
                if stride == 1
                else "Most of each fetched sector is used."
            )
            if a.loads == 1 and a.load_bytes == 16:
                note = "Each thread loads its elements with one 16-byte instruction, the widest."
            elif stride == 1:
                note = (
                    f"Each thread loads {a.load_bytes} bytes per instruction, up to 16: "
                    "more elements per thread make wider loads."
                )
            else:
                note = ""
            if stride == 1 and a.efficiency < 1:
                note += " The last sector is partly used: the tensor ends inside it."
        if mask == "on" and past:
            note = (note + " " if note else "") + (
                f"The mask switches off the {_plural(past, 'element')} past the end: "
                "they fetch nothing."
            )
        return {
            "knobs": {"stride": stride, "dtype": dtype, "per_thread": per_thread, "mask": mask},
            "efficiency": a.efficiency,
            "sectors": a.sectors,
            "fetched": a.fetched_bytes,
            "useful": a.useful_bytes,
            "loads": a.loads,
            "load_bytes": a.load_bytes,
            "past_end": a.past_end,
            "past_end_sectors": a.past_end_sectors,
            "map": a.sector_map,
            "verdict": verdict,
            "headline": headline,
            "note": note,
            "measured": self._measured_text(stride, dtype),
        }

    def data(self) -> dict[str, Any]:
        knobs = [
            {
                "name": "stride",
                "label": "stride (elements)",
                "kind": "slider",
                "values": self.strides,
            },
            {"name": "dtype", "label": "dtype", "kind": "choice", "values": self.dtypes},
            {
                "name": "per_thread",
                "label": "elements per thread",
                "kind": "choice",
                "values": self.per_thread,
            },
            {"name": "mask", "label": "mask", "kind": "choice", "values": ["on", "off"]},
        ]
        for k in knobs:
            k["initial"] = self.initial[k["name"]]
        rows = [
            self.row(s, d, p, m)
            for s in self.strides
            for d in self.dtypes
            for p in self.per_thread
            for m in ("on", "off")
        ]
        where = (
            f"measured rates: {self.measured.caption()}"
            if self.measured is not None
            else "no measured stride sweep recorded yet"
        )
        return {
            "knobs": knobs,
            "rows": rows,
            "columns": 32,
            "sector": SECTOR_BYTES,
            "caption": (
                f"Sectors of {SECTOR_BYTES} bytes computed by "
                "tilebook.course.experiments.memory_access.warp_access; the tensor ends "
                f"{self.tail:.0%} of the way through the warp's tile; {where}"
            ),
        }
