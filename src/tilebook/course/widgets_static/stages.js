var st={build:data.initial.build,line:data.initial.line,stage:data.initial.stage};
function radios(name,label,items,cur,onpick){
  var row=el("div","tbw-knob");var lab=el("span","tbw-label",label);lab.id=root.id+"-"+name;
  row.appendChild(lab);var g=el("div","tbw-choices");g.setAttribute("role","radiogroup");
  g.setAttribute("aria-labelledby",lab.id);var rs=[];
  items.forEach(function(it,i){var l=el("label","tbw-choice");var r=el("input");r.type="radio";
    r.name=root.id+"-"+name;r.value=String(i);r.checked=i===cur;
    r.addEventListener("change",function(){if(r.checked)onpick(i)});
    var t=el("span","",it);l.appendChild(r);l.appendChild(document.createTextNode(" "));
    l.appendChild(t);g.appendChild(l);rs.push({input:r,text:t})});
  row.appendChild(g);body.appendChild(row);return rs}
radios("build","build",data.builds.map(function(b){return b.label}),st.build,
  function(i){var old=data.builds[st.build];var was=(old.source[st.line-old.first]||"").trim();
    st.build=i;var b=data.builds[i];
    var same=b.source.findIndex(function(t){return was&&t.trim()===was});
    if(same>=0&&lineHas(b,b.first+same)){st.line=b.first+same}
    else{var e=b.stages[st.stage]||{index:{}};var best=-1;
      b.source.forEach(function(_,j){var n=b.first+j;var c=(e.index[String(n)]||[]).length;
        if(lineHas(b,n)&&c>best){best=c;st.line=n}})}
    update()});
var readout=el("div","tbw-readout tbw-stages-summary");readout.setAttribute("aria-live","polite");
var verdict=el("div","tbw-verdict");var note=el("div","tbw-note");
[readout,verdict,note].forEach(function(e){body.appendChild(e)});
var srcLab=el("div","tbw-label","Python line (select one)");srcLab.id=root.id+"-src";
body.appendChild(srcLab);
var src=el("div","tbw-src");src.setAttribute("role","group");src.setAttribute("aria-labelledby",srcLab.id);
body.appendChild(src);
var stageRadios=radios("stage","stage",data.stages.map(function(s){return s.label}),
  data.stages.findIndex(function(s){return s.key===st.stage}),
  function(i){st.stage=data.stages[i].key;update()});
var job=el("div","tbw-note tbw-job");var passes=el("div","tbw-note tbw-passes");
body.appendChild(job);body.appendChild(passes);
var code=el("div","tbw-code");code.tabIndex=0;code.setAttribute("role","region");
body.appendChild(code);
function lineHas(b,n){return Object.keys(b.stages).some(function(k){
  return (b.stages[k].index[String(n)]||[]).length>0})}
function update(){
  var b=data.builds[st.build];root.classList.remove("tbw-slow","tbw-wrong");
  readout.textContent=b.label+" \u2014 "+b.summary;
  if(b.verdict.kind==="wrong"){root.classList.add("tbw-wrong");verdict.textContent="Wrong: "+b.verdict.text}
  else if(b.verdict.kind==="warn"){root.classList.add("tbw-slow");verdict.textContent="Costly: "+b.verdict.text}
  else{verdict.textContent=""}
  note.textContent=b.note||"";
  src.innerHTML="";
  b.source.forEach(function(t,j){var n=b.first+j;var has=lineHas(b,n);
    var btn=el("button","tbw-srcline"+(n===st.line?" tbw-on":""));btn.type="button";
    btn.disabled=!has;btn.setAttribute("aria-pressed",n===st.line?"true":"false");
    btn.appendChild(el("span","tbw-ln",String(n)));btn.appendChild(el("span","tbw-lt",t||" "));
    btn.addEventListener("click",function(){st.line=n;update()});src.appendChild(btn)});
  data.stages.forEach(function(s,i){var e=b.stages[s.key];var r=stageRadios[i];
    r.input.disabled=!e;var c=e?(e.index[String(st.line)]||[]).length:0;
    r.text.textContent=s.label+(e?" ("+c+")":" (none)")});
  var s=data.stages.find(function(x){return x.key===st.stage});var e=b.stages[st.stage];
  job.textContent=s.job;
  passes.textContent=e&&e.passes?(e.passes.length?"Passes that changed this kernel on the way here: "+
    e.passes.join(", ")+".":"No pass changed this kernel on the way here."):"";
  code.innerHTML="";code.setAttribute("aria-label",s.label+" of "+b.label);
  if(!e){code.textContent="(no text for this stage)";root.dataset.value=st.build+"|"+st.line+"|"+st.stage;return}
  var lit=new Set(e.index[String(st.line)]||[]);var first=null;
  data.texts[e.text].split("\n").forEach(function(t,j){var n=j+1;
    var row=el("div","tbw-cl"+(lit.has(n)?" tbw-lit":""));
    row.appendChild(el("span","tbw-ln",String(n)));row.appendChild(el("span","tbw-lt",t||" "));
    code.appendChild(row);if(lit.has(n)&&first===null)first=row});
  code.scrollTop=first?Math.max(0,first.offsetTop-code.offsetTop-48):0;
  root.dataset.value=st.build+"|"+st.line+"|"+st.stage;
  root.dataset.verdict=b.verdict.kind==="wrong"?"wrong":(b.verdict.kind==="warn"?"slow":"ok");
}
var cap=el("div","tbw-caption",data.caption);body.appendChild(cap);
update();
