"""Flash attention's backward kernels, from the forward's output and base-2 log-sum-exp.

The ``N x N`` probabilities are recomputed tile by tile, never stored:

1. :func:`_bwd_preprocess_kernel`: ``delta = rowsum(dO * O)`` per query row;
2. :func:`_bwd_dkdv_kernel`: one program per key tile, looping over the query
   tiles that see it (and over the query heads that share its K/V head, which sums
   the grouped-query gradients in registers);
3. :func:`_bwd_dq_kernel`: one program per query tile, looping over its key tiles.

The masks and the tiles each program visits are :mod:`tilebook.ops.attention_masks`'s,
as in the forward (:mod:`tilebook.ops.attention_fwd`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .attention_masks import doc_bounds, tile_ranges, visible

__all__ = ["PREPROCESS_BLOCK"]

#: Query rows per program of :func:`_bwd_preprocess_kernel`.
PREPROCESS_BLOCK = 64


@triton.jit
def _bwd_preprocess_kernel(o_ptr, do_ptr, delta_ptr, H, Nq,
                           so_b, so_h, so_m, sdo_b, sdo_h, sdo_m,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """``delta = rowsum(dO * O)``: the term of dS = P * (dP - delta) that needs all of a row."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < Nq
    o = tl.load(o_ptr + b * so_b + h * so_h + offs_m[:, None] * so_m + offs_d[None, :],
                mask=rows, other=0.0)  # fmt: skip
    do = tl.load(do_ptr + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_m + offs_d[None, :],
                 mask=rows, other=0.0)  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(delta_ptr + bh.to(tl.int64) * Nq + offs_m, delta, mask=offs_m < Nq)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, b, h, offs_n, doc_n,
                    doc_ptr, lo, hi, qk_scale, shift, left, right, Nq, Nk,
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
                    BAND: tl.constexpr, DOC: tl.constexpr):  # fmt: skip
    """Accumulate dK and dV of one key tile over query tiles ``[lo, hi)``.

    Works on transposed scores (keys along rows), so that ``P^T`` and ``dS^T`` come
    out in the layout their products with ``dO`` and ``Q`` need.  Query rows past
    ``Nq`` load as zeros with a log-sum-exp of +inf: their ``P`` is 0, no mask needed.
    """
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        lse = tl.load(lse_ptr + offs_m, mask=offs_m < Nq, other=float("inf"))
        qkT = tl.dot(k, q.T)
        if MASKED:
            # _visible's test with keys along rows (built transposed: no layout shuffle).
            visT = offs_n[:, None] >= 0
            if BAND:
                diag = offs_m + shift
                visT = visT & (offs_n[:, None] >= (diag - left)[None, :])
                visT = visT & (offs_n[:, None] <= (diag + right)[None, :])
            if DOC:
                doc_m = tl.load(doc_ptr + offs_m, mask=offs_m < Nq, other=-2)
                visT = visT & (doc_n[:, None] == doc_m[None, :])
            qkT = tl.where(visT, qkT * qk_scale, float("-inf"))
            pT = tl.math.exp2(qkT - lse[None, :])
        else:
            pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
        do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < Nq, other=0.0)
        dpT = tl.dot(v, do.T)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr,
                     doc_ptr, rng_ptr, sm_scale, qk_scale, Hkv, G, Nq, Nk, left, right, num_n,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BAND: tl.constexpr, DOC: tl.constexpr):  # fmt: skip
    """One program per (key tile, batch, K/V head): dK and dV, summed over the G query
    heads that share the K/V head."""
    pid = tl.program_id(0)
    bhk = pid // num_n
    start_n = num_n - 1 - pid % num_n  # under a causal mask the first key tiles work most
    b = bhk // Hkv
    hk = bhk % Hkv
    n0 = start_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_last = tl.minimum(n0 + BLOCK_N, Nk) - 1
    shift = Nk - Nq

    # Query rows that see some key of the tile, and rows that see all of them.  Key
    # rows past Nk are never stored, so they need no mask here.
    lo = tl.maximum(n0 - shift - right, 0)
    hi = tl.minimum(n_last - shift + left + 1, Nq)
    full_lo = n_last - shift - right
    full_hi = n0 - shift + left + 1
    doc_n = offs_n
    if DOC:
        doc_ptr += b * Nk
        doc_n = tl.load(doc_ptr + offs_n, mask=offs_n < Nk, other=-1)
    lo, hi, full_lo, full_hi = doc_bounds(
        lo, hi, full_lo, full_hi, rng_ptr + (b * num_n + start_n) * 4, DOC
    )
    start, mid_lo, mid_hi, end = tile_ranges(lo, hi, full_lo, full_hi, BLOCK_M)

    k = k_desc.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
    v = v_desc.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for g in range(G):
        h = hk * G + g
        row = (b * Hkv * G + h).to(tl.int64) * Nq
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr + row, delta_ptr + row,
                                 b, h, offs_n, doc_n, doc_ptr, start, mid_lo, qk_scale, shift,
                                 left, right, Nq, Nk, BLOCK_M, HEAD_DIM, True, BAND, DOC)  # fmt: skip
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr + row, delta_ptr + row,
                                 b, h, offs_n, doc_n, doc_ptr, mid_lo, mid_hi, qk_scale, shift,
                                 left, right, Nq, Nk, BLOCK_M, HEAD_DIM, False, BAND, DOC)  # fmt: skip
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr + row, delta_ptr + row,
                                 b, h, offs_n, doc_n, doc_ptr, mid_hi, end, qk_scale, shift,
                                 left, right, Nq, Nk, BLOCK_M, HEAD_DIM, True, BAND, DOC)  # fmt: skip
    # dS = P * (dP - delta) is the gradient of the scaled scores: dK carries the scale.
    dk = dk * sm_scale
    dk_desc.store([b, hk, n0, 0], dk.to(dk_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))
    dv_desc.store([b, hk, n0, 0], dv.to(dv_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))


