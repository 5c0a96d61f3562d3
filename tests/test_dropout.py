"""Dropout: the mask against an independent Philox in numpy, statistics, autograd, checks.

The reference below re-derives the mask from the definition in the module
docstring (Philox4x32-10 as Triton implements it, word ``(i % 4096) // 1024`` of
counter ``(i // 4096) * 1024 + i % 1024``).  The same reference is checked against
the interpreter (CPU) and the compiled kernel (GPU), so the two produce the same
stream for the same seed.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import tilebook
from tilebook.course.aot import compile_kernel
from tilebook.ops.dropout import GROUP, MAX_NUMEL, SUB, dropout, launch_dropout

_M32 = np.uint64(0xFFFFFFFF)


def _philox4x32_10(seed: int, counters: np.ndarray) -> np.ndarray:
    """The four 32-bit words of Philox4x32-10 per counter (Salmon et al., 2011), with
    the key (seed low, seed high) and counter (c, 0, 0, 0) as in ``tl.randint4x``."""
    c0 = counters.astype(np.uint64)
    c1 = np.zeros_like(c0)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    mul_a, mul_b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        pa, pb = mul_a * c0, mul_b * c2  # exact: both factors < 2**32
        c0, c1, c2, c3 = (
            (pb >> np.uint64(32)) ^ c1 ^ k0,
            pb & _M32,
            (pa >> np.uint64(32)) ^ c3 ^ k1,
            pa & _M32,
        )
        k0 = (k0 + np.uint64(0x9E3779B9)) & _M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _M32
    return np.stack([c0, c1, c2, c3])


def reference_keep(numel: int, p: float, seed: int) -> torch.Tensor:
    i = np.arange(numel, dtype=np.uint64)
    counters = (i // np.uint64(GROUP)) * np.uint64(SUB) + i % np.uint64(SUB)
    words = _philox4x32_10(seed, counters)[
        (i % np.uint64(GROUP)) // np.uint64(SUB), np.arange(numel)
    ]
    threshold = min(round(p * 2.0**32), 2**32 - 1)
    return torch.from_numpy(words >= np.uint64(threshold))


def _keep_of(y: torch.Tensor) -> torch.Tensor:
    return (y != 0).reshape(-1).cpu()


def test_constants_define_the_mask():
    assert (SUB, GROUP) == (1024, 4096)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("numel", "seed"), [(1, 0), (4095, 7), (4097, 2**40 + 3), (10000, 123)])
def test_mask_matches_numpy_philox(device, dtype, numel, seed):
    x = torch.ones(numel, device=device, dtype=dtype)
    y = dropout(x, 0.3, seed=seed)
    assert torch.equal(_keep_of(y), reference_keep(numel, 0.3, seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_values_match_float64(device, dtype):
    p = 0.2
    x = torch.randn(3, 50, 41, device=device).to(dtype)
    y = dropout(x, p, seed=99)
    keep = reference_keep(x.numel(), p, 99).reshape(x.shape).to(device)
    want = torch.where(keep, x.double() / (1 - p), 0.0)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(
        y.double(), want, atol=1e-3 if dtype == torch.float16 else 1e-6, rtol=1e-3
    )


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_fraction(device, p):
    n = 3 * GROUP * 4
    y = dropout(torch.ones(n, device=device), p, seed=2024)
    dropped = (y == 0).double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(dropped - p) < 5 * sigma, (dropped, p)
    # Every kept element is scaled by exactly 1 / (1 - p).
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)))


def test_words_are_not_correlated_across_runs(device):
    """Adjacent runs of SUB elements share a Philox call: their masks must still be
    independent (the fraction kept in both is p_keep**2)."""
    n = GROUP * 4
    keep = _keep_of(dropout(torch.ones(n, device=device), 0.5, seed=5)).view(-1, 4, SUB)
    both = (keep[:, 0] & keep[:, 1]).double().mean().item()
    assert abs(both - 0.25) < 5 * math.sqrt(0.25 * 0.75 / (n // 4))


def test_same_seed_same_mask_other_seed_other_mask(device):
    x = torch.randn(77, 130, device=device)
    a, b = dropout(x, 0.5, seed=1), dropout(x, 0.5, seed=1)
    assert torch.equal(a, b)
    c = dropout(x, 0.5, seed=2)
    assert not torch.equal(_keep_of(a), _keep_of(c))
    # The mask belongs to the seed and the position, not to x's values.
    d = dropout(x * 3 + 1, 0.5, seed=1)
    assert torch.equal(_keep_of(d), _keep_of(a))


def test_seed_none_follows_torch_manual_seed(device):
    x = torch.ones(5000, device=device)
    torch.manual_seed(3)
    a = dropout(x, 0.5)
    b = dropout(x, 0.5)
    torch.manual_seed(3)
    a2 = dropout(x, 0.5)
    assert torch.equal(a, a2)
    assert not torch.equal(a, b)  # each call draws a fresh seed


def test_backward_regenerates_the_mask(device):
    p, seed = 0.4, 11
    x = torch.randn(33, 70, device=device, requires_grad=True)
    y = dropout(x, p, seed=seed)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    keep = reference_keep(x.numel(), p, seed).reshape(x.shape).to(device)
    torch.testing.assert_close(y, torch.where(keep, x.detach() / (1 - p), 0.0))
    torch.testing.assert_close(dx, torch.where(keep, dy / (1 - p), 0.0))


def test_backward_with_strided_dy(device):
    p = 0.25
    x = torch.randn(20, 30, device=device, requires_grad=True)
    y = dropout(x, p, seed=8)
    y.sum().backward()  # a stride-0 dy
    keep = reference_keep(x.numel(), p, 8).reshape(x.shape).to(device)
    torch.testing.assert_close(x.grad, keep.float() / (1 - p))


def test_strided_input_takes_the_mask_of_its_shape(device):
    base = torch.randn(40, 60, device=device)
    t = base.t()  # not contiguous: copied, numbered in row-major order of its shape
    y = dropout(t, 0.5, seed=4)
    assert y.shape == t.shape
    assert torch.equal(y, dropout(t.contiguous(), 0.5, seed=4))
    z = dropout(base[:, ::3], 0.5, seed=4)
    assert torch.equal(z, dropout(base[:, ::3].contiguous(), 0.5, seed=4))


def test_identity_and_zeros(device):
    x = torch.randn(10, 10, device=device, requires_grad=True)
    assert dropout(x, 0.0, seed=1) is x
    assert dropout(x, 0.7, training=False) is x
    y = dropout(x, 1.0, seed=1)
    assert torch.equal(y, torch.zeros_like(y))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    # Even infinities are dropped to zero, not 0 * inf = NaN.
    inf = torch.full((5,), float("inf"), device=device)
    assert torch.equal(dropout(inf, 1.0, seed=1), torch.zeros_like(inf))


def test_empty_and_scalar(device):
    e = torch.empty(0, 4, device=device)
    assert dropout(e, 0.5, seed=1).shape == (0, 4)
    s = torch.tensor(2.0, device=device)
    out = dropout(s, 0.5, seed=0)
    assert out.shape == () and out.item() in (0.0, 4.0)


def test_errors(device):
    x = torch.randn(4, 4, device=device)
    with pytest.raises(TypeError, match=r"dropout: x must be a torch\.Tensor"):
        dropout(x.tolist(), 0.5)
    with pytest.raises(TypeError, match="dropout: x has dtype int64"):
        dropout(x.long(), 0.5)
    for p in (-0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"dropout: p must be a probability in \[0, 1\]"):
            dropout(x, p)
    for p in ("0.5", None, True, torch.tensor(0.5)):
        with pytest.raises(TypeError, match="dropout: p must be a float"):
            dropout(x, p)
    for seed in (1.5, "1", True):
        with pytest.raises(TypeError, match="dropout: seed must be an int or None"):
            dropout(x, 0.5, seed=seed)
    for seed in (-1, 2**63):
        with pytest.raises(ValueError, match=r"dropout: seed must be in \[0, 2\*\*63\)"):
            dropout(x, 0.5, seed=seed)
    # Checked even where the seed is not used.
    with pytest.raises(ValueError, match="dropout: seed must be in"):
        dropout(x, 0.5, seed=-1, training=False)
    with pytest.raises(TypeError, match="dropout: training must be a bool"):
        dropout(x, 0.5, training=1)
    with pytest.raises(ValueError, match="launch_dropout: x must be contiguous"):
        launch_dropout(x.t(), 0.5, 1)


def test_too_many_elements(device):
    # Stride 0: as many elements as that, with no memory behind them.
    big = torch.zeros(1, device=device).expand(MAX_NUMEL + 1)
    with pytest.raises(ValueError, match=f"dropout supports at most {MAX_NUMEL}"):
        dropout(big, 0.5, seed=1)


def test_wrong_device():
    other = "cpu" if tilebook.is_gpu() else "meta"
    with pytest.raises(ValueError, match="dropout: x is on"):
        dropout(torch.empty(4, device=other), 0.5)


def test_repeat_calls_follow_seed_and_p(device):
    """The second call of a kind takes the plan of the first (on a GPU, its compiled
    launch), with its own seed and p (small and large seeds are different integer
    widths)."""
    x = torch.ones(3 * GROUP + 11, device=device)
    for seed, p in ((1, 0.5), (2, 0.5), (2**40, 0.25), (2**40 + 1, 0.75), (3, 1.0)):
        y = dropout(x, p, seed=seed)
        assert torch.equal(_keep_of(y), reference_keep(x.numel(), p, seed)), (seed, p)
        if p < 1:
            assert torch.all(y[y != 0] == torch.tensor(1 / (1 - p), device=device))


def test_launch_configuration_does_not_change_the_mask(device):
    x = torch.randn(3 * GROUP + 5, device=device)
    want = launch_dropout(x, 0.5, 77)
    for groups, warps in ((2, 4), (4, 8), (1, 1)):
        assert torch.equal(launch_dropout(x, 0.5, 77, groups=groups, num_warps=warps), want)


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_stream_matches_the_reference(device):
    """The compiled kernel draws the interpreter's numbers (both match numpy), in bf16."""
    n = 2**20 + 333
    x = torch.ones(n, device=device, dtype=torch.bfloat16)
    for seed in (0, 12345, 2**62 + 1):
        assert torch.equal(_keep_of(dropout(x, 0.5, seed=seed)), reference_keep(n, 0.5, seed))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 4096), (1000, 3000)])
