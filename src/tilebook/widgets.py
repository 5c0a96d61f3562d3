"""Interactive widgets as self-contained HTML: no server, no external URL.

A widget is a Python object whose ``_repr_html_`` returns one ``<div>`` holding
its data (JSON, escaped so that it cannot close the ``<script>`` tag around it),
a little CSS and a little JavaScript.  sphinx-gallery puts that HTML into the
lesson page, and Jupyter shows it in a notebook, with the same code.  The data
are measurements (live or from a committed record), never made-up numbers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from . import display

__all__ = ["SweepExplorer", "Widget", "embed_json"]

_CSS = """
.tbw{--tbw-fg:var(--pst-color-text-base,#222);--tbw-muted:var(--pst-color-text-muted,#555);
--tbw-bg:var(--pst-color-surface,#f6f7f9);--tbw-border:var(--pst-color-border,#c4c9d0);
--tbw-accent:#0072B2;--tbw-bad:#C04A00;--tbw-wrong:#B3261E;box-sizing:border-box;
border:1px solid var(--tbw-border);border-radius:8px;padding:12px 14px;margin:12px 0;
background:var(--tbw-bg);color:var(--tbw-fg);width:100%;max-width:100%;overflow:hidden;
font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;font-size:14px}
html[data-theme=dark] .tbw{--tbw-accent:#56B4E9;--tbw-bad:#F0A35E;--tbw-wrong:#FF8A80}
.tbw *{box-sizing:border-box}
.tbw h4{margin:0 0 8px 0;font-size:15px}
.tbw .tbw-knob{display:flex;flex-wrap:wrap;align-items:center;gap:6px 10px;margin:6px 0}
.tbw .tbw-label{min-width:8em;font-family:monospace;font-weight:600}
.tbw .tbw-knob input[type=range]{flex:1 1 12em;min-width:8em;max-width:22em}
.tbw .tbw-knob output{font-family:monospace;min-width:4em;font-weight:600}
.tbw .tbw-choices{display:flex;flex-wrap:wrap;gap:4px 12px}
.tbw .tbw-choice{font-family:monospace;white-space:nowrap;cursor:pointer}
.tbw .tbw-readout{font-size:22px;font-weight:700;margin:8px 0 2px 0}
.tbw .tbw-sub,.tbw .tbw-note{color:var(--tbw-muted);font-size:13px}
.tbw .tbw-bar{height:12px;border-radius:6px;background:var(--tbw-border);overflow:hidden;margin:6px 0}
.tbw .tbw-bar>div{height:100%;background:var(--tbw-accent);transition:width .2s}
.tbw.tbw-slow .tbw-bar>div{background:var(--tbw-bad)}
.tbw.tbw-wrong .tbw-bar>div{background:var(--tbw-wrong)}
.tbw .tbw-verdict{font-weight:600;margin:4px 0}
.tbw.tbw-slow .tbw-verdict{color:var(--tbw-bad)}
.tbw.tbw-wrong .tbw-verdict{color:var(--tbw-wrong)}
.tbw .tbw-grid-wrap{max-width:100%;margin-top:8px}
.tbw table{border-collapse:collapse;font-family:monospace;font-size:12px;max-width:100%}
.tbw td,.tbw th{border:1px solid var(--tbw-border);padding:2px 5px;text-align:right;
white-space:nowrap}
.tbw th{font-weight:600;white-space:normal;overflow-wrap:anywhere;background:transparent}
.tbw td[role=button]{cursor:pointer}
.tbw td.tbw-cell-slow{background:rgba(213,94,0,0.45)}
.tbw td.tbw-cell-wrong{background:#B3261E;color:#fff}
.tbw td.tbw-cur{outline:3px solid var(--tbw-fg);outline-offset:-3px;font-weight:700}
.tbw .tbw-caption{color:var(--tbw-muted);font-size:12px;margin-top:8px}
"""


def embed_json(data: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` survive unescaped."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _escape_html(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


#: What every widget's script may use, defined once: the script runs after these
#: lines, inside a function of its own (so two widgets on a page never share a name).
#: ``body`` is the widget's emptied body; ``el`` makes an element; ``knobRows`` adds
#: one row per knob (a slider, or radio choices) that keeps ``state[name]`` and calls
#: ``onchange()``, and returns a setter per knob that moves it as a reader would.
_HELPERS_JS = r"""
var body=root.querySelector(".tbw-body");body.innerHTML="";
function el(tag,cls,text){var e=document.createElement(tag);if(cls)e.className=cls;
  if(text!==undefined)e.textContent=text;return e}
function knobRows(parent,knobs,state,onchange){var setters={};
knobs.forEach(function(k,ki){
  var row=el("div","tbw-knob");var lab=el("span","tbw-label",k.label);lab.id=root.id+"-k"+ki;
  row.appendChild(lab);var idx=Math.max(0,k.values.indexOf(k.initial));state[k.name]=k.values[idx];
  if(k.kind==="slider"){
    var inp=el("input");inp.type="range";inp.min=0;inp.max=k.values.length-1;inp.step=1;
    inp.value=idx;inp.setAttribute("aria-labelledby",lab.id);inp.dataset.knob=k.name;
    var out=el("output","",String(k.values[idx]));
    inp.addEventListener("input",function(){state[k.name]=k.values[+inp.value];
      out.textContent=String(state[k.name]);onchange()});
    row.appendChild(inp);row.appendChild(out);
    setters[k.name]=function(v){inp.value=k.values.indexOf(v);inp.dispatchEvent(new Event("input"))};
  }else{
    var group=el("div","tbw-choices");group.setAttribute("role","radiogroup");
    group.setAttribute("aria-labelledby",lab.id);group.dataset.knob=k.name;var radios=[];
    k.values.forEach(function(v,vi){var l=el("label","tbw-choice");var r=el("input");
      r.type="radio";r.name=root.id+"-"+ki;r.value=String(vi);r.checked=vi===idx;
      r.addEventListener("change",function(){if(r.checked){state[k.name]=v;onchange()}});
      l.appendChild(r);l.appendChild(document.createTextNode(" "+String(v)));
      group.appendChild(l);radios.push(r)});
    row.appendChild(group);
    setters[k.name]=function(v){var i=k.values.indexOf(v);radios[i].checked=true;
      radios[i].dispatchEvent(new Event("change"))};
  }
  parent.appendChild(row)});
return setters}
"""


class Widget:
    """Base class: subclasses provide ``title``, :meth:`data` and :attr:`script`."""

    kind = "widget"
    title = ""
    script = ""  # JavaScript body; has `root` (the div), `data` (parsed JSON), _HELPERS_JS

    def __new__(cls, *args: Any, **kwargs: Any):
        obj = super().__new__(cls)
        display.register(obj)  # a lesson run as a script shows it on its page at exit
        return obj

    def data(self) -> dict[str, Any]:
        raise NotImplementedError

    def _repr_html_(self) -> str:
        uid = f"tbw-{uuid.uuid4().hex[:10]}"
        payload = embed_json(self.data())
        return (
            f'<div class="tbw tbw-{self.kind}" id="{uid}" data-tilebook-widget="{self.kind}">'
            f"<style>{_CSS}</style>"
            f"<h4>{_escape_html(self.title)}</h4>"
            f'<div class="tbw-body"><noscript>This widget needs JavaScript.</noscript></div>'
            f'<script type="application/json" class="tbw-data">{payload}</script>'
            "<script>(function(){"
            f'var root=document.getElementById("{uid}");'
            'var data=JSON.parse(root.querySelector("script.tbw-data").textContent);'
            f"{_HELPERS_JS}{self.script}"
            "})();</script></div>"
        )

    def __repr__(self) -> str:
        return f"<tilebook {type(self).__name__}: {self.title} (open in a browser or notebook)>"


_SWEEP_JS = r"""
var knobs=data.knobs,state={},higher=data.better!=="lower";
function fmt(v){var a=Math.abs(v);if(a>=1000)return Math.round(v).toString();
  if(a>=100)return v.toFixed(0);if(a>=10)return v.toFixed(1);return v.toPrecision(3)}
var setters=knobRows(body,knobs,state,function(){update()});
var readout=el("div","tbw-readout");readout.setAttribute("aria-live","polite");
var sub=el("div","tbw-sub");var bar=el("div","tbw-bar");var fill=el("div");bar.appendChild(fill);
var verdict=el("div","tbw-verdict");var note=el("div","tbw-note");
[readout,sub,bar,verdict,note].forEach(function(e){body.appendChild(e)});
var ok=data.rows.filter(function(r){return !r.wrong});
var best=higher?-Infinity:Infinity;ok.forEach(function(r){
  best=higher?Math.max(best,r.value):Math.min(best,r.value)});
function rel(v){return higher?v/best:best/v}
var scale=Math.max(higher?best:0,data.ceiling||0);
function same(a,b){return String(a)===String(b)}
function find(over){return data.rows.find(function(r){return knobs.every(function(k){
  return same(r.knobs[k.name],(over&&k.name in over)?over[k.name]:state[k.name])})})}
var table=null;
if(knobs.length===2){
  var a=knobs[0],b=knobs[1];table=el("table","tbw-grid");
  var hr=el("tr");hr.appendChild(el("th","",a.label+" \u2193 / "+b.label+" \u2192"));
  b.values.forEach(function(v){hr.appendChild(el("th","",String(v)))});table.appendChild(hr);
  a.values.forEach(function(va){var tr=el("tr");tr.appendChild(el("th","",String(va)));
    b.values.forEach(function(vb){var o={};o[a.name]=va;o[b.name]=vb;var r=find(o);var td=el("td");
      td.dataset.a=String(va);td.dataset.b=String(vb);
      if(r){var f=rel(r.value);
        td.textContent=r.wrong?"\u2717 "+fmt(r.value):fmt(r.value);
        td.className=r.wrong?"tbw-cell-wrong":(f<data.slow_fraction?"tbw-cell-slow":"");
        if(!r.wrong&&f>=data.slow_fraction)td.style.background=
          "rgba(0,114,178,"+(0.08+0.5*Math.max(0,Math.min(1,f))).toFixed(2)+")";
        td.title=a.label+"="+va+", "+b.label+"="+vb+": "+fmt(r.value)+" "+data.unit+
          (r.wrong?" (wrong)":"");
        td.tabIndex=0;td.setAttribute("role","button");
        var pick=function(){setters[a.name](va);setters[b.name](vb)};
        td.addEventListener("click",pick);
        td.addEventListener("keydown",function(e){if(e.key==="Enter"||e.key===" "){e.preventDefault();pick()}});
      }else{td.textContent="\u2013";td.title="not measured"}
      tr.appendChild(td)});table.appendChild(tr)});
  var wrap=el("div","tbw-grid-wrap");wrap.appendChild(table);body.appendChild(wrap);
}
function update(){
  var r=find();root.classList.remove("tbw-slow","tbw-wrong");
  if(!r){readout.textContent="not measured";sub.textContent="";fill.style.width="0%";
    verdict.textContent="";note.textContent="";root.dataset.value="";return}
  readout.textContent=fmt(r.value)+" "+data.unit;
  var f=rel(r.value),parts=[];
  if(!r.wrong)parts.push(Math.round(100*f)+"% of the best setting");
  if(data.ceiling)parts.push(Math.round(100*r.value/data.ceiling)+"% of "+data.ceiling_label);
  if(r.extra)parts.push(r.extra);
  sub.textContent=parts.join(" \u00b7 ");
  fill.style.width=(100*Math.min(1,(higher?r.value:best)/(higher?scale:r.value))).toFixed(1)+"%";
  if(r.wrong){root.classList.add("tbw-wrong");verdict.textContent="Wrong: "+r.wrong}
  else if(f<data.slow_fraction){root.classList.add("tbw-slow");
    verdict.textContent="Slow: "+Math.round(100*f)+"% of the best setting measured."}
  else if(f>=data.near_fraction){verdict.textContent="Among the best settings measured."}
  else{verdict.textContent=Math.round(100*f)+"% of the best setting measured."}
  note.textContent=r.note||"";
  if(table){table.querySelectorAll("td").forEach(function(td){
    td.classList.toggle("tbw-cur",td.dataset.a===String(state[knobs[0].name])&&
      td.dataset.b===String(state[knobs[1].name]))})}
  root.dataset.value=String(r.value);root.dataset.verdict=r.wrong?"wrong":(f<data.slow_fraction?"slow":"ok");
}
var cap=el("div","tbw-caption",data.caption);body.appendChild(cap);
update();
"""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class SweepExplorer(Widget):
    """Knobs over the settings of a measured sweep; shows the metric of the chosen one.

    Parameters
    ----------
    rows
        One dict per measured setting, holding every knob and the metric.
    knobs
        The row keys the reader turns, in order (two knobs also draw a grid).
        Numeric knobs are sliders in numeric order; other knobs (names,
        booleans) are choice lists in the order of ``order`` or, without it,
        of their first appearance in ``rows``: never alphabetical.
    metric, unit
        Row key of the measured value and its unit, e.g. ``"gbps"``, ``"GB/s"``.
    caption
        Where the numbers come from (use ``Record.caption()``).
    better
        ``"higher"`` (rates, the default) or ``"lower"`` (times, errors).
    order
        ``{knob: [values in the order to show them]}``.
    ceiling, ceiling_label
        An upper reference measured in the same run, e.g. the copy bandwidth.
    slow_fraction
        Settings below this fraction of the best are flagged as slow.
    note
        Row key of an explanation that belongs to that row alone (why *this*
        setting is slow, say); shown only when the row is selected.
    wrong
        Row key holding, for a setting that computes a wrong result, why it is
        wrong (an empty value means the row is right).  Wrong settings are
        flagged and never count as the best.
    extra
        Row key of a neutral detail shown with the row (time, bytes, ...).
    """

    kind = "sweep"
    script = _SWEEP_JS

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        knobs: Sequence[str],
        metric: str,
        unit: str,
        *,
        caption: str,
        title: str = "Sweep explorer",
        labels: dict[str, str] | None = None,
        order: dict[str, Sequence[Any]] | None = None,
        initial: dict[str, Any] | None = None,
        better: str = "higher",
        ceiling: float | None = None,
        ceiling_label: str = "the copy bandwidth",
        slow_fraction: float = 0.6,
        near_fraction: float = 0.95,
        note: str | None = None,
        wrong: str | None = None,
        extra: str | None = None,
    ) -> None:
        if not rows:
            raise ValueError("SweepExplorer needs at least one measured row")
        if not knobs:
            raise ValueError("SweepExplorer needs at least one knob")
        if better not in ("higher", "lower"):
            raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
        for r in rows:
            missing = [k for k in (*knobs, metric) if k not in r]
            if missing:
                raise ValueError(f"row {r} lacks {missing}")
        order = {k: list(v) for k, v in (order or {}).items()}
        for k, wanted in order.items():
            if k not in knobs:
                raise ValueError(f"order names {k!r}, which is not a knob")
            have = {repr(r[k]) for r in rows}
            unknown = [v for v in wanted if repr(v) not in have]
            if unknown:
                raise ValueError(f"order[{k!r}] lists values no row has: {unknown}")
        if sum(1 for r in rows if not (wrong and r.get(wrong))) == 0:
            raise ValueError("SweepExplorer needs at least one row that is not wrong")
        self.rows = list(rows)
        self.knobs = list(knobs)
        self.metric = metric
        self.unit = unit
        self.caption = caption
        self.title = title
        self.labels = dict(labels or {})
        self.order = order
        self.initial = dict(initial or {})
        self.better = better
        self.ceiling = ceiling
        self.ceiling_label = ceiling_label
        self.slow_fraction = slow_fraction
        self.near_fraction = near_fraction
        self.note = note
        self.wrong = wrong
        self.extra = extra

    def _values(self, knob: str) -> tuple[str, list[Any]]:
        seen = list(dict.fromkeys(r[knob] for r in self.rows))
        numeric = all(_is_number(v) for v in seen)
        if knob in self.order:
            wanted = self.order[knob]
            values = list(wanted) + [v for v in seen if v not in wanted]
        else:
            values = sorted(seen) if numeric else seen
        return ("slider" if numeric else "choice"), values

    def data(self) -> dict[str, Any]:
        knobs = []
        for k in self.knobs:
            kind, values = self._values(k)
            initial = self.initial.get(k, values[0])
            if initial not in values:
                raise ValueError(f"initial {k}={initial!r} is not among its values {values}")
            knobs.append(
                {
                    "name": k,
                    "label": self.labels.get(k, k),
                    "kind": kind,
                    "values": values,
                    "initial": initial,
                }
            )

        def text(r, key):
            return str(r[key]) if key and r.get(key) else None

        rows = []
        for r in self.rows:
            row = {"knobs": {k: r[k] for k in self.knobs}, "value": float(r[self.metric])}
            for name, key in (("note", self.note), ("wrong", self.wrong), ("extra", self.extra)):
                if text(r, key):
                    row[name] = text(r, key)
            rows.append(row)
        return {
            "knobs": knobs,
            "rows": rows,
            "unit": self.unit,
            "caption": self.caption,
            "better": self.better,
            "ceiling": self.ceiling,
            "ceiling_label": self.ceiling_label,
            "slow_fraction": self.slow_fraction,
            "near_fraction": self.near_fraction,
        }
