"""Compile one kernel in this process with Triton and read everything it produced.

This runs where kernels are real ``JITFunction`` objects: on a GPU machine, or
in a child process with ``TILEBOOK_MODE=aot`` (see :mod:`tilebook.course.aot.jobs`).
It needs no GPU: Triton compiles for the target it is given.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import linecache
import os
import re
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ...arch import TARGETS, parse_arch
from . import lines

__all__ = ["AotError", "compile_here", "ptxas_for"]


class AotError(RuntimeError):
    """An ahead-of-time compile failed; the message carries Triton's or ptxas's own text."""


def ptxas_for(arch: int | str) -> str:
    """The ``ptxas`` that Triton runs when it compiles for ``arch``.

    Triton 3.6-3.8 use their newest bundled ``ptxas`` for ``sm_100`` and up and
    the other one below; Triton 3.9 already for ``sm_90``.  Asking Triton's own
    ``get_ptxas`` keeps the report in step with the binary Triton builds.

    Parameters
    ----------
    arch : int or str
        Compute capability (``90``) or target name (``"sm_90a"``).

    Returns
    -------
    str
        Path of the executable (``TRITON_PTXAS_PATH`` and friends respected).
    """
    arch = parse_arch(arch)
    import triton

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        tool = get_ptxas(arch)
    except ImportError:  # a Triton without get_ptxas: the one knob there is
        tool = triton.knobs.nvidia.ptxas
    return str(tool.path)


def _tool(name: str) -> str:
    import triton

    return str(getattr(triton.knobs.nvidia, name).path)


# ------------------------------------------------------------------ arguments

_SCALARS = [
    *("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"),
    *("fp8e4nv", "fp8e4b8", "fp8e4b15", "fp8e5", "fp8e5b16", "fp16", "bf16", "fp32", "fp64"),
]
_TYPE = re.compile(rf"(\*k?)?({'|'.join(_SCALARS)})|tensordesc<.+>|nvTmaDesc|constexpr")


def check_arguments(
    name: str,
    arg_names: list[str],
    signature: dict[str, str],
    constexprs: dict[str, Any],
    divisible_by_16: list[str],
) -> None:
    """Raise a clear error when the signature does not fit the kernel's arguments."""
    unknown = [a for a in [*signature, *constexprs] if a not in arg_names]
    if unknown:
        raise ValueError(
            f"{name} has no argument {', '.join(map(repr, unknown))}; "
            f"its arguments are ({', '.join(arg_names)})"
        )
    missing = [a for a in arg_names if a not in signature and a not in constexprs]
    if missing:
        raise ValueError(
            f"{name}: give a type in `signature` or a value in `constexprs` for "
            f"{', '.join(map(repr, missing))}"
        )
    for arg, ty in signature.items():
        if not isinstance(ty, str) or not _TYPE.fullmatch(ty.strip()):
            raise ValueError(
                f"{name}: signature[{arg!r}] = {ty!r} is not a Triton type; use e.g. "
                f"'*fp32' (pointer), 'i32', 'fp32', 'tensordesc<bf16[64, 64]>' "
                f"(scalars: {', '.join(_SCALARS)})"
            )
    odd = [a for a in divisible_by_16 if a not in signature or signature[a] == "constexpr"]
    if odd:
        raise ValueError(
            f"{name}: divisible_by_16 names {', '.join(map(repr, odd))}, which are not "
            "runtime arguments in `signature`"
        )


def _check_options(options: dict[str, Any]) -> None:
    """Triton drops option names it does not know; a misspelt one must not vanish."""
    from triton.backends.nvidia.compiler import CUDAOptions

    known = set(CUDAOptions.__dataclass_fields__) - {"arch"}
    doubled = [o for o in options if o in ("num_warps", "num_stages")]
    if doubled:
        raise ValueError(f"give {', '.join(doubled)} as an argument of its own, not in options")
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"Triton has no compile option {', '.join(map(repr, unknown))}; "
            f"its options are {', '.join(sorted(known))}"
        )


# ------------------------------------------------------------------ the cubin

_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04
_EIFMT_HVAL = 0x03
_EIFMT_NVAL = 0x01


def cubin_registers(cubin: bytes, kernel: str) -> int | None:
    """Registers per thread of ``kernel`` as the cubin records them (``EIATTR_REGCOUNT``).

    This is the figure the driver reads when it loads the binary, so it is
    what a launch gets.  ``None`` when the ELF does not have the record.
    """
    try:
        (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)
        ]
        names_at = sections[shstrndx][4]

        def name(offset: int) -> str:
            start = names_at + offset
            return cubin[start : cubin.index(b"\0", start)].decode()

        by_name = {name(s[0]): s for s in sections}
        text = by_name.get(f".text.{kernel}")
        info = by_name.get(".nv.info")
        if text is None or info is None:
            return None
        symbol = text[7]  # sh_info of the code section: the kernel's symbol index
        data = cubin[info[4] : info[4] + info[5]]
        i = 0
        while i + 2 <= len(data):
            fmt, attr = data[i], data[i + 1]
            if fmt == _EIFMT_SVAL:
                (size,) = struct.unpack_from("<H", data, i + 2)
                if attr == _EIATTR_REGCOUNT and size == 8:
                    sym, value = struct.unpack_from("<II", data, i + 4)
                    if sym == symbol:
                        return int(value)
                i += 4 + size
            elif fmt == _EIFMT_NVAL:
                i += 2
            else:
                i += 4
    except (struct.error, ValueError, IndexError):
        return None
    return None


