var knobs=data.knobs,state={};
var NS="http://www.w3.org/2000/svg";
function sv(tag,attrs){var e=document.createElementNS(NS,tag);
  for(var k in attrs)e.setAttribute(k,attrs[k]);return e}
knobRows(body,knobs,state,function(){update()});
var readout=el("div","tbw-readout");readout.setAttribute("aria-live","polite");
var sub=el("div","tbw-sub");var bar=el("div","tbw-bar");var fill=el("div");bar.appendChild(fill);
var verdict=el("div","tbw-verdict");var note=el("div","tbw-note");
var pic=el("div");var measured=el("div","tbw-measured");
[readout,sub,bar,verdict,pic,note,measured].forEach(function(e){body.appendChild(e)});
var legend=el("div","tbw-legend");
[["var(--tbw-accent)","bytes the program asked for"],
 ["transparent","fetched, not asked for"],
 ["var(--tbw-wrong)","read past the end"],
 ["var(--tbw-muted)","past the end of the tensor"]].forEach(function(p,i){
  var s=el("span");var sw=el("span","tbw-sw");sw.style.background=p[0];
  if(i===3){sw.style.opacity="0.25"}s.appendChild(sw);
  s.appendChild(document.createTextNode(p[1]));legend.appendChild(s)});
body.appendChild(legend);
var cap=el("div","tbw-caption",data.caption);body.appendChild(cap);
function find(){return data.rows.find(function(r){return knobs.every(function(k){
  return String(r.knobs[k.name])===String(state[k.name])})})}
function pct(f){return Math.round(100*f)+"%"}
function draw(r){
  var cols=data.columns,cell=16,gap=2,n=r.map.length,rows=Math.ceil(n/cols);
  var w=cols*cell,h=rows*cell;
  var svg=sv("svg",{viewBox:"0 0 "+w+" "+h,width:w,height:h,role:"img"});
  svg.setAttribute("aria-label",r.sectors+" sectors fetched of the "+n+
    " the tile spans; "+r.past_end_sectors+" only for reads past the end");
  for(var i=0;i<n;i++){
    var c=r.map[i],x=(i%cols)*cell,y=Math.floor(i/cols)*cell,s=cell-gap;
    var g=sv("g",{});var t=sv("title",{});
    var box=sv("rect",{x:x,y:y,width:s,height:s,rx:2});
    box.style.fill="transparent";box.style.stroke="var(--tbw-border)";
    if(c===","){box.style.fill="var(--tbw-muted)";box.style.opacity="0.25";
      t.textContent="sector "+i+": past the end of the tensor, not read"}
    else if(c==="."){t.textContent="sector "+i+": not fetched"}
    else if(c==="x"){box.style.fill="var(--tbw-wrong)";
      t.textContent="sector "+i+": fetched only for reads past the end"}
    else{var up=c===c.toUpperCase(),e=c.toLowerCase().charCodeAt(0)-96,fh=s*e/8;
      box.style.stroke="var(--tbw-fg)";
      if(up){var bad=sv("rect",{x:x,y:y,width:s,height:s-fh,rx:2});
        bad.style.fill="var(--tbw-wrong)";g.appendChild(bad)}
      var ok=sv("rect",{x:x,y:y+s-fh,width:s,height:fh,rx:2});ok.style.fill="var(--tbw-accent)";
      g.appendChild(ok);
      t.textContent="sector "+i+": "+Math.min(data.sector,Math.round(e*data.sector/8))+
        " of its "+data.sector+" bytes asked for"+(up?", the rest read past the end":"")}
    g.insertBefore(box,g.firstChild);g.appendChild(t);svg.appendChild(g)}
  pic.innerHTML="";pic.appendChild(svg);
}
function update(){
  var r=find();root.classList.remove("tbw-slow","tbw-wrong");
  if(!r){readout.textContent="no such setting";root.dataset.value="";return}
  readout.textContent=pct(r.efficiency)+" of the bytes fetched are used";
  sub.textContent=r.sectors+" sectors ("+r.fetched+" bytes) fetched for "+r.useful+
    " bytes asked for \u00b7 each thread issues "+r.loads+" load"+(r.loads>1?"s":"")+" of "+
    r.load_bytes+" bytes";
  fill.style.width=(100*r.efficiency).toFixed(1)+"%";
  if(r.verdict==="wrong"){root.classList.add("tbw-wrong");verdict.textContent="Wrong: "+r.headline}
  else if(r.verdict==="slow"){root.classList.add("tbw-slow");verdict.textContent="Slow: "+r.headline}
  else{verdict.textContent=r.headline}
  note.textContent=r.note;measured.textContent=r.measured||"";
  draw(r);
  root.dataset.value=[r.efficiency.toFixed(4),r.sectors,r.past_end].join("/");
  root.dataset.verdict=r.verdict;
}
update();
