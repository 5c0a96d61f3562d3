knobs(update);
var readout=el("div","tbw-readout");readout.setAttribute("aria-live","polite");
var strip=el("div","tbw-strip");strip.setAttribute("role","img");
var scale=el("div","tbw-scale");var facts=el("div","tbw-facts");
var verdict=el("div","tbw-verdict");var note=el("div","tbw-note");
[readout,strip,scale,facts,verdict,note].forEach(function(e){body.appendChild(e)});
body.appendChild(el("div","tbw-caption",data.caption));
function fact(label,value){var d=el("div");d.appendChild(document.createTextNode(label+": "));
  d.appendChild(el("b","",value));facts.appendChild(d)}
function update(){
  var r=find(["n","block","grid"]);root.classList.remove("tbw-slow","tbw-wrong");
  readout.textContent="N = "+fmt(r.n)+": "+fmt(r.programs)+(r.programs===1?" program":" programs")+
    " of "+fmt(r.block)+" elements";
  strip.innerHTML="";var useful=r.programs-r.idle,draw=Math.min(useful,data.max_segments);
  var per=useful/draw;
  for(var i=0;i<draw;i++){var s=el("div","tbw-seg "+(i%2?"b":"a"));
    var first=Math.round(i*per),last=Math.round((i+1)*per);
    var cover=Math.min(r.n,last*r.block)-first*r.block;s.style.flex=String(Math.max(cover,0));
    s.title=per===1?"program "+i:"programs "+first+"-"+(last-1);strip.appendChild(s)}
  if(r.tail>0){var t=el("div","tbw-seg tail");t.style.flex=String(r.tail);
    t.title=r.tail+" elements no program owns";strip.appendChild(t)}
  strip.setAttribute("aria-label",readout.textContent+(r.tail?", "+r.tail+" elements unprocessed":""));
  scale.innerHTML="";scale.appendChild(el("span","","0"));scale.appendChild(el("span","","N = "+fmt(r.n)));
  facts.innerHTML="";
  fact("Triton: programs launched",fmt(r.programs));
  fact("elements per program",fmt(r.block));
  fact("threads per program ("+data.num_warps+" warps)",fmt(r.threads_per_program));
  fact("elements per thread",String(r.elements_per_thread));
  fact("CUDA, one thread per element: threads",fmt(r.n));
  fact("CUDA thread blocks of "+data.cuda_block,fmt(r.cuda_blocks));
  if(r.wrong){root.classList.add("tbw-wrong");verdict.textContent="Wrong: "+r.wrong}
  else if(r.slow){root.classList.add("tbw-slow");verdict.textContent="Slow: "+r.slow}
  else{verdict.textContent="Every element is owned by exactly one program."}
  note.textContent=r.note||"";
  root.dataset.value=[r.n,r.block,r.grid,r.programs,r.tail].join("/");
  root.dataset.verdict=r.wrong?"wrong":(r.slow?"slow":"ok");
}
update();
