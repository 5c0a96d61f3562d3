"""vector_add under whichever runtime is active (the interpreter on CPU machines)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
import torch

import tilebook
from tilebook.course.aot import compile_kernel
from tilebook.course.check import default_tolerance
from tilebook.ops import vector_add as va

LESSON = Path(__file__).parents[1] / "gallery" / "03_real_kernels" / "07_vector_add.py"


def _ref(x, y):
    return x.double() + y.double()


def _assert_close(out, ref):
    rel = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert rel <= default_tolerance(out.dtype), rel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 2, 31, 97, 1023, 1024, 1025, 4097, 65537, 2**20 + 3])
def test_sizes_and_tails(n, dtype, device):
    x = torch.randn(n, device=device, dtype=dtype)
    y = torch.randn(n, device=device, dtype=dtype)
    out = tilebook.vector_add(x, y)
    assert out.shape == x.shape
    assert out.dtype == dtype
    _assert_close(out, _ref(x, y))


def test_every_element_written(device):
    n = 5000
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    out = torch.full((n,), float("nan"), device=device)
    tilebook.vector_add(x, y, out=out)
    assert torch.isfinite(out).all()
    _assert_close(out, _ref(x, y))


def test_tail_does_not_touch_memory_past_the_end(device):
    # A view into a larger buffer: the elements after the view must stay untouched.
    buf = torch.full((3000,), -7.0, device=device)
    out = buf[:1000]
    x = torch.randn(1000, device=device)
    y = torch.randn(1000, device=device)
    tilebook.vector_add(x, y, out=out, block_size=256)
    assert torch.equal(buf[1000:], torch.full((2000,), -7.0, device=device))
    _assert_close(out, _ref(x, y))


@pytest.mark.parametrize(("block_size", "num_warps"), [(64, 1), (256, 2), (1024, 4), (4096, 8)])
def test_explicit_launch_settings(block_size, num_warps, device):
    x = torch.randn(3001, device=device)
    y = torch.randn(3001, device=device)
    _assert_close(tilebook.vector_add(x, y, block_size=block_size, num_warps=num_warps), _ref(x, y))


def test_multidimensional_and_non_contiguous(device):
    x = torch.randn(64, 48, device=device).t()  # transposed: not contiguous
    y = torch.randn(48, 64, device=device)
    assert not x.is_contiguous()
    out = tilebook.vector_add(x, y)
    assert out.shape == (48, 64)
    _assert_close(out, _ref(x, y))
    z = torch.randn(4000, device=device)[::3]  # strided slice
    w = torch.randn(z.shape[0], device=device)
    _assert_close(tilebook.vector_add(z, w), _ref(z, w))


def test_empty(device):
    x = torch.empty(0, device=device)
    assert tilebook.vector_add(x, x).numel() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 97, 2**20 + 3, 2**24])
def test_bfloat16_on_gpu(n, device):
    x = torch.randn(n, device=device, dtype=torch.bfloat16)
    y = torch.randn(n, device=device, dtype=torch.bfloat16)
    _assert_close(tilebook.vector_add(x, y), _ref(x, y))


def test_wrong_device_is_a_clear_error():
    other = "meta"  # never tilebook's device, on any machine
    x = torch.empty(4, device=other)
    with pytest.raises(ValueError, match=r"vector_add: x is on meta"):
        tilebook.vector_add(x, x)


def test_wrong_type_dtype_shape(device):
    x = torch.randn(8, device=device)
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
        tilebook.vector_add([1.0] * 8, x)
    with pytest.raises(TypeError, match="dtype int32"):
        tilebook.vector_add(x.int(), x.int())
    with pytest.raises(TypeError, match="same dtype"):
        tilebook.vector_add(x, x.half())
    with pytest.raises(ValueError, match="same shape"):
        tilebook.vector_add(x, torch.randn(9, device=device))
    with pytest.raises(ValueError, match="power of two"):
        tilebook.vector_add(x, x, block_size=1000)
    with pytest.raises(ValueError, match="num_warps"):
        tilebook.vector_add(x, x, num_warps=3)
    with pytest.raises(ValueError, match="out must be contiguous"):
        tilebook.vector_add(x, x, out=torch.empty(16, device=device)[::2])


def test_lesson_shows_the_package_kernel():
    """Lesson 07 writes the kernel out in full; it must stay the package's kernel."""
    tree = ast.parse(LESSON.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "add_kernel"]
    lesson_src = ast.get_source_segment(LESSON.read_text(), node)
    package_src = textwrap.dedent(inspect.getsource(va.add_kernel.fn))
    package_src = package_src[package_src.index("def add_kernel") :]
    assert lesson_src.strip() == package_src.strip()


