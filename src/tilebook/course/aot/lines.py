"""Which lines of Python each line of a compiler stage came from.

Every stage carries the source locations that Triton threads through it:

* TTIR and TTGIR (MLIR): ``loc(...)`` at the end of each operation, often an
  alias ``#locN`` defined at the bottom of the module as a file-line-column,
  a name wrapping another location, a ``callsite(callee at caller)`` for an
  inlined ``@triton.jit`` helper, or a ``fused[...]`` list;
* LLVM IR: ``!dbg !N`` on each instruction, ``!N = !DILocation(line:, scope:,
  inlinedAt:)`` with the file on the scope's ``DIFile``;
* PTX: ``.loc file line column`` (with ``inlined_at file line column`` for an
  inlined helper), in force until the next ``.loc``.  Inside an inline-asm
  block (Triton writes its loads and stores as inline asm) the LLVM of Triton
  3.8 and 3.9 (not 3.6) writes a ``.loc`` before every line of the asm,
  numbered on from the block's own line: a vector load of four lines claims
  the three Python lines after its own.  Only the block's first ``.loc`` is true;
  :func:`without_inline_asm_locs` removes the others;
* SASS: ``nvdisasm -gi`` prints ``//## File "...", line N inlined at ...``
  before the instructions of that line.

Each parser returns ``[(stage_line, ((file, line), ...)), ...]`` with 1-based
line numbers of the stage text; a line that came through an inlined helper
names the helper's line and every call site up to the kernel, so that asking
for the call site finds the helper's code too.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "LineMap",
    "Loc",
    "add_call_sites",
    "llvm_call_sites",
    "llvm_line_map",
    "mlir_line_map",
    "ptx_line_map",
    "sass_line_map",
    "without_inline_asm_locs",
]

Loc = tuple[str, int]
LineMap = list[tuple[int, tuple[Loc, ...]]]


def _ordered(locs) -> tuple[Loc, ...]:
    return tuple(sorted({loc for loc in locs if loc[1] > 0}))


# ------------------------------------------------------------------------- MLIR

_MLIR_ALIAS = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$")
_MLIR_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):\d+')
_MLIR_REF = re.compile(r"#loc\d*")
_MLIR_LOC_START = re.compile(r"\bloc\(")


def _balanced(text: str, start: int) -> str:
    """The text inside the parenthesis that opens at ``text[start - 1]``."""
    depth, i, quoted = 1, start, False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return text[start:]


def mlir_line_map(text: str) -> LineMap:
    """Source lines of each operation of a TTIR or TTGIR module."""
    lines = text.splitlines()
    aliases = {}
    for line in lines:
        if m := _MLIR_ALIAS.match(line):
            aliases[m.group(1)] = m.group(2)
    resolved: dict[str, frozenset[Loc]] = {}

    def resolve(expr: str, seen: frozenset[str] = frozenset()) -> set[Loc]:
        out = {(os.path.normpath(f), int(n)) for f, n in _MLIR_FILE_LOC.findall(expr)}
        for ref in _MLIR_REF.findall(expr):
            if ref in seen or ref not in aliases:
                continue
            if ref not in resolved:
                resolved[ref] = frozenset(resolve(aliases[ref], seen | {ref}))
            out |= resolved[ref]
        return out

    result: LineMap = []
    for number, line in enumerate(lines, 1):
        if line.startswith("#loc"):
            continue
        locs: set[Loc] = set()
        for m in _MLIR_LOC_START.finditer(line):
            locs |= resolve(_balanced(line, m.end()))
        if loc := _ordered(locs):
            result.append((number, loc))
    return result


# --------------------------------------------------------------------- LLVM IR

_LLVM_META = re.compile(r"^!(\d+) = (?:distinct )?!(\w+)\((.*)\)\s*$")
_LLVM_DBG = re.compile(r"!dbg !(\d+)")


def _field(body: str, name: str) -> str | None:
    m = re.search(rf"\b{name}: (!\d+|\d+|\"(?:[^\"\\]|\\.)*\")", body)
    return m.group(1) if m else None


class _LLVMDebug:
    """The debug metadata of an LLVM IR module: ``!N`` nodes and what they locate."""

    def __init__(self, text: str) -> None:
        self.nodes: dict[str, tuple[str, str]] = {}
        for line in text.splitlines():
            if m := _LLVM_META.match(line):
                self.nodes["!" + m.group(1)] = (m.group(2), m.group(3))

    def file_of(self, ref: str | None, depth: int = 0) -> str | None:
        if ref is None or ref not in self.nodes or depth > 32:
            return None
        kind, body = self.nodes[ref]
        if kind == "DIFile":
            name = (_field(body, "filename") or '""')[1:-1]
            directory = (_field(body, "directory") or '""')[1:-1]
            return os.path.normpath(os.path.join(directory, name))
        return self.file_of(_field(body, "file"), depth + 1) or self.file_of(
            _field(body, "scope"), depth + 1
        )

    def own(self, ref: str) -> Loc | None:
        """The line a DILocation or DISubprogram names itself, without call sites."""
        if ref not in self.nodes:
            return None
        kind, body = self.nodes[ref]
        if kind not in ("DILocation", "DISubprogram"):
            return None
        line = _field(body, "line")
        path = self.file_of(ref if kind == "DISubprogram" else _field(body, "scope"))
        return (path, int(line)) if path and line else None

    def locs(self, ref: str, depth: int = 0) -> set[Loc]:
        """The line ``ref`` names and every line it was inlined at."""
        if ref not in self.nodes or depth > 64:
            return set()
        out = {loc} if (loc := self.own(ref)) else set()
        if inlined := _field(self.nodes[ref][1], "inlinedAt"):
            out |= self.locs(inlined, depth + 1)
        return out


def llvm_line_map(text: str) -> LineMap:
    """Source lines of each instruction of an LLVM IR module (``!dbg`` records)."""
    debug = _LLVMDebug(text)
    result: LineMap = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("!") or line.lstrip().startswith("#dbg_"):
            continue
        if (m := _LLVM_DBG.search(line)) and (loc := _ordered(debug.locs("!" + m.group(1)))):
            result.append((number, loc))
    return result


def llvm_call_sites(text: str) -> dict[Loc, set[Loc]]:
    """For each line of an inlined helper, the lines it was inlined at (``inlinedAt``)."""
    debug = _LLVMDebug(text)
    sites: dict[Loc, set[Loc]] = {}
    for ref, (kind, body) in debug.nodes.items():
        inlined = _field(body, "inlinedAt")
        if kind == "DILocation" and inlined and (own := debug.own(ref)):
            sites.setdefault(own, set()).update(debug.locs(inlined) - {own})
    return sites


def add_call_sites(line_map: LineMap, sites: dict[Loc, set[Loc]]) -> LineMap:
    """Give a line that names only a helper's line the helper's call sites too.

    Triton 3.6 writes no ``inlined_at`` into PTX, so its PTX and SASS name an
    inlined helper's line alone; the LLVM IR still records where it was inlined.
    A helper called from several lines gets all of them.
    """
    out: LineMap = []
    for number, locs in line_map:
        if len(locs) == 1 and locs[0] in sites:
            locs = _ordered(set(locs) | sites[locs[0]])
        out.append((number, locs))
    return out


# ------------------------------------------------------------------------- PTX

_PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
_PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+(.*)$")
_PTX_INLINED = re.compile(r"inlined_at\s+(\d+)\s+(\d+)\s+\d+")


def _ptx_is_instruction(stripped: str) -> bool:
    return (
        bool(stripped)
        and not stripped.startswith((".", "//", "{", "}", "(", ")", "$"))
        and not stripped.endswith(":")
    )


_PTX_ASM_BEGIN = "// begin inline asm"
_PTX_ASM_END = "// end inline asm"


def _numbered_asm_locs(lines: list[str]) -> set[int]:
    """Indices of the ``.loc`` lines after the first inside each inline-asm block."""
    out, inside, seen = set(), False, False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped == _PTX_ASM_BEGIN:
            inside, seen = True, False
        elif stripped == _PTX_ASM_END:
            inside = False
        elif inside and _PTX_LOC.match(line):
            if seen:
                out.add(i)
            seen = True
    return out


def without_inline_asm_locs(text: str) -> str:
    """The PTX without the ``.loc`` lines after the first inside each inline-asm block.

    LLVM numbers the lines of an inline-asm block on from the block's own
    ``.loc``, so ``ptxas`` would give the instructions of a four-line vector
    load to the three Python lines after it.  Line information does not change
    the code ``ptxas`` makes, so this text assembles to the same instructions
    with the right source lines.  Returns ``text`` itself when there is nothing
    to remove.
    """
    lines = text.splitlines(keepends=True)
    drop = _numbered_asm_locs(lines)
    if not drop:
        return text
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def ptx_line_map(text: str) -> LineMap:
    """Source lines of each PTX instruction: the ``.loc`` in force above it.

    Inside an inline-asm block only the block's first ``.loc`` counts (see
    :func:`without_inline_asm_locs`).
    """
    lines = text.splitlines()
    files = {}
    for line in lines:
        if m := _PTX_FILE.match(line):
            files[m.group(1)] = os.path.normpath(m.group(2))
    numbered = _numbered_asm_locs(lines)
    result: LineMap = []
    current: tuple[Loc, ...] = ()
    for number, line in enumerate(lines, 1):
        if number - 1 in numbered:
            continue
        if m := _PTX_LOC.match(line):
            locs = set()
            if m.group(1) in files:
                locs.add((files[m.group(1)], int(m.group(2))))
            for f, n in _PTX_INLINED.findall(m.group(3)):
                if f in files:
                    locs.add((files[f], int(n)))
            current = _ordered(locs)
            continue
        if line.startswith("}") or line.lstrip().startswith((".entry", ".visible", ".func")):
            current = ()
            continue
        if current and _ptx_is_instruction(line.strip()):
            result.append((number, current))
    return result


# ------------------------------------------------------------------------ SASS

_SASS_INFO = re.compile(r'^\s*//## File "([^"]*)", line (\d+)(.*)$')
_SASS_INLINED = re.compile(r'inlined at "([^"]*)", line (\d+)')
SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+\S")


def sass_line_map(nvdisasm_text: str) -> tuple[str, LineMap]:
    """Split ``nvdisasm -gi`` output into the SASS text and its source lines.

    Returns
    -------
    sass : str
        The disassembly without the ``//##`` line-information comments.
    line_map : LineMap
        Source lines of each instruction of ``sass``.
    """
    kept: list[str] = []
    result: LineMap = []
    current: tuple[Loc, ...] = ()
    after_info = False
    for line in nvdisasm_text.splitlines():
        if m := _SASS_INFO.match(line):
            # An inlined helper's line comes first, then one comment per caller.
            locs = {(os.path.normpath(m.group(1)), int(m.group(2)))}
            locs |= {(os.path.normpath(f), int(n)) for f, n in _SASS_INLINED.findall(m.group(3))}
            current = _ordered(locs | set(current) if after_info else locs)
            after_info = True
            continue
        after_info = False
        if line.startswith("//----"):
            current = ()
        kept.append(line)
        if current and SASS_INSTRUCTION.match(line):
            result.append((len(kept), current))
    return "\n".join(kept).strip("\n") + "\n", _shift(result, kept)


def _shift(result: LineMap, kept: list[str]) -> LineMap:
    """Line numbers after the leading blank lines that ``strip`` removes."""
    lead = 0
    while lead < len(kept) and not kept[lead].strip():
        lead += 1
    return [(n - lead, locs) for n, locs in result]
