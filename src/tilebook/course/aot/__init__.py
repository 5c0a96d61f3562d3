"""Ahead-of-time compilation: every stage of a kernel for any GPU, on any machine.

Triton can compile for a GPU that the machine does not have: it only needs the
kernel's argument types and a target (``sm_75`` for Turing, ``sm_80`` for
Ampere, ``sm_90`` for Hopper).  :func:`compile_kernel` returns a
:class:`CompiledKernel` with the text of every stage (TTIR, TTGIR, LLVM IR,
PTX, SASS), which lines of each stage came from which line of Python, and the
resources that ``ptxas`` allocated (registers, spills) beside Triton's shared
memory and warps::

    k = compile_kernel(add_kernel, {"x_ptr": "*fp32", ...}, {"BLOCK": 1024}, arch=80)
    print(k.stage("ptx"))
    print(k.trace("tl.load(x_ptr"))          # one line of Python, stage by stage
    k.lines_for("tl.load(x_ptr", "sass")     # the SASS lines it became

:func:`compile_many` compiles several kernels or targets at once (in parallel
child processes on a CPU) and :func:`instruction_table` counts instructions
in them.  In CPU mode, where kernels are interpreter wrappers, compiling runs
in a child process with ``TILEBOOK_MODE=aot``; a kernel defined in a lesson
script is sent there as source, with its helpers and the constants they read.
"""

from ...arch import TARGETS, parse_arch
from .compiler import AotError, ptxas_for
from .counts import (
    DEFAULT_INSTRUCTIONS,
    InstructionTable,
    count_instructions,
    count_opcodes,
    instruction_table,
    opcodes,
)
from .jobs import compile_kernel, compile_many
from .kernel import STAGES, CompiledKernel, SourceLine, StageLine

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "STAGES",
    "TARGETS",
    "AotError",
    "CompiledKernel",
    "InstructionTable",
    "SourceLine",
    "StageLine",
    "compile_kernel",
    "compile_many",
    "count_instructions",
    "count_opcodes",
    "instruction_table",
    "opcodes",
    "parse_arch",
    "ptxas_for",
]
