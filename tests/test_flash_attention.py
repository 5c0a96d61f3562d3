"""tilebook.flash_attention: forward and gradients against a float64 reference with
explicit masks (causal, windows, documents, GQA, Nq != Nk), empty rows, strides, errors,
ahead-of-time compilation for sm_90, and bf16/fp16 on a GPU."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import tilebook
from tilebook import _launch
from tilebook.ops import attention_configs
from tilebook.ops import flash_attention as fa
from tilebook.ops.attention_launch import descriptor, tma_ready

DEV = tilebook.device()
# Norm-wise relative error against float64.  fp32: exact dots under the interpreter.
# fp16/bf16: rounding of the inputs' products and of P before P @ V.
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
# The widest type the op takes here: float32 under the interpreter; a GPU's kernels
# take 16-bit types only, so the same tests run there in bfloat16.
FLOAT = torch.bfloat16 if tilebook.is_gpu() else torch.float32


def reference(q, k, v, *, causal=False, scale=None, window=None, document_ids=None):
    """Attention in float64 with the mask written out element by element."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    i = torch.arange(Nq, device=q.device)[:, None] + (Nk - Nq)  # i', bottom-right aligned
    j = torch.arange(Nk, device=q.device)[None, :]
    visible = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= i
    if window is not None:
        left, right = window
        if left is not None:
            visible &= j >= i - left
        if right is not None:
            visible &= j <= i + right
    visible = visible.expand(B, 1, Nq, Nk)
    if document_ids is not None:
        same = document_ids[:, :, None] == document_ids[:, None, :]
        visible = visible & same[:, None]
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    # A row with no visible key: softmax gives NaN; the op's contract is 0.
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return p @ v


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_qkv(B, H, Hkv, Nq, Nk, D, dtype=FLOAT):
    q = torch.randn(B, H, Nq, D, dtype=dtype, device=DEV)
    k = torch.randn(B, Hkv, Nk, D, dtype=dtype, device=DEV)
    v = torch.randn(B, Hkv, Nk, D, dtype=dtype, device=DEV)
    return q, k, v


