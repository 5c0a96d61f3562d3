"""Run one lesson under Triton's interpreter, note the first launch of every kernel the
lesson defines, and compile each ahead of time for other GPUs (no GPU needed).

    python tests/lesson_targets.py gallery/03_real_kernels/07_vector_add.py 75 80

Prints one line ``RESULT=<json>``: for each kernel, per target, its registers and spills
or the compiler's error; and the lesson's ``@triton.jit`` functions that no launch on
the CPU reached.  ``tests/test_lesson_targets.py`` holds the verdicts; it takes what a
site build noted of the same lesson where there is one (``docs/_ext/lesson_launches.py``,
which notes the launches for both) and calls :func:`compile_noted` on it.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import tilebook  # first: in CPU mode it sets TRITON_INTERPRET before Triton loads

# isort: split
from tilebook.course.aot.jobs import _prepare, _run_children
from tilebook.course.aot.kernel import CompiledKernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "_ext"))
from lesson_launches import Recorder


def compile_noted(noted: dict, archs: list[int]) -> dict:
    """What :meth:`Recorder.result` noted of a lesson, compiled for each of ``archs``."""
    result = {"kernels": {}, "unlaunched": noted["unlaunched"]}
    jobs, labels = [], []
    for name, job in noted["jobs"].items():
        if isinstance(job, str):
            result["kernels"][name] = {"skipped": job}
            continue
        result["kernels"][name] = {}
        for arch in archs:
            jobs.append(_prepare({**job, "arch": arch}))
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


def main(lesson: str, archs: list[int]) -> dict:
    if not tilebook.is_interpreter():
        sys.exit("lesson_targets.py runs lessons under Triton's interpreter: set TILEBOOK_MODE=cpu")
    path = Path(lesson).resolve()
    rec = Recorder(path.name)
    rec.start()
    sys.argv = [str(path)]
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        rec.stop()
    return compile_noted(rec.result(path), archs)


if __name__ == "__main__":
    out = main(sys.argv[1], [int(a) for a in sys.argv[2:]])
    print("RESULT=" + json.dumps(out), flush=True)