# ------------------------------------------------------------------ ptxas -v

_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_log(ptx: str, arch: int, options: dict[str, Any]) -> str:
    """The ``ptxas -v`` report of the PTX, from the very ``ptxas`` call Triton makes.

    Triton prints that report only when ``knobs.nvidia.dump_ptxas_log`` is on, and
    not at all when the binary came from its cache, so the PTX goes through the
    backend's ``make_cubin`` once more with the knob on: same executable, same
    flags.  A Triton without the knob gets ``ptxas -v`` from :func:`ptxas_for`.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    nvidia = triton.knobs.nvidia
    if hasattr(nvidia, "dump_ptxas_log") and hasattr(nvidia, "scope"):
        backend = make_backend(GPUTarget("cuda", arch, 32))
        opts = backend.parse_options(dict(options))
        out = io.StringIO()
        with nvidia.scope(), contextlib.redirect_stdout(out):
            nvidia.dump_ptxas_log = True
            backend.make_cubin(ptx, {}, opts, arch)
        return out.getvalue()
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "k.ptx")
        src.write_text(ptx)
        proc = subprocess.run(
            [ptxas_for(arch), "-v", "-lineinfo", f"--gpu-name={gpu}", str(src), "-o", f"{src}.o"],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise AotError(f"ptxas rejected the PTX for sm_{arch}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


# ------------------------------------------------------------------------ SASS


def _disassemble(cubin: bytes) -> tuple[str, lines.LineMap, str]:
    """SASS with source lines (``nvdisasm -gi``), or without (``cuobjdump``) as a fallback."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.cubin")
        path.write_bytes(cubin)
        errors = []
        for tool, flags in (("nvdisasm", ["-c", "-gi"]), ("cuobjdump", ["--dump-sass"])):
            try:
                proc = subprocess.run(
                    [_tool(tool), *flags, str(path)], capture_output=True, text=True, check=False
                )
            except OSError as exc:
                errors.append(f"{tool}: {exc}")
                continue
            if proc.returncode == 0 and proc.stdout.strip():
                if tool == "nvdisasm":
                    sass, line_map = lines.sass_line_map(proc.stdout)
                    return sass, line_map, tool
                return proc.stdout, [], tool
            errors.append(f"{tool} (exit {proc.returncode}): {proc.stderr.strip()}")
    raise AotError("could not disassemble the cubin:\n" + "\n".join(errors))


def _code(sass: str) -> list[str]:
    return [line.strip() for line in sass.splitlines() if lines.SASS_INSTRUCTION.match(line)]


def _sass_lines_without_asm_locs(
    ptx: str, sass: str, arch: int, options: dict[str, Any]
) -> lines.LineMap | None:
    """The SASS line map when the PTX numbers the lines of its inline asm.

    ``ptxas`` reads its line table from the PTX's ``.loc`` lines, so where
    LLVM numbered the lines of an inline-asm block on from the block's own
    line (see :func:`tilebook.course.aot.lines.without_inline_asm_locs`), the SASS of
    a vector load names the Python lines after the load.  The PTX without
    those ``.loc`` lines goes through the backend's ``make_cubin`` (same
    ``ptxas``, same flags); its line table is used when its instructions are
    Triton's, one for one.  ``None`` when there was nothing to correct or the
    code differs.
    """
    clean = lines.without_inline_asm_locs(ptx)
    if clean == ptx:
        return None
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", arch, 32))
    opts = backend.parse_options(dict(options))
    with contextlib.redirect_stdout(io.StringIO()):
        cubin = backend.make_cubin(clean, {}, opts, arch)
    text, line_map, tool = _disassemble(cubin)
    if tool != "nvdisasm" or _code(text) != _code(sass):
        return None
    return line_map


# ------------------------------------------------------------------- compiling


@functools.cache
def _keyed_source():
    """Triton's ASTSource with the kernel's file in its cache key.

    Triton keys a compile on the kernel's text and first line number, not on
    its file, so the same kernel at the same line of another file (a lesson's
    copy of a package kernel, a test's temporary script) would come back from
    the cache with the other file's name in every location record.
    """
    from triton.compiler import ASTSource

    class FileKeyedSource(ASTSource):
        def hash(self) -> str:
            where = self.fn.fn.__code__.co_filename
            return hashlib.sha256(f"{super().hash()}-{where}".encode()).hexdigest()

    return FileKeyedSource


