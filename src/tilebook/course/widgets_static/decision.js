var st=document.createElement("style");st.textContent=data.css;root.appendChild(st);
root.classList.add("tbw-decision");
var chosen={},boxes={},radios={},qi=0;
Object.keys(data.questions).forEach(function(key){
  var q=data.questions[key];var box=el("div","tbw-q");box.hidden=true;
  var lab=el("div","tbw-qtext",q.text);lab.id=root.id+"-q"+(qi++);box.appendChild(lab);
  var g=el("div","tbw-choices");g.setAttribute("role","radiogroup");
  g.setAttribute("aria-labelledby",lab.id);g.dataset.knob=key;radios[key]=[];
  q.answers.forEach(function(p,i){var l=el("label","tbw-choice");var r=el("input");
    r.type="radio";r.name=root.id+"-"+key;r.value=String(i);radios[key].push(r);
    r.addEventListener("change",function(){if(r.checked){chosen[key]=i;update()}});
    l.appendChild(r);l.appendChild(document.createTextNode(" "+p[0]));g.appendChild(l)});
  box.appendChild(g);boxes[key]=box;body.appendChild(box)});
var result=el("div");result.setAttribute("aria-live","polite");body.appendChild(result);
if(data.caption)body.appendChild(el("div","tbw-caption",data.caption));
var LABEL={good:"Good choice: faster than the alternative, beyond the spread",
  level:"Level: no faster or slower than the alternative, beyond the spread",
  slow:"Slow choice: slower than the alternative, beyond the spread",
  wrong:"Wrong choice",unknown:"Not measured"};
function update(){
  result.innerHTML="";root.classList.remove("tbw-slow","tbw-wrong");
  var key=data.start,path=[],on={};
  while(data.questions[key]&&chosen[key]!==undefined){on[key]=true;
    var p=data.questions[key].answers[chosen[key]];path.push(p[0]);key=p[1]}
  if(data.questions[key])on[key]=true;
  Object.keys(boxes).forEach(function(k){boxes[k].hidden=!on[k];
    if(!on[k]||k===key&&chosen[k]===undefined){delete chosen[k];
      radios[k].forEach(function(r){r.checked=false})}});
  root.dataset.value=path.join("|");root.dataset.verdict="";
  if(!data.leaves[key])return;
  var leaf=data.leaves[key];var box=el("div","tbw-leaf");
  box.appendChild(el("div","tbw-readout",leaf.choice));
  box.appendChild(el("div","tbw-verdict",LABEL[leaf.verdict]));
  box.appendChild(el("div","tbw-sub",leaf.evidence));
  box.appendChild(el("div","tbw-caption","Record "+leaf.record+": "+leaf.source));
  result.appendChild(box);
  if(leaf.verdict==="slow")root.classList.add("tbw-slow");
  if(leaf.verdict==="wrong")root.classList.add("tbw-wrong");
  root.dataset.verdict=leaf.verdict;
}
update();
