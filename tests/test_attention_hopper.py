"""tilebook.ops.attention_hopper: the Gluon forward for sm_90.  Compiled ahead of time
here (any machine with a Triton that has Gluon); on an sm_90 GPU, checked against the
Triton forward and float64, and shown to be the forward flash_attention takes."""

from __future__ import annotations

import re

import pytest
import torch
from test_flash_attention import check_against_reference, make_qkv, reference, rel_err

import tilebook
from tilebook import _launch
from tilebook.ops import attention_hopper as ah
from tilebook.ops import attention_launch
from tilebook.ops import flash_attention as fa
from tilebook.ops.attention_masks import mask_for

DEV = tilebook.device()


def _sm90() -> bool:
    return tilebook.is_gpu() and torch.cuda.get_device_capability() == (9, 0)


needs_gluon = pytest.mark.skipif(not ah.available(), reason="this Triton has no Gluon")
needs_sm90 = pytest.mark.skipif(not _sm90(), reason="the Gluon forward runs on sm_90 only")


@needs_gluon
@pytest.mark.parametrize(("head_dim", "band"), [(128, False), (64, True)])
def test_compiles_for_sm90_with_the_overlapped_schedule(head_dim, band):
    k = ah.compile_ahead(head_dim, "bf16", band=band)
    assert k.spill_stores_bytes == 0, k.ptxas_log
    assert k.shared_bytes <= 227 * 1024, f"{k.shared_bytes} bytes of shared memory"
    assert k.registers * 32 * k.num_warps <= 65536, "the launch's registers do not fit an SM"
    assert "HGMMA" in k.stage("sass") and "UTMALDG" in k.stage("sass")
    ptx = k.ptx
    assert ptx.count("wgmma.mma_async") > 0, "the products are not wgmma"
    assert ptx.count("cp.async.bulk.tensor") > 0, "the tiles are not TMA copies"
    # The producer gives registers away, the consumers take them.
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    # The schedule itself: a wait that leaves one product (P @ V) in flight.
    assert k.overlapped_waits > 0, "no wait leaves a product in flight"


def test_compile_ahead_rejects_what_it_does_not_build():
    with pytest.raises(ValueError, match="head_dim"):
        ah.compile_ahead(96)
    with pytest.raises(ValueError, match="dtype"):
        ah.compile_ahead(128, "fp32")


@needs_gluon
def test_forward_launches_the_kernel_compile_ahead_compiles():
    # compile_ahead (and lesson 12's listing) compiles _fwd_kernel: forward must
    # launch that kernel, with the grid of two 64-row query tiles a program.
    q, k, v = make_qkv(2, 4, 2, 300, 433, 128, dtype=torch.bfloat16)
    o, lse = torch.empty_like(q), torch.empty(2, 4, 300)
    layouts = tuple((t.shape, t.stride()) for t in (q, k, v, o))
    seen = []

    def launch(kernel, grid, *args, **meta):
        seen.append((kernel, grid, args, meta))
        return "launched"

    assert ah.forward(launch, q, k, v, o, lse, layouts, 0.1, 5, 0, True) == "launched"
    kernel, grid, args, meta = seen[0]
    assert kernel is ah._fwd_kernel
    assert grid == (2 * 4 * 3,)  # cdiv(300, 128) programs per (batch, head)
    assert meta["BAND"] is True and meta["NS"] == ah.STAGES and meta["num_warps"] == 4
    assert [a.block_shape for a in args[:4]] == [[1, 1, 64, 128], [1, 1, 128, 128],
                                                 [1, 1, 128, 128], [1, 1, 64, 128]]  # fmt: skip
    assert args[4] is lse and args[6:] == (4, 2, 300, 433, 5, 0, 3)


@needs_gluon
def test_a_plan_starts_the_gluon_launch_again_with_the_same_arguments(monkeypatch):
    # A flash_attention call's plan (tilebook.ops.attention_launch.FwdPlan) starts its
    # Gluon step again with arguments laid out exactly as forward's first launch
    # (descriptors, scale, sizes, mask bounds), and its kernel, grid and constexprs.
    q, k, v = make_qkv(2, 4, 2, 300, 433, 128, dtype=torch.bfloat16)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # strided, read in place
    o, lse = torch.empty_like(q.contiguous()), torch.empty(2, 4, 300)
    mask = mask_for(True, (50, None), 300, 433)
    first, again = [], []
    layouts = attention_launch.views((t.shape, t.stride()) for t in (q, k, v, o))
    ah.forward(lambda *a, **m: first.append((a, m)), q, k, v, o, lse, layouts, 0.1, mask.left,
               mask.right, mask.band)  # fmt: skip
    monkeypatch.setattr(ah, "usable", lambda q, k, documents: True)
    monkeypatch.setattr(_launch.Step, "__call__", lambda step, *a: again.append((step, a)) or True)
    plan = attention_launch.FwdPlan(q, k, v, mask, {}, False)
    o2, lse2 = attention_launch.forward(plan, q, k, v, None, 0.1)
    ((kernel, grid, *a), meta), (step, b) = first[0], again[0]
    assert (step._kernel, step.grid, step.meta) == (kernel, grid, meta)
    assert len(a) == len(b) and b[4] is lse2 and b[3].base is o2
    for x, y in zip(a[:4], b[:4], strict=True):
        assert (x.shape, x.strides, x.block_shape, x.layout) == (
            y.shape, y.strides, y.block_shape, y.layout)  # fmt: skip
    assert tuple(a[5:]) == b[5:]


