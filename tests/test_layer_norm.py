"""LayerNorm forward and backward against float64 PyTorch, plus input checks and AOT compiles.

Every path is covered: whole rows in registers (with and without column splits in
the backward) and the chunked kernels of long rows, which the tests reach at small
sizes by lowering the module's thresholds and chunk widths.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import tilebook
import tilebook.ops.layer_norm as op
from tilebook._launch import PLANS
from tilebook.course.aot import compile_kernel
from tilebook.ops.layer_norm import MAX_HIDDEN, layer_norm

EPS = 1e-5
HIDDEN = [1, 7, 64, 1000]
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
    torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2},
}
# fp32 rows near 1000: the input's own rounding (6e-5) is the limit.
OFFSET_TOL = {"atol": 2e-3, "rtol": 1e-4}


def _inputs(shape, dtype, device, offset=0.0):
    x = (offset + torch.randn(shape, dtype=torch.float32, device=device)).to(dtype)
    # Weights near 1 and biases near 0 but not all equal, so a missing or misplaced
    # parameter shows.
    w = (1 + 0.5 * torch.randn(shape[-1], device=device)).to(dtype)
    b = (0.5 * torch.randn(shape[-1], device=device)).to(dtype)
    return x, w, b


def _reference(x, w, b, dy, eps=EPS):
    """float64 forward and autograd on upcast copies of the inputs."""
    x64 = x.detach().double().requires_grad_()
    w64 = None if w is None else w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    y64 = F.layer_norm(x64, (x.shape[-1],), w64, b64, eps)
    wrt = [t for t in (x64, w64, b64) if t is not None]
    grads = iter(torch.autograd.grad(y64, wrt, dy.double()))
    dx64 = next(grads)
    dw64 = None if w is None else next(grads)
    db64 = None if b is None else next(grads)
    return y64, dx64, dw64, db64


def _check(x, w, b, dtype, eps=EPS, tol=None):
    """Forward, then backward with a random dy, each against the float64 reference."""
    x = x.detach().requires_grad_()
    w = None if w is None else w.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    y = layer_norm(x, w, b, eps)
    assert y.dtype == dtype
    assert y.shape == x.shape
    dy = torch.randn(x.shape, device=x.device).to(dtype)
    wrt = [t for t in (x, w, b) if t is not None]
    grads = iter(torch.autograd.grad(y, wrt, dy))
    y64, dx64, dw64, db64 = _reference(x, w, b, dy, eps)
    tol = tol or TOL[dtype]
    torch.testing.assert_close(y.double(), y64, **tol)
    # dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) scales the fp32 rounding of
    # g = dy * weight by rstd, which is 1 / sqrt(eps) ~ 316 for a row of one column
    # (variance 0).  On a GPU, where g - mean(g) contracts into an FMA, such rows
    # gave |dx| up to 3e-5 instead of 0 (H100, fp32); the bound is that rounding.
    g64 = dy.double() * (1.0 if w is None else w.detach().double())
    rstd64 = torch.rsqrt(x.detach().double().var(-1, unbiased=False) + eps)
    dx_atol = max(tol["atol"], (rstd64.max() * g64.abs().max()).item() * 2**-22)
    torch.testing.assert_close(next(grads).double(), dx64, atol=dx_atol, rtol=tol["rtol"])
    # dweight and dbias sum over every row, so their error grows with the row count.
    scale = max(1.0, x[..., 0].numel() ** 0.5)
    for t, want in ((w, dw64), (b, db64)):
        if t is not None:
            got = next(grads)
            assert got.dtype == dtype
            torch.testing.assert_close(
                got.double(), want, atol=tol["atol"] * scale, rtol=tol["rtol"]
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_cols", HIDDEN)
def test_matches_float64(device, dtype, n_cols):
    # 37 rows: ragged against every rows-per-program and grid size.
    n_rows = 37 if n_cols < 1000 else 9
    _check(*_inputs((n_rows, n_cols), dtype, device), dtype)


@pytest.mark.parametrize(
    ("shape", "even"), [((32, 64), True), ((2, 8, 256), True), ((33, 64), False)]
)
def test_forward_without_masks_when_programs_are_full(device, monkeypatch, shape, even):
    # Rows of a power of two, and a row count that the rows per program divide:
    # the forward drops its masks (EVEN).  One row more and it keeps them.
    n_cols = shape[-1]
    assert op._fwd_plan(torch.empty(shape).view(-1, n_cols), None, None)[2]["EVEN"] is even
    _check(*_inputs(shape, torch.float32, device), torch.float32)
    x, w, b = _inputs(shape, torch.float32, device)
    want = _reference(x, w, b, torch.zeros_like(x))[0]
    with torch.no_grad():
        torch.testing.assert_close(layer_norm(x, w, b).double(), want, **TOL[torch.float32])


@pytest.fixture
def fresh_plans():
    """Calls planned before the test (or in it), under a table the test changes, are
    planned anew."""
    PLANS.clear()
    yield
    PLANS.clear()


@pytest.mark.parametrize("shape", [(37, 100), (2, 5, 128), (32, 128)])
def test_forward_that_reads_x_twice(device, monkeypatch, fresh_plans, shape):
    # The second read (RELOAD, tuned for 16384 columns) made to happen at a small
    # width, ragged (100 of 128 columns) and not; several rows per program; the last
    # shape fills every program (EVEN: no masks).
    n_cols = shape[-1]
    block_n = op._fwd_config(n_cols)[0]
    monkeypatch.setattr(op, "_FWD_RELOAD", frozenset({block_n}))
    assert op._fwd_plan(torch.empty(1, n_cols), None, None)[2]["RELOAD"]
    assert op._fwd_plan(torch.empty(shape).view(-1, n_cols), None, None)[2]["EVEN"] == (
        shape == (32, 128)
    )
    _check(*_inputs(shape, torch.float32, device), torch.float32)
    x, w, b = _inputs(shape, torch.float32, device)
    want = _reference(x, w, b, torch.zeros_like(x))[0]
    with torch.no_grad():  # the call without autograd takes its own path
        torch.testing.assert_close(layer_norm(x, w, b).double(), want, **TOL[torch.float32])


@pytest.mark.parametrize("params", ["none", "weight", "bias"])
def test_optional_weight_and_bias(device, params):
    x, w, b = _inputs((13, 100), torch.float32, device)
    _check(x, w if params == "weight" else None, b if params == "bias" else None, torch.float32)


@pytest.mark.parametrize("n_rows", [1, 2, 5, 13])
def test_ragged_row_counts(device, n_rows):
    _check(*_inputs((n_rows, 300), torch.float32, device), torch.float32)


@pytest.mark.parametrize("shape", [(2, 3, 64), (2, 1, 3, 7), (64,)])
def test_leading_batch_dims(device, shape):
    _check(*_inputs(shape, torch.float32, device), torch.float32)


def test_non_contiguous_inputs(device):
    base, w, b = _inputs((6, 16, 64), torch.float16, device)
    # A slice (rows evenly strided: handled as a view), a transpose of the leading
    # dims (not evenly strided) and a transpose of the last dim (copied).
    _check(base[:, ::2], w, b, torch.float16)
    _check(base.transpose(0, 1), w, b, torch.float16)
    _check(base[:, :, :16].transpose(1, 2), w[:16], b[:16], torch.float16)
    # Strided parameters are read through a contiguous copy.
    w2 = torch.stack([w, w], 1)[:, 0]
    _check(base, w2, b, torch.float16)


def test_strided_dy_and_parameter_only_grads(device):
    x, w, b = _inputs((5, 64), torch.float32, device)
    w.requires_grad_()
    b.requires_grad_()
    # sum() hands backward a stride-0 dy; x needs no gradient here.
    layer_norm(x, w, b).sum().backward()
    _, _, dw64, db64 = _reference(x, w, b, torch.ones_like(x))
    torch.testing.assert_close(w.grad.double(), dw64, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(b.grad.double(), db64, atol=1e-4, rtol=1e-5)
    # Only the bias needs a gradient: no dweight is computed, dbias is right.
    b2 = b.detach().requires_grad_()
    (db,) = torch.autograd.grad(layer_norm(x, w.detach(), b2), (b2,), torch.ones_like(x))
    torch.testing.assert_close(db.double(), db64, atol=1e-4, rtol=1e-5)


def test_empty_batch(device):
    x = torch.empty((0, 64), device=device, requires_grad=True)
    w = torch.ones(64, device=device, requires_grad=True)
    b = torch.zeros(64, device=device, requires_grad=True)
    y = layer_norm(x, w, b)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    assert torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_constant_rows_are_finite(device, dtype):
    """Variance 0: x_hat = 0, y = bias, and every gradient finite."""
    x = torch.full((4, 50), 3.25, device=device, dtype=dtype).requires_grad_()
    w = torch.rand(50, device=device, dtype=dtype).requires_grad_()
    b = torch.randn(50, device=device, dtype=dtype).requires_grad_()
    y = layer_norm(x, w, b)
    torch.testing.assert_close(y, b.detach().expand_as(y), atol=0, rtol=0)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.randn_like(y))
    for g in (dx, dw, db):
        assert torch.isfinite(g).all()
    assert torch.equal(dw, torch.zeros_like(dw))


def test_large_offset_keeps_the_variance(device):
    """Rows with mean 1000 and unit spread: a one-pass E[x^2] - E[x]^2 in fp32 would
    lose most of the variance (errors of order 1); the fp32 mean of values near 1000
    is good to about 1e-4, so that is the tolerance."""
    x, w, b = _inputs((9, 300), torch.float32, device, offset=1000.0)
    _check(x, w, b, torch.float32, tol=OFFSET_TOL)


def test_large_values_do_not_overflow_fp16(device):
    # (x - mean)**2 overflows fp16 past 256; the statistics are computed in fp32.
    x = (torch.arange(64, device=device) * 100.0 - 3200.0).half().expand(3, 64)
    y = layer_norm(x)
    want = F.layer_norm(x.double(), (64,), eps=EPS)
    torch.testing.assert_close(y.double(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("splits", [2, 4, 8])
def test_column_splits(device, splits):
    """Backward programs that share a row, each owning a slice of the columns."""
    x, w, b = _inputs((13, 100), torch.float32, device)
    dy = torch.randn_like(x)
    _, stats = op.launch_layer_norm_fwd(x, w, b, EPS)
    dx, dw, db = op.launch_layer_norm_bwd(dy, x, w, stats, col_splits=splits)
    _, dx64, dw64, db64 = _reference(x, w, b, dy)
    for got, want in [(dx, dx64), (dw, dw64), (db, db64)]:
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_stats_are_mean_and_rstd(device):
    x, w, b = _inputs((7, 90), torch.float32, device)
    _, stats = op.launch_layer_norm_fwd(x, w, b, EPS)
    x64 = x.double()
    want = torch.stack([x64.mean(-1), torch.rsqrt(x64.var(-1, unbiased=False) + EPS)])
    torch.testing.assert_close(stats.double(), want, atol=1e-5, rtol=1e-5)


def test_dweight_is_deterministic(device):
    x, w, b = _inputs((21, 64), torch.float32, device)
    dy = torch.randn_like(x)
    _, stats = op.launch_layer_norm_fwd(x, w, b, EPS)
    outs = [op.launch_layer_norm_bwd(dy, x, w, stats)[1:] for _ in range(3)]
    assert all(torch.equal(outs[0][i], o[i]) for o in outs[1:] for i in range(2))


def test_errors(device):
    x, w, b = _inputs((4, 8), torch.float32, device)
    with pytest.raises(TypeError, match=r"layer_norm: x must be a torch\.Tensor"):
        layer_norm(x.tolist(), w, b)
    with pytest.raises(TypeError, match=r"layer_norm: weight must be a torch\.Tensor"):
        layer_norm(x, [1.0] * 8, b)
    with pytest.raises(TypeError, match=r"layer_norm: bias must be a torch\.Tensor"):
        layer_norm(x, w, 0.0)
    with pytest.raises(TypeError, match="layer_norm: x has dtype int32"):
        layer_norm(x.int(), w, b)
    with pytest.raises(TypeError, match="layer_norm: x has dtype float64"):
        layer_norm(x.double())
    with pytest.raises(TypeError, match="layer_norm: weight must have the dtype of x"):
        layer_norm(x, w.half(), b)
    with pytest.raises(TypeError, match="layer_norm: bias must have the dtype of x"):
        layer_norm(x, w, b.half())
    with pytest.raises(ValueError, match=r"layer_norm: weight must have shape \(8,\)"):
        layer_norm(x, w[:4], b)
    with pytest.raises(ValueError, match=r"layer_norm: bias must have shape \(8,\)"):
        layer_norm(x, w, b[:4])
    with pytest.raises(ValueError, match="layer_norm: weight must have 1 dimensions"):
        layer_norm(x, w.view(2, 4), b)
    with pytest.raises(ValueError, match="layer_norm: x must have at least 1 dimension"):
        layer_norm(x[0, 0], w, b)
    with pytest.raises(ValueError, match="layer_norm: the last dimension of x must not be empty"):
        layer_norm(x[:, :0], w[:0], b[:0])
    big = MAX_HIDDEN + 1
    x_big = torch.empty((1, big), device=device)
    with pytest.raises(ValueError, match=f"supports at most {MAX_HIDDEN}"):
        layer_norm(x_big)
    for eps in (0.0, -1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="layer_norm: eps must be a positive"):
            layer_norm(x, w, b, eps)
    for eps in ("1e-5", None, True, torch.tensor(1e-5)):
        with pytest.raises(TypeError, match="layer_norm: eps must be a float"):
            layer_norm(x, w, b, eps)
    with pytest.raises(ValueError, match="col_splits must be a power of two"):
        op.launch_layer_norm_bwd(x, x, w, torch.zeros(2, 4, device=device), col_splits=3)


def test_wrong_device():
    other = "cpu" if tilebook.is_gpu() else "meta"
    x = torch.empty((4, 8), device=other)
    with pytest.raises(ValueError, match="layer_norm: x is on"):
        layer_norm(x)
    if tilebook.is_gpu():
        x = torch.empty((4, 8), device="cuda")
        with pytest.raises(ValueError, match="layer_norm: weight is on"):
            layer_norm(x, torch.empty(8))


# ---------------------------------------------------------------------------
# Long rows: the chunked kernels
# ---------------------------------------------------------------------------


@pytest.fixture
def chunked(monkeypatch):
    """Every row takes the chunked kernels, in chunks of 16 columns."""
    monkeypatch.setattr(op, "FWD_CHUNKED_THRESHOLD", 0)
    monkeypatch.setattr(op, "BWD_CHUNKED_THRESHOLD", 0)
    monkeypatch.setattr(op, "CHUNK_FWD", 16)
    monkeypatch.setattr(op, "CHUNK_BWD", 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    # One column, a single partial chunk, exact chunks, a ragged last chunk, and
    # rows several times the interpreter's 4-program persistent grid.
    "shape",
    [(5, 1), (37, 7), (13, 64), (37, 100)],
)
def test_chunked_matches_float64(device, chunked, dtype, shape):
    _check(*_inputs(shape, dtype, device), dtype)


@pytest.mark.parametrize("params", ["none", "weight", "bias"])
def test_chunked_optional_weight_and_bias(device, chunked, params):
    x, w, b = _inputs((9, 50), torch.float32, device)
    _check(x, w if params == "weight" else None, b if params == "bias" else None, torch.float32)


def test_chunked_leading_dims_strides_and_offset(device, chunked):
    base, w, b = _inputs((3, 8, 40), torch.float32, device, offset=1000.0)
    tol = OFFSET_TOL
    _check(base[:, ::2], w, b, torch.float32, tol=tol)  # evenly strided rows: a view
    _check(base.transpose(0, 1), w, b, torch.float32, tol=tol)  # copied
    _check(base[:, :, :20].transpose(1, 2), w[:8], b[:8], torch.float32, tol=tol)


def test_chunked_constant_rows_are_finite(device, chunked):
    x = torch.full((3, 40), -7.0, device=device).requires_grad_()
    b = torch.randn(40, device=device)
    y = layer_norm(x, None, b)
    torch.testing.assert_close(y, b.expand_as(y), atol=0, rtol=0)
    (dx,) = torch.autograd.grad(y, (x,), torch.randn_like(y))
    assert torch.isfinite(dx).all()


@pytest.mark.parametrize("chunk", [1, 4, 32, 64])
def test_chunked_any_chunk_width(device, chunk):
    """One chunk per column up to a single chunk for the whole row."""
    x, w, b = _inputs((7, 50), torch.float32, device)
    dy = torch.randn_like(x)
    y, stats = op.launch_layer_norm_fwd(x, w, b, EPS, chunked=True, chunk=chunk)
    dx, dw, db = op.launch_layer_norm_bwd(dy, x, w, stats, chunked=True, chunk=chunk)
    y64, dx64, dw64, db64 = _reference(x, w, b, dy)
    for got, want in [(y, y64), (dx, dx64), (dw, dw64), (db, db64)]:
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_cols", [16, 100])
def test_threshold_picks_the_kernels(device, monkeypatch, n_cols):
    """Rows longer than a threshold take the chunked kernels, others the whole-row ones."""
    monkeypatch.setattr(op, "CHUNK_FWD", 32)
    monkeypatch.setattr(op, "CHUNK_BWD", 32)
    x, w, b = _inputs((9, n_cols), torch.float32, device)
    dy = torch.randn_like(x)
    outs = {}
    for path in (False, True):
        y, stats = op.launch_layer_norm_fwd(x, w, b, EPS, chunked=path)
        outs[path] = (y, stats, *op.launch_layer_norm_bwd(dy, x, w, stats, chunked=path))
    for threshold in (n_cols - 1, n_cols):
        monkeypatch.setattr(op, "FWD_CHUNKED_THRESHOLD", threshold)
        monkeypatch.setattr(op, "BWD_CHUNKED_THRESHOLD", threshold)
        y, stats = op.launch_layer_norm_fwd(x, w, b, EPS)
        got = (y, stats, *op.launch_layer_norm_bwd(dy, x, w, stats))
        want = outs[n_cols > threshold]
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), threshold


def test_rows_past_65536(device):
    """Long rows take the chunked kernels by default."""
    _check(*_inputs((2, 70001), torch.float32, device), torch.float32)


# ---------------------------------------------------------------------------
# GPU: bf16, the widths of the speed targets, long rows
# ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [1, 100, 1024, 2048, 4096, 8192, 16384])
def test_bfloat16(device, n_cols):
    _check(*_inputs((257, n_cols), torch.bfloat16, device), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [16385, 32768, 65536, 100000])
def test_chunked_bfloat16(device, n_cols):
    _check(*_inputs((129, n_cols), torch.bfloat16, device), torch.bfloat16)


@pytest.mark.gpu
def test_bfloat16_without_parameters_and_offset(device):
    x, _, _ = _inputs((300, 4096), torch.bfloat16, device, offset=50.0)
    _check(x, None, None, torch.bfloat16)


@pytest.mark.gpu
def test_max_hidden_gpu(device):
    _check(*_inputs((3, MAX_HIDDEN), torch.float32, device), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [4096, 16384, 32768])
def test_every_backward_path_agrees(device, n_cols):
    """Whole rows, column splits and the chunked kernels, on a GPU in bf16."""
    x, w, b = _inputs((300, n_cols), torch.bfloat16, device)
    dy = torch.randn_like(x)
    _, stats = op.launch_layer_norm_fwd(x, w, b, EPS)
    _, dx64, dw64, db64 = _reference(x, w, b, dy)
    variants = [{"chunked": True}, {"chunked": False, "col_splits": 2}]
    if n_cols <= 8192:
        variants.append({"chunked": False, "col_splits": 1})
    for kw in variants:
        dx, dw, db = op.launch_layer_norm_bwd(dy, x, w, stats, **kw)
        torch.testing.assert_close(dx.double(), dx64, atol=3e-2, rtol=2e-2, msg=str(kw))
        torch.testing.assert_close(dw.double(), dw64, atol=0.5, rtol=2e-2, msg=str(kw))
        torch.testing.assert_close(db.double(), db64, atol=0.5, rtol=2e-2, msg=str(kw))


def test_repeat_backward_calls(device):
    """The second backward of a kind takes the plan of the first (on a GPU, its
    compiled launches); each must still be right, whichever gradients are asked for."""
    x, w, b = _inputs((37, 300), torch.float16, device)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    y = layer_norm(x, w, b)
    for _ in range(3):
        dy = torch.randn_like(y)
        got = torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)
        _, *want = _reference(x, w, b, dy)
        for g, r in zip(got, want, strict=True):
            torch.testing.assert_close(g.double(), r, atol=0.05, rtol=4e-3)
    # Another kind: only the bias needs a gradient, so no dx and no dweight.
    (db,) = torch.autograd.grad(layer_norm(x.detach(), w.detach(), b), (b,), dy)
    torch.testing.assert_close(db.double(), want[2], atol=0.05, rtol=4e-3)
    # ... and a later call that wants every gradient again is not given that plan.
    y = layer_norm(x, w, b)
    got = torch.autograd.grad(y, (x, w, b), dy)
    _, *want = _reference(x, w, b, dy)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), r, atol=0.05, rtol=4e-3)


def test_repeat_calls_agree_with_the_first(device):
    # The second call of a kind takes the plan of the first (on a GPU, its compiled
    # launch), with its own eps.  Every call must be right.
    def ref(x, w, b, eps):
        return F.layer_norm(x.double(), (x.shape[-1],), w.double(), b.double(), eps)

    x = torch.randn(3, 16, 200, device=device, dtype=torch.float16)
    w = torch.rand(200, device=device, dtype=torch.float16) + 0.5
    b = torch.randn(200, device=device, dtype=torch.float16)
    y = layer_norm(x, w, b, 1e-5)
    torch.testing.assert_close(y.double(), ref(x, w, b, 1e-5), atol=4e-3, rtol=0)
    for eps in (1e-5, 0.5):
        x2 = torch.randn_like(x) * 3
        y2 = layer_norm(x2, w, b, eps)
        assert y2.shape == x2.shape and y2.dtype == x2.dtype
        torch.testing.assert_close(y2.double(), ref(x2, w, b, eps), atol=1e-2, rtol=0)
    # Without the bias: another key, another answer.
    y3 = layer_norm(x2, w, None, 1e-5)
    want = F.layer_norm(x2.double(), (200,), w.double(), None, 1e-5)
    torch.testing.assert_close(y3.double(), want, atol=1e-2, rtol=0)
    with pytest.raises(ValueError, match="eps"):
        layer_norm(x2, w, b, -1.0)
    # A parameter that needs grad still gets a graph.
    assert layer_norm(x2, w, b.clone().requires_grad_(), 1e-5).grad_fn is not None


def test_repeat_calls_tell_layouts_apart(device, monkeypatch):
    """Calls of one shape in every layout, twice over: the second round finds a plan
    for each, and each must be the plan of its own call (strides, strided, misaligned
    or absent parameters, which gradients, a knob changed), not another's."""
    base = torch.randn(4, 2, 32, device=device)
    p_base = torch.randn(2, 66, device=device)
    xs = {
        "contiguous": base[:, 0].contiguous(),
        "row-strided": base[:, 0],
        "transposed": base[:, 0].t().contiguous().t(),
        "misaligned": torch.randn(4 * 32 + 1, device=device)[1:].view(4, 32),
    }
    params = {
        "both": (p_base[0, :32] + 1, p_base[1, :32]),
        "strided": (p_base[0, ::2][:32] + 1, p_base[1, ::2][:32]),
        "misaligned": (p_base[0, 1:33] + 1, p_base[1, 1:33]),
        "weight only": (p_base[0, :32] + 1, None),
        "bias only": (None, p_base[1, :32]),
        "none": (None, None),
    }
    names = ("FWD_CHUNKED_THRESHOLD", "BWD_CHUNKED_THRESHOLD", "CHUNK_FWD", "CHUNK_BWD")
    knobs = ([getattr(op, name) for name in names], [0, 0, 16, 16])  # whole rows; chunked
    for _ in range(2):
        for values in knobs:
            for name, value in zip(names, values, strict=True):
                monkeypatch.setattr(op, name, value)
            threshold = values[0]
            # Each layout of x with both parameters, each parameter set with a plain x.
            pairs = [(xn, "both") for xn in xs] + [("contiguous", pn) for pn in params]
            for xn, pn in pairs:
                x, (w, b) = xs[xn], params[pn]
                for grads in ((True, True, True), (False, True, False)):
                    ins = [t.detach().requires_grad_(g) if t is not None else None
                           for t, g in zip((x, w, b), grads, strict=True)]  # fmt: skip
                    y = layer_norm(*ins, 1e-5)
                    want_ins = [t for t in ins if t is not None and t.requires_grad]
                    ref_ins = [None if t is None else t.detach().double().requires_grad_()
                               for t in ins]  # fmt: skip
                    ref = F.layer_norm(ref_ins[0], (32,), ref_ins[1], ref_ins[2], 1e-5)
                    msg = f"x {xn}, parameters {pn}, grads {grads}, threshold {threshold}"
                    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4, msg=msg)
                    if not want_ins:
                        continue
                    dy = torch.randn_like(y)
                    got = torch.autograd.grad(y, want_ins, dy)
                    refs = [r for t, r in zip(ins, ref_ins, strict=True)
                            if t is not None and t.requires_grad]  # fmt: skip
                    want = torch.autograd.grad(ref, refs, dy.double())
                    for g, r in zip(got, want, strict=True):
                        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4, msg=msg)


