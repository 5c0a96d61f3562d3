"""The training path's repeat calls: a forward that needs a gradient takes what the
first call of its kind left (a plan, :data:`tilebook._launch.PLANS`) inside the op's
autograd.Function, and the backward after it too; a call of another kind plans afresh.

Softmax plans on the CPU as on a GPU too: its tests are public calls, steps of one
kind with calls of other kinds between them, each right.

The norms plan on the CPU as on a GPU (only the compiled launch is the GPU's), so
their tests are public calls: repeat training steps, mixed with calls of other
kinds, must each be right.  The GPU test at the end uses the real memos.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilebook
from tilebook.ops import softmax as sm

DEV = tilebook.device()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_softmax_training_steps_stay_right():
    """Steps with fresh tensors of one kind, with calls of other kinds between them (no
    grad, another dim, .sum()'s stride-0 dy, a second backward through a kept graph):
    each is right, forward and backward."""
    for step in range(3):
        x = torch.randn(3, 5, 40, device=DEV, requires_grad=True)
        xd = x.detach().double().requires_grad_()
        dy = torch.randn_like(x)
        _grads_right(sm.softmax(x, -1), (x,), torch.softmax(xd, -1), (xd,), dy)
        with torch.no_grad():  # the no-grad kind of the same layout
            y = sm.softmax(x, -1)
        assert y.grad_fn is None and _rel(y, torch.softmax(xd, -1)) < 1e-5
        y1 = sm.softmax(x, 1)  # another dim: another plan
        _grads_right(y1, (x,), torch.softmax(xd, 1), (xd,), dy)
        y = sm.softmax(x, -1)
        (dx,) = torch.autograd.grad(y.sum(), (x,), retain_graph=True)
        assert dx.abs().max().item() < 1e-5, step
        if step == 2:  # the kept graph again: the saved y feeds a second backward
            (dx2,) = torch.autograd.grad(y, (x,), dy)
            (want,) = torch.autograd.grad(torch.softmax(xd, -1), (xd,), dy.double())
            assert _rel(dx2, want) < 1e-5


def _weight(t: torch.Tensor, parameter: bool) -> torch.Tensor:
    # A model's weights are nn.Parameters: they must take the repeat path too.
    return torch.nn.Parameter(t) if parameter else t.requires_grad_()


def _grads_right(y, ins, ref, ref_ins, dy, tol=1e-5):
    got = torch.autograd.grad(y, ins, dy)
    want = torch.autograd.grad(ref, ref_ins, dy.double())
    assert _rel(y, ref) < tol
    for g, r in zip(got, want, strict=True):
        assert _rel(g, r) < tol


@pytest.mark.parametrize("parameter", [False, True])
def test_norm_training_steps_stay_right(parameter):
    """Steps of a training loop with fresh tensors (new pointers, one kind), with calls
    of other kinds between them (no grad; a strided dy; another eps): each step is
    right, forward and backward."""
    n = 48
    for step in range(3):
        x = torch.randn(2, 6, n, device=DEV, requires_grad=True)
        w = _weight(torch.rand(n, device=DEV) + 0.5, parameter)
        b = _weight(torch.randn(n, device=DEV), parameter)
        xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
        eps = 1e-6 if step != 1 else 0.25  # eps is no part of the plan
        dy = torch.randn_like(x)
        if step == 2:  # dy as y.sum() gives it: a stride-0 view, copied into rows
            dy = torch.ones(1, device=DEV).expand_as(x)
        cases = [
            (tilebook.rms_norm(x, w, eps), (x, w), F.rms_norm(xd, (n,), wd, eps), (xd, wd)),
            (tilebook.layer_norm(x, w, b, eps), (x, w, b),
             F.layer_norm(xd, (n,), wd, bd, eps), (xd, wd, bd)),
        ]  # fmt: skip
        for y, ins, ref, ref_ins in cases:
            _grads_right(y, ins, ref, ref_ins, dy)
        with torch.no_grad():  # the no-grad kind, between two training steps
            y = tilebook.rms_norm(x, w, eps)
        assert y.grad_fn is None and _rel(y, F.rms_norm(xd, (n,), wd, eps)) < 1e-5


def test_norm_grad_call_checks_eps_before_the_plan():
    x = torch.randn(4, 32, device=DEV, requires_grad=True)
    w = torch.ones(32, device=DEV)
    for _ in range(2):  # the second call has a plan to take
        tilebook.rms_norm(x, w, 1e-6)
        tilebook.layer_norm(x, w, w, 1e-6)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            tilebook.rms_norm(x, w, bad)
        with pytest.raises(ValueError, match="eps"):
            tilebook.layer_norm(x, w, w, bad)


def test_a_strided_weight_gets_its_gradient_on_repeat_calls():
    # The kernels read a weight with unit stride: a strided one is copied before the
    # autograd.Function (the copy is recorded), on the first call and on every repeat.
    x = torch.randn(4, 16, device=DEV, requires_grad=True)
    for step in range(3):
        w = (torch.rand(32, device=DEV) + 0.5)[:: 2 if step != 1 else 1][:16].requires_grad_()
        ref_w = w.detach().double().requires_grad_()
        for fn, ref in ((tilebook.rms_norm, F.rms_norm), (tilebook.layer_norm, F.layer_norm)):
            y = fn(x, w, w, 1e-6) if fn is tilebook.layer_norm else fn(x, w, 1e-6)
            (dw,) = torch.autograd.grad(y, (w,), torch.ones_like(y))
            args = (x.detach().double(), (16,), ref_w)
            r = ref(*args, ref_w, 1e-6) if ref is F.layer_norm else ref(*args, 1e-6)
            (rdw,) = torch.autograd.grad(r, (ref_w,), torch.ones_like(r))
            assert _rel(dw, rdw) < 1e-5, (fn, step)


@pytest.mark.gpu
def test_training_calls_remember_and_stay_right(monkeypatch):
    jit = {}  # Triton's JIT launches (kernel[grid](...)) of softmax's kernels, by name
    for kernel in (sm.softmax_fwd_kernel, sm.softmax_bwd_kernel):
        name = kernel.fn.__name__

        def counted(*args, _run=kernel.run, _name=name, **kwargs):
            jit[_name] = jit.get(_name, 0) + 1
            return _run(*args, **kwargs)

        monkeypatch.setattr(kernel, "run", counted)
    n = 1000
    for i in range(3):  # fresh tensors: new pointers, the same specialisations
        x = torch.randn(4, 75, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        # The weights as a model holds them: nn.Parameters.
        w = torch.nn.Parameter(torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5)
        b = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
        dy = torch.randn_like(x)
        xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
        cases = [
            (sm.softmax(x), (x,), torch.softmax(xd, -1), (xd,)),
            (tilebook.rms_norm(x, w, 1e-6), (x, w), F.rms_norm(xd, (n,), wd, 1e-6), (xd, wd)),
            (tilebook.layer_norm(x, w, b), (x, w, b), F.layer_norm(xd, (n,), wd, bd), (xd, wd, bd)),
        ]
        for y, ins, ref, ref_ins in cases:
            got = torch.autograd.grad(y, ins, dy)
            want = torch.autograd.grad(ref, ref_ins, dy.double())
            assert _rel(y, ref) < 1.6e-2, (i, ref.grad_fn)
            for g, r in zip(got, want, strict=True):
                assert _rel(g, r) < 1.6e-2, (i, ref.grad_fn)
        if i == 0:
            jit.clear()
    # The second and third steps started the kernels the first one's plans kept.
    assert not jit, jit


@pytest.mark.parametrize("parameter", [False, True])
def test_product_training_steps_stay_right(parameter):
    """matmul and linear_act: training steps with fresh tensors of one kind take the
    call's plan (tilebook.ops.matmul_plan) forward and backward, with calls of other
    kinds between them (no grad; a strided bias, copied; a stride-0 dy): each step is
    right, forward and backward."""
    for step in range(3):
        x = torch.randn(2, 5, 24, device=DEV, requires_grad=True)
        w = _weight(torch.randn(12, 24, device=DEV) / 5, parameter)
        bias = torch.randn(24 if step == 1 else 12, device=DEV)
        bias = _weight(bias[::2] if step == 1 else bias, parameter and step != 1)
        b = _weight(torch.randn(24, 7, device=DEV), parameter)
        xd, wd, bd, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias, b))
        dy = torch.randn(2, 5, 12, device=DEV)
        if step == 2:  # dy as y.sum() gives it: a stride-0 view
            dy = torch.ones(1, device=DEV).expand(2, 5, 12)
        y = tilebook.linear_act(x, w, bias, "gelu")
        _grads_right(y, (x, w, bias), F.gelu(F.linear(xd, wd, bd)), (xd, wd, bd), dy)
        y = tilebook.matmul(x, b)
        _grads_right(y, (x, b), xd @ b64, (xd, b64), dy[..., :7].contiguous())
        with torch.no_grad():  # the no-grad kind, between two training steps
            y = tilebook.linear_act(x, w, bias, "silu")
        assert y.grad_fn is None and _rel(y, F.silu(F.linear(xd, wd, bd))) < 1e-5
