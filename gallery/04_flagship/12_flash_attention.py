"""
12. flash attention: forward and backward, from the pieces of 04-11
===================================================================

Attention, ``softmax(Q K^T / sqrt(D)) V``, is where a transformer spends its
time.  As three PyTorch operations it builds an ``N x N`` matrix of scores per
head and sends it through :term:`HBM` and back.  Flash attention (Dao et al.,
2022) never builds it: each program keeps a tile of queries on chip, streams
the keys and values past it and finishes every row in one pass, with the
online softmax of lesson 06.  Lessons 04 to 11 taught every piece.

.. rubric:: You will learn

- the forward from lessons 04-09: pointer tiles, two ``tl.dot`` per tile,
  the online softmax in base 2, a loop over key tiles;
- causal masking that skips whole tiles; the log-sum-exp kept for backward;
- the backward as lesson 10's softmax backward on tiles, summed in
  :term:`registers <register>` (lesson 11) instead of with atomics;
- grouped heads, sliding windows and documents as tile bounds, and the same
  masks as FlexAttention's ``mask_mod`` and block masks;
- how the package compares with cuDNN, FlashAttention and FlexAttention.

The finished op is :func:`tilebook.flash_attention` (grouped heads, windows,
documents, autograd); kernels, launchers and tuned configurations are in
:mod:`tilebook.ops.flash_attention`.
"""

# %%
# Setting up
# ----------
# :mod:`tilebook` first (it picks the GPU or the interpreter).  The measurement
# is defined once, in :mod:`tilebook.course.experiments.flash_attention` (``xp``).

import tilebook

import math
import warnings

import torch
import triton
import triton.language as tl
from torch.nn.attention import flex_attention as flex

import tilebook.ops.flash_attention as fa
from tilebook.ops import attention_hopper
from tilebook.course.aot import compile_kernel, instruction_table
from tilebook.course.bench import load_record, record_or_measure
from tilebook.course.check import CorrectnessReport
from tilebook.course.claims import Claims, speedup
from tilebook.course.datasheet import fact
from tilebook.course.experiments import flash_attention as xp
from tilebook.course.plots import no_record_message, plot_record
from tilebook.course.prose import say
from tilebook.course.tables import table
from tilebook.course.widgets_attention import (
    TilingStepper,
    block_mask_states,
    tile_states,
)

print(tilebook.banner())
DEVICE, GPU, LOG2E = tilebook.device(), tilebook.is_gpu(), math.log2(math.e)
# FlexAttention without torch.compile (small checks below) warns that it is slow.
warnings.filterwarnings("ignore", "flex_attention called without torch.compile")

# %%
# Attention in tiles
# ------------------
# For one head, with :math:`c = 1/\sqrt{D}`: :math:`S = c\,Q K^T`,
# :math:`P = \mathrm{softmax}_{\text{rows}}(S)`, :math:`O = P V`.  A program
# keeps ``BLOCK_M`` rows of :math:`Q` on chip (in registers) and walks over
# :math:`K` and :math:`V` in tiles of ``BLOCK_N`` rows, as lesson 09 walks
# along ``K``.  Per tile: scores by ``tl.dot`` (lesson 05); lesson 06's
# running maximum :math:`m` and sum :math:`\ell`, with
# :math:`\alpha = 2^{m_{old} - m_{new}}` rescaling the sum when the maximum
# grows; ``acc = alpha * acc + P V`` by a second ``tl.dot``; at the end
# ``O = acc / l``.  Base 2: the GPU's exponential is ``exp2`` (``MUFU.EX2``),
# so :math:`\log_2 e` joins the scale once, ``qk_scale = c * log2(e)``.
#
# The smallest kernel: one query tile, all keys
# ---------------------------------------------
# A program per query tile and (batch, head): a 2-D grid (lesson 02).
#
# ``q_ptr, k_ptr, v_ptr, o_ptr``, ``stride_q*``, ``stride_k*``
#     ``(B, H, N, D)`` tensors and the steps between their batches, heads and
#     rows (``o`` shares ``q``'s, ``v`` ``k``'s); any layout, as in lesson 04.
# ``H, Nq, Nk, qk_scale``
#     Heads, queries, keys, scale.  Ragged last tiles: rows past ``Nq`` load
#     zeros and are not stored; keys past ``Nk`` score ``-inf``.
# ``HEAD_DIM, BLOCK_M, BLOCK_N``
#     ``D`` and the tile shape, constants for ``tl.arange`` and ``tl.dot``.