# ---------------------------------------------------------------------------
# Compiled for sm_90: no spills, 16-byte loads
# ---------------------------------------------------------------------------

_PTRS_FWD = {
    "x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "stats_ptr": "*fp32",
}  # fmt: skip
_INTS_FWD = ["n_rows", "n_cols", "x_row_stride", "y_row_stride"]
_PTRS_BWD = {
    "dy_ptr": "*bf16", "x_ptr": "*bf16", "w_ptr": "*bf16", "stats_ptr": "*fp32",
    "dx_ptr": "*bf16", "partial_ptr": "*fp32",
}  # fmt: skip
_INTS_BWD = ["n_rows", "n_cols", "dy_row_stride", "x_row_stride", "dx_row_stride"]


def _assert_clean(k, name):
    ptx = k.stages["ptx"]
    assert ".target sm_90" in ptx
    assert name in ptx
    assert re.search(r"\bld\.global\S*\.v4\.", ptx)  # 16-byte loads
    assert k.registers is not None, k.ptxas_log
    assert k.spill_stores_bytes == 0
    assert k.spill_loads_bytes == 0


@pytest.mark.parametrize(
    ("kernel", "n_cols"),
    [
        ("fwd", 1024),
        ("fwd", 8192),
        ("fwd", 16384),
        ("fwd", 32768),
        ("bwd", 1024),
        ("bwd", 8192),
        ("split", 16384),
    ],
)
def test_compiles_for_sm90_without_spills(kernel, n_cols):
    """The whole-row kernels at their default settings up to their thresholds, and
    the backward at 16384 with two column splits (without them it spills)."""
    flags = {"HAS_W": True}
    if kernel == "fwd":
        block_n, rows, warps = op._fwd_config(n_cols)
        sig = {**_PTRS_FWD, **dict.fromkeys(_INTS_FWD, "i32"), "eps": "fp32"}
        constexprs = {"BLOCK_N": block_n, "ROWS": rows, **flags, "HAS_B": True,
                      "RELOAD": block_n in op._FWD_RELOAD}  # fmt: skip
        # The unmasked variant is what full rows run; the masked one holds more.
        for even in (True, False):
            k = compile_kernel(
                "tilebook.ops.layer_norm:layer_norm_fwd_kernel",
                sig,
                {**constexprs, "EVEN": even},
                arch=90,
                num_warps=warps,
                divisible_by_16=[n for n in sig if n not in ("n_rows", "eps")],
            )
            _assert_clean(k, "layer_norm_fwd_kernel")
        return
    else:
        block_n, rows, warps, _, splits = op._bwd_config(n_cols)
        if kernel == "split":
            kernel, splits = "bwd", 2
        sig = {**_PTRS_BWD, **dict.fromkeys(_INTS_BWD, "i32")}
        constexprs = {"BLOCK_N": block_n, "ROWS": rows, "COL_SPLITS": splits, **flags}
        constexprs |= {"NEED_DW": True, "NEED_DB": True}
    k = compile_kernel(
        f"tilebook.ops.layer_norm:layer_norm_{kernel}_kernel",
        sig,
        constexprs,
        arch=90,
        num_warps=warps,
        divisible_by_16=[n for n in sig if n not in ("n_rows", "eps")],
    )
    _assert_clean(k, f"layer_norm_{kernel}_kernel")


