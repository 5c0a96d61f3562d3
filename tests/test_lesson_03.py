"""Lesson 03 (from Python to PTX): its kernels, its knobs, and what it says of them.

Running the whole lesson means seven compiles in child processes, so these
tests lift its kernels and launchers out of the script (by their source) into a
small module, check them against float64 and against lesson 02, and check the
facts about Triton the lesson relies on: the knobs it lists exist, the
pass-by-pass dump is not among them, and the variants it compiles differ in
their loads the way it says.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import torch
import triton

from tilebook.exercises import check_elementwise
from tilebook.passes import compile_with_passes

ROOT = Path(__file__).parents[1]
LESSON = ROOT / "gallery" / "01_the_model" / "03_python_to_ptx.py"
LESSON_02 = ROOT / "gallery" / "01_the_model" / "02_programs_and_grid.py"
SOURCE = LESSON.read_text()
TREE = ast.parse(SOURCE)
LIFTED = ["scale_kernel", "scale", "scale_kernel_no_mask", "tile_dot_kernel", "scale_no_mask"]


def _source(name: str, source: str = SOURCE) -> str:
    tree = TREE if source is SOURCE else ast.parse(source)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{name!r} is defined {len(found)} times at top level"
    node = found[0]
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(source.splitlines()[start - 1 : node.end_lineno])


def _constant(name: str):
    for node in TREE.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and name in [e.id for e in target.elts]:
                    i = [e.id for e in target.elts].index(name)
                    return ast.literal_eval(node.value.elts[i])
                if isinstance(target, ast.Name) and target.id == name:
                    return ast.literal_eval(node.value)
    raise AssertionError(f"lesson 03 assigns no {name}")


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file: Triton needs source)."""
    head = "import torch\nimport triton\nimport triton.language as tl\n\n"
    head += f"BLOCK = {_constant('BLOCK')}\n\n"
    body = "\n\n\n".join(_source(name) for name in LIFTED)
    path = tmp_path_factory.mktemp("lesson03") / "lesson03_lifted.py"
    path.write_text(head + body + "\n")
    spec = importlib.util.spec_from_file_location("lesson03_lifted", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kernel_is_lesson_02_s():
    ours = _source("scale_kernel")
    theirs = _source("scale_kernel", LESSON_02.read_text())
    assert ours == theirs


def test_the_variant_is_the_kernel_without_its_mask():
    def body(name):
        (node,) = ast.parse(_source(name)).body
        return [ast.unparse(s) for s in node.body]

    masked, plain = body("scale_kernel"), body("scale_kernel_no_mask")
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
    tile = _constant("TILE")
    m, n, k = tile["BM"], tile["BN"], 2 * tile["BK"]
    a = torch.randn(m, k, device=device, dtype=torch.float16)
    b = torch.randn(k, n, device=device, dtype=torch.float16)
    c = torch.empty(m, n, device=device)
    lesson.tile_dot_kernel[(1,)](a, b, c, k, **tile)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-3, atol=1e-3)


def _knobs():
    return _constant("KNOBS")


def test_the_knobs_the_lesson_lists_exist_in_triton():
    for group, name, _ in _knobs():
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
    for named in re.findall(r"``(TRITON_[A-Z_]+)", SOURCE):
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
