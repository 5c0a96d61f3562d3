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

__all__ = ["SweepExplorer", "Widget", "embed_json"]

_CSS = """
.tbw{--tbw-fg:var(--pst-color-text-base,#222);--tbw-muted:var(--pst-color-text-muted,#666);
--tbw-bg:var(--pst-color-surface,#f6f7f9);--tbw-border:var(--pst-color-border,#d0d4da);
--tbw-accent:#0072B2;--tbw-bad:#D55E00;border:1px solid var(--tbw-border);border-radius:8px;
padding:12px 14px;margin:12px 0;background:var(--tbw-bg);color:var(--tbw-fg);
font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;font-size:14px;max-width:760px}
.tbw h4{margin:0 0 8px 0;font-size:15px}
.tbw .tbw-knob{display:flex;align-items:center;gap:10px;margin:4px 0}
.tbw .tbw-knob label{min-width:110px;font-family:monospace}
.tbw .tbw-knob output{font-family:monospace;min-width:60px;font-weight:600}
.tbw .tbw-readout{font-size:22px;font-weight:700;margin:8px 0 2px 0}
.tbw .tbw-sub{color:var(--tbw-muted);font-size:13px}
.tbw .tbw-bar{height:12px;border-radius:6px;background:var(--tbw-border);overflow:hidden;margin:6px 0}
.tbw .tbw-bar>div{height:100%;background:var(--tbw-accent);transition:width .2s}
.tbw.tbw-slow .tbw-bar>div{background:var(--tbw-bad)}
.tbw .tbw-verdict{font-weight:600;margin:4px 0}
.tbw.tbw-slow .tbw-verdict{color:var(--tbw-bad)}
.tbw table{border-collapse:collapse;margin-top:8px;font-family:monospace;font-size:12px}
.tbw td,.tbw th{border:1px solid var(--tbw-border);padding:2px 6px;text-align:right}
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


class Widget:
    """Base class: subclasses provide ``title``, :meth:`data` and :attr:`script`."""

    kind = "widget"
    title = ""
    script = ""  # JavaScript body; receives `root` (the div) and `data` (parsed JSON)

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
            f"{self.script}"
            "})();</script></div>"
        )

    def __repr__(self) -> str:
        return f"<tilebook {type(self).__name__}: {self.title} (open in a browser or notebook)>"


_SWEEP_JS = r"""
var body=root.querySelector(".tbw-body");body.innerHTML="";
var knobs=data.knobs, state={}, inputs={};
function fmt(v){return (v>=100?v.toFixed(0):v.toPrecision(3))}
knobs.forEach(function(k){
  var row=document.createElement("div");row.className="tbw-knob";
  var lab=document.createElement("label");lab.textContent=k.label;
  var inp=document.createElement("input");inp.type="range";inp.min=0;inp.max=k.values.length-1;
  inp.step=1;inp.setAttribute("aria-label",k.label);inp.dataset.knob=k.name;
  var idx=Math.max(0,k.values.indexOf(k.initial));inp.value=idx;state[k.name]=k.values[idx];
  var out=document.createElement("output");out.textContent=k.values[idx];
  inp.addEventListener("input",function(){state[k.name]=k.values[+inp.value];
    out.textContent=state[k.name];update();});
  row.appendChild(lab);row.appendChild(inp);row.appendChild(out);body.appendChild(row);
  inputs[k.name]=inp;
});
var readout=document.createElement("div");readout.className="tbw-readout";
var sub=document.createElement("div");sub.className="tbw-sub";
var bar=document.createElement("div");bar.className="tbw-bar";var fill=document.createElement("div");
bar.appendChild(fill);var verdict=document.createElement("div");verdict.className="tbw-verdict";
[readout,sub,bar,verdict].forEach(function(e){body.appendChild(e)});
var best=0,worst=Infinity;data.rows.forEach(function(r){if(r.value>best)best=r.value;
  if(r.value<worst)worst=r.value});
