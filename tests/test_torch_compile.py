"""The ops stay usable inside torch.compile'd code (GPU only: Inductor needs CUDA here)."""

from __future__ import annotations

import pytest
import torch

import tilebook

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_compiled_model_with_every_op():
    torch._dynamo.reset()
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lin = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16) / 512**0.5
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)

    def block(x, w):
        h = tilebook.rms_norm(x, w, 1e-6)
        h = tilebook.linear_act(h, lin, bias, activation="gelu")
        h = tilebook.vector_add(h, h)
        return tilebook.softmax(h, dim=-1)

    def reference(x, w):
        h = torch.nn.functional.rms_norm(x.float(), (512,), w.float(), 1e-6)
        h = torch.nn.functional.gelu(h @ lin.float().t() + bias.float())
        return torch.softmax(h + h, dim=-1)

    out = torch.compile(block)(x, w)
    ref = reference(x, w)
    assert _rel(out, ref) < 3e-2
    out.float().pow(2).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert w.grad is not None and torch.isfinite(w.grad).all()


def test_compiled_matmul():
    torch._dynamo.reset()
    a = torch.randn(1000, 768, device="cuda", dtype=torch.float16)
    b = torch.randn(768, 513, device="cuda", dtype=torch.float16)
    out = torch.compile(lambda a, b: tilebook.matmul(a, b) * 2)(a, b)
    assert _rel(out, (a.double() @ b.double()) * 2) < 5e-3
