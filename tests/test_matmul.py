"""tilebook.ops.matmul: both kernels against a float64 reference, layouts, repeat calls,
errors, gradients, AOT."""

from __future__ import annotations

import inspect

import pytest
import torch

import tilebook
from tilebook import _launch
from tilebook.ops import matmul as mm
from tilebook.ops import matmul_hopper, matmul_kernels

DEV = tilebook.device()
# fp32: exact products under the interpreter, TF32 on a GPU.  fp16/bf16: output rounding.
TOL = {
    torch.float32: 1e-5 if tilebook.is_interpreter() else 5e-3,
    torch.float16: 3e-3,
    torch.bfloat16: 1.5e-2,
}
HAS_TMA = mm.tma_supported(DEV)
needs_tma = pytest.mark.skipif(
    not HAS_TMA, reason="no TMA path here (needs Hopper or the interpreter)"
)


@pytest.fixture
def no_autotuning(monkeypatch):
    """Makes the autotuners refuse to run: a call planned before must not need them
    (it launches its pick).  Used after a first call of each kind."""

    def refuse(*args, **kwargs):
        raise AssertionError("the autotuner ran again")

    def arm():
        for tuner in (matmul_kernels.ptr_autotuned, matmul_hopper.tma_autotuned):
            monkeypatch.setattr(tuner, "run", refuse)

    return arm


def _picked(kernel, m, n, k):
    return [
        p for p in mm.picked_configs() if (p["kernel"], p["M"], p["N"], p["K"]) == (kernel, m, n, k)
    ]


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEV)


def assert_matches(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    ref = a.double() @ b.double()
    assert out.shape == ref.shape
    assert out.dtype == a.dtype
    assert torch.isfinite(out).all(), "unwritten or non-finite output"
    if ref.numel() == 0:
        return
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOL[a.dtype], f"relative error {err:.2e}"


# M x N x K: single elements, K below and above one tile, ragged everything.
RAGGED = [(1, 1, 16), (1, 1, 1), (5, 7, 3), (17, 33, 40), (33, 17, 100), (64, 64, 64), (48, 24, 72)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "n", "k"), RAGGED)
def test_ragged_shapes(m, n, k, dtype):
    a, b = rand(m, k, dtype=dtype), rand(k, n, dtype=dtype)
    assert_matches(mm.matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_pointer_kernel_forced(dtype):
    a, b = rand(40, 24, dtype=dtype), rand(24, 56, dtype=dtype)
    assert_matches(mm.fused_matmul(a, b, impl="pointer"), a, b)


# Rows 16-byte aligned (fp16: multiples of 8), tiles ragged; 70x72 makes 9 tiles of 32x32
# for the interpreter's 4 persistent programs, so each walks several tiles.
@needs_tma
@pytest.mark.parametrize(("m", "n", "k"), [(1, 8, 16), (17, 40, 24), (70, 72, 40), (64, 64, 64)])
def test_tma_kernel(m, n, k):
    a, b = rand(m, k, dtype=torch.float16), rand(k, n, dtype=torch.float16)
    assert_matches(mm.fused_matmul(a, b, impl="tma"), a, b)


@needs_tma
def test_tma_stages_operands_whose_rows_are_not_aligned():
    # K = 29 and N = 37 halves: no row of A, B or C starts on 16 bytes.  impl="tma" copies
    # A and B to padded rows and writes C through a padded buffer; the second call of
    # the kind repeats that from the cached launch.
    a, b = rand(33, 29, dtype=torch.float16), rand(29, 37, dtype=torch.float16)
    assert mm.tma_layout(a) is None and mm.tma_layout(b) is None
    for _ in range(3):
        a, b = a.normal_(), b.normal_()
        out = mm.fused_matmul(a, b, impl="tma")
        assert out.is_contiguous() and out.stride() == (37, 1)
        assert_matches(out, a, b)
    assert _picked("tma", 33, 37, 29), "the TMA kernel did not run"
    # One operand aligned (read in place, transposed), the other copied; bias + GELU.
    bt = rand(40, 29, dtype=torch.float16).t()  # (29, 40): B^T rows of 29 halves
    at = rand(29, 48, dtype=torch.float16).t()  # (48, 29): A^T rows of 48 halves, aligned
    bias = rand(40, dtype=torch.float16)
    for _ in range(2):
        out = mm.fused_matmul(at, bt, bias, "gelu", impl="tma")
        ref = torch.nn.functional.gelu(at.double() @ bt.double() + bias.double())
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=1e-2)