@pytest.mark.parametrize("kernel", ["fwd_chunked", "bwd_dot", "bwd_chunked"])
def test_chunked_kernels_compile_for_sm90_without_spills(kernel):
    # The settings the launchers plan for rows of 65536, with a weight and a bias.
    x = torch.empty(8, 65536, device="meta", dtype=torch.bfloat16)
    w = x[0]
    dot, bwd = (step.meta for step in op._bwd_plan(x, w, (True, True), chunked=True).steps[:2])
    meta = {"fwd_chunked": op._fwd_plan(x, w, w, chunked=True)[2], "bwd_dot": dot,
            "bwd_chunked": bwd}  # fmt: skip
    constexprs = dict(meta[kernel])
    warps = constexprs.pop("num_warps")
    ptrs = {k: v for k, v in _PTRS_BWD.items() if k not in ("dx_ptr", "partial_ptr")}
    if kernel == "fwd_chunked":
        sig = {**_PTRS_FWD, **dict.fromkeys(_INTS_FWD, "i32"), "eps": "fp32"}
    elif kernel == "bwd_dot":
        ints = ["n_rows", "n_cols", "dy_row_stride", "x_row_stride"]
        sig = {**ptrs, "dot_ptr": "*fp32", **dict.fromkeys(ints, "i32")}
    else:
        ints = ["n_rows", "n_cols", "n_dots", *_INTS_BWD[2:]]
        sig = {**ptrs, "dot_ptr": "*fp32", "dx_ptr": "*bf16", "partial_ptr": "*fp32"}
        sig |= dict.fromkeys(ints, "i32")
    k = compile_kernel(
        f"tilebook.ops.layer_norm:layer_norm_{kernel}_kernel",
        sig,
        constexprs,
        arch=90,
        num_warps=warps,
        divisible_by_16=[n for n in sig if n not in ("n_rows", "n_dots", "eps")],
    )
    _assert_clean(k, f"layer_norm_{kernel}_kernel")


