"""The online softmax stepper of lesson 06: the running maximum and sum, block by block.

:class:`OnlineSoftmaxStepper` walks a short row of scores in blocks, as the
online softmax does (Milakov and Gimelshein, 2018).  After each block it shows
the running maximum ``m``, the running sum ``s`` of ``exp(x - m)``, and the
factor ``exp(m_old - m_new)`` that rescales what was summed against the old
maximum whenever a block raises it.  After the last block the probabilities
``exp(x_i - m) / s`` stand beside the true softmax.  The setting "skip the
rescale" leaves the factor out: wherever the maximum grows after the first
block the result is wrong, and the widget says by how much.

Every number it shows is computed here in Python, in float64, for every
setting of the knobs (:meth:`OnlineSoftmaxStepper.steps`), so that a test can
check it; the JavaScript only draws the setting the knobs select.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .widgets import Widget

__all__ = ["ROWS", "OnlineSoftmaxStepper", "online_steps"]

#: The rows the stepper offers, in the order shown: one whose maximum keeps
#: growing (every block rescales), one whose maximum comes first (no block
#: rescales, so leaving the rescale out goes unnoticed), and one whose maximum
#: arrives in the last block.
ROWS: dict[str, tuple[float, ...]] = {
    name: tuple(float(v) for v in values.split())
    for name, values in {
        "rising": "-1.2 0.4 -0.3 0.9 0.2 1.6 1.1 2.3 1.8 2.9 2.2 3.4 3.0 4.1 3.5 4.6",
        "max first": "4.0 1.2 -0.5 2.1 0.3 1.8 -1.1 2.6 0.7 3.1 -0.2 1.5 2.4 0.1 3.3 1.0",
        "spike last": "0.3 -0.8 0.5 0.1 -0.4 0.9 0.2 -0.6 0.4 0.0 -0.3 0.7 -0.1 0.6 6.0 0.2",
    }.items()
}

#: Below this largest error in a probability, a result counts as right.
RIGHT = 1e-12


def online_steps(row: Sequence[float], block: int, rescale: bool = True) -> dict[str, Any]:
    """The online softmax of ``row`` in blocks of ``block``, every step recorded.

    Returns ``{"steps": [...], "p": [...], "true": [...], "sum_p": ...,
    "max_err": ..., "rescales": ...}``.  Step ``k`` (from 0, before any block)
    holds the block just read (``lo``, ``hi``: its first and one-past-last
    index), its maximum ``block_max``, the maximum before and after
    (``m_old``, ``m``), the rescale factor ``exp(m_old - m)`` (``None`` at the
    first block, where nothing was summed yet), the block's own
    ``sum(exp(x - m))`` (``added``) and the running sum ``s``.  With
    ``rescale=False`` the old sum is carried over unscaled.  Infinite maxima
    are ``None`` (JSON has no infinity).
    """
    xs = [float(v) for v in row]
    if not xs:
        raise ValueError("online_steps(): the row is empty")
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ValueError(f"online_steps(): block must be a positive int, got {block!r}")
    m, s = -math.inf, 0.0
    before = dict.fromkeys(("block_max", "m_old", "m", "factor"))  # nothing read yet
    steps: list[dict[str, Any]] = [{"k": 0, "lo": 0, "hi": 0, **before, "added": 0.0, "s": 0.0}]
    rescales = 0
    for k, lo in enumerate(range(0, len(xs), block), start=1):
        chunk = xs[lo : lo + block]
        m_old, m = m, max(m, max(chunk))
        factor = None if m_old == -math.inf else math.exp(m_old - m)
        if factor is not None and factor != 1.0:
            rescales += 1
        added = sum(math.exp(v - m) for v in chunk)
        kept = s if (factor is None or not rescale) else s * factor
        s = kept + added
        steps.append(
            {
                "k": k,
                "lo": lo,
                "hi": lo + len(chunk),
                "block_max": max(chunk),
                "m_old": None if m_old == -math.inf else m_old,
                "m": m,
                "factor": factor,
                "added": added,
                "s": s,
            }
        )
    p = [math.exp(v - m) / s for v in xs]
    top = max(xs)
    z = sum(math.exp(v - top) for v in xs)
    true = [math.exp(v - top) / z for v in xs]
    return {
        "steps": steps,
        "p": p,
        "true": true,
        "sum_p": sum(p),
        "max_err": max(abs(a - b) for a, b in zip(p, true, strict=True)),
        "rescales": rescales,
    }


def _note(name: str, block: int, rescale: bool, out: dict[str, Any]) -> tuple[str, str]:
    """The verdict ("ok" or "wrong") and the note of one setting."""
    nb = len(out["steps"]) - 1
    grew = out["rescales"]
    if rescale:
        if grew:
            return "ok", (
                f"The maximum grew in {grew} of the {nb - 1} blocks after the first; each "
                "time the sum so far was multiplied by exp(m_old - m_new), so every term "
                "ends up measured against the final maximum."
            )
        return "ok", (
            "The first block holds the maximum: every later factor is exp(0) = 1, "
            "and the rescale changes nothing."
        )
    if out["max_err"] > RIGHT:
        return "wrong", (
            f"The maximum grew in {grew} of the {nb - 1} blocks after the first, and each "
            "time the terms summed before were left measured against a smaller maximum: "
            f"too large by exp(m_new - m_old).  The sum is too large, so the "
            f"probabilities sum to {out['sum_p']:.3f} instead of 1."
        )
    return "ok", (
        "Right by luck: the first block holds the maximum, so no factor was ever "
        "needed.  A test on rows like this one cannot catch the missing rescale."
    )


class OnlineSoftmaxStepper(Widget):
    """Step through the online softmax of a short row, block by block.

    Parameters
    ----------
    rows
        ``{name: values}``: the rows offered, in order (default :data:`ROWS`).
    blocks
        Block lengths offered, in order.
    initial
        Starting value of each knob: ``row``, ``block``, ``rescale`` (``"on"``
        or ``"skip"``) and ``step`` (0 is before the first block).
    title
        The widget's heading.
    """

    kind = "online-softmax"

    def __init__(
        self,
        rows: Mapping[str, Sequence[float]] | None = None,
        *,
        blocks: Sequence[int] = (2, 4, 8),
        initial: Mapping[str, Any] | None = None,
        title: str = "Online softmax, block by block",
    ) -> None:
        rows = dict(ROWS if rows is None else rows)
        if not rows:
            raise ValueError("OnlineSoftmaxStepper needs at least one row")
        for name, values in rows.items():
            if not isinstance(name, str) or not values:
                raise ValueError(f"row {name!r} must be a named, non-empty sequence of numbers")
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                raise ValueError(f"row {name!r} must hold finite numbers")
        blocks = list(blocks)
        if not blocks or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in blocks
        ):
            raise ValueError(f"blocks must be positive ints, got {blocks}")
        self.rows = {k: [float(v) for v in vals] for k, vals in rows.items()}
        self.blocks = blocks
        self.title = title
        self.initial = {
            "row": next(iter(self.rows)),
            "block": blocks[len(blocks) // 2],
            "rescale": "on",
            "step": 0,
            **dict(initial or {}),
        }
        if self.initial["row"] not in self.rows:
            raise ValueError(f"initial row {self.initial['row']!r} is not one of {list(self.rows)}")
        if self.initial["block"] not in blocks:
            raise ValueError(f"initial block {self.initial['block']!r} is not one of {blocks}")
        if self.initial["rescale"] not in ("on", "skip"):
            raise ValueError("initial rescale must be 'on' or 'skip'")
        step = self.initial["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"initial step must be an int >= 0, got {step!r}")

    def steps(self, row: str, block: int, rescale: str) -> dict[str, Any]:
        """One setting: :func:`online_steps` plus its ``verdict`` and ``note``."""
        if rescale not in ("on", "skip"):
            raise ValueError(f"rescale must be 'on' or 'skip', got {rescale!r}")
        out = online_steps(self.rows[row], block, rescale == "on")
        out["verdict"], out["note"] = _note(row, block, rescale == "on", out)
        out["knobs"] = {"row": row, "block": block, "rescale": rescale}
        return out

    def settings(self) -> list[dict[str, Any]]:
        """Every setting of the knobs, as :meth:`steps` computes it."""
        return [self.steps(r, b, s) for r in self.rows for b in self.blocks for s in ("on", "skip")]

    def data(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "blocks": self.blocks,
            "initial": self.initial,
            "settings": self.settings(),
            "css": _CSS,
        }


_CSS = """
.tbw-online svg{display:block;max-width:100%;height:auto;margin:6px 0}
.tbw-online .tbw-steps{overflow-x:auto;max-width:100%}
.tbw-online .tbw-steps td.tbw-now{font-weight:700}
.tbw-online .tbw-legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;
color:var(--tbw-muted)}
.tbw-online .tbw-sw{display:inline-block;width:12px;height:12px;margin-right:4px;
vertical-align:-2px;border:1px solid var(--tbw-border)}
.tbw-online button{font:inherit;padding:2px 10px;border-radius:4px;cursor:pointer;
border:1px solid var(--tbw-border);background:var(--tbw-bg);color:var(--tbw-fg)}
.tbw-online button:disabled{opacity:.45;cursor:default}
"""

OnlineSoftmaxStepper.script = r"""
var st=document.createElement("style");st.textContent=data.css;root.appendChild(st);
root.classList.add("tbw-online");
var NS="http://www.w3.org/2000/svg";
function sv(tag,attrs){var e=document.createElementNS(NS,tag);
  for(var k in attrs)e.setAttribute(k,attrs[k]);return e}
