"""RMSNorm forward and backward against float64 PyTorch, plus input checks and AOT compiles.

Both paths are covered: whole rows in registers, and the chunked kernels of long
rows, which the tests reach at small sizes by lowering the module's thresholds and
chunk widths.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import tilebook
import tilebook.ops.rms_norm as op
from tilebook.course.aot import compile_kernel
from tilebook.ops.rms_norm import MAX_HIDDEN, bwd_config, fwd_config, rms_norm

EPS = 1e-6
HIDDEN = [1, 7, 64, 1000, 4096]
# Loose enough for fp16 rounding of y and dx, tight enough to catch a wrong formula.
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def _inputs(shape, dtype, device):
    x = torch.randn(shape, dtype=torch.float32, device=device).to(dtype)
    # Weights near 1 but not all equal, so a missing or misplaced weight shows.
    w = (1 + 0.5 * torch.randn(shape[-1], device=device)).to(dtype)
    return x, w


def _reference(x, w, dy):
    """float64 forward and autograd on upcast copies of the inputs."""
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = F.rms_norm(x64, (x.shape[-1],), w64, EPS)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    return y64, dx64, dw64


def _check(x, w, dtype):
    """Forward, then backward with a random dy, each against the float64 reference."""
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    y = rms_norm(x, w, EPS)
    assert y.dtype == dtype
    assert y.shape == x.shape
    dy = torch.randn(x.shape, device=x.device).to(dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    y64, dx64, dw64 = _reference(x, w, dy)
    tol = TOL[dtype]
    torch.testing.assert_close(y.double(), y64, **tol)
    torch.testing.assert_close(dx.double(), dx64, **tol)
    assert dw.dtype == dtype
    # dw sums over every row, so its error grows with the row count.
    scale = max(1.0, x[..., 0].numel() ** 0.5)
    torch.testing.assert_close(dw.double(), dw64, atol=tol["atol"] * scale, rtol=tol["rtol"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_cols", HIDDEN)
def test_matches_float64(device, dtype, n_cols):
    # 37 rows: ragged against every rows-per-program and grid size.
    n_rows = 37 if n_cols < 1000 else 9
    _check(*_inputs((n_rows, n_cols), dtype, device), dtype)


@pytest.mark.parametrize("n_rows", [1, 2, 5, 13])
def test_ragged_row_counts(device, n_rows):
    _check(*_inputs((n_rows, 1000), torch.float32, device), torch.float32)


@pytest.mark.parametrize(
    ("shape", "even"), [((32, 64), True), ((2, 8, 256), True), ((33, 64), False)]
)
def test_forward_without_masks_when_programs_are_full(device, shape, even):
    # Rows of a power of two, and a row count that the rows per program divide:
    # the forward drops its masks (EVEN).  One row more and it keeps them.
    x2 = torch.empty(shape).view(-1, shape[-1])
    assert op._fwd_plan(x2)[2]["EVEN"] is even
    _check(*_inputs(shape, torch.float32, device), torch.float32)
    x, w = _inputs(shape, torch.float32, device)
    want = F.rms_norm(x.double(), (shape[-1],), w.double(), EPS)
    with torch.no_grad():  # the call without autograd takes its own path
        torch.testing.assert_close(rms_norm(x, w, EPS).double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 64), (2, 1, 3, 7), (64,)])
def test_leading_batch_dims(device, shape):
    _check(*_inputs(shape, torch.float32, device), torch.float32)


def test_non_contiguous_inputs(device):
    base, w = _inputs((6, 16, 64), torch.float16, device)
    # A slice (rows evenly strided: handled as a view), a transpose of the leading
    # dims (not evenly strided) and a transpose of the last dim (copied).
    _check(base[:, ::2], w, torch.float16)
    _check(base.transpose(0, 1), w, torch.float16)
    _check(base[:, :, :16].transpose(1, 2), w[:16], torch.float16)


def test_strided_dy_and_weight_only_grad(device):
    x, w = _inputs((5, 64), torch.float32, device)
    w.requires_grad_()
    # sum() hands backward a stride-0 dy; x needs no gradient here.
    rms_norm(x, w).sum().backward()
    _, _, dw64 = _reference(x, w, torch.ones_like(x))
    torch.testing.assert_close(w.grad.double(), dw64, atol=1e-4, rtol=1e-5)


def test_empty_batch(device):
    x = torch.empty((0, 64), device=device, requires_grad=True)
    w = torch.ones(64, device=device, requires_grad=True)
    y = rms_norm(x, w)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_large_values_do_not_overflow_fp16(device):
    # x**2 overflows fp16 past 256; the statistic is computed in fp32.
    x = torch.full((3, 64), 1000.0, device=device).half()
    w = torch.ones(64, device=device).half()
    y = rms_norm(x, w)
    torch.testing.assert_close(y, torch.ones_like(y), atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [*HIDDEN, 8192])
def test_bfloat16(device, n_cols):
    _check(*_inputs((257, n_cols), torch.bfloat16, device), torch.bfloat16)


@pytest.mark.gpu
def test_large_hidden_gpu(device):
    _check(*_inputs((33, 20000), torch.float32, device), torch.float32)


def test_errors(device):
    x, w = _inputs((4, 8), torch.float32, device)
    with pytest.raises(TypeError, match=r"rms_norm: x must be a torch\.Tensor"):
        rms_norm(x.tolist(), w)
    with pytest.raises(TypeError, match=r"rms_norm: weight must be a torch\.Tensor"):
        rms_norm(x, None)
    with pytest.raises(TypeError, match="rms_norm: x has dtype int32"):
        rms_norm(x.int(), w)
    with pytest.raises(TypeError, match="rms_norm: x has dtype float64"):
        rms_norm(x.double(), w.double())
    with pytest.raises(TypeError, match="rms_norm: weight must have the dtype of x"):
        rms_norm(x, w.half())
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \(8,\)"):
        rms_norm(x, w[:4])
    with pytest.raises(ValueError, match="rms_norm: weight must have 1 dimensions"):
        rms_norm(x, w.view(2, 4))
    with pytest.raises(ValueError, match="rms_norm: x must have at least 1 dimension"):
        rms_norm(x[0, 0], w)
    with pytest.raises(ValueError, match="rms_norm: the last dimension of x must not be empty"):
        rms_norm(x[:, :0], w[:0])
    big = MAX_HIDDEN + 1
    x_big, w_big = torch.empty((1, big), device=device), torch.empty(big, device=device)
    with pytest.raises(ValueError, match=f"supports at most {MAX_HIDDEN}"):
        rms_norm(x_big, w_big)
    for eps in (0.0, -1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rms_norm: eps must be a positive"):
            rms_norm(x, w, eps)
    for eps in ("1e-6", None, True, torch.tensor(1e-6)):
        with pytest.raises(TypeError, match="rms_norm: eps must be a float"):
            rms_norm(x, w, eps)


def test_wrong_device():
    other = "cpu" if tilebook.is_gpu() else "meta"
    x = torch.empty((4, 8), device=other)
    w = torch.empty(8, device=other)
    with pytest.raises(ValueError, match="rms_norm: x is on"):
        rms_norm(x, w)


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
    [(5, 1), (37, 7), (13, 64), (37, 100), (9, 300)],
)
def test_chunked_matches_float64(device, chunked, dtype, shape):
    _check(*_inputs(shape, dtype, device), dtype)


def test_chunked_leading_dims_and_strides(device, chunked):
    base, w = _inputs((3, 8, 40), torch.float32, device)
    _check(base[:, ::2], w, torch.float32)  # evenly strided rows: a view
    _check(base.transpose(0, 1), w, torch.float32)  # copied
    _check(base[:, :, :20].transpose(1, 2), w[:8], torch.float32)


@pytest.mark.parametrize("n_rows", [1, 2, 3, 13])
def test_chunked_ragged_row_counts(device, chunked, n_rows):
    _check(*_inputs((n_rows, 100), torch.float32, device), torch.float32)


@pytest.mark.parametrize("chunk", [1, 4, 32, 64])
def test_chunked_any_chunk_width(device, chunk):
    """One chunk per column up to a single chunk for the whole row."""
    x, w = _inputs((7, 50), torch.float32, device)
    dy = torch.randn_like(x)
    y, rstd = op.launch_rms_norm_fwd(x, w, EPS, chunked=True, chunk=chunk)
    dx, dw = op.launch_rms_norm_bwd(dy, x, w, rstd, chunked=True, chunk=chunk)
    y64, dx64, dw64 = _reference(x, w, dy)
    rstd64 = torch.rsqrt(x.double().pow(2).mean(-1) + EPS)
    for got, want in [(y, y64), (rstd, rstd64), (dx, dx64), (dw, dw64)]:
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_cols", [16, 100])
def test_threshold_picks_the_kernels(device, monkeypatch, n_cols):
    """Rows longer than a threshold take the chunked kernels, others the whole-row ones."""
    monkeypatch.setattr(op, "CHUNK_FWD", 32)
    monkeypatch.setattr(op, "CHUNK_BWD", 32)
    x, w = _inputs((9, n_cols), torch.float32, device)
    dy = torch.randn_like(x)
    outs = {}
    for path in (False, True):
        y, rstd = op.launch_rms_norm_fwd(x, w, EPS, chunked=path)
        outs[path] = (y, rstd, *op.launch_rms_norm_bwd(dy, x, w, rstd, chunked=path))
    for threshold in (n_cols - 1, n_cols):
        monkeypatch.setattr(op, "FWD_CHUNKED_THRESHOLD", threshold)
        monkeypatch.setattr(op, "BWD_CHUNKED_THRESHOLD", threshold)
        y, rstd = op.launch_rms_norm_fwd(x, w, EPS)
        got = (y, rstd, *op.launch_rms_norm_bwd(dy, x, w, rstd))
        want = outs[n_cols > threshold]
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), threshold


def test_chunked_dweight_is_deterministic(device, chunked):
    x, w = _inputs((21, 64), torch.float32, device)
    dy = torch.randn_like(x)
    _, rstd = op.launch_rms_norm_fwd(x, w, EPS)
    dws = [op.launch_rms_norm_bwd(dy, x, w, rstd)[1] for _ in range(3)]
    assert all(torch.equal(dws[0], d) for d in dws[1:])


def test_chunked_large_values_do_not_overflow_fp16(device, chunked):
    x = torch.full((3, 64), 1000.0, device=device).half()
    w = torch.ones(64, device=device).half()
    y = rms_norm(x, w)
    torch.testing.assert_close(y, torch.ones_like(y), atol=1e-3, rtol=1e-3)


def test_rows_past_the_old_limit(device):
    """65536 columns was the limit of the whole-row kernels; the default chunks now."""
    _check(*_inputs((3, 70001), torch.float32, device), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [16385, 32768, 65536, 100000])
def test_chunked_bfloat16(device, n_cols):
    _check(*_inputs((129, n_cols), torch.bfloat16, device), torch.bfloat16)


@pytest.mark.gpu
def test_max_hidden_gpu(device):
    _check(*_inputs((5, MAX_HIDDEN), torch.float32, device), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [4096, 16384, 32768])
def test_chunked_and_whole_row_kernels_agree(device, n_cols):
    """Where both paths apply, on a GPU, in bf16: the same answer up to fp32 rounding."""
    x, w = _inputs((300, n_cols), torch.bfloat16, device)
    dy = torch.randn_like(x)
    outs = []
    for path in (False, True):
        y, rstd = op.launch_rms_norm_fwd(x, w, EPS, chunked=path)
        outs.append((y, rstd, *op.launch_rms_norm_bwd(dy, x, w, rstd, chunked=path)))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=1e-2)


# The signatures a real launch on bf16 rows of 4096 or 8192 gives: pointers, sizes
# and row strides all multiples of 16.
_PTRS_FWD = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "rstd_ptr": "*fp32"}
_PTRS_BWD = {
    "dy_ptr": "*bf16",
    "x_ptr": "*bf16",
    "w_ptr": "*bf16",
    "rstd_ptr": "*fp32",
    "dx_ptr": "*bf16",
    "dw_partial_ptr": "*fp32",
}


@pytest.mark.parametrize("n_cols", [4096, 8192])
@pytest.mark.parametrize(("kernel", "even"), [("fwd", True), ("fwd", False), ("bwd", None)])
def test_compiles_for_sm90_without_spills(kernel, even, n_cols):
    if kernel == "fwd":
        block_n, rows, warps = fwd_config(n_cols)
        ints = ["n_rows", "n_cols", "x_row_stride", "y_row_stride"]
        sig = {**_PTRS_FWD, **dict.fromkeys(ints, "i32"), "eps": "fp32"}
    else:
        block_n, rows, warps, _ = bwd_config(n_cols)
        ints = ["n_rows", "n_cols", "dy_row_stride", "x_row_stride", "dx_row_stride"]
        sig = {**_PTRS_BWD, **dict.fromkeys(ints, "i32")}
    k = compile_kernel(
        f"tilebook.ops.rms_norm:rms_norm_{kernel}_kernel",
        sig,
        {
            "BLOCK_N": block_n,
            "ROWS": rows,
            **(
                {"STORE_RSTD": True, "X_EVICT": "evict_last", "EVEN": even}
                if even is not None
                else {}
            ),
        },
        arch=90,
        num_warps=warps,
        divisible_by_16=[n for n in sig if n != "n_rows" and n != "eps"],
    )
    ptx = k.stages["ptx"]
    assert ".target sm_90" in ptx
    assert f"rms_norm_{kernel}_kernel" in ptx
    # 16-byte loads: the whole point of the alignment hints (with or without an L2
    # policy, as in ld.global.L1::evict_last.L2::cache_hint.v4.b32).
    assert re.search(r"\bld\.global\S*\.v4\.", ptx)
    assert k.registers is not None, k.ptxas_log
    assert k.spill_stores_bytes == 0
    assert k.spill_loads_bytes == 0


_INTS_BWD_DOT = ["n_cols", "dy_row_stride", "x_row_stride"]
_INTS_BWD_CHUNKED = ["n_rows", "n_cols", "n_dots", "dy_row_stride", "x_row_stride", "dx_row_stride"]


@pytest.mark.parametrize(
    ("kernel", "n_cols"),
    [
        ("fwd_chunked", 65536),
        ("bwd_dot", 65536),
        ("bwd_chunked", 65536),
        ("bwd_chunked", MAX_HIDDEN),
    ],
)
def test_chunked_kernels_compile_for_sm90_without_spills(kernel, n_cols):
    """The chunked kernels at their default settings (as the launchers plan them):
    registers scale with the chunk, not with ``H`` (only the backward's ``DOTS`` grows
    with it)."""
    x = torch.empty(8, n_cols, device="meta", dtype=torch.bfloat16)
    dot, bwd = (step.meta for step in op._bwd_plan(x, chunked=True).steps[:2])
    meta = {"fwd_chunked": op._fwd_plan(x, chunked=True)[2], "bwd_dot": dot, "bwd_chunked": bwd}
    constexprs = dict(meta[kernel])
    warps = constexprs.pop("num_warps")
    if kernel == "fwd_chunked":
        ints = ["n_rows", "n_cols", "x_row_stride", "y_row_stride"]
        sig = {**_PTRS_FWD, **dict.fromkeys(ints, "i32"), "eps": "fp32"}
    elif kernel == "bwd_dot":
        ptrs = {k: v for k, v in _PTRS_BWD.items() if k in ("dy_ptr", "x_ptr", "w_ptr")}
        sig = {**ptrs, "dot_ptr": "*fp32", **dict.fromkeys(_INTS_BWD_DOT, "i32")}
    else:
        sig = {**_PTRS_BWD, "dot_ptr": "*fp32", **dict.fromkeys(_INTS_BWD_CHUNKED, "i32")}
    k = compile_kernel(
        f"tilebook.ops.rms_norm:rms_norm_{kernel}_kernel",
        sig,
        constexprs,
        arch=90,
        num_warps=warps,
        divisible_by_16=[n for n in sig if n not in ("n_rows", "n_dots", "eps")],
    )
    assert f"rms_norm_{kernel}_kernel" in k.stages["ptx"]
    # 16-byte loads (the forward's carry an L2 eviction hint: ld.global.L1::...v4).
    assert re.search(r"ld\.global\S*\.v4\.", k.stages["ptx"])
    assert k.registers is not None, k.ptxas_log
    assert k.spill_stores_bytes == 0
    assert k.spill_loads_bytes == 0


def test_repeat_calls_agree_with_the_first(device):
    # The second call of a kind takes the plan of the first (and, on a GPU, its
    # compiled launch), with its own eps.  Every call must be right.
    def ref(x, w, eps):
        return F.rms_norm(x.double(), (x.shape[-1],), w.double(), eps)

    x = torch.randn(3, 16, 200, device=device, dtype=torch.float16)
    w = torch.rand(200, device=device, dtype=torch.float16) + 0.5
    torch.testing.assert_close(rms_norm(x, w, 1e-6).double(), ref(x, w, 1e-6), atol=3e-3, rtol=0)
    for eps in (1e-6, 0.5):
        x2 = torch.randn_like(x) * 0.1
        y2 = rms_norm(x2, w, eps)
        assert y2.shape == x2.shape and y2.dtype == x2.dtype
        torch.testing.assert_close(y2.double(), ref(x2, w, eps), atol=3e-3, rtol=0)
    # Bad eps still raises; a weight that needs grad still gets a graph.
    with pytest.raises(ValueError, match="eps"):
        rms_norm(x2, w, -1.0)
    with pytest.raises(TypeError, match="eps"):
        rms_norm(x2, w, "0.1")
    assert rms_norm(x2, w.clone().requires_grad_(), 1e-6).grad_fn is not None


def test_repeat_calls_tell_layouts_apart(device, monkeypatch):
    """Calls of one shape in every layout, twice over: the second round finds a plan
    for each, and each must be the plan of its own layout (strides, a strided or
    misaligned weight, with and without grad, a knob changed), not another's."""
    base = torch.randn(4, 2, 32, device=device)
    w_base = torch.rand(66, device=device) + 0.5
    xs = {
        "contiguous": base[:, 0].contiguous(),
        "row-strided": base[:, 0],
        "transposed": base[:, 0].t().contiguous().t(),
        "misaligned": torch.randn(4 * 32 + 1, device=device)[1:].view(4, 32),
    }
    ws = {"contiguous": w_base[:32], "strided": w_base[::2][:32], "misaligned": w_base[1:33]}
    names = ("FWD_CHUNKED_THRESHOLD", "BWD_CHUNKED_THRESHOLD", "CHUNK_FWD", "CHUNK_BWD")
    knobs = ([getattr(op, name) for name in names], [0, 0, 16, 16])  # whole rows; chunked
    for _ in range(2):
        for values in knobs:
            for name, value in zip(names, values, strict=True):
                monkeypatch.setattr(op, name, value)
            threshold = values[0]
            # Each layout of x with a plain weight, each weight with a plain x.
            pairs = [(xn, "contiguous") for xn in xs] + [("contiguous", wn) for wn in ws]
            for xn, wn in pairs:
                x, w = xs[xn], ws[wn]
                x = x.detach().requires_grad_()
                w = w.detach().requires_grad_()
                with torch.no_grad():
                    y0 = rms_norm(x, w, 0.5)
                y = rms_norm(x, w, EPS)
                dy = torch.randn_like(y)
                dx, dw = torch.autograd.grad(y, (x, w), dy)
                y64, dx64, dw64 = _reference(x, w, dy)
                want0 = F.rms_norm(x.double(), (32,), w.double(), 0.5)
                msg = f"x {xn}, weight {wn}, threshold {threshold}"
                for got, want in ((y0, want0), (y, y64), (dx, dx64), (dw, dw64)):
                    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4, msg=msg)