def _source_of(fn) -> tuple[str, int, str]:
    """File, first line and text of the Python function behind a JITFunction."""
    py = fn.fn
    path = os.path.normpath(py.__code__.co_filename)
    try:
        src, first = inspect.getsourcelines(py)
    except (OSError, TypeError):
        return path, py.__code__.co_firstlineno, ""
    return path, first, "".join(src)


def compile_here(
    fn,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    arch: int,
    num_warps: int,
    num_stages: int,
    divisible_by_16: list[str],
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile the ``JITFunction`` ``fn`` for ``sm_<arch>``; the fields of a CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget

    name = fn.__name__
    check_arguments(name, list(fn.arg_names), signature, constexprs, divisible_by_16)
    full_sig = {a: signature.get(a, "constexpr") for a in fn.arg_names}
    # Pointers and sizes that a launch would find divisible by 16 get the hint
    # the launch gives them; without it the loads are not vectorised.
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in divisible_by_16}
    _check_options(options or {})
    src = _keyed_source()(fn=fn, signature=full_sig, constexprs=dict(constexprs), attrs=attrs)
    opts = {"num_warps": num_warps, "num_stages": num_stages, **(options or {})}
    printed = io.StringIO()  # on a ptxas failure Triton prints the whole PTX
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.redirect_stdout(printed))
            compilation = triton.knobs.compilation
            if hasattr(compilation, "store_binary_only") and hasattr(compilation, "scope"):
                stack.enter_context(compilation.scope())
                compilation.store_binary_only = False  # a cache hit must bring every stage
            k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    except Exception as exc:  # Triton's errors have no common base class
        raise AotError(
            f"Triton could not compile {name} for sm_{arch} ({TARGETS[arch][0]}):\n"
            f"{type(exc).__name__}: {exc}"
        ) from exc

    meta = k.metadata
    shared = int(meta.shared)
    limit = TARGETS[arch][1]
    if shared > limit:
        raise AotError(
            f"{name} needs {shared} bytes of shared memory per program; sm_{arch} "
            f"({TARGETS[arch][0]}) allows at most {limit}, so a launch would fail. "
            "Use fewer num_stages or smaller blocks."
        )

    absent = [s for s in ("ttir", "ttgir", "llir", "ptx", "cubin") if s not in k.asm]
    if absent:
        raise AotError(f"Triton's compile of {name} kept no {', '.join(absent)}")
    stages = {s: k.asm[s] for s in ("ttir", "ttgir", "llir", "ptx")}
    line_map = {
        "ttir": lines.mlir_line_map(stages["ttir"]),
        "ttgir": lines.mlir_line_map(stages["ttgir"]),
        "llir": lines.llvm_line_map(stages["llir"]),
        "ptx": lines.ptx_line_map(stages["ptx"]),
    }
    stages["sass"], line_map["sass"], disassembler = _disassemble(k.asm["cubin"])
    fixed = _sass_lines_without_asm_locs(stages["ptx"], stages["sass"], arch, opts)
    if fixed is not None:
        line_map["sass"] = fixed
    sites = lines.llvm_call_sites(stages["llir"])
    for stage in ("ptx", "sass"):
        line_map[stage] = lines.add_call_sites(line_map[stage], sites)

    log = _ptxas_log(stages["ptx"], arch, opts)
    m = _REGISTERS.search(log)
    if m is None:
        raise AotError(f"no register count in the ptxas report for {name}, sm_{arch}:\n{log}")
    registers = int(m.group(1))
    in_cubin = cubin_registers(k.asm["cubin"], meta.name)
    if in_cubin is not None and in_cubin != registers:
        raise AotError(
            f"ptxas reports {registers} registers for {name} but the compiled cubin "
            f"records {in_cubin}: the report is not of the binary Triton built.\n{log}"
        )
    spills = _SPILLS.search(log)
    if spills is None:
        raise AotError(f"no spill figures in the ptxas report for {name}, sm_{arch}:\n{log}")

    kernel_file, kernel_line, kernel_source = _source_of(fn)
    wanted = {loc for stage in line_map.values() for _, locs in stage for loc in locs}
    sources: dict[str, list[tuple[int, str]]] = {}
    for path, number in sorted(wanted):
        text = linecache.getline(path, number).rstrip("\n")
        sources.setdefault(path, []).append((number, text))

    return {
        "name": name,
        "arch": arch,
        "stages": stages,
        "num_warps": int(meta.num_warps),
        "num_stages": int(meta.num_stages),
        "shared_bytes": shared,
        "registers": registers,
        "spill_stores_bytes": int(spills.group(1)),
        "spill_loads_bytes": int(spills.group(2)),
        "ptxas_log": log,
        "ptxas": ptxas_for(arch),
        "line_map": line_map,
        "sources": sources,
        "kernel_file": kernel_file,
        "kernel_line": kernel_line,
        "kernel_source": kernel_source,
        "extra": {
            "triton_version": triton.__version__,
            "disassembler": disassembler,
            "options": {k: v for k, v in opts.items() if _plain(v)},
        },
    }


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
