"""What an ahead-of-time compile returns: every stage's text, its source lines, resources."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .counts import count_instructions, count_opcodes

__all__ = ["STAGES", "CompiledKernel", "SourceLine", "StageLine"]

#: The stages of a compile, in order: Triton IR, Triton GPU IR (with layouts),
#: LLVM IR, PTX (NVIDIA's virtual ISA) and SASS (the machine code ``ptxas`` made).
STAGES = ("ttir", "ttgir", "llir", "ptx", "sass")

_TRITON_DIR = None


def _in_triton(path: str) -> bool:
    """True for Triton's own library code (``tl.zeros`` is a ``@triton.jit`` helper)."""
    global _TRITON_DIR
    if _TRITON_DIR is None:
        import triton

        _TRITON_DIR = os.path.dirname(os.path.abspath(triton.__file__)) + os.sep
    return os.path.abspath(path).startswith(_TRITON_DIR)


class SourceLine(NamedTuple):
    """One line of Python: ``file``, 1-based ``line`` number and its ``text``."""

    file: str
    line: int
    text: str


class StageLine(NamedTuple):
    """One line of a stage's text: 1-based ``number`` and its ``text``."""

    number: int
    text: str


_TRAILING_LOC = re.compile(r"\s+loc\((?:[^()]|\([^()]*\))*\)\s*$")


