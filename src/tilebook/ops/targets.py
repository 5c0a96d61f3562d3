"""The package's kernels as ahead-of-time compile jobs for a GPU this machine lacks.

A reader's GPU may be a Turing (sm_75: a T4), an Ampere (sm_80: an A100) or a
Hopper (sm_90: an H100 or H200) one.  Every op module offers ``compile_jobs(arch,
dtype=None)``: the jobs of the kernels it would launch on ``sm_<arch>``, with the
configurations it picks there, for a few shapes that reach each of its kernels
(short rows and long, chunked ones, say).  The jobs are
:func:`tilebook.course.aot.compile_many`'s, so that one call compiles them all::

    from tilebook.course.aot import compile_many
    from tilebook.ops.targets import all_jobs

    kernels = compile_many(all_jobs(80))          # label -> CompiledKernel
    [k for k in kernels.values() if k.spill_stores_bytes]

Most jobs are recorded: the op's ``torch.library`` body runs on ``"meta"`` tensors
under :func:`tilebook.ops.library.recording`, which turns each launch into a job
specialised as Triton would specialise it (:func:`launch_job`).  Kernels that read
through host-side tensor descriptors build their jobs from their ``compile_ahead``
signatures.  A kernel the package never launches on a target has no job there: the
Hopper matmul (TMA, wgmma) exists only for sm_90.  ``tests/test_targets.py`` compiles
every kernel for sm_75, sm_80 and sm_90 and checks that none spills registers beyond
the few it lists (flash attention's untuned tiles below sm_90, the matmul pointer
kernel on sm_75).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any

import torch

from . import library

__all__ = [
    "TARGET_ARCHS",
    "all_jobs",
    "default_dtype",
    "dtype_name",
    "kernel_spec",
    "launch_job",
    "meta_tensor",
    "recorded",
]

#: The architectures a reader's GPU is likely to have: Turing, Ampere and Hopper.
TARGET_ARCHS = (75, 80, 90)

_DTYPE_NAMES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float64: "fp64",
    torch.bool: "i1",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e5m2: "fp8e5",
}
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def default_dtype(arch: int) -> torch.dtype:
    """The 16-bit dtype a reader on ``sm_<arch>`` uses: bfloat16 from sm_80 on, float16
    before (Turing has no bfloat16 tensor cores)."""
    return torch.bfloat16 if arch >= 80 else torch.float16


def dtype_name(dtype: torch.dtype) -> str:
    """Triton's name of a torch dtype: ``"bf16"``, ``"fp16"``, ``"fp32"``, ``"i32"`` ..."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"no Triton pointer type for {dtype}") from None


def meta_tensor(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A contiguous tensor without storage: shapes, strides and dtype, for recording."""
    return torch.empty(shape, dtype=dtype, device="meta")


def _python_function(kernel: Any):
    from ..course.aot.shipping import python_function

    return python_function(kernel)


def kernel_spec(kernel: Any) -> str:
    """``"module:name"`` of a kernel defined at module level (the compiling child
    process imports it from there)."""
    fn = _python_function(kernel)
    return f"{fn.__module__}:{fn.__name__}"


def launch_job(kernel: Any, args: tuple, meta: dict, arch: int) -> dict[str, Any]:
    """The compile job of ``kernel[grid](*args, **meta)`` on ``sm_<arch>``.

    As Triton specialises a launch: tensors are pointers of their dtype (divisible
    by 16: meta tensors count from address 0); an integer equal to 1 is a constant,
    others ``i32`` (``i64`` past 32 bits), divisible by 16 when they are; floats
    ``fp32``.  ``meta`` holds the constexprs and the launch options.
    """
    fn = _python_function(kernel)
    names = list(inspect.signature(fn).parameters)
    if len(args) > len(names):
        raise TypeError(f"{fn.__name__} takes {len(names)} arguments, got {len(args)}")
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    divisible: list[str] = []
    for name, value in zip(names, args, strict=False):
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + dtype_name(value.dtype)
            if value.data_ptr() % 16 == 0:
                divisible.append(name)
        elif isinstance(value, bool):
            constexprs[name] = value
        elif isinstance(value, int):
            if value == 1:
                constexprs[name] = 1
                continue
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                divisible.append(name)
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot compile argument {name}={value!r}")
    constexprs.update({k: v for k, v in meta.items() if k not in _OPTIONS})
    return {
        "kernel": kernel_spec(kernel),
        "signature": signature,
        "constexprs": constexprs,
        "divisible_by_16": divisible,
        "arch": arch,
        "num_warps": meta.get("num_warps", 4),
        "num_stages": meta.get("num_stages", 3),
    }


def recorded(body: Callable[[], object], arch: int, where: str) -> dict[str, dict]:
    """The jobs of every launch ``body()`` makes through :func:`tilebook.ops.library.launch`
    (run it on :func:`meta_tensor` inputs), labelled ``"<kernel> <where>"``."""
    with library.recording() as launches:
        body()
    jobs = {}
    for kernel, _grid, args, meta in launches:
        label = f"{_python_function(kernel).__name__} {where}".strip()
        jobs[label] = launch_job(kernel, args, meta, arch)
    return jobs


def all_jobs(arch: int, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """Every op module's ``compile_jobs(arch, dtype)``, labels prefixed by the module:
    the whole package for :func:`tilebook.course.aot.compile_many`.  A new module under
    :mod:`tilebook.ops` with a ``compile_jobs`` function joins by itself."""
    from ..course.aot import parse_arch

    arch = parse_arch(arch)
    from .. import ops

    jobs: dict[str, dict] = {}
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"{ops.__name__}.{info.name}")
        make = getattr(module, "compile_jobs", None)
        if callable(make):
            for label, job in make(arch, dtype).items():
                jobs[f"{info.name}: {label}"] = job
    return jobs
