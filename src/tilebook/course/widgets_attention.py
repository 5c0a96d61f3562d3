"""Lesson 12's tiling stepper: which tiles a flash-attention program computes, skips or
masks, and the running maximum and sum of its online softmax, step by step.

:func:`tile_states` classifies the ``BLOCK_M x BLOCK_N`` tiles of a boolean
attention mask the way the kernels do (and the way FlexAttention's block masks
do): *skipped* (no visible pair: never loaded), *masked* (some pairs visible:
computed, then masked element by element) or *full* (every pair visible:
computed without mask arithmetic).  :class:`TilingStepper` replays one query
tile's loop over its key tiles in float64, with the recurrence of the kernels
(base 2: ``m`` the running maximum of the scores, ``l`` the running sum of
``exp2(score - m)``), for several masks and several ways of getting it wrong:

``as written``
    the kernel's loop: skipped tiles are never visited, masked ones are masked;
``no rescale``
    the sum and the output are not rescaled when the maximum grows: wrong
    wherever a row's maximum arrives after its first tile;
``no skip``
    every key tile is visited and masked: right, but it computes tiles that
    contribute nothing (slow);
``no mask on partial tiles``
    partly visible tiles are treated as full: rows see keys they must not (wrong
    under every mask that has partial tiles).

Everything shown is computed here, from the scores the lesson passes; nothing
is measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from .widgets import Widget

__all__ = [
    "FULL",
    "MASKED",
    "SETTINGS",
    "SKIP",
    "TilingStepper",
    "block_mask_states",
    "replay",
    "tile_states",
]

#: Tile states, as :func:`tile_states` returns them.
SKIP, MASKED, FULL = 0, 1, 2
#: The stepper's settings and what each one is: right, wrong or slow.
SETTINGS = {
    "as written": "right",
    "no rescale": "wrong",
    "no skip": "slow",
    "no mask on partial tiles": "wrong",
}
_NOTES = {
    "as written": "Skipped tiles are never loaded; masked tiles get -inf where a pair is "
    "hidden; full tiles need no mask arithmetic.",
    "no rescale": "When a row's maximum grows, what it summed so far was computed against "
    "the old maximum and is too large by exp2(m_new - m_old): the sum and the output "
    "must be multiplied by that factor, alpha.",
    "no skip": "Every key tile is loaded, multiplied and masked, even those with no "
    "visible key: the answer is right, the work is wasted.",
    "no mask on partial tiles": "Partly visible tiles are computed as if full: rows "
    "attend to keys their mask hides.",
}


def tile_states(visible: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """The state of every ``block_m x block_n`` tile of the ``(Nq, Nk)`` boolean ``visible``.

    Returns ``(cdiv(Nq, block_m), cdiv(Nk, block_n))`` int64: :data:`SKIP` where no
    pair of the tile is visible, :data:`FULL` where every query row of the tile
    sees every key of it (a tile reaching past ``Nk`` is never full: its missing
    keys need the mask), :data:`MASKED` otherwise.
    """
    if not isinstance(visible, torch.Tensor) or visible.dtype != torch.bool or visible.dim() != 2:
        raise TypeError("tile_states: visible must be a 2-D boolean tensor (Nq, Nk)")
    if block_m < 1 or block_n < 1:
        raise ValueError(f"tile_states: blocks must be positive, got {block_m}, {block_n}")
    nq, nk = visible.shape
    tm, tn = math.ceil(nq / block_m), math.ceil(nk / block_n)
    seen = torch.zeros(tm * block_m, tn * block_n, dtype=torch.bool)
    seen[:nq, :nk] = visible.cpu()
    every = torch.ones_like(seen)  # rows past Nq do not count; keys past Nk do
    every[:nq, :nk] = visible.cpu()
    every[:, nk:] = False
    some = seen.reshape(tm, block_m, tn, block_n).any(dim=3).any(dim=1)
    all_ = every.reshape(tm, block_m, tn, block_n).all(dim=3).all(dim=1)
    states = torch.full((tm, tn), MASKED, dtype=torch.int64)
    states[~some] = SKIP
    states[all_ & some] = FULL
    return states


def block_mask_states(block_mask: Any, batch: int = 0, head: int = 0) -> torch.Tensor:
    """The tile states of a FlexAttention ``BlockMask``, as :func:`tile_states` gives them.

    A block mask lists, per query block, the key blocks to compute with the
    ``mask_mod`` applied (``kv_indices``, the first ``kv_num_blocks`` of them:
    :data:`MASKED`) and those to compute without it (``full_kv_indices``:
    :data:`FULL`); every other block is skipped.
    """
    nq, nk = block_mask.seq_lengths
    bq, bk = block_mask.BLOCK_SIZE
    states = torch.full((math.ceil(nq / bq), math.ceil(nk / bk)), SKIP, dtype=torch.int64)
    lists = [(block_mask.kv_num_blocks, block_mask.kv_indices, MASKED)]
    if block_mask.full_kv_num_blocks is not None:
        lists.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices, FULL))
    for counts, indices, state in lists:
        counts, indices = counts[batch, head].cpu(), indices[batch, head].cpu()
        for i in range(states.shape[0]):
            states[i, indices[i, : counts[i]].long()] = state
    return states


def _exact(scores: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    s = scores.masked_fill(~visible, -math.inf)
    p = torch.exp2(s - s.amax(1, keepdim=True)).nan_to_num(0.0)
    total = p.sum(1, keepdim=True)
    return torch.where(total > 0, (p @ values) / total.clamp_min(1e-300), 0.0)


def replay(
    scores: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    block_m: int,
    block_n: int,
    setting: str,
) -> list[dict[str, Any]]:
    """One query tile after another: the key tiles visited and the statistics after each.

    ``scores`` are ``(Nq, Nk)`` float64 in base-2 units (already times ``log2(e)``
    and the scale), ``values`` ``(Nk, Dv)``.  For each query tile: ``steps`` (the key
    tile, its state, ``m`` and ``l`` of every row after it; ``None`` for a maximum
    of ``-inf``), ``error`` (largest ``|o - exact|`` of the tile's rows),
    ``row_errors``, ``visited`` and ``needed`` (tiles that are not skipped).
    """
    if setting not in SETTINGS:
        raise ValueError(f"replay: setting must be one of {list(SETTINGS)}, got {setting!r}")
    scores, values = scores.double().cpu(), values.double().cpu()
    visible = visible.cpu()
    nq, nk = scores.shape
    states = tile_states(visible, block_m, block_n)
    exact = _exact(scores, values, visible)
    tiles = []
    for tq in range(states.shape[0]):
        rows = slice(tq * block_m, min((tq + 1) * block_m, nq))
        n_rows = rows.stop - rows.start
        needed = [j for j in range(states.shape[1]) if states[tq, j] != SKIP]
        visit = list(range(states.shape[1])) if setting == "no skip" else needed
        m = torch.full((n_rows,), -math.inf, dtype=torch.float64)
        l_sum = torch.zeros(n_rows, dtype=torch.float64)
        acc = torch.zeros(n_rows, values.shape[1], dtype=torch.float64)
        steps = []
        for j in visit:
            cols = slice(j * block_n, min((j + 1) * block_n, nk))
            s = scores[rows, cols]
            masked = states[tq, j] != FULL and setting != "no mask on partial tiles"
            if masked:
                s = s.masked_fill(~visible[rows, cols], -math.inf)
            m_new = torch.maximum(m, s.amax(1))
            m_use = torch.where(m_new == -math.inf, 0.0, m_new)  # no key seen yet
            p = torch.exp2(s - m_use[:, None])
            alpha = torch.exp2(m - m_use)
            if setting == "no rescale":
                alpha = torch.ones_like(alpha)
            l_sum = l_sum * alpha + p.sum(1)
            acc = acc * alpha[:, None] + p @ values[cols]
            m = m_new
            steps.append(
                {
                    "tile": j,
                    "state": int(states[tq, j]),
                    "masked": bool(masked),
                    "m": [None if math.isinf(x) else round(x, 4) for x in m.tolist()],
                    "l": [round(x, 4) for x in l_sum.tolist()],
                }
            )
        out = torch.where(l_sum[:, None] > 0, acc / l_sum.clamp_min(1e-300)[:, None], 0.0)
        err = (out - exact[rows]).abs().amax(1)
        tiles.append(
            {
                "steps": steps,
                "error": float(err.max()) if n_rows else 0.0,
                "row_errors": [float(f"{x:.3g}") for x in err.tolist()],
                "visited": len(visit),
                "needed": len(needed),
            }
        )
    return tiles


class TilingStepper(Widget):
    """The tiling stepper: masks, settings, a query tile and a step of its loop.

    Parameters
    ----------
    masks
        ``{name: (N, N) boolean tensor}``: which (query, key) pairs each mask lets
        through, in the order the reader should meet them.
    scores
        ``(N, N)`` scores in base-2 units (``q @ k.T`` times the scale and ``log2(e)``).
    values
        ``(N, Dv)`` values, for the output and its error.
    block_m, block_n
        Tile shape: query rows and key columns.
    caption
        Where the data come from.
    """

    kind = "tiling"
    scripts = ("tiling.js",)
    styles = ("tiling.css",)

    def __init__(
        self,
        masks: Mapping[str, torch.Tensor],
        scores: torch.Tensor,
        values: torch.Tensor,
        block_m: int,
        block_n: int,
        *,
        caption: str,
        title: str = "Tiling stepper",
    ) -> None:
        if not masks:
            raise ValueError("TilingStepper needs at least one mask")
        nq, nk = scores.shape
        for name, m in masks.items():
            if tuple(m.shape) != (nq, nk) or m.dtype != torch.bool:
                raise ValueError(f"mask {name!r} must be a ({nq}, {nk}) boolean tensor")
        if values.shape[0] != nk:
            raise ValueError(f"values must have {nk} rows, got {values.shape[0]}")
        self.masks = dict(masks)
        self.scores, self.values = scores, values
        self.block_m, self.block_n = block_m, block_n
        self.caption, self.title = caption, title

    def data(self) -> dict[str, Any]:
        bm, bn = self.block_m, self.block_n
        states = {name: tile_states(m, bm, bn).tolist() for name, m in self.masks.items()}
        runs = {
            name: {s: replay(self.scores, self.values, m, bm, bn, s) for s in SETTINGS}
            for name, m in self.masks.items()
        }
        return {
            "masks": list(self.masks),
            "settings": list(SETTINGS),
            "kinds": dict(SETTINGS),
            "notes": dict(_NOTES),
            "states": states,
            "replay": runs,
            "block_m": bm,
            "block_n": bn,
            "nq": int(self.scores.shape[0]),
            "nk": int(self.scores.shape[1]),
            "caption": self.caption,
        }
