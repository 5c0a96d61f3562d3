"""tilebook._launch: relaunches only what Triton would have compiled the same way,
once per call, on the tensors' GPU."""

from __future__ import annotations

import threading

import pytest
import torch
import triton
import triton.language as tl

import tilebook
from tilebook import _launch


@triton.jit
def _count_kernel(counter_ptr, x_ptr, n, scale, BLOCK: tl.constexpr):
    # Adds 1 to the counter once per launch (program 0 only) and scales x in place.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, x * scale, mask=mask)
    if tl.program_id(0) == 0:
        tl.atomic_add(counter_ptr, 1)


def _argument_samples():
    base = torch.empty(64, dtype=torch.float32)
    ints = [-(2**40), -17, -16, -1, 0, 1, 2, 15, 16, 17, 32, 2**31 - 16, 2**31 - 1, 2**31, 2**40]
    floats = [0.0, 1e-6, 0.5, 1.0, 16.0, 3.0e38, 1e300, float("inf")]
    tensors = [
        base,
        base[1:],
        base[2:],
        base[4:],
        base[8:],
        base[16:],
        base.half(),
        base.half()[8:],
    ]
    return [*ints, *floats, True, False, None, *tensors]


def test_launch_key_is_finer_than_tritons_specialisation():
    """Two arguments with one launch key must be ones Triton compiles alike (asked of
    Triton's own specialisation function, for every pair of samples)."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:  # pragma: no cover - depends on the installed Triton
        pytest.skip(f"triton {triton.__version__} has no native_specialize_impl to ask")

    def triton_says(v):
        return native_specialize_impl(BaseBackend, v, False, True, True)

    samples = _argument_samples()
    for i, a in enumerate(samples):
        for b in samples[i + 1 :]:
            if _launch._arg_key(a) == _launch._arg_key(b):
                assert triton_says(a) == triton_says(b), (a, b)
    # ...and the key is not so fine that aligned tensors never share a launch.
    t = torch.empty(64)
    assert _launch._arg_key(t) == _launch._arg_key(torch.empty(64))
    assert _launch._arg_key(t[1:]) != _launch._arg_key(t)


def test_parameters_are_keyed_like_tensors_and_other_subclasses_not_at_all():
    # A model's weights are nn.Parameters: their launches must be remembered like a
    # plain tensor's.  A subclass may change what the kernel sees: never keyed.
    class Other(torch.Tensor):
        pass

    t = torch.empty(64, dtype=torch.float16)
    p = torch.nn.Parameter(t)
    assert _launch._arg_key(p) == _launch._arg_key(t)
    assert _launch._arg_key(t.as_subclass(Other)) is _launch._UNKEYED
    key = _launch.launch_key(_count_kernel, (1,), (t, p, 64, 2.0), {"BLOCK": 64})
    assert key is not None
    assert _launch.launch_key(_count_kernel, (1,), (t, t.as_subclass(Other), 64, 2.0), {}) is None


@pytest.mark.skipif(tilebook.is_gpu(), reason="CPU behaviour")
def test_interpreter_launches_through_the_jit_only():
    x = torch.ones(10)
    counter = torch.zeros(1, dtype=torch.int32)
    for _ in range(3):
        assert _launch.launch(_count_kernel, (1,), counter, x, 10, 2.0, BLOCK=16) is None
    assert counter.item() == 3
    assert torch.equal(x, torch.full((10,), 8.0))
    assert not _launch._CACHE


def test_memo_starts_over_when_full():
    memo = _launch.Memo(limit=3)
    for i in range(3):
        memo.remember(i, i)
    memo.remember("next", 1)
    assert dict(memo) == {"next": 1}


def test_call_keys_tell_layouts_apart():
    t = torch.empty(4, 64)
    key = _launch.call_key(t, None, None, "op", 3)
    assert key == _launch.call_key(torch.empty(4, 64), None, None, "op", 3)  # same layout
    others = [
        (t.t().contiguous().t(), None, None, "op", 3),  # strides
        (torch.empty(4, 65)[:, 1:], None, None, "op", 3),  # alignment (and strides)
        (torch.empty(65)[1:], None, None, "op", 3),  # shape
        (t.half(), None, None, "op", 3),  # dtype
        (t, t[0], None, "op", 3),  # a parameter present
        (t, None, t[0], "op", 3),  # ... in another place
        (t, None, None, "op", 4),  # a knob
        (t, None, None, "other op", 3),
    ]
    assert all(_launch.call_key(*parts) != key for parts in others)
    misaligned = torch.empty(65)[1:].view(4, 16)
    assert _launch.call_key(misaligned, None, None) != _launch.call_key(
        torch.empty(4, 16), None, None
    )
    p = torch.empty(16)
    assert _launch.call_key(t, p, p[1:]) != _launch.call_key(t, p, p)


def test_a_step_launches_on_every_call():
    device = tilebook.device()
    x = torch.ones(10, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    step = _launch.Step(_count_kernel, (1,), {"BLOCK": 16})
    assert step(counter, x, 10, 2.0) is False  # nothing compiled yet: launched nothing
    for scale in (2.0, 0.5, 4.0):
        step(counter, x, 10, scale) or step.anew(counter, x, 10, scale)
    # The compiled kernel is kept for repeat calls on a GPU; under the interpreter
    # there is none, and every launch is anew.
    assert step(counter, x, 10, 2.0) is tilebook.is_gpu()
    if tilebook.is_gpu():
        torch.cuda.synchronize()
    want = 8.0 if tilebook.is_gpu() else 4.0
    assert counter.item() == (4 if tilebook.is_gpu() else 3)
    assert torch.equal(x, torch.full((10,), want, device=device))


@pytest.mark.gpu
def test_each_call_launches_once_and_repeats_take_the_short_route():
    n = 1000
    x = torch.ones(n, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    grid = (triton.cdiv(n, 256),)
    first = _launch.launch(_count_kernel, grid, counter, x, n, 2.0, BLOCK=256)
    assert isinstance(first, _launch.Launched)
    torch.cuda.synchronize()
    assert counter.item() == 1, "the first launch ran the kernel more than once"
    for i in range(2, 6):
        again = _launch.launch(_count_kernel, grid, counter, x, n, 0.5 if i % 2 else 2.0, BLOCK=256)
        assert again is first, "a repeat call of the same specialisation compiled anew"
        torch.cuda.synchronize()
        assert counter.item() == i
    assert torch.equal(x, torch.full((n,), 2.0, device="cuda"))
    # A different specialisation (unaligned pointer) is a different launch.
    y = torch.ones(n + 1, device="cuda")[1:]
    other = _launch.launch(_count_kernel, grid, counter, y, n, 2.0, BLOCK=256)
    assert other is not first
    # The Launched itself: new tensors, one launch.
    fresh = torch.ones(n, device="cuda")
    assert first(counter, fresh, n, 3.0)
    torch.cuda.synchronize()
    assert counter.item() == 7 and torch.equal(fresh, torch.full((n,), 3.0, device="cuda"))


@pytest.mark.gpu
def test_keyed_alike_means_compiled_alike():
    """Triton's warmup (no launch) says which arguments share a binary."""
    base = torch.empty(4096, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    views = [base, base[4:], base[8:], base[16:], base[32:], base[1:]]
    ints = [1, 2, 16, 17, 32, 2**31 + 16]
    compiled, keys = [], []
    for v in views:
        for n in ints:
            args = (counter, v, n, 1.0)
            compiled.append(_count_kernel.warmup(*args, BLOCK=256, grid=(1,)))
            keys.append(tuple(map(_launch._arg_key, args)))
    for i in range(len(keys)):
        for j in range(len(keys)):
            if keys[i] == keys[j]:
                assert compiled[i] is compiled[j]


@pytest.mark.gpu
def test_pre_run_hook_sends_calls_back_through_the_jit():
    n = 256
    x = torch.ones(n, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    launched = _launch.launch(_count_kernel, (1,), counter, x, n, 1.0, BLOCK=256)
    calls = []
    hook = lambda *args, **kwargs: calls.append(1)
    _count_kernel.pre_run_hooks.append(hook)
    try:
        assert launched(counter, x, n, 1.0) is False  # launched nothing
        _launch.launch(_count_kernel, (1,), counter, x, n, 1.0, BLOCK=256)
    finally:
        _count_kernel.pre_run_hooks.remove(hook)
    torch.cuda.synchronize()
    assert calls == [1] and counter.item() == 2


@pytest.mark.gpu
def test_repeat_calls_remember_and_stay_right():
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
        for t in (x.detach(), y.detach()):
            s, yn = tilebook.softmax(t), tilebook.rms_norm(t, w.detach())
            rs = torch.softmax(t.double(), -1)
            rn_ = torch.nn.functional.rms_norm(t.double(), (1000,), w.detach().double(), 1e-6)
            assert ((s.double() - rs).norm() / rs.norm()).item() < 1.6e-2
            assert ((yn.double() - rn_).norm() / rn_.norm()).item() < 1.6e-2
    relaunchable = {key[0].__name__ for key, v in _launch._CACHE.items() if v}
    assert {"rms_norm_bwd_kernel", "rms_norm_fwd_kernel"} <= relaunchable, relaunchable


@pytest.mark.gpu
def test_matmul_in_a_fresh_thread():
    """A new thread has no current CUDA context; TMA descriptors need one (seen in the
    autograd engine's backward thread)."""
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


@pytest.mark.gpu
def test_repeat_launches_call_a_launch_hook():
    """A profiler's launch hook sees the repeat launches, which otherwise skip
    Triton's runner (tilebook._launch._direct)."""
    knobs = pytest.importorskip("triton.knobs")
    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        tilebook.softmax(x)
    seen = []
    chain = knobs.runtime.launch_enter_hook  # a HookChain in later Tritons, else None

    def hook(metadata):
        seen.append(metadata.get()["name"])

    if chain is None:
        knobs.runtime.launch_enter_hook = hook
    else:
        chain.add(hook)
    try:
        tilebook.softmax(x)
        tilebook.softmax(x)
    finally:
        if chain is None:
            knobs.runtime.launch_enter_hook = None
        else:
            chain.remove(hook)
    assert seen == ["softmax_fwd_kernel"] * 2
    tilebook.softmax(x)  # no hook: the direct route again
    assert len(seen) == 2


@pytest.mark.gpu
def test_repeat_launches_run_on_the_current_stream():
    """A repeat launch goes to the caller's stream: captured into a CUDA graph on a
    side stream, its replay computes from the graph's input as it is at replay."""
    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            tilebook.rms_norm(x, w), tilebook.softmax(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            y, s = tilebook.rms_norm(x, w), tilebook.softmax(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    ref_y = torch.nn.functional.rms_norm(x.double(), (1000,), w.double(), 1e-6)
    ref_s = torch.softmax(x.double(), -1)
    assert ((y.double() - ref_y).norm() / ref_y.norm()).item() < 1.6e-2
    assert ((s.double() - ref_s).norm() / ref_s.norm()).item() < 1.6e-2
