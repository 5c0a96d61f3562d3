"""The training path's remembered launches: a forward that needs a gradient replays a
remembered launch inside the op's autograd.Function, and falls back when it cannot.

On the CPU nothing is remembered (the interpreter has no compiled launch), so these
tests put a stand-in ``run`` in each op's memo under the key a real call would use,
and check that grad calls take it, that its outputs reach the backward, and that a
``run`` that declines sends the call down the ordinary path.  The GPU test at the end
uses the real memos.

A stand-in computes something other than the op asked for (softmax of a shifted
input, a norm with another eps), and the float64 reference follows whichever of the
two the call must have taken: were both the same, a call that dropped the stand-in's
outputs and ran the kernels would pass as well.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilebook
from tilebook._launch import Memo
from tilebook.ops import layer_norm as ln
from tilebook.ops import rms_norm as rn
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


#: The eps the norms' stand-ins use whatever the caller passes: with rows of about unit
#: mean square it moves rstd by some 20%, so their outputs are not the kernels'.
STAND_IN_EPS = 0.5


def _softmax_run(shift):
    """A stand-in that computes ``softmax(t + shift)``: its y is a softmax (so the
    backward's formula holds for it) but not the one of ``t``."""
    return lambda t: torch.softmax(t.float() + shift, -1).to(t.dtype)


def _rms_run(t, w, eps):
    rows = t.reshape(-1, t.shape[-1]).float()
    rstd = torch.rsqrt(rows.pow(2).mean(-1) + STAND_IN_EPS)
    return (rows * rstd[:, None] * w.float()).to(t.dtype).view(t.shape), rstd


def _ln_run(t, w, b, eps):
    rows = t.reshape(-1, t.shape[-1]).float()
    mean = rows.mean(-1)
    rstd = torch.rsqrt(rows.var(-1, unbiased=False) + STAND_IN_EPS)
    y = (rows - mean[:, None]) * rstd[:, None] * w.float() + b.float()
    return y.to(t.dtype).view(t.shape), torch.stack([mean, rstd])


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
    # A model's weights are nn.Parameters: they must take the remembered launch too.
    return torch.nn.Parameter(t) if parameter else t.requires_grad_()


@pytest.mark.parametrize(("decline", "parameter"), [(False, False), (True, False), (False, True)])
def test_rms_norm_grad_call_takes_the_remembered_launch(monkeypatch, decline, parameter):
    x = torch.randn(2, 6, 48, device=DEV, requires_grad=True)
    w = _weight(torch.rand(48, device=DEV) + 0.5, parameter)
    run = _Recorder(_rms_run, decline)
    monkeypatch.setattr(rn, "_FAST_GRAD", _memo(rn._fast_key(x, w), run))
    monkeypatch.setattr(rn, "_FAST", Memo())  # the no-grad memo is not the one asked
    y = rn.rms_norm(x, w, 1e-6)
    assert run.calls == 1 and y.grad_fn is not None and y.shape == x.shape
    dy = torch.randn_like(x)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    # Taken: y and the rstd the backward reads are the stand-in's, of its own eps.
    ref = F.rms_norm(xd, (48,), wd, 1e-6 if decline else STAND_IN_EPS)
    rdx, rdw = torch.autograd.grad(ref, (xd, wd), dy.double())
    for got, want in ((y, ref), (dx, rdx), (dw, rdw)):
        assert _rel(got, want) < 1e-5
    with torch.no_grad():  # without grad, the other memo: nothing there, the slow path
        rn.rms_norm(x, w, 1e-6)
    assert run.calls == 1


def test_rms_norm_grad_call_checks_eps_before_the_remembered_launch(monkeypatch):
    x = torch.randn(4, 32, device=DEV, requires_grad=True)
    w = torch.ones(32, device=DEV)
    run = _Recorder(_rms_run)
    monkeypatch.setattr(rn, "_FAST_GRAD", _memo(rn._fast_key(x, w), run))
    with pytest.raises(ValueError, match="eps"):
        rn.rms_norm(x, w, -1.0)
    assert run.calls == 0


@pytest.mark.parametrize(("decline", "parameter"), [(False, False), (True, False), (False, True)])
def test_layer_norm_grad_call_takes_the_remembered_launch(monkeypatch, decline, parameter):
    x = torch.randn(5, 64, device=DEV, requires_grad=True)
    w = _weight(torch.rand(64, device=DEV) + 0.5, parameter)
    b = _weight(torch.randn(64, device=DEV), parameter)
    run = _Recorder(_ln_run, decline)
    monkeypatch.setattr(ln, "_FAST", _memo(ln._fast_key(x, w, b), run))
    y = ln.layer_norm(x, w, b, 1e-5)
    assert run.calls == 1 and y.grad_fn is not None and y.shape == x.shape
    dy = torch.randn_like(x)
    got = torch.autograd.grad(y, (x, w, b), dy)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    # Taken: y and the statistics the backward reads are the stand-in's, of its own eps.
    ref = F.layer_norm(xd, (64,), wd, bd, 1e-5 if decline else STAND_IN_EPS)
    want = torch.autograd.grad(ref, (xd, wd, bd), dy.double())
    assert _rel(y, ref) < 1e-5
    for g, r in zip(got, want, strict=True):
        assert _rel(g, r) < 1e-5


def test_a_strided_weight_is_never_remembered_for_grad_calls(monkeypatch):
    # rms_norm copies a strided weight before its Function (the copy is recorded for
    # autograd); the launch of that copy must not be remembered under the caller's key.
    # A stand-in for launch() runs the kernel and hands back a "compiled launch", as
    # on a GPU, so that the forward gets as far as deciding whether to remember.
    from tilebook import _launch

    def launch(kernel, grid, *args, **meta):
        _launch.launch(kernel, grid, *args, **meta)
        return lambda *a: False  # a relaunch that never launches

    remembered = []

    class Spy(dict):
        def remember(self, key, value):
            remembered.append(key)

    monkeypatch.setattr(rn, "launch", launch)
    monkeypatch.setattr(rn, "_FAST_GRAD", Spy())
    x = torch.randn(4, 16, device=DEV, requires_grad=True)
    for w, expect in (
        ((torch.rand(32, device=DEV) + 0.5)[::2].requires_grad_(), 0),
        ((torch.rand(16, device=DEV) + 0.5).requires_grad_(), 1),
    ):
        y = rn.rms_norm(x, w, 1e-6)
        (dw,) = torch.autograd.grad(y, (w,), torch.ones_like(y))
        ref_w = w.detach().double().requires_grad_()
        ref = F.rms_norm(x.detach().double(), (16,), ref_w, 1e-6)
        (rdw,) = torch.autograd.grad(ref, (ref_w,), torch.ones_like(ref))
        assert _rel(dw, rdw) < 1e-5
        assert len(remembered) == expect
    assert remembered == [rn._fast_key(x, w)]


@pytest.mark.gpu
def test_training_calls_remember_and_stay_right():
    for memo in (sm._FAST, sm._BWD_FAST, rn._FAST_GRAD, rn._BWD_FAST, ln._FAST):
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
            (rn.rms_norm(x, w, 1e-6), (x, w), F.rms_norm(xd, (n,), wd, 1e-6), (xd, wd)),
            (ln.layer_norm(x, w, b), (x, w, b), F.layer_norm(xd, (n,), wd, bd), (xd, wd, bd)),
        ]
        for y, ins, ref, ref_ins in cases:
            got = torch.autograd.grad(y, ins, dy)
            want = torch.autograd.grad(ref, ref_ins, dy.double())
            assert _rel(y, ref) < 1.6e-2, (i, ref.grad_fn)
            for g, r in zip(got, want, strict=True):
                assert _rel(g, r) < 1.6e-2, (i, ref.grad_fn)
    assert sm._fast_key(x, -1) in sm._FAST
    assert rn._fast_key(x, w) in rn._FAST_GRAD
    assert ln._fast_key(x, w, b) in ln._FAST
    # The backwards of the second and third steps replayed the first one's launches.
    y = sm.softmax(x)
    assert sm._bwd_key(y, dy) in sm._BWD_FAST
    assert len(rn._BWD_FAST) == 1
    # ... and rms_norm's forward entry keeps that replay for the backwards after it.
    assert rn._FAST_GRAD[rn._fast_key(x, w)].backward[2] in rn._BWD_FAST.values()


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


