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