def test_gpu_forward_and_backward_masks_agree(device, shape):
    p = 0.1
    x = (torch.rand(shape, device=device) + 0.5).to(torch.bfloat16).requires_grad_()
    y = dropout(x, p, seed=31337)
    dy = (torch.rand(shape, device=device) + 0.5).to(torch.bfloat16)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    assert torch.equal(y != 0, dx != 0)
    keep = y != 0
    dropped = 1 - keep.double().mean().item()
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / keep.numel())
    torch.testing.assert_close(
        y[keep].float(), (x.detach()[keep].float() / (1 - p)).bfloat16().float()
    )
    torch.testing.assert_close(dx[keep].float(), (dy[keep].float() / (1 - p)).bfloat16().float())


# ---------------------------------------------------------------------------
# Compiled for sm_90
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_compiles_for_sm90_without_spills(dtype):
    sig = {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "n": "i32", "seed": "i64",
           "thr_bits": "i32", "scale": "fp32"}  # fmt: skip
    k = compile_kernel(
        "tilebook.ops.dropout:dropout_kernel",
        sig,
        {"SUB": SUB, "GROUPS": 1},
        arch=90,
        num_warps=4,
        divisible_by_16=["x_ptr", "y_ptr", "n"],
    )
    ptx = k.stages["ptx"]
    assert ".target sm_90" in ptx
    # 16-byte loads and stores, and Philox's 32x32-bit multiplies.
    assert re.search(r"\bld\.global\S*\.v4\.", ptx)
    assert re.search(r"\bst\.global\S*\.v4\.", ptx)
    assert re.search(r"\bmul\.(hi|wide)\.u32", ptx)
    assert k.registers is not None, k.ptxas_log
    assert k.spill_stores_bytes == 0
    assert k.spill_loads_bytes == 0