function num(v,d){if(v===null||v===undefined)return "\u2013";return Number(v).toFixed(d===undefined?4:d)}
var state={row:data.initial.row,block:data.initial.block,rescale:data.initial.rescale,
  step:data.initial.step};
var n=0;
function choice(name,label,values,ki){
  var row=el("div","tbw-knob");var lab=el("span","tbw-label",label);lab.id=root.id+"-k"+ki;
  row.appendChild(lab);var g=el("div","tbw-choices");g.setAttribute("role","radiogroup");
  g.setAttribute("aria-labelledby",lab.id);g.dataset.knob=name;
  values.forEach(function(v,vi){var l=el("label","tbw-choice");var r=el("input");r.type="radio";
    r.name=root.id+"-"+ki;r.value=String(vi);r.checked=String(v)===String(state[name]);
    r.addEventListener("change",function(){if(r.checked){state[name]=v;update()}});
    l.appendChild(r);l.appendChild(document.createTextNode(" "+String(v)));g.appendChild(l)});
  row.appendChild(g);body.appendChild(row);
}
choice("row","row",Object.keys(data.rows),0);
choice("block","block length",data.blocks,1);
choice("rescale","rescale",["on","skip"],2);
var srow=el("div","tbw-knob");var slab=el("span","tbw-label","blocks read");
slab.id=root.id+"-k3";srow.appendChild(slab);
var prev=el("button","","\u25c0 previous");prev.type="button";
var inp=el("input");inp.type="range";inp.min=0;inp.step=1;inp.setAttribute("aria-labelledby",slab.id);
inp.dataset.knob="step";
var next=el("button","","next \u25b6");next.type="button";var out=el("output");
[prev,inp,next,out].forEach(function(e){srow.appendChild(e)});body.appendChild(srow);
prev.setAttribute("aria-label","previous block");next.setAttribute("aria-label","next block");
inp.addEventListener("input",function(){state.step=+inp.value;update()});
prev.addEventListener("click",function(){if(state.step>0){state.step--;update()}});
next.addEventListener("click",function(){if(state.step<n){state.step++;update()}});
var readout=el("div","tbw-readout");readout.setAttribute("aria-live","polite");
var sub=el("div","tbw-sub");var pic=el("div");var legend=el("div","tbw-legend");
var verdict=el("div","tbw-verdict");var note=el("div","tbw-note");var tab=el("div","tbw-steps");
[readout,sub,pic,legend,verdict,note,tab].forEach(function(e){body.appendChild(e)});
[["var(--tbw-accent)","read so far"],["var(--tbw-border)","not read yet"],
 ["var(--tbw-bad)","computed probability"],["var(--tbw-fg)","true probability"]].forEach(
  function(p){var s=el("span");var sw=el("span","tbw-sw");sw.style.background=p[0];
  s.appendChild(sw);s.appendChild(document.createTextNode(p[1]));legend.appendChild(s)});
