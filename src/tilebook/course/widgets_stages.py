"""A stage viewer: every compiler stage of a kernel, and the lines one Python line became.

The reader picks a compiled build (a kernel, a target, a variant), a line of the
kernel's Python source and a stage; the widget shows the stage's real text with
the lines that came from that Python line highlighted, how many there are in
every stage, what the stage is for, and the compiler passes that changed the
kernel on the way to it.  A build can be flagged as wrong (it computes a wrong
result) or as costly (what the compiled code shows, such as narrower loads),
with the reason, which the widget shows when that build is chosen.

Built from :func:`tilebook.course.passes.compile_with_passes` (every stage, the front
end's TTIR and the passes) or from :func:`tilebook.course.aot.compile_many` (every
stage, no passes)::

    StageViewer(builds, caption="compiled ahead of time", line="tl.load(x_ptr",
                warn={"no hint": "8 narrow loads where 2 wide ones do"})
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .aot import CompiledKernel
from .passes import Traced
from .widgets import Widget

__all__ = ["STAGE_JOBS", "StageViewer", "stage_texts"]

#: What each stage is for, shown with it: (key, label, job).
STAGE_JOBS: tuple[tuple[str, str, str], ...] = (
    (
        "front",
        "Python → TTIR",
        (
            "Triton parses the function's source with Python's ast module and its code "
            "generator walks the tree, writing Triton IR (TTIR): one operation per "
            "operation on a tensor, constexpr values already folded in.  This is the "
            "text before any pass ran: verbose, checks included, nothing about threads."
        ),
    ),
    (
        "ttir",
        "TTIR",
        (
            "Triton IR after the first passes (inlining, canonicalisation, combining, "
            "common subexpressions): operations on whole blocks such as a load of "
            "BLOCK pointers under a mask.  No threads, no layouts, no target yet."
        ),
    ),
    (
        "ttgir",
        "TTGIR",
        (
            "TritonGPU IR: each tensor now has a layout that says which thread holds "
            "which elements (#blocked: sizePerThread, threadsPerWarp, warpsPerCTA).  "
            "The passes here choose layouts for coalesced access, tensor-core layouts "
            "for tl.dot, remove layout conversions, and pipeline loops through shared "
            "memory."
        ),
    ),
    (
        "llir",
        "LLVM IR",
        (
            "LLVM IR of one thread: each tensor operation is unrolled into the "
            "elements this thread owns, loads and stores become inline PTX assembly "
            "(predicated by the mask), and LLVM's own optimiser runs."
        ),
    ),
    (
        "ptx",
        "PTX",
        (
            "PTX, NVIDIA's virtual instruction set, written by LLVM's NVPTX back end.  "
            "The .loc lines name the Python line of the instructions below them."
        ),
    ),
    (
        "sass",
        "SASS",
        (
            "SASS, the machine code of one GPU generation: ptxas assembles the PTX "
            "into a cubin, allocating registers and scheduling instructions; "
            "nvdisasm prints it."
        ),
    ),
)

_PASS_IR = {"ttir": "ttir", "ttgir": "ttgir", "llir": "llvm"}
_PTX_DEBUG = re.compile(r"^\s*\.section\s+\.debug")


def stage_texts(build: Traced | CompiledKernel) -> dict[str, str]:
    """The text of every stage of ``build`` as the viewer shows it.

    The PTX loses its DWARF sections (``.section .debug_*``, byte lists that
    ``ptxas`` turns into the cubin's debug information); every line before
    them keeps its number.
    """
    k = build.kernel if isinstance(build, Traced) else build
    out = {}
    if isinstance(build, Traced) and build.front_end:
        out["front"] = build.front_end
    for key in ("ttir", "ttgir", "llir", "ptx", "sass"):
        out[key] = k.stage(key)
    lines = out["ptx"].splitlines()
    cut = next((i for i, line in enumerate(lines) if _PTX_DEBUG.match(line)), None)
    if cut is not None:
        kept = [*lines[:cut], "\t// ... the DWARF sections (.section .debug_*) are left out"]
        out["ptx"] = "\n".join(kept) + "\n"
    return out


def _index(line_map: list, kernel_file: str) -> dict[int, list[int]]:
    index: dict[int, list[int]] = {}
    for number, locs in line_map:
        for path, line in locs:
            if path == kernel_file:
                index.setdefault(int(line), []).append(int(number))
    return index


def _summary(k: CompiledKernel) -> str:
    return (
        f"{k.name} for sm_{k.arch}: {k.num_warps} warps, {k.registers} registers "
        f"per thread, {k.spill_stores_bytes} bytes spilled, {k.shared_bytes} bytes "
        "of shared memory per program"
    )


class StageViewer(Widget):
    """Every stage of one or more compiled builds, with the lines of one Python line lit.

    Parameters
    ----------
    builds
        ``{label: build}`` in the order the reader should meet them; each build
        a :class:`tilebook.course.passes.Traced` (stages, front end and passes) or a
        :class:`tilebook.course.aot.CompiledKernel` (stages only).
    caption
        Where the text comes from (Triton version, compiled ahead of time...).
    title
        The widget's heading.
    initial
        The label shown first (default: the first).
    line
        The Python line selected first: a line number of the kernel's file or
        a piece of its text, as :meth:`CompiledKernel.lines_for` takes it.
    stage
        The stage shown first: ``"front"``, ``"ttir"``, ``"ttgir"``, ``"llir"``,
        ``"ptx"`` or ``"sass"``.
    wrong
        ``{label: why}`` for builds that compute a wrong result.
    warn
        ``{label: what}`` for builds whose compiled code costs more than it
        should (narrower loads, spills), said from that code.
    notes
        ``{label: text}``: a neutral note shown with that build.
    """

    kind = "stages"
    scripts = ("stages.js",)
    styles = ("stages.css",)

    def __init__(
        self,
        builds: Mapping[str, Traced | CompiledKernel],
        *,
        caption: str,
        title: str = "Stage viewer",
        initial: str | None = None,
        line: int | str | None = None,
        stage: str = "ptx",
        wrong: Mapping[str, str] | None = None,
        warn: Mapping[str, str] | None = None,
        notes: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(builds, Mapping) or not builds:
            raise ValueError("StageViewer needs a non-empty dict of label -> compiled build")
        for label, b in builds.items():
            if not isinstance(b, (Traced, CompiledKernel)):
                raise TypeError(
                    f"build {label!r} must be a Traced or a CompiledKernel, got {type(b).__name__}"
                )
        self.wrong, self.warn, self.notes = dict(wrong or {}), dict(warn or {}), dict(notes or {})
        for name, flags in (("wrong", self.wrong), ("warn", self.warn), ("notes", self.notes)):
            unknown = [k for k in flags if k not in builds]
            if unknown:
                raise ValueError(f"{name} names builds that do not exist: {unknown}")
        if all(label in self.wrong for label in builds):
            raise ValueError("StageViewer needs at least one build that is not wrong")
        keys = [key for key, _, _ in STAGE_JOBS]
        if stage not in keys:
            raise ValueError(f"stage must be one of {', '.join(keys)}, got {stage!r}")
        self.builds = dict(builds)
        self.initial = initial if initial is not None else next(iter(builds))
        if self.initial not in builds:
            raise ValueError(f"initial {self.initial!r} is not among the builds")
        self.caption = caption
        self.title = title
        self.stage = stage
        lines = self._kernel(self.initial).source_lines()
        if line is None:
            self.line = next((s.line for s in lines if "tl." in s.text), 0)
        elif isinstance(line, str):
            hits = [s.line for s in lines if line in s.text]
            if len(hits) != 1:
                raise ValueError(
                    f"line {line!r} is in {len(hits)} lines of {self.initial!r}'s kernel "
                    "that produced code; give a piece of text found in exactly one"
                )
            self.line = hits[0]
        elif isinstance(line, int) and not isinstance(line, bool):
            self.line = line
        else:
            raise TypeError(f"line must be a line number or a piece of its text, got {line!r}")

    def _kernel(self, label: str) -> CompiledKernel:
        b = self.builds[label]
        return b.kernel if isinstance(b, Traced) else b

    def data(self) -> dict[str, Any]:
        texts: list[str] = []
        ids: dict[str, int] = {}

        def text_id(text: str) -> int:
            if text not in ids:
                ids[text] = len(texts)
                texts.append(text)
            return ids[text]

        builds = []
        for label, b in self.builds.items():
            k = self._kernel(label)
            stages = {}
            for key, text in stage_texts(b).items():
                if key == "front":
                    index = _index(b.front_end_lines, k.kernel_file)
                else:
                    index = {n: v for (f, n), v in k.line_index(key).items() if f == k.kernel_file}
                entry: dict[str, Any] = {
                    "text": text_id(text),
                    "index": {str(n): v for n, v in index.items()},
                }
                if isinstance(b, Traced) and key in _PASS_IR:
                    entry["passes"] = [r.name for r in b.passes.changed(_PASS_IR[key])]
                stages[key] = entry
            verdict = (
                {"kind": "wrong", "text": self.wrong[label]}
                if label in self.wrong
                else {"kind": "warn", "text": self.warn[label]}
                if label in self.warn
                else {"kind": "", "text": ""}
            )
            builds.append(
                {
                    "label": label,
                    "summary": _summary(k),
                    "verdict": verdict,
                    "note": self.notes.get(label, ""),
                    "first": k.kernel_line,
                    "source": k.kernel_source.splitlines(),
                    "stages": stages,
                }
            )
        return {
            "texts": texts,
            "stages": [{"key": key, "label": lab, "job": job} for key, lab, job in STAGE_JOBS],
            "builds": builds,
            "initial": {
                "build": list(self.builds).index(self.initial),
                "line": self.line,
                "stage": self.stage,
            },
            "caption": self.caption,
        }