def check_against_reference(q, k, v, tol=None, **kw):
    """Forward and all three gradients against float64; returns the output."""
    tol = tol or TOL[q.dtype]
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fa.flash_attention(q, k, v, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "NaN or inf in the output"
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, **kw)
    rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    for name, got, want in (("out", out, ref), ("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert torch.isfinite(got).all(), f"{name} has NaN or inf"
        if want.abs().max() == 0:
            assert got.abs().max() == 0, f"{name} should be exactly zero"
            continue
        err = rel_err(got, want)
        assert err < tol, f"{name}: relative error {err:.2e} (tolerance {tol:.0e}) for {kw}"
    return out


# (B, H, Hkv, Nq, Nk, D): ragged lengths below and above a tile, Nq != Nk both ways, GQA.
SHAPES = [
    (1, 2, 2, 37, 53, 32),
    (1, 2, 2, 53, 37, 32),
    (2, 4, 2, 37, 53, 64),
    (1, 3, 1, 16, 16, 32),
]
MASKS = [
    {},
    {"causal": True},
    {"window": (9, 4)},
    {"causal": True, "window": (12, None)},
    {"window": (None, 5)},
]


@pytest.mark.parametrize("dtype", [FLOAT, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(m) or "full")
def test_matches_float64(shape, mask, dtype):
    check_against_reference(*make_qkv(*shape, dtype=dtype), **mask)


def test_custom_scale():
    q, k, v = make_qkv(1, 2, 1, 29, 41, 32)
    check_against_reference(q, k, v, scale=0.3, causal=True)


def _sorted_documents(batch: int, n: int) -> torch.Tensor:
    rows = []
    for b in range(batch):
        lengths = torch.randint(1, max(2, n // 3), (n,)).tolist()
        ids = torch.repeat_interleave(torch.arange(n), torch.tensor(lengths))[:n]
        rows.append(ids + 10 * b)
    return torch.stack(rows).to(DEV)


@pytest.mark.parametrize("dtype", [FLOAT, torch.float16])
@pytest.mark.parametrize(
    "mask", [{}, {"causal": True}, {"causal": True, "window": (8, None)}], ids=str
)
def test_documents(mask, dtype):
    q, k, v = make_qkv(2, 2, 1, 45, 45, 32, dtype=dtype)
    docs = _sorted_documents(2, 45)
    check_against_reference(q, k, v, document_ids=docs, **mask)


def test_unsorted_documents():
    q, k, v = make_qkv(2, 2, 2, 40, 40, 32)
    docs = torch.randint(0, 3, (2, 40), device=DEV, dtype=torch.int32)
    check_against_reference(q, k, v, document_ids=docs, causal=True)


def test_document_ranges_cover_every_visible_key():
    """Every (query, key) pair of one document lies in its tile's range; the fully
    visible part only holds keys that all of the tile's rows see."""
    for docs in (_sorted_documents(3, 70), torch.randint(0, 4, (2, 70), device=DEV)):
        for block in (16, 32):
            ranges = fa.document_ranges(docs, block).cpu()
            ids = docs.cpu()
            n = ids.shape[1]
            for b in range(ids.shape[0]):
                for t in range(ranges.shape[1]):
                    lo, hi, flo, fhi = ranges[b, t].tolist()
                    rows = ids[b, t * block : (t + 1) * block]
                    seen = torch.isin(ids[b], rows).nonzero().flatten()
                    assert lo <= seen.min() and seen.max() < hi
                    for j in range(max(flo, 0), min(fhi, n)):
                        assert (rows == ids[b, j]).all()


@pytest.fixture
def fresh_plans():
    """No plan of an earlier call, before and after: a call planned under other tiles
    (or with the launch watched) would be taken as it was."""
    _launch.PLANS.clear()
    yield _launch.PLANS
    _launch.PLANS.clear()


# The interpreter's tiles, swapped for shapes that stress the tile-range arithmetic:
# a query tile larger and smaller than a key tile, and one of equal size.
TILINGS = [
    {"fwd": fa.KernelConfig(16, 32, 4, 1), "dkdv": fa.KernelConfig(32, 16, 4, 1),
     "dq": fa.KernelConfig(16, 32, 4, 1)},
    {"fwd": fa.KernelConfig(16, 16, 4, 1), "dkdv": fa.KernelConfig(16, 16, 4, 1),
     "dq": fa.KernelConfig(16, 16, 4, 1)},
]  # fmt: skip


@pytest.mark.skipif(not tilebook.is_interpreter(), reason="swaps the interpreter's tiles")
@pytest.mark.parametrize("tiling", range(len(TILINGS)))
@pytest.mark.parametrize(
    "mask",
    [{"causal": True}, {"window": (20, 3)}, {"causal": True, "window": (5, None)}, {}],
    ids=str,
)
def test_other_tilings(tiling, mask, monkeypatch, fresh_plans):
    monkeypatch.setattr(attention_configs, "INTERPRETER", TILINGS[tiling])
    q, k, v = make_qkv(1, 2, 1, 70, 51, 32)
    check_against_reference(q, k, v, **mask)
    docs = _sorted_documents(1, 51)
    q, k, v = make_qkv(1, 2, 1, 51, 51, 32)
    check_against_reference(q, k, v, document_ids=docs, **mask)


def test_queries_that_see_no_key_give_zero():
    # Causal with Nq > Nk: the first Nq - Nk queries come before every key.
    q, k, v = make_qkv(1, 2, 1, 40, 20, 32)
    out = check_against_reference(q, k, v, causal=True)
    assert (out[:, :, :20] == 0).all()
    assert out[:, :, 20:].abs().amax() > 0
    # A window that excludes every key: all zeros, gradients too.
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 24, 24, 32))
    out = fa.flash_attention(q, k, v, window=(-3, -5))
    out.backward(torch.randn_like(out))
    assert (out == 0).all()
    for t in (q, k, v):
        assert (t.grad == 0).all()


def test_empty_sequences():
    q, k, v = make_qkv(1, 2, 2, 5, 0, 32)
    q.requires_grad_()
    out = fa.flash_attention(q, k, v)
    assert out.shape == (1, 2, 5, 32) and (out == 0).all()
    out.sum().backward()
    assert (q.grad == 0).all()
    q, k, v = make_qkv(0, 2, 2, 5, 7, 32)
    assert fa.flash_attention(q, k, v).shape == (0, 2, 5, 32)


def test_strided_inputs():
    B, N, H, D = 2, 33, 4, 32
    # (B, N, H, D) projections viewed as (B, H, N, D): read in place by the descriptors.
    qkv = torch.randn(B, N, 3, H, D, device=DEV, dtype=FLOAT)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert tma_ready(q) and not q.is_contiguous()
    check_against_reference(q, k, v, causal=True)
    # A head dim cut out of a wider one, rows 16-byte misaligned: copied first.
    wide = torch.randn(1, 2, 30, 37, device=DEV, dtype=FLOAT)
    q = wide[..., 1:33]
    assert not tma_ready(q)
    k, v = (torch.randn(1, 2, 19, 32, device=DEV, dtype=FLOAT) for _ in range(2))
    check_against_reference(q, k, v)


def test_gradient_flows_through_expanded_grad():
    # .sum().backward() sends an expanded (stride 0) dO: it must be copied, not read.
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 1, 21, 21, 32))
    fa.flash_attention(q, k, v, causal=True).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    reference(q64, k64, v64, causal=True).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert rel_err(got, want) < TOL[FLOAT]


def test_exported():
    assert tilebook.flash_attention is fa.flash_attention


def _err(exc, match, *args, **kw):
    with pytest.raises(exc, match=match):
        fa.flash_attention(*args, **kw)


def test_bad_inputs():
    q, k, v = make_qkv(1, 4, 2, 8, 8, 32)
    _err(TypeError, "q must be a torch.Tensor", q.tolist(), k, v)
    _err(ValueError, "4 dimensions", q[0], k, v)
    _err(ValueError, "4 dimensions", q, k[0], v)
    _err(
        ValueError,
        "multiple of the key/value heads",
        q,
        k[:, :1].expand(1, 3, 8, 32),
        v[:, :1].expand(1, 3, 8, 32),
    )
    _err(ValueError, "head dim", q, k[..., :16], v[..., :16])
    _err(ValueError, "same shape", q, k, v[:, :, :4])
    _err(ValueError, "batch", q, torch.cat([k, k]), torch.cat([v, v]))
    _err(TypeError, "same dtype", q, k.half(), v.half())
    _err(TypeError, "dtype", q.int(), k.int(), v.int())
    _err(
        ValueError,
        "head dim 50 is not supported; supported: multiples of 8",
        *make_qkv(1, 2, 2, 8, 8, 50),
    )
    _err(ValueError, "head dim 264 is not supported", *make_qkv(1, 2, 2, 8, 8, 264))
    meta = torch.empty(1, 4, 8, 32, device="meta")
    _err(ValueError, "device|on meta", meta, k, v)
    _err(TypeError, "causal must be a bool", q, k, v, causal=1)
    _err(TypeError, "scale", q, k, v, scale="0.1")
    _err(ValueError, "scale", q, k, v, scale=-1.0)
    _err(ValueError, "scale", q, k, v, scale=float("nan"))
    _err(TypeError, "window", q, k, v, window=5)
    _err(TypeError, "window", q, k, v, window=(1, 2, 3))
    _err(TypeError, "left bound", q, k, v, window=(1.5, None))
    _err(TypeError, "right bound", q, k, v, window=(None, True))
    ids = torch.zeros(1, 8, dtype=torch.int64, device=DEV)
    _err(TypeError, "document_ids", q, k, v, document_ids=ids.float())
    _err(TypeError, "document_ids", q, k, v, document_ids=ids.bool())
    _err(ValueError, "shape", q, k, v, document_ids=ids[:, :5])
    _err(ValueError, "dimensions", q, k, v, document_ids=ids[0])
    _err(ValueError, "as many queries as keys", q, k[:, :, :5], v[:, :, :5], document_ids=ids)
    # After calls that were planned and kept, arguments of the same layout still get
    # their errors: a bool bound, and ids of another dtype.
    fa.flash_attention(q, k, v, window=(1, 2))
    _err(TypeError, "left bound", q, k, v, window=(True, 2))
    fa.flash_attention(q, q, q, document_ids=ids)
    _err(TypeError, "document_ids", q, q, q, document_ids=ids.bool())
    _err(TypeError, "causal must be a bool", q, q, q, causal=0, document_ids=ids)
    _err(TypeError, "must be a torch.Tensor", q, k, v, document_ids=[0] * 8)


# --------------------------------------------------------------------------- compiled code


# Ahead of time for an H100, no GPU needed: the forward's products must be wgmma
# (HGMMA in SASS) fed by the copy engine (UTMALDG), with no register spills.
def test_forward_compiles_to_wgmma_for_sm90():
    for causal in (False, True):
        cfg = fa.CONFIGS[(90, 128, "bf16", causal)]["fwd"]
        k = fa.compile_ahead("fwd", cfg, 128, "bf16", band=causal)
        assert k.stages["sass"], "no SASS came back"
        assert k.count("HGMMA") > 0, "the forward's dots did not lower to wgmma"
        assert k.count("UTMALDG") > 0, "tiles are not loaded by the copy engine"
        assert k.spill_stores_bytes == 0, f"{k.spill_stores_bytes} bytes of register spills"


@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
def test_backward_compiles_to_wgmma_for_sm90(kernel):
    cfg = fa.CONFIGS[(90, 64, "bf16", True)][kernel]
    k = fa.compile_ahead(kernel, cfg, 64, "bf16", band=True, documents=True)
    assert k.count("HGMMA") > 0, f"{kernel}: dots did not lower to wgmma"
    assert k.count("UTMALDG") > 0


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize(
    "mask",
    [{}, {"causal": True}, {"causal": True, "window": (100, None)}, {"window": (77, 31)}],
    ids=str,
)
def test_gpu_ragged(dtype, D, mask):
    q, k, v = make_qkv(2, 4, 2, 300, 433, D, dtype=dtype)
    check_against_reference(q, k, v, **mask)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_large_bf16(causal):
    q, k, v = make_qkv(1, 4, 1, 4096, 4096, 128, dtype=torch.bfloat16)
    check_against_reference(q, k, v, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [32, 256])
def test_gpu_other_head_dims(D):
    q, k, v = make_qkv(1, 2, 1, 257, 300, D, dtype=torch.bfloat16)
    check_against_reference(q, k, v, causal=True)


@pytest.mark.gpu
def test_gpu_documents_bf16():
    q, k, v = make_qkv(2, 4, 4, 2000, 2000, 128, dtype=torch.bfloat16)
    docs = _sorted_documents(2, 2000)
    check_against_reference(q, k, v, document_ids=docs, causal=True)
    check_against_reference(q, k, v, document_ids=docs, window=(300, 300))


@pytest.mark.gpu
def test_gpu_other_device_index():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    dev = torch.device("cuda:1")
    q, k, v = (torch.randn(1, 2, 100, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
    out = fa.flash_attention(q, k, v, causal=True)
    assert out.device == dev
    assert rel_err(out, reference(q, k, v, causal=True)) < TOL[torch.bfloat16]


def test_repeat_calls_agree_with_fresh_ones(fresh_plans):
    # A call of a kind seen before takes that call's plan (tilebook._launch.PLANS), on a
    # GPU with the binaries it compiled; each call brings new data, and must still be
    # right.  Grad and no-grad calls, a mask, and a strided q.
    dtype = FLOAT
    sizes = []
    for step in range(3):
        q, k, v = make_qkv(1, 4, 2, 70, 90, 64, dtype=dtype)
        if step == 2:  # the layout of (B, N, H, D).transpose(1, 2), read in place
            q = q.transpose(1, 2).contiguous().transpose(1, 2)
        with torch.no_grad():
            out = fa.flash_attention(q, k, v, causal=True)
        want = reference(q.double(), k.double(), v.double(), causal=True)
        assert rel_err(out, want) < TOL[dtype]
        check_against_reference(q, k, v, window=(20, 5))
        sizes.append(len(fresh_plans))
    # one plan per kind (causal; the window, with a backward), two more for the strided q
    assert sizes == [2, 2, 4]


def test_launch_key_is_finer_than_tritons_specialisation():
    """Arguments that share a launch key (tilebook._launch.launch_key) must
    be ones Triton compiles alike (asked of Triton's own specialisation function, for
    every pair of sample descriptors, ints, floats and tensors)."""
    key = _launch._arg_key
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:  # pragma: no cover - depends on the installed Triton
        pytest.skip("this Triton has no native_specialize_impl to ask")

    def triton_says(v):
        return native_specialize_impl(BaseBackend, v, False, True, True)

    base = torch.empty(2, 4, 64, 64, dtype=torch.bfloat16, device=DEV)
    views = [base, base[:, :, :32], base.transpose(1, 2), base.half(), base[:1]]
    samples = [descriptor(t, rows) for t in views for rows in (16, 32)]
    samples += [0, 1, 16, 17, 2**31 + 16, -3, 0.5, 1.0, base[0, 0], base[0, 0, 0, 1:]]
    for i, a in enumerate(samples):
        for b in samples[i + 1 :]:
            if key(a) == key(b):
                assert triton_says(a) == triton_says(b), (a, b)
    # ...and not so fine that two tensors laid out alike never share a launch.
    other = torch.empty_like(base)
    assert key(descriptor(base, 16)) == key(descriptor(other, 16))


class _Watch:
    """Launches through tilebook._launch, counted: ``anew`` for those that go through
    Triton's launch (a first call compiles there), ``again`` for the starts of a kept
    kernel.  On the CPU, where no kernel is kept, a step that launched once starts
    again by running its kernel in the interpreter, as a GPU starts the kept binary."""

    def __init__(self, monkeypatch):
        self.anew, self.again, self.refuse = [], [], False
        self.launched = {}
        real_launch, real_call = _launch.launch, _launch.Step.__call__

        def launch(kernel, grid, *args, **meta):
            self.anew.append(kernel)
            return real_launch(kernel, grid, *args, **meta)

        def call(step, *args):
            if self.refuse:
                kept = False
            elif not tilebook.is_interpreter():
                kept = real_call(step, *args)
            elif id(step) not in self.launched:
                kept = False
            else:
                step._kernel[step.grid](*args, **step.meta)
                kept = True
            if kept:
                self.again.append(step._kernel)
            return kept

        def anew(step, *args):
            self.launched[id(step)] = step  # kept alive: no later step takes its id
            return real_anew(step, *args)

        real_anew = _launch.Step.anew
        monkeypatch.setattr(_launch, "launch", launch)
        monkeypatch.setattr(_launch.Step, "__call__", call)
        monkeypatch.setattr(_launch.Step, "anew", anew)

    def counts(self) -> tuple[int, int]:
        return len(self.anew), len(self.again)


def test_repeat_calls_start_the_kept_launches(monkeypatch, fresh_plans):
    """A repeat call goes through Triton's launch no more: its forward, and from its
    second backward on its backward, start the kernels kept by the first call's plan,
    with new tensors and scales, and give the right answers.  Calls of another kind
    (a window, documents, an int scale, another layout, causal off) and a dO that is not
    contiguous are planned on their own; bad arguments still raise."""
    # D=32: the Triton forward on every GPU (the Gluon one takes 64 and 128).
    watch = _Watch(monkeypatch)
    q, k, v = make_qkv(1, 4, 2, 40, 56, 32)
    fa.flash_attention(q, k, v, causal=True)  # the first call: checked, planned, launched
    assert watch.counts() == (1, 0)
    for step, scale in enumerate((None, 0.2, None)):  # new tensors each time
        q, k, v = make_qkv(1, 4, 2, 40, 56, 32)
        out = fa.flash_attention(q, k, v, causal=True, scale=scale)
        want = reference(q, k, v, causal=True, scale=scale)
        assert rel_err(out, want) < TOL[FLOAT]
        # with grad: the kept forward; the backward's three kernels anew the first time
        check_against_reference(q, k, v, causal=True, scale=scale)
        assert watch.counts() == (4, 2 * step + 2 + 3 * step)
    assert set(watch.again) == {fa._fwd_kernel, fa._bwd_dkdv_kernel, fa._bwd_dq_kernel,
                                fa._bwd_preprocess_kernel}  # fmt: skip
    docs = torch.zeros(1, 40, dtype=torch.int32, device=DEV)
    q2 = q.transpose(2, 3).contiguous().transpose(2, 3)  # D no longer contiguous
    for args, extra in (
        ((q, k, v), {"causal": True, "window": (8, None)}),
        ((q, q, q), {"causal": True, "document_ids": docs}),
        ((q, k, v), {"causal": True, "scale": 1}),
        ((q2, k, v), {"causal": True}),
        ((q, k, v), {"causal": False}),
    ):
        before = watch.counts()
        check_against_reference(*args, **extra)
        assert watch.counts()[0] == before[0] + 4, extra  # a forward and a backward, planned
    # A dO that is not contiguous: the backward is planned for it, the forward kept.
    before = watch.counts()
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = fa.flash_attention(qg, kg, vg, causal=True)
    dout = torch.randn(1, 4, 32, 40, device=DEV, dtype=FLOAT).transpose(2, 3)
    got = torch.autograd.grad(out, (qg, kg, vg), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(
        reference(q64, k64, v64, causal=True), (q64, k64, v64), dout.double()
    )
    assert all(rel_err(g, w) < TOL[FLOAT] for g, w in zip(got, want, strict=True))
    assert watch.counts() == (before[0] + 3, before[1] + 1)
    # Bad arguments on a kept kind still raise.
    with pytest.raises(ValueError, match="scale"):
        fa.flash_attention(q, k, v, causal=True, scale=-1.0)
    with pytest.raises(TypeError, match="causal"):
        fa.flash_attention(q, k, v, causal=1)
    # Kept kernels that decline (a hook listens, another device is current): launched
    # through Triton again, with the right answers.
    watch.refuse = True
    before = watch.counts()
    check_against_reference(q, k, v, causal=True)
    assert watch.counts() == (before[0] + 4, before[1])


def test_sm_scale_is_the_former_name_of_scale(monkeypatch):
    """``scale=`` as SDPA spells it; ``sm_scale=`` still works, with one FutureWarning."""
    monkeypatch.setattr(fa, "_WARNED_SM_SCALE", False)
    q, k, v = make_qkv(1, 2, 1, 9, 13, 32)
    want = fa.flash_attention(q, k, v, causal=True, scale=0.3)
    with pytest.warns(FutureWarning, match="sm_scale= is now scale="):
        got = fa.flash_attention(q, k, v, causal=True, sm_scale=0.3)
    assert torch.equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the second call is silent
        assert torch.equal(fa.flash_attention(q, k, v, causal=True, sm_scale=0.3), want)
    assert not torch.equal(fa.flash_attention(q, k, v, causal=True), want)
    with pytest.raises(TypeError, match="not both"):
        fa.flash_attention(q, k, v, scale=0.3, sm_scale=0.3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'softmax_scale'"):
        fa.flash_attention(q, k, v, softmax_scale=0.3)


@pytest.mark.parametrize("D", [8, 48, 80, 96])
def test_head_dims_between_the_tiles_run_padded_and_exact(D):
    """Any multiple of 8 up to 256, as FlashAttention takes: forward and gradients
    against float64, with grouped heads, a causal window and a short query block."""
    q, k, v = make_qkv(1, 4, 2, 24, 40, D)
    out = check_against_reference(q, k, v, causal=True, window=(16, None))
    assert out.shape[-1] == D and out.is_contiguous()
    # the default scale is D's, not the padded width's
    ref = reference(q, k, v, scale=1 / math.sqrt(D))
    assert rel_err(fa.flash_attention(q, k, v), ref) < TOL[q.dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("D", [80, 96])
def test_gpu_head_dims_80_and_96_in_half_precision(D):
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = make_qkv(2, 8, 2, 300, 300, D, dtype=dtype)
        check_against_reference(q, k, v, causal=True)