@pytest.mark.gpu
def test_eviction_hint_follows_the_tensor_size(device):
    """x's loads are hinted evict_last only past twice L2 (lesson 11's 128 MB tensors),
    not on L2-sized ones, where the hint measured slower; there 1024 columns take the
    tuned 4 rows of 2 warps."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    small = torch.empty(l2 // 4096, 1024, device=device, dtype=torch.bfloat16)  # L2 / 2
    big = torch.empty(4 * l2 // 2048, 1024, device=device, dtype=torch.bfloat16)  # 4 x L2
    _, _, meta = op._fwd_plan(small)
    assert (meta["X_EVICT"], meta["ROWS"], meta["num_warps"]) == ("", 4, 2)
    _, _, meta = op._fwd_plan(big)
    assert (meta["X_EVICT"], meta["ROWS"], meta["num_warps"]) == ("evict_last", 4, 8)
    for x in (small, big):
        x.normal_()
        w = torch.randn(1024, device=device, dtype=torch.bfloat16)
        want = F.rms_norm(x.double(), (1024,), w.double(), EPS)
        torch.testing.assert_close(op.rms_norm(x, w, EPS).double(), want, atol=2e-2, rtol=2e-2)


# bf16 only on a GPU: the interpreter's bfloat16 arithmetic is wrong.
HALVES = [torch.float16] + ([torch.bfloat16] if tilebook.is_gpu() else [])


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 1000)])
def test_float32_weight_with_a_16_bit_input(shape, dtype):
    """Mixed precision as torch's norms take it: the parameter kept in float32, the
    activations in 16 bits; y and dx in x's dtype, dw in float32."""
    x, _ = _inputs(shape, dtype, tilebook.device())
    w = 1 + 0.5 * torch.randn(shape[-1], device=x.device)
    x, w = x.requires_grad_(), w.requires_grad_()
    for _ in range(2):  # the first call plans, the second takes the plan
        y = rms_norm(x, w, EPS)
        dy = torch.randn(x.shape, device=x.device).to(dtype)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        y64, dx64, dw64 = _reference(x, w, dy)
        assert (y.dtype, dx.dtype, dw.dtype) == (dtype, dtype, torch.float32)
        torch.testing.assert_close(y.double(), y64, **TOL[dtype])
        torch.testing.assert_close(dx.double(), dx64, **TOL[dtype])
        torch.testing.assert_close(dw.double(), dw64, rtol=1e-3, atol=1e-3 * shape[0])
    other = torch.bfloat16 if dtype == torch.float16 else torch.float16
    with pytest.raises(TypeError, match=r"weight must have the dtype of x \(\w+\), or float32"):
        rms_norm(x, w.to(other))
    with pytest.raises(TypeError, match=r"weight must have the dtype of x \(float32\), got"):
        rms_norm(x.float(), w.half())  # float32 x: the weight is float32 too
