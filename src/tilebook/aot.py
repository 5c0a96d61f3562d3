"""Ahead-of-time compilation: a kernel's TTIR, TTGIR, LLVM IR, PTX and SASS without a GPU.

Triton can compile for a GPU that the machine does not have: it only needs the
kernel's signature and a target (``GPUTarget("cuda", 90, 32)`` for an H100).
That cannot happen inside a process where ``TRITON_INTERPRET=1`` (there the
kernel is an interpreted function), so from a CPU-mode process
:func:`compile_kernel` runs the compiler in a child process with
``TILEBOOK_MODE=aot`` and brings the text back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import runtime

__all__ = ["CompiledKernel", "compile_kernel", "count_instructions"]

STAGES = ("ttir", "ttgir", "llir", "ptx", "sass")


@dataclass
class CompiledKernel:
    """The text of every compiler stage plus the resource figures of one compiled kernel."""

    name: str
    arch: int
    stages: dict[str, str]
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int | None = None
    spill_stores_bytes: int | None = None
    spill_loads_bytes: int | None = None
    ptxas_log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def count(self, pattern: str, stage: str = "sass") -> int:
        """How many lines of ``stage`` match the regular expression ``pattern``."""
        return count_instructions(self.stages.get(stage, ""), pattern)


def count_instructions(text: str, pattern: str) -> int:
    rx = re.compile(pattern)
    return sum(1 for line in text.splitlines() if rx.search(line))


def _nvidia_bin(tool: str) -> str | None:
    """Where Triton itself finds ``ptxas`` / ``cuobjdump``: its knobs (which honour
    ``TRITON_PTXAS_PATH`` and friends), its bundled copy, then the CUDA toolkit."""
    import triton

    try:
        path = getattr(triton.knobs.nvidia, tool).path
        if path and Path(path).exists():
            return str(path)
    except Exception:  # noqa: BLE001, S110  (a Triton without this knob)
        pass
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    if bundled.exists():
        return str(bundled)
    for candidate in (shutil.which(tool), f"/usr/local/cuda/bin/{tool}"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _ptxas_report(ptx: str, arch: int) -> tuple[dict[str, int], str]:
    """Registers and spills as ptxas reports them (``-v``) for this PTX."""
    ptxas = _nvidia_bin("ptxas")
    if ptxas is None:
        return {}, "ptxas not found"
    sm = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "k.ptx")
        src.write_text(ptx)
        proc = subprocess.run(
            [ptxas, "-v", f"--gpu-name={sm}", str(src), "-o", str(Path(tmp, "k.cubin"))],
            capture_output=True,
            text=True,
            check=False,
        )
    log = proc.stdout + proc.stderr
    out: dict[str, int] = {}
    if m := re.search(r"Used (\d+) registers", log):
        out["registers"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log):
        out["spill_stores_bytes"] = int(m.group(1))
        out["spill_loads_bytes"] = int(m.group(2))
    return out, log


def _sass(cubin: bytes) -> str:
    tool = _nvidia_bin("cuobjdump")
    if tool is None:
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.cubin")
        path.write_bytes(cubin)
        proc = subprocess.run(
            [tool, "--dump-sass", str(path)], capture_output=True, text=True, check=False
        )
    return proc.stdout if proc.returncode == 0 else ""


def _resolve(spec: str):
    """``"package.module:name"`` or ``"/path/file.py:name"`` to the kernel object."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(
            f"kernel spec must look like 'module:name' or 'file.py:name', got {spec!r}"
        )
    if target.endswith(".py"):
        import importlib.util

        mod_spec = importlib.util.spec_from_file_location("_tilebook_aot_kernel", target)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot import {target}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        import importlib

        module = importlib.import_module(target)
    return getattr(module, attr)


def _compile_here(
    spec: str,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    arch: int,
    num_warps: int,
    num_stages: int,
    divisible_by_16: list[str] | None = None,
) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    divisible_by_16 = list(divisible_by_16 or [])
    fn = _resolve(spec)
    while not isinstance(fn, JITFunction):  # an Autotuner or Heuristics wraps it
        if not hasattr(fn, "fn"):
            raise TypeError(f"{spec} is not a @triton.jit kernel")
        fn = fn.fn
    full_sig = dict(signature)
    for name in constexprs:
        full_sig.setdefault(name, "constexpr")
    # Pointers and sizes that the launcher would find divisible by 16 get the same
    # hint a real launch gives them; without it the loads are not vectorised.
    attrs = {}
    for name in divisible_by_16:
        attrs[(fn.arg_names.index(name),)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=full_sig, constexprs=dict(constexprs), attrs=attrs)
    warp = 32
    k = triton.compile(
        src,
        target=GPUTarget("cuda", arch, warp),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    stages = {s: k.asm[s] for s in ("ttir", "ttgir", "llir", "ptx") if s in k.asm}
    stages["sass"] = _sass(k.asm["cubin"]) if "cubin" in k.asm else ""
    resources, log = _ptxas_report(stages["ptx"], arch)
    return {
        "name": fn.__name__,
        "arch": arch,
        "stages": stages,
        "num_warps": k.metadata.num_warps,
        "num_stages": k.metadata.num_stages,
        "shared_bytes": int(k.metadata.shared),
        "ptxas_log": log,
        **resources,
    }


def compile_kernel(
    spec: str,
    signature: dict[str, str],
    constexprs: dict[str, Any] | None = None,
    *,
    arch: int = 90,
    num_warps: int = 4,
    num_stages: int = 3,
    divisible_by_16: list[str] | None = None,
    timeout: float = 300.0,
) -> CompiledKernel:
    """Compile a kernel for ``sm_<arch>`` without launching it, on any machine.

    Parameters
    ----------
    spec
        Where the kernel lives: ``"tilebook.ops.vector_add:add_kernel"`` or
        ``"path/to/file.py:my_kernel"``.
    signature
        Triton type of each runtime argument, e.g. ``{"x_ptr": "*fp32", "n": "i32"}``.
    constexprs
        Values of the ``tl.constexpr`` arguments.
    arch
        Compute capability: 80 for A100, 90 for H100/H200.
    divisible_by_16
        Arguments to treat as multiples of 16 (pointers of aligned tensors, sizes
        like 4096), as a real launch on such inputs would.  By default every
        pointer argument (type starting with ``*``).
    """
    constexprs = dict(constexprs or {})
    if not isinstance(arch, int) or arch < 70:
        raise ValueError(f"arch must be an int compute capability >= 70, got {arch!r}")
    if divisible_by_16 is None:
        divisible_by_16 = [n for n, t in signature.items() if t.startswith("*")]
    args = (spec, signature, constexprs, arch, num_warps, num_stages, divisible_by_16)
    if runtime.get_runtime().mode in ("gpu", "aot"):
        return CompiledKernel(**_compile_here(*args))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[runtime.MODE_ENV] = "aot"
    payload = json.dumps(args)
    code = (
        "import json, sys\n"
        "from tilebook.aot import _compile_here\n"
        "print(json.dumps(_compile_here(*json.loads(sys.stdin.read()))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=payload,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ahead-of-time compile of {spec} for sm_{arch} failed:\n{proc.stderr}")
    return CompiledKernel(**json.loads(proc.stdout.strip().splitlines()[-1]))
