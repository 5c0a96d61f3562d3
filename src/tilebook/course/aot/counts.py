"""Counting instructions in compiled kernels, and a narrow table of the counts."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kernel import CompiledKernel

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "InstructionTable",
    "count_instructions",
    "count_opcodes",
    "instruction_table",
    "opcodes",
]

#: What a lesson usually asks of a SASS listing: tensor-core instructions of
#: Ampere (``HMMA``) and Hopper (``HGMMA``), asynchronous copies into shared
#: memory (``LDGSTS``, and ``UTMALDG`` for the TMA engine), special-function
#: calls (``MUFU``: exp2, reciprocal, ...) and 16-byte global loads.
DEFAULT_INSTRUCTIONS = ("HMMA", "HGMMA", "LDGSTS", "UTMALDG", "MUFU", "LDG.E.128")

_SASS_OP = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_.]*)")
_PTX_PRED = re.compile(r"^@!?%\w+\s+")
_MLIR_OP = re.compile(r"^\s*(?:%[\w#:, %]+ = )?\"?([a-z_]+\.[\w.]+)")


def count_instructions(text: str, pattern: str) -> int:
    """How many lines of ``text`` the regular expression ``pattern`` finds something in."""
    rx = re.compile(pattern)
    return sum(1 for line in text.splitlines() if rx.search(line))


def opcodes(text: str, stage: str = "sass") -> list[str]:
    """The opcode of every instruction of a stage's text, in order.

    Parameters
    ----------
    text : str
        The text of one stage (:meth:`CompiledKernel.stage`).
    stage : {"sass", "ptx", "ttir", "ttgir"}
        Which stage it is: SASS opcodes look like ``LDG.E.128``, PTX ones like
        ``ld.global.v4.b32`` and MLIR operations like ``tt.load``.  Predicates
        (``@P0``, ``@%p1``) are not part of the opcode.
    """
    ops = []
    if stage == "sass":
        for line in text.splitlines():
            if m := _SASS_OP.match(line):
                ops.append(m.group(1))
    elif stage == "ptx":
        from .lines import _ptx_is_instruction

        for line in text.splitlines():
            s = line.strip()
            if _ptx_is_instruction(s):
                s = _PTX_PRED.sub("", s)
                ops.append(re.split(r"[\s;]", s, maxsplit=1)[0])
    elif stage in ("ttir", "ttgir"):
        for line in text.splitlines():
            if not line.startswith("#") and (m := _MLIR_OP.match(line)):
                ops.append(m.group(1))
    else:
        raise ValueError(
            f"opcodes are read from 'sass', 'ptx', 'ttir' or 'ttgir', not {stage!r}; "
            "count lines of other stages with CompiledKernel.count(regex, stage)"
        )
    return ops


def _matcher(name: str) -> re.Pattern[str]:
    # A name matches an opcode from its start up to a dot or the end, so HMMA
    # counts HMMA.16816.F32.BF16 but HGMMA is not HMMA and LDG is not LDGSTS.
    try:
        return re.compile(rf"(?:{name})(?=\.|$)")
    except re.error as exc:
        raise ValueError(
            f"instruction name {name!r} is not a valid regular expression: {exc}"
        ) from exc


def count_opcodes(text: str, names: Iterable[str], stage: str = "sass") -> dict[str, int]:
    """How many instructions of ``text`` each name in ``names`` matches, by whole words.

    A name is a regular expression matched against an opcode's start and ending
    at a dot or the opcode's end: ``"HMMA"`` counts ``HMMA.16816.F32.BF16`` and not
    ``HGMMA``; ``"LDG"`` counts ``LDG.E.128`` and not ``LDGSTS``;
    ``"LDG.E.128"`` counts ``LDG.E.128`` and ``LDG.E.128.CONSTANT``.
    """
    ops = opcodes(text, stage)
    matchers = {n: _matcher(n) for n in names}
    return {n: sum(1 for op in ops if rx.match(op)) for n, rx in matchers.items()}


@dataclass
class InstructionTable:
    """Instruction counts and resources of several compiled kernels, printable in 88 columns.

    Attributes
    ----------
    names : tuple of str
        The instructions counted, in column order.
    stage : str
        The stage they were counted in.
    counts : dict
        ``counts[label][name]``: how many instructions ``name`` matched.
    resources : dict
        ``resources[label]``: ``registers``, ``spill_bytes`` (spill stores) and
        ``shared_bytes`` of that kernel.
    width : int
        Widest line :meth:`text` writes; more columns are split into blocks.
    """

    names: tuple[str, ...]
    stage: str
    counts: dict[str, dict[str, int]]
    resources: dict[str, dict[str, int]]
    width: int = 88
    _order: list[str] = field(default_factory=list, repr=False)

    def __getitem__(self, label: str) -> dict[str, int]:
        """Counts and resources of the kernel called ``label``, in one dict."""
        return {**self.counts[label], **self.resources[label]}

    def text(self) -> str:
        """The table as lines no wider than :attr:`width` (column blocks if need be)."""
        labels = self._order or list(self.counts)
        head = max([len("kernel"), *map(len, labels)])
        res_cols = [("regs", "registers"), ("spill B", "spill_bytes"), ("smem KiB", "shared_bytes")]

        def cell(label: str, key: str) -> str:
            value = self.resources[label][key]
            if key == "shared_bytes":
                kib = value / 1024
                return f"{kib:.0f}" if kib == int(kib) else f"{kib:.1f}"
            return str(value)

        columns: list[tuple[str, dict[str, str]]] = [
            (n, {lb: str(self.counts[lb][n]) for lb in labels}) for n in self.names
        ]
        columns += [(title, {lb: cell(lb, key) for lb in labels}) for title, key in res_cols]
        widths = [max(len(t), *(len(v) for v in vals.values())) for t, vals in columns]
        blocks: list[list[int]] = [[]]
        used = head
        for i, w in enumerate(widths):
            if blocks[-1] and used + 2 + w > self.width:
                blocks.append([])
                used = head
            blocks[-1].append(i)
            used += 2 + w
        out = []
        for block in blocks:
            if out:
                out.append("")
            out.append(
                f"{'kernel':<{head}}" + "".join(f"  {columns[i][0]:>{widths[i]}}" for i in block)
            )
            for lb in labels:
                out.append(
                    f"{lb:<{head}}" + "".join(f"  {columns[i][1][lb]:>{widths[i]}}" for i in block)
                )
        return "\n".join(out)

    def __str__(self) -> str:
        return self.text()


def instruction_table(
    kernels: Mapping[str, CompiledKernel] | Sequence[CompiledKernel],
    names: Sequence[str] | None = None,
    *,
    stage: str = "sass",
    width: int = 88,
) -> InstructionTable:
    """Count instructions in several compiled kernels, for ``print`` or for checks.

    Parameters
    ----------
    kernels : mapping of label to CompiledKernel, or a sequence of them
        What :func:`compile_many` returns.  A sequence is labelled
        ``"<name> sm_<arch>"``.
    names : sequence of str, optional
        Instructions to count, matched by whole words (see :func:`count_opcodes`).
        Default: :data:`DEFAULT_INSTRUCTIONS` for SASS; required for other stages.
    stage : {"sass", "ptx", "ttir", "ttgir"}
        Where to count.
    width : int
        Widest line of the printed table.

    Returns
    -------
    InstructionTable
        ``print(table)`` shows one row per kernel: the counts, then registers per
        thread, bytes of spill stores and KiB of shared memory.
        ``table["sm_80"]["HMMA"]`` reads one figure.

    Examples
    --------
    >>> ks = compile_many({"sm_80": {"arch": 80}, "sm_90": {"arch": 90}},
    ...                   kernel=matmul_kernel, signature=sig, constexprs=consts)
    >>> print(instruction_table(ks))  # doctest: +SKIP
    """
    if isinstance(kernels, Mapping):
        items = list(kernels.items())
    else:
        items = []
        for k in kernels:
            label = f"{k.name} sm_{k.arch}"
            while label in dict(items):
                label += "'"
            items.append((label, k))
    if not items:
        raise ValueError("instruction_table needs at least one compiled kernel")
    if names is None:
        if stage != "sass":
            raise ValueError(f"name the instructions to count in the {stage!r} stage")
        names = DEFAULT_INSTRUCTIONS
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    counts, resources = {}, {}
    for label, k in items:
        counts[label] = count_opcodes(k.stage(stage), names, stage)
        resources[label] = {
            "registers": k.registers,
            "spill_bytes": k.spill_stores_bytes,
            "shared_bytes": k.shared_bytes,
        }
    return InstructionTable(names, stage, counts, resources, width, [lb for lb, _ in items])