def test_staging_pads_rows_to_16_bytes():
    for dtype, cols, stride in (
        (torch.float16, 29, 32),
        (torch.float32, 5, 8),
        (torch.float16, 8, 8),
    ):
        t = rand(3, cols, dtype=dtype)
        s = matmul_hopper.aligned_copy(t)
        assert s.shape == t.shape and s.stride() == (stride, 1) and s.data_ptr() % 16 == 0
        assert torch.equal(s, t)
    # Aligned operands are read in place, transposed ones included; offset views are not.
    base = rand(16, 24, dtype=torch.float16)
    assert mm.tma_layout(base) is False and mm.tma_layout(base.t()) is True
    assert mm.tma_layout(base[:, 1:]) is None


def _layouts(m, n, k, dtype):
    """(name, a, b) pairs of the same sizes in different memory layouts."""
    yield "row-major", rand(m, k, dtype=dtype), rand(k, n, dtype=dtype)
    yield "a transposed", rand(k, m, dtype=dtype).t(), rand(k, n, dtype=dtype)
    yield "b transposed", rand(m, k, dtype=dtype), rand(n, k, dtype=dtype).t()
    yield "both transposed", rand(k, m, dtype=dtype).t(), rand(n, k, dtype=dtype).t()
    yield (
        "strided slices",
        rand(2 * m, 3 * k, dtype=dtype)[::2, 1::3],
        rand(k, 2 * n, dtype=dtype)[:, ::2],
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_contiguous(dtype):
    for name, a, b in _layouts(33, 24, 40, dtype):
        out = mm.matmul(a, b)
        assert out.is_contiguous()
        try:
            assert_matches(out, a, b)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@needs_tma
def test_tma_transposed_operands():
    # All four A_T / B_T combinations of the descriptor kernel.
    for name, a, b in list(_layouts(40, 48, 32, torch.float16))[:4]:
        assert mm.tma_layout(a) is not None, name
        assert mm.tma_layout(b) is not None, name
        try:
            assert_matches(mm.fused_matmul(a, b, impl="tma"), a, b)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


def test_second_call_skips_the_autotuner(no_autotuning):
    # The first call reports the autotuner's pick; later ones launch it without the
    # autotuner (which refuses to run after the first calls).
    a, b = rand(40, 24, dtype=torch.float16), rand(24, 56, dtype=torch.float16)
    impls = ["pointer", "tma"] if HAS_TMA else ["pointer"]
    for impl in impls:
        assert_matches(mm.fused_matmul(a, b, impl=impl), a, b)
        assert _picked(impl, 40, 56, 24), impl
    no_autotuning()
    for impl in impls:
        for _ in range(2):
            assert_matches(mm.fused_matmul(a, b, impl=impl), a, b)


@pytest.mark.parametrize("impl", ["pointer", "tma"])
def test_planned_call_every_layout(impl, no_autotuning):
    if impl == "tma" and not HAS_TMA:
        pytest.skip("no TMA path here")
    count = 4 if impl == "tma" else 5  # the descriptor kernel takes no strided slices
    # The 1st call of a layout autotunes, the 2nd launches the pick through the JIT and
    # keeps the compiled kernel, the 3rd and 4th start it directly, each time with new
    # tensors that it must read.
    for call in range(4):
        if call == 1:
            no_autotuning()
        for name, a, b in list(_layouts(40, 48, 32, torch.float16))[:count]:
            try:
                assert_matches(mm.fused_matmul(a, b, impl=impl), a, b)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from exc


def test_planned_call_takes_new_tensors(no_autotuning):
    a, b, bias = rand(20, 32), rand(32, 24), rand(24)
    for call in range(4):
        if call == 1:
            no_autotuning()
        a.normal_(), b.normal_(), bias.normal_()
        a_new, b_new, bias_new = a.clone(), b.clone(), bias.clone()  # new storage each call
        out = mm.fused_matmul(a_new, b_new, bias_new, "relu")
        ref = torch.relu(a_new.double() @ b_new.double() + bias_new.double())
        assert ((out.double() - ref).norm() / ref.norm()).item() < TOL[torch.float32]


def test_strided_bias_is_read_as_it_is():
    # A bias with stride 2: copied for the kernel on every call, never read in place.
    a, b = rand(20, 32), rand(32, 24)
    for _ in range(3):
        bias = rand(48)[::2]
        out = mm.fused_matmul(a, b, bias, "relu")
        ref = torch.relu(a.double() @ b.double() + bias.double())
        assert ((out.double() - ref).norm() / ref.norm()).item() < TOL[torch.float32]


def test_cached_call_keeps_checks():
    a, b = rand(8, 16), rand(16, 4)
    for _ in range(3):
        assert_matches(mm.matmul(a, b), a, b)
    with pytest.raises(TypeError, match="matmul: a and b must have the same dtype"):
        mm.matmul(a, b.half())
    with pytest.raises(ValueError, match="matmul: inner dimensions differ"):
        mm.matmul(a, rand(15, 4))
    with pytest.raises(ValueError, match="fused_matmul: unknown activation"):
        mm.fused_matmul(a, b, activation=["relu"])  # unhashable: no key, same message
    with pytest.raises(ValueError, match="impl must be"):
        mm.fused_matmul(a, b, impl=["tma"])
    with pytest.raises(TypeError, match=r"fused_matmul: bias must be a torch\.Tensor"):
        mm.fused_matmul(a, b, [0.0] * 4)


def test_misaligned_view_takes_its_own_path():
    # Same shape and strides as a cached call, but a data pointer off by one element:
    # alignment is part of the key (Triton specialises on it, TMA requires it).
    a, b = rand(40, 24, dtype=torch.float16), rand(24, 56, dtype=torch.float16)
    for _ in range(3):
        assert_matches(mm.matmul(a, b), a, b)
    shifted = rand(40 * 24 + 1, dtype=torch.float16)[1:].view(40, 24)
    assert shifted.data_ptr() % 16
    for _ in range(3):
        assert_matches(mm.matmul(shifted, b), shifted, b)


def test_runtime_arguments_then_constexprs_fill_the_signature():
    # A relaunch passes every parameter positionally: the runtime arguments that
    # tma_args / ptr_args build, then the constexprs the launch took by name.
    from tilebook._launch import _bound

    t = rand(16, 16, dtype=torch.float16)
    blocks = ([16, 16],) * 3
    cases = [
        (
            mm.matmul_tma_kernel,
            matmul_hopper.tma_args(16, 16, 16, False, True, (16, 1), (1, 16), (16, 1), blocks),
        ),
        (mm.matmul_kernel, matmul_kernels.ptr_args(16, 16, 16, (16, 1), (16, 1), (16, 1))),
    ]
    for kernel, make in cases:
        args = make(t, t, t, None)
        params = inspect.signature(kernel.fn).parameters
        constexprs = {n: 0 for n, p in params.items() if "constexpr" in str(p.annotation)}
        tail = _bound(kernel, args, constexprs)
        assert tail is not None and len(args) + len(tail) == len(params)
        assert list(params)[len(args) :] == list(constexprs)


def test_empty_and_k_zero():
    assert mm.matmul(rand(0, 8), rand(8, 5)).shape == (0, 5)
    assert mm.matmul(rand(4, 8), rand(8, 0)).shape == (4, 0)
    out = mm.matmul(rand(4, 0, dtype=torch.float16), rand(0, 6, dtype=torch.float16))
    assert out.shape == (4, 6)
    assert out.dtype == torch.float16
    assert (out == 0).all()


def test_fused_epilogue():
    a, b, bias = rand(20, 32), rand(32, 24), rand(24)
    out = mm.fused_matmul(a, b, bias, "relu")
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL[torch.float32]


def test_bad_inputs():
    a, b = rand(8, 16), rand(16, 4)
    with pytest.raises(TypeError, match=r"matmul: a must be a torch\.Tensor"):
        mm.matmul([[1.0]], b)
    with pytest.raises(TypeError, match="matmul: b has dtype int32"):
        mm.matmul(a, torch.ones(16, 4, dtype=torch.int32, device=DEV))
    with pytest.raises(TypeError, match="matmul: a and b must have the same dtype"):
        mm.matmul(a, b.half())
    with pytest.raises(ValueError, match="matmul: inner dimensions differ"):
        mm.matmul(rand(2, 8, 15), b)  # batched: torch.matmul's shapes, checked alike
    with pytest.raises(ValueError, match="matmul: inner dimensions differ"):
        mm.matmul(a, rand(15, 4))
    with pytest.raises(ValueError, match="matmul: a is on meta"):
        mm.matmul(torch.empty(8, 16, device="meta"), b)
    with pytest.raises(ValueError, match="fused_matmul: unknown activation 'tanh'"):
        mm.fused_matmul(a, b, activation="tanh")
    with pytest.raises(ValueError, match="fused_matmul: bias must have shape"):
        mm.fused_matmul(a, b, rand(5))
    with pytest.raises(ValueError, match="impl='tma' needs 16-bit operands"):
        mm.fused_matmul(a, b, impl="tma")  # float32 never takes the TMA kernel


def test_configs_keep_dot_legal():
    configs = mm.GPU_PTR_CONFIGS + mm.GPU_TMA_CONFIGS
    configs += mm.INTERPRETER_PTR_CONFIGS + mm.INTERPRETER_TMA_CONFIGS
    for cfg in configs:
        assert cfg.kwargs["BLOCK_K"] >= 16, cfg  # tl.dot needs K tiles of at least 16
    for cfg in mm.GPU_TMA_CONFIGS:
        assert matmul_kernels.fits(cfg, 2), cfg  # every Hopper config fits in shared memory at bf16


def _tma_ok(a, b) -> bool:
    return HAS_TMA and mm.tma_layout(a) is not None and mm.tma_layout(b) is not None


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(512, 384, 256), (300, 520, 200), (255, 257, 130)])
def test_bf16_gpu(m, n, k):
    for name, a, b in _layouts(m, n, k, torch.bfloat16):
        try:
            assert_matches(mm.matmul(a, b), a, b)
            assert_matches(mm.fused_matmul(a, b, impl="pointer"), a, b)
            if _tma_ok(a, b):
                assert_matches(mm.fused_matmul(a, b, impl="tma"), a, b)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.gpu
