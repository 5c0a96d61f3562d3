"""Lesson 03 (from Python to PTX): its kernels, its knobs, and what it says of them.

Running the whole lesson means seven compiles in child processes, so these
tests lift its kernels and launchers out of the script (by their source) into a
small module, check them against float64 and against lesson 02, and check the
facts about Triton the lesson relies on: the knobs it lists exist, the
pass-by-pass dump is not among them, and the variants it compiles differ in
their loads the way it says.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import triton
from lesson_source import LessonSource

from tilebook.course.exercises import check_elementwise
from tilebook.course.experiments import stages
from tilebook.course.passes import compile_with_passes

SCRIPT = LessonSource(3)
LIFTED = ["scale_kernel", "scale", "scale_kernel_no_mask", "tile_dot_kernel", "scale_no_mask"]


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file: Triton needs source)."""
    head = "import torch\nimport triton\nimport triton.language as tl\n\n"
    head += f"BLOCK = {SCRIPT.constant('BLOCK')}\n\n"
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson03"), head)


def test_the_kernel_is_lesson_02_s():
    ours = SCRIPT.source("scale_kernel")
    theirs = LessonSource(2).source("scale_kernel")
    assert ours == theirs


def test_the_variant_is_the_kernel_without_its_mask():
    masked, plain = SCRIPT.body("scale_kernel"), SCRIPT.body("scale_kernel_no_mask")
    assert [s for s in masked if not s.startswith("mask =")] != plain  # loads differ
    assert [s.replace(", mask=mask", "") for s in masked if not s.startswith("mask =")] == plain


@pytest.mark.parametrize("n", [1, 97, 4100])
def test_scale_matches_float64(lesson, device, n):
    x = torch.randn(n, device=device)
    torch.testing.assert_close(lesson.scale(x).double(), 2.0 * x.double(), rtol=1e-6, atol=0)


def test_the_masked_kernel_passes_the_checker_and_the_unmasked_one_fails(lesson):
    verdict = check_elementwise(lesson.scale_no_mask, lambda x: 2.0 * x, inputs=1, block=1024)
    assert not verdict.ok and "past the end" in str(verdict)

    def masked(x, out):
        n = x.numel()
        lesson.scale_kernel[(triton.cdiv(n, 1024),)](x, out, n, 2.0, BLOCK=1024)

    assert check_elementwise(masked, lambda x: 2.0 * x, inputs=1, block=1024).ok


def test_tile_dot_kernel_matches_float64(lesson, device):
    tile = SCRIPT.constant("TILE")
    m, n, k = tile["BM"], tile["BN"], 2 * tile["BK"]
    a = torch.randn(m, k, device=device, dtype=torch.float16)
    b = torch.randn(k, n, device=device, dtype=torch.float16)
    c = torch.empty(m, n, device=device)
    lesson.tile_dot_kernel[(1,)](a, b, c, k, **tile)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-3, atol=1e-3)


def test_the_knobs_the_lesson_lists_exist_in_triton():
    for group, name, _ in stages.KNOBS:
        descriptor = vars(type(getattr(triton.knobs, group)))[name]
        assert isinstance(descriptor, triton.knobs.env_base), (group, name)
        assert re.fullmatch(r"TRITON_[A-Z_]+", descriptor.key), descriptor.key
    keys = {
        d.key
        for g in vars(triton.knobs).values()
        if isinstance(g, triton.knobs.base_knobs)
        for d in vars(type(g)).values()
        if isinstance(d, triton.knobs.env_base)
    }
    for named in re.findall(r"``(TRITON_[A-Z_]+)", SCRIPT.text):
        assert named in keys, f"the lesson names {named}, which is not a knob"
    assert "MLIR_ENABLE_DUMP" not in keys and "MLIR_DUMP_PATH" not in keys


def test_the_variants_differ_in_their_loads_as_the_lesson_says(lesson):
    """The three H100 variants of the lesson, compiled as it compiles them."""
    sig = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32"}
    job = {"kernel": lesson.scale_kernel, "signature": sig, "constexprs": {"BLOCK": 1024}}
    builds = compile_with_passes(
        {
            "hints": {**job, "divisible_by_16": ["x_ptr", "out_ptr", "n"]},
            "n=4100": {**job, "divisible_by_16": ["x_ptr", "out_ptr"]},
            "x[1:]": {**job, "divisible_by_16": ["out_ptr", "n"]},
        },
        arch=90,
        workers=2,
    )
    wide = {label: t.kernel.count(r"LDG\.E\.128") for label, t in builds.items()}
    stores = {label: t.kernel.count(r"STG\.E\.128") for label, t in builds.items()}
    assert wide["hints"] > 0 and wide["n=4100"] == wide["x[1:]"] == 0
    assert stores["x[1:]"] == stores["hints"] > stores["n=4100"] == 0
    for t in builds.values():  # the same layout in all three: width comes later
        assert re.findall(r"sizePerThread = \[(\d+)\]", t.kernel.stage("ttgir")) == ["4"]
    assert builds["hints"].passes.did("tritongpu-coalesce")


def test_what_the_page_reads_from_a_stage():
    ttgir = (
        "#blocked = #ttg.blocked<{sizePerThread = [1], threadsPerWarp = [32]}>\n"
        "#blocked1 = #ttg.blocked<{sizePerThread = [4], threadsPerWarp = [32]}>\n"
        "%0 = ttg.local_alloc : () -> !ttg.memdesc<3x64x32xf16, #shared, #smem>\n"
        "%1 = ttg.local_alloc : () -> !ttg.memdesc<3x32x64xf16, #shared1, #smem>\n"
        "%2 = ttg.local_alloc : () -> !ttg.memdesc<1xi64, #shared2, #smem>\n"
    )
    assert stages.layouts(ttgir) == ["1", "4"]
    build = SimpleNamespace(kernel=SimpleNamespace(stage={"ttgir": ttgir}.__getitem__))
    assert stages.shared_buffers(build) == ([(3, 64, 32), (3, 32, 64)], 2 * 3 * 64 * 32 * 2)
