"""Lesson 11 (rms_norm): its kernels, launch rules and records stay the package's.

The lesson writes both kernels out in full, re-derives the launch heuristics in a
few lines of its own and adds a variant of each kernel whose accumulators take a
``tl.constexpr`` type.  Running the whole lesson takes a while, so these tests lift
those definitions out of the script (by their source) into a small module and
check them against :mod:`tilebook.ops.rms_norm`.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import textwrap
from pathlib import Path

import pytest
import torch
import triton.language as tl

import tilebook
from tilebook.bench import RECORDS_DIR
from tilebook.ops import rms_norm as op

LESSON = Path(__file__).parents[1] / "gallery" / "03_real_kernels" / "11_rms_norm.py"
SOURCE = LESSON.read_text()
TREE = ast.parse(SOURCE)
EPS = 1e-6

#: The lesson's definitions that the tests lift out, in the order they appear.
LIFTED = [
    "warps_for",
    "fwd_config",
    "rms_norm_fwd_kernel",
    "rms_norm_forward",
    "bwd_config",
    "rms_norm_bwd_kernel",
    "rms_norm_backward",
    "rms_norm_fwd_acc_kernel",
    "rms_norm_bwd_acc_kernel",
]


def _node(name: str) -> ast.FunctionDef:
    (node,) = [n for n in TREE.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return node


def _with_decorators(node: ast.FunctionDef) -> str:
    lines = SOURCE.splitlines()
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(lines[first - 1 : node.end_lineno])


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as an importable module (Triton needs their source)."""
    header = (
        "import torch\nimport triton\nimport triton.language as tl\n\n"
        f"EPS = {EPS!r}\nSM_COUNT = 4\n"
    )
    body = "\n\n\n".join(_with_decorators(_node(name)) for name in LIFTED)
    path = tmp_path_factory.mktemp("lesson11") / "lesson11_lifted.py"
    path.write_text(header + "\n\n" + body + "\n")
    spec = importlib.util.spec_from_file_location("lesson11_lifted", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["rms_norm_fwd_kernel", "rms_norm_bwd_kernel"])
def test_lesson_shows_the_package_kernel(name):
    """Both kernels appear in full in the lesson; they must stay the package's."""
    lesson_src = ast.get_source_segment(SOURCE, _node(name))
    package_src = textwrap.dedent(inspect.getsource(getattr(op, name).fn))
    package_src = package_src[package_src.index(f"def {name}") :]
    assert lesson_src.strip() == package_src.strip()


HIDDEN = sorted({1, 2, 7, 100, 1000, 4095, 8193} | {2**k for k in range(17)})


@pytest.mark.parametrize("n_cols", HIDDEN)
def test_lesson_launch_rules_are_the_package_rules(lesson, n_cols):
    assert lesson.fwd_config(n_cols) == op._fwd_config(n_cols)
    assert lesson.bwd_config(n_cols) == op._bwd_config(n_cols)


def _inputs(n_rows, n_cols, dtype, device):
    x = torch.randn(n_rows, n_cols, device=device).to(dtype)
    w = (1 + 0.1 * torch.randn(n_cols, device=device)).to(dtype)
    dy = torch.randn(n_rows, n_cols, device=device).to(dtype)
    return x, w, dy


@pytest.mark.parametrize("shape", [(37, 7), (21, 1000)])
def test_lesson_launchers_match_the_package_op(lesson, device, shape):
    x, w, dy = _inputs(*shape, torch.float32, device)
    y, rstd = lesson.rms_norm_forward(x, w)
    dx, dw = lesson.rms_norm_backward(dy, x, w, rstd)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y_ref = tilebook.rms_norm(xg, wg, eps=EPS)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (xg, wg), dy)
    torch.testing.assert_close(y, y_ref, atol=0, rtol=0)
    torch.testing.assert_close(dx, dx_ref, atol=0, rtol=0)
    # The package sizes its grid from the real SM count on a GPU; the lifted module
    # assumes 4, so the partial sums may be grouped differently there.
    torch.testing.assert_close(dw, dw_ref, atol=1e-5, rtol=1e-5)


def test_acc_variant_in_fp32_is_the_lesson_kernel(lesson, device):
    """With ACC=tl.float32 the variants compute exactly what the kernels compute."""
    x, w, dy = _inputs(45, 300, torch.float32, device)
    y, rstd = lesson.rms_norm_forward(x, w)
    dx, dw = lesson.rms_norm_backward(dy, x, w, rstd)
    y_a, rstd_a = lesson.rms_norm_forward(
        x, w, kernel=lesson.rms_norm_fwd_acc_kernel, ACC=tl.float32
    )
    dx_a, dw_a = lesson.rms_norm_backward(
        dy, x, w, rstd_a, kernel=lesson.rms_norm_bwd_acc_kernel, ACC=tl.float32
    )
    for got, want in [(y_a, y), (rstd_a, rstd), (dx_a, dx), (dw_a, dw)]:
        assert torch.equal(got, want)


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.gpu
def test_bf16_accumulators_lose_accuracy_in_dweight(lesson, device):
    """On a GPU (bf16 is wrong under the interpreter): the bf16 variant's dweight is
    several times less accurate than the fp32 one's."""
    x, w, dy = _inputs(16384, 4096, torch.bfloat16, device)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w64
    _, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    errs = {}
    for acc in (tl.float32, tl.bfloat16):
        _, rstd = lesson.rms_norm_forward(x, w, kernel=lesson.rms_norm_fwd_acc_kernel, ACC=acc)
        _, dw = lesson.rms_norm_backward(
            dy, x, w, rstd, kernel=lesson.rms_norm_bwd_acc_kernel, ACC=acc
        )
        errs[acc] = _rel(dw, dw64)
    assert errs[tl.bfloat16] > 2 * errs[tl.float32], errs


def _record(name):
    path = RECORDS_DIR / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name} has not been recorded on a GPU yet")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", ["lesson11_sizes", "lesson11_accumulate"])
def test_committed_records_are_gpu_measurements(name):
    """CPU builds plot these: they must come from a GPU and cover the lesson's sizes."""
    rec = _record(name)
    assert rec["provenance"]["mode"] == "gpu"
    assert rec["provenance"].get("gpu")
    assert rec["provenance"].get("copy_gbps", 0) > 0
    assert {4096, 65536} <= {r["hidden"] for r in rec["rows"]}
    assert all(r["gbps"] > 0 for r in rec["rows"])


def test_sizes_record_has_every_implementation_and_pass():
    rows = _record("lesson11_sizes")["rows"]
    for h in {r["hidden"] for r in rows}:
        for pass_ in ("forward", "backward"):
            impls = {r["impl"] for r in rows if r["hidden"] == h and r["pass"] == pass_}
            assert impls == {"tilebook", "F.rms_norm", "torch.compile", "eager"}, (h, pass_)


def test_recorded_bf16_accumulation_is_visibly_worse():
    """The widget flags bf16 rows as wrong when some error is over 2x the fp32 one."""
    rows = _record("lesson11_accumulate")["rows"]
    by = {(r["hidden"], r["accumulate"]): r for r in rows}
    assert {acc for _, acc in by} == {"fp32", "bf16"}
    worse = [
        h
        for (h, acc), r in by.items()
        if acc == "bf16" and r["err_dw"] > 2 * by[(h, "fp32")]["err_dw"]
    ]
    assert worse, "no hidden size where bf16 accumulation visibly hurts dweight"