var scale=Math.max(best,data.ceiling||0);
var table=null;
if(knobs.length===2){
  table=document.createElement("table");var a=knobs[0],b=knobs[1];
  var hr=document.createElement("tr");var c0=document.createElement("th");
  c0.textContent=a.label+" \\ "+b.label;hr.appendChild(c0);
  b.values.forEach(function(v){var th=document.createElement("th");th.textContent=v;hr.appendChild(th)});
  table.appendChild(hr);
  a.values.forEach(function(va){var tr=document.createElement("tr");var th=document.createElement("th");
    th.textContent=va;tr.appendChild(th);
    b.values.forEach(function(vb){var td=document.createElement("td");var r=find(va,vb,a.name,b.name);
      td.dataset.a=va;td.dataset.b=vb;
      if(r){td.textContent=fmt(r.value);var t=(r.value-worst)/Math.max(best-worst,1e-9);
        td.style.background=r.value<data.slow_fraction*best?"rgba(213,94,0,0.55)":
          "rgba(0,114,178,"+(0.08+0.6*t).toFixed(2)+")";
        td.title=a.label+"="+va+", "+b.label+"="+vb+": "+fmt(r.value)+" "+data.unit;
        td.style.cursor="pointer";td.addEventListener("click",function(){
          inputs[a.name].value=a.values.indexOf(va);inputs[b.name].value=b.values.indexOf(vb);
          inputs[a.name].dispatchEvent(new Event("input"));inputs[b.name].dispatchEvent(new Event("input"));});
      }else{td.textContent="n/a"}
      tr.appendChild(td)});table.appendChild(tr)});
  body.appendChild(table);
}
function find(){var args=arguments;
  return data.rows.find(function(r){
    if(args.length===4)return r.knobs[args[2]]===args[0]&&r.knobs[args[3]]===args[1];
    return knobs.every(function(k){return r.knobs[k.name]===state[k.name]});})}
function update(){
  var r=find();
  if(!r){readout.textContent="not measured";sub.textContent="";fill.style.width="0%";
    verdict.textContent="";root.classList.remove("tbw-slow");return;}
  readout.textContent=fmt(r.value)+" "+data.unit;
  var parts=[(100*r.value/best).toFixed(0)+"% of the best setting"];
  if(data.ceiling){parts.push((100*r.value/data.ceiling).toFixed(0)+"% of "+data.ceiling_label)}
  if(r.extra){parts.push(r.extra)}
  sub.textContent=parts.join(" · ");
  fill.style.width=(100*r.value/scale).toFixed(1)+"%";
  var slow=r.value<data.slow_fraction*best;
  root.classList.toggle("tbw-slow",slow);
  verdict.textContent=slow?("Slow: "+(data.slow_hint||"this setting leaves bandwidth unused.")):
    "Near the best measured setting.";
  if(table){table.querySelectorAll("td").forEach(function(td){
    td.classList.toggle("tbw-cur",String(state[knobs[0].name])===td.dataset.a&&
      String(state[knobs[1].name])===td.dataset.b)})}
  root.dataset.value=r.value;
}
var cap=document.createElement("div");cap.className="tbw-caption";cap.textContent=data.caption;
body.appendChild(cap);
update();
"""


class SweepExplorer(Widget):
    """Sliders over the parameters of a measured sweep; shows the metric of the chosen point.

    Parameters
    ----------
    rows
        One dict per measured point, holding every knob and the metric.
    knobs
        The row keys to expose as sliders, in order (two knobs also draw a grid).
    metric, unit
        Row key of the measured value and its unit, e.g. ``"gbps"``, ``"GB/s"``.
    caption
        Where the numbers come from (use ``Record.caption()``).
    ceiling
        An upper reference, e.g. the copy bandwidth measured in the same run.
    slow_fraction
        Points below this fraction of the best are flagged as slow.
    """

    kind = "sweep"

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
        initial: dict[str, Any] | None = None,
        ceiling: float | None = None,
        ceiling_label: str = "the copy bandwidth",
        slow_fraction: float = 0.6,
        slow_hint: str | None = None,
        extra: str | None = None,
    ) -> None:
        if not rows:
            raise ValueError("SweepExplorer needs at least one measured row")
        if not knobs:
            raise ValueError("SweepExplorer needs at least one knob")
        for r in rows:
            missing = [k for k in (*knobs, metric) if k not in r]
            if missing:
                raise ValueError(f"row {r} lacks {missing}")
        self.rows = list(rows)
        self.knobs = list(knobs)
        self.metric = metric
        self.unit = unit
        self.caption = caption
        self.title = title
        self.labels = dict(labels or {})
        self.initial = dict(initial or {})
        self.ceiling = ceiling
        self.ceiling_label = ceiling_label
        self.slow_fraction = slow_fraction
        self.slow_hint = slow_hint
        self.extra = extra

    script = _SWEEP_JS

    def data(self) -> dict[str, Any]:
        knobs = []
        for k in self.knobs:
            values = sorted({r[k] for r in self.rows})
            knobs.append(
                {
                    "name": k,
                    "label": self.labels.get(k, k),
                    "values": values,
                    "initial": self.initial.get(k, values[0]),
                }
            )
        rows = [
            {
                "knobs": {k: r[k] for k in self.knobs},
                "value": float(r[self.metric]),
                **({"extra": str(r[self.extra])} if self.extra and r.get(self.extra) else {}),
            }
            for r in self.rows
        ]
        return {
            "knobs": knobs,
            "rows": rows,
            "unit": self.unit,
            "caption": self.caption,
            "ceiling": self.ceiling,
            "ceiling_label": self.ceiling_label,
            "slow_fraction": self.slow_fraction,
            "slow_hint": self.slow_hint,
        }
