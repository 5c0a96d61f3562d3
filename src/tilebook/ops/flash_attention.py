"""Flash attention, forward and backward: ``softmax(q @ k^T * scale + mask) @ v`` in tiles.

The forward keeps one ``BLOCK_M x D`` tile of queries on chip and streams the
keys and values past it in ``BLOCK_N``-row tiles (:func:`_fwd_inner`), with the
online softmax of lesson 06 in base 2: the scale is folded into ``log2(e)`` so that
each score costs one fused multiply-add and one ``exp2``.  It saves the log-sum-exp
of every row (base 2), so the backward never stores the ``N x N`` probabilities:

1. :func:`_bwd_preprocess_kernel`: ``delta = rowsum(dO * O)`` per query row;
2. :func:`_bwd_dkdv_kernel`: one program per key tile, looping over the query
   tiles that see it (and over the query heads that share its K/V head, which sums
   the grouped-query gradients in registers);
3. :func:`_bwd_dq_kernel`: one program per query tile, looping over its key tiles.

Masks.  Every mask here is a band plus documents: query ``i`` sees key ``j`` when
``i' - left <= j <= i' + right`` with ``i' = i + Nk - Nq`` (causal is ``right = 0``,
bottom-right aligned; no window is an unbounded band) and, with document ids, when
both belong to the same document.  From those bounds each program computes which
tiles it must visit at all (the others are skipped, so time falls with the visible
area) and which of them are fully visible.  The loop over tiles runs in three
parts: masked tiles, fully visible tiles (no mask arithmetic: the ``MASKED``
constexpr compiles it out), masked tiles again.  For documents the host turns the
ids into per-tile ranges once per call (:func:`document_ranges`).

A query that sees no key gets an output of 0, a log-sum-exp of ``+inf`` and so
zero gradients.

On Hopper (sm_90) the forward without documents is not :func:`_fwd_kernel`
but the Gluon kernel of :mod:`tilebook.ops.attention_hopper`, which overlaps each
tile's softmax with the previous tile's ``P @ V`` product (FlashAttention-3's
schedule); :func:`attention_forward`'s ``gluon`` argument chooses.  Its log-sum-exp
is the same, so the backward is shared.

Tiles move through tensor descriptors (TMA on Hopper): the copy engine fills rows
past the end of a sequence with zeros, so no load needs a mask, and any strides
whose rows are 16-byte aligned are read in place.  Configurations are tuned ahead
(``benchmarks/flash_attention.py --tune``) and committed in :data:`CONFIGS`: no
autotuning happens at import or during a call.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .. import runtime
from .._launch import (
    Memo,
    device_guard,
    ensure_cuda_context,
    launch,
    launch_key,
    plain,
    plain_grad,
)
from ..validation import check_same_dtype_device, check_tensor
from . import library
from .precision import autocasting, lower

try:  # host-side tensor descriptors arrived in Triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None


def _lazy_module(name: str) -> types.ModuleType:
    """``name``, executed on its first attribute access (importlib's LazyLoader)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)  # as an import would
    return module


# The Gluon forward imports triton.experimental.gluon, about 0.1 s that every
# ``import tilebook`` paid: it is loaded by the first call that asks whether it applies.
attention_hopper = _lazy_module(f"{__package__}.attention_hopper")

__all__ = [
    "CONFIGS",
    "HEAD_DIMS",
    "KernelConfig",
    "attention_backward",
    "attention_forward",
    "compile_ahead",
    "compile_jobs",
    "document_ranges",
    "flash_attention",
    "launch_dkdv",
    "launch_dq",
    "launch_preprocess",
    "pick_configs",
]

#: Head dimensions the kernels are built for (a tile's row must be a power of two).
HEAD_DIMS = (32, 64, 128, 256)
_GPU_DTYPES = (torch.float16, torch.bfloat16)
# float32 runs under the interpreter only: on a GPU it would need TF32 dots and
# twice the shared memory of the tuned tiles.
_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634

# --------------------------------------------------------------------------- kernels


@triton.jit
def _tile_ranges(lo, hi, full_lo, full_hi, BLOCK: tl.constexpr):
    """Split the visible positions ``[lo, hi)`` into tile-aligned parts.

    Returns ``(start, mid_lo, mid_hi, end)``: tiles in ``[start, mid_lo)`` and
    ``[mid_hi, end)`` need the mask, tiles in ``[mid_lo, mid_hi)`` lie inside
    ``[full_lo, full_hi)`` and need none.  An empty ``[lo, hi)`` gives no tiles.
    """
    hi = tl.maximum(hi, lo)
    start = (lo // BLOCK) * BLOCK
    end = tl.cdiv(hi, BLOCK) * BLOCK
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    mid_lo = tl.cdiv(full_lo, BLOCK) * BLOCK
    mid_hi = (full_hi // BLOCK) * BLOCK
    if mid_hi <= mid_lo:  # no tile is fully visible: the first masked part takes all
        mid_lo = end
        mid_hi = end
    return start, mid_lo, mid_hi, end


@triton.jit
def _doc_bounds(lo, hi, full_lo, full_hi, rng_ptr, DOC: tl.constexpr):
    # The host's per-tile document ranges (see document_ranges), intersected with the band's.
    if DOC:
        lo = tl.maximum(lo, tl.load(rng_ptr))
        hi = tl.minimum(hi, tl.load(rng_ptr + 1))
        full_lo = tl.maximum(full_lo, tl.load(rng_ptr + 2))
        full_hi = tl.minimum(full_hi, tl.load(rng_ptr + 3))
    return lo, hi, full_lo, full_hi


@triton.jit
def _visible(offs_m, offs_n, doc_m, doc_ptr, shift, left, right, Nk, BAND: tl.constexpr,
             DOC: tl.constexpr):  # fmt: skip
    """``[BLOCK_M, BLOCK_N]`` booleans: which (query, key) pairs the mask lets through."""
    vis = offs_n[None, :] < Nk
    if BAND:
        diag = offs_m + shift  # i' = i + Nk - Nq: bottom-right alignment
        vis = vis & (offs_n[None, :] >= (diag - left)[:, None])
        vis = vis & (offs_n[None, :] <= (diag + right)[:, None])
    if DOC:
        doc_n = tl.load(doc_ptr + offs_n, mask=offs_n < Nk, other=-1)
        vis = vis & (doc_m[:, None] == doc_n[None, :])
    return vis


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
            vis = _visible(offs_m, offs_n, doc_m, doc_ptr, shift, left, right, Nk, BAND, DOC)
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
    lo, hi, full_lo, full_hi = _doc_bounds(
        lo, hi, full_lo, full_hi, rng_ptr + (b * num_m + start_m) * 4, DOC
    )
    start, mid_lo, mid_hi, end = _tile_ranges(lo, hi, full_lo, full_hi, BLOCK_N)

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
    lo, hi, full_lo, full_hi = _doc_bounds(
        lo, hi, full_lo, full_hi, rng_ptr + (b * num_n + start_n) * 4, DOC
    )
    start, mid_lo, mid_hi, end = _tile_ranges(lo, hi, full_lo, full_hi, BLOCK_M)

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
            vis = _visible(offs_m, offs_n, doc_m, doc_ptr, shift, left, right, Nk, BAND, DOC)
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
    lo, hi, full_lo, full_hi = _doc_bounds(
        lo, hi, full_lo, full_hi, rng_ptr + (b * num_m + start_m) * 4, DOC
    )
    start, mid_lo, mid_hi, end = _tile_ranges(lo, hi, full_lo, full_hi, BLOCK_N)

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


# --------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch options of one kernel.

    ``block_m`` counts query rows and ``block_n`` key rows, whichever kernel it is.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _kc(bm: int, bn: int, warps: int, stages: int) -> KernelConfig:
    return KernelConfig(bm, bn, warps, stages)


#: Tuned ahead (``benchmarks/flash_attention.py --tune``; the sweeps, and the GPU they
#: ran on, are in ``benchmarks/notes/flash_attention.md``), one entry per
#: (compute capability, head dim, dtype, causal): the forward, the dK/dV kernel and the
#: dQ kernel.  Windows and document masks take the causal entry (masked tiles at both
#: ends of every row).  The D=32 and D=256 entries are compiled and checked, not tuned.
CONFIGS: dict[tuple[int, int, str, bool], dict[str, KernelConfig]] = {}


def _fill_defaults() -> None:
    # Swept on an H100 (torch 2.11, triton 3.6), bf16, B=4, N=4096: H=16 at D=128 and
    # H=32 at D=64; see benchmarks/notes/flash_attention.md.  fp16 takes the same tiles.
    # The D=128 forward's 64 x 64 tiles take 115,712 bytes of shared memory and 143
    # registers a thread: two programs fit on an SM, and one's softmax overlaps the
    # other's products (491 TFLOP/s, against 491 for 128 x 128 tiles in 8 warps without
    # a mask and 453 against 421 causal).
    tuned = {
        (64, False): (_kc(128, 128, 4, 3), _kc(32, 128, 4, 3), _kc(128, 64, 8, 3)),
        (64, True): (_kc(128, 128, 4, 3), _kc(64, 64, 4, 3), _kc(128, 64, 8, 3)),
        (128, False): (_kc(64, 64, 4, 3), _kc(64, 64, 4, 2), _kc(128, 64, 8, 3)),
        (128, True): (_kc(64, 64, 4, 3), _kc(64, 64, 4, 2), _kc(128, 64, 8, 3)),
    }
    # D=32 takes D=64's tiles; D=256 the ones that keep registers spill-free or nearly
    # (dK/dV spills 176 bytes outside its inner loop).  Compiled and checked, not swept.
    for causal in (False, True):
        tuned[(32, causal)] = tuned[(64, causal)]
        tuned[(256, causal)] = (_kc(64, 64, 4, 2), _kc(64, 64, 8, 1), _kc(64, 32, 4, 2))
    for (head_dim, causal), (fwd, dkdv, dq) in tuned.items():
        for dtype in ("bf16", "fp16"):
            CONFIGS[(90, head_dim, dtype, causal)] = {"fwd": fwd, "dkdv": dkdv, "dq": dq}


_fill_defaults()

# Other GPUs (not tuned): tiles that fit in 100 KB of shared memory.
_FALLBACK = {
    "fwd": _kc(64, 64, 4, 2),
    "dkdv": _kc(32, 64, 4, 2),
    "dq": _kc(64, 32, 4, 2),
}
_FALLBACK_256 = {"fwd": _kc(32, 32, 4, 1), "dkdv": _kc(16, 32, 4, 1), "dq": _kc(32, 16, 4, 1)}
# The interpreter: tiles of 16 keep the emulated programs cheap and make even the
# small test shapes cross several tiles (and BLOCK_M != BLOCK_N in the forward).
_INTERPRETER = {"fwd": _kc(32, 16, 4, 1), "dkdv": _kc(16, 32, 4, 1), "dq": _kc(32, 16, 4, 1)}
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def pick_configs(
    head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device
) -> dict[str, KernelConfig]:
    """The committed configurations for a call: ``{"fwd", "dkdv", "dq"}`` to KernelConfig."""
    if device.type != "cuda":
        return _INTERPRETER
    if dtype not in _GPU_DTYPES or head_dim not in HEAD_DIMS:
        # torch.ops.tilebook.* reaches here without the public function's checks.
        raise ValueError(
            f"flash_attention on a GPU takes float16 or bfloat16 with a head dimension "
            f"in {HEAD_DIMS}; got {dtype} and {head_dim}"
        )
    major, minor = runtime.capability(device)
    return _configs_for(major * 10 + minor, head_dim, _DTYPE_NAMES[dtype], causal)


def _configs_for(arch: int, head_dim: int, dtype: str, causal: bool) -> dict[str, KernelConfig]:
    key = (arch, head_dim, dtype, bool(causal))
    if key in CONFIGS:
        return CONFIGS[key]
    if arch // 10 == 9:  # H100 and H200 share the sm_90 tables
        return CONFIGS[(90, *key[1:])]
    return _FALLBACK_256 if head_dim == 256 else _FALLBACK


# --------------------------------------------------------------------------- masks


@dataclass(frozen=True)
class _Mask:
    """The band every query sees, in the kernels' terms: keys j with
    ``i' - left <= j <= i' + right``; an unbounded side is ``Nq + Nk``."""

    left: int
    right: int
    band: bool  # False: no causal mask and no window (only the padding past Nk)


def _mask_for(causal: bool, window, nq: int, nk: int) -> _Mask:
    far = nq + nk  # past every key from every query: an unbounded side
    left, right = window if window is not None else (None, None)
    band = bool(causal) or left is not None or right is not None
    left = far if left is None else max(-far, min(int(left), far))
    right = far if right is None else max(-far, min(int(right), far))
    if causal:
        right = min(right, 0)
    return _Mask(left, right, band)


def document_ranges(document_ids: torch.Tensor, block: int) -> torch.Tensor:
    """Per tile of ``block`` positions: the positions its rows may see, and those all of
    its rows see, under a document mask: ``(B, cdiv(N, block), 4)`` int32 holding
    ``lo, hi, full_lo, full_hi`` (half-open).

    The mask is symmetric, so the same ranges serve query tiles (forward, dQ) and key
    tiles (dK/dV).  For sorted ids (packed sequences) a tile whose ids run from ``a``
    to ``b`` sees exactly the positions of documents ``a..b``, and all of a
    one-document tile's rows see its whole document.  Rows of unsorted ids get the
    whole sequence and no fully visible part: the element mask alone decides there.
    Computed on the device with no host synchronisation.
    """
    ids = document_ids.to(torch.int64).contiguous()
    _batch, n = ids.shape
    starts = torch.arange(0, n, block, device=ids.device)
    first = ids[:, starts]
    last = ids[:, torch.clamp(starts + block - 1, max=n - 1)]
    lo = torch.searchsorted(ids, first)
    hi = torch.searchsorted(ids, last, right=True)
    single = first == last
    full_lo = torch.where(single, lo, 0)
    full_hi = torch.where(single, torch.searchsorted(ids, first, right=True), 0)
    if n > 1:
        # Scalars only: a small tensor built from a list would be a blocking copy to
        # the GPU, which synchronises the stream on every call.
        ordered = (ids[:, 1:] >= ids[:, :-1]).all(dim=1, keepdim=True)
        lo = torch.where(ordered, lo, 0)
        hi = torch.where(ordered, hi, n)
        full_lo = torch.where(ordered, full_lo, 0)
        full_hi = torch.where(ordered, full_hi, 0)
    return torch.stack((lo, hi, full_lo, full_hi), dim=-1).to(torch.int32).contiguous()


# --------------------------------------------------------------------------- launchers


def _descriptor(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A descriptor of the 4-D ``t`` (batch, heads, rows, D) giving ``block_rows x D`` tiles."""
    return TensorDescriptor(t, *_layout(t.shape, t.stride(), block_rows))


def _layout(shape, strides, rows: int) -> tuple[list, list, list]:
    """A descriptor's shape, strides and block for a 4-D tensor of this shape and
    strides read in tiles of ``rows`` rows."""
    shape, strides = list(shape), list(strides)
    # A dimension of size 1 is never stepped along: give it a stride TMA accepts.
    for i in (2, 1, 0):
        if shape[i] == 1:
            strides[i] = strides[i + 1] * shape[i + 1]
    return shape, strides, [1, 1, rows, shape[3]]


def _views(shapes_strides) -> tuple:
    """``(shape, strides)`` of each 4-D tensor as a descriptor takes them (see
    :func:`_layout`): what the Gluon forward's ``layouts`` are."""
    return tuple(_layout(shape, strides, 1)[:2] for shape, strides in shapes_strides)


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a tensor descriptor can read ``t`` in place: unit stride along D, the
    other strides (of dimensions longer than 1) positive multiples of 16 bytes, and a
    16-byte aligned start."""
    if t.data_ptr() % 16 or t.stride(3) != 1:
        return False
    step = 16 // t.element_size()
    return all(
        size == 1 or (s > 0 and s % step == 0)
        for size, s in zip(t.shape[:3], t.stride()[:3], strict=False)
    )


def _ready(t: torch.Tensor) -> torch.Tensor:
    return t if _tma_ready(t) else t.contiguous()


def _grid_1d(tiles: int, rows: int):
    return (tiles * rows,)


# Repeat launches.  Triton's JIT launch binds and specialises every argument on each
# call, tens of microseconds for these kernels' four tensor descriptors; a forward at
# 1 x 2 x 128 x 128 spent 148 us of host time a call (H100, triton 3.6).  A launch
# keeps what it compiled under its launch_key (everything Triton specialises on, and
# more: descriptors' shapes and strides exactly) with the config it was asked for,
# and the next launch with the same key starts that binary again with the new
# arguments (tilebook._launch.Launched), at the pipeline depth that fitted.
_LAUNCHES = Memo()


def _run(kernel, grid, config: KernelConfig, *args, **constexprs):
    """Launch with ``config``; if the tiles' pipeline does not fit in this GPU's shared
    memory (a smaller GPU, or the document mask's extra buffers), with fewer stages.
    A launch like an earlier one starts the binary that one compiled.  Returns what
    starts it again (:func:`tilebook._launch.launch`'s), or None."""
    key = None
    if runtime.is_gpu():
        key = launch_key(kernel, grid, args, constexprs)
        key = key and (config, key)
        again = _LAUNCHES.get(key)
        if again is not None and again(*args):
            return again
    stages = config.num_stages
    while True:
        try:
            launched = launch(
                kernel, grid, *args, **constexprs, num_warps=config.num_warps, num_stages=stages
            )
            break
        except OutOfResources:
            if stages <= 1:
                raise
            stages -= 1
    if key is not None and launched is not None:
        _LAUNCHES.remember(key, launched)
    return launched


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float,
    mask: _Mask,
    document_ids: torch.Tensor | None,
    config: KernelConfig,
    gluon: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel on checked, descriptor-ready inputs.

    Returns ``O`` (B, H, Nq, D) in q's dtype and the base-2 log-sum-exp of the scaled
    scores (B, H, Nq) in float32 (``+inf`` for rows that see no key).

    ``gluon``: None takes the Gluon forward of :mod:`tilebook.ops.attention_hopper`
    where it applies (an sm_90 GPU, no documents, D of 64 or 128) and the Triton
    kernel with ``config`` elsewhere; False always the Triton kernel (``config``'s
    tiles are then what runs); True the Gluon forward, or :class:`ValueError` where
    it does not apply.
    """
    if gluon and not attention_hopper.usable(q, k, document_ids is not None):
        raise ValueError(
            "the Gluon forward needs an sm_90 GPU, float16 or bfloat16, a head dimension "
            f"in {attention_hopper.HEAD_DIMS}, no document_ids and a Triton with Gluon"
        )
    o, lse, _ = _attention_forward(q, k, v, sm_scale, mask, document_ids, config, gluon)
    return o, lse


def _attention_forward(q, k, v, sm_scale, mask, document_ids, config, gluon=None):
    """:func:`attention_forward`'s work: ``(o, lse, what starts the launch again)``; that
    last is a ``(kind, Launched)`` pair, ``kind`` "gluon" or "triton", or None."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    doc = document_ids
    if gluon is not False and attention_hopper.usable(q, k, doc is not None):
        with device_guard(q):
            if q.is_cuda:
                ensure_cuda_context(q.device)
            layouts = _views((t.shape, t.stride()) for t in (q, k, v, o))
            try:
                launched = attention_hopper.forward(
                    launch, q, k, v, o, lse, layouts, sm_scale, mask.left, mask.right,
                    mask.band,
                )  # fmt: skip
                return o, lse, ("gluon", launched) if launched is not None else None
            except RuntimeError:
                if gluon:
                    raise
    bm, bn = config.block_m, config.block_n
    num_m = triton.cdiv(Nq, bm)
    rng = document_ranges(doc, bm) if doc is not None else lse
    with device_guard(q):
        if q.is_cuda:
            ensure_cuda_context(q.device)
        launched = _run(
            _fwd_kernel, _grid_1d(num_m, B * H), config,
            _descriptor(q, bm), _descriptor(k, bn), _descriptor(v, bn), _descriptor(o, bm),
            lse, doc if doc is not None else lse, rng,
            sm_scale * _LOG2E, H, H // Hkv, Nq, Nk, mask.left, mask.right, num_m,
            HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, BAND=mask.band, DOC=doc is not None,
        )  # fmt: skip
    return o, lse, ("triton", launched) if launched is not None else None


_PREPROCESS_BLOCK = 64


def launch_preprocess(o: torch.Tensor, do: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``delta[b, h, i] = sum_d dO * O`` into the float32 ``delta`` (B, H, Nq)."""
    _preprocess(o, do, delta)
    return delta


def _preprocess(o, do, delta):
    """:func:`launch_preprocess`'s launch; returns what starts it again (or None)."""
    B, H, Nq, D = o.shape
    block = _PREPROCESS_BLOCK
    return launch(
        _bwd_preprocess_kernel, (triton.cdiv(Nq, block), B * H),
        o, do, delta, H, Nq, o.stride(0), o.stride(1), o.stride(2),
        do.stride(0), do.stride(1), do.stride(2), HEAD_DIM=D, BLOCK_M=block,
    )  # fmt: skip


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, *, sm_scale, mask, document_ids, config):
    """dK and dV into ``dk`` and ``dv`` (B, Hkv, Nk, D), summed over grouped query heads."""
    kw = {"sm_scale": sm_scale, "mask": mask, "document_ids": document_ids, "config": config}
    _dkdv(q, k, v, do, lse, delta, dk, dv, **kw)
    return dk, dv


def _dkdv(q, k, v, do, lse, delta, dk, dv, *, sm_scale, mask, document_ids, config):
    """:func:`launch_dkdv`'s launch; returns what starts it again (or None)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    bm, bn = config.block_m, config.block_n
    num_n = triton.cdiv(Nk, bn)
    doc = document_ids
    rng = document_ranges(doc, bn) if doc is not None else lse
    with device_guard(q):
        if q.is_cuda:
            ensure_cuda_context(q.device)
        return _run(
            _bwd_dkdv_kernel, _grid_1d(num_n, B * Hkv), config,
            _descriptor(q, bm), _descriptor(k, bn), _descriptor(v, bn), _descriptor(do, bm),
            _descriptor(dk, bn), _descriptor(dv, bn), lse, delta,
            doc if doc is not None else lse, rng,
            sm_scale, sm_scale * _LOG2E, Hkv, H // Hkv, Nq, Nk, mask.left, mask.right, num_n,
            HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, BAND=mask.band, DOC=doc is not None,
        )  # fmt: skip


def launch_dq(q, k, v, do, lse, delta, dq, *, sm_scale, mask, document_ids, config):
    """dQ into ``dq`` (B, H, Nq, D)."""
    _dq(q, k, v, do, lse, delta, dq, sm_scale=sm_scale, mask=mask, document_ids=document_ids,
        config=config)  # fmt: skip
    return dq


def _dq(q, k, v, do, lse, delta, dq, *, sm_scale, mask, document_ids, config):
    """:func:`launch_dq`'s launch; returns what starts it again (or None)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    bm, bn = config.block_m, config.block_n
    num_m = triton.cdiv(Nq, bm)
    doc = document_ids
    rng = document_ranges(doc, bm) if doc is not None else lse
    with device_guard(q):
        if q.is_cuda:
            ensure_cuda_context(q.device)
        return _run(
            _bwd_dq_kernel, _grid_1d(num_m, B * H), config,
            _descriptor(q, bm), _descriptor(k, bn), _descriptor(v, bn), _descriptor(do, bm),
            _descriptor(dq, bm), lse, delta, doc if doc is not None else lse, rng,
            sm_scale, sm_scale * _LOG2E, H, H // Hkv, Nq, Nk, mask.left, mask.right, num_m,
            HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, BAND=mask.band, DOC=doc is not None,
        )  # fmt: skip


def attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    *,
    sm_scale: float,
    mask: _Mask,
    document_ids: torch.Tensor | None,
    configs: dict[str, KernelConfig],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` from the forward's ``o`` and ``lse``: the rowsum(dO*O)
    preprocess, then the dK/dV kernel and the dQ kernel."""
    kw = {"sm_scale": sm_scale, "mask": mask, "document_ids": document_ids, "configs": configs}
    return _attention_backward(do, q, k, v, o, lse, **kw)[:3]


def _attention_backward(do, q, k, v, o, lse, *, sm_scale, mask, document_ids, configs):
    """:func:`attention_backward`'s work: ``(dq, dk, dv, what starts each of the three
    launches again)``."""
    do = _ready(do)
    delta = torch.empty_like(lse)
    pre = _preprocess(o, do, delta)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    kw = {"sm_scale": sm_scale, "mask": mask, "document_ids": document_ids}
    kv = _dkdv(q, k, v, do, lse, delta, dk, dv, config=configs["dkdv"], **kw)
    qq = _dq(q, k, v, do, lse, delta, dq, config=configs["dq"], **kw)
    return dq, dk, dv, (pre, kv, qq)


def _forward(q, k, v, document_ids, sm_scale, mask, configs, remember=None):
    """``(o, lse)``, with no launch when there is nothing to compute; with ``remember``
    (a key of :data:`_CALLS`), the launch is remembered for calls like this one."""
    B, H, Nq, D = q.shape
    if k.shape[2] == 0 or q.numel() == 0:  # every query sees no key
        o = torch.zeros((B, H, Nq, D), dtype=q.dtype, device=q.device)
        return o, torch.full((B, H, Nq), float("inf"), device=q.device)
    o, lse, launched = _attention_forward(
        q, k, v, sm_scale, mask, document_ids, configs["fwd"]
    )  # fmt: skip
    if remember is not None and launched is not None:
        replay = _call_replay(launched, q, k, v, mask, configs["fwd"])
        _CALLS.remember(remember, _Call(replay, mask, configs, 1.0 / math.sqrt(D)))
    return o, lse


class _Call:
    """A remembered kind of call (:data:`_CALLS`): its forward replay, and the backward
    replay its first backward with a plain ``dO`` leaves (None until then)."""

    __slots__ = ("backward", "configs", "forward", "mask", "scale")

    def __init__(self, forward, mask, configs, scale: float):
        self.forward, self.mask, self.configs, self.scale = forward, mask, configs, scale
        self.backward = None


# Repeat calls.  A forward at 1 x 4 x 256 x 64 spent about 155 us of host time in
# checks, configuration, four descriptors and the launch key (H100's host, triton 3.6),
# where SDPA spent 31.  A call without documents or a window, on tensors the kernels
# read in place, keeps its launch under the key of the three tensors' shapes, strides,
# dtypes, devices and alignment and of ``causal``: everything the checks read and the
# launch was specialised on.  The next call with the same key only allocates O and the
# log-sum-exp, builds the descriptors and launches; ``sm_scale`` is a runtime argument.
_CALLS = Memo()


def _call_key(q, k, v, causal: bool) -> tuple:
    aligned = not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype,
            v.dtype, q.device, k.device, v.device, aligned, causal)  # fmt: skip


def _call_replay(launched, q, k, v, mask: _Mask, config: KernelConfig):
    """``replay(q, k, v, sm_scale) -> (o, lse) or None`` for tensors keyed like these;
    ``launched`` is :func:`_attention_forward`'s ``(kind, Launched)``."""
    kind, launched = launched
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    o_shape, lse_shape = (B, H, Nq, D), (B, H, Nq)
    o_strides = (H * Nq * D, Nq * D, D, 1)
    empty, f32 = torch.empty, torch.float32
    if kind == "gluon":
        views = _views(((q.shape, q.stride()), (k.shape, k.stride()), (v.shape, v.stride()),
                        (o_shape, o_strides)))  # fmt: skip
        left, right = mask.left, mask.right

        def arguments(q, k, v, o, lse, sm_scale):
            return attention_hopper.arguments(q, k, v, o, lse, views, sm_scale, left, right)
    else:
        bm, bn = config.block_m, config.block_n
        lq, lk, lv = (_layout(t.shape, t.stride(), r) for t, r in ((q, bm), (k, bn), (v, bn)))
        lo = _layout(o_shape, o_strides, bm)
        ints = (H, H // Hkv, Nq, Nk, mask.left, mask.right, triton.cdiv(Nq, bm))
        desc = TensorDescriptor

        def arguments(q, k, v, o, lse, sm_scale):
            return (desc(q, *lq), desc(k, *lk), desc(v, *lv), desc(o, *lo), lse, lse, lse,
                    sm_scale * _LOG2E, *ints)  # fmt: skip

    def replay(q, k, v, sm_scale: float):
        dev = q.device
        o = empty(o_shape, dtype=q.dtype, device=dev)
        lse = empty(lse_shape, dtype=f32, device=dev)
        if (o.data_ptr() | lse.data_ptr()) & 15:
            return None  # another specialisation: the ordinary path
        if dev.type == "cuda":
            ensure_cuda_context(dev)
        return (o, lse) if launched(*arguments(q, k, v, o, lse, sm_scale)) else None

    return replay


def _backward_replay(launches, q, k, v, mask: _Mask, configs):
    """``replay(do, q, k, v, o, lse, sm_scale) -> (dq, dk, dv) or None`` for tensors laid
    out like these (the call's key) and a contiguous, 16-byte aligned ``do`` of q's
    dtype; ``o`` is the forward's (contiguous)."""
    pre, dkdv, dqk = launches
    _, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    o_strides = (H * Nq * D, Nq * D, D, 1)  # o, do (contiguous) and dq
    kv_strides = (Hkv * Nk * D, Nk * D, D, 1)  # dk and dv
    pre_ints = (H, Nq, *o_strides[:3])

    def layouts(cfg: KernelConfig) -> tuple:
        """q, k, v and do as the kernel with ``cfg``'s tiles reads them."""
        bm, bn = cfg.block_m, cfg.block_n
        return (_layout(q.shape, q.stride(), bm), _layout(k.shape, k.stride(), bn),
                _layout(v.shape, v.stride(), bn), _layout(q.shape, o_strides, bm))  # fmt: skip

    cfg_kv, cfg_q = configs["dkdv"], configs["dq"]
    lay_kv, lay_q = layouts(cfg_kv), layouts(cfg_q)
    ldk = _layout(k.shape, kv_strides, cfg_kv.block_n)
    ldq = _layout(q.shape, o_strides, cfg_q.block_m)
    kv_ints = (Hkv, H // Hkv, Nq, Nk, mask.left, mask.right, triton.cdiv(Nk, cfg_kv.block_n))
    q_ints = (H, H // Hkv, Nq, Nk, mask.left, mask.right, triton.cdiv(Nq, cfg_q.block_m))
    desc, empty, empty_like = TensorDescriptor, torch.empty, torch.empty_like

    def replay(do, q, k, v, o, lse, sm_scale: float):
        delta = empty_like(lse)
        dq = empty(q.shape, dtype=q.dtype, device=q.device)
        dk = empty(k.shape, dtype=k.dtype, device=k.device)
        dv = empty(v.shape, dtype=v.dtype, device=v.device)
        if (delta.data_ptr() | dq.data_ptr() | dk.data_ptr() | dv.data_ptr()) & 15:
            return None  # another specialisation: the ordinary path
        if q.is_cuda:
            ensure_cuda_context(q.device)
        s2 = sm_scale * _LOG2E
        a, b, c, d = lay_kv
        kv_args = (desc(q, *a), desc(k, *b), desc(v, *c), desc(do, *d), desc(dk, *ldk),
                   desc(dv, *ldk), lse, delta, lse, lse, sm_scale, s2, *kv_ints)  # fmt: skip
        a, b, c, d = lay_q
        q_args = (desc(q, *a), desc(k, *b), desc(v, *c), desc(do, *d), desc(dq, *ldq),
                  lse, delta, lse, lse, sm_scale, s2, *q_ints)  # fmt: skip
        if not (pre(o, do, delta, *pre_ints, *do.stride()[:3]) and dkdv(*kv_args) and dqk(*q_args)):
            return None  # another device is current, or a hook listens
        return dq, dk, dv

    return replay


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd for :func:`flash_attention`; the inputs arrive checked and descriptor-ready.

    ``call`` is a remembered kind of call (see :data:`_CALLS`) whose forward is tried
    first, and whose backward replay the backward uses (or leaves there); ``remember``,
    a key under which the forward remembers its launch.  Both are plumbing of
    :func:`flash_attention`: they get no gradient.
    """

    @staticmethod
    def forward(ctx, q, k, v, document_ids, sm_scale, mask, configs, call=None, remember=None):
        got = call.forward(q, k, v, sm_scale) if call is not None else None
        ctx.call = call if got is not None else None
        if got is None:
            got = _forward(q, k, v, document_ids, sm_scale, mask, configs, remember)
        o, lse = got
        ctx.save_for_backward(q, k, v, o, lse, document_ids)
        ctx.sm_scale, ctx.mask, ctx.configs = sm_scale, mask, configs
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse, document_ids = ctx.saved_tensors
        rest = (None,) * 6  # document_ids, sm_scale, mask, configs, call, remember
        if k.shape[2] == 0 or q.numel() == 0:
            return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), *rest)
        call = ctx.call  # the forward replayed a remembered call: its backward may too
        replayable = call is not None and plain_grad(do, q.dtype)
        if replayable and call.backward is not None:
            got = call.backward(do, q, k, v, o, lse, ctx.sm_scale)
            if got is not None:
                return (*got, *rest)
        dq, dk, dv, launches = _attention_backward(
            do, q, k, v, o, lse, sm_scale=ctx.sm_scale, mask=ctx.mask,
            document_ids=document_ids, configs=ctx.configs,
        )  # fmt: skip
        if replayable and call.backward is None and None not in launches:
            call.backward = _backward_replay(launches, q, k, v, ctx.mask, ctx.configs)
        return dq, dk, dv, *rest


# --------------------------------------------------------------------------- public API

_OP = "flash_attention"


def _check_int_or_none(value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{_OP}: {what} must be an int or None, got {type(value).__name__}")


def _check_args(q, k, v, causal, sm_scale, window, document_ids) -> None:
    """Every check of flash_attention's arguments; raises TypeError or ValueError."""
    dtypes = _GPU_DTYPES if runtime.is_gpu() else _CPU_DTYPES
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, _OP, dtypes=dtypes, ndim=4)
    check_same_dtype_device(q, k, ("q", "k"), _OP)
    check_same_dtype_device(q, v, ("q", "v"), _OP)
    B, H, _, D = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"{_OP}: k and v must have the same shape (B, Hkv, Nk, D), got {tuple(k.shape)} "
            f"and {tuple(v.shape)}"
        )
    if k.shape[0] != B:
        raise ValueError(f"{_OP}: q has batch {B} but k and v have batch {k.shape[0]}")
    if k.shape[3] != D:
        raise ValueError(f"{_OP}: q has head dim {D} but k and v have head dim {k.shape[3]}")
    hkv = k.shape[1]
    if hkv == 0 or H % hkv:
        raise ValueError(
            f"{_OP}: the query heads ({H}) must be a multiple of the key/value heads ({hkv}) "
            "(grouped-query attention)"
        )
    if D not in HEAD_DIMS:
        raise ValueError(
            f"{_OP}: head dim {D} is not supported; supported: {', '.join(map(str, HEAD_DIMS))}"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"{_OP}: causal must be a bool, got {type(causal).__name__}")
    if sm_scale is not None:
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
            raise TypeError(f"{_OP}: scale must be a float or None, got {type(sm_scale).__name__}")
        if not (math.isfinite(sm_scale) and sm_scale > 0):
            raise ValueError(f"{_OP}: scale must be a finite positive number, got {sm_scale}")
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError(f"{_OP}: window must be a (left, right) pair or None, got {window!r}")
        _check_int_or_none(window[0], "window's left bound")
        _check_int_or_none(window[1], "window's right bound")
    if document_ids is not None:
        check_tensor(document_ids, "document_ids", _OP, dtypes=_DOC_DTYPES, ndim=2)
        if document_ids.device != q.device:
            raise ValueError(
                f"{_OP}: document_ids is on {document_ids.device} but q is on {q.device}"
            )
        nq, nk = q.shape[2], k.shape[2]
        if nq != nk:
            raise ValueError(
                f"{_OP}: document_ids needs as many queries as keys, got Nq={nq} and Nk={nk}"
            )
        if tuple(document_ids.shape) != (B, nq):
            raise ValueError(
                f"{_OP}: document_ids must have shape (B, N) = ({B}, {nq}), got "
                f"{tuple(document_ids.shape)}"
            )


_DOC_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


# --------------------------------------------------------------------------- torch.library
# Every kernel here reads through host-side tensor descriptors, which PyTorch's
# tracer cannot record (tilebook.ops.library): inside torch.compile the forward and
# the backward are opaque operators around the eager launchers.


def _op_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    document_ids: torch.Tensor | None,
    sm_scale: float,
    left: int,
    right: int,
    band: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` for checked inputs and the mask ``_Mask(left, right, band)``."""
    B, H, Nq, D = q.shape
    if k.shape[2] == 0 or q.numel() == 0:
        o = torch.zeros((B, H, Nq, D), dtype=q.dtype, device=q.device)
        return o, torch.full((B, H, Nq), float("inf"), device=q.device)
    configs = pick_configs(D, q.dtype, band or document_ids is not None, q.device)
    doc = document_ids.contiguous() if document_ids is not None else None
    return attention_forward(
        _ready(q), _ready(k), _ready(v), sm_scale=sm_scale, mask=_Mask(left, right, band),
        document_ids=doc, config=configs["fwd"],
    )  # fmt: skip


def _op_forward_fake(q, k, v, document_ids, sm_scale, left, right, band):
    B, H, Nq, D = q.shape
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    return o, torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)


def _op_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    document_ids: torch.Tensor | None,
    sm_scale: float,
    left: int,
    right: int,
    band: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` from the forward operator's inputs and outputs."""
    if k.shape[2] == 0 or q.numel() == 0:
        return _op_backward_fake(do, q, k, v, o, lse, document_ids, sm_scale, left, right,
                                 band, zeros=True)  # fmt: skip
    configs = pick_configs(q.shape[3], q.dtype, band or document_ids is not None, q.device)
    doc = document_ids.contiguous() if document_ids is not None else None
    return attention_backward(
        do, _ready(q), _ready(k), _ready(v), o, lse, sm_scale=sm_scale,
        mask=_Mask(left, right, band), document_ids=doc, configs=configs,
    )  # fmt: skip


def _op_backward_fake(do, q, k, v, o, lse, document_ids, sm_scale, left, right, band, *,
                      zeros=False):  # fmt: skip
    new = torch.zeros if zeros else torch.empty
    return tuple(new(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


flash_attention_op = library.define_opaque("flash_attention", _op_forward, fake=_op_forward_fake)
flash_attention_backward_op = library.define_opaque(
    "flash_attention_backward", _op_backward, fake=_op_backward_fake
)


def _op_setup(ctx, inputs, output) -> None:
    q, k, v, document_ids, *ctx.rest = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], document_ids)


def _op_grad(ctx, do, _dlse):
    q, k, v, o, lse, document_ids = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward_op(do, q, k, v, o, lse, document_ids, *ctx.rest)
    return dq, dk, dv, None, None, None, None, None


flash_attention_op.register_autograd(_op_grad, setup_context=_op_setup)


def _compiled(q, k, v, causal, sm_scale, window, document_ids) -> torch.Tensor:
    """:func:`flash_attention` inside torch.compile: the checks, then the operator."""
    _check_args(q, k, v, causal, sm_scale, window, document_ids)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[3])
    mask = _mask_for(causal, window, q.shape[2], k.shape[2])
    o, _ = flash_attention_op(q, k, v, document_ids, scale, mask.left, mask.right, mask.band)
    return o


_compiling = torch.compiler.is_compiling


_WARNED_SM_SCALE = False


def _renamed_scale(scale: float | None, deprecated: dict[str, Any]) -> float | None:
    """``scale`` given as the former keyword ``sm_scale=`` (a FutureWarning, once)."""
    global _WARNED_SM_SCALE
    unknown = sorted(set(deprecated) - {"sm_scale"})
    if unknown:
        raise TypeError(f"{_OP}() got an unexpected keyword argument {unknown[0]!r}")
    if scale is not None:
        raise TypeError(f"{_OP}: give scale= (or the former sm_scale=), not both")
    if not _WARNED_SM_SCALE:
        _WARNED_SM_SCALE = True
        warnings.warn(
            f"{_OP}: sm_scale= is now scale= (as in scaled_dot_product_attention); "
            "sm_scale= will be removed in the next release",
            FutureWarning,
            stacklevel=3,
        )
    return deprecated["sm_scale"]


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    document_ids: torch.Tensor | None = None,
    **deprecated: Any,
) -> torch.Tensor:
    """Scaled dot-product attention by Triton kernels, with autograd.

    ``softmax(q @ k^T * scale + mask) @ v`` without materialising the scores.

    Parameters
    ----------
    q
        ``(B, H, Nq, D)`` queries; float16 or bfloat16 on a GPU (float32 too under the
        interpreter).  ``D`` is one of 32, 64, 128, 256.
    k, v
        ``(B, Hkv, Nk, D)`` keys and values of q's dtype and device, with ``H`` a
        multiple of ``Hkv``: grouped-query (and, with ``Hkv = 1``, multi-query)
        attention.  Query head ``h`` uses key/value head ``h // (H // Hkv)``.  Any
        ``Nq`` and ``Nk``, equal or not.
    causal
        Query ``i`` sees key ``j`` when ``j <= i + Nk - Nq`` (bottom-right aligned, as
        in FlashAttention; the usual causal mask when ``Nq == Nk``).
    scale
        The scale of the scores, a positive number; ``1 / sqrt(D)`` by default (as
        in :func:`torch.nn.functional.scaled_dot_product_attention`).  The former
        name ``sm_scale=`` still works for one release, with a ``FutureWarning``.
    window
        ``(left, right)``: query ``i`` sees keys ``j`` with
        ``i' - left <= j <= i' + right``, where ``i' = i + Nk - Nq``; either bound may
        be None (unbounded).  Combines with ``causal``.
    document_ids
        ``(B, N)`` integer tensor (``Nq == Nk == N``): a query sees only keys of its
        own document (packed sequences).  Combines with ``causal`` and ``window``.
        Sorted ids (each document contiguous) let whole tiles be skipped; other ids
        are masked element by element over the whole sequence.

    Returns
    -------
    torch.Tensor
        ``(B, H, Nq, D)`` in q's dtype (a new contiguous tensor).  A query that sees
        no key gets 0, and zero gradients.

    Notes
    -----
    Under ``torch.autocast``, ``q``, ``k`` and ``v`` are cast to the autocast dtype
    first, as ``scaled_dot_product_attention``'s are.
    Tiles whose keys are all masked are skipped, so the time falls with the visible
    area.  Inputs are read in place when their last dimension is contiguous and
    their other strides and start are 16-byte aligned (any layout of B, H and N,
    such as ``(B, N, H, D).transpose(1, 2)``); other inputs are copied first.
    Gradients flow to q, k and v; for grouped heads, dK and dV sum over the query
    heads sharing a key/value head.

    Inside ``torch.compile`` the call is the operator
    ``torch.ops.tilebook.flash_attention`` (opaque: see :mod:`tilebook.ops.library`).

    Examples
    --------
    >>> o = tilebook.flash_attention(q, k, v, causal=True)   # doctest: +SKIP
    """
    sm_scale = scale if not deprecated else _renamed_scale(scale, deprecated)
    if autocasting(q):
        q, k, v = lower(q, k, v)  # as scaled_dot_product_attention under autocast
    if _compiling():
        return _compiled(q, k, v, causal, sm_scale, window, document_ids)
    key = None
    if (
        document_ids is None
        and window is None
        and (causal is True or causal is False)
        and (sm_scale is None or (type(sm_scale) is float and 0.0 < sm_scale < math.inf))
        and plain(q)
        and plain(k)
        and plain(v)
    ):
        key = _call_key(q, k, v, causal)
        call = _CALLS.get(key)
        if call is not None:
            scale = call.scale if sm_scale is None else sm_scale
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return FlashAttentionFunction.apply(
                    q, k, v, None, scale, call.mask, call.configs, call
                )
            got = call.forward(q, k, v, scale)
            if got is not None:
                return got[0]
    _check_args(q, k, v, causal, sm_scale, window, document_ids)
    D = q.shape[3]
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(D)
    nq, nk = q.shape[2], k.shape[2]
    mask = _mask_for(causal, window, nq, nk)
    banded = mask.band or document_ids is not None
    configs = pick_configs(D, q.dtype, banded, q.device)
    doc = document_ids.contiguous() if document_ids is not None else None
    if key is not None and not (_tma_ready(q) and _tma_ready(k) and _tma_ready(v)):
        key = None  # copied first: nothing to replay on the caller's tensors
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # Nothing for autograd to record: no Function (and its host time) around it.
        return _forward(_ready(q), _ready(k), _ready(v), doc, scale, mask, configs, key)[0]
    return FlashAttentionFunction.apply(
        _ready(q), _ready(k), _ready(v), doc, scale, mask, configs, None, key
    )


def compile_ahead(
    kernel: str,
    config: KernelConfig,
    head_dim: int = 128,
    dtype: str = "bf16",
    *,
    band: bool = False,
    documents: bool = False,
    arch: int = 90,
):
    """Compile ``"fwd"``, ``"dkdv"`` or ``"dq"`` for ``sm_<arch>`` without a GPU, as a launch
    with ``config`` would; returns a :class:`tilebook.course.aot.CompiledKernel` (SASS,
    registers, spills).  ``dtype`` is Triton's name ("bf16", "fp16")."""
    from ..course.aot import compile_kernel

    job = _ahead_job(kernel, config, head_dim, dtype, band, documents, arch)
    # kernel, signature and constexprs by position, as compile_kernel's callers pass them
    return compile_kernel(job.pop("kernel"), job.pop("signature"), job.pop("constexprs"), **job)


def _ahead_job(kernel, config, head_dim, dtype, band, documents, arch) -> dict:
    """:func:`compile_ahead`'s compile job (for :func:`tilebook.course.aot.compile_many`)."""
    bm, bn = config.block_m, config.block_n

    def desc(rows):
        return f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}]>"

    ints = ("Nq", "Nk", "left", "right")
    common = {"lse_ptr": "*fp32", "doc_ptr": "*i64", "rng_ptr": "*i32"}
    consts = {"HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn, "BAND": band, "DOC": documents}
    if kernel == "fwd":
        sig = {"q_desc": desc(bm), "k_desc": desc(bn), "v_desc": desc(bn), "o_desc": desc(bm),
               **common, "qk_scale": "fp32", "H": "i32", "G": "i32",
               **dict.fromkeys(ints, "i32"), "num_m": "i32"}  # fmt: skip
        name = "_fwd_kernel"
    elif kernel == "dkdv":
        sig = {"q_desc": desc(bm), "k_desc": desc(bn), "v_desc": desc(bn), "do_desc": desc(bm),
               "dk_desc": desc(bn), "dv_desc": desc(bn), "lse_ptr": "*fp32",
               "delta_ptr": "*fp32", "doc_ptr": "*i64", "rng_ptr": "*i32",
               "sm_scale": "fp32", "qk_scale": "fp32", "Hkv": "i32", "G": "i32",
               **dict.fromkeys(ints, "i32"), "num_n": "i32"}  # fmt: skip
        name = "_bwd_dkdv_kernel"
    elif kernel == "dq":
        sig = {"q_desc": desc(bm), "k_desc": desc(bn), "v_desc": desc(bn), "do_desc": desc(bm),
               "dq_desc": desc(bm), "lse_ptr": "*fp32", "delta_ptr": "*fp32",
               "doc_ptr": "*i64", "rng_ptr": "*i32", "sm_scale": "fp32", "qk_scale": "fp32",
               "H": "i32", "G": "i32", **dict.fromkeys(ints, "i32"), "num_m": "i32"}  # fmt: skip
        name = "_bwd_dq_kernel"
    else:
        raise ValueError(f"compile_ahead: kernel must be 'fwd', 'dkdv' or 'dq', got {kernel!r}")
    return {
        "kernel": f"tilebook.ops.flash_attention:{name}",
        "signature": sig,
        "constexprs": consts,
        "arch": arch,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The four kernels as jobs of :func:`tilebook.course.aot.compile_many` for ``sm_<arch>``,
    in the configurations :func:`pick_configs` takes there for a causal mask: head
    dim 128, and 64 below sm_80 (a T4's 64 KB of shared memory hold the D=128 tiles
    only after :func:`attention_forward` drops pipeline stages, which it does when
    the launch runs out of resources)."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    head_dim = 128 if arch >= 80 else 64
    configs = _configs_for(arch, head_dim, targets.dtype_name(dt), True)
    where = f"D={head_dim} causal"
    jobs = {
        f"{name} {where}": _ahead_job(
            kind, configs[kind], head_dim, targets.dtype_name(dt), True, False, arch
        )
        for kind, name in (("fwd", "_fwd_kernel"), ("dkdv", "_bwd_dkdv_kernel"),
                           ("dq", "_bwd_dq_kernel"))
    }  # fmt: skip
    o = targets.meta_tensor(1, 16, 4096, head_dim, dtype=dt)
    delta = targets.meta_tensor(1, 16, 4096)
    args = (o, o, delta, 16, 4096, *o.stride()[:3], *o.stride()[:3])
    meta = {"HEAD_DIM": head_dim, "BLOCK_M": _PREPROCESS_BLOCK}
    jobs[f"_bwd_preprocess_kernel D={head_dim}"] = targets.launch_job(
        _bwd_preprocess_kernel, args, meta, arch
    )
    return jobs
