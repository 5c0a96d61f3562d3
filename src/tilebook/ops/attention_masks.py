"""Flash attention's masks: which keys each query sees, and which tiles a program visits.

Every mask is a band plus documents: query ``i`` sees key ``j`` when
``i' - left <= j <= i' + right`` with ``i' = i + Nk - Nq`` (causal is ``right = 0``,
bottom-right aligned; no window is an unbounded band) and, with document ids, when
both belong to the same document.  From those bounds each program of the kernels
(:mod:`tilebook.ops.attention_fwd`, :mod:`tilebook.ops.attention_bwd`) computes which
tiles it must visit at all (the others are skipped, so time falls with the visible
area) and which of them are fully visible.  Its loop over tiles runs in three parts:
masked tiles, fully visible tiles (no mask arithmetic: the ``MASKED`` constexpr
compiles it out), masked tiles again.  For documents the host turns the ids into
per-tile ranges once per call (:func:`document_ranges`).

Here: the host's side (:class:`Mask`, :func:`mask_for`, :func:`document_ranges`) and
the kernels' (:func:`tile_ranges`, :func:`doc_bounds`, :func:`visible`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["Mask", "doc_bounds", "document_ranges", "mask_for", "tile_ranges", "visible"]


@dataclass(frozen=True)
class Mask:
    """The band every query sees, in the kernels' terms: keys j with
    ``i' - left <= j <= i' + right``; an unbounded side is ``Nq + Nk``."""

    left: int
    right: int
    band: bool  # False: no causal mask and no window (only the padding past Nk)


def mask_for(causal: bool, window, nq: int, nk: int) -> Mask:
    far = nq + nk  # past every key from every query: an unbounded side
    left, right = window if window is not None else (None, None)
    band = bool(causal) or left is not None or right is not None
    left = far if left is None else max(-far, min(int(left), far))
    right = far if right is None else max(-far, min(int(right), far))
    if causal:
        right = min(right, 0)
    return Mask(left, right, band)


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


# --------------------------------------------------------------------------- in the kernels


@triton.jit
def tile_ranges(lo, hi, full_lo, full_hi, BLOCK: tl.constexpr):
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
def doc_bounds(lo, hi, full_lo, full_hi, rng_ptr, DOC: tl.constexpr):
    # The host's per-tile document ranges (see document_ranges), intersected with the band's.
    if DOC:
        lo = tl.maximum(lo, tl.load(rng_ptr))
        hi = tl.minimum(hi, tl.load(rng_ptr + 1))
        full_lo = tl.maximum(full_lo, tl.load(rng_ptr + 2))
        full_hi = tl.minimum(full_hi, tl.load(rng_ptr + 3))
    return lo, hi, full_lo, full_hi


@triton.jit
def visible(offs_m, offs_n, doc_m, doc_ptr, shift, left, right, Nk, BAND: tl.constexpr,
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