@dataclass(repr=False)
class CompiledKernel:
    """Every compiler stage of one kernel, where its lines came from, and its resources.

    Made by :func:`compile_kernel` and :func:`compile_many`.

    Attributes
    ----------
    name : str
        The kernel's name.
    arch : int
        Compute capability compiled for (``90`` is ``sm_90a``).
    stages : dict of str to str
        The text of each stage in :data:`STAGES`; read one with :meth:`stage`.
    num_warps, num_stages : int
        The launch options compiled with.
    shared_bytes : int
        Shared memory one program uses (Triton's ``metadata.shared``).
    registers : int
        Registers per thread, from the ptxas report of the PTX (checked against
        the register count recorded in the cubin Triton built).
    spill_stores_bytes, spill_loads_bytes : int
        Bytes of spill stores and loads that ptxas reports.
    ptxas_log : str
        The whole ``ptxas -v`` report.
    ptxas : str
        Path of the ``ptxas`` that produced it: the one Triton uses for ``arch``.
    line_map : dict
        ``line_map[stage]`` lists ``(stage_line, ((file, line), ...))``: each line of
        the stage that carries a source location, with the Python lines it came
        from (an inlined helper's line and the line that called it).
    sources : dict
        ``sources[file]`` lists ``(line, text)`` of each Python line in ``line_map``.
    kernel_file, kernel_line, kernel_source : str, int, str
        Where the kernel's ``def`` (with its decorators) is and its text.
    extra : dict
        Triton's version, the disassembler used, the compile options.
    """

    name: str
    arch: int
    stages: dict[str, str]
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int
    spill_stores_bytes: int
    spill_loads_bytes: int
    ptxas_log: str = ""
    ptxas: str = ""
    line_map: dict[str, list[tuple[int, tuple[tuple[str, int], ...]]]] = field(default_factory=dict)
    sources: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    kernel_file: str = ""
    kernel_line: int = 0
    kernel_source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # After a trip through JSON the tuples are lists; make them tuples again.
        self.line_map = {
            stage: [(int(n), tuple((str(f), int(ln)) for f, ln in locs)) for n, locs in rows]
            for stage, rows in self.line_map.items()
        }
        self.sources = {f: [(int(n), str(t)) for n, t in rows] for f, rows in self.sources.items()}

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.summary()}>"

    # ------------------------------------------------------------------ reading

    def summary(self) -> str:
        """One line: name, target, warps, stages, registers, spills, shared memory."""
        return (
            f"{self.name} sm_{self.arch}: {self.num_warps} warps, {self.num_stages} stages, "
            f"{self.registers} registers, {self.spill_stores_bytes} B spilled, "
            f"{self.shared_bytes} B shared"
        )

    def stage(self, name: str) -> str:
        """The text of one stage: ``"ttir"``, ``"ttgir"``, ``"llir"``, ``"ptx"`` or ``"sass"``."""
        if name not in self.stages:
            raise ValueError(f"no stage {name!r}; the stages are {', '.join(self.stages)}")
        return self.stages[name]

    def count(self, pattern: str, stage: str = "sass") -> int:
        """How many lines of ``stage`` the regular expression ``pattern`` finds something in.

        Lines, not opcodes: ``count("MMA")`` counts the lines of ``HMMA`` and of
        ``HGMMA`` alike; :meth:`instructions` counts opcodes by whole words.
        """
        return count_instructions(self.stage(stage), pattern)

    def instructions(self, *names: str, stage: str = "sass") -> dict[str, int]:
        """How many instructions each of ``names`` matches, by whole words.

        ``k.instructions("HMMA", "HGMMA")`` on an ``sm_90`` matmul gives
        ``{"HMMA": 0, "HGMMA": 4}``; see :func:`tilebook.course.aot.count_opcodes`.
        """
        if not names:
            raise ValueError("name at least one instruction, e.g. k.instructions('HMMA')")
        return count_opcodes(self.stage(stage), names, stage)

    # ------------------------------------------------------------ source lines

    def source_lines(self, *, include_triton: bool = False) -> list[SourceLine]:
        """The Python lines that produced code in at least one stage, in order.

        The kernel's own file comes first, then the files of its helpers.
        Lines inside Triton's library (``tl.zeros``, ``tl.cdiv`` are
        ``@triton.jit`` functions too) are left out unless ``include_triton``.
        """

        def order(path: str) -> tuple[bool, str]:
            return (path != self.kernel_file, path)

        out = []
        for path in sorted(self.sources, key=order):
            if include_triton or not _in_triton(path):
                out.extend(SourceLine(path, n, t) for n, t in self.sources[path])
        return out

    def _resolve(self, source_line: int | str, file: str | None) -> tuple[str, int]:
        if isinstance(source_line, bool) or not isinstance(source_line, (int, str)):
            raise TypeError(
                f"source_line must be a line number or a piece of its text, got {source_line!r}"
            )
        if isinstance(source_line, int):
            return (os.path.normpath(file) if file else self.kernel_file), source_line
        candidates = {
            (p, n): t
            for p, rows in self.sources.items()
            if (file is None or p == os.path.normpath(file)) and not _in_triton(p)
            for n, t in rows
        }
        first = self.kernel_line
        for i, text in enumerate(self.kernel_source.splitlines()):
            if file is None or os.path.normpath(file) == self.kernel_file:
                candidates.setdefault((self.kernel_file, first + i), text)
        hits = sorted(pos for pos, text in candidates.items() if source_line in text)
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise ValueError(f"no line of {self.name} or its helpers contains {source_line!r}")
        listing = "\n".join(f"  {p}:{n}: {candidates[(p, n)].strip()}" for p, n in hits)
        raise ValueError(
            f"{len(hits)} lines contain {source_line!r}; give more of the text or the "
            f"line number:\n{listing}"
        )

    def lines_for(
        self, source_line: int | str, stage: str, *, file: str | None = None
    ) -> list[StageLine]:
        """The lines of ``stage`` that came from one line of Python.

        Parameters
        ----------
        source_line : int or str
            A line number in ``file`` (by default the kernel's file, numbered as
            in that file), or a piece of the line's text that exactly one line
            of the kernel or its helpers contains, e.g. ``"tl.load(x_ptr"``.
        stage : str
            One of :data:`STAGES`.
        file : str, optional
            The file of a helper kernel, when ``source_line`` is a number there.

        Returns
        -------
        list of StageLine
            ``(number, text)`` of each line of the stage, in order; empty when
            that line produced nothing in this stage (a comment, a constant
            folded away).  A call of a ``@triton.jit`` helper gets the lines of
            the inlined helper too.

        Raises
        ------
        ValueError
            Unknown stage, or a text that no line or several lines contain.
        """
        text = self.stage(stage).splitlines()
        want = self._resolve(source_line, file)
        return [
            StageLine(n, text[n - 1])
            for n, locs in self.line_map.get(stage, [])
            if want in locs and n <= len(text)
        ]

    def line_index(self, stage: str) -> dict[tuple[str, int], list[int]]:
        """For every Python line ``(file, line)``, the numbers of the stage lines from it.

        The whole mapping at once, as a stage viewer needs it; :meth:`lines_for`
        answers for one line.
        """
        self.stage(stage)
        index: dict[tuple[str, int], list[int]] = {}
        for number, locs in self.line_map.get(stage, []):
            for loc in locs:
                index.setdefault(loc, []).append(number)
        return index

    def trace(
        self,
        source_line: int | str,
        stages: tuple[str, ...] = STAGES,
        *,
        file: str | None = None,
        limit: int = 6,
        width: int = 88,
    ) -> str:
        """One line of Python followed through the stages, as text for ``print``.

        Shows at most ``limit`` lines per stage, cut to ``width`` characters, with
        MLIR's trailing ``loc(...)`` records left out for reading.
        """
        path, number = self._resolve(source_line, file)
        src = dict(self.sources.get(path, []))
        if path == self.kernel_file:
            for i, t in enumerate(self.kernel_source.splitlines()):
                src.setdefault(self.kernel_line + i, t)
        out = [_clip(f"{os.path.basename(path)}:{number}  {src.get(number, '').strip()}", width)]
        for stage in stages:
            found = self.lines_for(number, stage, file=path)
            out.append(f"{stage}: {len(found)} line{'s' * (len(found) != 1)}")
            for line in found[:limit]:
                body = _TRAILING_LOC.sub("", line.text).strip()
                out.append(_clip(f"  {line.number:>5}  {body}", width))
            if len(found) > limit:
                out.append(f"  ... {len(found) - limit} more")
        return "\n".join(out)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
