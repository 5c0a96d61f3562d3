"""Every kernel a lesson defines compiles for a T4 (sm_75) and an A100 (sm_80), as the
lesson launches it, with no GPU: a reader's GPU need not be an H100.

The CPU build of the site runs each lesson under Triton's interpreter and notes the
first launch of each of the lesson's kernels (``docs/_ext/lesson_launches.py``); this
test compiles those launches ahead of time for both targets
(``tests/lesson_targets.py``).  With a site built before (``TILEBOOK_BUILT_SITE``) that
noted nothing, the lesson runs again in a child process instead.  The package's own
kernels are :mod:`tests.test_targets`' business.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(ROOT.glob("gallery/*/[0-9][0-9]_*.py"))
ARCHS = (75, 80)

#: (lesson stem, kernel) -> why the CPU run does not launch it.
NOT_LAUNCHED_ON_CPU = {
    ("02_programs_and_grid", "scale_kernel"): "GPU timings only; a CPU reads their record",
    ("03_python_to_ptx", "scale_kernel_no_mask"): "the checker runs it in a child process",
    ("05_dot_and_tensor_cores", "repeat_dot_kernel"): "GPU timings only; a CPU reads their record",
    ("11_rms_norm", "bwd_kernel_bf16"): "bf16 sweep: the interpreter gets bf16 wrong",
}

#: (lesson stem, kernel) -> why it is for Hopper only (the lesson says so).
HOPPER_ONLY = {
    ("04_pointers_masks_strides", "scale_descriptor_kernel"): "tensor descriptors (TMA)",
    ("09_matmul", "matmul_tma_kernel"): "tensor descriptors (TMA) and wgmma",
}

#: (lesson stem, kernel, arch) -> why it may not compile or may spill there.
KNOWN = {
    **{
        ("02_programs_and_grid", "stamp_no_constexpr", arch): "the lesson's compile error"
        for arch in ARCHS
    },
    # Triton 3.8 on Turing: found by this test, not tuned (tuning needs the GPU).
    ("03_python_to_ptx", "tile_dot_kernel", 75): "spills 704 B on a T4",
    ("08_linear_act", "linear_act_kernel", 75): "spills 196 B on a T4",
    ("08_linear_act", "linear_epilogue_kernel", 75): "spills 196 B on a T4",
}


def _noted(lesson: Path, html_dir: Path) -> dict | None:
    """What the site build noted of ``lesson``, compiled for :data:`ARCHS` (None: it
    noted nothing)."""
    notes = html_dir.parent / "launches" / f"{lesson.stem}.pickle"
    if not notes.is_file():
        return None
    sys.path.insert(0, str(ROOT / "tests"))
    from lesson_targets import compile_noted

    return compile_noted(pickle.loads(notes.read_bytes()), list(ARCHS))


def _run(lesson: Path) -> dict:
    env = {
        **os.environ,
        "TILEBOOK_MODE": "cpu",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "lesson_targets.py"), str(lesson),
         *map(str, ARCHS)],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT=")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT="))


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem[:2] for p in LESSONS])
def test_lesson_kernels_compile_for_older_gpus(lesson, built_site, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a lesson run as a script writes its page here
    result = _noted(lesson, built_site[0]) or _run(lesson)
    stem = lesson.stem
    problems = []
    for name in result["unlaunched"]:
        if (stem, name) not in NOT_LAUNCHED_ON_CPU:
            problems.append(f"{name}: never launched on the CPU, so never compiled here")
    for name, per_arch in result["kernels"].items():
        if "skipped" in per_arch:
            if (stem, name) not in HOPPER_ONLY:
                problems.append(f"{name}: {per_arch['skipped']}")
            continue
        for arch in ARCHS:
            entry = per_arch[str(arch)]
            known = (stem, name, arch) in KNOWN
            if "error" in entry and not known:
                problems.append(f"{name} on sm_{arch}: {entry['error']}")
            elif entry.get("spills") and not known:
                problems.append(f"{name} on sm_{arch}: spills {entry['spills']} B")
            elif known and "error" not in entry and not entry.get("spills"):
                problems.append(f"{name} on sm_{arch}: listed in KNOWN but compiles cleanly")
    assert result["kernels"] or result["unlaunched"] == [], result
    assert not problems, "\n".join(problems)
