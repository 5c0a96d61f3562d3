"""The warps x stages grid of lesson 13: what the compiler made of each setting.

:class:`PipelineExplorer` is a :class:`tilebook.course.widgets.SweepExplorer` over
``num_warps`` x ``num_stages`` of one kernel, built from ahead-of-time compiles
(:func:`tilebook.course.aot.compile_many`), so it works on any machine.  Each cell
holds a setting's registers, spills and shared memory; a setting that spills is
explained in its own row, one the compiler refused (its pipeline does not fit
in shared memory) is shown as *refused*, with no value.  Without a timing record the grid shows
shared memory per program (lower is not faster: the caption says where the
figures come from); with a record of the same settings (rows holding
``warps``, ``stages`` and ``tflops``) it shows the measured rate and flags slow
settings as the sweep explorer does::

    PipelineExplorer({(8, 3): compiled, ...}, refused={(8, 5): 245760},
                     record=None, source="compiled for sm_90", title="matmul")

``pitfalls`` adds one checkbox per :class:`Pitfall` (a mistake such as a
16-bit accumulator or a missing mask, with the text of what it got wrong and
its fix).  While one is on, the chosen setting's verdict is "Wrong: " and that
text, and the whole grid is marked wrong: no ``num_warps`` or ``num_stages``
makes a wrong kernel right, only the fix does.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from .aot import CompiledKernel
from .widgets import SweepExplorer, asset

__all__ = ["PipelineExplorer", "Pitfall", "pipeline_rows"]

# The pipeline explorer runs the sweep explorer's script (sweep.js) with these edits.
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
    # the pitfalls wrap the setting's own update (function declarations hoist, so the
    # knobs' handlers and the first call reach the wrapper in pipeline.js)
    "function update(){": "function settingUpdate(){",
}


@functools.cache
def _script() -> str:
    """The sweep explorer's script with :data:`_EDITS` made, then ``pipeline.js``.

    ``pipeline.js`` adds the pitfalls: one on makes every setting wrong, refused ones
    excepted (they build no kernel, so they keep saying why); off again, the
    setting's own verdict comes back.
    """
    js = asset("sweep.js")
    for old, new in _EDITS.items():
        if js.count(old) != 1:
            raise AssertionError(f"the sweep explorer's script changed: {old!r}")
        js = js.replace(old, new)
    return js + asset("pipeline.js")


_PITFALL_NAME_MAX = 40  # a checkbox's label, on one line


@dataclass(frozen=True)
class Pitfall:
    """A mistake the reader can put into the kernel of a :class:`PipelineExplorer`.

    Parameters
    ----------
    name
        A short label for its checkbox, e.g. ``"fp16 accumulator"``.
    wrong
        What goes wrong, best with the figures the page measured; shown as the
        verdict ("Wrong: " and this text) while the pitfall is on.
    fix
        What fixes it, shown with the verdict.
    """

    name: str
    wrong: str
    fix: str

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str):
                raise TypeError(f"Pitfall {f.name} must be text, got {type(value).__name__}")
            if not value.strip():
                raise ValueError(f"Pitfall {f.name} must not be empty")
        if len(self.name) > _PITFALL_NAME_MAX:
            raise ValueError(
                f"Pitfall name {self.name!r} is longer than {_PITFALL_NAME_MAX} characters: "
                "it labels a checkbox; put the detail in wrong"
            )


def _pitfalls(given: Any) -> list[Pitfall]:
    """``given`` as a list of Pitfall: each a Pitfall or a dict of name, wrong and fix."""
    if given is None:
        return []
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Sequence):
        raise TypeError(
            f"pitfalls must be a sequence of Pitfall or dicts, got {type(given).__name__}"
        )
    keys = {f.name for f in fields(Pitfall)}
    out = []
    for i, p in enumerate(given):
        if isinstance(p, Mapping):
            if set(p) != keys:
                missing, extra = sorted(keys - set(p)), sorted(set(p) - keys, key=str)
                raise ValueError(
                    f"pitfalls[{i}] needs exactly the keys {sorted(keys)}: "
                    f"missing {missing}, unknown {extra}"
                )
            p = Pitfall(**p)
        elif not isinstance(p, Pitfall):
            raise TypeError(f"pitfalls[{i}] is not a Pitfall or a dict: {p!r}")
        out.append(p)
    names = [p.name for p in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"pitfall names must differ; given more than once: {twice}")
    return out


def pipeline_rows(
    compiled: Mapping[tuple[int, int], CompiledKernel],
    refused: Mapping[tuple[int, int], int] | None = None,
    record: Any = None,
) -> list[dict[str, Any]]:
    """One row per ``(warps, stages)``: compiled facts, a note, and the rate if timed.

    ``refused`` maps a setting the compiler refused to the bytes of shared
    memory it said the setting needs.  ``record`` (a :class:`tilebook.course.bench.Record`
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
        :func:`tilebook.course.aot.compile_many`.
    refused
        ``{(num_warps, num_stages): shared bytes needed}`` for settings the
        compiler refused; they are flagged and shown as refused, with no value.
    record
        A :class:`tilebook.course.bench.Record` timing the compiled settings (rows with
        ``warps``, ``stages``, ``tflops``), or None on a machine without one.
    source
        Where the compiled figures come from, the caption when there is no record.
    title
        The widget's title.
    pitfalls
        :class:`Pitfall` objects (or dicts with ``name``, ``wrong`` and ``fix``),
        one checkbox each: while one is on, every setting is wrong.
    """

    # pipeline.css: the legend undoes the site theme's (Bootstrap's: a floating
    # heading).  While a pitfall is on, every cell of the grid is marked wrong as a
    # wrong cell is, by its colours (legible in both themes; !important beats the
    # inline tint of a right cell) and by a cross.
    styles = ("pipeline.css",)

    @property
    def script(self) -> str:
        return _script()

    def __init__(
        self,
        compiled: Mapping[tuple[int, int], CompiledKernel],
        *,
        refused: Mapping[tuple[int, int], int] | None = None,
        record: Any = None,
        source: str,
        title: str,
        pitfalls: Sequence[Pitfall | Mapping[str, str]] | None = None,
    ) -> None:
        self.pitfalls = _pitfalls(pitfalls)
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
        """The sweep explorer's data, plus ``untimed``, ``pitfalls`` and each row's ``refused``."""
        data = {**super().data(), "untimed": not self.timed}
        # a text may come wrapped (str of a tilebook.say paragraph): one line in the page
        data["pitfalls"] = [
            {k: " ".join(v.split()) for k, v in asdict(p).items()} for p in self.pitfalls
        ]
        for row in data["rows"]:
            knobs = row["knobs"]
            row["refused"] = (knobs["warps"], knobs["stages"]) in self.refused
        return data
