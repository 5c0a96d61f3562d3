"""tilebook.ops.linear_act: every activation against float64 PyTorch, batch dims, errors, AOT."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tilebook
from tilebook.ops import epilogue, matmul_hopper, matmul_kernels
from tilebook.ops import matmul as mm
from tilebook.ops.linear_act import ACTIVATIONS, linear_act

DEV = tilebook.device()
TOL = {
    torch.float32: 1e-5 if tilebook.is_interpreter() else 5e-3,
    torch.float16: 3e-3,
    torch.bfloat16: 1.5e-2,
}
REF_ACT = {
    "none": lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}
needs_tma = pytest.mark.skipif(
    not mm.tma_supported(DEV), reason="no TMA path here (needs Hopper or the interpreter)"
)
# sigmoid of a large negative input overflows exp() in the interpreter's numpy: harmless.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@pytest.fixture
def no_autotuning(monkeypatch):
    """Makes the autotuners refuse to run: a call planned before must not need them."""

    def refuse(*args, **kwargs):
        raise AssertionError("the autotuner ran again")

    def arm():
        for tuner in (matmul_kernels.ptr_autotuned, matmul_hopper.tma_autotuned):
            monkeypatch.setattr(tuner, "run", refuse)

    return arm


def rand(*shape, dtype=torch.float32, scale=1.0):
    return torch.randn(*shape, dtype=dtype, device=DEV) * scale


def reference(x, w, bias, activation):
    b64 = None if bias is None else bias.double()
    return REF_ACT[activation](F.linear(x.double(), w.double(), b64))


def assert_matches(out, x, w, bias, activation):
    ref = reference(x, w, bias, activation)
    assert out.shape == ref.shape
    assert out.dtype == x.dtype
    assert torch.isfinite(out).all(), "unwritten or non-finite output"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOL[x.dtype], f"{activation}: relative error {err:.2e}"


def test_activation_names():
    assert set(ACTIVATIONS) == set(REF_ACT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activations_batched_ragged(activation, with_bias, dtype):
    # Batch dims (2, 3), K = 40 (not a multiple of the 32-wide K tile), N = 33.
    x, w = rand(2, 3, 40, dtype=dtype), rand(33, 40, dtype=dtype, scale=0.3)
    bias = rand(33, dtype=dtype) if with_bias else None
    assert_matches(linear_act(x, w, bias, activation), x, w, bias, activation)


@needs_tma
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_tma_kernel_epilogue(activation):
    # Aligned rows (K, N multiples of 8 at fp16) take the descriptor kernel, B read as W^T.
    x, w, bias = rand(5, 14, 48, dtype=torch.float16), rand(40, 48, dtype=torch.float16), None
    if activation != "none":
        bias = rand(40, dtype=torch.float16)
    out = linear_act(x, w, bias, activation, impl="tma")
    assert_matches(out, x, w, bias, activation)


def test_large_inputs_saturate_cleanly():
    # Pre-activations of +-80: the sigmoid-based forms must give x or 0, not NaN.
    x, w = rand(8, 32, scale=10.0), rand(16, 32)
    for activation in ACTIVATIONS:
        assert_matches(linear_act(x, w, None, activation), x, w, None, activation)


def test_vector_and_layouts():
    w, bias = rand(24, 40), rand(24)
    x1 = rand(40)
    out = linear_act(x1, w, bias, "silu")
    assert out.shape == (24,)
    assert_matches(out, x1, w, bias, "silu")
    # Non-contiguous x (batch dims permuted) and a weight stored transposed.
    x = rand(40, 3, 5).permute(1, 2, 0)
    wt = rand(40, 24).t()
    assert_matches(linear_act(x, wt, bias, "gelu"), x, wt, bias, "gelu")
    assert_matches(linear_act(x, w, bias, "gelu", impl="pointer"), x, w, bias, "gelu")


@pytest.mark.parametrize("impl", ["pointer", "tma"])
def test_planned_call_batched(impl, no_autotuning):
    if impl == "tma" and not mm.tma_supported(DEV):
        pytest.skip("no TMA path here")
    # From the 2nd call on, the plan launches with x and weight themselves (no views)
    # and without the autotuner: batch dimensions, a transposed weight and new tensors
    # each call.
    for call in range(4):
        if call == 1:
            no_autotuning()
        x, bias = rand(2, 7, 48, dtype=torch.float16), rand(40, dtype=torch.float16)
        for w in (rand(40, 48, dtype=torch.float16), rand(48, 40, dtype=torch.float16).t()):
            out = linear_act(x, w, bias, "silu", impl=impl)
            assert_matches(out, x, w, bias, "silu")


def test_copied_input_is_read_afresh():
    # x whose batch dimensions cannot be flattened into a view: every call copies it,
    # and each call's product reads its own copy (new values every call).
    for _ in range(3):
        x, w = rand(3, 40, 5).permute(0, 2, 1)[:, :, ::2], rand(24, 20)
        assert_matches(linear_act(x, w, None, "relu"), x, w, None, "relu")


def test_empty_batch():
    out = linear_act(rand(0, 7, 16), rand(8, 16), rand(8))
    assert out.shape == (0, 7, 8)


def test_bad_inputs():
    x, w, b = rand(4, 16), rand(8, 16), rand(8)
    with pytest.raises(ValueError, match="linear_act: unknown activation 'tanh'"):
        linear_act(x, w, b, "tanh")
    with pytest.raises(ValueError, match="linear_act: unknown activation"):
        linear_act(x, w, b, None)
    with pytest.raises(TypeError, match=r"linear_act: x must be a torch\.Tensor"):
        linear_act(x.tolist(), w, b)
    with pytest.raises(TypeError, match="linear_act: weight has dtype int64"):
        linear_act(x, torch.ones(8, 16, dtype=torch.int64, device=DEV), b)
    with pytest.raises(TypeError, match="linear_act: x and weight must have the same dtype"):
        linear_act(x, w.half(), b)
    with pytest.raises(TypeError, match="linear_act: x and bias must have the same dtype"):
        linear_act(x, w, b.half())
    with pytest.raises(ValueError, match="linear_act: x has 15 features"):
        linear_act(rand(4, 15), w, b)
    with pytest.raises(ValueError, match="linear_act: weight must have 2 dimensions"):
        linear_act(x, rand(16), b)
    with pytest.raises(ValueError, match="linear_act: x must have at least 1 dimension"):
        linear_act(rand(()), w, b)
    with pytest.raises(ValueError, match="linear_act: bias must have shape \\(8,\\)"):
        linear_act(x, w, rand(9))
    with pytest.raises(ValueError, match="linear_act: bias must have 1 dimensions"):
        linear_act(x, w, rand(1, 8))
    with pytest.raises(ValueError, match="linear_act: weight is on meta"):
        linear_act(x, torch.empty(8, 16, device="meta"), b)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(512, 384, 256), (300, 257, 130)])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_bf16_gpu(m, n, k, activation):
    x = rand(2, m // 2, k, dtype=torch.bfloat16)
    w = rand(n, k, dtype=torch.bfloat16, scale=k**-0.5)
    bias = rand(n, dtype=torch.bfloat16)
    assert_matches(linear_act(x, w, bias, activation), x, w, bias, activation)
    assert_matches(linear_act(x, w, None, activation, impl="pointer"), x, w, None, activation)
    if mm.tma_supported(DEV) and k % 8 == 0 and n % 8 == 0:
        assert_matches(linear_act(x, w, bias, activation, impl="tma"), x, w, bias, activation)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["auto", "pointer"])
def test_gpu_planned_call_batched(impl, monkeypatch):
    # After two calls the compiled kernel is started directly: Triton's JIT refuses.
    x, bias = rand(4, 96, 256, dtype=torch.bfloat16), rand(384, dtype=torch.bfloat16)
    w = rand(384, 256, dtype=torch.bfloat16, scale=256**-0.5)
    for call in range(4):
        if call == 2:
            for kernel in (mm.matmul_kernel, mm.matmul_tma_kernel):
                monkeypatch.setattr(kernel, "run", _refuse)
        x.normal_(), w.normal_(std=256**-0.5), bias.normal_()
        assert_matches(linear_act(x, w, bias, "gelu", impl=impl), x, w, bias, "gelu")


def _refuse(*args, **kwargs):
    raise AssertionError("launched through Triton's JIT")


def test_fused_epilogue_compiles_to_wgmma_for_sm90():
    # linear_act's Hopper kernel: W read transposed (B_T), bias + erf GELU in the epilogue.
    for cfg in mm.GPU_TMA_CONFIGS[:1]:
        k = mm.compile_ahead("tma", cfg, "bf16", b_t=True, activation="gelu", has_bias=True)
        assert k.count("HGMMA") > 0, "bf16 dot did not lower to wgmma"
        assert not k.spill_stores_bytes, f"{k.spill_stores_bytes} bytes of register spills"


# --------------------------------------------------------------------------- autograd

GRAD_TOL = {
    torch.float32: 1e-5 if tilebook.is_interpreter() else 5e-3,
    torch.float16: 3e-3,
    torch.bfloat16: 2e-2,
}


def leaf(t, requires_grad=True):
    return None if t is None else t.detach().clone().requires_grad_(requires_grad)


def check_grads(x, w, bias, activation, grads=(True, True, True), impl="auto"):
    """linear_act's gradients against float64 autograd of F.<act>(F.linear(...))."""
    x, w = leaf(x, grads[0]), leaf(w, grads[1])
    bias = leaf(bias, grads[2])
    out = linear_act(x, w, bias, activation, impl=impl)
    assert out.requires_grad
    dy = torch.randn_like(out)
    out.backward(dy)

    x64, w64 = leaf(x.double(), grads[0]), leaf(w.double(), grads[1])
    b64 = None if bias is None else leaf(bias.double(), grads[2])
    ref = REF_ACT[activation](F.linear(x64, w64, b64))
    ref.backward(dy.double())
    assert_matches(out.detach(), x, w, bias, activation)
    for name, got, want in (("x", x, x64), ("weight", w, w64), ("bias", bias, b64)):
        if got is None or not got.requires_grad:
            assert got is None or got.grad is None, f"{name} got a gradient it did not ask for"
            continue
        assert got.grad is not None, f"no gradient for {name}"
        assert got.grad.shape == got.shape and got.grad.dtype == got.dtype
        assert torch.isfinite(got.grad).all(), f"{name}: non-finite gradient"
        err = ((got.grad.double() - want.grad).norm() / want.grad.norm().clamp_min(1e-30)).item()
        assert err < GRAD_TOL[got.dtype], f"{activation}: d{name} relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_grad_batched_ragged(activation, with_bias, dtype):
    # Batch dims (3, 5), K = 33, N = 19: ragged against every tile.
    x, w = rand(3, 5, 33, dtype=dtype), rand(19, 33, dtype=dtype, scale=0.3)
    bias = rand(19, dtype=dtype) if with_bias else None
    check_grads(x, w, bias, activation)


