"""Every op on any GPU index, whichever device is current; mixed devices are refused.

The GPU tests need two devices and skip themselves on a machine with one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_dropout import reference_keep
from test_flash_attention import reference

import tilebook
from tilebook.ops import attention_hopper
from tilebook.ops import matmul as mm
from tilebook.validation import check_same_device


def test_mixed_devices_are_named_in_the_error():
    a, b = torch.empty(2), torch.empty(2, device="meta")
    with pytest.raises(
        ValueError, match=r"op: tensors must be on one device, got a on cpu, b on meta"
    ):
        check_same_device("op", a=a, b=b, c=None)
    assert check_same_device("op", a=a, c=None) == a.device


two_gpus = pytest.mark.skipif(
    not (tilebook.is_gpu() and torch.cuda.device_count() >= 2), reason="needs two CUDA GPUs"
)


def _rel(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _every_op(dev: str) -> None:
    """Forward (three calls: the first, the remembered, the relaunched) and backward of
    every op on ``dev``, against float64 PyTorch on the same device."""
    bf = torch.bfloat16
    x = torch.randn(96, 256, device=dev, dtype=bf)
    w = torch.randn(256, device=dev, dtype=bf)
    lin = torch.randn(192, 256, device=dev, dtype=bf) / 16
    bias = torch.randn(192, device=dev, dtype=bf)
    b = torch.randn(256, 160, device=dev, dtype=bf)
    x64 = x.double()
    cases = {
        "vector_add": (lambda: tilebook.vector_add(x, x), lambda: 2 * x64),
        "softmax": (lambda: tilebook.softmax(x, -1), lambda: torch.softmax(x64, -1)),
        "rms_norm": (
            lambda: tilebook.rms_norm(x, w),
            lambda: F.rms_norm(x64, (256,), w.double(), 1e-6),
        ),
        "matmul": (lambda: tilebook.matmul(x, b), lambda: x64 @ b.double()),
        "matmul (pointer kernel)": (
            lambda: tilebook.matmul(x[:, 1:], b[1:]),
            lambda: x64[:, 1:] @ b.double()[1:],
        ),
        "linear_act": (
            lambda: tilebook.linear_act(x, lin, bias, "gelu"),
            lambda: F.gelu(F.linear(x64, lin.double(), bias.double())),
        ),
        "layer_norm": (
            lambda: tilebook.layer_norm(x, w, w),
            lambda: F.layer_norm(x64, (256,), w.double(), w.double(), 1e-5),
        ),
        "dropout": (
            lambda: tilebook.dropout(x, 0.25, seed=7),
            lambda: x64 / 0.75 * reference_keep(x.numel(), 0.25, 7).view_as(x).to(dev),
        ),
    }
    # flash_attention: on sm_90 its forward is the Gluon kernel (descriptors on dev).
    q, k, v = (torch.randn(1, 2, 128, 64, device=dev, dtype=bf) for _ in range(3))
    cases["flash_attention"] = (
        lambda: tilebook.flash_attention(q, k, v, causal=True),
        lambda: reference(q, k, v, causal=True),
    )
    if mm._tma_supported(x.device):  # rows of 255: copied to aligned ones, on x's device
        cases["matmul (staged for the TMA kernel)"] = (
            lambda: mm.fused_matmul(x[:, 1:], b[1:], impl="tma"),
            lambda: x64[:, 1:] @ b.double()[1:],
        )
    for name, (ours, ref) in cases.items():
        want = ref()
        for call in range(3):
            out = ours()
            assert out.device == x.device, name
            assert _rel(out, want) < 2e-2, f"{name} on {dev}, call {call}"
    # Backward, through every op at once.
    xl, wl, linl, bl = _leaf(x), _leaf(w), _leaf(lin), _leaf(b)
    h = tilebook.rms_norm(xl, wl)
    h = tilebook.linear_act(h, linl, bias, "silu")
    h = tilebook.vector_add(h, h)
    h = tilebook.softmax(tilebook.matmul(h, bl[:192] / 8), -1)
    h.float().pow(2).sum().backward()
    x6, w6, lin6, b6 = (_leaf(t.double()) for t in (x, w, lin, b))
    r = F.silu(F.linear(F.rms_norm(x6, (256,), w6, 1e-6), lin6, bias.double()))
    torch.softmax((2 * r) @ (b6[:192] / 8), -1).pow(2).sum().backward()
    for name, got, want in (("x", xl, x6), ("w", wl, w6), ("lin", linl, lin6), ("b", bl, b6)):
        assert got.grad is not None and got.grad.device == x.device, name
        assert _rel(got.grad, want.grad) < 5e-2, f"d{name} on {dev}"
    # The other three: layer_norm into dropout into attention (whose K and V are Q).
    keep = reference_keep(x.numel(), 0.25, 7).view_as(x).to(dev)
    xl, wl = _leaf(x), _leaf(w)
    h = tilebook.dropout(tilebook.layer_norm(xl, wl, wl), 0.25, seed=7).view(1, 2, 96, 128)
    tilebook.flash_attention(h, h, h, causal=True).float().pow(2).sum().backward()
    x6, w6 = _leaf(x.double()), _leaf(w.double())
    r = (F.layer_norm(x6, (256,), w6, w6, 1e-5) / 0.75 * keep).view(1, 2, 96, 128)
    reference(r, r, r, causal=True).pow(2).sum().backward()
    for name, got, want in (("x", xl, x6), ("w", wl, w6)):
        assert got.grad is not None and got.grad.device == x.device, name
        assert _rel(got.grad, want.grad) < 5e-2, f"d{name} (attention) on {dev}"
    if torch.cuda.get_device_capability(dev) == (9, 0):  # and no Gluon failure on dev
        assert attention_hopper.available(), f"the Gluon forward failed on {dev}"


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize(("current", "data"), [(0, 1), (1, 0), (1, 1)])
def test_every_op_on_any_index_whichever_is_current(current, data):
    with torch.cuda.device(current):
        _every_op(f"cuda:{data}")
        assert torch.cuda.current_device() == current, "an op left another device current"


@pytest.mark.gpu
@two_gpus
def test_tensors_on_two_gpus_are_refused():
    bf = torch.bfloat16
    x0 = torch.randn(8, 64, device="cuda:0", dtype=bf)
    x1 = x0.to("cuda:1")
    w0, w1 = torch.randn(64, device="cuda:0", dtype=bf), torch.randn(64, device="cuda:1", dtype=bf)
    lin0 = torch.randn(32, 64, device="cuda:0", dtype=bf)
    q0 = x0[None, None]  # (1, 1, 8, 64): one head of attention
    b1 = torch.randn(32, device="cuda:1", dtype=bf)
    calls = {
        "vector_add": lambda: tilebook.vector_add(x0, x1),
        "vector_add out": lambda: tilebook.vector_add(x0, x0, out=torch.empty_like(x1)),
        "rms_norm": lambda: tilebook.rms_norm(x0, w1),
        "matmul": lambda: tilebook.matmul(x0, x1.t()),
        "linear_act weight": lambda: tilebook.linear_act(x1, lin0),
        "linear_act bias": lambda: tilebook.linear_act(x0, lin0, b1),
        "layer_norm weight": lambda: tilebook.layer_norm(x0, w1),
        "layer_norm bias": lambda: tilebook.layer_norm(x0, w0, w1),
        "flash_attention k": lambda: tilebook.flash_attention(q0, x1[None, None], q0),
        "flash_attention v": lambda: tilebook.flash_attention(q0, q0, x1[None, None]),
    }
    for name, call in calls.items():
        for _ in range(2):  # the second time after a successful call of the same shapes
            with pytest.raises(ValueError, match=r"cuda:0.*cuda:1|cuda:1.*cuda:0"):
                call()
            _ = tilebook.rms_norm(x0, w0), tilebook.matmul(x0, x0.t()), name