def test_sm90_compile_is_vectorised():
    """Ahead-of-time compile for an H100: 16-byte loads, no spills at the tuned config."""
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"}
    cfg = va.DEFAULT_CONFIG
    k = compile_kernel(
        "tilebook.ops.vector_add:add_kernel",
        sig,
        {"BLOCK_SIZE": cfg.kwargs["BLOCK_SIZE"], "INT64_OFFSETS": False},
        num_warps=cfg.num_warps,
        divisible_by_16=list(sig),
    )
    assert k.arch == 90
    assert k.count(r"LDG\.E\.128") > 0, "expected 16-byte global loads"
    assert k.spill_stores_bytes == 0
    assert "tt.func" in k.stages["ttir"] and "ttg." in k.stages["ttgir"]


def test_gradients_flow_to_both_inputs(device):
    x = torch.randn(1000, device=device, requires_grad=True)
    y = torch.randn(1000, device=device, requires_grad=True)
    g = torch.randn(1000, device=device)
    out = tilebook.vector_add(x, y)
    out.backward(g)
    assert torch.equal(x.grad, g)
    assert torch.equal(y.grad, g)
    with pytest.raises(RuntimeError, match="out= cannot be used"):
        tilebook.vector_add(x, y, out=torch.empty(1000, device=device))


def test_usable_inside_torch_compile(device):
    """Every op works inside a compiled function, gradients included (aot_eager on CPU)."""
    torch._dynamo.reset()
    x = torch.randn(4, 32, device=device, requires_grad=True)
    w = torch.randn(32, device=device, requires_grad=True)
    lin = torch.randn(24, 32, device=device)
    b = torch.randn(24, device=device)

    def block(x, w):
        h = tilebook.rms_norm(x, w)
        h = tilebook.linear_act(h, lin, b, "gelu")
        h = tilebook.vector_add(h, h)
        return tilebook.softmax(h, -1)

    backend = "inductor" if tilebook.is_gpu() else "aot_eager"
    tol = 3e-3 if tilebook.is_gpu() else 1e-4  # float32 matrix products run as TF32 on a GPU
    out = torch.compile(block, backend=backend)(x, w)
    h = torch.nn.functional.rms_norm(x.double(), (32,), w.double(), 1e-6)
    h = torch.nn.functional.gelu(torch.nn.functional.linear(h, lin.double(), b.double()))
    ref = torch.softmax(2 * h, -1)
    assert ((out.double() - ref).norm() / ref.norm()).item() < tol
    out.pow(2).sum().backward()
    gx, gw = torch.autograd.grad(ref.pow(2).sum(), (x, w))
    assert ((x.grad.double() - gx).norm() / gx.norm()).item() < tol
    assert ((w.grad.double() - gw).norm() / gw.norm()).item() < tol
    m = torch.compile(lambda a, c: tilebook.matmul(a, c) * 2, backend=backend)
    a, c = torch.randn(5, 16, device=device), torch.randn(16, 7, device=device)
    ref_m = 2 * a.double() @ c.double()
    assert ((m(a, c).double() - ref_m).norm() / ref_m.norm()).item() < tol