@pytest.mark.parametrize(
    "grads", [(True, False, False), (False, True, False), (False, False, True), (True, False, True)]
)
def test_grad_some_inputs(grads):
    x, w, bias = rand(2, 7, 24), rand(12, 24, scale=0.3), rand(12)
    check_grads(x, w, bias, "silu", grads)


def test_grad_layouts_and_saturation():
    # A vector x, a permuted (non-viewable) x, a transposed weight, and +-80
    # pre-activations, where the sigmoid-based derivatives must stay finite.
    w, bias = rand(24, 40, scale=0.3), rand(24)
    check_grads(rand(40), w, bias, "gelu")
    check_grads(rand(3, 40, 5).permute(0, 2, 1)[:, :, ::2], rand(24, 20), bias, "gelu_tanh")
    check_grads(rand(2, 5, 40), rand(40, 24).t(), bias, "relu")
    for activation in ACTIVATIONS:
        check_grads(rand(8, 32, scale=10.0), rand(16, 32), None, activation)


def test_grad_expanded_upstream_and_chain():
    # y.sum().backward() sends a stride-0 dY; and the op composes with itself.
    x, w1, w2 = (
        leaf(rand(*s, dtype=torch.float16, scale=0.5)) for s in ((6, 16), (20, 16), (8, 20))
    )
    linear_act(linear_act(x, w1, None, "gelu"), w2, None, "silu").sum().backward()
    x64, a64, b64 = (leaf(t.double()) for t in (x, w1, w2))
    F.silu(F.linear(F.gelu(F.linear(x64, a64)), b64)).sum().backward()
    for got, want in ((x, x64), (w1, a64), (w2, b64)):
        err = ((got.grad.double() - want.grad).norm() / want.grad.norm()).item()
        assert err < 5e-3, err