def test_bf16_gpu_large_odd_product_is_staged_for_tma():
    # Rows of 2045 and 2049 halves: not 16-byte aligned; above STAGE_MIN_MACS "auto"
    # stages them for the TMA kernel (H100), or keeps the pointer kernel elsewhere.
    m, n, k = 2047, 2049, 2045
    assert m * n * k >= mm.STAGE_MIN_MACS
    a, b = rand(m, k, dtype=torch.bfloat16), rand(k, n, dtype=torch.bfloat16)
    for _ in range(2):
        out = mm.matmul(a, b)
        assert out.is_contiguous()
        assert_matches(out, a, b)
    kernels = {p["kernel"] for p in mm.picked_configs() if (p["M"], p["N"], p["K"]) == (m, n, k)}
    assert kernels == ({"tma"} if HAS_TMA else {"pointer"})


@pytest.mark.gpu
def test_bf16_gpu_large_takes_tma():
    # Enough 128x256 tiles for "auto" to pick the TMA kernel on a Hopper GPU.
    a, b = rand(4096, 128, dtype=torch.bfloat16), rand(128, 4096 + 8, dtype=torch.bfloat16)
    assert_matches(mm.matmul(a, b), a, b)


@pytest.mark.gpu
def test_gpu_planned_call_launches_directly(monkeypatch):
    # After two calls the compiled kernel is started directly: neither the autotuner
    # nor Triton's JIT (JITFunction.run, refusing from then on) is called.
    a, b = rand(512, 256, dtype=torch.bfloat16), rand(256, 384, dtype=torch.bfloat16)
    for _ in range(2):
        assert_matches(mm.matmul(a, b), a, b)

    def refuse(*args, **kwargs):
        raise AssertionError("launched through Triton's JIT")

    for kernel in (mm.matmul_kernel, mm.matmul_tma_kernel):
        monkeypatch.setattr(kernel, "run", refuse)
    for _ in range(2):
        a.normal_(), b.normal_()
        assert_matches(mm.matmul(a, b), a, b)
    with torch.cuda.stream(torch.cuda.Stream()):  # the current stream, read on every call
        out = mm.matmul(a, b)
    torch.cuda.synchronize()
    assert_matches(out, a, b)


