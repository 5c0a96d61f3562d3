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


_CSS = """
.tbw-tiling .tbw-tgrid td{width:2.4em;height:1.9em;text-align:center;padding:0}
.tbw-tiling .tbw-st0{color:var(--tbw-muted)}
.tbw-tiling .tbw-st1{background:rgba(0,158,115,0.30)}
.tbw-tiling .tbw-st2{background:rgba(0,114,178,0.38)}
.tbw-tiling td.tbw-waste{background:#F0A35E;color:#111}
.tbw-tiling td.tbw-bad,.tbw-tiling td.tbw-cell-wrong{background:#B3261E;color:#fff}
.tbw-tiling tr.tbw-row th{text-decoration:underline}
.tbw-tiling .tbw-cols{display:flex;flex-wrap:wrap;gap:10px 24px;align-items:flex-start}
.tbw-tiling .tbw-legend{color:var(--tbw-muted);font-size:12px;margin-top:4px}
"""

_JS = r"""
var st={mask:data.masks[0],setting:data.settings[0],tile:0,step:0},ctl={};
var seenMask=st.mask;  // a new mask starts its tile's steps over; a new setting does not
knobRows(body,[{name:"mask",label:"mask",values:data.masks,initial:st.mask},
  {name:"setting",label:"setting",values:data.settings,initial:st.setting}],st,
  function(){if(st.mask!==seenMask){seenMask=st.mask;st.step=0}update()});
function slider(name,label,i){var row=el("div","tbw-knob");
  var lab=el("span","tbw-label",label);lab.id=root.id+"-k"+i;row.appendChild(lab);
  var inp=el("input");inp.type="range";inp.min=0;inp.step=1;inp.value=0;
  inp.setAttribute("aria-labelledby",lab.id);var out=el("output");
  inp.addEventListener("input",function(){st[name]=+inp.value;
    if(name==="tile")st.step=0;update()});
  row.appendChild(inp);row.appendChild(out);body.appendChild(row);ctl[name]={inp:inp,out:out}}
slider("tile","query tile",2);slider("step","step",3);
var readout=el("div","tbw-readout");readout.setAttribute("aria-live","polite");
var sub=el("div","tbw-sub"),verdict=el("div","tbw-verdict"),note=el("div","tbw-note");
[readout,sub,verdict].forEach(function(e){body.appendChild(e)});
var cols=el("div","tbw-cols");body.appendChild(cols);
var gwrap=el("div","tbw-grid-wrap"),swrap=el("div","tbw-grid-wrap");
cols.appendChild(gwrap);cols.appendChild(swrap);
body.appendChild(el("div","tbw-legend","F: full tile (no mask), M: masked tile, "+
  "\u00b7: skipped; numbers: the order the selected query tile visits its key tiles; "+
  "orange: computed for nothing; red: computed without the mask it needs."));
body.appendChild(note);body.appendChild(el("div","tbw-caption",data.caption));
var sym=["\u00b7","M","F"],names=["skipped","masked","full"];
function span(t,b,n){return t*b+"\u2013"+(Math.min((t+1)*b,n)-1)}
function what(c){if(c.state===2)return "fully visible, no mask";
  if(c.state===1)return c.masked?"partly visible, masked":"partly visible, not masked";
  return "no visible key, computed anyway"}
function num(x){return x===null?"\u2212\u221e":x.toFixed(3)}
function update(){
  var grid=data.states[st.mask],tiles=data.replay[st.mask][st.setting];
  var T=grid.length;ctl.tile.inp.max=T-1;st.tile=Math.min(st.tile,T-1);
  ctl.tile.inp.value=st.tile;ctl.tile.out.textContent=String(st.tile);
  var tile=tiles[st.tile],steps=tile.steps,S=Math.max(1,steps.length);
  ctl.step.inp.max=S-1;st.step=Math.min(st.step,S-1);ctl.step.inp.value=st.step;
  ctl.step.out.textContent=steps.length?(st.step+1)+" of "+steps.length:"none";
  var order={};steps.forEach(function(s,i){order[s.tile]=i});
  var cur=steps.length?steps[st.step]:null,kind=data.kinds[st.setting];
  var t=el("table","tbw-tgrid");t.setAttribute("aria-label","tiles: query rows down, key columns across");
  var hr=el("tr");hr.appendChild(el("th","","q \u2193 k \u2192"));
  grid[0].forEach(function(_,j){hr.appendChild(el("th","",String(j)))});t.appendChild(hr);
  grid.forEach(function(row,i){var tr=el("tr",i===st.tile?"tbw-row":"");
    tr.appendChild(el("th","",String(i)));
    row.forEach(function(s,j){var td=el("td","tbw-st"+s,sym[s]);
      td.title="query tile "+i+", key tile "+j+": "+names[s];
      if(i===st.tile&&j in order){td.textContent=sym[s]+(order[j]+1);
        if(s===0)td.classList.add("tbw-waste");
        if(s===1&&!steps[order[j]].masked)td.classList.add("tbw-bad");
        if(cur&&cur.tile===j)td.classList.add("tbw-cur")}
      tr.appendChild(td)});t.appendChild(tr)});
  gwrap.innerHTML="";gwrap.appendChild(t);
  var last=st.step===steps.length-1,s2=el("table","tbw-stats");
  s2.setAttribute("aria-label","running statistics of the query rows");
  var h=el("tr");["row","max m (log2)","sum l"].concat(last?["|o \u2212 exact|"]:[])
    .forEach(function(c){h.appendChild(el("th","",c))});s2.appendChild(h);
  var r0=st.tile*data.block_m;
  (cur?cur.m:[]).forEach(function(m,r){var tr=el("tr");tr.appendChild(el("td","",String(r0+r)));
    tr.appendChild(el("td","",num(m)));tr.appendChild(el("td","",cur.l[r].toFixed(3)));
    if(last){var e=tile.row_errors[r];tr.appendChild(el("td",e>1e-9?"tbw-cell-wrong":"",
      e>1e-9?e.toPrecision(2):"0"))}
    s2.appendChild(tr)});
  swrap.innerHTML="";swrap.appendChild(s2);
  readout.textContent=cur?"key tile "+cur.tile+": "+what(cur):"no key tile to visit";
  sub.textContent="query rows "+span(st.tile,data.block_m,data.nq)+(cur?", keys "+
    span(cur.tile,data.block_n,data.nk):"")+"; tiles visited "+tile.visited+
    ", needed "+tile.needed;
  root.classList.remove("tbw-slow","tbw-wrong");var v="right";
  if(tile.error>1e-9){v="wrong";root.classList.add("tbw-wrong");
    verdict.textContent="Wrong: the output of this tile is off by up to "+
      tile.error.toPrecision(2)+" from the exact attention."}
  else if(tile.visited>tile.needed){v="slow";root.classList.add("tbw-slow");
    verdict.textContent="Slow: "+(tile.visited-tile.needed)+" of "+tile.visited+
      " key tiles visited hold no visible key."}
  else{verdict.textContent=kind==="right"?"Right: the output matches the exact attention.":
    "Right for this query tile: its rows never need what this setting breaks."}
  note.textContent=data.notes[st.setting];
  root.dataset.value=[st.mask,st.setting,st.tile,st.step].join("|");root.dataset.verdict=v;
}
update();
"""


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

    def _repr_html_(self) -> str:
        html = super()._repr_html_()
        return html.replace("</style>", _CSS + "</style>", 1)

    script = _JS
