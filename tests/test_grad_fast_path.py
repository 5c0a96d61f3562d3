"""The training path's repeat calls: a forward that needs a gradient takes what the
first call of its kind left (softmax: a remembered launch in the op's memo; the norms:
a plan, :data:`tilebook._launch.PLANS`) inside the op's autograd.Function, and the
backward after it too; a call that cannot falls back to the ordinary path.

Softmax: on the CPU nothing is remembered (the interpreter has no compiled launch), so
these tests put a stand-in ``run`` in its memo under the key a real call would use,
and check that grad calls take it, that its outputs reach the backward, and that a
``run`` that declines sends the call down the ordinary path.  A stand-in computes
something other than the op asked for (softmax of a shifted input), and the float64
reference follows whichever of the two the call must have taken.

The norms plan on the CPU as on a GPU (only the compiled launch is the GPU's), so
their tests are public calls: repeat training steps, mixed with calls of other
kinds, must each be right.  The GPU test at the end uses the real memos.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilebook
from tilebook._launch import Memo
from tilebook.ops import softmax as sm

DEV = tilebook.device()


def _memo(key, run) -> Memo:
    """An op's memo holding ``run`` under ``key``, as a GPU call leaves it."""
    memo = Memo()
    memo.remember(key, run)
    return memo


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


class _Recorder:
    """A stand-in for a remembered launch: computes with torch, counts its calls, or
    declines (returns None) when told to."""

    def __init__(self, compute, decline=False):
        self.compute, self.decline, self.calls = compute, decline, 0

    def __call__(self, *args):
        self.calls += 1
        return None if self.decline else self.compute(*args)


def _softmax_run(shift):
    """A stand-in that computes ``softmax(t + shift)``: its y is a softmax (so the
    backward's formula holds for it) but not the one of ``t``."""
    return lambda t: torch.softmax(t.float() + shift, -1).to(t.dtype)


@pytest.mark.parametrize("decline", [False, True])
def test_softmax_grad_call_takes_the_remembered_launch(monkeypatch, decline):
    x = torch.randn(3, 5, 40, device=DEV, dtype=torch.float32, requires_grad=True)
    shift = torch.randn(40, device=DEV)
    run = _Recorder(_softmax_run(shift), decline)
    monkeypatch.setattr(sm, "_FAST", _memo(sm._fast_key(x, -1), run))
    y = sm.softmax(x, -1)
    assert run.calls == 1 and y.grad_fn is not None and y.shape == x.shape
    dy = torch.randn_like(x)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    # Taken: y is the stand-in's and the backward works from it; declined: the kernels'.
    xd = x.detach().double().requires_grad_()
    ref = torch.softmax(xd if decline else xd + shift.double(), -1)
    (rdx,) = torch.autograd.grad(ref, (xd,), dy.double())
    assert _rel(y, ref) < 1e-5 and _rel(dx, rdx) < 1e-5
    # Another dim is another key: the stand-in is not asked.
    sm.softmax(x, 1)
    assert run.calls == 1


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
def test_training_calls_remember_and_stay_right():
    for memo in (sm._FAST, sm._BWD_FAST):
        memo.clear()
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
    assert sm._fast_key(x, -1) in sm._FAST
    # The backwards of the second and third steps replayed the first one's launches.
    y = sm.softmax(x)
    assert sm._bwd_key(y, dy) in sm._BWD_FAST


# --------------------------------------------------------------------------- backward
# The backwards' replays: on the CPU, stand-ins for the compiled launches that run the
# real kernels through the interpreter, so the replays' arguments meet the kernels.


def _relaunch(kernel, grid, meta):
    """What a remembered launch does, under the interpreter: the kernel, again."""

    def go(*args):
        kernel[grid](*args, **meta)
        return True

    return go


@pytest.mark.parametrize("decline", [False, True])
def test_softmax_backward_takes_the_remembered_launch(monkeypatch, decline):
    x = torch.randn(3, 4, 40, device=DEV, requires_grad=True)
    y = sm.softmax(x, -1)
    dy = torch.randn_like(y)
    # The stand-in's dx is no gradient at all: only a call that took it returns it.
    replay = _Recorder(lambda y, dy: torch.full_like(y, 7.0), decline)
    monkeypatch.setattr(sm, "_BWD_FAST", _memo(sm._bwd_key(y, dy), replay))
    (dx,) = torch.autograd.grad(y, (x,), dy, retain_graph=True)
    assert replay.calls == 1
    if decline:  # the kernels' gradient
        xd = x.detach().double().requires_grad_()
        (want,) = torch.autograd.grad(torch.softmax(xd, -1), (xd,), dy.double())
        assert _rel(dx, want) < 1e-5
    else:
        assert torch.equal(dx, torch.full_like(y, 7.0))
    # A strided dy (here .sum()'s expanded ones) is not asked: another layout.
    (dx1,) = torch.autograd.grad(y.sum(), (x,), retain_graph=True)
    assert replay.calls == 1 and dx1.abs().max().item() < 1e-5


def test_softmax_backward_replay_runs_the_kernel_with_its_arguments():
    x = torch.randn(6, 40, device=DEV)
    y, dy = torch.softmax(x, -1), torch.randn(6, 40, device=DEV)
    seen = []

    def run(kernel, grid, *args, **meta):
        kernel[grid](*args, **meta)
        seen.append(_relaunch(kernel, grid, meta))
        return seen[-1]

    first = torch.empty_like(y)
    assert sm._backward_launch(y, dy, first, run=run) is seen[0]
    replay = sm._replay_bwd(seen[0], y.shape, first.data_ptr() & 15)
    dy2 = torch.randn_like(dy)
    got = replay(y, dy2)
    yd, dyd = y.double(), dy2.double()
    want = yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
    assert got is not None and _rel(got, want) < 1e-5
    assert sm._replay_bwd(lambda *a: False, y.shape, first.data_ptr() & 15)(y, dy2) is None


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