@pytest.mark.parametrize(
    ("shape", "chunked"),
    [((8, 48), False), ((37, 100), False), ((37, 100), True), ((36, 100), True)],
)
def test_rms_norm_backward_replay_runs_the_kernels_with_their_arguments(shape, chunked):
    x = torch.randn(*shape, device=DEV)
    w = torch.rand(shape[1], device=DEV) + 0.5
    _, rstd = rn.launch_rms_norm_fwd(x, w, 1e-6)
    plan = rn._bwd_plan(x, chunked=chunked, chunk=32 if chunked else None)
    assert plan.chunked is chunked
    steps = [_relaunch(*step) for step in plan.launches]
    replay = rn._replay_bwd(plan, steps, x.stride(0), x.stride(0))
    dy_shapes = [shape, (shape[0], 1, shape[1])]  # dy as the caller holds it
    if shape[0] % 2 == 0:
        dy_shapes.append((2, shape[0] // 2, shape[1]))
    for dy_shape in dy_shapes:
        dy = torch.randn(dy_shape, device=DEV)
        got = replay(dy, x, w, rstd)
        assert got is not None and got[0].shape == dy.shape
        xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
        ref = F.rms_norm(xd, (shape[1],), wd, 1e-6)
        want = torch.autograd.grad(ref, (xd, wd), dy.double().view(shape))
        for g, r in zip(got, want, strict=True):
            assert g.dtype == torch.float32 and _rel(g.view(r.shape), r) < 1e-5
    # A launch that declines (another device current, a hook): the ordinary path.
    steps[-1] = lambda *a: False
    assert rn._replay_bwd(plan, steps, shape[1], shape[1])(dy, x, w, rstd) is None


@pytest.mark.skipif(
    not tilebook.is_interpreter(),
    reason="a GPU remembers the launch of a declined call itself and asks no stand-in again",
)
@pytest.mark.parametrize("decline", [False, True])
def test_rms_norm_backward_replays_through_the_forward_entry(monkeypatch, decline):
    # A forward that took its remembered launch hands it to the backward; the
    # backward's replay kept on it runs dy as it comes (here 3-D), with no key.
    x = torch.randn(2, 6, 48, device=DEV, requires_grad=True)
    w = (torch.rand(48, device=DEV) + 0.5).requires_grad_()
    forward = _Recorder(_rms_run)
    plan = rn._bwd_plan(x.detach().view(12, 48))
    real = rn._replay_bwd(plan, [_relaunch(*step) for step in plan.launches], 48, 48)
    backward = _Recorder(real, decline)
    forward.backward = (rn.BWD_CHUNKED_THRESHOLD, rn.CHUNK_BWD, backward)
    monkeypatch.setattr(rn, "_FAST_GRAD", _memo(rn._fast_key(x, w), forward))
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    # The backward reads the rstd the forward stand-in made, of its own eps.
    ref = F.rms_norm(xd, (48,), wd, STAND_IN_EPS)
    y = rn.rms_norm(x, w, 1e-6)
    for step in range(2):
        dy = torch.randn_like(x)
        dx, dw = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
        want = torch.autograd.grad(ref, (xd, wd), dy.double(), retain_graph=True)
        assert backward.calls == step + 1 and dx.shape == x.shape
        assert _rel(dx, want[0]) < 1e-5 and _rel(dw, want[1]) < 1e-5
    # Another layout of dy (strided): the ordinary path, the replay is not asked.
    dy = torch.randn(2, 6, 96, device=DEV)[..., ::2]
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    want = torch.autograd.grad(ref, (xd, wd), dy.double())
    assert backward.calls == 2 and _rel(dx, want[0]) < 1e-5 and _rel(dw, want[1]) < 1e-5
