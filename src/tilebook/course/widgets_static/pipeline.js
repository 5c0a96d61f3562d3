var pits=null,pitFix=null;
function update(){settingUpdate();if(!pits)return;
  var on=pits.filter(function(p){return p.box.checked}),r=find();
  root.dataset.pitfalls=on.map(function(p){return p.name}).join("|");
  if(table)table.classList.toggle("tbw-pitfall-on",on.length>0);
  pitFix.textContent=on.length?"Fix: "+on.map(function(p){return p.fix.replace(/[.\s]+$/,"")}).join("; ")+
    ". Until then no setting in the grid is right.":"";
  if(!on.length||!r||r.refused)return;
  root.classList.remove("tbw-slow");root.classList.add("tbw-wrong");
  verdict.textContent="Wrong: "+on.map(function(p){return p.wrong}).join("; ");
  root.dataset.verdict="wrong";
}
if(data.pitfalls&&data.pitfalls.length){
  var fs=el("fieldset","tbw-pitfalls");
  fs.appendChild(el("legend","","Put a pitfall into the kernel"));
  pits=data.pitfalls.map(function(p){var l=el("label","tbw-pitfall"),c=el("input");
    c.type="checkbox";c.dataset.pitfall=p.name;c.addEventListener("change",update);
    l.appendChild(c);l.appendChild(document.createTextNode(" "+p.name));fs.appendChild(l);
    return {name:p.name,wrong:p.wrong,fix:p.fix,box:c}});
  body.insertBefore(fs,readout);
  pitFix=el("div","tbw-note tbw-fix");pitFix.setAttribute("aria-live","polite");
  body.insertBefore(pitFix,note.nextSibling);
  update();
}