@pytest.mark.gpu
def test_fp32_and_fp16_gpu_large():
    for dtype in (torch.float16, torch.float32):
        a, b = rand(1000, 600, dtype=dtype), rand(600, 1100, dtype=dtype)
        assert_matches(mm.matmul(a, b), a, b)


# Ahead-of-time compilation for an H100 (no GPU needed): the bf16 tiles must lower to
# wgmma (HGMMA in SASS), without register spills.
@pytest.mark.parametrize("kernel", ["tma", "pointer"])
def test_compiles_to_wgmma_for_sm90(kernel):
    cfg = (mm.GPU_TMA_CONFIGS if kernel == "tma" else mm.GPU_PTR_CONFIGS)[0]
    k = mm.compile_ahead(kernel, cfg, "bf16")
    assert k.stages["sass"], "no SASS came back"
    assert k.count("HGMMA") > 0, "bf16 dot did not lower to wgmma"
    assert not k.spill_stores_bytes, f"{k.spill_stores_bytes} bytes of register spills"
    if kernel == "tma":
        assert k.count("UTMALDG") > 0, "tiles are not loaded by the copy engine"


# --------------------------------------------------------------------------- gradients

GRAD_TOL = {torch.float32: 1e-5 if tilebook.is_interpreter() else 5e-3, torch.float16: 5e-3}
GRAD_TOL[torch.bfloat16] = 2e-2


