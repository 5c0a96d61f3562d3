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

import tilebook  # first: in CPU mode it sets TRITON_INTERPRET before Triton loads

# isort: split
from triton.runtime.interpreter import InterpretedFunction

from tilebook.course.aot.jobs import _prepare, _run_children
from tilebook.course.aot.kernel import CompiledKernel
from tilebook.ops.targets import launch_job

if not tilebook.is_interpreter():
    sys.exit("lesson_targets.py runs lessons under Triton's interpreter: set TILEBOOK_MODE=cpu")


def _job(kernel, args: tuple, kwargs: dict) -> dict:
    """The compile job of one launch, specialised as Triton would
    (:func:`tilebook.ops.targets.launch_job`): the runtime arguments in order, then
    the constexprs (and any argument passed as None) with the launch options."""
    params = inspect.signature(kernel.fn).parameters
    values = dict(zip(params, args, strict=False)) | kwargs
    runtime, meta = [], {k: v for k, v in kwargs.items() if k not in params}
    for name, param in params.items():
        value = values.get(name, param.default)
        if value is inspect.Parameter.empty:
            raise TypeError(f"no value for {name}")
        if "constexpr" in str(param.annotation) or value is None:
            meta[name] = value
        elif meta.keys() & params.keys():
            raise TypeError(f"{name}: a runtime argument after a constexpr")
        else:
            runtime.append(value)
    job = launch_job(kernel, tuple(runtime), meta, 0)
    del job["arch"]
    return job | {"kernel": kernel}  # the object: the lesson is no importable module


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
                first[fn.__name__] = (self, _job(self, args, kwargs))
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