body.appendChild(el("div","tbw-caption","Computed in float64 by "+
  "tilebook.widgets_softmax.online_steps; the same recurrence as the lesson's kernel."));
function find(){return data.settings.find(function(r){return r.knobs.row===state.row&&
  String(r.knobs.block)===String(state.block)&&r.knobs.rescale===state.rescale})}
function draw(r,xs,k){
  var W=520,H=170,top=10,mid=100,bot=H-8,bw=W/xs.length;
  var lo=Math.min(0,Math.min.apply(null,xs)),hi=Math.max.apply(null,xs);
  function y(v){return top+(hi-v)/(hi-lo)*(mid-top)}
  var svg=sv("svg",{viewBox:"0 0 "+W+" "+H,width:W,height:H,role:"img"});
  var s=r.steps[k],done=s.hi;
  svg.setAttribute("aria-label","scores of the row; "+done+" of "+xs.length+" read"+
    (k?"; running maximum "+num(s.m,2):""));
  svg.appendChild(sv("line",{x1:0,x2:W,y1:y(0),y2:y(0),stroke:"var(--tbw-muted)","stroke-width":1}));
  xs.forEach(function(v,i){var a=Math.min(y(v),y(0)),h=Math.max(1,Math.abs(y(v)-y(0)));
    var b=sv("rect",{x:i*bw+2,y:a,width:bw-4,height:h,rx:2});
    b.style.fill=i<done?"var(--tbw-accent)":"var(--tbw-border)";
    if(i>=s.lo&&i<s.hi&&k>0){b.style.stroke="var(--tbw-fg)";b.style.strokeWidth="2"}
    var t=sv("title",{});t.textContent="x["+i+"] = "+v;b.appendChild(t);svg.appendChild(b)});
  if(k>0){var ym=y(s.m);svg.appendChild(sv("line",{x1:0,x2:done*bw,y1:ym,y2:ym,
    stroke:"var(--tbw-wrong)","stroke-dasharray":"5 3","stroke-width":1.5}));
    var lab=sv("text",{x:4,y:Math.max(ym-3,9),"font-size":11,fill:"var(--tbw-fg)"});
    lab.textContent="running max m = "+num(s.m,2);svg.appendChild(lab)}
  if(k===n){var pmax=Math.max(Math.max.apply(null,r.p),Math.max.apply(null,r.true));
    function py(v){return bot-v/pmax*(bot-mid-14)}
    xs.forEach(function(v,i){
      var c=sv("rect",{x:i*bw+2,y:py(r.p[i]),width:bw/2-2,height:bot-py(r.p[i])});
      c.style.fill="var(--tbw-bad)";var t=sv("title",{});
      t.textContent="computed p["+i+"] = "+num(r.p[i]);c.appendChild(t);svg.appendChild(c);
      var e=sv("rect",{x:i*bw+bw/2,y:py(r.true[i]),width:bw/2-2,height:bot-py(r.true[i])});
      e.style.fill="var(--tbw-fg)";var u=sv("title",{});
      u.textContent="true p["+i+"] = "+num(r.true[i]);e.appendChild(u);svg.appendChild(e)})}
  pic.innerHTML="";pic.appendChild(svg);
}
function table(r,k){
  var t=el("table");var hr=el("tr");
  ["block","block max","m before","m after","factor exp(m before - m after)",
   "sum of block","s"].forEach(function(h){hr.appendChild(el("th","",h))});t.appendChild(hr);
  r.steps.slice(1,k+1).forEach(function(s){var tr=el("tr");
    var f=s.factor===null?"\u2013":(state.rescale==="skip"?num(s.factor)+" (skipped)":num(s.factor));
    [String(s.k),num(s.block_max,2),num(s.m_old,2),num(s.m,2),f,num(s.added),num(s.s)].forEach(
      function(c){var td=el("td","",c);if(s.k===k)td.className="tbw-now";tr.appendChild(td)});
    t.appendChild(tr)});
  tab.innerHTML="";if(k>0)tab.appendChild(t);
}
function update(){
  var r=find(),xs=data.rows[state.row];n=r.steps.length-1;
  if(state.step>n)state.step=n;inp.max=n;inp.value=state.step;
  out.textContent=state.step+" of "+n;prev.disabled=state.step===0;next.disabled=state.step===n;
  var k=state.step,s=r.steps[k];root.classList.remove("tbw-wrong","tbw-slow");
  if(k===0){readout.textContent="Before the first block: m = -inf, s = 0";
    sub.textContent="Press next to read block 1 of "+n+"."}
  else{readout.textContent="After block "+k+" of "+n+": m = "+num(s.m,2)+", s = "+num(s.s);
    sub.textContent=s.factor===null?"First block: s = sum of exp(x - m) over it.":
      (s.factor===1?"The maximum did not grow: factor exp(0) = 1.":
      "The maximum grew from "+num(s.m_old,2)+" to "+num(s.m,2)+": the old sum is "+
      (state.rescale==="skip"?"NOT multiplied by ":"multiplied by ")+num(s.factor)+".")}
  draw(r,xs,k);table(r,k);
  if(k===n){verdict.textContent=(r.verdict==="wrong"?"Wrong: ":"Right: ")+
      "the probabilities exp(x - m) / s sum to "+num(r.sum_p,6)+"; largest error "+
      Number(r.max_err).toExponential(1)+".";
    if(r.verdict==="wrong")root.classList.add("tbw-wrong");note.textContent=r.note}
  else{verdict.textContent="";note.textContent=""}
  root.dataset.value=[state.row,state.block,state.rescale,k,num(s.s,6)].join("|");
  root.dataset.verdict=k===n?r.verdict:"";
}
update();
"""
