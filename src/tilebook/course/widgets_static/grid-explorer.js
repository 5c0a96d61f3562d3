knobs(function(){resetStep();update()});
// "programs started" runs from 0 to the grid's size, so it is built here, not from a
// list of values; resetStep() sets its range whenever the grid changes.
var stepRow=el("div","tbw-knob"),stepLab=el("span","tbw-label","programs started");
stepLab.id=root.id+"-k"+data.knobs.length;stepRow.appendChild(stepLab);
var stepInput=el("input");stepInput.type="range";stepInput.min=0;stepInput.step=1;
stepInput.setAttribute("aria-labelledby",stepLab.id);stepInput.dataset.knob="step";
var stepOut=el("output");stepRow.appendChild(stepInput);stepRow.appendChild(stepOut);
body.appendChild(stepRow);
var readout=el("div","tbw-readout");readout.setAttribute("aria-live","polite");
var facts=el("div","tbw-facts");var wrap=el("div","tbw-grid-wrap");var map=el("div","tbw-map");
map.setAttribute("role","img");wrap.appendChild(map);
var verdict=el("div","tbw-verdict");var note=el("div","tbw-note");
[readout,facts,wrap,verdict,note].forEach(function(e){body.appendChild(e)});
body.appendChild(el("div","tbw-caption",data.caption));
function fact(label,value){var d=el("div");d.appendChild(document.createTextNode(label+": "));
  d.appendChild(el("b","",value));facts.appendChild(d)}
function row(){return find(["m","n","block_m","block_n","grid"])}
function resetStep(){var r=row();stepInput.max=r.programs;stepInput.value=r.programs;
  state.step=r.programs;stepOut.textContent=String(r.programs)}
stepInput.addEventListener("input",function(){state.step=+stepInput.value;
  stepOut.textContent=String(state.step);update()});
function update(){
  var r=row();root.classList.remove("tbw-slow","tbw-wrong");
  var k=Math.min(state.step,r.programs);
  readout.textContent=r.tiles_m+" x "+r.tiles_n+" tiles, grid ("+r.grid_0+", "+r.grid_1+")";
  facts.innerHTML="";
  fact("programs launched",fmt(r.programs));fact("tiles",fmt(r.tiles));
  fact("tiles nobody owns",fmt(r.unowned));fact("programs that own no tile",fmt(r.idle));
  var size=Math.max(14,Math.min(44,Math.floor(560/Math.max(r.tiles_n,1))));
  map.style.gridTemplateColumns="repeat("+r.tiles_n+","+size+"px)";map.innerHTML="";
  for(var i=0;i<r.tiles_m;i++){for(var j=0;j<r.tiles_n;j++){
    var c=el("div","tbw-cell");c.style.height=size+"px";
    if(i<r.grid_0&&j<r.grid_1){var order=i+j*r.grid_0;
      c.className+=" own"+((i+j)%2?" alt":"");c.className+=order<k?" run":" wait";
      c.appendChild(el("span","","#"+order));
      if(size>=30)c.appendChild(el("span","","("+i+","+j+")"));
      c.title="tile ("+i+", "+j+"): program (pid 0 = "+i+", pid 1 = "+j+"), linear "+
        "index "+order;
    }else{c.className+=" none";c.title="tile ("+i+", "+j+"): no program owns it"}
    map.appendChild(c)}}
  map.setAttribute("aria-label",r.tiles+" tiles, "+r.unowned+" not owned by any program");
  if(r.wrong){root.classList.add("tbw-wrong");verdict.textContent="Wrong: "+r.wrong}
  else if(r.idle){root.classList.add("tbw-slow");verdict.textContent="Wasteful: "+r.note}
  else{verdict.textContent="Every tile is owned by exactly one program."}
  note.textContent=r.wrong?r.note:(r.idle?"":"The numbers are the linear index, pid 0 "+
    "changing fastest: a GPU starts programs mostly, not exactly, in that order. "+
    "Move \u201cprograms started\u201d to watch the first ones.");
  root.dataset.value=[r.m,r.n,r.block_m,r.block_n,r.grid,k].join("/");
  root.dataset.verdict=r.wrong?"wrong":(r.idle?"slow":"ok");
}
resetStep();update();