# bf16 only on a GPU: the interpreter's bfloat16 arithmetic is wrong.
HALVES = [torch.float16] + ([torch.bfloat16] if tilebook.is_gpu() else [])


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 1000)])
def test_float32_parameters_with_a_16_bit_input(shape, dtype):
    """Mixed precision as torch's layer_norm takes it: weight and bias in float32,
    the activations in 16 bits; y and dx in x's dtype, dw and db in float32."""
    x, _, _ = _inputs(shape, dtype, tilebook.device())
    w = 1 + 0.5 * torch.randn(shape[-1], device=x.device)
    b = 0.5 * torch.randn(shape[-1], device=x.device)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    for _ in range(2):  # the first call plans, the second takes the plan
        y = layer_norm(x, w, b, EPS)
        dy = torch.randn(x.shape, device=x.device).to(dtype)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
        y64, dx64, dw64, db64 = _reference(x, w, b, dy)
        assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == (dtype, dtype, *[torch.float32] * 2)
        torch.testing.assert_close(y.double(), y64, **TOL[dtype])
        torch.testing.assert_close(dx.double(), dx64, rtol=2e-2, atol=2e-2)
        for got, want in ((dw, dw64), (db, db64)):
            torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3 * shape[0])
    with pytest.raises(TypeError, match="weight and bias must share a dtype"):
        layer_norm(x, w, b.to(dtype))
    with pytest.raises(TypeError, match=r"bias must have the dtype of x \(float32\), got"):
        layer_norm(x.float(), w, b.half())