def test_no_grad_keeps_fast_path(no_autotuning):
    # Under no_grad, or with no input that requires grad, the result carries no graph.
    # One plan serves calls with and without grad: planned by the first calls, it
    # needs no autotuner later, and a grad call on it still gets its graph.
    x, w = leaf(rand(4, 32)), rand(16, 32)
    want = (torch.relu(x.detach().double() @ w.double().t()) > 0).double() @ w.double()
    for again in (False, True):
        if again:
            no_autotuning()
        with torch.no_grad():
            out = linear_act(x, w, None, "relu")
        assert not out.requires_grad and out.grad_fn is None
        assert linear_act(x.detach(), w, None, "relu").grad_fn is None
        x.grad = None
        out = linear_act(x, w, None, "relu")
        assert out.grad_fn is not None
        out.sum().backward()
        torch.testing.assert_close(x.grad.double(), want, rtol=1e-5, atol=1e-5)


def test_grad_path_checks_inputs():
    w = leaf(rand(8, 16))
    with pytest.raises(ValueError, match="linear_act: unknown activation 'tanh'"):
        linear_act(rand(4, 16), w, None, "tanh")
    with pytest.raises(ValueError, match="linear_act: x has 15 features"):
        linear_act(rand(4, 15), w)
    with pytest.raises(TypeError, match=r"linear_act: x must be a torch\.Tensor"):
        linear_act([[1.0] * 16], w)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(512, 384, 256), (300, 257, 130)])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_grad_bf16_gpu(m, n, k, activation):
    x = rand(2, m // 2, k, dtype=torch.bfloat16)
    w = rand(n, k, dtype=torch.bfloat16, scale=k**-0.5)
    bias = rand(n, dtype=torch.bfloat16)
    check_grads(x, w, bias, activation)
    check_grads(x, w, None, activation, impl="pointer")
    if mm.tma_supported(DEV) and k % 8 == 0 and n % 8 == 0:
        check_grads(x, w, bias, activation, impl="tma")


@triton.jit
def _activation_probe(x_ptr, y_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, epilogue.activation(x, ACTIVATION), mask=mask)


def _run_activation(x, activation):
    y = torch.empty_like(x)
    block = 1024
    _activation_probe[(triton.cdiv(x.numel(), block),)](
        x, y, x.numel(), ACTIVATION=activation, BLOCK=block
    )
    return y


def test_gelu_epilogue_matches_the_erf_form():
    # The epilogue's GELU is a fitted exp2 form, not erf: hold it to its stated
    # accuracy (6e-7 absolute, 6e-6 relative) in float32 over the whole line.
    x = torch.linspace(-12.0, 12.0, 240_001, device=DEV)
    y = _run_activation(x, "gelu").double()
    x64 = x.double()
    ref = 0.5 * x64 * (1.0 + torch.erf(x64 / 2**0.5))
    err = (y - ref).abs()
    assert err.max().item() < 1e-6
    big = ref.abs() > 1e-6
    assert (err[big] / ref[big].abs()).max().item() < 1e-5
    # Exactly 0 at 0; the positive tail is x itself; infinities stay finite-or-inf.
    special = torch.tensor([0.0, 30.0, float("inf"), -30.0], device=DEV)
    out = _run_activation(special, "gelu").cpu()
    assert out[0].item() == 0.0
    assert out[1].item() == 30.0 and out[2].item() == float("inf")
    assert abs(out[3].item()) < 1e-6


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
def test_sigmoid_activations_match_float64(activation):
    # On a GPU the one-instruction tanh.approx form (measured on an H100: at most 1e-4
    # relatively, 1e-5 absolutely over [-30, 30]); under the interpreter the sigmoid
    # form, at float32's own accuracy.
    x = torch.linspace(-30.0, 30.0, 240_001, device=DEV)
    y = _run_activation(x, activation).double()
    x64 = x.double()
    ref = F.gelu(x64, approximate="tanh") if activation == "gelu_tanh" else F.silu(x64)
    err = (y - ref).abs()
    rel, absolute = (2e-4, 2e-5) if epilogue.HW_TANH.value else (2e-6, 4e-6)
    big = ref.abs() > 1e-2
    assert (err[big] / ref[big].abs()).max().item() < rel
    assert err.max().item() < absolute
    assert epilogue.HW_TANH.value == tilebook.is_gpu()


def test_compiled_for_a_gpu_the_sigmoid_activations_take_one_tanh():
    # Ahead of time (no GPU needed, HW_TANH on in the compiling process): SiLU and the
    # tanh GELU issue one MUFU.TANH a value and no exponential or reciprocal.
    from tilebook.course.aot import compile_many

    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}
    jobs = {
        act: {"kernel": _activation_probe, "constexprs": {"ACTIVATION": act, "BLOCK": 128}}
        for act in ("silu", "gelu_tanh", "gelu")
    }
    compiled = compile_many(jobs, signature=sig, num_warps=4, arch=90)
    for act, k in compiled.items():
        sass = k.stage("sass")
        assert ("MUFU.TANH" in sass) == (act != "gelu"), act
        assert ("MUFU.RCP" in sass) is False, act
    assert "MUFU.EX2" in compiled["gelu"].stage("sass")