def _leaf(t, requires_grad=True):
    return None if t is None else t.detach().clone().requires_grad_(requires_grad)


def check_matmul_grads(a, b, bias=None, activation="none", grads=(True, True, True), op=None):
    """Gradients of tilebook's product against float64 autograd of the same expression.

    ``a`` and ``b`` keep their layout (transposed or strided views stay views): the
    leaves are made first, then viewed as the caller's tensors were.
    """

    def as_leaf(t, want):
        base = t
        while base._base is not None:
            base = base._base
        leaf = _leaf(base, want)
        return leaf.as_strided(t.shape, t.stride(), t.storage_offset()), leaf

    (a_in, a_leaf), (b_in, b_leaf) = as_leaf(a, grads[0]), as_leaf(b, grads[1])
    bias_leaf = _leaf(bias, grads[2])
    if op == "matmul":
        out = tilebook.matmul(a_in, b_in)
    else:
        out = mm.fused_matmul(a_in, b_in, bias_leaf, activation)
    assert out.requires_grad and out.grad_fn is not None, "the product dropped its graph"
    dc = torch.randn_like(out)
    out.backward(dc)

    a64, b64 = _leaf(a_leaf.double(), grads[0]), _leaf(b_leaf.double(), grads[1])
    bias64 = _leaf(None if bias is None else bias_leaf.double(), grads[2])
    ref = a64.as_strided(a.shape, a.stride(), a.storage_offset()) @ b64.as_strided(
        b.shape, b.stride(), b.storage_offset()
    )
    if bias64 is not None:
        ref = ref + bias64
    ref = {"none": lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu}[activation](
        ref
    )
    ref.backward(dc.double())
    for name, got, want in (("a", a_leaf, a64), ("b", b_leaf, b64), ("bias", bias_leaf, bias64)):
        if got is None or not got.requires_grad:
            assert got is None or got.grad is None, f"{name} got a gradient it did not ask for"
            continue
        assert got.grad is not None, f"no gradient for {name}"
        assert got.grad.dtype == got.dtype and got.grad.shape == got.shape
        err = ((got.grad.double() - want.grad).norm() / want.grad.norm().clamp_min(1e-30)).item()
        assert err < GRAD_TOL[got.dtype], f"d{name}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (5, 7, 3), (17, 33, 40), (48, 24, 72)])
