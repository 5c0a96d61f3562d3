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
