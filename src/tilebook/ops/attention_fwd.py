"""Flash attention's Triton forward: ``softmax(q @ k^T * scale + mask) @ v`` in tiles.

One program keeps a ``BLOCK_M x D`` tile of queries on chip and streams the keys
and values past it in ``BLOCK_N``-row tiles (:func:`_fwd_inner`), with the online
softmax of lesson 06 in base 2: the scale is folded into ``log2(e)`` so that each
score costs one fused multiply-add and one ``exp2``.  It saves the log-sum-exp of
every row (base 2), so the backward (:mod:`tilebook.ops.attention_bwd`) never stores
the ``N x N`` probabilities.  Which key tiles a program visits, and which of them
need the mask, is :mod:`tilebook.ops.attention_masks`'s.  A query that sees no key
gets an output of 0 and a log-sum-exp of ``+inf`` (so zero gradients).

Tiles move through tensor descriptors (TMA on Hopper): the copy engine fills rows
past the end of a sequence with zeros, so no load needs a mask.  On Hopper (sm_90)
the forward without documents is the Gluon kernel of
:mod:`tilebook.ops.attention_hopper` instead; its log-sum-exp is the same.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .attention_masks import doc_bounds, tile_ranges, visible

__all__ = ["LOG2E"]

#: ``log2(e)``: the kernels take ``scale * LOG2E`` and work in base 2.
LOG2E = 1.4426950408889634


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, b, hk, offs_m, doc_m, doc_ptr,
               lo, hi, qk_scale, shift, left, right, Nk,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
               BAND: tl.constexpr, DOC: tl.constexpr):  # fmt: skip
    """The online softmax over key tiles ``[lo, hi)``, in base 2.

    ``m_i`` is each row's running maximum of the scaled scores (log2 units), ``l_i``
    the running sum of ``exp2(score - m_i)``, ``acc`` the running ``P @ V``; when the
    maximum grows, both are rescaled by ``alpha = exp2(m_old - m_new)``.
    """
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            vis = visible(offs_m, offs_n, doc_m, doc_ptr, shift, left, right, Nk, BAND, DOC)
            qk = tl.where(vis, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen no key yet has m_new = -inf: subtract 0 instead, so
            # that exp2 gives 0 (not exp2(-inf + inf) = NaN).
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(qk - m_use[:, None])
        else:
            # Scaling after the max (scale > 0) leaves one FMA per score.
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_use = m_new
            p = tl.math.exp2(qk * qk_scale - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, doc_ptr, rng_ptr,
                qk_scale, H, G, Nq, Nk, left, right, num_m,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BAND: tl.constexpr, DOC: tl.constexpr):  # fmt: skip
    """One program per (query tile, batch, head): ``O`` and the base-2 log-sum-exp."""
    pid = tl.program_id(0)
    bh = pid // num_m
    # Tiles in reverse: under a causal mask the last query tiles see the most keys,
    # and starting them first leaves the short ones to fill the end of the grid.
    start_m = num_m - 1 - pid % num_m
    b = bh // H
    h = bh % H
    hk = h // G  # grouped-query attention: G query heads share one K/V head
    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_last = tl.minimum(m0 + BLOCK_M, Nq) - 1
    shift = Nk - Nq

    # Keys some row of the tile sees, and keys every row of it sees.
    lo = tl.maximum(m0 + shift - left, 0)
    hi = tl.minimum(m_last + shift + right + 1, Nk)
    full_lo = m_last + shift - left
    full_hi = tl.minimum(m0 + shift + right + 1, Nk)  # a tile past Nk needs the mask
    doc_m = offs_m  # placeholder when DOC is off (never read)
    if DOC:
        doc_ptr += b * Nk
        doc_m = tl.load(doc_ptr + offs_m, mask=offs_m < Nq, other=-2)
    lo, hi, full_lo, full_hi = doc_bounds(
        lo, hi, full_lo, full_hi, rng_ptr + (b * num_m + start_m) * 4, DOC
    )
    start, mid_lo, mid_hi, end = tile_ranges(lo, hi, full_lo, full_hi, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    q = q_desc.load([b, h, m0, 0]).reshape(BLOCK_M, HEAD_DIM)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, b, hk, offs_m, doc_m,
                               doc_ptr, start, mid_lo, qk_scale, shift, left, right, Nk,
                               BLOCK_N, HEAD_DIM, True, BAND, DOC)  # fmt: skip
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, b, hk, offs_m, doc_m,
                               doc_ptr, mid_lo, mid_hi, qk_scale, shift, left, right, Nk,
                               BLOCK_N, HEAD_DIM, False, BAND, DOC)  # fmt: skip
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, b, hk, offs_m, doc_m,
                               doc_ptr, mid_hi, end, qk_scale, shift, left, right, Nk,
                               BLOCK_N, HEAD_DIM, True, BAND, DOC)  # fmt: skip

    # A row that saw no key: output 0, log-sum-exp +inf (so the backward's P is 0).
    empty = l_i == 0.0
    l_i = tl.where(empty, 1.0, l_i)
    out = acc * (1.0 / l_i)[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_i))
    o_desc.store([b, h, m0, 0], out.to(o_desc.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    tl.store(lse_ptr + bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)