@triton.jit
def attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    H,
    Nq,
    Nk,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b, h = tl.program_id(1) // H, tl.program_id(1) % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptr + rows, mask=offs_m[:, None] < Nq, other=0.0)  # stays resident
    kv_head = b * stride_kb + h * stride_kh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running maximum, base 2
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running P @ V
    for start_n in range(0, Nk, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keys = offs_n[:, None] * stride_kn + offs_d[None, :]
        k = tl.load(k_ptr + kv_head + keys, mask=offs_n[:, None] < Nk, other=0.0)
        s = tl.dot(q, k.T) * qk_scale
        s = tl.where(offs_n[None, :] < Nk, s, float("-inf"))  # the ragged edge
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was summed so far
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_head + keys, mask=offs_n[:, None] < Nk, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    o = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + rows, o, mask=offs_m[:, None] < Nq)


FWD_GPU = (128, 64, 8, 3)  # BLOCK_M, BLOCK_N, warps, stages
FWD = tilebook.pick(gpu=FWD_GPU, cpu=(16, 16, 4, 1))


def launch(kernel, grid, args, tiles, head_dim):
    bm, bn, warps, stages = tiles
    meta = {"HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn}
    kernel[grid](*args, **meta, num_warps=warps, num_stages=stages)


def attention(q, k, v):
    """The kernel above on ``(B, H, N, D)`` queries, keys and values."""
    B, H, Nq, D = q.shape
    assert k.stride() == v.stride() and q.stride(3) == k.stride(3) == 1
    o = torch.empty_like(q)  # q's layout: q's strides serve o
    args = (q, k, v, o, *q.stride()[:3], *k.stride()[:3], H, Nq, k.shape[2])
    grid = (triton.cdiv(Nq, FWD[0]), B * H)
    launch(attention_kernel, grid, (*args, LOG2E / math.sqrt(D)), FWD, D)
    return o


# %%
# Is it right?  Against float64, every mask of the page written out pair by
# pair.  Shapes ``(B, H, Hkv, Nq, Nk, D)``, ragged on purpose; float32 and
# float16 under the interpreter (small tiles: small checks cross several;
# bfloat16 it gets wrong), bf16 on a GPU.

SHAPES = tilebook.pick(
    gpu=[(1, 16, 16, 1040, 1040, 128), (1, 16, 8, 1040, 1040, 128)],
    cpu=[(1, 2, 2, 37, 53, 32), (1, 4, 2, 37, 53, 32)],
)
DTYPES = tilebook.pick(gpu=[torch.bfloat16], cpu=[torch.float32, torch.float16])


def visible_mask(nq, nk, causal=False, window=None, document_ids=None):
    """tilebook's masks pair by pair: ``(Nq, Nk)``, ``(B, Nq, Nk)`` with documents."""
    i = torch.arange(nq)[:, None] + (nk - nq)  # i': the query, bottom-right aligned
    j = torch.arange(nk)[None, :]
    left, right = window or (None, None)
    seen = (j <= i) if causal else torch.ones(nq, nk, dtype=torch.bool)
    if right is not None:
        seen &= j <= i + right
    if left is not None:
        seen &= j >= i - left
    if document_ids is not None:
        ids = document_ids.cpu()
        seen = seen & (ids[:, :, None] == ids[:, None, :])
    return seen


def reference(q, k, v, **mask):
    """Output and base-2 log-sum-exp in float64; a row that sees no key gives 0."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]  # query heads per K/V head
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    seen = visible_mask(q.shape[2], k.shape[2], **mask).to(q.device)
    s = s.masked_fill(~(seen[:, None] if seen.dim() == 3 else seen), -math.inf)
    lse = torch.logsumexp(s, -1) / math.log(2)
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, lse


def qkv(B, H, Hkv, Nq, Nk, D, dtype):
    torch.manual_seed(0)
    make = lambda h, n: torch.randn(B, h, n, D, device=DEVICE).to(dtype)
    return make(H, Nq), make(Hkv, Nk), make(Hkv, Nk)


report = CorrectnessReport("the smallest kernel vs float64")
for dtype in DTYPES:
    q, k, v = qkv(*SHAPES[0], dtype)
    report.check("all keys", attention(q, k, v), reference(q, k, v)[0])
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, D) in memory
    report.check("a transposed layout", attention(qt, k, v), reference(qt, k, v)[0])
report.assert_ok()

# %%
# Causal attention: skip whole tiles
# ----------------------------------
# Causal: query :math:`i` sees key :math:`j \le i' = i + N_k - N_q`
# (bottom-right aligned, as FlashAttention).  Rather than mask every score, a
# query tile sorts its key tiles: seen whole by all its rows (no mask), on the
# diagonal (masked), past its last row's diagonal (never visited).
# ``tl.static_range`` unrolls the loop over the two *stages* at compile time,
# so the first carries no mask arithmetic.  ``reach``, how far past its own
# index a query sees, is ``Nk - Nq`` when causal, ``Nk`` (all) when not.  The
# kernel keeps each row's log-sum-exp, :math:`\mathrm{lse} = m + \log_2 \ell`:
# the backward recomputes :math:`P = 2^{s - \mathrm{lse}}` with one ``exp2``.
# ``G`` query heads share a K/V head (grouped-query attention, below);
# tensors are contiguous (no strides); every query sees a key (``Nq <= Nk``).


@triton.jit
def attention_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    G,
    Nq,
    Nk,
    reach,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh = tl.program_id(1)  # batch * H + query head
    m0 = tl.program_id(0) * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = (bh * Nq + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + rows, mask=offs_m[:, None] < Nq, other=0.0)
    kv_head = (bh // G) * Nk * HEAD_DIM  # this query head's K/V head
    last = offs_m + reach  # each row's last visible key
    full = tl.minimum(m0 + reach + 1, Nk) // BLOCK_N * BLOCK_N  # tiles all rows see
    hi = tl.minimum(tl.minimum(m0 + BLOCK_M, Nq) + reach, Nk)  # keys any row sees
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for stage in tl.static_range(2):  # unrolled: stage is a constant
        if stage == 0:
            lo, end = 0, full
        else:
            lo, end = full, hi
        for start_n in range(lo, end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            keys = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
            k = tl.load(k_ptr + kv_head + keys, mask=offs_n[:, None] < Nk, other=0.0)
            s = tl.dot(q, k.T) * qk_scale
            if stage == 1:  # the diagonal tiles alone carry the mask
                seen = (offs_n[None, :] < Nk) & (offs_n[None, :] <= last[:, None])
                s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + kv_head + keys, mask=offs_n[:, None] < Nk, other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
    o = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + rows, o, mask=offs_m[:, None] < Nq)
    tl.store(lse_ptr + bh * Nq + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < Nq)


def attention_fwd(q, k, v, causal=False):
    """Output and base-2 log-sum-exp; ``k`` and ``v`` may have fewer heads."""
    (B, H, Nq, D), (Hkv, Nk) = q.shape, k.shape[1:3]
    assert Nq <= Nk or not causal, "every query must see a key"
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o, lse = torch.empty_like(q), torch.empty(B, H, Nq, device=q.device)
    reach = Nk - Nq if causal else Nk
    args = (q, k, v, o, lse, H // Hkv, Nq, Nk, reach, LOG2E / math.sqrt(D))
    launch(attention_fwd_kernel, (triton.cdiv(Nq, FWD[0]), B * H), args, FWD, D)
    return o, lse


# %%
# Both masks, both shapes (the second with two query heads per K/V head):

report = CorrectnessReport("causal kernel and log-sum-exp vs float64")
for dtype in DTYPES:
    for shape, causal in [(s, c) for s in SHAPES for c in (False, True)]:
        q, k, v = qkv(*shape, dtype)
        o, lse = attention_fwd(q, k, v, causal)
        want = reference(q, k, v, causal=causal)
        name = f"causal={causal}, G={shape[1] // shape[2]}"
        report.check(name, o, want[0])
        report.check(f"{name}, lse", lse, want[1], tol=1e-5)
report.assert_ok()

# %%
# The backward pass
# -----------------
# :math:`dV = P^T dO`, :math:`dP = dO\,V^T`, and through the softmax, row by
# row, lesson 10's rule: :math:`dS = P \odot (dP - \Delta)` with
# :math:`\Delta_i = \sum_j P_{ij} (dO_i \cdot V_j) = dO_i \cdot O_i`; then
# :math:`dQ = c\,dS\,K`, :math:`dK = c\,dS^T Q`.  :math:`P` comes from the
# lse, and :math:`\Delta = \mathrm{rowsum}(dO \odot O)` first, from two
# tensors in memory: a row sum (the package's *preprocess* kernel).
#
# A program per key tile loops over the query tiles that see it (and the
# ``G`` query heads of its K/V head), summing dK and dV in registers (lesson
# 11: no atomics, the same bits every run).  A program per query tile computes
# dQ, recomputing :math:`P` and :math:`dP`: seven products instead of five.
# Both skip tiles no query sees and mask the rest.


@triton.jit
def dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    G,
    Nq,
    Nk,
    reach,
    sm_scale,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bhk = tl.program_id(1)  # batch * Hkv + K/V head
    n0 = tl.program_id(0) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = (bhk * Nk + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + keys, mask=offs_n[:, None] < Nk, other=0.0)
    v = tl.load(v_ptr + keys, mask=offs_n[:, None] < Nk, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = tl.maximum(n0 - reach, 0) // BLOCK_M * BLOCK_M  # the first query that sees
    for g in range(G):  # the query heads that share this K/V head
        row0 = (bhk * G + g) * Nq
        for start_m in range(lo, Nq, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            rows = (row0 + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
            q = tl.load(q_ptr + rows, mask=offs_m[:, None] < Nq, other=0.0)
            do = tl.load(do_ptr + rows, mask=offs_m[:, None] < Nq, other=0.0)
            # Rows past Nq: a log-sum-exp of +inf makes their P zero.
            lse = tl.load(lse_ptr + row0 + offs_m, mask=offs_m < Nq, other=float("inf"))
            delta = tl.load(delta_ptr + row0 + offs_m, mask=offs_m < Nq, other=0.0)
            seen = (offs_n[:, None] < Nk) & (offs_n[:, None] <= offs_m[None, :] + reach)
            sT = tl.where(seen, tl.dot(k, q.T) * qk_scale, float("-inf"))
            pT = tl.math.exp2(sT - lse[None, :])
            dv = tl.dot(pT.to(do.dtype), do, dv)
            dsT = pT * (tl.dot(v, do.T) - delta[None, :])
            dk = tl.dot(dsT.to(q.dtype), q, dk)
    tl.store(dk_ptr + keys, (dk * sm_scale).to(k.dtype), mask=offs_n[:, None] < Nk)
    tl.store(dv_ptr + keys, dv.to(k.dtype), mask=offs_n[:, None] < Nk)


@triton.jit
def dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    G,
    Nq,
    Nk,
    reach,
    sm_scale,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh = tl.program_id(1)
    m0 = tl.program_id(0) * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = (bh * Nq + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + rows, mask=offs_m[:, None] < Nq, other=0.0)
    do = tl.load(do_ptr + rows, mask=offs_m[:, None] < Nq, other=0.0)
    lse = tl.load(lse_ptr + bh * Nq + offs_m, mask=offs_m < Nq, other=float("inf"))
    delta = tl.load(delta_ptr + bh * Nq + offs_m, mask=offs_m < Nq, other=0.0)
    kv_head = (bh // G) * Nk * HEAD_DIM
    hi = tl.minimum(tl.minimum(m0 + BLOCK_M, Nq) + reach, Nk)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keys = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv_head + keys, mask=offs_n[:, None] < Nk, other=0.0)
        v = tl.load(v_ptr + kv_head + keys, mask=offs_n[:, None] < Nk, other=0.0)
        seen = (offs_n[None, :] < Nk) & (offs_n[None, :] <= offs_m[:, None] + reach)
        s = tl.where(seen, tl.dot(q, k.T) * qk_scale, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        ds = p * (tl.dot(do, v.T) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    tl.store(dq_ptr + rows, (dq * sm_scale).to(q.dtype), mask=offs_m[:, None] < Nq)


BWD = tilebook.pick(gpu=(64, 64, 8, 2), cpu=(16, 16, 4, 1))


def attention_bwd(q, k, v, o, lse, do, causal=False):
    """``(dq, dk, dv)`` from the forward's ``o`` and ``lse``."""
    (B, H, Nq, D), (Hkv, Nk) = q.shape, k.shape[1:3]
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    delta = fa.launch_preprocess(o, do, torch.empty_like(lse))  # rowsum(dO * O)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    reach = Nk - Nq if causal else Nk
    scales = (H // Hkv, Nq, Nk, reach, 1 / math.sqrt(D), LOG2E / math.sqrt(D))
    dkdv_args, dq_args = (dk, dv, *scales), (dq, *scales)
    grid = (triton.cdiv(Nk, BWD[1]), B * Hkv)  # a program per key tile
    launch(dkdv_kernel, grid, (q, k, v, do, lse, delta, *dkdv_args), BWD, D)
    grid = (triton.cdiv(Nq, BWD[0]), B * H)  # a program per query tile
    launch(dq_kernel, grid, (q, k, v, do, lse, delta, *dq_args), BWD, D)
    return dq, dk, dv


def check_grads(report, name, got, q, k, v, do, **mask):
    """``got`` (dq, dk, dv) against autograd through the float64 reference."""
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():  # autograd's GPU thread meets cuBLAS before it has
        warnings.filterwarnings("ignore", "Attempting to run cuBLAS")  # a CUDA context
        want = torch.autograd.grad(reference(*x64, **mask)[0], x64, do.double())
    for what, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):  # bf16: xp.TOL
        report.check(f"{name}, {what}", g, w, tol=xp.TOL if GPU else None)


# %%
# On the grouped-heads shape (dK and dV sum over two query heads), both masks:

report = CorrectnessReport("backward kernels vs float64 autograd")
for dtype in DTYPES:
    q, k, v = qkv(*SHAPES[1], dtype)
    do = torch.randn_like(q)
    for causal in (False, True):
        got = attention_bwd(q, k, v, *attention_fwd(q, k, v, causal), do, causal)
        check_grads(report, f"causal={causal}", got, q, k, v, do, causal=causal)
report.assert_ok()

# %%
# Grouped heads, windows and documents
# ------------------------------------
# Grouped-query attention: ``G = H / Hkv`` query heads share a K/V head (head
# ``bh // G``); a dK/dV program sums its ``G`` heads.  A sliding window lets
# query :math:`i` see keys :math:`i' - \mathit{left} \le j \le i' +
# \mathit{right}` (causal: ``right = 0``): a query tile's visible keys form one
# range, and so do those all its rows see: masked tiles at *both* ends, full
# ones between.  A row that sees nothing in its first tile has maximum
# :math:`-\infty`, and :math:`2^{-\infty - (-\infty)}` is NaN: the package
# subtracts 0 until a key shows up (a row that never sees one gets 0 and zero
# gradients).  Sorted document ids give each tile a range too (``fa.document_ranges``).
# The package against float64; on the GPU only the forward of the last mask:

packed = lambda *n: torch.repeat_interleave(torch.arange(len(n)), torch.tensor(n))[None]
B, H, Hkv, N, D = tilebook.pick(gpu=(1, 16, 8, 1040, 128), cpu=(1, 4, 2, 45, 32))
LEFT, docs = 15, packed(N // 5, N // 2, N - N // 5 - N // 2).to(DEVICE)
WINDOW = {"causal": True, "window": (LEFT, None)}
MASKS = {"two-sided window": {"window": (9, 4)}, "causal window": WINDOW}
MASKS["causal window in documents"] = WINDOW | {"document_ids": docs}
report = CorrectnessReport("tilebook.flash_attention vs float64")
for name, mask in list(MASKS.items())[-1 if GPU else 0 :]:
    q, k, v = (t.requires_grad_() for t in qkv(B, H, Hkv, N, N, D, DTYPES[0]))
    o = tilebook.flash_attention(q, k, v, **mask)
    report.check(name, o, reference(q, k, v, **mask)[0])
    if not GPU:
        do = torch.randn_like(o)
        got = torch.autograd.grad(o, (q, k, v), do)
        check_grads(report, name, got, q, k, v, do, **mask)
report.assert_ok()

# %%
# The tiling stepper
# ------------------
# The masks on 48 queries and keys in tiles of 8 (documents of 6, 26 and 16),
# and one query tile's loop with each row's running maximum (base 2) and sum
# after every step, replayed in float64.  Three settings break the kernel:
# no rescale (wrong), no skip (slow), no mask on partly visible tiles (wrong).

N_DEMO, BLOCK_DEMO, DOC_IDS = 48, 8, packed(6, 26, 16)
torch.manual_seed(1)
qd, kd, vd = (torch.randn(N_DEMO, 16, dtype=torch.float64) for _ in range(3))
scores = 2 * LOG2E * (qd @ kd.T) / math.sqrt(16)  # doubled: maxima that move
seen = lambda **mask: visible_mask(N_DEMO, N_DEMO, **mask)
demo = {"full": seen(), "causal": seen(causal=True)}
demo["causal window"] = seen(causal=True, window=(LEFT, None))
demo["causal documents"] = seen(causal=True, document_ids=DOC_IDS)[0]
caption = "Scores of random queries and keys, replayed in float64 by this page."
TilingStepper(demo, scores, vd, BLOCK_DEMO, BLOCK_DEMO, caption=caption)

# %%
# The same masks in FlexAttention
# -------------------------------
# FlexAttention takes a mask as a function, ``mask_mod(b, h, q_idx, kv_idx)``,
# and may change scores with ``score_mod(score, b, h, q_idx, kv_idx)``
# (tilebook has none).  ``create_block_mask`` keeps per query block the key
# blocks to compute with the mask and without: tilebook's tile states, which
# its kernels derive from a band and document ranges.  One mask both ways,
# equal pair by pair, tile by tile, output by output (eager FlexAttention):


def documents_in_window(doc_ids, left):
    def mask_mod(b, h, q_idx, kv_idx):
        causal = kv_idx <= q_idx
        in_window = kv_idx >= q_idx - left
        return causal & in_window & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    return mask_mod


as_score_mod = lambda m: lambda s, b, h, i, j: torch.where(m(b, h, i, j), s, -math.inf)
report = CorrectnessReport("one mask, tilebook's and FlexAttention's")
mod = documents_in_window(DOC_IDS, LEFT)
ours = visible_mask(N_DEMO, N_DEMO, True, (LEFT, None), document_ids=DOC_IDS)[0]
theirs = flex.create_mask(mod, 1, 1, N_DEMO, N_DEMO, device="cpu")[0, 0]
report.check("pairs seen", theirs.double(), ours.double(), tol=0)
blocks = flex.create_block_mask(mod, 1, 1, N_DEMO, N_DEMO, "cpu", BLOCK_DEMO)
tiles = tile_states(ours, BLOCK_DEMO, BLOCK_DEMO).double()
report.check("tile states", block_mask_states(blocks).double(), tiles, tol=0)
mod, x = documents_in_window(docs, LEFT), [t.detach().float() for t in (q, k, v)]
blocks = flex.create_block_mask(mod, 1, None, N, N, DEVICE)
report.check("output", o, flex.flex_attention(*x, block_mask=blocks, enable_gqa=True))
want = flex.flex_attention(*x, score_mod=as_score_mod(mod), enable_gqa=True)
report.check("output, as a score_mod", o, want)
report.assert_ok()

# %%
# The package's kernels
# ---------------------
# :mod:`tilebook.ops.flash_attention` adds what speed asks for: tensor
# descriptors (lesson 09: the copy engine, :term:`TMA`, fills rows past the end
# with zeros, so no load masks); the three-part loop; the scale applied after the maximum
# (one fused multiply-add per score); rows that see no key; the longest tiles
# first; tiles tuned ahead for Hopper (``sm_90``; ``fa.CONFIGS``, no call
# autotunes).
# One limit stays: a tile's softmax waits for its ``Q K^T``, its ``P V`` for
# the softmax.  So on Hopper the package's forward is Gluon, Triton's lower
# level (:mod:`tilebook.ops.attention_hopper`): a producer :term:`warp`
# copies; two consumer :term:`warpgroups <warpgroup>` issue ``Q K_j^T`` and
# ``P_{j-1} V_{j-1}``, then compute the first's softmax while the second runs
# (FlashAttention-3).  This page's causal forward, the package's Triton forward
# (other GPUs, documents) and its Gluon one, compiled for Hopper (``sm_90``),
# bf16, D=128, with the registers and :term:`spill` bytes of each and how many
# of its programs one :term:`SM` holds:

sig = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "o_ptr"), "*bf16")
sig |= dict.fromkeys(("G", "Nq", "Nk", "reach"), "i32")
sig |= {"lse_ptr": "*fp32", "qk_scale": "fp32"}
tiles = {"HEAD_DIM": 128, "BLOCK_M": FWD_GPU[0], "BLOCK_N": FWD_GPU[1]}
launch_opts = {"num_warps": FWD_GPU[2], "num_stages": FWD_GPU[3]}
package = fa.compile_ahead("fwd", fa.CONFIGS[(90, 128, "bf16", True)]["fwd"], band=True)
lesson = compile_kernel(attention_fwd_kernel, sig, tiles, **launch_opts)
gluon = attention_hopper.compile_ahead(128, "bf16", band=True)
compiled = {"lesson": lesson, "package": package, "gluon": gluon}
counts = instruction_table(compiled, ("HGMMA", "LDGSTS", "UTMALDG", "MUFU.EX2"))
print(counts)
copier = lambda k: next((op for op in ("UTMALDG", "LDGSTS") if counts[k][op]), "?")


