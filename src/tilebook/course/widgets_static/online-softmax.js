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
  "tilebook.course.widgets_softmax.online_steps; the same recurrence as the lesson's kernel."));
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