@needs_gluon
def test_a_failing_gluon_forward_falls_back_to_the_triton_one(monkeypatch):
    # Wherever this runs: the Gluon path is taken and its launch fails, as an
    # incompatible Triton's Gluon would.  The op must warn once, answer with the
    # Triton forward, and not try Gluon again; asked for Gluon alone, it must raise.
    dtype = torch.bfloat16 if tilebook.is_gpu() else torch.float16
    q, k, v = make_qkv(1, 2, 1, 40, 40, 64, dtype=dtype)
    monkeypatch.setattr(ah, "_BROKEN", False)
    monkeypatch.setattr(ah, "usable", lambda q, k, documents: not ah._BROKEN)
    calls = []

    def failing_launch(*args, **meta):
        calls.append(1)
        raise RuntimeError("PassManager::run failed")

    real_forward = ah.forward
    monkeypatch.setattr(
        ah, "forward", lambda launch, *a, **k: real_forward(failing_launch, *a, **k)
    )
    mask = mask_for(True, None, 40, 40)
    cfg = fa.pick_configs(64, q.dtype, True, q.device)["fwd"]
    kw = {"sm_scale": 0.125, "mask": mask, "document_ids": None, "config": cfg}
    with pytest.warns(RuntimeWarning, match="Gluon flash-attention forward failed"):
        o, _ = fa.attention_forward(q, k, v, **kw)
    want = reference(q, k, v, causal=True, scale=0.125)
    assert rel_err(o, want) < (2e-2 if dtype == torch.bfloat16 else 3e-3)
    assert ah._BROKEN and not ah.available()
    fa.attention_forward(q, k, v, **kw)  # no second try, no second warning
    assert len(calls) == 1
    monkeypatch.setattr(ah, "_BROKEN", False)
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="Gluon"):
        fa.attention_forward(q, k, v, gluon=True, **kw)


def test_usable_only_where_it_applies():
    q, k, _ = make_qkv(1, 2, 1, 64, 64, 64, dtype=torch.bfloat16)
    assert not ah.usable(q, k, documents=True)
    assert not ah.usable(q.float(), k.float(), documents=False)
    if not _sm90():
        assert not ah.usable(q, k, documents=False)


def test_asking_for_gluon_where_it_does_not_apply_is_an_error():
    if _sm90():
        pytest.skip("applies on this GPU")
    dtype = torch.bfloat16 if tilebook.is_gpu() else torch.float32
    q, k, v = make_qkv(1, 2, 1, 64, 64, 64, dtype=dtype)
    mask = mask_for(False, None, 64, 64)
    with pytest.raises(ValueError, match="sm_90"):
        fa.attention_forward(q, k, v, sm_scale=0.125, mask=mask, document_ids=None,
                             config=fa.pick_configs(64, q.dtype, False, q.device)["fwd"],
                             gluon=True)  # fmt: skip


# --------------------------------------------------------------------------- sm_90


CASES = [
    # (B, H, Hkv, Nq, Nk, mask)
    (2, 4, 2, 300, 433, {}),
    (2, 4, 2, 300, 433, {"causal": True}),
    (1, 4, 4, 433, 300, {"causal": True}),  # the first 133 rows see no key
    (1, 2, 1, 256, 256, {"window": (77, 31)}),
    (1, 2, 2, 1, 1000, {"causal": True, "window": (100, None)}),
    (1, 3, 1, 1000, 129, {}),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_gluon_forward_agrees_with_the_triton_forward(case, D, dtype):
    B, H, Hkv, Nq, Nk, mask = case
    q, k, v = make_qkv(B, H, Hkv, Nq, Nk, D, dtype=dtype)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # a (B, N, H, D) layout, in place
    m = mask_for(mask.get("causal", False), mask.get("window"), Nq, Nk)
    cfg = fa.pick_configs(D, dtype, m.band, q.device)["fwd"]
    kw = {"sm_scale": D**-0.5, "mask": m, "document_ids": None, "config": cfg}
    o_g, lse_g = fa.attention_forward(q, k, v, gluon=True, **kw)
    o_t, lse_t = fa.attention_forward(q, k, v, gluon=False, **kw)
    want = reference(q, k, v, **mask)
    assert torch.isfinite(o_g).all()
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    if want.abs().max() > 0:
        assert rel_err(o_g, want) < tol
        assert rel_err(o_g, o_t.double()) < tol
    assert torch.equal(torch.isinf(lse_g), torch.isinf(lse_t)), "rows that see no key differ"
    seen = ~torch.isinf(lse_t)
    assert (lse_g[seen] - lse_t[seen]).abs().max() < 1e-2
    assert (o_g[~seen.unsqueeze(-1).expand_as(o_g)] == 0).all()


@pytest.mark.gpu
@needs_sm90
def test_gpu_flash_attention_takes_the_gluon_forward(monkeypatch):
    calls = []
    real = ah.forward

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(ah, "forward", counting)
    _launch.PLANS.clear()  # a plan of an earlier call would not ask forward
    q, k, v = make_qkv(1, 4, 2, 500, 500, 128, dtype=torch.bfloat16)
    check_against_reference(q, k, v, causal=True)
    assert calls, "flash_attention did not take the Gluon forward on an sm_90 GPU"
    assert ah.available(), "Gluon failed and the Triton forward took over"