def per_sm(kernel):
    """How many programs like ``kernel`` fit on a Hopper (sm_90) SM at once."""
    threads, regs = 32 * kernel.num_warps, -(-kernel.registers // 8) * 8
    by_regs = fact("cuda.registers_per_sm").value // (regs * threads)
    smem = int(fact("sm90.smem_per_sm").si)  # the compile target: any Hopper
    return min(by_regs, smem // (kernel.shared_bytes + 1024))  # CUDA keeps 1 KiB each


held = (
    "``LDGSTS`` copies a piece of a tile per thread, ``UTMALDG`` a whole tile: the "
    "lesson's kernel uses ``{a}``, the package's ``{b}``.  A Hopper SM holds {n} of "
    "the lesson's programs, {m} of the package's Triton ones (where two fit, one's "
    "softmax runs during the other's products) and {g} Gluon one, whose code has "
    "{w} waits that leave a product in flight (``wgmma.wait_group 1``)."
)
held_at = {"a": copier("lesson"), "b": copier("package"), "n": per_sm(lesson)}
say(held, **held_at, m=per_sm(package), g=per_sm(gluon), w=gluon.overlapped_waits)

# %%
# How fast?
# ---------
# bfloat16, ``D = 128``, 16 heads, 16384 tokens at each length (the batch
# shrinks as ``N`` grows), forward and backward (autograd), causal or not:
# :func:`tilebook.flash_attention`; ``lesson``, this page's kernel (forward);
# SDPA's cuDNN and FlashAttention-2 backends.  FlexAttention is compared after
# the plots, from the package benchmark's record: each of its shapes and masks
# costs a cold ``torch.compile`` of its forward and backward, more than this
# page's time budget leaves.  FLOPs: :math:`4 B H N_q N_k D` forward, half when causal, 2.5
# times that backward.  Each is checked, then timed in interleaved rounds.

LENGTHS, TOKENS, FLEX_AT = [1024, 4096], 16384, 4096  # two lengths: the time budget
TIMED = ("tilebook", "sdpa_cudnn", "sdpa_flash")  # and this page's kernel, below
IMPLS = ["tilebook", "lesson", "sdpa_cudnn", "sdpa_flash"]
extra = {"lesson": lambda q, k, v, causal: attention_fwd(q, k, v, causal)[0]}
kw = {"d": 128, "heads": 16, "tokens": TOKENS, "extra": extra, "impls": TIMED}
kw |= {"warmup": 5, "rep": 20}  # short rounds, for the page's time budget
title = "attention, bfloat16, D=128, 16 heads, 16384 tokens: TFLOP/s by length"
runs = record_or_measure("lesson12_lengths", title, lambda: xp.lengths(LENGTHS, **kw))
style = {"x": "n", "y": "tflops", "series": "impl", "logx": True, "order": IMPLS}
style |= {"xlabel": "sequence length N", "ylabel": "TFLOP/s"}


def plot(kernel, mask):
    where = {"kernel": kernel, "mask": mask}
    return runs and plot_record(runs, where=where, title=f"{kernel}, {mask}", **style)


# %%
fig = plot("forward", "full")
say("{m}", m=no_record_message("lesson12_lengths")) if runs is None else None
# %%
fig = plot("forward", "causal")
# %%
fig = plot("backward", "full")
# %%
fig = plot("backward", "causal")

# %%
# What the data say ("faster", "slower": beyond the p20-p80 spread).


def vs(kernel, pairs):
    """``speedup`` of ``a`` over ``b`` for each ``(a, mask_a, b, mask_b, n)``."""
    one = lambda impl, mask, n: runs.one(kernel=kernel, mask=mask, n=n, impl=impl)
    return [speedup(one(a, ma, n), one(b, mb, n)) for a, ma, b, mb, n in pairs if runs]


claims, MASK_KINDS = Claims("12 flash attention", runs), ("full", "causal")
ahead, CASES = {}, [(m, n) for m in MASK_KINDS for n in LENGTHS]  # cuDNN vs tilebook
for kernel in ("forward", "backward"):
    g = vs(kernel, [("tilebook", "causal", "tilebook", "full", n) for n in LENGTHS])
    claims.check(
        f"At every length tilebook's causal {kernel} skips tiles: it takes less "
        "time than the full one",
        all(c.faster for c in g),
        "; ".join(c.evidence("causal", "full") for c in g),
    )
    g = vs(kernel, [("tilebook", m, "sdpa_flash", m, FLEX_AT) for m in MASK_KINDS])
    claims.check(
        f"At {FLEX_AT}, tilebook's {kernel} beats FlashAttention-2's, causal or not",
        all(c.faster for c in g),
        "; ".join(c.evidence("tilebook", "FlashAttention-2") for c in g),
    )
    ahead[kernel] = vs(kernel, [("sdpa_cudnn", m, "tilebook", m, n) for m, n in CASES])
evidence = "; ".join(c.evidence("cuDNN", "tilebook") for c in ahead["backward"])
says = "cuDNN's backward is faster than tilebook's at every length, causal or not"
claims.check(says, all(c.faster for c in ahead["backward"]), evidence)
claims

# %%
# Each baseline over the lengths, in words:

names = {"lesson": "this page's kernel", "sdpa_cudnn": "cuDNN"}
names |= {"sdpa_flash": "FlashAttention-2"}
columns = {"tilebook against": "case", **{n: n for n in names.values()}}
rows = xp.verdict_rows(runs, names) if runs is not None else []
table(rows, columns, caption=runs.caption()) if rows else None

# %%
# FlexAttention (``torch.compile(flex_attention)``) against the package, from
# ``benchmarks/flash_attention.py``'s record, whose caption says which GPU and
# commit measured it: plain and causal masks, and the sliding window and
# documents that FlexAttention is made for.  Ratio: FlexAttention's time over
# tilebook's.

bench_fa = load_record("bench_flash_attention")
at = f"4x16x{FLEX_AT}x128"  # where the package's targets are set
flex_rows = xp.against(bench_fa, "flex", at=at) if bench_fa is not None else []
cols = {c: c for c in ("kernel", "shape", "verdict")} | {"ratio": ("ratio", "{:.2f}")}
cols |= {"target": "target", "target met?": "goal"}
table(flex_rows, cols, caption=bench_fa.caption()) if flex_rows else None

# %%
# The package's targets at ``N = 4096`` (batch 4), least ratios of a baseline's
# time to tilebook's.  The record decides, with its spread:

cols = ("kernel", "mask", "baseline", "target", "ratio", "spread", "verdict")
cols = {c: c for c in cols} | {"ratio": ("ratio", "{:.2f}")}
goals = xp.targets(runs, FLEX_AT) if runs is not None else []
table(goals, cols, caption=runs.caption()) if goals else None

# %%
# The targets missed, and cuDNN in each case (kernel, mask and length):

what = "{kernel} ({mask}) against {baseline}"
missed = "; ".join(what.format(**r) for r in goals if r["verdict"] == "missed")
flex_missed = [r["kernel"] for r in flex_rows if r["goal"] == "missed"]
flex_missed = [f"{kernel} against FlexAttention" for kernel in flex_missed]
missed = "; ".join([m for m in (missed, *flex_missed) if m])
ahead = ahead["forward"] + ahead["backward"]
won = [1 / c.ratio for c in ahead if c.faster]  # tilebook's share of cuDNN's speed
span = f"tilebook runs at {min(won):.0%}-{max(won):.0%} of cuDNN's speed" if won else ""
cudnn = "cuDNN (SDPA) is ahead of tilebook beyond the spread in {k} of {t} cases{r}."
words = say("Missed beyond the spread: {m}.", m=missed or "none")
words += say(cudnn, k=len(won), t=len(ahead), r=span and f": {span}")
words if runs is not None else None

# %%
# Try this
# --------
#
# 1. Drop the rescale from ``attention_fwd_kernel`` (``alpha = 1.0``): which
#    checks fail?  Which query tiles does the widget's ``no rescale`` get right?
#
#    .. dropdown:: Solution
#
#       Every case fails: most rows meet a larger score after their first
#       tile.  A tile whose rows all peak in their first key tile stays right.
#
# 2. Give ``attention_fwd_kernel`` a left bound (a sliding window).
#
#    .. dropdown:: Solution
#
#       Three stages (masked, full, masked) from the key ``m0 + Nk - Nq -
#       left`` (at least 0), a mask term ``offs_n >= offs_m + Nk - Nq - left``
#       and, for rows that meet only hidden keys in their first tile, ``exp2``
#       of ``s - 0`` while ``m_new`` is ``-inf`` (else ``-inf - -inf``: NaN).
#
# 3. Why does the dK/dV kernel compute ``tl.dot(k, q.T)``?
#
#    .. dropdown:: Solution
#
#       Its products are ``dV += P^T dO`` and ``dK += dS^T Q``: with keys along
#       rows, ``P^T`` and ``dS^T`` come out ready as ``tl.dot``'s first operand.
