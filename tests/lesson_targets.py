"""Run one lesson under Triton's interpreter, note the first launch of every kernel the
lesson defines, and compile each ahead of time for other GPUs (no GPU needed).

    python tests/lesson_targets.py gallery/03_real_kernels/07_vector_add.py 75 80

Prints one line ``RESULT=<json>``: for each kernel, per target, its registers and spills
or the compiler's error; and the lesson's ``@triton.jit`` functions that no launch on
the CPU reached.  ``tests/test_lesson_targets.py`` holds the verdicts.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import runpy
import sys
from pathlib import Path

import torch
from triton.runtime.interpreter import InterpretedFunction

from tilebook.aot.jobs import _prepare, _run_children
from tilebook.aot.kernel import CompiledKernel

TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "i1",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e5m2: "fp8e5",
}
# Options of the launch, not arguments of the kernel.
LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion"}


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"an argument of type {type(value).__name__}")


def _job(fn, args: tuple, kwargs: dict) -> dict:
    """The compile job of one launch: signature and constexprs from its arguments."""
    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})
    signature, constexprs = {}, {}
    for name, param in params.items():
        value = bound.get(name, param.default)
        if value is inspect.Parameter.empty:
            raise TypeError(f"no value for {name}")
        if "constexpr" in str(param.annotation) or value is None:
            constexprs[name] = value
        else:
            signature[name] = _arg_type(value)
    return {
        "kernel": None,
        "signature": signature,
        "constexprs": constexprs,
        "num_warps": kwargs.get("num_warps", 4),
        "num_stages": kwargs.get("num_stages", 3),
    }


def _jit_functions(path: Path) -> dict[str, str]:
    """The module-level functions the lesson decorates with ``triton.jit``: their source."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target).endswith("jit"):
                    found[node.name] = ast.unparse(node)
    return found


def _unreached(jit: dict[str, str], launched: set[str]) -> list[str]:
    """Functions neither launched nor called (by name) from one that is: a device
    function is compiled inside the kernels that call it."""
    reached = set(launched)
    grew = True
    while grew:
        grew = False
        for name in set(jit) - reached:
            if any(re.search(rf"\b{name}\b", jit[r]) for r in reached if r in jit):
                reached.add(name)
                grew = True
    return sorted(set(jit) - reached)


def main(lesson: str, archs: list[int]) -> dict:
    path = Path(lesson).resolve()
    first: dict[str, tuple] = {}
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        if fn.__code__.co_filename == str(path) and fn.__name__ not in first:
            try:
                first[fn.__name__] = (self, _job(fn, args, kwargs))
            except (TypeError, KeyError) as exc:
                first[fn.__name__] = (self, f"not compiled: {exc}")
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    sys.argv = [str(path)]
    runpy.run_path(str(path), run_name="__main__")
    InterpretedFunction.run = original

    result = {"kernels": {}, "unlaunched": _unreached(_jit_functions(path), set(first))}
    jobs, labels = [], []
    for name, (kernel, job) in first.items():
        if isinstance(job, str):
            result["kernels"][name] = {"skipped": job}
            continue
        result["kernels"][name] = {}
        for arch in archs:
            jobs.append(_prepare({**job, "kernel": kernel, "arch": arch}))
            labels.append((name, arch))
    outcomes = _run_children(jobs, min(len(jobs), os.cpu_count() or 1), 300.0) if jobs else []
    for (name, arch), out in zip(labels, outcomes, strict=True):
        if "ok" in out:
            k = CompiledKernel(**out["ok"])
            entry = {"registers": k.registers, "spills": k.spill_stores_bytes}
        else:
            entry = {"error": out["error"][-400:]}
        result["kernels"][name][str(arch)] = entry
    return result


if __name__ == "__main__":
    out = main(sys.argv[1], [int(a) for a in sys.argv[2:]])
    print("RESULT=" + json.dumps(out), flush=True)
