"""The cached direct launch: same results as the JIT, taken only where it is safe."""

from __future__ import annotations

import pytest
import torch
import triton

import tilebook
from tilebook import _launch


def test_spec_covers_what_triton_specialises_on():
    t = torch.empty(8)
    assert _launch._spec(t) == ("t", torch.float32, True)
    assert _launch._spec(t[1:]) == ("t", torch.float32, False)  # 4-byte offset: unaligned
    assert _launch._spec(1) == ("i", True, False, True)
    assert _launch._spec(32) == ("i", False, True, True)
    assert _launch._spec(2**40) == ("i", False, True, False)
    assert _launch._spec(True) == ("b", True)
    assert _launch._spec(0.5) == ("f",)
    assert _launch._spec(None) == ("n",)
    assert _launch._spec("x") is None


@pytest.mark.skipif(tilebook.is_gpu(), reason="CPU behaviour")
def test_interpreter_never_takes_the_direct_path():
    assert not _launch.direct_launch_enabled()
    x = torch.randn(5, 7)
    for _ in range(3):
        tilebook.softmax(x)
    assert not _launch._CACHE


def test_direct_path_is_gated_by_version(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "9.9.0")
    assert not _launch.direct_launch_enabled()


@pytest.mark.gpu
def test_repeat_calls_take_the_direct_path_and_stay_right():
    if not _launch.direct_launch_enabled():
        pytest.skip(f"direct launch not verified for triton {triton.__version__}")
    for _ in range(4):  # fresh tensors each time: new pointers, same specialisation
        x = torch.randn(300, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(300, 1000, device="cuda", dtype=torch.bfloat16)
        y = tilebook.rms_norm(x, w)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        ref = torch.nn.functional.rms_norm(xd, (1000,), wd, 1e-6)
        rdx, rdw = torch.autograd.grad(ref, (xd, wd), dy.double())
        for out, r in ((y, ref), (dx, rdx), (dw, rdw)):
            assert ((out.double() - r).norm() / r.norm()).item() < 1.6e-2
        s = tilebook.softmax(x.detach())
        rs = torch.softmax(x.detach().double(), -1)
        assert ((s.double() - rs).norm() / rs.norm()).item() < 1.6e-2
    direct = [v for v in _launch._CACHE.values() if v]
    assert len(direct) >= 3, "rms_norm fwd/bwd and softmax should launch directly"


@pytest.mark.gpu
def test_matmul_in_a_fresh_thread():
    """A new thread has no current CUDA context; TMA descriptors need one (seen in the
    autograd engine's backward thread)."""
    import threading

    a = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    out: list = []
    errors: list = []

    def work():
        try:
            out.append(tilebook.matmul(a, b))
            out.append(tilebook.matmul(a, b))  # the cached runner, same thread
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    ref = a.double() @ b.double()
    for o in out:
        assert ((o.double() - ref).norm() / ref.norm()).item() < 1.6e-2
