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


def test_compiled_attention_with_gradients():
    """flash_attention's one autograd path (its autograd.Function, calling the opaque
    operators under compile) in one Inductor graph: eager's output and gradients, with
    grouped heads and a window."""
    torch._dynamo.reset()

    def make(*shape):
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = make(2, 4, 200, 64), make(2, 2, 200, 64), make(2, 2, 200, 64)

    def f(q, k, v):
        return tilebook.flash_attention(q, k, v, causal=True, window=(64, None)) * 2

    def grads(fn):
        out = fn(q, k, v)
        return out, torch.autograd.grad(out.float().pow(2).sum(), (q, k, v))

    eager, eager_grads = grads(f)
    out, out_grads = grads(torch.compile(f, fullgraph=True))
    assert _rel(out, eager) < 1e-2
    for got, want in zip(out_grads, eager_grads, strict=True):
        assert _rel(got, want) < 1e-2