def test_matmul_grad_ragged(m, n, k, dtype):
    check_matmul_grads(rand(m, k, dtype=dtype), rand(k, n, dtype=dtype), op="matmul")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul_grad_layouts(dtype):
    # Transposed and strided operands: dA and dB land in the layout of the leaves.
    for name, a, b in _layouts(19, 24, 33, dtype):
        try:
            check_matmul_grads(a, b, op="matmul")
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.parametrize(
    "grads", [(True, False, False), (False, True, False), (False, False, True), (True, True, True)]
)
def test_fused_matmul_grad_bias_and_some_inputs(grads):
    a, b, bias = rand(21, 30), rand(30, 17), rand(17)
    check_matmul_grads(a, b, bias, grads=grads)


@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_fused_matmul_grad_through_activation(activation):
    check_matmul_grads(rand(13, 24, dtype=torch.float16), rand(24, 9, dtype=torch.float16),
                       rand(9, dtype=torch.float16), activation)  # fmt: skip


def test_matmul_grad_expanded_upstream_and_chain():
    # .sum().backward() sends a stride-0 dC; and products chain.
    a, b, c = (_leaf(rand(*s)) for s in ((6, 16), (16, 20), (20, 8)))
    tilebook.matmul(tilebook.matmul(a, b), c).sum().backward()
    a64, b64, c64 = (_leaf(t.double()) for t in (a, b, c))
    (a64 @ b64 @ c64).sum().backward()
    for got, want in ((a, a64), (b, b64), (c, c64)):
        err = ((got.grad.double() - want.grad).norm() / want.grad.norm()).item()
        assert err < GRAD_TOL[torch.float32], err


def test_matmul_no_grad_keeps_fast_path(no_autotuning):
    # One plan serves calls with and without grad: planned by the first calls, it
    # needs no autotuner later, and a grad call on it still gets its graph.
    a, b = _leaf(rand(8, 16)), rand(16, 4)
    for _ in range(2):  # the 2nd time: every product (the backward's too) is planned
        if _:
            no_autotuning()
        with torch.no_grad():
            out = tilebook.matmul(a, b)
        assert out.grad_fn is None and not out.requires_grad
        a.grad = None
        out = tilebook.matmul(a, b)
        assert out.grad_fn is not None
        out.sum().backward()
        torch.testing.assert_close(a.grad, b.sum(1).expand(8, 16))


def test_matmul_grad_path_checks_inputs():
    a = _leaf(rand(4, 16))
    with pytest.raises(ValueError, match="matmul: inner dimensions differ"):
        tilebook.matmul(a, rand(15, 3))
    with pytest.raises(TypeError, match="matmul: a and b must have the same dtype"):
        tilebook.matmul(a, rand(16, 3, dtype=torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(512, 384, 256), (300, 257, 130)])
def test_matmul_grad_bf16_gpu(m, n, k):
    for name, a, b in _layouts(m, n, k, torch.bfloat16):
        try:
            check_matmul_grads(a, b, op="matmul")
            check_matmul_grads(a, b, rand(n, dtype=torch.bfloat16), "silu")
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