@triton.jit
def _bwd_dq_inner(dq, q, do, lse, delta, k_desc, v_desc, b, hk, offs_m, doc_m, doc_ptr,
                  lo, hi, qk_scale, shift, left, right, Nk,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
                  BAND: tl.constexpr, DOC: tl.constexpr):  # fmt: skip
    """Accumulate dQ of one query tile over key tiles ``[lo, hi)``."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            vis = visible(offs_m, offs_n, doc_m, doc_ptr, shift, left, right, Nk, BAND, DOC)
            qk = tl.where(vis, qk * qk_scale, float("-inf"))
            p = tl.math.exp2(qk - lse[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - lse[:, None])
        dp = tl.dot(do, v.T)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _bwd_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, doc_ptr,
                   rng_ptr, sm_scale, qk_scale, H, G, Nq, Nk, left, right, num_m,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BAND: tl.constexpr, DOC: tl.constexpr):  # fmt: skip
    """One program per (query tile, batch, head): dQ."""
    pid = tl.program_id(0)
    bh = pid // num_m
    start_m = num_m - 1 - pid % num_m
    b = bh // H
    h = bh % H
    hk = h // G
    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_last = tl.minimum(m0 + BLOCK_M, Nq) - 1
    shift = Nk - Nq

    lo = tl.maximum(m0 + shift - left, 0)
    hi = tl.minimum(m_last + shift + right + 1, Nk)
    full_lo = m_last + shift - left
    # Keys past Nk load as zeros, so they add nothing to dQ, but their P could
    # overflow for rows of very negative scores: the last tile keeps its mask.
    full_hi = tl.minimum(m0 + shift + right + 1, Nk)
    doc_m = offs_m
    if DOC:
        doc_ptr += b * Nk
        doc_m = tl.load(doc_ptr + offs_m, mask=offs_m < Nq, other=-2)
    lo, hi, full_lo, full_hi = doc_bounds(
        lo, hi, full_lo, full_hi, rng_ptr + (b * num_m + start_m) * 4, DOC
    )
    start, mid_lo, mid_hi, end = tile_ranges(lo, hi, full_lo, full_hi, BLOCK_N)

    row = bh.to(tl.int64) * Nq
    q = q_desc.load([b, h, m0, 0]).reshape(BLOCK_M, HEAD_DIM)
    do = do_desc.load([b, h, m0, 0]).reshape(BLOCK_M, HEAD_DIM)
    lse = tl.load(lse_ptr + row + offs_m, mask=offs_m < Nq, other=float("inf"))
    delta = tl.load(delta_ptr + row + offs_m, mask=offs_m < Nq, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_desc, v_desc, b, hk, offs_m, doc_m, doc_ptr,
                       start, mid_lo, qk_scale, shift, left, right, Nk,
                       BLOCK_N, HEAD_DIM, True, BAND, DOC)  # fmt: skip
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_desc, v_desc, b, hk, offs_m, doc_m, doc_ptr,
                       mid_lo, mid_hi, qk_scale, shift, left, right, Nk,
                       BLOCK_N, HEAD_DIM, False, BAND, DOC)  # fmt: skip
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_desc, v_desc, b, hk, offs_m, doc_m, doc_ptr,
                       mid_hi, end, qk_scale, shift, left, right, Nk,
                       BLOCK_N, HEAD_DIM, True, BAND, DOC)  # fmt: skip
    dq = dq * sm_scale
    dq_desc.store([b, h, m0, 0], dq.to(dq_desc.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
