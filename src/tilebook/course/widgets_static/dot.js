var st=document.createElement("style");st.textContent=data.css;root.appendChild(st);
var state={};
knobRows(body,data.knobs,state,function(){update()});
var readout=el("div","tbw-readout");readout.setAttribute("aria-live","polite");
var facts=el("dl","tbw-facts");var verdict=el("div","tbw-verdict");var note=el("div","tbw-note");
[readout,facts,verdict,note].forEach(function(e){body.appendChild(e)});
body.appendChild(el("div","tbw-caption",data.caption));
function find(){return data.rows.find(function(r){return data.knobs.every(function(k){
  return r.knobs[k.name]===state[k.name]})})}
function update(){
  var r=find();root.classList.remove("tbw-slow","tbw-wrong");facts.innerHTML="";
  var key=data.knobs.map(function(k){return state[k.name]}).join(" | ");
  root.dataset.value=key;
  if(!r){readout.textContent="not part of this explorer";verdict.textContent="";
    note.textContent="";root.dataset.verdict="";return}
  readout.textContent=r.headline;
  data.facts.forEach(function(f){if(r.facts[f.key]){facts.appendChild(el("dt","",f.label));
    facts.appendChild(el("dd","",r.facts[f.key]))}});
  if(r.wrong){root.classList.add("tbw-wrong");verdict.textContent="Wrong: "+r.wrong}
  else if(r.slow){root.classList.add("tbw-slow");verdict.textContent="Slow: "+r.slow}
  else{verdict.textContent=data.fine}
  note.textContent=r.note||"";
  root.dataset.verdict=r.wrong?"wrong":(r.slow?"slow":"ok");
}
update();