# ----------------------------------------------------- torch.matmul's shapes and TF32


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((3, 5, 24), (24, 7)),  # a batch times one matrix: one product of 15 rows
        ((2, 3, 5, 24), (24, 7)),
        ((3, 5, 24), (3, 24, 7)),  # a batch of products
        ((2, 1, 5, 24), (3, 24, 7)),  # broadcast batch dimensions
        ((5, 24), (4, 24, 7)),
        ((24,), (24, 7)),  # a vector times a matrix
        ((5, 24), (24,)),  # a matrix times a vector
        ((3, 5, 24), (24,)),
        ((24,), (3, 24, 7)),
    ],
)
def test_matmul_takes_torch_matmul_shapes(sa, sb):
    a, b = rand(*sa), rand(*sb)
    out = mm.matmul(a, b)
    ref = torch.matmul(a.double(), b.double())
    assert out.shape == ref.shape and out.dtype == a.dtype
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < TOL[torch.float32], f"relative error {err:.2e}"


def test_batched_matmul_gradients_match_float64():
    a = rand(2, 1, 5, 24).requires_grad_()
    b = rand(3, 24, 7).requires_grad_()
    dc = rand(2, 3, 5, 7)
    got = torch.autograd.grad(mm.matmul(a, b), (a, b), dc)
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    want = torch.autograd.grad(torch.matmul(a64, b64), (a64, b64), dc.double())
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert ((g.double() - w).norm() / w.norm()).item() < TOL[torch.float32]


def test_batched_matmul_refuses_what_torch_refuses():
    with pytest.raises(ValueError, match="inner dimensions differ"):
        mm.matmul(rand(3, 5, 24), rand(3, 23, 7))
    with pytest.raises(ValueError, match="do not broadcast"):
        mm.matmul(rand(2, 5, 24), rand(3, 24, 7))
    with pytest.raises(ValueError, match="at least one dimension"):
        mm.matmul(rand(()), rand(24, 7))
    with pytest.raises(TypeError):
        mm.matmul(rand(3, 5, 24), [[1.0]])


@pytest.fixture
def tf32():
    """Sets ``torch.backends.cuda.matmul.allow_tf32`` (a property monkeypatch cannot
    restore) and puts it back."""
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    yield lambda on: setattr(flags, "allow_tf32", on)
    flags.allow_tf32 = before


def test_float32_follows_allow_tf32(tf32, monkeypatch):
    """TF32 only where torch.matmul would take it; the flag is part of a call's key,
    so a planned call does not keep the other setting (under the interpreter every
    planned call goes through tilebook._launch.launch, which a spy watches)."""
    seen, real = [], _launch.launch

    def spy(kernel, grid, *args, **meta):
        seen.append(meta.get("F32_DOT"))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(_launch, "launch", spy)
    a, b = rand(8, 16), rand(16, 8)
    for allowed, want in ((False, "ieee"), (True, "tf32"), (False, "ieee")):
        tf32(allowed)
        assert mm.f32_dot(torch.float32) == want
        assert mm.f32_dot(torch.bfloat16) == "tf32"  # 16-bit operands: the flag is moot
        seen.clear()
        for _ in range(2):
            assert_matches(mm.matmul(a, b), a, b)
        assert want in {p["kwargs"]["F32_DOT"] for p in _picked("pointer", 8, 8, 16)}
        if tilebook.is_interpreter():
            assert seen and set(seen) == {want}, seen


@pytest.mark.gpu
def test_float32_without_tf32_is_float32_on_the_gpu(tf32):
    a, b = rand(512, 768), rand(768, 384)
    ref = a.double() @ b.double()

    def err(allowed):
        tf32(allowed)
        return ((mm.matmul(a, b).double() - ref).norm() / ref.norm()).item()

    full, tf32 = err(False), err(True)
    assert full < 1e-5 < tf32 < 5e-3, (full, tf32)


@pytest.mark.gpu
def test_batched_matmul_compiles_to_one_graph():
    a, b = rand(2, 3, 64, 32, dtype=torch.bfloat16), rand(3, 32, 48, dtype=torch.bfloat16)
    torch._dynamo.reset()
    got = torch.compile(mm.matmul, fullgraph=True)(a, b)
    want = torch.matmul(a.double(), b.double())
    assert ((got.double() - want).norm() / want.norm()).item() < TOL[torch.bfloat16]
