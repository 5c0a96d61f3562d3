"""The warps x stages grid of lesson 13: what the compiler made of each setting.

:class:`PipelineExplorer` is a :class:`tilebook.widgets.SweepExplorer` over
``num_warps`` x ``num_stages`` of one kernel, built from ahead-of-time compiles
(:func:`tilebook.aot.compile_many`), so it works on any machine.  Each cell
holds a setting's registers, spills and shared memory; a setting that spills is
explained in its own row, one the compiler refused (its pipeline does not fit
in shared memory) is shown as *refused*, with no value.  Without a timing record the grid shows
shared memory per program (lower is not faster: the caption says where the
figures come from); with a record of the same settings (rows holding
``warps``, ``stages`` and ``tflops``) it shows the measured rate and flags slow
settings as the sweep explorer does::

    PipelineExplorer({(8, 3): compiled, ...}, refused={(8, 5): 245760},
                     record=None, source="compiled for sm_90", title="matmul")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .aot import CompiledKernel
from .widgets import _SWEEP_JS, SweepExplorer

__all__ = ["PipelineExplorer", "pipeline_rows"]

# Without times, a cell's value is shared memory: no "% of the best" and no
# "among the best" verdict, which would read as speed.  A setting the compiler
# refused has no value at all (its row carries ``refused``): its cell, readout
# and bar say "refused" instead of a number that would read as a measured 0.
_WRONG = 'if(r.wrong){root.classList.add("tbw-wrong");verdict.textContent="Wrong: "+r.wrong}'
_REFUSED = (
    'if(r.wrong){root.classList.add("tbw-wrong");'
    'verdict.textContent=(r.refused?"Refused: ":"Wrong: ")+r.wrong;'
    'if(r.refused)fill.style.width="0%"}'
)
_UNTIMED = (
    "\n  else if(data.untimed){verdict.textContent="
    '"Not timed here: the cell shows what the compiler allocated."}'
)
_EDITS = {
    _WRONG: _REFUSED + _UNTIMED,
    "if(!r.wrong)parts.push(": "if(!r.wrong&&!data.untimed)parts.push(",
    # the grid's cell and its tooltip
    '"\\u2717 "+fmt(r.value)': 'r.refused?"\\u2717 refused":"\\u2717 "+fmt(r.value)',
    '": "+fmt(r.value)+" "+data.unit+': '": "+(r.refused?"refused":fmt(r.value)+" "+data.unit)+',
    '(r.wrong?" (wrong)":"")': '(r.wrong&&!r.refused?" (wrong)":"")',
    # the readout of the chosen setting
    'readout.textContent=fmt(r.value)+" "+data.unit;': (
        'readout.textContent=r.refused?"refused by the compiler":fmt(r.value)+" "+data.unit;'
    ),
}
_PIPELINE_JS = _SWEEP_JS
for _old, _new in _EDITS.items():
    if _PIPELINE_JS.count(_old) != 1:
        raise AssertionError(f"the sweep explorer's script changed: {_old!r}")
    _PIPELINE_JS = _PIPELINE_JS.replace(_old, _new)


def pipeline_rows(
    compiled: Mapping[tuple[int, int], CompiledKernel],
    refused: Mapping[tuple[int, int], int] | None = None,
    record: Any = None,
) -> list[dict[str, Any]]:
    """One row per ``(warps, stages)``: compiled facts, a note, and the rate if timed.

    ``refused`` maps a setting the compiler refused to the bytes of shared
    memory it said the setting needs.  ``record`` (a :class:`tilebook.bench.Record`
    or None) must hold one row per compiled setting.
    """
    if not compiled:
        raise ValueError("pipeline_rows needs at least one compiled setting")
    rows = []
    for (warps, stages), k in compiled.items():
        if not isinstance(k, CompiledKernel):
            raise TypeError(f"compiled[{warps, stages}] is not a CompiledKernel: {k!r}")
        row = {"warps": warps, "stages": stages, "smem_kib": k.shared_bytes / 1024}
        row["detail"] = (
            f"{k.registers} registers per thread, {k.shared_bytes / 1024:.0f} KiB shared"
        )
        if k.spill_stores_bytes:
            row["why"] = (
                f"spills {k.spill_stores_bytes} bytes of registers to local memory: "
                "more warps (or a smaller tile) give each thread fewer values to hold"
            )
        elif stages == 1:
            row["why"] = "one stage, no pipeline: every K step waits for its own loads"
        if record is not None:
            row["tflops"] = record.one(warps=warps, stages=stages)["tflops"]
        rows.append(row)
    for (warps, stages), need in (refused or {}).items():
        rows.append(
            {
                "warps": warps,
                "stages": stages,
                "smem_kib": need / 1024,
                "tflops": 0.0,  # never shown: the widget says "refused"
                "refused": True,
                "wrong": (
                    f"its pipeline needs {need / 1024:.0f} KiB of shared memory per "
                    "program, more than one program may have, so the compiler does not "
                    "build it"
                ),
            }
        )
    return rows


class PipelineExplorer(SweepExplorer):
    """Warps x stages of one kernel: compiled facts, and measured rates when recorded.

    Parameters
    ----------
    compiled
        ``{(num_warps, num_stages): CompiledKernel}`` from
        :func:`tilebook.aot.compile_many`.
    refused
        ``{(num_warps, num_stages): shared bytes needed}`` for settings the
        compiler refused; they are flagged and shown as refused, with no value.
    record
        A :class:`tilebook.bench.Record` timing the compiled settings (rows with
        ``warps``, ``stages``, ``tflops``), or None on a machine without one.
    source
        Where the compiled figures come from, the caption when there is no record.
    title
        The widget's title.
    """

    script = _PIPELINE_JS

    def __init__(
        self,
        compiled: Mapping[tuple[int, int], CompiledKernel],
        *,
        refused: Mapping[tuple[int, int], int] | None = None,
        record: Any = None,
        source: str,
        title: str,
    ) -> None:
        timed = record is not None
        self.timed = timed
        self.refused = dict(refused or {})
        rows = pipeline_rows(compiled, refused, record)
        deepest = max(s for w, s in compiled if w == max(w for w, _ in compiled))
        super().__init__(
            rows,
            knobs=["warps", "stages"],
            metric="tflops" if timed else "smem_kib",
            unit="TFLOP/s" if timed else "KiB of shared memory per program",
            caption=record.caption() if timed else source,
            title=title,
            labels={"warps": "num_warps", "stages": "num_stages"},
            initial={"warps": max(w for w, _ in compiled), "stages": deepest},
            better="higher" if timed else "lower",
            slow_fraction=0.6 if timed else 0.0,
            note="why",
            wrong="wrong",
            extra="detail",
        )

    def data(self) -> dict[str, Any]:
        """The sweep explorer's data, plus ``untimed`` and each row's ``refused``."""
        data = {**super().data(), "untimed": not self.timed}
        for row in data["rows"]:
            knobs = row["knobs"]
            row["refused"] = (knobs["warps"], knobs["stages"]) in self.refused
        return data
